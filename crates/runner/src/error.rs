//! The runner's errors.

use agentry_memory::StoreError;
use agentry_model::ModelError;
use agentry_types::{SessionId, TurnId};

/// What went wrong in a runner call. Every variant says what a caller can do about it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// No such session, turn or agent (or it belongs to another subject).
    #[error("{kind} {id} not found")]
    NotFound {
        /// What was looked up: `session`, `turn`, `agent`.
        kind: &'static str,
        /// The id or name asked for.
        id: String,
    },
    /// The session already has a running turn; wait for it or cancel it.
    #[error("session {session_id} already has a running turn")]
    TurnRunning {
        /// The session.
        session_id: SessionId,
    },
    /// As `TurnRunning`, and the running turn is one left unfinished (its process stopped,
    /// or could not store its end): this call resumed it. Follow it by its id; a new turn
    /// can start once it ends.
    #[error(
        "session {session_id} has a running turn: {turn_id}, left unfinished (its process stopped or could not \
         store its end), was resumed; a new turn can start once it ends"
    )]
    TurnResumed {
        /// The session.
        session_id: SessionId,
        /// The resumed turn.
        turn_id: TurnId,
    },
    /// A turn with the request's idempotency key exists already
    /// ([`TurnRequest::idempotency_key`](crate::TurnRequest::idempotency_key)): nothing was
    /// run again. Follow that turn by its id.
    #[error("session {session_id} already has the turn of this idempotency key: {turn_id}")]
    TurnExists {
        /// The session.
        session_id: SessionId,
        /// The turn made with the key.
        turn_id: TurnId,
    },
    /// The session was cancelled; it takes no new turns.
    #[error("session {session_id} was cancelled and takes no new turns")]
    SessionCancelled {
        /// The session.
        session_id: SessionId,
    },
    /// The agent's definition has a problem ([`Agent::problem`](crate::Agent::problem)):
    /// fix how it is built; nothing was changed.
    #[error("agent {agent} cannot run: {problem}")]
    InvalidAgent {
        /// The agent's name.
        agent: String,
        /// What is wrong.
        problem: String,
    },
    /// The request breaks an input rule (seed 002); nothing was changed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The turn a new turn names as its previous one is not the session's latest: turns
    /// chain in a line, so only the latest can be continued. Nothing was changed.
    #[error("turn {turn_id} is not the session's latest turn; a new turn chains on the latest")]
    NotLatestTurn {
        /// The turn named.
        turn_id: TurnId,
    },
    /// The store failed.
    #[error("storage: {0}")]
    Store(StoreError),
    /// The model failed (after the provider's retries).
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The turn lost its lease to another process (its lease expired and was taken over).
    #[error("turn {turn_id} lost its lease to another process")]
    LeaseLost {
        /// The turn.
        turn_id: TurnId,
    },
    /// The runtime handed its running turns over to the next process
    /// ([`Runtime::hand_over`](crate::Runtime::hand_over)) and takes no new turns.
    #[error("this runtime is stopping: it handed its running turns over and takes no new turns")]
    HandedOver,
    /// Something that should not happen did; the message says what.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A runner result.
pub type RuntimeResult<T> = Result<T, RunnerError>;

impl RunnerError {
    pub(crate) fn not_found(kind: &'static str, id: impl ToString) -> Self {
        Self::NotFound { kind, id: id.to_string() }
    }
}

impl From<StoreError> for RunnerError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound { kind, id } => Self::NotFound { kind, id },
            other => Self::Store(other),
        }
    }
}
