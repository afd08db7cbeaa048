//! `POST /agui/{agent_name}`: the AG-UI protocol 1.x over HTTP + SSE. The body is a
//! `RunAgentInput`; the answer streams AG-UI events (`RUN_STARTED`, text and tool-call
//! frames, sub-agent frames, `RUN_FINISHED` with an interrupt outcome when the turn waits
//! for approvals or answers). A `resume` list answers those interrupts on the next run:
//! status `resolved` with the payload the interrupt's `responseSchema` asks for (an
//! approval `{"approved": bool, "reason"?: string}`; an answer as a string,
//! `{"content": string}`, or any other JSON value, passed on as JSON), or `cancelled`.
//! Anything else is refused (400) before anything is decided. Of `messages` (the whole
//! conversation, as clients send it each run) only what follows the last assistant
//! message counts: its last user message is answered, and tool messages there for calls
//! the thread waits on answer them as `resume` does. A client that goes away before its
//! run's end cancels the turn. A run's turn is named by its `runId` (its id is derived from
//! the session and the `runId`, and created atomically): that run sent again, at the same
//! moment or later, on any server sharing the store, is streamed again while it is the
//! thread's latest, refused (409 `run_superseded`) once the thread has gone on, and never
//! run twice. (Builds before kept the latest and 32 earlier `runId`s in the session's
//! state; those are still recognised.)
//!
//! A `threadId` names a session: the first run of an unknown thread creates a session for
//! the agent, titled with the thread id, under an id derived from the caller, the agent and
//! the thread id; later runs (on any server sharing the store, also after a restart) find
//! it with one read. A `threadId` that is the id of one of the caller's sessions continues
//! that session, and a thread begun before sessions had derived ids is found by its title
//! among the caller's newest sessions of the agent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use agentry_events::render::agui::{AguiEvent, AguiRenderer};
use agentry_memory::{Conflict, Order, PageRequest, StoreError};
use agentry_runner::{RunnerError, Session, TurnHandle, TurnRequest};
use agentry_types::{
    ClientContext, RequiredAction, RequiredActionRecord, SessionId, Timestamp, ToolSpec, TurnInputItem,
};
use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::post;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::harness::JsonBody;
use crate::sse::{self, Frame};

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/agui/{agent_name}", post(run))
}

/// The parts of `RunAgentInput` the server acts on (other fields are accepted and ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunAgentInput {
    thread_id: String,
    run_id: String,
    messages: Vec<AguiMessage>,
    #[serde(default)]
    resume: Option<Vec<ResumeEntry>>,
    /// The client's frontend tools: offered to the model for this run, their calls left to
    /// the client (answered with tool messages in its next run).
    #[serde(default)]
    tools: Vec<AguiTool>,
    /// What the client tells the model about its side (CopilotKit's readables): shown to
    /// the model for this run, after the agent's instructions.
    #[serde(default)]
    context: Vec<ClientContext>,
}

/// A frontend tool of `RunAgentInput.tools`.
#[derive(Deserialize)]
struct AguiTool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AguiMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    /// A tool message's call.
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeEntry {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Option<Value>,
}

