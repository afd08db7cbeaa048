//! The storage traits: what every backend (in-memory, SQLite, redb) provides, and the
//! contract each method keeps.
//!
//! Contracts common to every method:
//! - every write is atomic: it happens whole or not at all, and a failed write changes
//!   nothing;
//! - an acknowledged write (the future resolved `Ok`) is visible to every later read of the
//!   same store, and survives a crash when the backend's durability mode says so;
//! - records larger than [`MAX_RECORD_BYTES`] serialized as JSON are refused with
//!   [`StoreError::TooLarge`](crate::StoreError::TooLarge) (an event: its payload and team
//!   context, with a fixed allowance for the envelope; see
//!   [`rules::check_event_size`](crate::rules::check_event_size)), and records nested
//!   more deeply than they are read back with
//!   [`StoreError::InvalidInput`](crate::StoreError::InvalidInput) (see
//!   [`rules::MAX_RECORD_NESTING`](crate::rules::MAX_RECORD_NESTING));
//! - writes made on behalf of a running turn may carry a [`Fence`]; the store refuses them
//!   with [`Conflict::StaleFence`](crate::Conflict::StaleFence) unless the fence's token is
//!   the session's current lease token.

use std::sync::Arc;
use std::time::Duration;

use agentry_events::EventEnvelope;
use agentry_types::agno::SessionSummary;
use agentry_types::{
    BudgetLedger, BudgetLimit, BudgetReservation, BudgetUsage, Fence, HistoryMessage, JournalEntry, Lease,
    Message, Role, RunRecord, RunStatus, SessionId, SessionRecord, SessionType, Timestamp, ToolResult,
    TurnId, UserMemory, UserProfile,
};
use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::error::StoreResult;
use crate::page::{Order, Page, PageRequest};

/// The largest record, event or message a store accepts, serialized as JSON (what a store
/// keeps may be in another form, events in MessagePack for one).
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;

/// Which sessions to list. Every set filter must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionQuery {
    /// Sessions of this type.
    pub session_type: Option<SessionType>,
    /// Sessions of this agent, team or workflow name.
    pub name: Option<String>,
    /// Sessions owned by this subject id.
    pub owner: Option<String>,
    /// Sessions of this end user.
    pub user_id: Option<String>,
    /// Sessions created at or after this time.
    pub created_from: Option<Timestamp>,
    /// Sessions created at or before this time.
    pub created_until: Option<Timestamp>,
    /// List oldest first instead of newest first.
    pub oldest_first: bool,
}

impl SessionQuery {
    /// The listing kind of this query's pages (see [`crate::encode_token`]): a token from
    /// a listing with other filters, or in the other order, is refused by this one, where
    /// it would continue from a position of another listing.
    #[must_use]
    pub fn page_kind(&self) -> String {
        let fields = serde_json::json!([
            self.session_type.map(|kind| serde_json::to_value(kind).unwrap_or_default()),
            self.name,
            self.owner,
            self.user_id,
            self.created_from.map(Timestamp::unix_micros),
            self.created_until.map(Timestamp::unix_micros),
            self.oldest_first,
        ]);
        // Hashed: the filters may hold any character (a subject `auth0|123`), and tokens stay
        // short. FNV-1a, fixed here, so tokens survive an upgrade of the toolchain.
        let hash = fields.to_string().bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("sessions:{hash:016x}")
    }

    /// Whether a session matches.
    #[must_use]
    pub fn matches(&self, session: &SessionRecord) -> bool {
        self.session_type.is_none_or(|kind| session.session_type == kind)
            && self.name.as_ref().is_none_or(|name| &session.name == name)
            && self.owner.as_ref().is_none_or(|owner| &session.owner.subject_id == owner)
            && self.user_id.as_ref().is_none_or(|user| session.user_id.as_ref() == Some(user))
            && self.created_from.is_none_or(|from| session.created_at >= from)
            && self.created_until.is_none_or(|until| session.created_at <= until)
    }
}

