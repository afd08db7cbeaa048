//! The harness vocabulary: the events, turns and states of the agent-harness HTTP API,
//! shaped exactly as the published client `truefoundry-gateway-sdk==0.4.2` parses them.
//!
//! [`render`] maps one canonical event to its harness event (turn-level, model, tool,
//! thread, MCP and sandbox events; other canonical events have no harness form). The SSE
//! frame of a streamed event carries the turn's `seq` as its `id:` ([`sse_frame`]).

use agentry_types::{
    ContentPart, McpServerAuth, MessageContent, ModelMessage, ModelMessageDelta, PendingToolCall,
    RequiredAction, RequiredActionRecord, RunRecord, Subject, ThreadMessage, ToolCall, ToolCallDelta,
    ToolInfo, TurnInputItem, TurnMetrics, TurnState, Usage,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::EventEnvelope;
use crate::payload::{EventPayload, McpTransport, ThreadOutcome};

/// `status: "running"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename = "running")]
pub struct TurnStateRunning {}

/// A finished turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnStateDone {
    /// The last model message of the main thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<ModelMessageEvent>,
    /// What the next turn must answer.
    pub required_actions: Vec<ActionRequiredEvent>,
    /// ISO-8601 completion time.
    pub completed_at: String,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<TurnMetrics>,
}

/// A cancelled turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnStateCancelled {
    /// `client-cancelled`, `server-execution-timeout`, `cancelled-for-next-turn` or `abandoned`.
    pub reason: String,
    /// ISO-8601 time.
    pub completed_at: String,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<TurnMetrics>,
}

/// A failed turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnStateError {
    /// What went wrong.
    pub message: String,
    /// ISO-8601 time.
    pub completed_at: String,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<TurnMetrics>,
}

/// A turn's state (`TurnState`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum HarnessTurnState {
    /// Running.
    Running {},
    /// Finished.
    Done(Box<TurnStateDone>),
    /// Cancelled.
    Cancelled(TurnStateCancelled),
    /// Failed.
    Error(TurnStateError),
}

/// A terminal turn state (`TurnDoneEventState`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum TerminalTurnState {
    /// Finished.
    Done(Box<TurnStateDone>),
    /// Cancelled.
    Cancelled(TurnStateCancelled),
    /// Failed.
    Error(TurnStateError),
}

/// Where a tool lives (`ToolInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum HarnessToolInfo {
    /// A tool of the runtime itself.
    #[serde(rename = "truefoundry-system")]
    System {
        /// The tool's name.
        name: String,
    },
    /// A tool of an MCP server.
    #[serde(rename = "mcp")]
    Mcp {
        /// The server's id.
        server_id: String,
        /// The server's name.
        server_name: String,
        /// The tool's name on the server.
        name: String,
    },
}

impl HarnessToolInfo {
    fn from_info(info: Option<&ToolInfo>, name: &str) -> Self {
        match info {
            Some(ToolInfo { mcp_server: Some(server), original_tool_name, .. }) => Self::Mcp {
                server_id: server.id.clone(),
                server_name: server.name.clone(),
                name: original_tool_name.clone(),
            },
            Some(info) => Self::System { name: info.original_tool_name.clone() },
            None => Self::System { name: name.to_owned() },
        }
    }
}

/// A function's name and complete arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessFunction {
    /// The tool name.
    pub name: String,
    /// The JSON arguments.
    pub arguments: String,
}

/// A complete tool call (`ToolCall`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessToolCall {
    /// The call id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: HarnessFunction,
    /// Where the tool lives.
    pub tool_info: HarnessToolInfo,
}

/// A function chunk of a streaming tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessFunctionDelta {
    /// The tool name (first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A streaming tool-call chunk (`ExtendedChunkDeltaToolCall`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessToolCallDelta {
    /// Position in `tool_calls`.
    pub index: u32,
    /// The call id (first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first chunk).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name and a piece of the arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<HarnessFunctionDelta>,
    /// Where the tool lives (first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_info: Option<HarnessToolInfo>,
}

