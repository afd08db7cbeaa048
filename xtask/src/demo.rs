//! `cargo xtask demo`: runs one turn of a scripted agent through the real runtime on the
//! embedded default store (a SQLite file), and prints its event stream as the harness API
//! sends it (SSE frames), then the answer and where the turn was stored.
//!
//! The scripted model calls the `calculator` tool with the expression it finds in the
//! question (`a op b`, default `6 * 7`), then answers with the result.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use agentry_events::render::harness;
use agentry_memory::Order;
use agentry_model::{ModelRequest, ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, FunctionTool, Runtime, ToolError, TurnRequest};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{Role, TurnState};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde_json::json;

/// Evaluates `a op b` for the demo's calculator tool.
fn calculate(expression: &str) -> Result<f64> {
    let parts: Vec<&str> = expression.split_whitespace().collect();
    let [a, op, b] = parts.as_slice() else { bail!("expected `a op b`, got {expression:?}") };
    let (a, b): (f64, f64) = (a.parse()?, b.parse()?);
    Ok(match *op {
        "+" => a + b,
        "-" => a - b,
        "*" | "x" => a * b,
        "/" if b != 0.0 => a / b,
        _ => bail!("unsupported operator {op:?}"),
    })
}

/// The first `a op b` in a text, or `6 * 7`.
fn expression_in(text: &str) -> String {
    let words: Vec<&str> =
        text.split(|c: char| c.is_whitespace() || c == '?').filter(|w| !w.is_empty()).collect();
    words
        .windows(3)
        .find(|window| calculate(&window.join(" ")).is_ok())
        .map_or_else(|| "6 * 7".to_owned(), |window| window.join(" "))
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Calculation {
    /// `a op b`, with op one of + - * /.
    expression: String,
}

/// The demo agent: a scripted model and a calculator tool.
fn demo_agent() -> Agent {
    let model = ScriptedModel::responder(|request: &ModelRequest| {
        match request.messages.last().filter(|message| message.role == Role::Tool) {
            Some(result) => ScriptedResponse::text(format!("The result is {}.", result.text())).chunked(5),
            None => {
                let question = request.last_user_text().unwrap_or_default();
                ScriptedResponse::text("Let me calculate that.")
                    .with_tool_call("calculator", &json!({ "expression": expression_in(&question) }))
                    .chunked(5)
            }
        }
    });
    let calculator =
        FunctionTool::new("calculator", "Evaluates `a op b`.", |args: Calculation, _| async move {
            calculate(&args.expression)
                .map(|value| value.to_string())
                .map_err(|error| ToolError::Failed(error.to_string()))
        })
        .idempotent();
    Agent::builder("demo", Arc::new(model))
        .instructions("You are a helpful calculator.")
        .tool(calculator.shared())
        .build()
}

/// Runs the demo on the SQLite store at `store`, writing the stream to `out`.
pub async fn run(question: &str, store: &Path, out: &mut impl Write) -> Result<()> {
    if let Some(parent) = store.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let sqlite = SqliteStore::open(store, SqliteOptions::default())
        .with_context(|| format!("opening the store {}", store.display()))?;
    let runtime = Runtime::new(Arc::new(sqlite));
    runtime.register(demo_agent());
    let session = runtime.create_session("demo", Some("cargo xtask demo")).await?;
    let turn = session.create_turn(TurnRequest::message(question)).await?;
    let mut events = turn.stream(None);
    while let Some(event) = events.next().await {
        let event = event?;
        if let Some(rendered) = harness::render(&event) {
            out.write_all(harness::sse_frame(event.seq, &rendered).as_bytes())?;
        }
    }
    let state = turn.wait().await?;
    let answer = match &state {
        TurnState::Done { output, .. } => {
            output.as_ref().and_then(|output| output.message.content.clone()).unwrap_or_default()
        }
        other => bail!("the turn did not finish: {other:?}"),
    };
    let stored = turn.events(Order::Asc).await?.len();
    writeln!(out, ": answer: {answer}")?;
    writeln!(
        out,
        ": stored: {stored} events of turn {} in session {} ({})",
        turn.id(),
        session.id(),
        store.display()
    )?;
    Ok(())
}