/// Changes to a session's mutable fields; unset fields are left as they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionUpdate {
    /// A new title.
    pub title: Option<String>,
    /// A new end user.
    pub user_id: Option<String>,
    /// Metadata keys to set; a `null` value removes its key.
    pub metadata: Option<Map<String, Value>>,
    /// Session-state keys to set; a `null` value removes its key.
    pub state: Option<Map<String, Value>>,
    /// A new summary.
    pub summary: Option<SessionSummary>,
    /// Made on behalf of a running turn: refused with
    /// [`Conflict::StaleFence`](crate::Conflict::StaleFence), changing nothing, once the
    /// session's lease is no longer held under the fence's token (another process took the
    /// turn over, or the turn ended). `InvalidInput` when the fence is another session's.
    pub fence: Option<Fence>,
}

impl SessionUpdate {
    /// Applies the update to a session, stamping `updated_at` with `now`.
    pub fn apply(&self, session: &mut SessionRecord, now: Timestamp) {
        fn merge(target: &mut Map<String, Value>, changes: &Map<String, Value>) {
            for (key, value) in changes {
                if value.is_null() {
                    target.remove(key);
                } else {
                    target.insert(key.clone(), value.clone());
                }
            }
        }
        if let Some(title) = &self.title {
            session.title = Some(title.clone());
        }
        if let Some(user_id) = &self.user_id {
            session.user_id = Some(user_id.clone());
        }
        if let Some(metadata) = &self.metadata {
            merge(&mut session.metadata, metadata);
        }
        if let Some(state) = &self.state {
            merge(&mut session.state, state);
        }
        if let Some(summary) = &self.summary {
            session.summary = Some(summary.clone());
        }
        session.updated_at = now.max(session.updated_at);
    }
}

/// Which runs of a session to list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ParentFilter {
    /// Top-level runs (turns) only.
    #[default]
    TopLevel,
    /// Every run, member runs included.
    Any,
    /// The member runs of this run.
    Of(TurnId),
}

/// Which runs of a session to list, and in which order (creation order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Oldest or newest first.
    pub order: Order,
    /// Top-level runs, all runs, or the members of one run.
    pub parent: ParentFilter,
    /// Runs with one of these statuses (empty: any status).
    pub statuses: Vec<RunStatus>,
    /// Runs of this agent.
    pub agent_id: Option<String>,
    /// Runs of this team.
    pub team_id: Option<String>,
}

impl RunQuery {
    /// Whether the query filters on fields a backend keeps only in a run's record (status,
    /// agent, team), not in its indexes: without such a filter, a listing can read a record
    /// only to return it, and know there is a next page without reading the next one (the
    /// SQLite and redb stores do, but redb for a parent's members, which its index keeps
    /// across sessions).
    #[must_use]
    pub fn filters_records(&self) -> bool {
        !self.statuses.is_empty() || self.agent_id.is_some() || self.team_id.is_some()
    }

    /// Whether a run matches (the order aside).
    #[must_use]
    pub fn matches(&self, run: &RunRecord) -> bool {
        let parent = match &self.parent {
            ParentFilter::TopLevel => run.parent_run_id.is_none(),
            ParentFilter::Any => true,
            ParentFilter::Of(parent) => run.parent_run_id == Some(*parent),
        };
        parent
            && (self.statuses.is_empty() || self.statuses.contains(&run.status))
            && self.agent_id.as_ref().is_none_or(|agent| run.agent_id.as_ref() == Some(agent))
            && self.team_id.as_ref().is_none_or(|team| run.team_id.as_ref() == Some(team))
    }
}

/// The runs considered when neither bound of a [`HistoryQuery`] is set.
pub const DEFAULT_HISTORY_RUNS: usize = 100;

/// The most runs a history window looks at (matching or not), unless its `last_runs` is
/// larger: runs skipped by the filters, or without messages, count too. Member runs are
/// looked at only by a window that includes them: a team session's members do not push
/// its turns out of the window.
pub const MAX_HISTORY_SCAN: usize = 1000;

