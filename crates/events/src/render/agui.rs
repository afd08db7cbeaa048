//! The AG-UI 1.x vocabulary (the events of `@ag-ui/core` / `ag-ui-protocol`, sent over
//! HTTP + SSE).
//!
//! AG-UI streams messages as START / CONTENT / END frames, so this renderer is a fold over
//! a turn's events ([`AguiRenderer`]): it opens a reasoning message, a text message or a
//! tool call (once its id and name are known) at its first delta, closes the reasoning
//! when the answer begins, and closes everything when the message finishes. The complete
//! `model.message` then closes what a cut-off stream left open and renders in full what
//! its deltas did not show: everything, for a replay from the stored log. Required actions end the run with an interrupt outcome;
//! cancellation with the cancelled outcome; an error with `RUN_ERROR`. Events on a
//! sub-agent thread carry that thread as their `subagentRunId`. Canonical events AG-UI
//! has no frame for travel as `CUSTOM` events named by their canonical type.

use std::collections::{BTreeMap, HashMap};

use agentry_types::{
    EventId, ModelMessage, ModelMessageDelta, PendingToolCall, RequiredAction, RequiredActionRecord,
    ThreadId, TurnInputItem, TurnState,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::envelope::EventEnvelope;
use crate::payload::{EventPayload, ThreadOutcome};
use crate::render::agent_team;

/// Something a run needs from outside before it continues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    /// Unique within the run; a resume entry answers it by this id.
    pub id: String,
    /// Why the run stopped: `tool_approval`, `tool_response` or `mcp_auth`.
    pub reason: String,
    /// A prompt for whoever answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The tool call concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The shape of the expected answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    /// Details (thread, tool name and arguments, authorization URL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The sub-agent thread that raised it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subagent_run_id: Option<String>,
}

/// Why a run finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase", rename_all_fields = "camelCase")]
pub enum RunFinishedOutcome {
    /// It completed.
    Success {
        /// Calls of the client's frontend tools it left for the client to answer (with tool
        /// messages in its next run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pending_tool_call_ids: Option<Vec<String>>,
    },
    /// It paused for outside input.
    Interrupt {
        /// What it waits for (at least one).
        interrupts: Vec<Interrupt>,
    },
    /// It was stopped.
    Cancelled {},
}

/// Why a sub-agent's segment ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase", rename_all_fields = "camelCase")]
pub enum SubagentFinishedOutcome {
    /// It completed.
    Success {},
    /// It waits for outside input: the run's interrupts it raised itself.
    Suspended {
        /// Ids of its interrupts.
        interrupt_ids: Vec<String>,
    },
}

