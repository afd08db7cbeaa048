//! Floors: what SQLite and redb themselves cost for the writes that design §9's storage
//! targets time, with none of Agentry's code around them. One thread, no async, no
//! hand-off, the most favourable layout (16-byte turn keys, one table and, in SQLite, the
//! one index a per-turn read needs), the very bytes the storage benchmark stores per event,
//! one file per benchmark warmed up to the size it keeps, and, in SQLite, passive WAL
//! checkpoints at the size the store's start at, outside the timed part. A store built on
//! either library does at least this work for the same writes, so on the same machine it
//! does not beat these figures by more than the run-to-run noise: `cargo xtask bench`
//! prints each target beside its floor, measured in the same run.
//!
//! - `floor_event_appends_50`: commits of 50 events, one to each of 50 turns, as the group
//!   commit of 50 concurrent writers appending one event per call at best gathers them.
//! - `floor_conversation_25`: 100 commits of one event each, the 4 writes of each of 25
//!   one-tool turns (the turn's start, the journal entry before the call, the result before
//!   the next model call, the end: design §8a's durable boundaries), and, as `1-per-turn`,
//!   25 commits, one a turn, the least any turn synced to disk can cost.
//!
//! Modes: `strict` and `batched` sync every commit as the stores do (SQLite WAL with
//! `synchronous=FULL`; redb `Durability::Immediate` in multi-writer mode, which the
//! cross-process session lease needs). `relaxed` is SQLite's WAL with `synchronous=NORMAL`,
//! the store's mode; redb's floor for `relaxed` is its loosest mode (one process,
//! `Durability::None`, commits kept in memory until a durable one), looser than the store.
//! `-exclusive` rows are redb's single-process mode with one-phase commits, the cheapest
//! synced commit redb has; `-sync-off` is SQLite with `synchronous=OFF`, which no store mode
//! uses (a power loss can corrupt the file).

// A benchmark whose workload fails should stop loudly.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use agentry_benches::{bench_store_dir, event_for};
use agentry_memory::rules::encode_event;
use agentry_types::{RunRecord, SessionId, Subject, TurnInputItem};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redb::{ConcurrencyMode, Database, TableDefinition};
use rusqlite::Connection;

const EVENTS: TableDefinition<'_, (u128, u64), &[u8]> = TableDefinition::new("events");

/// WAL pages after which a SQLite floor checkpoints, outside the timed part: the store's
/// checkpointer starts at the same size.
const CHECKPOINT_PAGES: u64 = 1000;

/// Untimed commits before the timing, so the file and the WAL have reached the size they
/// keep (a WAL that still grows costs each synced commit a change of the file's size).
const WARM_UP_COMMITS: u64 = 2000;

/// The encoded bytes of the storage benchmark's typical event.
fn event_body() -> Vec<u8> {
    let run = RunRecord::new(
        SessionId::new(),
        vec![TurnInputItem::message("What is 6 * 7?")],
        Subject::user("bench"),
    );
    encode_event(&event_for(&run, 1)).unwrap()
}

/// A SQLite file with the least the contract needs: events by store-wide position, and by
/// turn and `seq`.
struct SqliteFloor {
    connection: Connection,
    next_seq: i64,
    commits: u64,
    /// Commits between two checkpoints: about [`CHECKPOINT_PAGES`] of WAL.
    checkpoint_every: u64,
}

impl SqliteFloor {
    fn open(path: &Path, synchronous: &str, turns: u64) -> Self {
        let connection = Connection::open(path).unwrap();
        connection.pragma_update(None, "journal_mode", "WAL").unwrap();
        connection.pragma_update(None, "synchronous", synchronous).unwrap();
        connection.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        connection
            .execute_batch(
                "CREATE TABLE events (position INTEGER PRIMARY KEY, turn BLOB NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL);
                 CREATE UNIQUE INDEX events_by_turn ON events (turn, seq);",
            )
            .unwrap();
        // A commit writes about one index page per turn and a few table pages.
        let checkpoint_every = (CHECKPOINT_PAGES / (turns + 4)).max(1);
        Self { connection, next_seq: 0, commits: 0, checkpoint_every }
    }

    /// One transaction appending one event to each of `turns` turns; returns its time.
    fn commit(&mut self, turns: &[[u8; 16]], body: &[u8]) -> Duration {
        if self.commits.is_multiple_of(self.checkpoint_every) {
            // PASSIVE, as the store's: with no reader in the way it copies the whole WAL, and
            // the next transaction writes the WAL again from its start, in place.
            self.connection.execute_batch("PRAGMA wal_checkpoint(PASSIVE)").unwrap();
        }
        self.commits += 1;
        self.next_seq += 1;
        let started = Instant::now();
        self.connection.execute_batch("BEGIN IMMEDIATE").unwrap();
        {
            let mut insert = self
                .connection
                .prepare_cached("INSERT INTO events (turn, seq, body) VALUES (?1, ?2, ?3)")
                .unwrap();
            for turn in turns {
                insert.execute(rusqlite::params![&turn[..], self.next_seq, body]).unwrap();
            }
        }
        self.connection.execute_batch("COMMIT").unwrap();
        started.elapsed()
    }
}

