//! Records of sessions' turns as the runtime keeps them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{SessionId, TurnId};
use crate::input::TurnInputItem;
use crate::status::{Subject, TurnState};
use crate::time::Timestamp;

/// A turn: its place in the session's chain, its input and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnRecord {
    /// Its id.
    pub id: TurnId,
    /// The session it belongs to.
    pub session_id: SessionId,
    /// The turn it chains from; absent for the first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_turn_id: Option<TurnId>,
    /// The input that started it.
    #[serde(default)]
    pub input: Vec<TurnInputItem>,
    /// Where it is in its life.
    pub state: TurnState,
    /// Who created it.
    pub created_by: Subject,
    /// When it was created.
    pub created_at: Timestamp,
}
