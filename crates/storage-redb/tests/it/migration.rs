//! A store written by schema 1 (whose `run_meta` also held each turn's last stored seq)
//! opens, is migrated to the current schema, and keeps every turn's seq and mark.

use agentry_memory::conformance::event;
use agentry_memory::{Conflict, EventStore, Order, RunStore, SessionStore, StoreError};
use agentry_storage_redb::{RedbOptions, RedbStore};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const RUN_META_V2: TableDefinition<'_, u128, (u128, u64, u64)> = TableDefinition::new("run_meta");
const RUN_META_V1: TableDefinition<'_, u128, (u128, u64, u64, u64)> = TableDefinition::new("run_meta");

/// Rewrites a current store's `run_meta` and version into schema 1's shape.
fn downgrade_to_schema_1(path: &std::path::Path, last_seq: u64) {
    let database =
        Database::builder().set_concurrency_mode(redb::ConcurrencyMode::MultiWriter).create(path).unwrap();
    let write = database.begin_write().unwrap();
    let rows: Vec<(u128, (u128, u64, u64))> = write
        .open_table(RUN_META_V2)
        .unwrap()
        .iter()
        .unwrap()
        .map(|entry| {
            let (key, value) = entry.unwrap();
            (key.value(), value.value())
        })
        .collect();
    write.delete_table(RUN_META_V2).unwrap();
    {
        let mut old = write.open_table(RUN_META_V1).unwrap();
        for (key, (session, order, mark)) in rows {
            old.insert(key, (session, order, last_seq, mark)).unwrap();
        }
        write.open_table(META).unwrap().insert("schema_version", 1).unwrap();
    }
    write.commit().unwrap();
    drop(database);
    let check =
        Database::builder().set_concurrency_mode(redb::ConcurrencyMode::MultiWriter).create(path).unwrap();
    let read = check.begin_read().unwrap();
    assert_eq!(read.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_1_store_is_migrated_and_keeps_its_turns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    let store = RedbStore::open(&path, RedbOptions::default()).unwrap();
    let session = SessionRecord::new(SessionType::Agent, "old", Subject::user("ann"));
    store.create_session(&session).await.unwrap();
    let run = RunRecord::new(session.id, vec![TurnInputItem::message("hi")], Subject::user("ann"));
    store.put_run(&run, None).await.unwrap();
    store.append_events(run.id, &[event(&run, 1), event(&run, 2)], None).await.unwrap();
    store.raise_high_water(run.id, 40, None).await.unwrap();
    drop(store);
    // Schema 1 kept the last stored seq (2) next to the mark (40).
    downgrade_to_schema_1(&path, 2);

    let store = RedbStore::open(&path, RedbOptions::default()).unwrap();
    assert_eq!(store.high_water(run.id).await.unwrap(), 40);
    let refused = store.append_events(run.id, &[event(&run, 2)], None).await.unwrap_err();
    assert!(matches!(refused, StoreError::Conflict(Conflict::StaleSeq { last: 2, .. })), "{refused:?}");
    store.append_events(run.id, &[event(&run, 3)], None).await.unwrap();
    let seqs: Vec<u64> =
        store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().iter().map(|e| e.event.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    drop(store);

    let database =
        Database::builder().set_concurrency_mode(redb::ConcurrencyMode::MultiWriter).create(&path).unwrap();
    let read = database.begin_read().unwrap();
    assert_eq!(read.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), 2);
}
