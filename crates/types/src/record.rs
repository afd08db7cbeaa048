//! Records the runtime stores: sessions, runs (turns), history messages, user profiles and
//! memories, tool-journal entries, budget ledgers and session leases.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::agno::SessionSummary;
use crate::budget::{BudgetLimit, BudgetUsage};
use crate::ids::{SessionId, ThreadId, TurnId};
use crate::input::TurnInputItem;
use crate::message::Message;
use crate::status::{RunStatus, Subject, TurnState};
use crate::time::Timestamp;
use crate::tool::ToolSpec;

/// What a session belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionType {
    /// A single agent.
    Agent,
    /// A team of agents.
    Team,
    /// A workflow.
    Workflow,
}

impl SessionType {
    /// The lowercase name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Team => "team",
            Self::Workflow => "workflow",
        }
    }
}

/// A session: a conversation with an agent, a team or a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionRecord {
    /// Its id.
    pub id: SessionId,
    /// What it belongs to.
    pub session_type: SessionType,
    /// The agent, team or workflow name.
    pub name: String,
    /// The subject that owns it (who created it); only that subject sees it over the API.
    pub owner: Subject,
    /// The end user it serves, when the application tracks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// A human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Application metadata.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// Session state the agents keep between turns.
    #[serde(default)]
    pub state: Map<String, Value>,
    /// The running summary of the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<SessionSummary>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

impl SessionRecord {
    /// A new, empty session created now.
    #[must_use]
    pub fn new(session_type: SessionType, name: impl Into<String>, owner: Subject) -> Self {
        let now = Timestamp::now();
        Self {
            id: SessionId::new(),
            session_type,
            name: name.into(),
            owner,
            user_id: None,
            title: None,
            metadata: Map::new(),
            state: Map::new(),
            summary: None,
            created_at: now,
            updated_at: now,
        }
    }
}

/// A run: one turn of a session, or a member's run inside a team turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunRecord {
    /// Its id (the turn id for a turn).
    pub id: TurnId,
    /// The session it belongs to.
    pub session_id: SessionId,
    /// The turn it chains from; absent for the first turn and for member runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_turn_id: Option<TurnId>,
    /// The run it belongs to, for a member's run inside a team run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<TurnId>,
    /// The thread a member run ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    /// The agent that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The team that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    /// The input that started it.
    #[serde(default)]
    pub input: Vec<TurnInputItem>,
    /// Client-side tools the turn's caller offered for this turn alone (an AG-UI client's
    /// frontend tools): a call of one ends the turn waiting for the caller's result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ToolSpec>,
    /// What the turn's caller told the model about its side for this turn alone (an AG-UI
    /// client's `context`), shown to the main thread's model after the instructions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_context: Vec<ClientContext>,
    /// Where it is in its life (output, required actions and metrics once it ended).
    pub state: TurnState,
    /// Its status. For turns it follows `state` ([`RunRecord::set_state`]); a run saved from
    /// an output document carries that document's status.
    pub status: RunStatus,
    /// The run's output document (an Agno `RunOutput` or `TeamRunOutput`), when one was saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Who created it.
    pub created_by: Subject,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// The first line of [`ClientContext::prompt`]'s text; each item follows on a line of its
/// own, as `- <description>: <value>`.
pub const CLIENT_CONTEXT_HEADING: &str = "Context from the user's application:";

/// One piece of context a turn's caller gives the model (an AG-UI `Context`): what the
/// client shows or knows, such as the page open or the user's selection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClientContext {
    /// What it is.
    pub description: String,
    /// Its value, as text.
    pub value: String,
}

impl ClientContext {
    /// The context a turn's caller gave, as the text added to the system prompt; `None`
    /// when there is none.
    #[must_use]
    pub fn prompt(context: &[Self]) -> Option<String> {
        if context.is_empty() {
            return None;
        }
        let mut text = String::from(CLIENT_CONTEXT_HEADING);
        for item in context {
            text.push_str("\n- ");
            text.push_str(item.description.trim());
            text.push_str(": ");
            text.push_str(&item.value);
        }
        Some(text)
    }
}

