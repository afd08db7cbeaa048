//! Every durability mode stores and reads the same way, and keeps everything across a clean
//! close and reopen.

use std::sync::Arc;

use agentry_memory::conformance::event;
use agentry_memory::{Durability, EventStore, Order, Store};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_durability_mode_keeps_concurrent_writes_across_a_reopen() {
    for durability in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let options = SqliteOptions { durability, ..SqliteOptions::default() };
        let session = SessionRecord::new(SessionType::Agent, "a", Subject::user("u"));
        let mut runs = Vec::new();
        {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path, options.clone()).unwrap());
            assert!(
                format!("{store:?}").contains(&format!("{durability:?}")),
                "the store runs in the mode asked for"
            );
            store.create_session(&session).await.unwrap();
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let store = store.clone();
                let run = RunRecord::new(session.id, vec![TurnInputItem::message("x")], Subject::user("u"));
                runs.push(run.id);
                tasks.push(tokio::spawn(async move {
                    store.put_run(&run, None).await.unwrap();
                    for seq in 1..=20 {
                        store.append_events(run.id, &[event(&run, seq)], None).await.unwrap();
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        }
        let store = SqliteStore::open(&path, options).unwrap();
        for run in runs {
            let events = store.turn_events(run, Order::Asc, None, 100).await.unwrap();
            assert_eq!(events.len(), 20, "{durability}: every event survives a clean reopen");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_checkpoint_the_file_alone_holds_every_acknowledged_write() {
    use agentry_memory::{Checkpoint, SessionStore};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let mut ids = Vec::new();
    for index in 0..40 {
        let session = SessionRecord::new(SessionType::Agent, format!("agent-{index}"), Subject::user("u"));
        store.create_session(&session).await.unwrap();
        ids.push(session.id);
    }
    store.checkpoint().await.unwrap();
    // The file alone, copied while the store is still open (its log left behind).
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    let copied = SqliteStore::open(&copy, SqliteOptions::default()).unwrap();
    for id in ids {
        copied.get_session(id).await.unwrap();
    }
    // Writes go on as before.
    let later = SessionRecord::new(SessionType::Agent, "later", Subject::user("u"));
    store.create_session(&later).await.unwrap();
    store.get_session(later.id).await.unwrap();
}
