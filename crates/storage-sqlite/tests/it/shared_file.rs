//! Two stores on one file: what one writer remembers about a turn never hides what the
//! other wrote, and the background checkpointer keeps the log bounded.

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
async fn a_writer_sees_the_seqs_another_process_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let first = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let second = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let (_, run) = session_with_run(&first).await;

    // The first writer now remembers seq 1 as the turn's last.
    first.append_events(run.id, &[event(&run, 1)], None).await.unwrap();
    second.append_events(run.id, &[event(&run, 5)], None).await.unwrap();

    // Seq 3 was never stored, but it is not above the turn's last (5): refused.
    let refused = first.append_events(run.id, &[event(&run, 3)], None).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::Conflict(Conflict::StaleSeq { seq: 3, last: 5, .. })),
        "{refused:?}"
    );
    first.append_events(run.id, &[event(&run, 6)], None).await.unwrap();
    let refused = second.append_events(run.id, &[event(&run, 6)], None).await.unwrap_err();
    assert!(matches!(refused, StoreError::Conflict(Conflict::StaleSeq { last: 6, .. })), "{refused:?}");
    let seqs: Vec<u64> = second
        .turn_events(run.id, agentry_memory::Order::Asc, None, 10)
        .await
        .unwrap()
        .iter()
        .map(|stored| stored.event.seq)
        .collect();
    assert_eq!(seqs, [1, 5, 6]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_sees_a_session_another_process_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let first = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let second = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let (session, run) = session_with_run(&first).await;
    first.append_events(run.id, &[event(&run, 1)], None).await.unwrap();

    second.delete_session(session.id).await.unwrap();
    let refused = first.append_events(run.id, &[event(&run, 2)], None).await.unwrap_err();
    assert!(matches!(refused, StoreError::NotFound { .. }), "{refused:?}");
    assert!(first.feed(&agentry_memory::FeedQuery::default(), 10).await.unwrap().is_empty());
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
    // About 20 MiB of events, 16 per transaction: without checkpoints the log would hold
    // all of it.
    let mut seq = 0;
    for _ in 0..1_400 {
        let events: Vec<_> = (0..16)
            .map(|_| {
                seq += 1;
                event(&run, seq)
            })
            .collect();
        store.append_events(run.id, &events, None).await.unwrap();
    }
    let log = std::fs::metadata(dir.path().join("store.db-wal")).unwrap().len();
    assert!(log < 12 << 20, "the log holds {log} bytes");
    drop(store);
    let reopened = SqliteStore::open(&path, options).unwrap();
    assert_eq!(reopened.high_water(run.id).await.unwrap(), seq);
}
