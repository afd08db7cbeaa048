//! Bad files and paths: each is refused with an error naming the problem, and the file is
//! left as it was.

use std::path::Path;

use agentry_memory::{RunStore, SessionStore, StoreError, conformance};
use agentry_storage_redb::{RedbOptions, RedbStore};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};

fn open(path: &Path) -> Result<RedbStore, StoreError> {
    RedbStore::open(path, RedbOptions::default())
}

async fn populated(path: &Path) {
    let store = open(path).unwrap();
    for _ in 0..50 {
        let session = SessionRecord::new(SessionType::Agent, "a".repeat(2000), Subject::user("u"));
        store.create_session(&session).await.unwrap();
        store
            .put_run(
                &RunRecord::new(
                    session.id,
                    vec![TurnInputItem::message("x".repeat(3000))],
                    Subject::user("u"),
                ),
                None,
            )
            .await
            .unwrap();
    }
}

#[test]
fn the_other_backends_file_is_refused_naming_its_backend_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let mut bytes = (b"SQLite format 3\0" as &[u8]).to_vec();
    bytes.resize(8192, 0);
    std::fs::write(&path, &bytes).unwrap();
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::OtherBackend(ref message)
            if message.contains("is an SQLite database, not a redb one") && message.contains("backend = \"sqlite\"")),
        "{error}"
    );
    assert!(std::fs::read(&path).unwrap() == bytes, "the refused file was changed");
}

#[test]
fn a_file_of_random_bytes_is_refused_as_corrupt_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.redb");
    let bytes: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let error = open(&path).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
    assert!(error.to_string().contains("is not a redb database"), "the error names the problem: {error}");
    assert!(std::fs::read(&path).unwrap() == bytes, "the refused file was changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    populated(&path).await;
    let full = std::fs::read(&path).unwrap();
    let truncated = &full[..full.len() / 2];
    std::fs::write(&path, truncated).unwrap();
    let error = open(&path).expect_err("a truncated file must not open");
    assert!(matches!(error, StoreError::Corrupt(_) | StoreError::Io(_)), "{error}");
    assert!(std::fs::read(&path).unwrap() == truncated, "the refused file was changed");
}