/// Token usage of a model message (`ModelMessageUsage`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Cache reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Cache writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Where the input tokens went; all to `messages` when the runtime did not break them down.
    pub input_tokens_breakdown: agentry_types::InputTokensBreakdown,
}

impl From<&Usage> for HarnessUsage {
    fn from(usage: &Usage) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            input_tokens_breakdown: usage.input_tokens_breakdown.unwrap_or(
                agentry_types::InputTokensBreakdown { messages: usage.input_tokens, ..Default::default() },
            ),
        }
    }
}

/// A complete model message outside the event union (`ModelMessageEvent`), as a turn's
/// output and a thread's state hold it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename = "model.message")]
pub struct ModelMessageEvent {
    /// The message's fields.
    #[serde(flatten)]
    pub body: ModelMessageBody,
}

/// A streamed piece of a model message (`ModelMessageDeltaEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelMessageDeltaEvent {
    /// Text to append.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Refusal text to append.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Tool-call chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<HarnessToolCallDelta>>,
    /// Reasoning text to append.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The id of the message it builds.
    pub id: String,
    /// The thread.
    pub thread_id: String,
    /// ISO-8601 time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Set on the last delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Usage, on the last delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<HarnessUsage>,
}

/// A tool call awaiting an answer (`ToolCallRef`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallRef {
    /// The call id.
    pub id: String,
    /// The `model.message` that made it.
    pub source_event_id: String,
    /// It may already have run: a process started it and stopped before its result was
    /// stored (an agentry extension; absent otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub may_have_run: bool,
}

/// Tool calls awaiting approval (`ToolApprovalRequiredEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallsAwaitingEvent {
    /// The event id.
    pub id: String,
    /// ISO-8601 time.
    pub created_at: String,
    /// The thread.
    pub thread_id: String,
    /// The calls.
    pub tool_calls: Vec<ToolCallRef>,
}

/// An MCP server needing authorization (`McpServerAuthInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpServerAuthInfo {
    /// The server's id.
    pub id: String,
    /// The server's name.
    pub name: String,
    /// Where the user authorizes.
    pub auth_url: String,
}

/// MCP servers needing authorization (`McpAuthRequiredEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpAuthRequiredEvent {
    /// The event id.
    pub id: String,
    /// ISO-8601 time.
    pub created_at: String,
    /// The thread, if one needed the servers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The servers.
    pub mcp_servers: Vec<McpServerAuthInfo>,
}

/// A required action (`ActionRequiredEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum ActionRequiredEvent {
    /// Approvals needed.
    #[serde(rename = "tool.approval_required")]
    ToolApprovalRequired(ToolCallsAwaitingEvent),
    /// Client-side results needed.
    #[serde(rename = "tool.response_required")]
    ToolResponseRequired(ToolCallsAwaitingEvent),
    /// MCP authorization needed.
    #[serde(rename = "mcp.auth_required")]
    McpAuthRequired(McpAuthRequiredEvent),
}

/// Who is running and what started a sub-agent thread (`AgentParent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentParent {
    /// The parent thread.
    pub thread_id: String,
    /// The tool call that started the thread.
    pub tool_call_id: String,
}

/// The agent on a sub-agent thread (`AgentInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename = "dynamic")]
pub struct AgentInfo {
    /// The agent's name.
    pub name: String,
    /// Its task.
    pub input: String,
    /// Its model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// How a sub-agent thread ended (`ThreadState`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ThreadState {
    /// Finished with an output.
    Done {
        /// Its final message.
        output: ModelMessageEvent,
    },
    /// Failed.
    Error {
        /// What went wrong.
        error: String,
        /// Its last message, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        output: Option<ModelMessageEvent>,
    },
}

/// An initialized MCP server (`McpServerInitInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpServerInitInfo {
    /// The server's id.
    pub id: String,
    /// The server's name.
    pub name: String,
    /// The MCP session id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `streamable-http` or `sse`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_type: Option<String>,
}

/// A text part of a user message (`TextContent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum UserContentItem {
    /// Text.
    #[serde(rename = "text")]
    Text {
        /// The text.
        text: String,
    },
    /// A file as a data URI.
    #[serde(rename = "file")]
    File {
        /// The file name.
        name: String,
        /// `data:<mime>;base64,<payload>`.
        data: String,
    },
}

