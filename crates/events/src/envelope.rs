//! The event envelope: identity, ordering, thread and team context around a payload.

use agentry_types::{EventId, SessionId, ThreadId, Timestamp, TurnId};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::payload::EventPayload;

/// The version of the envelope and payload format. Raised on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Where an agent-team action came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventSource {
    /// A person, through a user interface or the API.
    UiAction,
    /// An agent's tool call (`spawn_agent`).
    ToolCall,
    /// The runtime itself (budgets, cancellation cascades).
    OrchestratorRuntime,
}

/// The agent-team context of an event: which mission and instance it concerns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TeamContext {
    /// The mission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mission_id: Option<String>,
    /// The agent instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The instance that spawned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_instance_id: Option<String>,
    /// Where the action came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
    /// The model message whose tool call caused the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The tool call that caused the event (a spawn's request and decision carry it, so
    /// a recovery can tell which call a spawn left undecided belongs to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// One event of a turn.
///
/// `seq` numbers every event of a turn, durable and delta alike, from 1, strictly
/// increasing; a live stream that keeps up has every number, the stored log keeps the
/// `seq` of each durable event (so it has gaps where deltas were), and a live stream
/// reading far behind a long reply may get adjacent deltas merged into one numbered like
/// the last of them. Deltas share `event_id` with the `model.message` they build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventEnvelope {
    /// The event's id.
    pub event_id: EventId,
    /// Its position in the turn's stream.
    pub seq: u64,
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// The thread: `main` for the root agent, a sub-agent's id, absent for turn-level events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    /// Agent-team context, for team events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<TeamContext>,
    /// When it happened.
    pub created_at: Timestamp,
    /// The format version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// What happened.
    pub payload: EventPayload,
}

impl EventEnvelope {
    /// The canonical event name.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        self.payload.kind()
    }

    /// Whether the event is persisted (every event but deltas).
    #[must_use]
    pub fn is_durable(&self) -> bool {
        self.payload.durability() == crate::payload::Durability::Durable
    }

    /// The thread, or `main` for turn-level events.
    #[must_use]
    pub fn thread_or_main(&self) -> ThreadId {
        self.thread_id.clone().unwrap_or_else(ThreadId::main)
    }
}
