//! Runner benchmarks (design §9):
//! - `agent_construction`: building an agent with one tool;
//! - `one_turn`: one turn on the in-memory store (the scripted model calls one tool, then
//!   answers), from `create_turn` to the end of `wait`;
//! - `conversation_25`: a 25-turn conversation of such turns, per backend and durability
//!   (the caller, like `one_turn`'s, a task of the multi-thread runtime; in memory also on
//!   a current-thread runtime);
//! - `fan_out_100`: one turn of 1,000 deltas streamed to 100 live subscribers
//!   (throughput in deliveries);
//! - `recovery_pass`: a crash-recovery pass (`Runtime::recover`) over a SQLite store of
//!   10,000 sessions whose turns all ended, with nothing to recover.
//!
//! Each timed session is deleted after its timing, so the in-memory store stays the same
//! size over criterion's many iterations: kept, 100,000 turns would grow its heap by over a
//! gigabyte and the figure would mostly measure the page faults of fresh memory.

// A benchmark whose workload fails should stop loudly.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry_benches::{bench_store_dir, open_store, tool_then_answer};
use agentry_memory::{Durability, InMemoryStore, Store};
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, FunctionTool, Runtime, RuntimeOptions, Tool, ToolError, TurnRequest};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, Timestamp, TurnInputItem, TurnState};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Multiply {
    a: i64,
    b: i64,
}

fn multiply() -> Arc<dyn Tool> {
    FunctionTool::new("multiply", "Multiplies two integers.", |args: Multiply, _| async move {
        Ok::<_, ToolError>((args.a * args.b).to_string())
    })
    .shared()
}

fn runner(store: Arc<dyn Store>) -> Runtime {
    let options = RuntimeOptions { live_retention: Duration::ZERO, ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(store, options);
    runtime.register(Agent::builder("bench", tool_then_answer()).tool(multiply()).build());
    runtime
}

fn agent_construction(c: &mut Criterion) {
    let model = tool_then_answer();
    let tool = multiply();
    c.bench_function("agent_construction", |b| {
        b.iter(|| {
            Agent::builder("bench", model.clone()).instructions("Be brief.").tool(tool.clone()).build()
        });
    });
}

fn one_turn(c: &mut Criterion) {
    let multi = tokio_runtime();
    let single = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for (name, tokio) in [("current_thread", &single), ("multi_thread", &multi)] {
        let runtime = runner(Arc::new(InMemoryStore::new()));
        c.bench_function(&format!("one_turn/memory/{name}"), |b| {
            b.to_async(tokio).iter_custom(|iters| {
                let runtime = runtime.clone();
                // The caller runs as a task of the runtime, as a server's request handler does.
                async move { tokio::spawn(timed_turns(runtime, iters)).await.unwrap() }
            });
        });
    }
}

/// Runs `iters` one-turn sessions and returns the time spent in the turns.
async fn timed_turns(runtime: Runtime, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let session = runtime.create_session("bench", None).await.unwrap();
        let started = Instant::now();
        let turn = session.create_turn(TurnRequest::message("What is 6 * 7?")).await.unwrap();
        turn.wait().await.unwrap();
        total += started.elapsed();
        runtime.store().delete_session(session.id()).await.unwrap();
    }
    total
}

/// Runs `iters` 25-turn conversations and returns the time spent in their turns.
async fn timed_conversations(runtime: Runtime, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let session = runtime.create_session("bench", None).await.unwrap();
        let started = Instant::now();
        for turn in 0..25 {
            let request = TurnRequest::message(format!("Turn {turn}: what is 6 * 7?"));
            session.create_turn(request).await.unwrap().wait().await.unwrap();
        }
        total += started.elapsed();
        runtime.store().delete_session(session.id()).await.unwrap();
    }
    total
}

struct Backend {
    name: &'static str,
    durability: Durability,
}