/// A window of a session's history: the messages of its latest runs, oldest first.
///
/// Runs are taken newest first, skipping those that do not match the filters, until
/// `last_runs` runs are taken or `last_messages` messages are collected; with neither set,
/// the last [`DEFAULT_HISTORY_RUNS`] runs. A window never reads the whole session: it
/// looks at most at the latest [`MAX_HISTORY_SCAN`] runs (turns only, unless it includes
/// member runs), or `last_runs` when more. Cut to
/// `last_messages`, it never starts with a tool result (its call was cut off).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Take the messages of at most this many runs.
    pub last_runs: Option<usize>,
    /// Keep at most this many messages (the latest).
    pub last_messages: Option<usize>,
    /// Only runs of this agent.
    pub agent_id: Option<String>,
    /// Only runs of this team.
    pub team_id: Option<String>,
    /// Leave out messages with these roles.
    pub skip_roles: Vec<Role>,
    /// Leave out runs with these statuses.
    pub skip_statuses: Vec<RunStatus>,
    /// Leave out messages that were themselves replayed history.
    pub skip_history_messages: bool,
    /// Include member runs (by default only top-level runs count).
    pub include_member_runs: bool,
}

impl HistoryQuery {
    /// Whether a run's messages belong to the window.
    #[must_use]
    pub fn run_matches(&self, run: &RunRecord) -> bool {
        self.fields_match(
            run.parent_run_id.is_some(),
            run.status,
            run.agent_id.as_deref(),
            run.team_id.as_deref(),
        )
    }

    /// [`HistoryQuery::run_matches`] on the fields it looks at.
    pub(crate) fn fields_match(
        &self,
        member: bool,
        status: RunStatus,
        agent_id: Option<&str>,
        team_id: Option<&str>,
    ) -> bool {
        (self.include_member_runs || !member)
            && !self.skip_statuses.contains(&status)
            && self.agent_id.as_deref().is_none_or(|agent| agent_id == Some(agent))
            && self.team_id.as_deref().is_none_or(|team| team_id == Some(team))
    }

    /// Whether a message of a matching run is kept.
    #[must_use]
    pub fn message_matches(&self, message: &Message) -> bool {
        let replayed = self.skip_history_messages && message.from_history;
        !replayed && !self.skip_roles.contains(&message.role)
    }

    /// The most runs to take.
    #[must_use]
    pub fn run_bound(&self) -> Option<usize> {
        match (self.last_runs, self.last_messages) {
            (None, None) => Some(DEFAULT_HISTORY_RUNS),
            (runs, _) => runs,
        }
    }

    /// The most runs to look at, matching or not ([`MAX_HISTORY_SCAN`]).
    #[must_use]
    pub fn scan_bound(&self) -> usize {
        self.last_runs.map_or(MAX_HISTORY_SCAN, |runs| runs.max(MAX_HISTORY_SCAN))
    }
}

/// A durable event as stored: the event and its store-wide position.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Store-wide, increasing in append order; may have gaps.
    pub position: u64,
    /// The event.
    pub event: EventEnvelope,
}

/// Which events a feed reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedQuery {
    /// Only this session's events.
    pub session_id: Option<SessionId>,
    /// Oldest or newest first.
    pub order: Order,
    /// Start after this position (exclusive, in the feed's order).
    pub after: Option<u64>,
}

