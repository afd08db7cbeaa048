//! A store of schema 1, whose events a build before event format 2 wrote, opens, is
//! migrated to the current schema and reads those events; new events take the current
//! format beside them; its budget ledgers, which belong to no session, still read.

use agentry_memory::conformance::{check_format_1_turn, format_1_turn};
use agentry_memory::{BudgetStore, RunStore, SessionStore};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{SessionRecord, SessionType, Subject};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_1_store_reads_its_format_1_events_and_adds_new_ones_in_format_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    // The first sample turn's events, as schema 1 stored them.
    let (session, run, old) = format_1_turn();
    let turn = run.id;
    {
        let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
        store.create_session(&session).await.unwrap();
        store.put_run(&run, None).await.unwrap();
        store.create_budget("old", &agentry_types::BudgetLimit::default(), None).await.unwrap();
    }
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        for (bytes, event) in &old {
            connection
                .execute(
                    "INSERT INTO events (turn_id, session_id, seq, body) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![turn.to_string(), session.id.to_string(), event.seq as i64, bytes],
                )
                .unwrap();
        }
        // Schema 1's shape: ledgers without the session they belong to, runs without
        // their parent.
        connection
            .execute_batch(
                "DROP INDEX budgets_by_session; DROP INDEX reservation_scopes_by_reservation;
                 ALTER TABLE budgets DROP COLUMN session_id;
                 DROP INDEX runs_by_parent; DROP INDEX runs_top_level; ALTER TABLE runs DROP COLUMN parent_id;
                 DROP INDEX sessions_by_owner; ALTER TABLE sessions DROP COLUMN owner;
                 ALTER TABLE sessions DROP COLUMN active_us;",
            )
            .unwrap();
        connection.pragma_update(None, "user_version", 1).unwrap();
    }

    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    check_format_1_turn(&store, &session, &run).await;
    // A ledger of schema 1 belongs to no session; new ones may.
    store.budget("old", agentry_types::Timestamp::now()).await.unwrap();
    let limit = agentry_types::BudgetLimit::default();
    let other = SessionRecord::new(SessionType::Agent, "other", Subject::user("ann"));
    store.create_session(&other).await.unwrap();
    store.create_budget("new", &limit, Some(other.id)).await.unwrap();
    store.delete_session(other.id).await.unwrap();
    let deleted = store.budget("new", agentry_types::Timestamp::now()).await.unwrap_err();
    assert!(matches!(deleted, agentry_memory::StoreError::NotFound { .. }), "{deleted:?}");
    store.budget("old", agentry_types::Timestamp::now()).await.unwrap();
    drop(store);

    let connection = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
    assert_eq!(version, 6);
    let formats: Vec<u8> = connection
        .prepare("SELECT body FROM events ORDER BY position")
        .unwrap()
        .query_map([], |row| row.get::<_, Vec<u8>>(0))
        .unwrap()
        .map(|body| body.unwrap()[0])
        .collect();
    assert_eq!(formats.last(), Some(&2));
    assert!(formats[..formats.len() - 1].iter().all(|format| *format == 1), "{formats:?}");
}

/// Servers started together on a new file: each opens it, and the schema is created once
/// (each migration step reads the version under the file's write lock).
#[test]
fn processes_opening_a_new_file_at_once_all_open_it() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let path = dir.path().join(format!("new-{round}.db"));
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let openers: Vec<_> = (0..4)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    SqliteStore::open(&path, SqliteOptions::default()).map(drop)
                })
            })
            .collect();
        for opener in openers {
            opener.join().unwrap().unwrap();
        }
        let connection = rusqlite::Connection::open(&path).unwrap();
        let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
        assert_eq!(version, 6);
    }
}

/// A store of schema 3, which kept no run's parent nor session's owner beside their
/// records, is migrated: both are read from the records, and turns, members and an owner's
/// sessions are listed by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_3_store_lists_its_members_turns_and_owners_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let runs = {
        let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
        agentry_memory::conformance::store_runs_with_members(&store).await
    };
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        // Schema 3's shape.
        connection
            .execute_batch(
                "DROP INDEX runs_by_parent; DROP INDEX runs_top_level; ALTER TABLE runs DROP COLUMN parent_id;
                 DROP INDEX sessions_by_owner; ALTER TABLE sessions DROP COLUMN owner;
                 ALTER TABLE sessions DROP COLUMN active_us;",
            )
            .unwrap();
        connection.pragma_update(None, "user_version", 3).unwrap();
    }
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    agentry_memory::conformance::check_runs_with_members(&store, &runs).await;
    drop(store);
    let connection = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
    assert_eq!(version, 6);
}
