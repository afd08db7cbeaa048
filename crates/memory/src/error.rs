//! What a store operation can fail with.

use agentry_types::{SessionId, Timestamp, TurnId};

/// Why a write conflicts with what the store holds. Nothing was changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Conflict {
    /// A record with this id exists.
    #[error("{kind} {id} already exists")]
    AlreadyExists {
        /// The kind of record.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// An event's `seq` is not greater than the last stored for its turn.
    #[error(
        "event seq {seq} of turn {turn_id} is not greater than {last}, the turn's last stored seq or the batch's previous one"
    )]
    StaleSeq {
        /// The turn.
        turn_id: TurnId,
        /// The refused seq.
        seq: u64,
        /// The turn's last stored seq.
        last: u64,
    },
    /// Another owner holds the session's lease.
    #[error("session {session_id} is leased to {holder} until {expires_at}")]
    LeaseHeld {
        /// The session.
        session_id: SessionId,
        /// Who holds it.
        holder: String,
        /// Until when.
        expires_at: Timestamp,
    },
    /// A write carried a fencing token that is not the session's current lease.
    #[error("fencing token {token} of session {session_id} is stale (current: {current:?})")]
    StaleFence {
        /// The session.
        session_id: SessionId,
        /// The token the write carried.
        token: u64,
        /// The current lease's token, if the session has a live one.
        current: Option<u64>,
    },
    /// A turn was started on a session whose latest turn is not the one the start expected
    /// (another turn was stored meanwhile; see [`EventStore::start_turn`]).
    ///
    /// [`EventStore::start_turn`]: crate::EventStore::start_turn
    #[error(
        "the latest turn of session {session_id} changed since it was read: another turn was stored meanwhile"
    )]
    LatestTurnChanged {
        /// The session.
        session_id: SessionId,
        /// The latest turn the start expected (`None`: no turn).
        expected: Option<TurnId>,
        /// The session's latest turn (`None`: no turn).
        latest: Option<TurnId>,
    },
    /// A tool call was journaled again with different arguments.
    #[error("tool call {tool_call_id} of turn {turn_id} was journaled with different arguments")]
    JournalMismatch {
        /// The turn.
        turn_id: TurnId,
        /// The call.
        tool_call_id: String,
    },
    /// A tool call was completed again with a different result.
    #[error("tool call {tool_call_id} of turn {turn_id} already completed with a different result")]
    AlreadyCompleted {
        /// The turn.
        turn_id: TurnId,
        /// The call.
        tool_call_id: String,
    },
    /// A reservation would take a budget past its limit.
    #[error(
        "budget {scope} has no room for {dimension}: {used} used and reserved, {requested} requested, limit {limit}"
    )]
    BudgetExceeded {
        /// The scope that is full.
        scope: String,
        /// The dimension (`max_tokens`, `max_tool_calls`, …).
        dimension: &'static str,
        /// Used plus reserved before the request.
        used: f64,
        /// The amount requested.
        requested: f64,
        /// The limit.
        limit: f64,
    },
}

/// Why a store operation failed. Every failed write leaves the store unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The record does not exist.
    #[error("{kind} {id} not found")]
    NotFound {
        /// The kind of record (`session`, `run`, …).
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The write conflicts with the stored state.
    #[error("conflict: {0}")]
    Conflict(#[from] Conflict),
    /// The request is malformed (an unknown page token, an event of another turn, …).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A record is larger than the store accepts.
    #[error("{what} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The store's file is damaged or is not a store.
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    /// The store's file is the other backend's (an SQLite file opened with redb, or the
    /// reverse): it is not damaged; open it with the backend the message names.
    #[error("the store is another backend's: {0}")]
    OtherBackend(String),
    /// The store's file was written by a newer version of Agentry.
    #[error(
        "the store has schema version {found}, newer than the {supported} this build supports: upgrade Agentry"
    )]
    VersionTooNew {
        /// The file's version.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// The store's file cannot be opened, created or written.
    #[error("storage I/O failed: {0}")]
    Io(String),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// A not-found error.
    #[must_use]
    pub fn not_found(kind: &'static str, id: impl ToString) -> Self {
        Self::NotFound { kind, id: id.to_string() }
    }

    /// Whether this is [`StoreError::NotFound`].
    #[must_use]
    pub const fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}

/// The result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;