/// Sessions.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Creates a session. `Conflict::AlreadyExists` when the id is taken.
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()>;

    /// Reads a session. `NotFound` when it does not exist.
    ///
    /// Its `updated_at` is the later of its own last update and the `updated_at` of its
    /// top-level runs as last written (by `put_run`, or a step carrying the run: a turn's
    /// start, pause and end): a session shows when it was last active, and never goes
    /// back. Member runs do not count. Listings show the same.
    async fn get_session(&self, id: SessionId) -> StoreResult<SessionRecord>;

    /// Applies an update atomically and returns the updated session. `NotFound` when it
    /// does not exist; `Conflict::StaleFence` when the update's fence no longer holds.
    async fn update_session(&self, id: SessionId, update: &SessionUpdate) -> StoreResult<SessionRecord>;

    /// Deletes a session with its runs, events, messages, journal, lease and budget ledgers
    /// (with the reservations on them). `NotFound` when it does not exist.
    async fn delete_session(&self, id: SessionId) -> StoreResult<()>;

    /// Lists sessions newest first (by creation time, then id). `InvalidInput` for a token
    /// not issued by this listing.
    ///
    /// Sessions are indexed by owner: listing one owner's sessions reads only theirs, and
    /// only those within the creation bounds, however many sessions others hold.
    async fn list_sessions(
        &self,
        query: &SessionQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<SessionRecord>>;
}