/// A redb file with one table of events keyed by turn and `seq`.
struct RedbFloor {
    database: Database,
    durable: bool,
    two_phase: bool,
    next_seq: u64,
}

impl RedbFloor {
    fn open(path: &Path, mode: ConcurrencyMode, durable: bool) -> Self {
        let database = Database::builder().set_concurrency_mode(mode).create(path).unwrap();
        // Multi-writer mode commits in two phases whatever is asked.
        let two_phase = mode == ConcurrencyMode::MultiWriter;
        Self { database, durable, two_phase, next_seq: 0 }
    }

    fn commit(&mut self, turns: &[u128], body: &[u8]) -> Duration {
        self.next_seq += 1;
        let started = Instant::now();
        let mut transaction = self.database.begin_write().unwrap();
        if !self.durable {
            transaction.set_durability(redb::Durability::None).unwrap();
        }
        transaction.set_two_phase_commit(self.two_phase);
        {
            let mut table = transaction.open_table(EVENTS).unwrap();
            for turn in turns {
                table.insert((*turn, self.next_seq), body).unwrap();
            }
        }
        transaction.commit().unwrap();
        started.elapsed()
    }
}

/// A floor to time: SQLite in a `synchronous` mode, or redb in a concurrency mode, synced
/// or not.
#[derive(Clone, Copy)]
enum Floor {
    Sqlite(&'static str),
    Redb(ConcurrencyMode, bool),
}

const APPEND_FLOORS: [(&str, Floor); 6] = [
    ("sqlite/batched", Floor::Sqlite("FULL")),
    ("sqlite/relaxed", Floor::Sqlite("NORMAL")),
    ("sqlite/relaxed-sync-off", Floor::Sqlite("OFF")),
    ("redb/batched", Floor::Redb(ConcurrencyMode::MultiWriter, true)),
    ("redb/batched-exclusive", Floor::Redb(ConcurrencyMode::ExclusiveWriter, true)),
    ("redb/relaxed", Floor::Redb(ConcurrencyMode::ExclusiveWriter, false)),
];

const CONVERSATION_FLOORS: [(&str, Floor); 5] = [
    ("sqlite/strict", Floor::Sqlite("FULL")),
    ("sqlite/relaxed", Floor::Sqlite("NORMAL")),
    ("redb/strict", Floor::Redb(ConcurrencyMode::MultiWriter, true)),
    ("redb/strict-exclusive", Floor::Redb(ConcurrencyMode::ExclusiveWriter, true)),
    ("redb/relaxed", Floor::Redb(ConcurrencyMode::ExclusiveWriter, false)),
];

/// A floor's file, opened once per benchmark and warmed up, appending to `turns` turns.
enum FloorFile {
    Sqlite(SqliteFloor, Vec<[u8; 16]>),
    Redb(RedbFloor, Vec<u128>),
}

impl FloorFile {
    fn open(floor: Floor, dir: &Path, turns: u64, body: &[u8]) -> Self {
        let keys = (1..=u128::from(turns)).map(|turn| turn << 64 | turn);
        let mut file = match floor {
            Floor::Sqlite(synchronous) => Self::Sqlite(
                SqliteFloor::open(&dir.join("floor.db"), synchronous, turns),
                keys.map(u128::to_be_bytes).collect(),
            ),
            Floor::Redb(mode, durable) => {
                Self::Redb(RedbFloor::open(&dir.join("floor.redb"), mode, durable), keys.collect())
            }
        };
        // `cargo test` runs each benchmark once to see that it works: no warm-up for that.
        if std::env::args().any(|arg| arg == "--bench") {
            for _ in 0..WARM_UP_COMMITS {
                file.commit(body);
            }
        }
        file
    }

    fn commit(&mut self, body: &[u8]) -> Duration {
        match self {
            Self::Sqlite(file, keys) => file.commit(keys, body),
            Self::Redb(file, keys) => file.commit(keys, body),
        }
    }

    /// The time of `iters` rounds of `commits` commits.
    fn time(&mut self, iters: u64, commits: u64, body: &[u8]) -> Duration {
        (0..iters * commits).map(|_| self.commit(body)).sum()
    }
}

fn event_appends(c: &mut Criterion) {
    let body = event_body();
    let mut group = c.benchmark_group("floor_event_appends_50");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(50));
    for (name, floor) in APPEND_FLOORS {
        // Opened in the closure, which runs only when the filter selects the benchmark.
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            let dir = bench_store_dir().unwrap();
            let mut file = FloorFile::open(floor, dir.path(), 50, &body);
            b.iter_custom(|iters| file.time(iters, 1, &body));
        });
    }
    group.finish();
}

fn conversation(c: &mut Criterion) {
    let body = event_body();
    let mut group = c.benchmark_group("floor_conversation_25");
    group.sample_size(10);
    for (name, floor) in CONVERSATION_FLOORS {
        for (writes_per_turn, suffix) in [(4, ""), (1, "/1-per-turn")] {
            group.bench_function(BenchmarkId::from_parameter(format!("{name}{suffix}")), |b| {
                let dir = bench_store_dir().unwrap();
                let mut file = FloorFile::open(floor, dir.path(), 1, &body);
                b.iter_custom(|iters| file.time(iters, 25 * writes_per_turn, &body));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, event_appends, conversation);
criterion_main!(benches);
