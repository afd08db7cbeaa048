//! A store of schema 1, whose events a build before event format 2 wrote, opens, is
//! migrated to the current schema and reads those events; new events take the current
//! format beside them.

use agentry_memory::conformance::{check_format_1_turn, format_1_turn};
use agentry_memory::{RunStore, SessionStore};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};

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
        connection.pragma_update(None, "user_version", 1).unwrap();
    }

    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    check_format_1_turn(&store, &session, &run).await;
    drop(store);

    let connection = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
    assert_eq!(version, 2);
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