/// Runs (turns and member runs).
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Creates a run, or replaces the run with the same id (its session and its parent
    /// must stay the same: `InvalidInput` otherwise). `NotFound` when the session does not
    /// exist.
    async fn put_run(&self, run: &RunRecord, fence: Option<Fence>) -> StoreResult<()>;

    /// Reads a run. `NotFound` when it does not exist.
    async fn get_run(&self, id: TurnId) -> StoreResult<RunRecord>;

    /// Lists a session's runs in creation order. `NotFound` when the session does not
    /// exist; `InvalidInput` for a foreign token.
    ///
    /// Runs are indexed by parent: listing the members of a run reads only those runs,
    /// however many others the session holds (SQLite and redb list turns through an index
    /// of their own as well; the in-memory store filters the session's runs for them).
    async fn list_runs(
        &self,
        session: SessionId,
        query: &RunQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<RunRecord>>;
}

/// Durable events.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Appends durable events of one turn atomically and returns their store-wide
    /// positions. Every event must belong to `turn` and its session (`InvalidInput`), be
    /// durable (`InvalidInput` for deltas), and carry a `seq` greater than the turn's last
    /// stored one and than the previous event of the batch (`Conflict::StaleSeq`). Raises
    /// the turn's high-water mark to the last `seq`. `NotFound` when the run does not exist.
    async fn append_events(
        &self,
        turn: TurnId,
        events: &[EventEnvelope],
        fence: Option<Fence>,
    ) -> StoreResult<Vec<u64>>;

    /// Reads a turn's stored events by `seq`: ascending after `after`, or descending
    /// before it. `NotFound` when the run does not exist.
    async fn turn_events(
        &self,
        turn: TurnId,
        order: Order,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredEvent>>;

    /// Reads the store-wide feed (or one session's) by position.
    async fn feed(&self, query: &FeedQuery, limit: usize) -> StoreResult<Vec<StoredEvent>>;

    /// Raises the turn's high-water mark of issued `seq` values to at least `seq`, durably,
    /// and returns the mark. `NotFound` when the run does not exist.
    async fn raise_high_water(&self, turn: TurnId, seq: u64, fence: Option<Fence>) -> StoreResult<u64>;

    /// The turn's high-water mark: no `seq` at or below it may be issued again.
    async fn high_water(&self, turn: TurnId) -> StoreResult<u64>;

    /// Writes one step of a turn in one atomic write: raises the high-water mark (as
    /// [`raise_high_water`](Self::raise_high_water)), appends the history messages (as
    /// [`MessageStore::append_messages`]), appends the events (as
    /// [`append_events`](Self::append_events)), writes the journal entries (see
    /// [`TurnStep::journal`]) and replaces the run's record (as
    /// [`RunStore::put_run`]), each only when the step has it, then releases the lease when
    /// asked (as [`LeaseStore::release_lease`] with the fence's token). Either every part is
    /// stored or none is, with the error of the first part refused. Returns the events'
    /// positions.
    ///
    /// A turn's first step may create its run: when the run does not exist and the step
    /// carries its record, the record is stored first as [`RunStore::put_run`] stores a new
    /// run (its session must exist and the fence hold), so a new turn and its first events
    /// are one write.
    ///
    /// Errors: `NotFound` when the run does not exist and the step has no record for it (or
    /// the record's session does not exist); `InvalidInput` when `step.run` is another run's
    /// record, a journal entry is another turn's, or a release is asked without a fence;
    /// `Conflict::JournalMismatch` when a call is journaled already with other arguments, and
    /// `Conflict::AlreadyCompleted` with another result (also by an earlier entry of the
    /// same step); otherwise as the methods it stands for.
    async fn write_step(&self, turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<Vec<u64>>;

    /// Starts a turn in one atomic write: grants the session's lease to `start.owner` (as
    /// [`LeaseStore::acquire_lease`]), checks that the session's latest turn (its newest
    /// top-level run) is still `start.previous`, and writes the turn's first step, which
    /// stores the new run (as [`write_step`](Self::write_step) under the new lease). So a
    /// turn is started with one write instead of a lease write and a step write, and no
    /// other turn can have been stored in between. Returns the lease and the events'
    /// positions.
    ///
    /// Errors, each leaving the store unchanged: `InvalidInput` when the step carries no
    /// run record, a member run's (one with a parent), or a release of the lease (and as
    /// `write_step` and `acquire_lease` for the rest of the step and an empty owner);
    /// `NotFound` for an unknown session; `Conflict::LeaseHeld` when another lease is live;
    /// `Conflict::LatestTurnChanged` when the session's latest turn is not
    /// `start.previous`; `Conflict::AlreadyExists` when the run exists; otherwise as
    /// `write_step`.
    async fn start_turn(
        &self,
        turn: TurnId,
        step: &TurnStep,
        start: &TurnStart,
    ) -> StoreResult<(Lease, Vec<u64>)>;
}

/// What [`EventStore::start_turn`] needs besides the turn's first step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnStart {
    /// Who takes the session's lease (not empty).
    pub owner: Arc<str>,
    /// How long the lease lasts, from `now`.
    pub ttl: Duration,
    /// The time the lease is granted at; a lease expired by then is taken over.
    pub now: Timestamp,
    /// The session's latest turn as the caller read it, which the new turn follows
    /// (`None`: the session has no turn yet).
    pub previous: Option<TurnId>,
}

/// One step of a running turn, written together by [`EventStore::write_step`]: what the
/// turn produced between two waits on the outside world (a model call, tool calls).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnStep {
    /// Raise the turn's high-water mark of issued `seq` values to at least this.
    pub high_water: Option<u64>,
    /// History messages appended to the run, after the ones it has. Shared, so the
    /// caller can keep using the very messages it stored (and a store that keeps them in
    /// memory, hold them) without copying them.
    pub messages: Vec<Arc<Message>>,
    /// Durable events, under the same rules as [`EventStore::append_events`]. Shared, so
    /// the caller can publish the very envelopes it stored without copying them.
    pub events: Vec<Arc<EventEnvelope>>,
    /// Journal entries of this turn's tool calls, applied in order: an entry of a call not
    /// journaled yet is stored as given (started, as [`JournalStore::journal_start`]
    /// stores it, or already completed); for a call journaled with the same arguments hash,
    /// a result the stored entry lacks is added with its `completed_at` (its `started_at`
    /// when it has none), as [`JournalStore::journal_complete`] adds one, and the stored
    /// entry otherwise stays as it is.
    pub journal: Vec<JournalEntry>,
    /// The run's record replaced, typically with its end state, or stored as a new run by
    /// the turn's first step; it must be the turn's own. Shared, so a turn hands its record
    /// to the store (and an in-memory store keeps it) without copying it.
    pub run: Option<Arc<RunRecord>>,
    /// Release the session's lease, held by the step's fence, once the step is written
    /// (the turn is over). Needs a fence.
    pub release_lease: bool,
}

impl TurnStep {
    /// Whether the step writes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.high_water.is_none()
            && self.messages.is_empty()
            && self.events.is_empty()
            && self.journal.is_empty()
            && self.run.is_none()
            && !self.release_lease
    }
}