impl RunRecord {
    /// A new running turn of a session.
    #[must_use]
    pub fn new(session_id: SessionId, input: Vec<TurnInputItem>, created_by: Subject) -> Self {
        let now = Timestamp::now();
        Self {
            id: TurnId::new(),
            session_id,
            previous_turn_id: None,
            parent_run_id: None,
            thread_id: None,
            agent_id: None,
            team_id: None,
            input,
            client_tools: Vec::new(),
            client_context: Vec::new(),
            state: TurnState::Running,
            status: RunStatus::Running,
            output: None,
            created_by,
            created_at: now,
            updated_at: now,
        }
    }

    /// Moves the run to a new state, its status following.
    pub fn set_state(&mut self, state: TurnState) {
        self.status = state.run_status();
        self.state = state;
        self.updated_at = Timestamp::now();
    }
}

/// A message kept for a run's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryMessage {
    /// The run it belongs to.
    pub run_id: TurnId,
    /// Its position within the run, from 0.
    pub index: u32,
    /// The message, shared: a store that keeps messages in memory hands them out, and
    /// a turn puts them in its model's context, without copying them.
    pub message: Arc<Message>,
}

/// What an application knows about an end user, as a JSON document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UserProfile {
    /// The user.
    pub user_id: String,
    /// The profile (shaped by the memory's profile schema, when one is set).
    pub profile: Value,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// A fact remembered about a user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UserMemory {
    /// Its id.
    pub id: String,
    /// The user.
    pub user_id: String,
    /// The fact.
    pub memory: String,
    /// Topics it concerns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// When it was remembered.
    pub created_at: Timestamp,
}

/// The result of a tool call as journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResult {
    /// The content given to the model.
    pub content: String,
    /// Whether it reports a failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

/// A tool call in the journal: recorded before it runs, and with its result after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JournalEntry {
    /// The turn that made the call.
    pub turn_id: TurnId,
    /// The call id.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// The key passed to the tool so that a repeated call can be recognized (stable per call).
    pub idempotency_key: String,
    /// A hash of the call's arguments.
    pub arguments_hash: String,
    /// When it was recorded as started.
    pub started_at: Timestamp,
    /// Its result, once it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResult>,
    /// When it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
}

/// A budget scope's ledger: its limit, what was used and what is reserved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetLedger {
    /// The scope (`mission:<id>`, `instance:<id>`, …).
    pub scope: String,
    /// The limit.
    pub limit: BudgetLimit,
    /// Settled usage.
    pub used: BudgetUsage,
    /// Usage reserved by the reservations that hold: unsettled, unexpired, and made under
    /// no lease or under their session's current one.
    pub reserved: BudgetUsage,
}

/// A reservation against one or more budget scopes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetReservation {
    /// Its id.
    pub id: String,
    /// The scopes it holds amounts on (an instance and its mission, say).
    pub scopes: Vec<String>,
    /// The amount held on each.
    pub amount: BudgetUsage,
    /// When it lapses if not settled, at the latest (a backstop for reservations made
    /// without a lease).
    pub expires_at: Timestamp,
    /// The lease of the turn it was made for, when there is one: it holds only while that
    /// lease is its session's current one, so the reservations of a holder that crashed
    /// end when recovery takes its lease over, and those it left unsettled end when it
    /// gives the lease back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Fence>,
}

/// The lease that lets one process run a session's turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    /// The session.
    pub session_id: SessionId,
    /// Who holds it (a process or runner id).
    pub owner: String,
    /// The fencing token: greater than every token granted before it.
    pub token: u64,
    /// When it lapses unless renewed.
    pub expires_at: Timestamp,
}

impl Lease {
    /// Whether it has lapsed at `now`.
    #[must_use]
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }

    /// The fence that writes on behalf of the lease holder carry.
    #[must_use]
    pub const fn fence(&self) -> Fence {
        Fence { session_id: self.session_id, token: self.token }
    }
}

/// Proof of holding a session's lease, carried by writes made for its running turn. A store
/// refuses a write whose token is not the session's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Fence {
    /// The session.
    pub session_id: SessionId,
    /// The lease's token.
    pub token: u64,
}

/// The time-to-live of a lease, for convenience.
#[must_use]
pub fn lease_expiry(now: Timestamp, ttl: Duration) -> Timestamp {
    now.saturating_add(ttl)
}
