//! `agentry-turns`: runs agent turns in a separate process, for the crash-recovery and
//! cross-process tests of the runner.
//!
//! - `agentry-turns start <backend> <path> <counter file>` creates a session of the `steps`
//!   agent and a turn, printing `turn <session> <turn>` and then `event <seq> <kind>` for
//!   every event it streams, until `final …`. The test kills it with SIGKILL part way.
//! - `agentry-turns recover <backend> <path> <counter file> <turn> <after seq>` waits for
//!   the dead process's lease to expire, recovers the turn, prints the turn's events after
//!   `<after seq>` as `event <seq> <kind>`, resolves calls left in doubt the way a person
//!   would (a charge the counter file shows as made is denied, otherwise allowed), printing
//!   `indoubt <call id> <ran|notran>`, and ends with `final <status> <answer>`.
//! - `agentry-turns try-turn <backend> <path> <session>` tries to create a turn on the
//!   session and prints `ok <state>`, `running` (another turn holds the session) or
//!   `error <message>`.
//!
//! The `steps` agent's scripted model calls, one per model message, `charge` (not
//! idempotent), `lookup` (idempotent), `charge`, `lookup`, `charge`, then answers. Both tools
//! append `<tool> <call id>` to the counter file, synced, so the file proves how often each
//! call ran.

// A workload driver reports on standard output.
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentry_benches::open_store;
use agentry_events::EventPayload;
use agentry_memory::{Durability, Order, Store};
use agentry_model::{ScriptedModel, ScriptedResponse, ScriptedToolCall};
use agentry_runner::{
    Agent, FunctionTool, RunnerError, Runtime, RuntimeOptions, ToolError, TurnHandle, TurnRequest,
};
use agentry_types::{
    ApprovalDecision, RequiredAction, Role, Timestamp, TurnInputItem, TurnState, UserToolApproval,
};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;

const PLAN: [&str; 5] = ["charge", "lookup", "charge", "lookup", "charge"];

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Amount {
    amount: u32,
}

fn record(counter: &Path, line: &str) -> Result<(), ToolError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(counter)
        .map_err(|error| ToolError::Failed(error.to_string()))?;
    // One write of the whole line: `writeln!` on a file writes the text and its newline
    // separately, and a kill between the two left a line run into the next one.
    file.write_all(format!("{line}\n").as_bytes()).map_err(|error| ToolError::Failed(error.to_string()))?;
    file.sync_data().map_err(|error| ToolError::Failed(error.to_string()))
}

