//! The writer thread: what it remembers about a turn follows only committed writes (other
//! processes' writes are covered by `benches/tests/it/shared.rs`), and the background
//! checkpointer keeps the log bounded.

use agentry_memory::{Conflict, Durability, EventStore, RunStore, SessionStore, StoreError};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};

/// A durable event of `run` (a tool result of about 1 KiB) under `seq`.
fn event(run: &RunRecord, seq: u64) -> agentry_events::EventEnvelope {
    agentry_events::EventEnvelope {
        event_id: agentry_types::EventId::new(),
        seq,
        session_id: run.session_id,
        turn_id: run.id,
        thread_id: Some(agentry_types::ThreadId::main()),
        team: None,
        created_at: agentry_types::Timestamp::now(),
        schema_version: agentry_events::SCHEMA_VERSION,
        payload: agentry_events::EventPayload::ToolResponse {
            tool_call_id: "call_1".to_owned(),
            name: "calculator".to_owned(),
            arguments: "{}".to_owned(),
            content: "x".repeat(900),
            is_error: false,
        },
    }
}

async fn session_with_run(store: &SqliteStore) -> (SessionRecord, RunRecord) {
    let session = SessionRecord::new(SessionType::Agent, "shared", Subject::user("ann"));
    store.create_session(&session).await.unwrap();
    let run = RunRecord::new(session.id, vec![TurnInputItem::message("hi")], Subject::user("ann"));
    store.put_run(&run, None).await.unwrap();
    (session, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_is_not_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"), SqliteOptions::default()).unwrap();
    let (_, run) = session_with_run(&store).await;
    // The second event of the batch is out of order: the whole batch is refused, and the
    // turn's last seq stays 0.
    let refused = store.append_events(run.id, &[event(&run, 4), event(&run, 2)], None).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::Conflict(Conflict::StaleSeq { seq: 2, last: 4, .. })),
        "{refused:?}"
    );
    store.append_events(run.id, &[event(&run, 1)], None).await.unwrap();
    assert_eq!(store.high_water(run.id).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_bounded_while_events_keep_coming() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let options = SqliteOptions { durability: Durability::Relaxed, ..SqliteOptions::default() };
    let store = SqliteStore::open(&path, options.clone()).unwrap();
    let (_, run) = session_with_run(&store).await;
    // About 50 MiB of events, 16 per transaction: without checkpoints the log would grow
    // past 200 MiB (each commit writes whole pages). The checkpointer thread usually keeps
    // it near 4 MiB; when it falls behind (a busy machine), the writer copies the log
    // itself from about 31 MiB on, as soon as no checkpointer pass holds it, and the log
    // may grow by what is written during that pass: bounded well below what no checkpoint
    // would leave, whatever the timing.
    let mut seq = 0;
    for _ in 0..3_500 {
        let events: Vec<_> = (0..16)
            .map(|_| {
                seq += 1;
                event(&run, seq)
            })
            .collect();
        store.append_events(run.id, &events, None).await.unwrap();
    }
    let log = std::fs::metadata(dir.path().join("store.db-wal")).unwrap().len();
    assert!(log < 64 << 20, "the log holds {log} bytes");
    drop(store);
    let reopened = SqliteStore::open(&path, options).unwrap();
    assert_eq!(reopened.high_water(run.id).await.unwrap(), seq);
}
