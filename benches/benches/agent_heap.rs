//! Heap used by constructing an agent with one tool (design §9: at most 1 KiB): counted by
//! an instrumented global allocator around the construction, in its own bench binary so
//! the counting does not slow the other benchmarks.

// A measurement binary reports on standard output.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::alloc::System;
use std::sync::Arc;

use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, FunctionTool, ToolError};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Multiply {
    a: i64,
    b: i64,
}

fn main() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("42")]));
    let tool = FunctionTool::new("multiply", "Multiplies two integers.", |args: Multiply, _| async move {
        Ok::<_, ToolError>((args.a * args.b).to_string())
    })
    .shared();
    const AGENTS: usize = 1000;
    let region = Region::new(GLOBAL);
    let agents: Vec<Agent> = (0..AGENTS)
        .map(|_| Agent::builder("bench", model.clone()).instructions("Be brief.").tool(tool.clone()).build())
        .collect();
    let change = region.change();
    // The vector holding the agents is not part of an agent.
    let vector = AGENTS * std::mem::size_of::<Agent>();
    let per_agent = (change.bytes_allocated - vector) / AGENTS;
    let allocations = (change.allocations - 1) / AGENTS;
    println!(
        "agent_construction_heap: {per_agent} bytes in {allocations} allocations per agent (target: at most 1024 bytes)"
    );
    drop(agents);
    assert!(per_agent <= 1024, "an agent with one tool takes {per_agent} bytes of heap, more than 1 KiB");
    turn_allocations(tool);
}

/// Reports the allocations of one turn (the scripted model calls `multiply`, then answers)
/// on the in-memory store: what the runtime's per-turn work costs the allocator.
fn turn_allocations(tool: Arc<dyn agentry_runner::Tool>) {
    use agentry_memory::InMemoryStore;
    use agentry_runner::{Runtime, RuntimeOptions, TurnRequest};
    let model = agentry_benches::tool_then_answer();
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let options = RuntimeOptions { live_retention: std::time::Duration::ZERO, ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(Arc::new(InMemoryStore::new()), options);
    runtime.register(Agent::builder("bench", model).tool(tool).build());
    const TURNS: usize = 200;
    let (allocations, bytes, retained) = tokio.block_on(async {
        let mut sessions = Vec::new();
        for _ in 0..TURNS {
            sessions.push(runtime.create_session("bench", None).await.unwrap());
        }
        // One warm-up turn: lazily built state (the lease keeper) is not a turn's cost.
        sessions[0].create_turn(TurnRequest::message("warm up")).await.unwrap().wait().await.unwrap();
        let region = Region::new(GLOBAL);
        for session in &sessions[1..] {
            session.create_turn(TurnRequest::message("What is 6 * 7?")).await.unwrap().wait().await.unwrap();
        }
        let change = region.change();
        let retained = (change.bytes_allocated + change.bytes_reallocated.max(0) as usize)
            .saturating_sub(change.bytes_deallocated);
        (change.allocations / (TURNS - 1), change.bytes_allocated / (TURNS - 1), retained / (TURNS - 1))
    });
    println!(
        "one_turn_heap: {allocations} allocations, {bytes} bytes allocated, {retained} bytes kept per turn (in-memory store)"
    );
}
