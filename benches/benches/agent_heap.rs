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
}
