//! The canonical event payloads: one enum covering every event of the harness (seed 002),
//! Agno teams (seed 000), agent teams (seed 001) and the AdalFlow runner (seed 004).

use agentry_types::agno::ReasoningStep;
use agentry_types::{
    BudgetLimit, BudgetUsage, McpServerAuth, ModelMessage, ModelMessageDelta, PendingToolCall, Subject,
    ThreadId, ThreadMessage, ToolCall, TurnId, TurnInputItem, TurnState,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How an event is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Numbered, live-streamed and persisted.
    Durable,
    /// Numbered and live-streamed, not persisted: the durable message it builds is.
    Delta,
}

/// The thread and tool call that started a sub-agent thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadParent {
    /// The parent thread.
    pub thread_id: ThreadId,
    /// The tool call on the parent thread that started this one.
    pub tool_call_id: String,
}

/// The agent running on a sub-agent thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadAgent {
    /// The agent's name.
    pub name: String,
    /// The task it was given.
    pub input: String,
    /// The model it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// How a sub-agent thread ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ThreadOutcome {
    /// It finished; its last message is the output.
    Done {
        /// The thread's final model message.
        output: Box<ThreadMessage>,
    },
    /// It failed.
    Error {
        /// What went wrong.
        error: String,
        /// Its last model message, if it produced one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Box<ThreadMessage>>,
    },
}

/// The transport of an MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum McpTransport {
    /// Streamable HTTP.
    StreamableHttp,
    /// Server-sent events (legacy HTTP transport).
    Sse,
    /// A child process over stdin and stdout.
    Stdio,
}

/// An MCP server session that was opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpServerSession {
    /// The server's id.
    pub id: String,
    /// The server's name.
    pub name: String,
    /// The MCP session id, when the server assigned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// How the server is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<McpTransport>,
}

/// A canonical event payload: `{"type": <canonical event name>, "data": {<fields>}}`.
///
/// The tag comes first and the fields sit apart from it, so reading a stored event never
/// buffers its payload (replaying a turn decodes every event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", content = "data")]
#[non_exhaustive]
pub enum EventPayload {
    // ----- Turn lifecycle (turn-level: no thread) -----
    /// A turn was created; always the first event of a turn.
    #[serde(rename = "turn.created")]
    TurnCreated {
        /// The turn it chains from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_turn_id: Option<TurnId>,
        /// Its input.
        #[serde(default)]
        input: Vec<TurnInputItem>,
        /// Who created it.
        created_by: Subject,
    },
    /// The turn ended; always the last event of a turn. The state is never `running`.
    #[serde(rename = "turn.done")]
    TurnDone {
        /// The terminal state.
        state: TurnState,
    },

    // ----- Model output -----
    /// A piece of a model message as it streams. Shares its id with the message.
    #[serde(rename = "model.message.delta")]
    ModelMessageDelta(ModelMessageDelta),
    /// A complete model message.
    #[serde(rename = "model.message")]
    ModelMessage(ModelMessage),
    /// Content produced before the final answer (for example by a parser or an output model).
    #[serde(rename = "run.intermediate_content")]
    IntermediateContent {
        /// The content.
        content: Value,
        /// Its type (`"str"` for text).
        content_type: String,
    },

