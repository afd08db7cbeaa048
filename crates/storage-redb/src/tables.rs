//! The redb tables: composite keys over 128-bit ids, JSON record bodies (events in the
//! binary form of `agentry_memory::rules::encode_event`).

use redb::TableDefinition;

/// Counters and the schema version.
pub(crate) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// Session id → session JSON.
pub(crate) const SESSIONS: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("sessions");
/// (created µs, session id) → () for newest-first listing.
pub(crate) const SESSION_INDEX: TableDefinition<'_, (i64, u128), ()> = TableDefinition::new("session_index");
/// (owner subject id, created µs, session id) → () for listing an owner's sessions.
pub(crate) const SESSION_OWNERS: TableDefinition<'_, (&str, i64, u128), ()> =
    TableDefinition::new("session_owners");
/// Session id → its latest activity: the `updated_at` of its turns as last written, in
/// microseconds (`SessionStore::get_session`).
pub(crate) const SESSION_ACTIVITY: TableDefinition<'_, u128, i64> = TableDefinition::new("session_activity");
/// Run id → run JSON.
pub(crate) const RUNS: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("runs");
/// Run id → (session id, creation order, explicitly raised high-water mark). The last
/// stored seq is the last key of the turn in [`TURN_EVENTS`].
pub(crate) const RUN_META: TableDefinition<'_, u128, (u128, u64, u64)> = TableDefinition::new("run_meta");
/// (session id, creation order) → run id.
pub(crate) const SESSION_RUNS: TableDefinition<'_, (u128, u64), u128> = TableDefinition::new("session_runs");
/// (session id, creation order) → run id, for the session's top-level runs (turns).
pub(crate) const SESSION_TURNS: TableDefinition<'_, (u128, u64), u128> =
    TableDefinition::new("session_turns");
/// (parent run id, creation order) → run id, for member runs.
pub(crate) const MEMBER_RUNS: TableDefinition<'_, (u128, u64), u128> = TableDefinition::new("member_runs");
/// Member run id → its parent's id (fixed when the run is created; turns have none).
pub(crate) const RUN_PARENTS: TableDefinition<'_, u128, u128> = TableDefinition::new("run_parents");
/// Position → stored event (`agentry_memory::rules::encode_event`).
pub(crate) const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");
/// (turn id, seq) → position.
pub(crate) const TURN_EVENTS: TableDefinition<'_, (u128, u64), u64> = TableDefinition::new("turn_events");
/// (session id, position) → ().
pub(crate) const SESSION_EVENTS: TableDefinition<'_, (u128, u64), ()> =
    TableDefinition::new("session_events");
/// (run id, index) → message JSON.
pub(crate) const MESSAGES: TableDefinition<'_, (u128, u32), &[u8]> = TableDefinition::new("messages");
/// User id → profile JSON.
pub(crate) const PROFILES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("profiles");
/// (user id, memory id) → memory JSON.
pub(crate) const MEMORIES: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("memories");
/// (user id, created µs, memory id) → () for newest-first listing.
pub(crate) const MEMORY_INDEX: TableDefinition<'_, (&str, i64, &str), ()> =
    TableDefinition::new("memory_index");
/// (turn id, tool call id) → (start order, journal entry JSON).
pub(crate) const JOURNAL: TableDefinition<'_, (u128, &str), (u64, &[u8])> = TableDefinition::new("journal");
/// (turn id, start order) → tool call id.
pub(crate) const JOURNAL_ORDER: TableDefinition<'_, (u128, u64), &str> =
    TableDefinition::new("journal_order");
/// Scope → budget JSON (limit and used).
pub(crate) const BUDGETS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("budgets");
/// (session id, scope) → () for the ledgers a session owns (deleted with it).
pub(crate) const SESSION_BUDGETS: TableDefinition<'_, (u128, &str), ()> =
    TableDefinition::new("session_budgets");
/// Reservation id → reservation JSON.
pub(crate) const RESERVATIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("reservations");
/// (scope, reservation id) → ().
pub(crate) const RESERVATION_SCOPES: TableDefinition<'_, (&str, &str), ()> =
    TableDefinition::new("reservation_scopes");
/// Session id → lease JSON.
pub(crate) const LEASES: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("leases");