fn conversation_25(c: &mut Criterion) {
    let tokio = tokio_runtime();
    let mut group = c.benchmark_group("conversation_25");
    group.sample_size(10);
    let backends = [
        Backend { name: "memory", durability: Durability::Relaxed },
        Backend { name: "sqlite", durability: Durability::Strict },
        Backend { name: "sqlite", durability: Durability::Relaxed },
        Backend { name: "redb", durability: Durability::Strict },
        Backend { name: "redb", durability: Durability::Relaxed },
    ];
    // The in-memory conversation also on a current-thread runtime, as `one_turn` is: the
    // multi-thread runtime adds its cross-worker wake-ups to every turn.
    let single = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runtime = runner(Arc::new(InMemoryStore::new()));
    group.bench_function(BenchmarkId::from_parameter("memory/current_thread"), |b| {
        b.to_async(&single).iter_custom(|iters| {
            let runtime = runtime.clone();
            async move { tokio::spawn(timed_conversations(runtime, iters)).await.unwrap() }
        });
    });
    for backend in backends {
        let dir = bench_store_dir().unwrap();
        let store: Arc<dyn Store> = if backend.name == "memory" {
            Arc::new(InMemoryStore::new())
        } else {
            open_store(backend.name, &dir.path().join(format!("bench.{}", backend.name)), backend.durability)
                .unwrap()
        };
        let runtime = runner(store);
        let id = format!("{}/{}", backend.name, backend.durability.as_str());
        group.bench_function(BenchmarkId::from_parameter(id), |b| {
            b.to_async(&tokio).iter_custom(|iters| {
                let runtime = runtime.clone();
                // The caller runs as a task of the runtime, as a server's request handler does.
                async move { tokio::spawn(timed_conversations(runtime, iters)).await.unwrap() }
            });
        });
    }
    group.finish();
}

fn fan_out_100(c: &mut Criterion) {
    const SUBSCRIBERS: usize = 100;
    let tokio = tokio_runtime();
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse {
        chunk_chars: Some(1),
        ..ScriptedResponse::text("x".repeat(1000))
    }));
    let options = RuntimeOptions { live_retention: Duration::from_secs(2), ..RuntimeOptions::default() };
    // The live log outlives the turn a little: subscribers that arrive after a fast turn
    // ended still read it (with no retention they would get the stored log, without deltas).
    let runtime = Runtime::with_options(Arc::new(InMemoryStore::new()), options);
    runtime.register(Agent::builder("fan", model).build());
    // 1,000 text deltas, the finishing delta, the message, the answer step, turn.created and turn.done.
    let events_per_turn = 1005u64;
    let mut group = c.benchmark_group("fan_out_100");
    group.throughput(Throughput::Elements(events_per_turn * SUBSCRIBERS as u64));
    group.bench_function("memory", |b| {
        b.to_async(&tokio).iter_custom(|iters| {
            let runtime = runtime.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let session = runtime.create_session("fan", None).await.unwrap();
                    let started = Instant::now();
                    let turn = session.create_turn(TurnRequest::message("Stream")).await.unwrap();
                    let subscribers: Vec<_> = (0..SUBSCRIBERS)
                        .map(|_| {
                            let mut stream = turn.stream(None);
                            tokio::spawn(async move {
                                let mut count = 0u64;
                                while let Some(event) = stream.next().await {
                                    event.unwrap();
                                    count += 1;
                                }
                                count
                            })
                        })
                        .collect();
                    for subscriber in subscribers {
                        assert_eq!(subscriber.await.unwrap(), events_per_turn);
                    }
                    total += started.elapsed();
                }
                total
            }
        });
    });
    group.finish();
}

fn recovery_pass(c: &mut Criterion) {
    const SESSIONS: usize = 10_000;
    let tokio = tokio_runtime();
    let dir = bench_store_dir().unwrap();
    let store = open_store("sqlite", &dir.path().join("bench.sqlite"), Durability::Relaxed).unwrap();
    tokio.block_on(async {
        // Written concurrently, so the group commit fills large transactions.
        let writers = (0..50).map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                for _ in 0..SESSIONS / 50 {
                    let session = SessionRecord::new(SessionType::Agent, "bench", Subject::user("bench"));
                    store.create_session(&session).await.unwrap();
                    let mut run =
                        RunRecord::new(session.id, vec![TurnInputItem::message("hi")], session.owner.clone());
                    run.set_state(TurnState::Done {
                        output: None,
                        required_actions: Vec::new(),
                        completed_at: Timestamp::now(),
                        metrics: None,
                    });
                    store.put_run(&run, None).await.unwrap();
                }
            })
        });
        for writer in futures_util::future::join_all(writers).await {
            writer.unwrap();
        }
    });
    let runtime = runner(store);
    let mut group = c.benchmark_group("recovery_pass");
    group.bench_function("sqlite/10000_sessions", |b| {
        b.to_async(&tokio).iter(|| async { assert!(runtime.recover().await.unwrap().is_empty()) });
    });
    group.finish();
}

criterion_group!(benches, agent_construction, one_turn, conversation_25, fan_out_100, recovery_pass);
criterion_main!(benches);