    // ----- Tools -----
    /// A tool call is about to run.
    #[serde(rename = "tool.call.started")]
    ToolCallStarted {
        /// The call id.
        tool_call_id: String,
        /// The tool.
        name: String,
        /// The arguments as a JSON string.
        arguments: String,
    },
    /// Progress reported by a running tool.
    #[serde(rename = "tool.call.activity")]
    ToolCallActivity {
        /// The call id.
        tool_call_id: String,
        /// What the tool reported.
        data: Value,
    },
    /// A server-side tool's complete result.
    #[serde(rename = "tool.response")]
    ToolResponse {
        /// The call id.
        tool_call_id: String,
        /// The tool.
        name: String,
        /// The arguments it ran with, as a JSON string.
        arguments: String,
        /// The result given to the model.
        content: String,
        /// Whether the result reports a failure (an error, a denial, a timeout).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// Tool calls await a human's approval; the turn ends after this.
    #[serde(rename = "tool.approval_required")]
    ToolApprovalRequired {
        /// The calls.
        tool_calls: Vec<PendingToolCall>,
    },
    /// Client-side tool calls await their results; the turn ends after this.
    #[serde(rename = "tool.response_required")]
    ToolResponseRequired {
        /// The calls.
        tool_calls: Vec<PendingToolCall>,
    },

    // ----- Sub-agent threads -----
    /// A sub-agent thread started (never emitted for the main thread).
    #[serde(rename = "thread.created")]
    ThreadCreated {
        /// Who started it.
        parent: ThreadParent,
        /// The agent running on it.
        agent: ThreadAgent,
        /// A title for people.
        title: String,
    },
    /// A sub-agent thread ended (never emitted for the main thread).
    #[serde(rename = "thread.done")]
    ThreadDone {
        /// Who started it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<ThreadParent>,
        /// Its title.
        title: String,
        /// How it ended.
        outcome: ThreadOutcome,
    },

    // ----- MCP and sandbox -----
    /// MCP server sessions were opened for the thread.
    #[serde(rename = "mcp.initialize")]
    McpInitialize {
        /// The servers.
        servers: Vec<McpServerSession>,
    },
    /// MCP servers need the user to authorize access; the turn ends after this.
    #[serde(rename = "mcp.auth_required")]
    McpAuthRequired {
        /// The servers.
        servers: Vec<McpServerAuth>,
    },
    /// A sandbox was provisioned for the turn.
    #[serde(rename = "sandbox.created")]
    SandboxCreated {
        /// Its id.
        sandbox_id: String,
    },

    // ----- Reasoning, memory and steps -----
    /// A reasoning process started.
    #[serde(rename = "reasoning.started")]
    ReasoningStarted {},
    /// One step of a reasoning process.
    #[serde(rename = "reasoning.step")]
    ReasoningStep {
        /// The step.
        step: ReasoningStep,
    },
    /// A reasoning process ended.
    #[serde(rename = "reasoning.completed")]
    ReasoningCompleted {},
    /// Memory (summary, user profile) is being updated after a run.
    #[serde(rename = "memory.update.started")]
    MemoryUpdateStarted {},
    /// The memory update finished: the summary and the profile are written, or `error`
    /// says what failed. A failure does not fail the run, whose answer stands.
    #[serde(rename = "memory.update.completed")]
    MemoryUpdateCompleted {
        /// What failed (the model, its answer, the store), when the update did not
        /// complete; absent when it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// One step of the agent loop finished: a tool call and its observation, or the answer.
    #[serde(rename = "step.completed")]
    StepCompleted {
        /// The step's number, from 1.
        step: u32,
        /// The tool call the step made; absent for the answering step.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call: Option<ToolCall>,
        /// What the step observed: the tool's result, or the answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        observation: Option<String>,
    },

    // ----- Agent teams (seed 001); team context is in the envelope -----
    /// A spawn of a new agent instance was requested.
    #[serde(rename = "agent_team.spawn.requested")]
    SpawnRequested {
        /// The role asked for.
        requested_role: String,
        /// The template asked for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        template: Option<String>,
        /// The task for the instance.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task: Option<String>,
        /// Why it is needed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        justification: Option<String>,
        /// A budget asked for instead of the role's default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_override: Option<BudgetLimit>,
    },
    /// A spawn was refused.
    #[serde(rename = "agent_team.spawn.denied")]
    SpawnDenied {
        /// The role asked for.
        requested_role: String,
        /// A machine-readable reason (`spawn_policy_missing`, …).
        code: String,
        /// A human-readable reason.
        error: String,
    },
    /// A spawn was allowed.
    #[serde(rename = "agent_team.spawn.approved")]
    SpawnApproved {
        /// The role granted.
        requested_role: String,
        /// The approval that allowed it, when one was needed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    },
    /// An agent instance started.
    #[serde(rename = "agent_team.instance.started")]
    InstanceStarted {
        /// Its role.
        role: String,
        /// Its status (`running`).
        status: String,
        /// Its budget.
        budget_limit: BudgetLimit,
        /// A hash of its skills and instructions (`sha256:…`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skill_hash: Option<String>,
    },
    /// What an instance has used of its budget.
    #[serde(rename = "agent_team.budget.usage")]
    BudgetUsage {
        /// The usage.
        usage: BudgetUsage,
        /// The limit it counts against.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<BudgetLimit>,
    },
    /// An instance's budget ran out; the instance is cancelled.
    #[serde(rename = "agent_team.budget.exhausted")]
    BudgetExhausted {
        /// The limit that ran out (`max_tokens`, `max_tool_calls`, …): the instance's own,
        /// or with `ancestor_` an ancestor's that leaves it no room, or with `mission_` its
        /// mission's that leaves this step no room beside what other instances hold (the
        /// mission itself is not exhausted then).
        exhausted_by: String,
        /// The usage at that point.
        usage: BudgetUsage,
    },
    /// An instance was cancelled.
    #[serde(rename = "agent_team.instance.cancelled")]
    InstanceCancelled {
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// An instance finished its task.
    #[serde(rename = "agent_team.instance.completed")]
    InstanceCompleted {
        /// Its final answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        /// What it used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<BudgetUsage>,
    },
    /// An instance failed.
    #[serde(rename = "agent_team.instance.failed")]
    InstanceFailed {
        /// What went wrong.
        error: String,
    },
    /// A mission's total budget ran out; every instance of the mission is cancelled.
    #[serde(rename = "agent_team.mission.budget.exhausted")]
    MissionBudgetExhausted {
        /// The limit that ran out (`mission_max_tokens`, …).
        exhausted_by: String,
        /// The mission's usage at that point.
        usage: BudgetUsage,
    },
    /// A tool call was refused by the instance's capability policy.
    #[serde(rename = "agent_team.capability.denied")]
    CapabilityDenied {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
}

impl EventPayload {
    /// The canonical event name, the value of the `type` tag.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::TurnCreated { .. } => "turn.created",
            Self::TurnDone { .. } => "turn.done",
            Self::ModelMessageDelta(_) => "model.message.delta",
            Self::ModelMessage(_) => "model.message",
            Self::IntermediateContent { .. } => "run.intermediate_content",
            Self::ToolCallStarted { .. } => "tool.call.started",
            Self::ToolCallActivity { .. } => "tool.call.activity",
            Self::ToolResponse { .. } => "tool.response",
            Self::ToolApprovalRequired { .. } => "tool.approval_required",
            Self::ToolResponseRequired { .. } => "tool.response_required",
            Self::ThreadCreated { .. } => "thread.created",
            Self::ThreadDone { .. } => "thread.done",
            Self::McpInitialize { .. } => "mcp.initialize",
            Self::McpAuthRequired { .. } => "mcp.auth_required",
            Self::SandboxCreated { .. } => "sandbox.created",
            Self::ReasoningStarted {} => "reasoning.started",
            Self::ReasoningStep { .. } => "reasoning.step",
            Self::ReasoningCompleted {} => "reasoning.completed",
            Self::MemoryUpdateStarted {} => "memory.update.started",
            Self::MemoryUpdateCompleted { .. } => "memory.update.completed",
            Self::StepCompleted { .. } => "step.completed",
            Self::SpawnRequested { .. } => "agent_team.spawn.requested",
            Self::SpawnDenied { .. } => "agent_team.spawn.denied",
            Self::SpawnApproved { .. } => "agent_team.spawn.approved",
            Self::InstanceStarted { .. } => "agent_team.instance.started",
            Self::BudgetUsage { .. } => "agent_team.budget.usage",
            Self::BudgetExhausted { .. } => "agent_team.budget.exhausted",
            Self::InstanceCancelled { .. } => "agent_team.instance.cancelled",
            Self::InstanceCompleted { .. } => "agent_team.instance.completed",
            Self::InstanceFailed { .. } => "agent_team.instance.failed",
            Self::MissionBudgetExhausted { .. } => "agent_team.mission.budget.exhausted",
            Self::CapabilityDenied { .. } => "agent_team.capability.denied",
        }
    }

    /// Whether the event is persisted or only streamed.
    #[must_use]
    pub const fn durability(&self) -> Durability {
        match self {
            Self::ModelMessageDelta(_) => Durability::Delta,
            _ => Durability::Durable,
        }
    }

    /// Whether this is the last event of a turn.
    #[must_use]
    pub const fn is_terminal(&self) -> bool {
        matches!(self, Self::TurnDone { .. })
    }

    /// Whether this is one of the agent-team events of seed 001.
    #[must_use]
    pub fn is_agent_team(&self) -> bool {
        self.kind().starts_with("agent_team.")
    }
}

/// How the result of a spawn's tool call starts when the spawn was denied
/// (`agent_team.spawn.denied`): see [`spawn_denial_result`].
pub const SPAWN_DENIED_PREFIX: &str = "spawn denied ";

/// The result a spawn's tool call gives its caller's model when the spawn is denied with
/// `code` and `error` (those of its `agent_team.spawn.denied`).
#[must_use]
pub fn spawn_denial_result(code: &str, error: &str) -> String {
    format!("{SPAWN_DENIED_PREFIX}({code}): {error}")
}
