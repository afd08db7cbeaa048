//! Storage benchmarks, per backend (in-memory as the baseline, SQLite, redb):
//! - `append_run`: the cost of appending a run to a session holding about 10 or 10,000 runs
//!   (flat cost as sessions grow; see [`TIMED_APPENDS`] for how the sizes are kept);
//! - `event_appends_50_writers`: durable event appends from 50 concurrent writers, one event
//!   per call, in each durability mode, and eight per call under `relaxed`;
//! - `replay_1000_events`: reading one turn's 1,000 stored events;
//! - `history_window_20`: loading a 20-message history window from a session with 10,000 runs;
//! - `member_listing`: listing the 4 members of a session's first turn when the session holds
//!   10 or 10,000 runs (turns of 4 members each; flat: runs are indexed by parent);
//! - `owner_listing`: listing the 5 sessions of one owner, its oldest, when the store holds
//!   10 or 10,000 sessions of others (flat: sessions are indexed by owner).
//!
//! Stores live under `target/bench-stores` on the real disk, so syncs cost what they cost.

// A benchmark whose workload fails should stop loudly.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry_benches::{bench_store_dir, event_for, open_store};
use agentry_memory::{
    Durability, HistoryQuery, InMemoryStore, Order, PageRequest, ParentFilter, RunQuery, SessionQuery, Store,
};
use agentry_types::{Message, RunRecord, SessionId, SessionRecord, SessionType, Subject, TurnInputItem};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;

const BACKENDS: [&str; 3] = ["memory", "sqlite", "redb"];

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

