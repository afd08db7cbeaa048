//! Agentry's runner: agents, tools, and the turn engine that runs them.
//!
//! A [`Runtime`] holds registered [`Agent`]s over a store (`Arc<dyn Store>`). Sessions hold
//! conversations; each [`Session::create_turn`] starts one turn, which streams events
//! (numbered by one sequencer per turn, stored when durable, kept in a live log for
//! subscribers), calls the model, runs tools (validated, journaled, in parallel), pauses
//! for approvals or client-side tools, and ends `done`, `cancelled` or `error`.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use agentry_memory::InMemoryStore;
//! use agentry_model::{ScriptedModel, ScriptedResponse};
//! use agentry_runner::{Agent, FunctionTool, Runtime, ToolError, TurnRequest};
//! use futures_util::StreamExt;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Add { a: i64, b: i64 }
//! let add = FunctionTool::new("add", "Adds two integers.", |args: Add, _| async move {
//!     Ok::<_, ToolError>((args.a + args.b).to_string())
//! });
//! let model = Arc::new(ScriptedModel::new(vec![
//!     ScriptedResponse::tool_call("add", &serde_json::json!({"a": 2, "b": 3})),
//!     ScriptedResponse::text("2 + 3 = 5"),
//! ]));
//! let runtime = Runtime::new(Arc::new(InMemoryStore::new()));
//! runtime.register(Agent::builder("math", model).tool(add.shared()).build());
//! let session = runtime.create_session("math", None).await?;
//! let mut events = session.create_turn_streaming(TurnRequest::message("What is 2 + 3?")).await?;
//! let mut kinds = Vec::new();
//! while let Some(event) = events.next().await {
//!     kinds.push(event?.payload.kind());
//! }
//! assert_eq!(kinds.first(), Some(&"turn.created"));
//! assert!(kinds.contains(&"tool.response"));
//! assert_eq!(kinds.last(), Some(&"turn.done"));
//! # Ok::<_, agentry_runner::RunnerError>(())
//! # }).unwrap();
//! ```

mod agent;
mod budget;
mod engine;
mod error;
mod input;
mod live;
mod runtime;
#[cfg(feature = "scenarios")]
pub mod scenarios;
mod streaming;
mod tool;

pub use agent::{Agent, AgentBuilder, AgentLimits, AgentMemory, DEFAULT_MAX_TOOL_OUTPUT_BYTES};
pub use budget::{Exhausted, Refused, Settled, Spent, Step, StepBudget};
pub use engine::CancelToken;
pub use error::{RunnerError, RuntimeResult};
pub use live::EventStream;
pub use runtime::{
    MAX_IDEMPOTENCY_KEY, PreviousTurn, Runtime, RuntimeOptions, Session, TurnHandle, TurnRequest,
    turn_id_for_key,
};
pub use streaming::{AdalFlowEventStream, RunnerStreamingResult};
pub use tool::{
    ASK_USER_QUESTION, FunctionTool, SchemaValidator, ThreadInstance, ThreadResult, Tool, ToolContext,
    ToolError, ask_user_question, parameters_schema,
};
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "mcp")]
pub use mcp::{MCP_INHERITED_ENV, McpConnection, McpError, McpServerConfig, McpServerTransport, McpTool};
