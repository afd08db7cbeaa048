//! Run statuses and turn states.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{EventId, ThreadId};
use crate::message::ThreadMessage;
use crate::time::Timestamp;
use crate::tool::PendingToolCall;
use crate::usage::TurnMetrics;

/// The status of a run, as Agno stores it (`"PENDING"`, `"RUNNING"`, …).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunStatus {
    /// Created, not started.
    Pending,
    /// In progress.
    #[default]
    Running,
    /// Finished normally.
    Completed,
    /// Waiting for a human decision or a client-side tool result.
    Paused,
    /// Stopped on request or by a timeout.
    Cancelled,
    /// Failed.
    Error,
}

impl RunStatus {
    /// Whether the run has ended (completed, cancelled or failed). A paused run has not.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Cancelled | Self::Error)
    }
}

/// Why a turn was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CancellationReason {
    /// A client asked for it.
    ClientCancelled,
    /// The turn ran past its time limit.
    ServerExecutionTimeout,
    /// A newer turn replaced it.
    CancelledForNextTurn,
    /// Its process went away and it could not be resumed.
    Abandoned,
    /// Its budget (or its mission's) ran out.
    BudgetExhausted,
}

impl CancellationReason {
    /// The wire value (`client-cancelled`, `server-execution-timeout`, …).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClientCancelled => "client-cancelled",
            Self::ServerExecutionTimeout => "server-execution-timeout",
            Self::CancelledForNextTurn => "cancelled-for-next-turn",
            Self::Abandoned => "abandoned",
            Self::BudgetExhausted => "budget-exhausted",
        }
    }
}

/// The MCP server that needs its user to authorize access.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct McpServerAuth {
    /// The server's id.
    pub id: String,
    /// The server's name.
    pub name: String,
    /// Where the user authorizes.
    pub auth_url: String,
}

/// Something a turn needs from outside before the session can continue. Each one ends the
/// turn; the next turn answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum RequiredAction {
    /// Tool calls awaiting a human's approval.
    #[serde(rename = "tool.approval_required")]
    ToolApproval {
        /// The thread that made the calls.
        thread_id: ThreadId,
        /// The calls.
        tool_calls: Vec<PendingToolCall>,
    },
    /// Client-side tool calls awaiting their results.
    #[serde(rename = "tool.response_required")]
    ToolResponse {
        /// The thread that made the calls.
        thread_id: ThreadId,
        /// The calls.
        tool_calls: Vec<PendingToolCall>,
    },
    /// MCP servers whose user must authorize access first.
    #[serde(rename = "mcp.auth_required")]
    McpAuth {
        /// The thread that needed the servers, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<ThreadId>,
        /// The servers.
        servers: Vec<McpServerAuth>,
    },
}

impl RequiredAction {
    /// The thread that asks (`None` for an MCP authorization no one thread needed).
    #[must_use]
    pub const fn thread_id(&self) -> Option<&ThreadId> {
        match self {
            Self::ToolApproval { thread_id, .. } | Self::ToolResponse { thread_id, .. } => Some(thread_id),
            Self::McpAuth { thread_id, .. } => thread_id.as_ref(),
        }
    }
}

/// A required action as it was recorded: the action with the id and time of its event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RequiredActionRecord {
    /// The id of the event that raised it.
    pub id: EventId,
    /// When it was raised.
    pub created_at: Timestamp,
    /// The action.
    #[serde(flatten)]
    pub action: RequiredAction,
}

/// Where a turn is in its life: `running → done | cancelled | error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum TurnState {
    /// Still running.
    Running,
    /// Finished: the agent answered, or stopped to ask for something (`required_actions`).
    Done {
        /// The last model message of the main thread.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Box<ThreadMessage>>,
        /// What the next turn must answer; empty when nothing is pending.
        #[serde(default)]
        required_actions: Vec<RequiredActionRecord>,
        /// When it finished.
        completed_at: Timestamp,
        /// Usage over the turn.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metrics: Option<TurnMetrics>,
    },
    /// Cancelled.
    Cancelled {
        /// Why.
        reason: CancellationReason,
        /// When it stopped.
        completed_at: Timestamp,
        /// Usage up to the cancellation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metrics: Option<TurnMetrics>,
    },
    /// Failed.
    Error {
        /// What went wrong, for a human.
        message: String,
        /// When it failed.
        completed_at: Timestamp,
        /// Usage up to the failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metrics: Option<TurnMetrics>,
    },
}

impl TurnState {
    /// Whether the turn has ended.
    #[must_use]
    pub const fn is_terminal(&self) -> bool {
        !matches!(self, Self::Running)
    }

    /// The turn's status as a run status: a done turn with required actions is paused.
    #[must_use]
    pub fn run_status(&self) -> RunStatus {
        match self {
            Self::Running => RunStatus::Running,
            Self::Done { required_actions, .. } if !required_actions.is_empty() => RunStatus::Paused,
            Self::Done { .. } => RunStatus::Completed,
            Self::Cancelled { .. } => RunStatus::Cancelled,
            Self::Error { .. } => RunStatus::Error,
        }
    }

    /// The actions the next turn must answer (empty unless done with required actions).
    #[must_use]
    pub fn required_actions(&self) -> &[RequiredActionRecord] {
        match self {
            Self::Done { required_actions, .. } => required_actions,
            _ => &[],
        }
    }
}

/// Who did something: a user, a service account, an agent identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Subject {
    /// A stable id.
    pub subject_id: String,
    /// `user`, `serviceaccount`, `team`, `virtualaccount`, `agent-identity`, `role`, …
    pub subject_type: String,
    /// A readable name.
    pub subject_slug: String,
}

impl Subject {
    /// A user subject whose id and slug are the same name.
    #[must_use]
    pub fn user(name: impl Into<String>) -> Self {
        let name = name.into();
        Self { subject_id: name.clone(), subject_type: "user".to_owned(), subject_slug: name }
    }
}