/// Messages kept for history.
#[async_trait]
pub trait MessageStore: Send + Sync {
    /// Appends messages to a run's history, after the ones it has. `NotFound` when the run
    /// does not exist. The messages are shared: a store that keeps them in memory may hold
    /// these very `Arc`s (messages are never changed once stored).
    async fn append_messages(
        &self,
        run: TurnId,
        messages: &[Arc<Message>],
        fence: Option<Fence>,
    ) -> StoreResult<()>;

    /// Reads a window of a session's history, oldest first. `NotFound` when the session
    /// does not exist.
    async fn history(&self, session: SessionId, query: &HistoryQuery) -> StoreResult<Vec<HistoryMessage>>;
}

/// User profiles and memories.
#[async_trait]
pub trait UserStore: Send + Sync {
    /// A user's profile, if one was saved.
    async fn profile(&self, user_id: &str) -> StoreResult<Option<UserProfile>>;

    /// Saves (replaces) a user's profile.
    async fn put_profile(&self, profile: &UserProfile) -> StoreResult<()>;

    /// Merges `patch` into its user's profile in one atomic step and returns the result:
    /// each field of `patch.profile` (a JSON object) replaces the profile's field of that
    /// name, the others are kept; a user without a profile, or whose profile is not a JSON
    /// object, gets `patch.profile` as the profile. The result has the later of the stored
    /// profile's `updated_at` and `patch.updated_at`.
    /// Merges made at the same time all land, whatever their order, which a read followed
    /// by [`put_profile`](Self::put_profile) does not promise. Errors: `InvalidInput` when
    /// `patch.profile` is not an object or the merged profile nests too deeply, `TooLarge`
    /// when it is over the record limit; nothing changes then.
    async fn merge_profile(&self, patch: &UserProfile) -> StoreResult<UserProfile>;

    /// Adds a memory. `Conflict::AlreadyExists` when its id is taken.
    async fn add_memory(&self, memory: &UserMemory) -> StoreResult<()>;

    /// A user's memories, newest first.
    async fn memories(&self, user_id: &str, limit: usize) -> StoreResult<Vec<UserMemory>>;

    /// Deletes a memory. `NotFound` when the user has no memory with that id.
    async fn delete_memory(&self, user_id: &str, id: &str) -> StoreResult<()>;
}

/// The tool journal: exactly-once tool calls across crashes.
#[async_trait]
pub trait JournalStore: Send + Sync {
    /// Records that a call is about to run. When the call was journaled before, returns
    /// that entry (with its result, if it completed) if the arguments hash is the same,
    /// and `Conflict::JournalMismatch` otherwise. `NotFound` when the run does not exist.
    async fn journal_start(&self, entry: &JournalEntry, fence: Option<Fence>) -> StoreResult<JournalEntry>;

    /// Records a call's result. Completing again with the same result returns the entry;
    /// with another, `Conflict::AlreadyCompleted`. `NotFound` when the call was not started.
    async fn journal_complete(
        &self,
        turn: TurnId,
        tool_call_id: &str,
        result: &ToolResult,
        completed_at: Timestamp,
        fence: Option<Fence>,
    ) -> StoreResult<JournalEntry>;

    /// A turn's journal, in the order the calls started.
    async fn journal(&self, turn: TurnId) -> StoreResult<Vec<JournalEntry>>;
}

/// Budget ledgers shared by a mission and its instances.
#[async_trait]
pub trait BudgetStore: Send + Sync {
    /// Creates a scope's ledger with nothing used, belonging to `session` when one is
    /// given: deleting that session deletes the ledger and the reservations on it.
    /// `NotFound` when the session does not exist (checked first);
    /// `Conflict::AlreadyExists` when the scope does.
    async fn create_budget(
        &self,
        scope: &str,
        limit: &BudgetLimit,
        session: Option<SessionId>,
    ) -> StoreResult<()>;