/// The agent whose turns the tests crash.
fn steps_agent(counter: PathBuf) -> Agent {
    let model = ScriptedModel::responder(|request| {
        let since_user = request.messages.iter().rev().take_while(|message| message.role != Role::User);
        let done = since_user.filter(|message| message.role == Role::Tool).count();
        let base = ScriptedResponse { chunk_chars: Some(4), ..ScriptedResponse::default() }
            .delayed(Duration::from_millis(2));
        match PLAN.get(done) {
            Some(tool) => ScriptedResponse {
                text: Some(format!("Step {done}: {tool}.")),
                tool_calls: vec![ScriptedToolCall {
                    id: Some(format!("step{done}")),
                    name: (*tool).to_owned(),
                    arguments: format!(r#"{{"amount": {}}}"#, 10 + done),
                }],
                ..base
            },
            None => ScriptedResponse { text: Some("All five steps are done.".to_owned()), ..base },
        }
    });
    let charge_counter = counter.clone();
    let charge =
        FunctionTool::new("charge", "Charges an amount (not idempotent).", move |args: Amount, context| {
            let counter = charge_counter.clone();
            async move {
                record(&counter, &format!("charge {}", context.tool_call_id))?;
                Ok(format!("charged {}", args.amount))
            }
        });
    let lookup =
        FunctionTool::new("lookup", "Looks an amount up (idempotent).", move |args: Amount, context| {
            let counter = counter.clone();
            async move {
                record(&counter, &format!("lookup {}", context.tool_call_id))?;
                Ok(format!("found {}", args.amount))
            }
        })
        .idempotent();
    Agent::builder("steps", Arc::new(model)).tool(charge.shared()).tool(lookup.shared()).build()
}

fn runtime(store: Arc<dyn Store>, counter: PathBuf) -> Runtime {
    let options = RuntimeOptions { lease_ttl: Duration::from_millis(600), ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(store, options);
    runtime.register(steps_agent(counter));
    runtime
}

async fn print_events(turn: &TurnHandle, after: Option<u64>) -> Result<()> {
    let mut events = turn.stream(after);
    while let Some(event) = events.next().await {
        let event = event?;
        say(&format!("event {} {}", event.seq, event.payload.kind()));
    }
    Ok(())
}

fn describe(state: &TurnState) -> String {
    match state {
        TurnState::Done { output, .. } => format!(
            "done {}",
            output.as_ref().and_then(|output| output.message.content.clone()).unwrap_or_default()
        ),
        TurnState::Cancelled { reason, .. } => format!("cancelled {}", reason.as_str()),
        TurnState::Error { message, .. } => format!("error {message}"),
        TurnState::Running => "running".to_owned(),
    }
}

async fn start(backend: &str, path: &Path, counter: PathBuf) -> Result<()> {
    let runtime = runtime(open_store(backend, path, Durability::Batched)?, counter);
    let session = runtime.create_session("steps", Some("crash test")).await?;
    let turn = session.create_turn(TurnRequest::message("Run the five steps.")).await?;
    say(&format!("turn {} {}", session.id(), turn.id()));
    print_events(&turn, None).await?;
    say(&format!("final {}", describe(&turn.wait().await?)));
    Ok(())
}

async fn recover(backend: &str, path: &Path, counter: PathBuf, turn: &str, after: u64) -> Result<()> {
    let store = open_store(backend, path, Durability::Batched)?;
    let runtime = runtime(store.clone(), counter.clone());
    let turn_id = turn.parse().map_err(anyhow::Error::msg)?;
    let run = store.get_run(turn_id).await?;
    // The dead process's lease runs out on its own; wait for that, as a restarted server would.
    if let Some(lease) = store.lease(run.session_id).await? {
        let left = lease.expires_at.unix_micros().saturating_sub(Timestamp::now().unix_micros());
        tokio::time::sleep(
            Duration::from_micros(u64::try_from(left).unwrap_or(0)) + Duration::from_millis(20),
        )
        .await;
    }
    runtime.recover().await?;
    let handle = runtime.get_turn(turn_id).await?;
    print_events(&handle, Some(after)).await?;
    let mut state = handle.wait().await?;
    let ran = std::fs::read_to_string(&counter).unwrap_or_default();
    let mut approvals = Vec::new();
    for record in state.required_actions() {
        if let RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action {
            for call in tool_calls {
                let made = ran.lines().any(|line| line == format!("{} {}", call.name, call.id));
                let flagged = if call.may_have_run { "flagged" } else { "unflagged" };
                say(&format!("indoubt {} {} {flagged}", call.id, if made { "ran" } else { "notran" }));
                let approval = if made {
                    ApprovalDecision::Deny { reason: Some("it already ran".to_owned()) }
                } else {
                    ApprovalDecision::Allow
                };
                approvals.push(TurnInputItem::ToolApproval(UserToolApproval {
                    thread_id: thread_id.clone(),
                    tool_call_id: call.id.clone(),
                    approval,
                }));
            }
        }
    }
    if !approvals.is_empty() {
        let session = runtime.get_session(run.session_id).await?;
        let next = session.create_turn(TurnRequest::input(approvals)).await?;
        state = next.wait().await?;
    }
    say(&format!("final {}", describe(&state)));
    // The recovered turn's metrics against the usage its stored model messages carry.
    let metrics = match store.get_run(turn_id).await?.state {
        TurnState::Done { metrics, .. }
        | TurnState::Cancelled { metrics, .. }
        | TurnState::Error { metrics, .. } => metrics.map_or(0, |metrics| metrics.total_tokens),
        TurnState::Running => 0,
    };
    let stored: u64 = handle
        .events(Order::Asc)
        .await?
        .iter()
        .filter(|event| event.thread_or_main().is_main())
        .filter_map(|event| match &event.payload {
            EventPayload::ModelMessage(message) => message.usage.map(|usage| usage.total_tokens()),
            _ => None,
        })
        .sum();
    say(&format!("tokens {metrics} {stored}"));
    Ok(())
}

async fn try_turn(backend: &str, path: &Path, session: &str) -> Result<()> {
    let store = open_store(backend, path, Durability::Batched)?;
    let runtime = Runtime::new(store);
    let model = ScriptedModel::responder(|_| ScriptedResponse::text("from the second process"));
    let session = session.parse().map_err(anyhow::Error::msg)?;
    let name = runtime.store().get_session(session).await?.name;
    runtime.register(Agent::builder(name, Arc::new(model)).build());
    let session = runtime.get_session(session).await?;
    match session.create_turn(TurnRequest::message("hello from another process")).await {
        Ok(turn) => say(&format!("ok {}", describe(&turn.wait().await?))),
        Err(RunnerError::TurnRunning { .. }) => say("running"),
        Err(error) => say(&format!("error {error}")),
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["start", backend, path, counter] => {
            runtime.block_on(start(backend, Path::new(path), counter.into()))
        }
        ["recover", backend, path, counter, turn, after] => {
            let after = after.parse().context("after seq")?;
            runtime.block_on(recover(backend, Path::new(path), counter.into(), turn, after))
        }
        ["try-turn", backend, path, session] => runtime.block_on(try_turn(backend, Path::new(path), session)),
        _ => bail!(
            "usage: agentry-turns start <backend> <path> <counter> | recover <backend> <path> <counter> <turn> \
             <after seq> | try-turn <backend> <path> <session>"
        ),
    }
}