/// A user message's content (`UserMessageContent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum UserMessageContent {
    /// Plain text.
    Text(String),
    /// Parts.
    Parts(Vec<UserContentItem>),
}

/// An approval decision (`ApprovalDecision`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum HarnessApproval {
    /// Allowed.
    Allow {},
    /// Denied.
    Deny {
        /// Why.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// One item of a turn's input (`TurnInputItem`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum HarnessInputItem {
    /// A user message.
    #[serde(rename = "user.message")]
    Message {
        /// Its content.
        content: UserMessageContent,
    },
    /// An approval.
    #[serde(rename = "user.tool_approval")]
    ToolApproval {
        /// The thread.
        thread_id: String,
        /// The call.
        tool_call_id: String,
        /// The decision.
        approval: HarnessApproval,
    },
    /// A client-side result.
    #[serde(rename = "user.tool_response")]
    ToolResponse {
        /// The thread.
        thread_id: String,
        /// The call.
        tool_call_id: String,
        /// The result.
        content: String,
    },
}

/// The first event of a turn's stream (`TurnCreatedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnCreatedEvent {
    /// The event id.
    pub id: String,
    /// The turn.
    pub turn_id: String,
    /// The turn it chains from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_turn_id: Option<String>,
    /// Its input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Vec<HarnessInputItem>>,
    /// Always running.
    pub state: TurnStateRunning,
    /// Who created it.
    pub created_by: Subject,
    /// ISO-8601 time.
    pub created_at: String,
    /// Not set for turn-level events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// The last event of a turn's stream (`TurnDoneEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnDoneEvent {
    /// The event id.
    pub id: String,
    /// The terminal state.
    pub state: TerminalTurnState,
    /// ISO-8601 time.
    pub created_at: String,
    /// Not set for turn-level events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// A server-side tool result (`ToolResponseEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResponseEvent {
    /// The call answered.
    pub tool_call_id: String,
    /// The result.
    pub content: String,
    /// The event id.
    pub id: String,
    /// The thread.
    pub thread_id: String,
    /// ISO-8601 time.
    pub created_at: String,
}

/// A sub-agent thread started (`ThreadCreatedEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadCreatedEvent {
    /// The event id.
    pub id: String,
    /// The agent.
    pub agent_info: AgentInfo,
    /// ISO-8601 time.
    pub created_at: String,
    /// Who started it.
    pub parent: AgentParent,
    /// The new thread.
    pub thread_id: String,
    /// A title.
    pub title: String,
}

/// A sub-agent thread ended (`ThreadDoneEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadDoneEvent {
    /// Who started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<AgentParent>,
    /// The thread.
    pub thread_id: String,
    /// Its title.
    pub title: String,
    /// The event id.
    pub id: String,
    /// ISO-8601 time.
    pub created_at: String,
    /// How it ended.
    pub state: ThreadState,
}

/// MCP sessions opened (`McpInitializeEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpInitializeEvent {
    /// The event id.
    pub id: String,
    /// ISO-8601 time.
    pub created_at: String,
    /// The thread.
    pub thread_id: String,
    /// The servers.
    pub mcp_servers: Vec<McpServerInitInfo>,
}

/// A sandbox was provisioned (`SandboxCreatedEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxCreatedEvent {
    /// The event id.
    pub id: String,
    /// ISO-8601 time.
    pub created_at: String,
    /// The sandbox.
    pub sandbox_id: String,
    /// The thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// Any event of a turn's stream (`TurnStreamingEvent`): the stored events plus