/// A copy of a store taken while it was open (as `cp` of a running server's file, or a
/// file left by a crash): redb marks such a file as needing recovery.
async fn copied_while_open(dir: &Path) -> Vec<u8> {
    let path = dir.join("live.redb");
    populated(&path).await;
    let store = open(&path).unwrap();
    let session = SessionRecord::new(SessionType::Agent, "b", Subject::user("u"));
    store.create_session(&session).await.unwrap();
    let bytes = std::fs::read(&path).unwrap();
    drop(store);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_copy_of_an_open_store_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let full = copied_while_open(dir.path()).await;
    // As it is, the copy opens: recovery is what a crash needs too.
    let path = dir.path().join("copy.redb");
    std::fs::write(&path, &full).unwrap();
    drop(open(&path).expect("a copy of an open store is recovered"));
    for length in [10, 4096, 32_768, 65_536, 131_072, full.len() / 2, full.len() - 4096] {
        let truncated = &full[..length.min(full.len() - 1)];
        std::fs::write(&path, truncated).unwrap();
        let error = open(&path).expect_err("a truncated file must not open");
        assert!(matches!(error, StoreError::Corrupt(_) | StoreError::Io(_)), "{length}: {error}");
        assert!(
            error.to_string().contains("truncated") || length < 4096,
            "{length}: the error names the problem: {error}"
        );
        assert!(std::fs::read(&path).unwrap() == truncated, "{length}: the refused file was changed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_copy_of_an_open_store_is_refused_without_a_panic_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let full = copied_while_open(dir.path()).await;
    let path = dir.path().join("copy.redb");
    for start in [full.len() / 3, full.len() / 2, 2 * full.len() / 3] {
        let mut damaged = full.clone();
        let start = start / 4096 * 4096;
        for (index, byte) in damaged[start..start + 3 * 4096].iter_mut().enumerate() {
            *byte = (index % 251) as u8 ^ 0x5a;
        }
        std::fs::write(&path, &damaged).unwrap();
        let opened = std::panic::catch_unwind(|| open(&path));
        let Ok(result) = opened else { panic!("opening a damaged file panicked (pages from {start})") };
        if let Err(error) = result {
            assert!(matches!(error, StoreError::Corrupt(_)), "{start}: {error}");
            assert!(std::fs::read(&path).unwrap() == damaged, "{start}: the refused file was changed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_a_newer_schema_version_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    populated(&path).await;
    {
        let database = redb::Database::create(&path).unwrap();
        let write = database.begin_write().unwrap();
        {
            let mut meta = write.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap();
            meta.insert("schema_version", 99).unwrap();
        }
        write.commit().unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = open(&path).unwrap_err();
    assert_eq!(error, StoreError::VersionTooNew { found: 99, supported: 5 });
    assert!(std::fs::read(&path).unwrap() == before, "the refused file was changed");
}

#[test]
fn another_applications_redb_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    {
        let database = redb::Database::create(&path).unwrap();
        let write = database.begin_write().unwrap();
        {
            let mut notes = write.open_table(redb::TableDefinition::<&str, &str>::new("notes")).unwrap();
            notes.insert("a", "hello").unwrap();
        }
        write.commit().unwrap();
    }
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt(ref message) if message.contains("not an Agentry store")),
        "{error}"
    );
}

#[test]
fn a_directory_is_refused_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let error = open(dir.path()).unwrap_err();
    assert!(
        matches!(error, StoreError::Io(ref message) if message.contains("it is a directory")
            && message.contains(&dir.path().display().to_string())),
        "{error}"
    );
}

#[test]
fn an_empty_or_blank_path_is_refused_naming_the_problem() {
    conformance::check_blank_paths_refused(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_refused_once_the_file_is_removed_or_replaced() {
    conformance::check_writes_refused_once_the_file_is_gone(open).await;
}

#[test]
fn a_path_that_cannot_be_created_is_an_io_error_naming_it() {
    let error = open(Path::new("/nonexistent-agentry-dir/sub/store.redb")).unwrap_err();
    assert!(
        matches!(error, StoreError::Io(ref message) if message.contains("/nonexistent-agentry-dir/sub does not exist")),
        "{error}"
    );
    // A file where its directory should be is named as that.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let error = open(&file.join("store.db")).unwrap_err();
    assert!(
        matches!(error, StoreError::Io(ref message) if message.contains("plain is not a directory")),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reopens_with_everything_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let session = SessionRecord::new(SessionType::Team, "crew", Subject::user("u"));
    {
        let store = open(&path).unwrap();
        store.create_session(&session).await.unwrap();
    }
    let store = open(&path).unwrap();
    assert_eq!(store.get_session(session.id).await.unwrap(), session);
}

/// Overwrites `session`'s record in the file with one nested more deeply than records are
/// read (what a build before the nesting limit could store).
fn damage(path: &Path, session: &SessionRecord) {
    let database = redb::Database::create(path).unwrap();
    let write = database.begin_write().unwrap();
    {
        let sessions = redb::TableDefinition::<u128, &[u8]>::new("sessions");
        let mut sessions = write.open_table(sessions).unwrap();
        let bytes = conformance::too_deep_session_json(session);
        sessions.insert(session.id.as_uuid().as_u128(), bytes.as_slice()).unwrap();
    }
    write.commit().unwrap();
}

/// A write that reads a stored record that does not decode is refused alone: the writes
/// that share its group commit (other sessions', under `batched`) still commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_refuses_its_write_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (damaged, _kept) = conformance::sessions_to_damage(&open(&path).unwrap()).await;
    damage(&path, &damaged);
    let options = RedbOptions { durability: agentry_memory::Durability::Batched, ..RedbOptions::default() };
    let store = std::sync::Arc::new(RedbStore::open(&path, options).unwrap());
    for _round in 0..5 {
        let mut writes = tokio::task::JoinSet::new();
        for index in 0..40 {
            let store = store.clone();
            let damaged = damaged.id;
            writes.spawn(async move {
                if index == 20 {
                    let update = agentry_memory::SessionUpdate {
                        title: Some("renamed".to_owned()),
                        ..agentry_memory::SessionUpdate::default()
                    };
                    let refused = store.update_session(damaged, &update).await.unwrap_err();
                    assert!(agentry_memory::rules::is_damaged_record(&refused), "{refused:?}");
                    None
                } else {
                    let session = SessionRecord::new(SessionType::Agent, "a", Subject::user("u"));
                    store.create_session(&session).await.expect("a batch-mate of the damaged write commits");
                    Some(session.id)
                }
            });
        }
        while let Some(written) = writes.join_next().await {
            if let Some(id) = written.unwrap() {
                store.get_session(id).await.unwrap();
            }
        }
    }
}

/// A session record nested more deeply than records are read (one a build before the
/// nesting limit could write) is reported as damaged, and can still be deleted whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_record_that_no_longer_reads_can_still_be_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (damaged, kept) = conformance::sessions_to_damage(&open(&path).unwrap()).await;
    damage(&path, &damaged);
    conformance::check_damaged_session_deleted_whole(&open(&path).unwrap(), &damaged, &kept).await;
}

/// A damaged budget reservation refuses the reservations of its own scopes (what they hold
/// is not known), not those of every other budget in the store.
#[tokio::test]
async fn a_damaged_reservation_refuses_only_its_own_budgets_reservations() {
    use agentry_memory::BudgetStore;
    use agentry_types::{BudgetLimit, BudgetReservation, BudgetUsage, Timestamp};
    let reservation = |id: &str, scope: &str| BudgetReservation {
        id: id.to_owned(),
        scopes: vec![scope.to_owned()],
        amount: BudgetUsage { tokens_used: 10, ..BudgetUsage::default() },
        expires_at: Timestamp::from_unix_micros(i64::MAX),
        lease: None,
    };
    let now = Timestamp::from_unix_micros(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let store = open(&path).unwrap();
        let limit = BudgetLimit { max_tokens: Some(1000), ..BudgetLimit::default() };
        for scope in ["mission:damaged", "mission:sound"] {
            store.create_budget(scope, &limit, None).await.unwrap();
        }
        store.reserve(&reservation("broken", "mission:damaged"), now).await.unwrap();
    }
    {
        let database = redb::Database::create(&path).unwrap();
        let write = database.begin_write().unwrap();
        {
            let table = redb::TableDefinition::<&str, &[u8]>::new("reservations");
            write.open_table(table).unwrap().insert("broken", b"{not json".as_slice()).unwrap();
        }
        write.commit().unwrap();
    }
    let store = open(&path).unwrap();
    store.reserve(&reservation("fine", "mission:sound"), now).await.expect("another budget's reservation");
    assert_eq!(store.budget("mission:sound", now).await.unwrap().reserved.tokens_used, 10);
    let refused = store.reserve(&reservation("unknown", "mission:damaged"), now).await.unwrap_err();
    assert!(agentry_memory::rules::is_damaged_record(&refused), "{refused:?}");
}