    /// A scope's ledger; only reservations that hold at `now` count (see
    /// [`rules::reservation_holds`](crate::rules::reservation_holds)). `NotFound` when the
    /// scope does not exist.
    async fn budget(&self, scope: &str, now: Timestamp) -> StoreResult<BudgetLedger>;

    /// Holds an amount on every scope of the reservation, all or none:
    /// `Conflict::BudgetExceeded` when used + reserved + amount would pass any limit of any
    /// scope; `NotFound` for an unknown scope; `InvalidInput` for a scope named twice or an
    /// amount that is not a finite, non-negative quantity; `Conflict::AlreadyExists` for a
    /// reused id;
    /// `Conflict::StaleFence` when the reservation's lease is not its session's current
    /// one. A reservation holds until it is settled or released, it expires, or its lease
    /// stops being its session's current one ([`rules::reservation_holds`]).
    ///
    /// [`rules::reservation_holds`]: crate::rules::reservation_holds
    async fn reserve(&self, reservation: &BudgetReservation, now: Timestamp) -> StoreResult<()>;

    /// Settles a reservation: its scopes' used amounts grow by `actual` and the hold is
    /// released. `NotFound` when the reservation does not exist (settled or released).
    async fn settle(&self, reservation_id: &str, actual: &BudgetUsage) -> StoreResult<()>;

    /// Releases a reservation unused. `NotFound` when it does not exist.
    async fn release(&self, reservation_id: &str) -> StoreResult<()>;
}

/// Session leases: one running turn per session, across processes.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Grants the session's lease to `owner` for `ttl` when no unexpired lease exists,
    /// with a fencing token greater than every token granted before.
    /// `Conflict::LeaseHeld` when another lease is live; `NotFound` for an unknown session.
    async fn acquire_lease(
        &self,
        session: SessionId,
        owner: &str,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease>;

    /// Extends the lease holding `token` to `now + ttl`. `Conflict::StaleFence` when the
    /// token is not the session's current one.
    async fn renew_lease(
        &self,
        session: SessionId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease>;

    /// Gives the lease up. `Conflict::StaleFence` when the token is not the current one.
    async fn release_lease(&self, session: SessionId, token: u64) -> StoreResult<()>;

    /// The session's current lease, expired or not, if one is held.
    async fn lease(&self, session: SessionId) -> StoreResult<Option<Lease>>;

    /// Lists the store's leases, expired or not, by session id ascending: at most `limit`
    /// of them (none when `limit` is 0), of sessions after `after` (from the first when
    /// `None`). A runtime holds a session's lease while a turn of it runs and lets a lease
    /// a turn start does not use lapse rather than delete it, so this is where crash
    /// recovery looks for the turns a dead process left running: its cost follows the
    /// leases, not the number of sessions or runs in the store.
    async fn list_leases(&self, after: Option<SessionId>, limit: usize) -> StoreResult<Vec<Lease>>;
}

/// Keeping a store's file whole on its own.
#[async_trait]
pub trait Checkpoint: Send + Sync {
    /// Makes everything acknowledged so far whole in the store's own file, so that the
    /// file alone (a copy of it, say) holds the store: SQLite copies its write-ahead log
    /// into the file and empties the log. A backend that keeps no separate log has nothing
    /// to do (the default). Writes go on as before after it. A server calls it as it stops:
    /// its last handle may be dropped only as the process exits, if at all.
    ///
    /// Errors: `Io` when the log could not be emptied (a reader in another process held it
    /// for the busy timeout): the log still holds what the file lacks, and the next open
    /// replays it.
    async fn checkpoint(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// Everything a backend provides.
pub trait Store:
    SessionStore
    + RunStore
    + EventStore
    + MessageStore
    + UserStore
    + JournalStore
    + BudgetStore
    + LeaseStore
    + Checkpoint
    + std::fmt::Debug
{
}

impl<T> Store for T where
    T: SessionStore
        + RunStore
        + EventStore
        + MessageStore
        + UserStore
        + JournalStore
        + BudgetStore
        + LeaseStore
        + Checkpoint
        + std::fmt::Debug
{
}