/// An AG-UI event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", rename_all_fields = "camelCase")]
pub enum AguiEvent {
    /// A run started.
    RunStarted {
        /// The conversation (session).
        thread_id: String,
        /// The run (turn).
        run_id: String,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A run finished without failing.
    RunFinished {
        /// The conversation.
        thread_id: String,
        /// The run.
        run_id: String,
        /// The final answer, on success.
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        /// Why it ended.
        outcome: RunFinishedOutcome,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A run failed.
    RunError {
        /// What went wrong.
        message: String,
        /// A machine-readable code.
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A text message opens.
    TextMessageStart {
        /// The message.
        message_id: String,
        /// Always `assistant`.
        role: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A piece of a text message.
    TextMessageContent {
        /// The message.
        message_id: String,
        /// The text to append.
        delta: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A text message closes.
    TextMessageEnd {
        /// The message.
        message_id: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A tool call opens.
    ToolCallStart {
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_call_name: String,
        /// The assistant message holding the call.
        parent_message_id: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A piece of a tool call's arguments.
    ToolCallArgs {
        /// The call.
        tool_call_id: String,
        /// The JSON text to append.
        delta: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A tool call's arguments are complete.
    ToolCallEnd {
        /// The call.
        tool_call_id: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A tool's result.
    ToolCallResult {
        /// The tool message this mints.
        message_id: String,
        /// The call.
        tool_call_id: String,
        /// The result.
        content: String,
        /// Always `tool`.
        role: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// Reasoning begins.
    ReasoningStart {
        /// The reasoning message.
        message_id: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A reasoning message opens.
    ReasoningMessageStart {
        /// The reasoning message.
        message_id: String,
        /// Always `reasoning`.
        role: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A piece of reasoning.
    ReasoningMessageContent {
        /// The reasoning message.
        message_id: String,
        /// The text to append.
        delta: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A reasoning message closes.
    ReasoningMessageEnd {
        /// The reasoning message.
        message_id: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// Reasoning ends.
    ReasoningEnd {
        /// The reasoning message.
        message_id: String,
        /// The sub-agent thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A sub-agent started.
    SubagentStarted {
        /// Its thread.
        subagent_run_id: String,
        /// The agent's name.
        name: String,
        /// The thread's title.
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// The sub-agent that started it, for nested delegation.
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_subagent_run_id: Option<String>,
        /// The tool call that started it.
        parent_tool_call_id: String,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A sub-agent finished.
    SubagentFinished {
        /// Its thread.
        subagent_run_id: String,
        /// Its answer.
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        /// Why it ended.
        outcome: SubagentFinishedOutcome,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// A sub-agent failed.
    SubagentError {
        /// Its thread.
        subagent_run_id: String,
        /// What went wrong.
        message: String,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
    /// An application event: a canonical event AG-UI has no frame for.
    Custom {
        /// The canonical event type.
        name: String,
        /// The canonical payload.
        value: Value,
        /// The sub-agent thread it happened on.
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
        /// Milliseconds since the Unix epoch.
        timestamp: i64,
    },
}

/// A tool call being streamed: it opens once both its id and its name are known (they may
/// arrive in different chunks); arguments that arrive before that wait.
#[derive(Debug, Default)]
struct OpenCall {
    id: Option<String>,
    name: Option<String>,
    started: bool,
    waiting_arguments: String,
}

/// A streamed message's open frames.
#[derive(Debug, Default)]
struct OpenMessage {
    subagent: Option<String>,
    text: bool,
    reasoning: bool,
    calls: BTreeMap<u32, OpenCall>,
    /// Its finishing delta arrived and closed its frames; the `model.message` is next.
    finished: bool,
}

/// Renders a turn's events into AG-UI events, one canonical event at a time.
#[derive(Debug, Default)]
pub struct AguiRenderer {
    /// Messages seen as deltas, until their `model.message` arrives.
    open: HashMap<EventId, OpenMessage>,
    /// Sub-agents started and not yet finished, in start order.
    subagents: Vec<String>,
    /// Calls whose answers the client sent as tool messages: it has them already.
    known_results: Vec<String>,
    /// The client's own (frontend) tools: the run completes leaving their calls to it,
    /// rather than being interrupted.
    frontend_tools: Vec<String>,
}

struct Frame<'a> {
    message_id: &'a str,
    subagent: Option<&'a String>,
    timestamp: i64,
}

impl Frame<'_> {
    fn subagent(&self) -> Option<String> {
        self.subagent.cloned()
    }
}

impl AguiRenderer {
    /// A renderer at the start of a turn.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The same renderer, finishing a run that waits only for calls of these tools (the
    /// client's frontend tools) as a success naming them in `pendingToolCallIds`, not as an
    /// interrupt.
    #[must_use]
    pub fn with_frontend_tools(mut self, names: Vec<String>) -> Self {
        self.frontend_tools = names;
        self
    }

    /// The same renderer, sending no `TOOL_CALL_RESULT` for the answers to these client-side
    /// calls in the turn's input (the client sent them as tool messages, so it has them).
    #[must_use]
    pub fn with_known_results(mut self, tool_call_ids: Vec<String>) -> Self {
        self.known_results = tool_call_ids;
        self
    }

    /// The AG-UI events for the next canonical event of the turn.
    pub fn render(&mut self, event: &EventEnvelope) -> Vec<AguiEvent> {
        let timestamp = event.created_at.unix_millis();
        let subagent = event.thread_id.as_ref().filter(|thread| !thread.is_main()).map(ThreadId::to_string);
        let mut out = Vec::new();
        match &event.payload {
            EventPayload::TurnCreated { input, .. } => {
                out.push(AguiEvent::RunStarted {
                    thread_id: event.session_id.to_string(),
                    run_id: event.turn_id.to_string(),
                    timestamp,
                });
                // Answers to client-side calls are results no tool of the turn reports:
                // the client's message list gets them here, so no call is left dangling.
                for item in input {
                    if let TurnInputItem::ToolResponse(answer) = item
                        && !self.known_results.contains(&answer.tool_call_id)
                    {
                        out.push(AguiEvent::ToolCallResult {
                            message_id: format!("{}-{}", event.event_id, answer.tool_call_id),
                            tool_call_id: answer.tool_call_id.clone(),
                            content: answer.content.clone(),
                            role: "tool".to_owned(),
                            subagent_run_id: (!answer.thread_id.is_main())
                                .then(|| answer.thread_id.to_string()),
                            timestamp,
                        });
                    }
                }
            }
            EventPayload::ModelMessageDelta(delta) => {
                let message_id = event.event_id.to_string();
                let open = self
                    .open
                    .entry(event.event_id)
                    .or_insert_with(|| OpenMessage { subagent, ..OpenMessage::default() });
                let subagent = open.subagent.clone();
                let frame = Frame { message_id: &message_id, subagent: subagent.as_ref(), timestamp };
                open.delta(delta, &frame, &mut out);
            }
            EventPayload::ModelMessage(message) => {
                let message_id = event.event_id.to_string();
                let open = self.open.remove(&event.event_id).unwrap_or_default();
                let subagent = open.subagent.clone().or(subagent);
                let frame = Frame { message_id: &message_id, subagent: subagent.as_ref(), timestamp };
                open.complete(message, &frame, &mut out);
            }
            EventPayload::ToolResponse { tool_call_id, content, .. } => out.push(AguiEvent::ToolCallResult {
                message_id: event.event_id.to_string(),
                tool_call_id: tool_call_id.clone(),
                content: content.clone(),
                role: "tool".to_owned(),
                subagent_run_id: subagent,
                timestamp,
            }),
            EventPayload::ThreadCreated { parent, agent, title } => {
                let subagent_run_id = event.thread_or_main().to_string();
                self.subagents.push(subagent_run_id.clone());
                out.push(AguiEvent::SubagentStarted {
                    subagent_run_id,
                    name: agent.name.clone(),
                    description: Some(title.clone()),
                    parent_subagent_run_id: (!parent.thread_id.is_main())
                        .then(|| parent.thread_id.to_string()),
                    parent_tool_call_id: parent.tool_call_id.clone(),
                    timestamp,
                });
            }
            EventPayload::ThreadDone { outcome, .. } => {
                let subagent_run_id = event.thread_or_main().to_string();
                self.subagents.retain(|open| *open != subagent_run_id);
                out.push(match outcome {
                    ThreadOutcome::Done { output } => AguiEvent::SubagentFinished {
                        subagent_run_id,
                        result: output.message.content.clone().map(Value::String),
                        outcome: SubagentFinishedOutcome::Success {},
                        timestamp,
                    },
                    ThreadOutcome::Error { error, .. } => {
                        AguiEvent::SubagentError { subagent_run_id, message: error.clone(), timestamp }
                    }
                });
            }
            EventPayload::TurnDone { state } => {
                self.close_all(timestamp, &mut out);
                self.close_subagents(state, timestamp, &mut out);
                out.extend(finish(event, state, timestamp, &self.frontend_tools));
            }
            // Reflected in the run's interrupt outcome and in the tool-call frames.
            EventPayload::ToolApprovalRequired { .. }
            | EventPayload::ToolResponseRequired { .. }
            | EventPayload::McpAuthRequired { .. }
            | EventPayload::ToolCallStarted { .. } => {}
            other => out.push(AguiEvent::Custom {
                name: other.kind().to_owned(),
                // Agent-team events travel in their own vocabulary, with their team context.
                value: agent_team::render(event)
                    .and_then(|frame| serde_json::to_value(frame).ok())
                    .or_else(|| serde_json::to_value(other).ok())
                    .unwrap_or(Value::Null),
                subagent_run_id: subagent,
                timestamp,
            }),
        }
        out
    }

    fn close_all(&mut self, timestamp: i64, out: &mut Vec<AguiEvent>) {
        let mut open: Vec<_> = self.open.drain().collect();
        open.sort_by_key(|(id, _)| *id);
        for (id, mut message) in open {
            let message_id = id.to_string();
            let subagent = message.subagent.clone();
            message.close(&Frame { message_id: &message_id, subagent: subagent.as_ref(), timestamp }, out);
        }
    }

    /// Ends the segments of sub-agents still running when the turn ends: suspended with
    /// their interrupts when the turn waits for answers, failed when it was cancelled or
    /// failed.
    fn close_subagents(&mut self, state: &TurnState, timestamp: i64, out: &mut Vec<AguiEvent>) {
        let interrupts = interrupts(state.required_actions());
        for subagent_run_id in std::mem::take(&mut self.subagents) {
            out.push(match state {
                TurnState::Running | TurnState::Done { .. } => AguiEvent::SubagentFinished {
                    outcome: SubagentFinishedOutcome::Suspended {
                        interrupt_ids: interrupts
                            .iter()
                            .filter(|interrupt| interrupt.subagent_run_id.as_ref() == Some(&subagent_run_id))
                            .map(|interrupt| interrupt.id.clone())
                            .collect(),
                    },
                    subagent_run_id,
                    result: None,
                    timestamp,
                },
                TurnState::Cancelled { reason, .. } => AguiEvent::SubagentError {
                    subagent_run_id,
                    message: format!("cancelled: {}", reason.as_str()),
                    timestamp,
                },
                TurnState::Error { message, .. } => {
                    AguiEvent::SubagentError { subagent_run_id, message: message.clone(), timestamp }
                }
            });
        }
    }
}

impl OpenMessage {
    fn delta(&mut self, delta: &ModelMessageDelta, frame: &Frame<'_>, out: &mut Vec<AguiEvent>) {
        if let Some(reasoning) = delta.reasoning_content.as_deref().filter(|text| !text.is_empty()) {
            self.reasoning(reasoning, frame, out);
        }
        if let Some(text) = delta.content.as_deref().filter(|text| !text.is_empty()) {
            self.close_reasoning(frame, out);
            if !self.text {
                self.text = true;
                out.push(AguiEvent::TextMessageStart {
                    message_id: frame.message_id.to_owned(),
                    role: "assistant".to_owned(),
                    subagent_run_id: frame.subagent(),
                    timestamp: frame.timestamp,
                });
            }
            out.push(AguiEvent::TextMessageContent {
                message_id: frame.message_id.to_owned(),
                delta: text.to_owned(),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
        }
        for chunk in &delta.tool_calls {
            self.close_reasoning(frame, out);
            let call = self.calls.entry(chunk.index).or_default();
            if call.id.is_none() {
                call.id = chunk.id.clone().filter(|id| !id.is_empty());
            }
            let function = chunk.function.as_ref();
            if call.name.is_none() {
                call.name = function.and_then(|f| f.name.clone()).filter(|name| !name.is_empty());
            }
            if let Some(arguments) = function.and_then(|f| f.arguments.as_deref()) {
                call.waiting_arguments.push_str(arguments);
            }
            call.advance(frame, out);
        }
        if delta.finish_reason.is_some() {
            self.close(frame, out);
        }
    }

    fn reasoning(&mut self, text: &str, frame: &Frame<'_>, out: &mut Vec<AguiEvent>) {
        let reasoning_id = reasoning_message_id(frame.message_id);
        if !self.reasoning {
            self.reasoning = true;
            out.push(AguiEvent::ReasoningStart {
                message_id: reasoning_id.clone(),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
            out.push(AguiEvent::ReasoningMessageStart {
                message_id: reasoning_id.clone(),
                role: "reasoning".to_owned(),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
        }
        out.push(AguiEvent::ReasoningMessageContent {
            message_id: reasoning_id,
            delta: text.to_owned(),
            subagent_run_id: frame.subagent(),
            timestamp: frame.timestamp,
        });
    }

    fn close_reasoning(&mut self, frame: &Frame<'_>, out: &mut Vec<AguiEvent>) {
        if self.reasoning {
            self.reasoning = false;
            let reasoning_id = reasoning_message_id(frame.message_id);
            out.push(AguiEvent::ReasoningMessageEnd {
                message_id: reasoning_id.clone(),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
            out.push(AguiEvent::ReasoningEnd {
                message_id: reasoning_id,
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
        }
    }

    /// Closes every open frame; calls that never started are dropped here and synthesized
    /// from the complete message, if it arrives.
    fn close(&mut self, frame: &Frame<'_>, out: &mut Vec<AguiEvent>) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.close_reasoning(frame, out);
        if self.text {
            out.push(AguiEvent::TextMessageEnd {
                message_id: frame.message_id.to_owned(),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
        }
        for call in self.calls.values() {
            if let (true, Some(id)) = (call.started, &call.id) {
                out.push(AguiEvent::ToolCallEnd {
                    tool_call_id: id.clone(),
                    subagent_run_id: frame.subagent(),
                    timestamp: frame.timestamp,
                });
            }
        }
    }

    /// Handles the complete message: closes what its deltas left open, and renders in full
    /// whatever its deltas did not show (everything, for a message replayed from storage).
    fn complete(mut self, message: &ModelMessage, frame: &Frame<'_>, out: &mut Vec<AguiEvent>) {
        let replayed = self.calls.is_empty() && !self.text && !self.reasoning && !self.finished;
        if replayed {
            if let Some(reasoning) = message.reasoning_content.as_deref().filter(|text| !text.is_empty()) {
                self.reasoning(reasoning, frame, out);
            }
            if let Some(text) = message.content.as_deref().filter(|text| !text.is_empty()) {
                self.delta(&ModelMessageDelta::text(text), frame, out);
            }
        }
        self.close(frame, out);
        for (index, call) in message.tool_calls.iter().enumerate() {
            let started =
                u32::try_from(index).ok().and_then(|index| self.calls.get(&index)).is_some_and(|c| c.started);
            if !started {
                let mut full = OpenCall {
                    id: Some(call.id.clone()),
                    name: Some(call.function.name.clone()),
                    started: false,
                    waiting_arguments: call.function.arguments.clone(),
                };
                full.advance(frame, out);
                out.push(AguiEvent::ToolCallEnd {
                    tool_call_id: call.id.clone(),
                    subagent_run_id: frame.subagent(),
                    timestamp: frame.timestamp,
                });
            }
        }
    }
}

impl OpenCall {
    /// Starts the call once its id and name are known, and sends the arguments waiting.
    fn advance(&mut self, frame: &Frame<'_>, out: &mut Vec<AguiEvent>) {
        let (Some(id), Some(name)) = (&self.id, &self.name) else { return };
        if !self.started {
            self.started = true;
            out.push(AguiEvent::ToolCallStart {
                tool_call_id: id.clone(),
                tool_call_name: name.clone(),
                parent_message_id: frame.message_id.to_owned(),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
        }
        if !self.waiting_arguments.is_empty() {
            out.push(AguiEvent::ToolCallArgs {
                tool_call_id: id.clone(),
                delta: std::mem::take(&mut self.waiting_arguments),
                subagent_run_id: frame.subagent(),
                timestamp: frame.timestamp,
            });
        }
    }
}

fn reasoning_message_id(message_id: &str) -> String {
    format!("{message_id}-reasoning")
}

fn finish(
    event: &EventEnvelope,
    state: &TurnState,
    timestamp: i64,
    frontend: &[String],
) -> Option<AguiEvent> {
    let thread_id = event.session_id.to_string();
    let run_id = event.turn_id.to_string();
    Some(match state {
        TurnState::Running => return None,
        TurnState::Done { output, required_actions, .. }
            if !required_actions.is_empty() && only_frontend_calls(required_actions, frontend) =>
        {
            let pending = required_actions
                .iter()
                .flat_map(|record| match &record.action {
                    RequiredAction::ToolResponse { tool_calls, .. } => tool_calls.clone(),
                    _ => Vec::new(),
                })
                .map(|call| call.id)
                .collect();
            AguiEvent::RunFinished {
                thread_id,
                run_id,
                result: output.as_ref().and_then(|output| output.message.content.clone()).map(Value::String),
                outcome: RunFinishedOutcome::Success { pending_tool_call_ids: Some(pending) },
                timestamp,
            }
        }
        TurnState::Done { required_actions, .. } if !required_actions.is_empty() => AguiEvent::RunFinished {
            thread_id,
            run_id,
            result: None,
            outcome: RunFinishedOutcome::Interrupt { interrupts: interrupts(required_actions) },
            timestamp,
        },
        TurnState::Done { output, .. } => AguiEvent::RunFinished {
            thread_id,
            run_id,
            result: output.as_ref().and_then(|output| output.message.content.clone()).map(Value::String),
            outcome: RunFinishedOutcome::Success { pending_tool_call_ids: None },
            timestamp,
        },
        TurnState::Cancelled { .. } => AguiEvent::RunFinished {
            thread_id,
            run_id,
            result: None,
            outcome: RunFinishedOutcome::Cancelled {},
            timestamp,
        },
        TurnState::Error { message, .. } => {
            AguiEvent::RunError { message: message.clone(), code: Some("turn_error".to_owned()), timestamp }
        }
    })
}

/// Whether a turn waits only for calls of the client's frontend tools, on the main thread.
fn only_frontend_calls(actions: &[RequiredActionRecord], frontend: &[String]) -> bool {
    !frontend.is_empty()
        && actions.iter().all(|record| match &record.action {
            RequiredAction::ToolResponse { thread_id, tool_calls } => {
                thread_id.is_main() && tool_calls.iter().all(|call| frontend.contains(&call.name))
            }
            _ => false,
        })
}

/// The interrupts of a turn that ended with required actions: one per pending tool call
/// (its id is the tool call's id) and one per MCP server to authorize (`mcp:<server id>`).
#[must_use]
pub fn interrupts(actions: &[RequiredActionRecord]) -> Vec<Interrupt> {
    let mut interrupts = Vec::new();
    for record in actions {
        match &record.action {
            RequiredAction::ToolApproval { thread_id, tool_calls } => {
                interrupts.extend(tool_calls.iter().map(|call| tool_interrupt(thread_id, call, true)));
            }
            RequiredAction::ToolResponse { thread_id, tool_calls } => {
                interrupts.extend(tool_calls.iter().map(|call| tool_interrupt(thread_id, call, false)));
            }
            RequiredAction::McpAuth { thread_id, servers } => {
                interrupts.extend(servers.iter().map(|server| Interrupt {
                    id: format!("mcp:{}", server.id),
                    reason: "mcp_auth".to_owned(),
                    message: Some(format!("Authorize access to {} at {}", server.name, server.auth_url)),
                    tool_call_id: None,
                    response_schema: None,
                    metadata: Some(json!({ "serverName": server.name, "authUrl": server.auth_url })),
                    subagent_run_id: thread_id.as_ref().filter(|t| !t.is_main()).map(ToString::to_string),
                }));
            }
        }
    }
    interrupts
}

fn tool_interrupt(thread_id: &ThreadId, call: &PendingToolCall, approval: bool) -> Interrupt {
    let arguments: Value =
        serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments.clone()));
    let question = arguments.get("question").and_then(Value::as_str).map(str::to_owned);
    let (reason, message, schema) = if approval {
        (
            "tool_approval",
            if call.may_have_run {
                format!(
                    "The call to {} may already have run: its process stopped before its result was stored. \
                     Allow it to run again?",
                    call.name
                )
            } else {
                format!("Allow the call to {}?", call.name)
            },
            json!({
                "type": "object",
                "properties": { "approved": { "type": "boolean" }, "reason": { "type": "string" } },
                "required": ["approved"]
            }),
        )
    } else {
        (
            "tool_response",
            question.unwrap_or_else(|| format!("Provide the result of {}", call.name)),
            json!({
                "type": "object",
                "properties": { "content": { "type": "string" } },
                "required": ["content"]
            }),
        )
    };
    Interrupt {
        id: call.id.clone(),
        reason: reason.to_owned(),
        message: Some(message),
        tool_call_id: Some(call.id.clone()),
        response_schema: Some(schema),
        metadata: Some(json!({
            "threadId": thread_id.to_string(),
            "toolName": call.name,
            "arguments": arguments,
            "mayHaveRun": call.may_have_run,
        })),
        subagent_run_id: (!thread_id.is_main()).then(|| thread_id.to_string()),
    }
}
