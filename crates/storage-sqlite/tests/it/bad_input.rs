//! Bad files and paths: each is refused with an error naming the problem, and the file is
//! left as it was.

use std::path::Path;

use agentry_memory::{RunStore, SessionStore, StoreError, conformance};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};

fn open(path: &Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::open(path, SqliteOptions::default())
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
    let mut bytes = (&[b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A] as &[u8]).to_vec();
    bytes.resize(8192, 0);
    std::fs::write(&path, &bytes).unwrap();
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::OtherBackend(ref message)
            if message.contains("is a redb database, not an SQLite one") && message.contains("backend = \"redb\"")),
        "{error}"
    );
    assert!(std::fs::read(&path).unwrap() == bytes, "the refused file was changed");
}

#[test]
fn a_file_of_random_bytes_is_refused_as_corrupt_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.db");
    let bytes: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt(ref message) if message.contains("not an SQLite database")),
        "{error}"
    );
    assert!(std::fs::read(&path).unwrap() == bytes, "the refused file was changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_is_refused_as_corrupt_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    populated(&path).await;
    let full = std::fs::read(&path).unwrap();
    assert!(
        !dir.path().join("store.db-wal").exists()
            || std::fs::metadata(dir.path().join("store.db-wal")).unwrap().len() == 0
    );
    let truncated = &full[..full.len() / 2];
    std::fs::write(&path, truncated).unwrap();
    let error = open(&path).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(ref message) if message.contains("truncated")), "{error}");
    assert!(std::fs::read(&path).unwrap() == truncated, "the refused file was changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_a_newer_schema_version_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    populated(&path).await;
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        connection.pragma_update(None, "user_version", 99).unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = open(&path).unwrap_err();
    assert_eq!(error, StoreError::VersionTooNew { found: 99, supported: 6 });
    assert!(error.to_string().contains("upgrade Agentry"));
    assert!(std::fs::read(&path).unwrap() == before, "the refused file was changed");
}

#[test]
fn another_applications_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        connection
            .execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('hello');")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt(ref message) if message.contains("not an Agentry store")),
        "{error}"
    );
    assert!(std::fs::read(&path).unwrap() == before, "the refused file was changed");
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

/// A store file replaced by another database while open: the write that finds it out
/// empties the old file's log, so the new database is opened as it is, not with the old
/// one's pages replayed onto it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_file_is_not_opened_with_the_old_files_log() {
    // Found out by a write, or only as the store closes.
    for write_after in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (path, other_path) = (dir.path().join("store.db"), dir.path().join("other.db"));
        let session = |name: &str| SessionRecord::new(SessionType::Agent, name, Subject::user("u"));
        let (first, second, late) = (session("first"), session("second"), session("late"));
        let store = open(&path).unwrap();
        store.create_session(&first).await.unwrap();
        let other = open(&other_path).unwrap();
        other.create_session(&second).await.unwrap();
        drop(other);
        std::fs::rename(&other_path, &path).unwrap();
        if write_after {
            assert!(matches!(store.create_session(&late).await, Err(StoreError::Io(_))));
        }
        drop(store);
        let reopened = open(&path).unwrap();
        assert_eq!(
            reopened.get_session(second.id).await.unwrap().name,
            "second",
            "write after: {write_after}"
        );
        assert!(matches!(reopened.get_session(first.id).await, Err(StoreError::NotFound { .. })));
    }
}

#[test]
fn a_path_that_cannot_be_created_is_an_io_error_naming_it() {
    let error = open(Path::new("/nonexistent-agentry-dir/sub/store.db")).unwrap_err();
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

/// A file SQLite may only read is refused at open, not served as a store whose every write
/// fails. The file is made read-only by its mode, which binds any user but root, and for
/// root (as in CI) by the immutable attribute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_cannot_be_written_is_refused_naming_it_and_left_alone() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    populated(&path).await;
    let before = std::fs::read(&path).unwrap();
    let mode = |mode: u32| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    mode(0o444);
    let writable = std::fs::OpenOptions::new().write(true).open(&path).is_ok();
    let chattr = |flag: &str| {
        let status = std::process::Command::new("chattr").arg(flag).arg(&path).status();
        assert!(status.is_ok_and(|status| status.success()), "chattr {flag} failed on {}", path.display());
    };
    if writable {
        chattr("+i");
    }
    let opened = open(&path);
    if writable {
        chattr("-i");
    }
    mode(0o644);
    let Err(error) = opened else { panic!("a read-only file is refused") };
    assert!(
        matches!(error, StoreError::Io(ref message) if message.contains("cannot be written")
            && message.contains(&path.display().to_string())),
        "{error}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before, "the file is left as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reopens_with_everything_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let session = SessionRecord::new(SessionType::Team, "crew", Subject::user("u"));
    {
        let store = open(&path).unwrap();
        store.create_session(&session).await.unwrap();
    }
    let store = open(&path).unwrap();
    assert_eq!(store.get_session(session.id).await.unwrap(), session);
}

/// A session record nested more deeply than records are read (one a build before the
/// nesting limit could write) is reported as damaged, and can still be deleted whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_record_that_no_longer_reads_can_still_be_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let (damaged, kept) = conformance::sessions_to_damage(&open(&path).unwrap()).await;
    let connection = rusqlite::Connection::open(&path).unwrap();
    let body = conformance::too_deep_session_json(&damaged);
    let changed = connection
        .execute(
            "UPDATE sessions SET body = ?2 WHERE id = ?1",
            rusqlite::params![damaged.id.to_string(), body],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(connection);
    conformance::check_damaged_session_deleted_whole(&open(&path).unwrap(), &damaged, &kept).await;
}

/// A busy timeout past what SQLite takes (`i32::MAX` milliseconds) waits that long instead
/// of failing the open (rusqlite panics on it).
#[test]
fn a_busy_timeout_past_sqlites_longest_opens_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions { busy_timeout: std::time::Duration::MAX, ..SqliteOptions::default() };
    SqliteStore::open(dir.path().join("store.db"), options).expect("the store opens");
}