/// `turn.created`, `turn.done` and the deltas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum HarnessEvent {
    /// `turn.created`.
    #[serde(rename = "turn.created")]
    TurnCreated(TurnCreatedEvent),
    /// `turn.done`.
    #[serde(rename = "turn.done")]
    TurnDone(TurnDoneEvent),
    /// `model.message`.
    #[serde(rename = "model.message")]
    ModelMessage(ModelMessageBody),
    /// `model.message.delta`.
    #[serde(rename = "model.message.delta")]
    ModelMessageDelta(ModelMessageDeltaEvent),
    /// `tool.response`.
    #[serde(rename = "tool.response")]
    ToolResponse(ToolResponseEvent),
    /// `tool.approval_required`.
    #[serde(rename = "tool.approval_required")]
    ToolApprovalRequired(ToolCallsAwaitingEvent),
    /// `tool.response_required`.
    #[serde(rename = "tool.response_required")]
    ToolResponseRequired(ToolCallsAwaitingEvent),
    /// `thread.created`.
    #[serde(rename = "thread.created")]
    ThreadCreated(ThreadCreatedEvent),
    /// `thread.done`.
    #[serde(rename = "thread.done")]
    ThreadDone(ThreadDoneEvent),
    /// `mcp.initialize`.
    #[serde(rename = "mcp.initialize")]
    McpInitialize(McpInitializeEvent),
    /// `mcp.auth_required`.
    #[serde(rename = "mcp.auth_required")]
    McpAuthRequired(McpAuthRequiredEvent),
    /// `sandbox.created`.
    #[serde(rename = "sandbox.created")]
    SandboxCreated(SandboxCreatedEvent),
}

/// The fields of a `model.message` inside [`HarnessEvent`] (the tag is the enum's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelMessageBody {
    /// The assistant text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// An author name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<HarnessToolCall>>,
    /// The event id.
    pub id: String,
    /// The thread.
    pub thread_id: String,
    /// Why it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// ISO-8601 time.
    pub created_at: String,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<HarnessUsage>,
}

impl HarnessEvent {
    /// The event's `type`.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::TurnCreated(_) => "turn.created",
            Self::TurnDone(_) => "turn.done",
            Self::ModelMessage(_) => "model.message",
            Self::ModelMessageDelta(_) => "model.message.delta",
            Self::ToolResponse(_) => "tool.response",
            Self::ToolApprovalRequired(_) => "tool.approval_required",
            Self::ToolResponseRequired(_) => "tool.response_required",
            Self::ThreadCreated(_) => "thread.created",
            Self::ThreadDone(_) => "thread.done",
            Self::McpInitialize(_) => "mcp.initialize",
            Self::McpAuthRequired(_) => "mcp.auth_required",
            Self::SandboxCreated(_) => "sandbox.created",
        }
    }

    /// Whether the event appears in a turn's stored event list (`TurnEvent`):
    /// `turn.created`, `turn.done` and deltas are stream-only.
    #[must_use]
    pub const fn is_turn_event(&self) -> bool {
        !matches!(self, Self::TurnCreated(_) | Self::TurnDone(_) | Self::ModelMessageDelta(_))
    }
}

/// A turn (`Turn`), as the list-turns and get-turn routes return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessTurn {
    /// Its id.
    pub id: String,
    /// Its session.
    pub session_id: String,
    /// The turn it chains from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_turn_id: Option<String>,
    /// Its input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Vec<HarnessInputItem>>,
    /// Its state.
    pub state: HarnessTurnState,
    /// Who created it.
    pub created_by_subject: Subject,
    /// ISO-8601 time.
    pub created_at: String,
}