/// The session of an AG-UI thread, if it has one.
async fn thread_session(
    state: &AppState,
    caller: &Caller,
    agent: &str,
    thread_id: &str,
) -> ApiResult<Option<Session>> {
    // A thread named by the id of one of the caller's sessions continues it.
    if let Ok(id) = thread_id.parse::<SessionId>()
        && let Ok(session) = caller.session(state, &id.to_string()).await
    {
        return of_agent(session, agent, thread_id).map(Some);
    }
    let id = thread_session_id(&caller.0.subject_id, agent, thread_id);
    match state.runtime.get_session(id).await {
        Ok(session) => return derived(session, caller, agent, thread_id).map(Some),
        Err(RunnerError::NotFound { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    // A thread begun before sessions had their thread's id: the caller's session of this
    // agent titled with the thread id.
    let key = (caller.0.subject_id.clone(), agent.to_owned(), thread_id.to_owned());
    let known = state.agui_threads.lock().unwrap_or_else(PoisonError::into_inner).get(&key).copied();
    if let Some(known) = known
        && let Ok(session) = caller.session(state, &known.to_string()).await
    {
        return of_agent(session, agent, thread_id).map(Some);
    }
    if let Some(session) = titled_session(state, caller, agent, thread_id).await? {
        state.agui_threads.lock().unwrap_or_else(PoisonError::into_inner).insert(key, session.id());
        return Ok(Some(session));
    }
    Ok(None)
}

/// Creates the session of a thread that has none (its first run). Returns it, and whether
/// this request created it (not when the same thread's first run, on another request or
/// server, created it at the same moment).
async fn new_thread_session(
    state: &AppState,
    caller: &Caller,
    agent: &str,
    thread_id: &str,
) -> ApiResult<(Session, bool)> {
    let id = thread_session_id(&caller.0.subject_id, agent, thread_id);
    match state.runtime.create_session_with_id(id, caller.0.clone(), agent, Some(thread_id)).await {
        Ok(session) => Ok((session, true)),
        Err(RunnerError::Store(StoreError::Conflict(Conflict::AlreadyExists { .. }))) => {
            Ok((derived(state.runtime.get_session(id).await?, caller, agent, thread_id)?, false))
        }
        Err(error) => Err(error.into()),
    }
}

/// The session under a thread's derived id, checked like any other: the caller's, of
/// `agent` (both hold by construction, unless a session was created under that id by other
/// means).
fn derived(session: Session, caller: &Caller, agent: &str, thread_id: &str) -> ApiResult<Session> {
    if session.record().owner.subject_id != caller.0.subject_id {
        return Err(ApiError::bad_param("threadId", format!("thread {thread_id} belongs to another caller")));
    }
    of_agent(session, agent, thread_id)
}

/// The session a thread names, if it is one of `agent`'s.
fn of_agent(session: Session, agent: &str, thread_id: &str) -> ApiResult<Session> {
    if session.record().name != agent {
        return Err(ApiError::bad_param("threadId", format!("thread {thread_id} belongs to another agent")));
    }
    Ok(session)
}

/// The id of the session that holds a caller's AG-UI thread of an agent: a name-based UUID
/// (version 8, over SHA-256 of the three names), so every server finds the thread's
/// session with one read, however many sessions the store holds, and the same thread id
/// of another caller or agent names another session.
fn thread_session_id(subject: &str, agent: &str, thread_id: &str) -> SessionId {
    SessionId::from_uuid(agentry_types::name_based_uuid(&["agentry agui thread", subject, agent, thread_id]))
}

/// How many of the caller's newest sessions of an agent are searched for a thread's title.
const THREAD_SEARCH: usize = 1000;

/// Threads found by title were begun before this time (2026-11-23T00:00:00Z), by builds
/// before sessions had their thread's id. A session created since with a title that
/// happens to be a thread id (through `/v1/agents/sessions`, say) is not that thread's.
const TITLED_THREADS_UNTIL: Timestamp = Timestamp::from_unix_micros(1_795_392_000_000_000);

/// The caller's newest session of `agent` titled `thread_id`, among the newest
/// [`THREAD_SEARCH`] created before [`TITLED_THREADS_UNTIL`].
async fn titled_session(
    state: &AppState,
    caller: &Caller,
    agent: &str,
    thread_id: &str,
) -> ApiResult<Option<Session>> {
    let mut query = caller.sessions();
    query.name = Some(agent.to_owned());
    query.created_until = Some(TITLED_THREADS_UNTIL);
    let mut page = PageRequest::first(100);
    let mut searched = 0;
    while searched < THREAD_SEARCH {
        let sessions = state.runtime.list_sessions(&query, &page).await?;
        searched += sessions.items.len();
        if let Some(found) = sessions.items.iter().find(|record| record.title.as_deref() == Some(thread_id)) {
            return Ok(Some(state.runtime.get_session(found.id).await?));
        }
        match sessions.next_token {
            Some(token) => page = PageRequest::after(token, 100),
            None => break,
        }
    }
    Ok(None)
}

/// The text of a message's `content` (a string, or text parts).
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The turn input of a run. A client sends the whole conversation each run: what this
/// run adds is what follows the last assistant message. A user message there is answered
/// (the last one); tool messages there answer pending client-side calls, as `resume`
/// does; `resume` answers the interrupts. Nothing new is refused rather than answered
/// again, and so is a new user message sent with answers (seed 002: answers and messages
/// go in separate turns), rather than dropped. Also returns the calls answered by tool
/// messages, which the client has in its list already.
async fn run_input(
    body: &RunAgentInput,
    session: Option<&Session>,
) -> ApiResult<(Vec<TurnInputItem>, Vec<String>)> {
    let added = body.messages.iter().rposition(|message| message.role == "assistant").map_or(0, |at| at + 1);
    let added = &body.messages[added..];
    let user_text = added
        .iter()
        .rev()
        .find(|message| message.role == "user")
        .map(|message| text_of(message.content.as_ref()))
        .filter(|text| !text.is_empty());
    let mut answers: Vec<ResumeEntry> = body.resume.clone().unwrap_or_default();
    let resumed = !answers.is_empty();
    let given = answers.len();
    // The thread's latest turn, read once: what it waits on, and what it began with.
    let latest = match session {
        Some(session) if resumed || added.iter().any(|message| message.role == "tool") => {
            crate::harness::latest_turn(session).await?
        }
        _ => None,
    };
    let actions = latest.as_ref().map_or(&[][..], |turn| turn.record().state.required_actions());
    // Tool messages answer only the calls the thread waits on: the others are results the
    // client was sent (of tools the server ran), kept in its list.
    let pending = pending_calls(actions, true);
    let approvals = pending_calls(actions, false);
    answers.extend(
        added
            .iter()
            .filter(|message| message.role == "tool")
            .filter(|message| message.tool_call_id.as_ref().is_some_and(|id| pending.contains(id)))
            .filter(|message| !answers_call(body.resume.as_deref(), message.tool_call_id.as_deref()))
            .map(|message| {
                let id = message.tool_call_id.clone().unwrap_or_default();
                let text = text_of(message.content.as_ref());
                // An approval's answer is `{"approved": …}`, as `resume` gives it.
                let payload = match serde_json::from_str::<Value>(&text) {
                    Ok(value) if value.is_object() && approvals.contains(&id) => value,
                    _ => Value::String(text),
                };
                ResumeEntry { interrupt_id: id, status: "resolved".to_owned(), payload: Some(payload) }
            }),
    );
    let by_tool_messages = answers.len() > given;
    if answers.is_empty() {
        return match user_text {
            Some(text) => Ok((vec![TurnInputItem::message(text)], Vec::new())),
            None if body.messages.last().is_some_and(|message| message.role == "assistant") => {
                Err(ApiError::bad_param(
                    "messages",
                    "nothing new to answer: the last message is the assistant's; add the user's next message \
                     (or answer the thread's interrupts with `resume`)",
                ))
            }
            None => Err(ApiError::bad_param(
                "messages",
                "a run needs a user message with text in `messages` (its last one is answered), or `resume` \
                 answers to the thread's interrupts",
            )),
        };
    }
    let field = if resumed { "resume" } else { "messages" };
    if session.is_none() {
        return Err(ApiError::bad_param(
            field,
            format!("interrupt {} is not pending on this thread: it has no runs", answers[0].interrupt_id),
        ));
    }
    if let Some(text) = user_text {
        // The message the answered turn began with may come again; a new one may not.
        let asked = latest
            .iter()
            .flat_map(|turn| &turn.record().input)
            .any(|item| matches!(item, TurnInputItem::Message(message) if message.content.text() == text));
        if !asked {
            let with = if by_tool_messages { "tool results" } else { "`resume`" };
            return Err(ApiError::bad_param(
                field,
                format!(
                    "a new user message cannot be sent with {with}: the thread's interrupts are answered in this \
                     run, and the message in the next one"
                ),
            ));
        }
    }
    let by_client = answers[given..].iter().map(|entry| entry.interrupt_id.clone()).collect();
    Ok((resume_input(actions, &answers, given)?, by_client))
}

/// The calls that a run's tool messages (after its last assistant message) answered in
/// `turn`'s input: the client holds those results already.
fn answered_in_messages(body: &RunAgentInput, turn: &agentry_types::RunRecord) -> Vec<String> {
    let added = body.messages.iter().rposition(|message| message.role == "assistant").map_or(0, |at| at + 1);
    body.messages[added..]
        .iter()
        .filter(|message| message.role == "tool")
        .filter_map(|message| message.tool_call_id.clone())
        .filter(|id| {
            turn.input.iter().any(
                |item| matches!(item, TurnInputItem::ToolResponse(response) if response.tool_call_id == *id),
            )
        })
        .collect()
}

/// The ids of the calls a turn's required actions wait on: for an approval, or (with
/// `responses`) for the client's answer too.
fn pending_calls(actions: &[RequiredActionRecord], responses: bool) -> Vec<String> {
    actions
        .iter()
        .flat_map(|record| match &record.action {
            RequiredAction::ToolApproval { tool_calls, .. } => tool_calls.as_slice(),
            RequiredAction::ToolResponse { tool_calls, .. } if responses => tool_calls.as_slice(),
            _ => &[],
        })
        .map(|call| call.id.clone())
        .collect()
}

/// Whether `resume` already answers the call `id`.
fn answers_call(resume: Option<&[ResumeEntry]>, id: Option<&str>) -> bool {
    resume.unwrap_or_default().iter().any(|entry| Some(entry.interrupt_id.as_str()) == id)
}

/// The turn input that answers the latest turn's interrupts (its required `actions`) with
/// `resume`.
fn resume_input(
    actions: &[RequiredActionRecord],
    resume: &[ResumeEntry],
    given: usize,
) -> ApiResult<Vec<TurnInputItem>> {
    let mut input = Vec::new();
    for (at, entry) in resume.iter().enumerate() {
        // An error names the field at fault: `resume[at]`, or the tool message (in
        // `messages`) that gave the answer (the entries from `given` on).
        let (field, named) = if at < given {
            ("resume", format!("resume[{at}]"))
        } else {
            ("messages", format!("the tool message answering {}", entry.interrupt_id))
        };
        let mut matching = actions.iter().flat_map(|record| match &record.action {
            RequiredAction::ToolApproval { thread_id, tool_calls } => tool_calls
                .iter()
                .filter(|call| call.id == entry.interrupt_id)
                .map(|call| (true, thread_id.clone(), call.id.clone()))
                .collect(),
            RequiredAction::ToolResponse { thread_id, tool_calls } => tool_calls
                .iter()
                .filter(|call| call.id == entry.interrupt_id)
                .map(|call| (false, thread_id.clone(), call.id.clone()))
                .collect(),
            RequiredAction::McpAuth { .. } => Vec::new(),
        });
        let found = matching.next();
        if matching.next().is_some() {
            // Two threads (members on models of their own) gave their calls this id: an
            // AG-UI interrupt names no thread, so the answer cannot be placed.
            return Err(ApiError::bad_param(
                field,
                format!(
                    "interrupt {} is pending on more than one thread (their models gave their calls the same \
                     id); answer them through the harness API, which names each call's thread",
                    entry.interrupt_id
                ),
            ));
        }
        let resolved = match entry.status.as_str() {
            "resolved" => true,
            "cancelled" => false,
            other => {
                return Err(ApiError::bad_param(
                    field,
                    format!("{named}: status is {other:?}; it must be \"resolved\" or \"cancelled\""),
                ));
            }
        };
        let Some((approval, thread, call)) = found else {
            if entry.interrupt_id.starts_with("mcp:") {
                continue; // Authorization happened elsewhere; the resumed turn retries.
            }
            return Err(ApiError::bad_param(
                field,
                format!("interrupt {} is not pending on this thread", entry.interrupt_id),
            ));
        };
        let payload = entry.payload.as_ref();
        input.push(if approval {
            let reason = |payload: Option<&Value>| {
                payload.and_then(|p| p.get("reason")).and_then(Value::as_str).map(str::to_owned)
            };
            match (resolved, payload.and_then(|p| p.get("approved")).and_then(Value::as_bool)) {
                (false, _) => {
                    TurnInputItem::deny(thread, call, reason(payload).or_else(|| Some("cancelled".to_owned())))
                }
                (true, Some(true)) => TurnInputItem::allow(thread, call),
                (true, Some(false)) => TurnInputItem::deny(thread, call, reason(payload)),
                (true, None) => {
                    return Err(ApiError::bad_param(
                        field,
                        format!(
                            "{named}: its payload must be {{\"approved\": true}} or {{\"approved\": false, \"reason\": \"…\"}} \
                             to answer the approval {}",
                            entry.interrupt_id
                        ),
                    ));
                }
            }
        } else {
            let content = match payload {
                _ if !resolved => "The user cancelled the question.".to_owned(),
                Some(Value::String(text)) => text.clone(),
                // A structured result of a client tool is passed on as JSON.
                Some(value) => value
                    .get("content")
                    .or_else(|| value.get("answer"))
                    .and_then(Value::as_str)
                    .map_or_else(|| value.to_string(), str::to_owned),
                None => {
                    return Err(ApiError::bad_param(
                        field,
                        format!("{named}: its payload is missing: it is the answer to {}", entry.interrupt_id),
                    ));
                }
            };
            TurnInputItem::respond(thread, call, content)
        });
    }
    Ok(input)
}

async fn run(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(agent_name): Path<String>,
    JsonBody(body): JsonBody<RunAgentInput>,
) -> ApiResult<Response> {
    if state.runtime.agent(&agent_name).is_none() {
        return Err(ApiError::not_found("agent", &agent_name));
    }
    crate::harness::check_title("threadId", &body.thread_id)?;
    if body.thread_id.trim().is_empty() {
        return Err(ApiError::bad_param("threadId", "threadId must name the conversation: it is empty"));
    }
    // A run's id tells a retry from a new run, so it must be one.
    if body.run_id.trim().is_empty() {
        return Err(ApiError::bad_param("runId", "runId must name the run: it is empty"));
    }
    if body.run_id.chars().count() > MAX_RUN_ID_CHARS {
        return Err(ApiError::bad_param(
            "runId",
            format!("runId is longer than {MAX_RUN_ID_CHARS} characters"),
        ));
    }
    // Before the thread's session or turn is made: a run refused its stream creates nothing.
    let slot = state.streams.take(&caller.0.subject_id)?;
    let session = thread_session(&state, &caller, &agent_name, &body.thread_id).await?;
    // A run sent again under its `runId` (a client retrying after a dropped connection) is
    // the same run: its turn is streamed again from its start, not run a second time; one
    // sent again after the thread went on was run already and is refused.
    if let Some(session) = session.as_ref()
        && let Some(turn) = sent_before(session, &body.run_id, &body.thread_id).await?
    {
        return rerun(&state, slot, session, turn, body).await;
    }
    // A refused run changes nothing: a new thread's session is created once its input
    // checks out, and removed again if its first turn is refused.
    let (input, answered_by_client) = run_input(&body, session.as_ref()).await?;
    let (session, created) = match session {
        Some(session) => (session, false),
        None => new_thread_session(&state, &caller, &agent_name, &body.thread_id).await?,
    };
    let client_tools: Vec<ToolSpec> = body
        .tools
        .iter()
        .map(|tool| ToolSpec {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool
                .parameters
                .clone()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        })
        .collect();
    let frontend_tools: Vec<String> = client_tools.iter().map(|tool| tool.name.clone()).collect();
    let request = TurnRequest {
        input,
        created_by: Some(caller.0.clone()),
        client_tools,
        client_context: body.context.clone(),
        // The run's turn is named by its `runId`: a copy sent at the same moment (on
        // another connection or server) finds it, and runs nothing.
        idempotency_key: Some(run_key(&body.run_id)),
        ..TurnRequest::default()
    };
    let turn = match session.create_turn(request).await {
        Ok(turn) => turn,
        Err(RunnerError::TurnExists { turn_id, .. }) => {
            let turn = session.get_turn(turn_id).await?;
            return rerun(&state, slot, &session, turn, body).await;
        }
        // A copy of this run sent at the same moment may be the running turn (or a turn
        // a stopped process left, which the start just resumed).
        Err(error @ (RunnerError::TurnRunning { .. } | RunnerError::TurnResumed { .. })) => {
            return match session.get_turn(run_turn_id(&session, &body.run_id)).await {
                Ok(turn) => rerun(&state, slot, &session, turn, body).await,
                Err(_) if matches!(error, RunnerError::TurnRunning { .. }) => {
                    Err(crate::harness::naming_running_turn(&state, &session, error).await)
                }
                Err(_) => Err(error.into()),
            };
        }
        Err(error) => {
            if created {
                discard_new_session(&state, &session).await;
            }
            let mut error = ApiError::from(error);
            // The run's input came from these fields, not from a turn's `input`.
            if error.param.as_deref() == Some("input") {
                let field = if error.message.contains("client tool") {
                    "tools"
                } else if error.message.contains("client context") {
                    "context"
                } else if body.resume.as_ref().is_some_and(|resume| !resume.is_empty()) {
                    "resume"
                } else {
                    "messages"
                };
                error.param = Some(field.to_owned());
                if error.message.contains("awaiting answers") {
                    // Say it in this protocol's terms: a frontend tool's call, say, that
                    // the client never answered.
                    error.message.push_str(
                        " (over AG-UI: send a tool message for each pending toolCallId, or `resume` with status \
                         \"cancelled\" for it)",
                    );
                }
            }
            return Err(error);
        }
    };
    state.track(&turn);
    Ok(stream_turn(&state, slot, turn, body.thread_id, body.run_id, answered_by_client, frontend_tools))
}

/// The idempotency key of a run's turn ([`TurnRequest::idempotency_key`]).
fn run_key(run_id: &str) -> String {
    format!("agui-run:{run_id}")
}

/// The id of a run's turn in the thread's session (see [`run_key`]).
fn run_turn_id(session: &Session, run_id: &str) -> agentry_types::TurnId {
    agentry_runner::turn_id_for_key(session.id(), &run_key(run_id))
}

/// The turn of a run sent before, if it was: named by its `runId` (see [`run_key`]), or
/// for a run of a build that kept runs in the session's state instead, found there.
async fn sent_before(session: &Session, run_id: &str, thread_id: &str) -> ApiResult<Option<TurnHandle>> {
    match session.get_turn(run_turn_id(session, run_id)).await {
        Ok(turn) => return Ok(Some(turn)),
        Err(RunnerError::NotFound { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    if let Some(turn) = noted_run(session, run_id).await {
        return Ok(Some(turn));
    }
    if earlier_runs(session.record()).any(|earlier| earlier == run_id) {
        return Err(superseded(run_id, thread_id));
    }
    Ok(None)
}

/// Answers a run sent again: the same run, streamed from its start, when its turn is the
/// thread's latest; otherwise 409, as the thread has gone on since.
async fn rerun(
    state: &Arc<AppState>,
    slot: sse::StreamSlot,
    session: &Session,
    turn: TurnHandle,
    body: RunAgentInput,
) -> ApiResult<Response> {
    let latest = crate::harness::latest_turn(session).await?;
    if latest.as_ref().map(TurnHandle::id) != Some(turn.id()) {
        return Err(superseded(&body.run_id, &body.thread_id));
    }
    let frontend = body.tools.iter().map(|tool| tool.name.clone()).collect();
    // The answers the client sent as tool messages are in its list already, as they
    // were when the run was first sent.
    let answered = answered_in_messages(&body, turn.record());
    Ok(stream_turn(state, slot, turn, body.thread_id, body.run_id, answered, frontend))
}

/// 409 for a run sent again after its thread went on: running it again would repeat what
/// it did.
fn superseded(run_id: &str, thread_id: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::CONFLICT,
        "run_superseded",
        format!(
            "run {} of thread {} was run already, and the thread has gone on since: it is not run again \
             (send a new runId for a new run)",
            crate::error::quoted_id(run_id),
            crate::error::quoted_id(thread_id)
        ),
    )
}

/// The session-state key under which builds before runs were named by their `runId` kept
/// a thread's latest run: its `runId` and turn.
const LAST_RUN_KEY: &str = "agentry.agui.last_run";

/// The session-state key under which those builds kept the `runId`s of a thread's earlier
/// runs.
const EARLIER_RUNS_KEY: &str = "agentry.agui.earlier_runs";

/// The longest `runId` taken.
const MAX_RUN_ID_CHARS: usize = 200;

/// The `runId`s of the thread's earlier runs (not its latest).
fn earlier_runs(record: &agentry_types::SessionRecord) -> impl Iterator<Item = &str> {
    record
        .state
        .get(EARLIER_RUNS_KEY)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The turn a build that kept the thread's latest run in its session's state noted for
/// `run_id`, if it did.
async fn noted_run(session: &Session, run_id: &str) -> Option<TurnHandle> {
    let last = session.record().state.get(LAST_RUN_KEY)?;
    if last.get("run_id").and_then(Value::as_str) != Some(run_id) {
        return None;
    }
    let turn = last.get("turn_id").and_then(Value::as_str)?.parse().ok()?;
    session.get_turn(turn).await.ok()
}

/// A run's response: the turn's events as AG-UI frames, ending with `RUN_FINISHED` or
/// `RUN_ERROR`; the turn is cancelled if the client goes away before.
fn stream_turn(
    state: &Arc<AppState>,
    slot: sse::StreamSlot,
    turn: TurnHandle,
    thread_id: String,
    run_id: String,
    answered_by_client: Vec<String>,
    frontend_tools: Vec<String>,
) -> Response {
    let state = Arc::clone(state);
    let mut renderer =
        AguiRenderer::new().with_known_results(answered_by_client).with_frontend_tools(frontend_tools);
    // Each frame with whether it ends the run.
    let frames =
        turn.stream(None).filter_map(|event| std::future::ready(event.ok())).flat_map(move |event| {
            let frames: Vec<(Frame, bool)> = renderer
                .render(&event)
                .into_iter()
                .map(|rendered| {
                    let last = matches!(rendered, AguiEvent::RunFinished { .. } | AguiEvent::RunError { .. });
                    (frame(rendered, &thread_id, &run_id), last)
                })
                .collect();
            futures_util::stream::iter(frames)
        });
    // A run's stream always ends with RUN_FINISHED or RUN_ERROR: one cut short (the server
    // is stopping; the turn goes on for the shutdown grace, then in the next server) says
    // so, rather than leaving the client to take a dropped connection for the end. Whether
    // the end was sent is noted as frames leave, after the cut.
    let ended = Arc::new(AtomicBool::new(false));
    let sent_end = ended.clone();
    // A client that goes away before the run's end aborted it (AG-UI has no other
    // cancellation: `abortRun` closes the connection, and a run's stream cannot be
    // resumed), so the turn is cancelled rather than left running for no one.
    // The guard lives in the closing part of the stream, which is dropped unpolled when
    // the connection goes first, and run only once the frames are over.
    state.agui_streams.attach(turn.id());
    let abort = AbortOnDisconnect { turn: Some(turn), over: ended.clone(), state: Arc::clone(&state) };
    let frames = frames.take_until(state.stopped()).map(move |(frame, last)| {
        if last {
            sent_end.store(true, Ordering::Relaxed);
        }
        frame
    });
    let interrupted = futures_util::stream::once(async move {
        // The frames ended by themselves (the run ended, its stream failed, or the server
        // is stopping): not a client going away.
        let cut = !ended.swap(true, Ordering::Relaxed);
        drop(abort);
        cut.then(|| {
            let error = AguiEvent::RunError {
                message:
                    "the stream was cut before the run finished; its outcome will be in the thread's session"
                        .to_owned(),
                code: Some("run_interrupted".to_owned()),
                timestamp: Timestamp::now().unix_millis(),
            };
            Frame { id: None, data: serde_json::to_string(&error).unwrap_or_default() }
        })
    })
    .filter_map(std::future::ready);
    sse::respond_ending(&state, slot, frames.chain(interrupted))
}

/// Cancels a run's turn when dropped before the run's frames were over: its client went
/// away. Not while the server stops, whose turns go on in the next server.
struct AbortOnDisconnect {
    turn: Option<TurnHandle>,
    over: Arc<AtomicBool>,
    state: Arc<AppState>,
}

impl Drop for AbortOnDisconnect {
    fn drop(&mut self) {
        let Some(turn) = self.turn.take() else { return };
        let Some(generation) = self.state.agui_streams.detach(turn.id()) else { return };
        if self.over.load(Ordering::Relaxed) || *self.state.stopping.borrow() {
            // Nothing to cancel: the turn is forgotten (unless a stream attached meanwhile).
            let _forgotten = self.state.agui_streams.unchanged_since(turn.id(), generation);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let state = Arc::clone(&self.state);
        runtime.spawn(async move {
            // A client whose connection dropped retries the run under its `runId`: the
            // turn goes on if it comes back within the grace (its stream attached since,
            // even if that one went away too: its own grace then counts).
            tokio::time::sleep(RETRY_GRACE).await;
            if !state.agui_streams.unchanged_since(turn.id(), generation) {
                return;
            }
            tracing::info!(turn = %turn.id(), "the AG-UI client went away before the run's end: cancelling it");
            if let Err(error) = turn.cancel().await {
                tracing::warn!(turn = %turn.id(), %error, "cancelling an abandoned AG-UI run failed");
            }
        });
    }
}

/// How long a run whose client went away waits for a retry under its `runId` before it is
/// cancelled as aborted.
const RETRY_GRACE: Duration = Duration::from_secs(2);

/// The AG-UI streams open on each turn (see [`AbortOnDisconnect`]), and how many have
/// attached to it: a turn whose last stream went away is cancelled only if none attached
/// since.
#[derive(Debug, Default)]
pub(crate) struct Streams(std::sync::Mutex<HashMap<agentry_types::TurnId, (usize, u64)>>);

impl Streams {
    fn attach(&self, turn: agentry_types::TurnId) {
        let mut streams = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (open, attached) = streams.entry(turn).or_default();
        *open += 1;
        *attached += 1;
    }

    /// When it was the turn's last stream, how many had attached.
    fn detach(&self, turn: agentry_types::TurnId) -> Option<u64> {
        let mut streams = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (open, attached) = streams.get_mut(&turn)?;
        *open = open.saturating_sub(1);
        (*open == 0).then_some(*attached)
    }

    /// Whether no stream is open on the turn and none attached since `attached` had;
    /// forgets the turn then.
    fn unchanged_since(&self, turn: agentry_types::TurnId, attached: u64) -> bool {
        let mut streams = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let unchanged = streams.get(&turn).is_none_or(|(open, now)| *open == 0 && *now == attached);
        if unchanged {
            streams.remove(&turn);
        }
        unchanged
    }
}

/// Removes the session a refused first run of a thread created, unless a run of the same
/// thread (another request's) started on it meanwhile: the session's lease, taken first,
/// keeps every other start out while its turns are counted, and a lease that cannot be
/// taken means a turn runs there. Best effort: a session that stays is logged.
async fn discard_new_session(state: &AppState, session: &Session) {
    let store = state.runtime.store();
    let (id, now) = (session.id(), Timestamp::now());
    let Ok(lease) = store.acquire_lease(id, "agentry agui cleanup", Duration::from_secs(30), now).await
    else {
        return;
    };
    let empty = session
        .list_turns(Order::Asc, &PageRequest::first(1))
        .await
        .is_ok_and(|turns| turns.items.is_empty());
    let outcome =
        if empty { store.delete_session(id).await } else { store.release_lease(id, lease.token).await };
    if let Err(error) = outcome {
        tracing::warn!(session = %id, %error, "the session of a refused AG-UI run could not be removed or released");
    }
}

/// An AG-UI event as an SSE frame, with the client's thread and run ids.
fn frame(event: AguiEvent, thread: &str, run: &str) -> Frame {
    let event = match event {
        AguiEvent::RunStarted { timestamp, .. } => {
            AguiEvent::RunStarted { thread_id: thread.to_owned(), run_id: run.to_owned(), timestamp }
        }
        AguiEvent::RunFinished { result, outcome, timestamp, .. } => AguiEvent::RunFinished {
            thread_id: thread.to_owned(),
            run_id: run.to_owned(),
            result,
            outcome,
            timestamp,
        },
        other => other,
    };
    Frame { id: None, data: serde_json::to_string(&event).unwrap_or_default() }
}

/// The sessions of threads begun before sessions had derived ids, found by their title, by
/// subject, agent and thread id (one small entry per such thread, kept while the server
/// runs), so their title is searched once per server.
pub(crate) type Threads = std::sync::Mutex<HashMap<(String, String, String), SessionId>>;

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{EventId, PendingToolCall, ThreadId, Timestamp};

    #[test]
    fn a_threads_session_id_is_the_same_in_every_build() {
        // Stored threads are found again by it: the derivation must never change.
        let id = thread_session_id("local", "demo", "thread-1");
        assert_eq!(id.to_string(), "47116297-4b9a-86f9-86d2-886626688b40");
    }

    fn approval(thread: &ThreadId, id: &str) -> RequiredActionRecord {
        let call = PendingToolCall {
            id: id.to_owned(),
            source_event_id: EventId::new(),
            name: "file_report".to_owned(),
            arguments: "{}".to_owned(),
            may_have_run: false,
        };
        RequiredActionRecord {
            id: EventId::new(),
            created_at: Timestamp::now(),
            action: RequiredAction::ToolApproval { thread_id: thread.clone(), tool_calls: vec![call] },
        }
    }

    #[test]
    fn an_interrupt_id_pending_on_two_threads_is_refused_not_guessed() {
        let (north, south) = (ThreadId::new_sub_thread(), ThreadId::new_sub_thread());
        let actions =
            [approval(&north, "call_1_0"), approval(&south, "call_1_0"), approval(&south, "call_2_0")];
        let entry = |id: &str| ResumeEntry {
            interrupt_id: id.to_owned(),
            status: "resolved".to_owned(),
            payload: Some(serde_json::json!({"approved": true})),
        };
        let error = resume_input(&actions, &[entry("call_1_0")], 1).unwrap_err();
        assert!(format!("{error:?}").contains("pending on more than one thread"), "{error:?}");
        let input = resume_input(&actions, &[entry("call_2_0")], 1).unwrap();
        assert_eq!(input, [TurnInputItem::allow(south, "call_2_0")]);
    }
}
