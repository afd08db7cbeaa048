//! Team overhead (issue 5): one team turn whose coordinator delegates to four members at
//! once (each answers in one model call), against four single-agent turns doing the same
//! member work, on the in-memory store.

// A benchmark whose workload fails should stop loudly.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry_memory::InMemoryStore;
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, Runtime, RuntimeOptions, TurnRequest};
use agentry_team::Team;
use agentry_types::Role;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

fn member(name: &str) -> Agent {
    let model = ScriptedModel::responder(|_| ScriptedResponse::text("member answer")).without_request_log();
    Agent::builder(name, Arc::new(model)).build()
}

fn runtime() -> Runtime {
    let options = RuntimeOptions { live_retention: Duration::ZERO, ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(Arc::new(InMemoryStore::new()), options);
    let coordinator = ScriptedModel::responder(|request| {
        if request.messages.iter().any(|message| message.role == Role::Tool) {
            ScriptedResponse::text("team answer")
        } else {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Answer."}))
        }
    });
    let coordinator = Arc::new(coordinator.without_request_log());
    let mut team = Team::builder("team", coordinator);
    for index in 0..4 {
        team = team.member(member(&format!("m{index}")));
    }
    runtime.register(team.build());
    runtime.register(member("single"));
    runtime
}

async fn timed(runtime: &Runtime, agent: &str, turns: usize, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let session = runtime.create_session(agent, None).await.unwrap();
        let started = Instant::now();
        for _ in 0..turns {
            session.create_turn(TurnRequest::message("Go.")).await.unwrap().wait().await.unwrap();
        }
        total += started.elapsed();
        // As in the runner benchmarks: a steady store, so the figure is the turns' cost and
        // not the page faults of a store growing over criterion's iterations.
        runtime.store().delete_session(session.id()).await.unwrap();
    }
    total
}

fn team_overhead(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runtime = runtime();
    let mut group = c.benchmark_group("team_vs_single");
    group.bench_function("team_turn_4_members", |b| {
        b.to_async(&tokio).iter_custom(|iters| {
            let runtime = runtime.clone();
            async move { timed(&runtime, "team", 1, iters).await }
        });
    });
    group.bench_function("four_single_agent_turns", |b| {
        b.to_async(&tokio).iter_custom(|iters| {
            let runtime = runtime.clone();
            async move { timed(&runtime, "single", 4, iters).await }
        });
    });
    group.finish();
}

criterion_group!(benches, team_overhead);
criterion_main!(benches);
