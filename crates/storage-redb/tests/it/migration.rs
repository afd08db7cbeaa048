//! Stores of older schemas open, are migrated to the current one and keep what they hold:
//! schema 1 (whose `run_meta` also held each turn's last stored seq) keeps every turn's seq
//! and mark; events an older build stored in event format 1 still read.

use agentry_memory::conformance::{check_format_1_turn, event, format_1_turn};
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
    assert_eq!(read.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), 5);
}

const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");

/// A store of schema 2, whose events a build before event format 2 wrote, opens, is
/// migrated to the current schema and reads those events; new events take the current
/// format beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_2_store_reads_its_format_1_events_and_adds_new_ones_in_format_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    // The first sample turn's events, as schema 2 stored them.
    let (session, run, old) = format_1_turn();
    let turn = run.id;
    {
        let store = RedbStore::open(&path, RedbOptions::default()).unwrap();
        store.create_session(&session).await.unwrap();
        store.put_run(&run, None).await.unwrap();
        let events: Vec<_> = old.iter().map(|(_, event)| event.clone()).collect();
        store.append_events(turn, &events, None).await.unwrap();
    }
    {
        // The same events in the bytes the older build stored, under the same positions.
        let database = Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .create(&path)
            .unwrap();
        let write = database.begin_write().unwrap();
        {
            let mut events = write.open_table(EVENTS).unwrap();
            let positions: Vec<u64> = events.iter().unwrap().map(|entry| entry.unwrap().0.value()).collect();
            assert_eq!(positions.len(), old.len());
            for (position, (bytes, _)) in positions.into_iter().zip(&old) {
                events.insert(position, bytes.as_slice()).unwrap();
            }
            write.open_table(META).unwrap().insert("schema_version", 2).unwrap();
        }
        write.commit().unwrap();
    }

    let store = RedbStore::open(&path, RedbOptions::default()).unwrap();
    check_format_1_turn(&store, &session, &run).await;
    drop(store);

    let database =
        Database::builder().set_concurrency_mode(redb::ConcurrencyMode::MultiWriter).create(&path).unwrap();
    let read = database.begin_read().unwrap();
    assert_eq!(read.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), 5);
    let formats: Vec<u8> =
        read.open_table(EVENTS).unwrap().iter().unwrap().map(|entry| entry.unwrap().1.value()[0]).collect();
    assert_eq!(formats.last(), Some(&2));
    assert!(formats[..formats.len() - 1].iter().all(|format| *format == 1), "{formats:?}");
}

/// A store of schema 3, which did not index runs by parent nor sessions by owner, is
/// migrated: both are indexed from the records, and turns, members and an owner's
/// sessions are listed by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_3_store_lists_its_members_turns_and_owners_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    let runs = {
        let store = RedbStore::open(&path, RedbOptions::default()).unwrap();
        agentry_memory::conformance::store_runs_with_members(&store).await
    };
    {
        let database = Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .create(&path)
            .unwrap();
        let write = database.begin_write().unwrap();
        // Schema 3's shape: none of the four indexes.
        let session_turns: TableDefinition<'_, (u128, u64), u128> = TableDefinition::new("session_turns");
        let member_runs: TableDefinition<'_, (u128, u64), u128> = TableDefinition::new("member_runs");
        let run_parents: TableDefinition<'_, u128, u128> = TableDefinition::new("run_parents");
        assert!(write.delete_table(session_turns).unwrap());
        assert!(write.delete_table(member_runs).unwrap());
        assert!(write.delete_table(run_parents).unwrap());
        let session_owners: TableDefinition<'_, (&str, i64, u128), ()> =
            TableDefinition::new("session_owners");
        assert!(write.delete_table(session_owners).unwrap());
        write.open_table(META).unwrap().insert("schema_version", 3).unwrap();
        write.commit().unwrap();
    }
    let store = RedbStore::open(&path, RedbOptions::default()).unwrap();
    agentry_memory::conformance::check_runs_with_members(&store, &runs).await;
    drop(store);
    let database =
        Database::builder().set_concurrency_mode(redb::ConcurrencyMode::MultiWriter).create(&path).unwrap();
    let read = database.begin_read().unwrap();
    assert_eq!(read.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), 5);
}