/// Renders a canonical event in the harness vocabulary; `None` for events the harness
/// does not have (reasoning, memory, steps, agent-team events, tool start and activity).
#[must_use]
pub fn render(event: &EventEnvelope) -> Option<HarnessEvent> {
    let id = event.event_id.to_string();
    let created_at = event.created_at.to_rfc3339();
    let thread = event.thread_or_main().to_string();
    let rendered = match &event.payload {
        EventPayload::TurnCreated { previous_turn_id, input, created_by } => {
            HarnessEvent::TurnCreated(TurnCreatedEvent {
                id,
                turn_id: event.turn_id.to_string(),
                previous_turn_id: previous_turn_id.map(|turn| turn.to_string()),
                input: Some(input.iter().map(input_item).collect()),
                state: TurnStateRunning {},
                created_by: created_by.clone(),
                created_at,
                thread_id: None,
            })
        }
        EventPayload::TurnDone { state } => HarnessEvent::TurnDone(TurnDoneEvent {
            id,
            state: terminal_state(state)?,
            created_at,
            thread_id: None,
        }),
        EventPayload::ModelMessageDelta(delta) => {
            HarnessEvent::ModelMessageDelta(model_message_delta(id, thread, Some(created_at), delta))
        }
        EventPayload::ModelMessage(message) => {
            HarnessEvent::ModelMessage(model_message_body(id, thread, created_at, message))
        }
        EventPayload::ToolResponse { tool_call_id, content, .. } => {
            HarnessEvent::ToolResponse(ToolResponseEvent {
                tool_call_id: tool_call_id.clone(),
                content: content.clone(),
                id,
                thread_id: thread,
                created_at,
            })
        }
        EventPayload::ToolApprovalRequired { tool_calls } => {
            HarnessEvent::ToolApprovalRequired(awaiting(id, created_at, thread, tool_calls))
        }
        EventPayload::ToolResponseRequired { tool_calls } => {
            HarnessEvent::ToolResponseRequired(awaiting(id, created_at, thread, tool_calls))
        }
        EventPayload::ThreadCreated { parent, agent, title } => {
            HarnessEvent::ThreadCreated(ThreadCreatedEvent {
                id,
                agent_info: AgentInfo {
                    name: agent.name.clone(),
                    input: agent.input.clone(),
                    model: agent.model.clone(),
                },
                created_at,
                parent: AgentParent {
                    thread_id: parent.thread_id.to_string(),
                    tool_call_id: parent.tool_call_id.clone(),
                },
                thread_id: thread,
                title: title.clone(),
            })
        }
        EventPayload::ThreadDone { parent, title, outcome } => HarnessEvent::ThreadDone(ThreadDoneEvent {
            parent: parent.as_ref().map(|parent| AgentParent {
                thread_id: parent.thread_id.to_string(),
                tool_call_id: parent.tool_call_id.clone(),
            }),
            thread_id: thread,
            title: title.clone(),
            id,
            created_at,
            state: match outcome {
                ThreadOutcome::Done { output } => ThreadState::Done { output: model_message_event(output) },
                ThreadOutcome::Error { error, output } => ThreadState::Error {
                    error: error.clone(),
                    output: output.as_deref().map(model_message_event),
                },
            },
        }),
        EventPayload::McpInitialize { servers } => HarnessEvent::McpInitialize(McpInitializeEvent {
            id,
            created_at,
            thread_id: thread,
            mcp_servers: servers
                .iter()
                .map(|server| McpServerInitInfo {
                    id: server.id.clone(),
                    name: server.name.clone(),
                    session_id: server.session_id.clone(),
                    transport_type: server.transport.and_then(|transport| match transport {
                        McpTransport::StreamableHttp => Some("streamable-http".to_owned()),
                        McpTransport::Sse => Some("sse".to_owned()),
                        McpTransport::Stdio => None,
                    }),
                })
                .collect(),
        }),
        EventPayload::McpAuthRequired { servers } => HarnessEvent::McpAuthRequired(McpAuthRequiredEvent {
            id,
            created_at,
            thread_id: event.thread_id.as_ref().map(ToString::to_string),
            mcp_servers: servers.iter().map(mcp_auth_info).collect(),
        }),
        EventPayload::SandboxCreated { sandbox_id } => HarnessEvent::SandboxCreated(SandboxCreatedEvent {
            id,
            created_at,
            sandbox_id: sandbox_id.clone(),
            thread_id: event.thread_id.as_ref().map(ToString::to_string),
        }),
        _ => return None,
    };
    Some(rendered)
}

/// The SSE frame of a streamed event: `id: <seq>` and the JSON as `data:`.
#[must_use]
pub fn sse_frame(seq: u64, event: &HarnessEvent) -> String {
    // Serializing plain data to JSON cannot fail.
    let json = serde_json::to_string(event).unwrap_or_default();
    format!("id: {seq}\ndata: {json}\n\n")
}

/// Renders a turn record (`Turn`).
#[must_use]
pub fn turn(record: &RunRecord) -> HarnessTurn {
    HarnessTurn {
        id: record.id.to_string(),
        session_id: record.session_id.to_string(),
        previous_turn_id: record.previous_turn_id.map(|turn| turn.to_string()),
        input: Some(record.input.iter().map(input_item).collect()),
        state: turn_state(&record.state),
        created_by_subject: record.created_by.clone(),
        created_at: record.created_at.to_rfc3339(),
    }
}