struct Fresh {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

fn fresh(backend: &str, durability: Durability) -> Fresh {
    if backend == "memory" {
        return Fresh { store: Arc::new(InMemoryStore::new()), _dir: None };
    }
    let dir = bench_store_dir().unwrap();
    let store = open_store(backend, &dir.path().join(format!("bench.{backend}")), durability).unwrap();
    Fresh { store, _dir: Some(dir) }
}

async fn session(store: &dyn Store) -> SessionId {
    let session = SessionRecord::new(SessionType::Agent, "bench", Subject::user("bench"));
    store.create_session(&session).await.unwrap();
    session.id
}

fn run(session: SessionId) -> RunRecord {
    RunRecord::new(session, vec![TurnInputItem::message("What is 6 * 7?")], Subject::user("bench"))
}

async fn fill(store: &Arc<dyn Store>, session: SessionId, runs: usize, messages: bool) {
    // Concurrent writers so the group commit fills large transactions.
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in (worker..runs).step_by(8) {
                let record = run(session);
                store.put_run(&record, None).await.unwrap();
                if messages {
                    store
                        .append_messages(
                            record.id,
                            &[Arc::new(Message::user("q")), Arc::new(Message::assistant("a"))],
                            None,
                        )
                        .await
                        .unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// At most this many appends are timed per sample (when criterion asks for more
/// iterations, the time per append measured over these is scaled up), so the sessions stay
/// near their size however fast the backend is.
const TIMED_APPENDS: u64 = 1_000;

/// Appending run k to a session of k = 10 or k = 10,000 runs, in stores of the same total
/// size (10,000 runs: one session of 10,000, or 1,000 sessions of 10), so that only the
/// session's size differs. The k = 10 appends go round the 1,000 sessions.
fn append_run(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("append_run");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for backend in BACKENDS {
        for k in [10usize, 10_000] {
            let fresh = fresh(backend, Durability::Relaxed);
            let store = fresh.store.clone();
            let sessions: Vec<SessionId> = runtime.block_on(async {
                let mut ids = Vec::new();
                for _ in 0..10_000 / k {
                    let id = session(&*store).await;
                    fill(&store, id, k, false).await;
                    ids.push(id);
                }
                ids
            });
            let mut next = 0usize;
            group.bench_with_input(BenchmarkId::new(backend, format!("k={k}")), &k, |b, _| {
                b.to_async(&runtime).iter_custom(|iters| {
                    let store = store.clone();
                    let appends = iters.min(TIMED_APPENDS);
                    let targets: Vec<SessionId> = (0..appends)
                        .map(|_| {
                            next += 1;
                            sessions[next % sessions.len()]
                        })
                        .collect();
                    async move {
                        if appends == 0 {
                            return Duration::ZERO;
                        }
                        let started = Instant::now();
                        for session in targets {
                            store.put_run(&run(session), None).await.unwrap();
                        }
                        let elapsed = started.elapsed();
                        #[allow(clippy::cast_precision_loss)]
                        elapsed.mul_f64(iters as f64 / appends as f64)
                    }
                });
            });
        }
    }
    group.finish();
}

/// 50 concurrent writers (turns) appending events: one event per call in each durability
/// mode, and under `relaxed` also eight events per call (a turn coalescing the events it
/// emitted while its previous append was in flight).
fn event_appends(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("event_appends_50_writers");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    let modes = [
        (Durability::Strict, 1),
        (Durability::Batched, 1),
        (Durability::Relaxed, 1),
        (Durability::Relaxed, 8),
    ];
    for backend in BACKENDS {
        for (durability, per_call) in modes {
            if backend == "memory" && durability == Durability::Strict {
                continue;
            }
            let per_writer: u64 = match durability {
                Durability::Strict => 4,
                Durability::Batched => 40,
                Durability::Relaxed => 200 * per_call as u64,
            };
            let fresh = fresh(backend, durability);
            let store = fresh.store.clone();
            let name = if per_call == 1 {
                durability.as_str().to_owned()
            } else {
                format!("{durability}/{per_call}-per-call")
            };
            group.throughput(Throughput::Elements(50 * per_writer));
            group.bench_function(BenchmarkId::new(backend, name), |b| {
                b.to_async(&runtime).iter_custom(|iters| {
                    let store = store.clone();
                    async move {
                        let session = session(&*store).await;
                        let mut runs = Vec::new();
                        for _ in 0..50 {
                            let record = run(session);
                            store.put_run(&record, None).await.unwrap();
                            runs.push(record);
                        }
                        let mut next_seq = 0u64;
                        let started = Instant::now();
                        for _ in 0..iters {
                            let mut tasks = Vec::new();
                            for record in runs.clone() {
                                let store = store.clone();
                                let first = next_seq + 1;
                                tasks.push(tokio::spawn(async move {
                                    let seqs: Vec<u64> = (first..first + per_writer).collect();
                                    for chunk in seqs.chunks(per_call) {
                                        let events: Vec<_> =
                                            chunk.iter().map(|seq| event_for(&record, *seq)).collect();
                                        store.append_events(record.id, &events, None).await.unwrap();
                                    }
                                }));
                            }
                            for task in tasks {
                                task.await.unwrap();
                            }
                            next_seq += per_writer;
                        }
                        started.elapsed()
                    }
                });
            });
        }
    }
    group.finish();
}

fn replay(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("replay_1000_events");
    group.throughput(Throughput::Elements(1000));
    for backend in BACKENDS {
        let fresh = fresh(backend, Durability::Relaxed);
        let store = fresh.store.clone();
        let turn = runtime.block_on(async {
            let session = session(&*store).await;
            let record = run(session);
            store.put_run(&record, None).await.unwrap();
            for chunk in (1..=1000u64).collect::<Vec<_>>().chunks(100) {
                let events: Vec<_> = chunk.iter().map(|seq| event_for(&record, *seq)).collect();
                store.append_events(record.id, &events, None).await.unwrap();
            }
            record.id
        });
        group.bench_function(backend, |b| {
            b.to_async(&runtime).iter(|| {
                let store = store.clone();
                async move {
                    let events = store.turn_events(turn, Order::Asc, None, 1000).await.unwrap();
                    assert_eq!(events.len(), 1000);
                    events
                }
            });
        });
    }
    group.finish();
}

fn history_window(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("history_window_20");
    for backend in BACKENDS {
        let fresh = fresh(backend, Durability::Relaxed);
        let store = fresh.store.clone();
        let session = runtime.block_on(async {
            let id = session(&*store).await;
            fill(&store, id, 10_000, true).await;
            id
        });
        group.bench_function(backend, |b| {
            b.to_async(&runtime).iter(|| {
                let store = store.clone();
                async move {
                    let query = HistoryQuery { last_messages: Some(20), ..HistoryQuery::default() };
                    let window = store.history(session, &query).await.unwrap();
                    assert_eq!(window.len(), 20);
                    window
                }
            });
        });
    }
    group.finish();
}

/// Stores `runs` runs in a session: turns of 4 members each. Returns the first turn's id.
async fn fill_teams(store: &Arc<dyn Store>, session: SessionId, runs: usize) -> agentry_types::TurnId {
    let mut turn = run(session);
    let first = turn.id;
    for index in 0..runs {
        if index > 0 && index % 5 == 0 {
            turn = run(session);
        }
        if index % 5 == 0 {
            store.put_run(&turn, None).await.unwrap();
        } else {
            let mut member = run(session);
            member.parent_run_id = Some(turn.id);
            store.put_run(&member, None).await.unwrap();
        }
    }
    first
}

fn member_listing(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("member_listing");
    for backend in BACKENDS {
        for k in [10usize, 10_000] {
            let fresh = fresh(backend, Durability::Relaxed);
            let store = fresh.store.clone();
            let (session, first) = runtime.block_on(async {
                let id = session(&*store).await;
                let first = fill_teams(&store, id, k).await;
                (id, first)
            });
            group.bench_with_input(BenchmarkId::new(backend, format!("k={k}")), &k, |b, _| {
                b.to_async(&runtime).iter(|| {
                    let store = store.clone();
                    async move {
                        let query = RunQuery { parent: ParentFilter::Of(first), ..RunQuery::default() };
                        let members =
                            store.list_runs(session, &query, &PageRequest::first(100)).await.unwrap();
                        assert_eq!(members.items.len(), 4);
                        members
                    }
                });
            });
        }
    }
    group.finish();
}

fn owner_listing(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("owner_listing");
    for backend in BACKENDS {
        for k in [10usize, 10_000] {
            let fresh = fresh(backend, Durability::Relaxed);
            let store = fresh.store.clone();
            runtime.block_on(async {
                for index in 0..k + 5 {
                    let owner = if index < 5 { "rare".to_owned() } else { format!("user{}", index % 100) };
                    let session = SessionRecord::new(SessionType::Agent, "bench", Subject::user(owner));
                    store.create_session(&session).await.unwrap();
                }
            });
            group.bench_with_input(BenchmarkId::new(backend, format!("k={k}")), &k, |b, _| {
                b.to_async(&runtime).iter(|| {
                    let store = store.clone();
                    async move {
                        let query =
                            SessionQuery { owner: Some("rare".to_owned()), ..SessionQuery::default() };
                        let sessions = store.list_sessions(&query, &PageRequest::first(20)).await.unwrap();
                        assert_eq!(sessions.items.len(), 5);
                        sessions
                    }
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, append_run, event_appends, replay, history_window, member_listing, owner_listing);
criterion_main!(benches);