/// Renders a turn state (`TurnState`).
#[must_use]
pub fn turn_state(state: &TurnState) -> HarnessTurnState {
    match terminal_state(state) {
        None => HarnessTurnState::Running {},
        Some(TerminalTurnState::Done(done)) => HarnessTurnState::Done(done),
        Some(TerminalTurnState::Cancelled(cancelled)) => HarnessTurnState::Cancelled(cancelled),
        Some(TerminalTurnState::Error(error)) => HarnessTurnState::Error(error),
    }
}

fn terminal_state(state: &TurnState) -> Option<TerminalTurnState> {
    Some(match state {
        TurnState::Running => return None,
        TurnState::Done { output, required_actions, completed_at, metrics } => {
            TerminalTurnState::Done(Box::new(TurnStateDone {
                output: output.as_deref().map(model_message_event),
                required_actions: required_actions.iter().map(action_required).collect(),
                completed_at: completed_at.to_rfc3339(),
                metrics: *metrics,
            }))
        }
        TurnState::Cancelled { reason, completed_at, metrics } => {
            TerminalTurnState::Cancelled(TurnStateCancelled {
                reason: reason.as_str().to_owned(),
                completed_at: completed_at.to_rfc3339(),
                metrics: *metrics,
            })
        }
        TurnState::Error { message, completed_at, metrics } => TerminalTurnState::Error(TurnStateError {
            message: message.clone(),
            completed_at: completed_at.to_rfc3339(),
            metrics: *metrics,
        }),
    })
}

fn action_required(record: &RequiredActionRecord) -> ActionRequiredEvent {
    let id = record.id.to_string();
    let created_at = record.created_at.to_rfc3339();
    match &record.action {
        RequiredAction::ToolApproval { thread_id, tool_calls } => ActionRequiredEvent::ToolApprovalRequired(
            awaiting(id, created_at, thread_id.to_string(), tool_calls),
        ),
        RequiredAction::ToolResponse { thread_id, tool_calls } => ActionRequiredEvent::ToolResponseRequired(
            awaiting(id, created_at, thread_id.to_string(), tool_calls),
        ),
        RequiredAction::McpAuth { thread_id, servers } => {
            ActionRequiredEvent::McpAuthRequired(McpAuthRequiredEvent {
                id,
                created_at,
                thread_id: thread_id.as_ref().map(ToString::to_string),
                mcp_servers: servers.iter().map(mcp_auth_info).collect(),
            })
        }
    }
}

fn mcp_auth_info(server: &McpServerAuth) -> McpServerAuthInfo {
    McpServerAuthInfo { id: server.id.clone(), name: server.name.clone(), auth_url: server.auth_url.clone() }
}

fn awaiting(
    id: String,
    created_at: String,
    thread_id: String,
    calls: &[PendingToolCall],
) -> ToolCallsAwaitingEvent {
    ToolCallsAwaitingEvent {
        id,
        created_at,
        thread_id,
        tool_calls: calls
            .iter()
            .map(|call| ToolCallRef {
                id: call.id.clone(),
                source_event_id: call.source_event_id.to_string(),
                may_have_run: call.may_have_run,
            })
            .collect(),
    }
}

fn tool_call(call: &ToolCall) -> HarnessToolCall {
    HarnessToolCall {
        id: call.id.clone(),
        kind: "function".to_owned(),
        function: HarnessFunction {
            name: call.function.name.clone(),
            arguments: call.function.arguments.clone(),
        },
        tool_info: HarnessToolInfo::from_info(call.tool_info.as_ref(), &call.function.name),
    }
}

fn tool_call_delta(chunk: &ToolCallDelta) -> HarnessToolCallDelta {
    let name = chunk.function.as_ref().and_then(|function| function.name.as_deref());
    HarnessToolCallDelta {
        index: chunk.index,
        id: chunk.id.clone(),
        kind: chunk.kind.map(|_| "function".to_owned()),
        function: chunk.function.as_ref().map(|function| HarnessFunctionDelta {
            name: function.name.clone(),
            arguments: function.arguments.clone(),
        }),
        // The first chunk of a call (the one with its name) always carries routing
        // metadata, so a client merging the deltas gets the same call as the full message.
        tool_info: match (chunk.tool_info.as_ref(), name) {
            (Some(info), name) => Some(HarnessToolInfo::from_info(Some(info), name.unwrap_or_default())),
            (None, Some(name)) => Some(HarnessToolInfo::System { name: name.to_owned() }),
            (None, None) => None,
        },
    }
}

fn model_message_delta(
    id: String,
    thread_id: String,
    created_at: Option<String>,
    delta: &ModelMessageDelta,
) -> ModelMessageDeltaEvent {
    ModelMessageDeltaEvent {
        content: delta.content.clone(),
        refusal: delta.refusal.clone(),
        tool_calls: (!delta.tool_calls.is_empty())
            .then(|| delta.tool_calls.iter().map(tool_call_delta).collect()),
        reasoning_content: delta.reasoning_content.clone(),
        id,
        thread_id,
        created_at,
        finish_reason: delta.finish_reason.as_ref().map(|reason| reason.as_str().to_owned()),
        usage: delta.usage.as_ref().map(HarnessUsage::from),
    }
}

fn model_message_body(
    id: String,
    thread_id: String,
    created_at: String,
    message: &ModelMessage,
) -> ModelMessageBody {
    ModelMessageBody {
        content: message.content.clone(),
        name: message.name.clone(),
        refusal: message.refusal.clone(),
        reasoning_content: message.reasoning_content.clone(),
        tool_calls: (!message.tool_calls.is_empty())
            .then(|| message.tool_calls.iter().map(tool_call).collect()),
        id,
        thread_id,
        finish_reason: message.finish_reason.as_ref().map(|reason| reason.as_str().to_owned()),
        created_at,
        usage: message.usage.as_ref().map(HarnessUsage::from),
    }
}

/// Renders a recorded thread message as a standalone `ModelMessageEvent`.
#[must_use]
pub fn model_message_event(message: &ThreadMessage) -> ModelMessageEvent {
    ModelMessageEvent {
        body: model_message_body(
            message.id.to_string(),
            message.thread_id.to_string(),
            message.created_at.to_rfc3339(),
            &message.message,
        ),
    }
}

fn input_item(item: &TurnInputItem) -> HarnessInputItem {
    match item {
        TurnInputItem::Message(message) => HarnessInputItem::Message {
            content: match &message.content {
                MessageContent::Text(text) => UserMessageContent::Text(text.clone()),
                MessageContent::Parts(parts) => {
                    UserMessageContent::Parts(parts.iter().map(content_item).collect())
                }
            },
        },
        TurnInputItem::ToolApproval(approval) => HarnessInputItem::ToolApproval {
            thread_id: approval.thread_id.to_string(),
            tool_call_id: approval.tool_call_id.clone(),
            approval: match &approval.approval {
                agentry_types::ApprovalDecision::Allow => HarnessApproval::Allow {},
                agentry_types::ApprovalDecision::Deny { reason } => {
                    HarnessApproval::Deny { reason: reason.clone() }
                }
            },
        },
        TurnInputItem::ToolResponse(response) => HarnessInputItem::ToolResponse {
            thread_id: response.thread_id.to_string(),
            tool_call_id: response.tool_call_id.clone(),
            content: response.content.clone(),
        },
    }
}

fn content_item(part: &ContentPart) -> UserContentItem {
    match part {
        ContentPart::Text { text } => UserContentItem::Text { text: text.clone() },
        ContentPart::File(file) => {
            UserContentItem::File { name: file.name.clone(), data: file.data.as_str().to_owned() }
        }
        // The harness has no image-by-URL part: a data URI travels as a file, a remote
        // URL as text naming it.
        ContentPart::Image { image_url } if image_url.url.starts_with("data:") => {
            UserContentItem::File { name: "image".to_owned(), data: image_url.url.clone() }
        }
        ContentPart::Image { image_url } => {
            UserContentItem::Text { text: format!("[image: {}]", image_url.url) }
        }
    }
}
