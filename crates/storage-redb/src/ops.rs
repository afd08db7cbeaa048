//! The storage traits over redb. Every write reads and validates first and changes tables
//! last, so a refused write leaves its transaction (shared with its batch) untouched. That
//! includes decoding every stored record it needs: a record that does not decode refuses
//! its write alone (`rules::is_damaged_record`), so it must be read before any change.

use std::sync::Arc;
use std::time::Duration;

use agentry_events::EventEnvelope;
use std::ops::Bound;

use agentry_memory::handoff;
use agentry_memory::rules::EncodedRun;
use agentry_memory::{
    BudgetStore, Conflict, EventStore, FeedQuery, HistoryQuery, JournalStore, LeaseStore, MessageStore,
    Order, Page, PageRequest, ParentFilter, RunQuery, RunStore, SessionQuery, SessionStore, SessionUpdate,
    StoreError, StoreResult, StoredEvent, TurnFacts, TurnStart, TurnStep, UserStore, decode_key,
    decode_token, rules,
};
use agentry_types::{
    BudgetLedger, BudgetLimit, BudgetReservation, BudgetUsage, Fence, HistoryMessage, JournalEntry, Lease,
    Message, RunRecord, SessionId, SessionRecord, Timestamp, ToolResult, TurnId, UserMemory, UserProfile,
};
use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use uuid_bits::{session_key, turn_key};

use crate::tables::{
    BUDGETS, EVENTS, JOURNAL, JOURNAL_ORDER, LEASES, MEMBER_RUNS, MEMORIES, MEMORY_INDEX, MESSAGES, PROFILES,
    RESERVATION_SCOPES, RESERVATIONS, RUN_META, RUN_PARENTS, RUNS, SESSION_ACTIVITY, SESSION_BUDGETS,
    SESSION_EVENTS, SESSION_INDEX, SESSION_OWNERS, SESSION_RUNS, SESSION_TURNS, SESSIONS, TURN_EVENTS,
};
use crate::{RedbStore, Tx, counter, redb_error, set_counter};

mod uuid_bits {
    use agentry_types::{SessionId, TurnId};

    pub(super) fn session_key(id: SessionId) -> u128 {
        id.as_uuid().as_u128()
    }

    pub(super) fn turn_key(id: TurnId) -> u128 {
        id.as_uuid().as_u128()
    }
}

/// Creates every table, so that reads of a new store find them.
pub(crate) fn create_tables(transaction: &WriteTransaction) -> StoreResult<()> {
    fn touch<K: redb::Key + 'static, V: redb::Value + 'static>(
        transaction: &WriteTransaction,
        table: TableDefinition<'_, K, V>,
    ) -> StoreResult<()> {
        transaction.open_table(table).map(drop).map_err(redb_error)
    }
    touch(transaction, SESSIONS)?;
    touch(transaction, SESSION_INDEX)?;
    touch(transaction, SESSION_OWNERS)?;
    touch(transaction, SESSION_ACTIVITY)?;
    touch(transaction, RUNS)?;
    touch(transaction, RUN_META)?;
    touch(transaction, SESSION_RUNS)?;
    touch(transaction, SESSION_TURNS)?;
    touch(transaction, MEMBER_RUNS)?;
    touch(transaction, RUN_PARENTS)?;
    touch(transaction, EVENTS)?;
    touch(transaction, TURN_EVENTS)?;
    touch(transaction, SESSION_EVENTS)?;
    touch(transaction, MESSAGES)?;
    touch(transaction, PROFILES)?;
    touch(transaction, MEMORIES)?;
    touch(transaction, MEMORY_INDEX)?;
    touch(transaction, JOURNAL)?;
    touch(transaction, JOURNAL_ORDER)?;
    touch(transaction, BUDGETS)?;
    touch(transaction, RESERVATIONS)?;
    touch(transaction, RESERVATION_SCOPES)?;
    touch(transaction, SESSION_BUDGETS)?;
    touch(transaction, LEASES)
}

/// Schema 1 → 2: `run_meta` loses the last stored seq, which folds into the high-water
/// mark (a turn's mark was the larger of the two).
pub(crate) fn migrate_1_to_2(transaction: &WriteTransaction) -> StoreResult<()> {
    const RUN_META_V1: TableDefinition<'_, u128, (u128, u64, u64, u64)> = TableDefinition::new("run_meta");
    let rows = {
        let old = match transaction.open_table(RUN_META_V1) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(error) => return Err(redb_error(error)),
        };
        let mut rows = Vec::new();
        for entry in old.iter().map_err(redb_error)? {
            let (key, value) = entry.map_err(redb_error)?;
            let (session, order, last_seq, high_water) = value.value();
            rows.push((key.value(), (session, order, high_water.max(last_seq))));
        }
        rows
    };
    transaction.delete_table(RUN_META_V1).map_err(redb_error)?;
    let mut table = transaction.open_table(RUN_META).map_err(redb_error)?;
    for (key, value) in rows {
        table.insert(key, value).map_err(redb_error)?;
    }
    Ok(())
}

/// Reads one JSON record from any table keyed by `K`.
fn get_json<T: serde::de::DeserializeOwned, K: redb::Key + 'static>(
    table: &impl ReadableTable<K, &'static [u8]>,
    key: impl std::borrow::Borrow<K::SelfType<'static>>,
    what: &'static str,
) -> StoreResult<Option<T>> {
    match table.get(key).map_err(redb_error)? {
        Some(value) => rules::decode(what, value.value()).map(Some),
        None => Ok(None),
    }
}

/// (session, order, explicitly raised high-water mark) of a run.
type RunMeta = (u128, u64, u64);

fn run_meta(table: &impl ReadableTable<u128, RunMeta>, turn: TurnId) -> StoreResult<RunMeta> {
    table
        .get(turn_key(turn))
        .map_err(redb_error)?
        .map(|value| value.value())
        .ok_or_else(|| StoreError::not_found("run", turn))
}

/// Gives a new run of `session` under `parent` (a turn: none) the next place among the
/// runs and indexes it (the record itself is stored by the caller); returns its metadata.
fn insert_run_meta(
    transaction: &WriteTransaction,
    id: TurnId,
    session: SessionId,
    parent: Option<TurnId>,
) -> StoreResult<RunMeta> {
    let order = counter(transaction, "last_run_order")? + 1;
    set_counter(transaction, "last_run_order", order)?;
    let meta = (session_key(session), order, 0);
    let mut metas = transaction.open_table(RUN_META).map_err(redb_error)?;
    metas.insert(turn_key(id), meta).map_err(redb_error)?;
    let mut session_runs = transaction.open_table(SESSION_RUNS).map_err(redb_error)?;
    session_runs.insert((session_key(session), order), turn_key(id)).map_err(redb_error)?;
    index_run(transaction, id, session, order, parent)?;
    Ok(meta)
}

/// A session's place in the listings: (created µs, session id).
type SessionListKey = (i64, u128);

/// The listing keys (created µs, session id) a page of `query` reads, in key order: the
/// query's creation bounds, cut at the page's cursor `after`. `None` when nothing is left.
fn session_key_range(
    query: &SessionQuery,
    after: Option<SessionListKey>,
) -> Option<(Bound<SessionListKey>, Bound<SessionListKey>)> {
    let low = (query.created_from.map_or(i64::MIN, Timestamp::unix_micros), 0);
    let high = (query.created_until.map_or(i64::MAX, Timestamp::unix_micros), u128::MAX);
    rules::listing_range(low, high, after, query.oldest_first)
}

/// Indexes a run by its parent: among its session's turns, or its parent's members.
fn index_run(
    transaction: &WriteTransaction,
    id: TurnId,
    session: SessionId,
    order: u64,
    parent: Option<TurnId>,
) -> StoreResult<()> {
    match parent {
        None => {
            let mut turns = transaction.open_table(SESSION_TURNS).map_err(redb_error)?;
            turns.insert((session_key(session), order), turn_key(id)).map_err(redb_error)?;
        }
        Some(parent) => {
            let mut members = transaction.open_table(MEMBER_RUNS).map_err(redb_error)?;
            members.insert((turn_key(parent), order), turn_key(id)).map_err(redb_error)?;
            let mut parents = transaction.open_table(RUN_PARENTS).map_err(redb_error)?;
            parents.insert(turn_key(id), turn_key(parent)).map_err(redb_error)?;
        }
    }
    Ok(())
}

/// Migrates a store of schema 3 or older to 4: indexes every run by its parent, read from
/// its record. A record that does not parse is indexed as a turn; it fails to decode
/// wherever it is read, as before.
pub(crate) fn index_runs_by_parent(transaction: &WriteTransaction) -> StoreResult<()> {
    let session_runs = transaction.open_table(SESSION_RUNS).map_err(redb_error)?;
    let runs = transaction.open_table(RUNS).map_err(redb_error)?;
    for entry in session_runs.iter().map_err(redb_error)? {
        let (key, run) = entry.map_err(redb_error)?;
        let ((session, order), run) = (key.value(), run.value());
        let parent = match runs.get(run).map_err(redb_error)? {
            Some(body) => rules::run_parent(body.value()).unwrap_or(None),
            None => None,
        };
        let id = TurnId::from_uuid(uuid::Uuid::from_u128(run));
        index_run(transaction, id, SessionId::from_uuid(uuid::Uuid::from_u128(session)), order, parent)?;
    }
    Ok(())
}

/// Migrates a store of schema 4 or older to 5: indexes every session by its owner, read
/// from its record. A record that does not decode (damaged, or nested too deeply by a
/// build before the nesting limit) is listed for no owner: its owner's listings leave it
/// out, while listings without an owner still fail on it, as before.
pub(crate) fn index_sessions_by_owner(transaction: &WriteTransaction) -> StoreResult<()> {
    let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
    let mut owners = transaction.open_table(SESSION_OWNERS).map_err(redb_error)?;
    for entry in sessions.iter().map_err(redb_error)? {
        let (id, body) = entry.map_err(redb_error)?;
        if let Ok(session) = rules::decode::<SessionRecord>("session", body.value()) {
            let key = (session.owner.subject_id.as_str(), session.created_at.unix_micros(), id.value());
            owners.insert(key, ()).map_err(redb_error)?;
        }
    }
    Ok(())
}

/// A stored run's parent (`None` for a turn).
fn stored_parent(transaction: &WriteTransaction, run: TurnId) -> StoreResult<Option<TurnId>> {
    let parents = transaction.open_table(RUN_PARENTS).map_err(redb_error)?;
    let parent = parents.get(turn_key(run)).map_err(redb_error)?.map(|parent| parent.value());
    Ok(parent.map(|parent| TurnId::from_uuid(uuid::Uuid::from_u128(parent))))
}

/// The last stored seq of a turn (0 when none).
fn last_stored_seq(by_turn: &impl ReadableTable<(u128, u64), u64>, turn: TurnId) -> StoreResult<u64> {
    let key = turn_key(turn);
    let last = by_turn.range((key, 0)..=(key, u64::MAX)).map_err(redb_error)?.next_back();
    match last {
        Some(entry) => Ok(entry.map_err(redb_error)?.0.value().1),
        None => Ok(0),
    }
}

fn session_of(meta: RunMeta) -> SessionId {
    SessionId::from_uuid(uuid::Uuid::from_u128(meta.0))
}

fn lease_of(transaction: &WriteTransaction, session: SessionId) -> StoreResult<Option<Lease>> {
    let leases = transaction.open_table(LEASES).map_err(redb_error)?;
    get_json(&leases, session_key(session), "lease")
}

fn check_fence(transaction: &WriteTransaction, session: SessionId, fence: Option<Fence>) -> StoreResult<()> {
    if fence.is_none() {
        return Ok(());
    }
    rules::check_fence(session, lease_of(transaction, session)?.as_ref(), fence)
}

/// A session's record with its latest activity (see [`SESSION_ACTIVITY`]).
fn read_session<T: ReadableTable<u128, &'static [u8]>>(
    sessions: &T,
    activity: &impl ReadableTable<u128, i64>,
    id: u128,
) -> StoreResult<Option<SessionRecord>> {
    let Some(session) = get_json::<SessionRecord, u128>(sessions, id, "session")? else { return Ok(None) };
    let active =
        activity.get(id).map_err(redb_error)?.map(|micros| Timestamp::from_unix_micros(micros.value()));
    Ok(Some(rules::with_activity(session, active)))
}

/// Moves a session's latest activity forward to a turn's record as written.
fn touch_session(transaction: &WriteTransaction, session: SessionId, run: &EncodedRun) -> StoreResult<()> {
    let Some(activity) = run.activity() else { return Ok(()) };
    let mut table = transaction.open_table(SESSION_ACTIVITY).map_err(redb_error)?;
    let known = table.get(session_key(session)).map_err(redb_error)?.map(|micros| micros.value());
    if known.is_none_or(|known| known < activity.unix_micros()) {
        table.insert(session_key(session), activity.unix_micros()).map_err(redb_error)?;
    }
    Ok(())
}

fn session_exists(transaction: &WriteTransaction, session: SessionId) -> StoreResult<bool> {
    let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
    Ok(sessions.get(session_key(session)).map_err(redb_error)?.is_some())
}

#[async_trait]
impl SessionStore for RedbStore {
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()> {
        let body = rules::encode("session", session)?;
        let (id, created) = (session.id, session.created_at.unix_micros());
        let owner = session.owner.subject_id.clone();
        self.write(move |transaction| {
            let mut sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
            if sessions.get(session_key(id)).map_err(redb_error)?.is_some() {
                return Err(Conflict::AlreadyExists { kind: "session", id: id.to_string() }.into());
            }
            sessions.insert(session_key(id), body.as_slice()).map_err(redb_error)?;
            let mut index = transaction.open_table(SESSION_INDEX).map_err(redb_error)?;
            index.insert((created, session_key(id)), ()).map_err(redb_error)?;
            let mut owners = transaction.open_table(SESSION_OWNERS).map_err(redb_error)?;
            owners.insert((owner.as_str(), created, session_key(id)), ()).map_err(redb_error)?;
            Ok(())
        })
        .await
    }

    async fn get_session(&self, id: SessionId) -> StoreResult<SessionRecord> {
        self.read_sized(true, move |transaction| {
            let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
            let activity = transaction.open_table(SESSION_ACTIVITY).map_err(redb_error)?;
            read_session(&sessions, &activity, session_key(id))?
                .ok_or_else(|| StoreError::not_found("session", id))
        })
        .await
    }

    async fn update_session(&self, id: SessionId, update: &SessionUpdate) -> StoreResult<SessionRecord> {
        let update = update.clone();
        self.write(move |transaction| {
            let mut sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
            let activity = transaction.open_table(SESSION_ACTIVITY).map_err(redb_error)?;
            let mut session = read_session(&sessions, &activity, session_key(id))?
                .ok_or_else(|| StoreError::not_found("session", id))?;
            drop(activity);
            check_fence(transaction, id, update.fence)?;
            update.apply(&mut session, Timestamp::now());
            let body = rules::encode("session", &session)?;
            sessions.insert(session_key(id), body.as_slice()).map_err(redb_error)?;
            Ok(session)
        })
        .await
    }

    async fn delete_session(&self, id: SessionId) -> StoreResult<()> {
        self.write(move |transaction| {
            transaction.turns.forget_all();
            let key = session_key(id);
            // The record is read only for its creation time, the key of its listing entry. A
            // record that no longer reads (nested too deeply by a build before the nesting
            // limit, or damaged) must still be deletable: its entry is then looked for.
            let created: Option<(i64, String)> = {
                let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
                match get_json::<SessionRecord, _>(&sessions, key, "session") {
                    Ok(Some(session)) => Some((session.created_at.unix_micros(), session.owner.subject_id)),
                    Ok(None) => return Err(StoreError::not_found("session", id)),
                    Err(StoreError::Corrupt(_)) => None,
                    Err(error) => return Err(error),
                }
            };
            let budgets = session_budgets(transaction, key)?;
            let runs: Vec<(u64, u128)> = {
                let session_runs = transaction.open_table(SESSION_RUNS).map_err(redb_error)?;
                let range = session_runs.range((key, 0)..=(key, u64::MAX)).map_err(redb_error)?;
                range
                    .map(|entry| entry.map(|(order, run)| (order.value().1, run.value())).map_err(redb_error))
                    .collect::<StoreResult<_>>()?
            };
            let positions: Vec<u64> = {
                let session_events = transaction.open_table(SESSION_EVENTS).map_err(redb_error)?;
                let range = session_events.range((key, 0)..=(key, u64::MAX)).map_err(redb_error)?;
                range
                    .map(|entry| entry.map(|(k, _)| k.value().1).map_err(redb_error))
                    .collect::<StoreResult<_>>()?
            };
            transaction.open_table(SESSIONS).map_err(redb_error)?.remove(key).map_err(redb_error)?;
            transaction.open_table(SESSION_ACTIVITY).map_err(redb_error)?.remove(key).map_err(redb_error)?;
            let mut index = transaction.open_table(SESSION_INDEX).map_err(redb_error)?;
            let mut owners = transaction.open_table(SESSION_OWNERS).map_err(redb_error)?;
            match created {
                Some((created, owner)) => {
                    index.remove((created, key)).map_err(redb_error)?;
                    owners.remove((owner.as_str(), created, key)).map_err(redb_error)?;
                }
                None => {
                    index.retain(|(_, session), ()| session != key).map_err(redb_error)?;
                    owners.retain(|(_, _, session), ()| session != key).map_err(redb_error)?;
                }
            }
            drop((index, owners));
            transaction.open_table(LEASES).map_err(redb_error)?.remove(key).map_err(redb_error)?;
            for table in [SESSION_RUNS, SESSION_TURNS] {
                transaction
                    .open_table(table)
                    .map_err(redb_error)?
                    .retain_in((key, 0)..=(key, u64::MAX), |_, _| false)
                    .map_err(redb_error)?;
            }
            transaction
                .open_table(SESSION_EVENTS)
                .map_err(redb_error)?
                .retain_in((key, 0)..=(key, u64::MAX), |_, _| false)
                .map_err(redb_error)?;
            let mut events = transaction.open_table(EVENTS).map_err(redb_error)?;
            for position in positions {
                events.remove(position).map_err(redb_error)?;
            }
            drop(events);
            for (order, run) in runs {
                // A member leaves its parent's index (the parent may be another session's).
                let parent = transaction
                    .open_table(RUN_PARENTS)
                    .map_err(redb_error)?
                    .remove(run)
                    .map_err(redb_error)?
                    .map(|parent| parent.value());
                if let Some(parent) = parent {
                    transaction
                        .open_table(MEMBER_RUNS)
                        .map_err(redb_error)?
                        .remove((parent, order))
                        .map_err(redb_error)?;
                }
                transaction.open_table(RUNS).map_err(redb_error)?.remove(run).map_err(redb_error)?;
                transaction.open_table(RUN_META).map_err(redb_error)?.remove(run).map_err(redb_error)?;
                transaction
                    .open_table(TURN_EVENTS)
                    .map_err(redb_error)?
                    .retain_in((run, 0)..=(run, u64::MAX), |_, _| false)
                    .map_err(redb_error)?;
                transaction
                    .open_table(MESSAGES)
                    .map_err(redb_error)?
                    .retain_in((run, 0)..=(run, u32::MAX), |_, _| false)
                    .map_err(redb_error)?;
                let calls: Vec<String> = {
                    let orders = transaction.open_table(JOURNAL_ORDER).map_err(redb_error)?;
                    let range = orders.range((run, 0)..=(run, u64::MAX)).map_err(redb_error)?;
                    range
                        .map(|entry| entry.map(|(_, call)| call.value().to_owned()).map_err(redb_error))
                        .collect::<StoreResult<_>>()?
                };
                let mut journal = transaction.open_table(JOURNAL).map_err(redb_error)?;
                for call in &calls {
                    journal.remove((run, call.as_str())).map_err(redb_error)?;
                }
                drop(journal);
                transaction
                    .open_table(JOURNAL_ORDER)
                    .map_err(redb_error)?
                    .retain_in((run, 0)..=(run, u64::MAX), |_, _| false)
                    .map_err(redb_error)?;
            }
            delete_session_budgets(transaction, key, &budgets)
        })
        .await
    }

    async fn list_sessions(
        &self,
        query: &SessionQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<SessionRecord>> {
        let limit = page.effective_limit();
        // Once per call: the kind serializes and hashes the query.
        let kind = query.page_kind();
        let after = match &page.token {
            Some(token) => {
                let key = decode_token(&kind, token)?;
                let invalid = || StoreError::InvalidInput(format!("invalid page token {token:?}"));
                let (micros, id) = key.split_once(':').ok_or_else(invalid)?;
                let micros: i64 = micros.parse().map_err(|_| invalid())?;
                let id: SessionId = id.parse().map_err(|_| invalid())?;
                Some((micros, session_key(id)))
            }
            None => None,
        };
        let query = query.clone();
        self.read(move |transaction| {
            let index = transaction.open_table(SESSION_INDEX).map_err(redb_error)?;
            let owners = transaction.open_table(SESSION_OWNERS).map_err(redb_error)?;
            let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
            let activity = transaction.open_table(SESSION_ACTIVITY).map_err(redb_error)?;
            let Some((lower, upper)) = session_key_range(&query, after) else {
                return Ok(Page { items: Vec::new(), next_token: None });
            };
            // An owner's sessions through their own index; the creation bounds bound the
            // range read, as the cursor does.
            let ids: Box<dyn DoubleEndedIterator<Item = StoreResult<u128>>> = match &query.owner {
                Some(owner) => {
                    let owned =
                        |bound: Bound<(i64, u128)>| bound.map(|(created, id)| (owner.as_str(), created, id));
                    let range = owners.range((owned(lower), owned(upper))).map_err(redb_error)?;
                    Box::new(range.map(|entry| entry.map(|(key, _)| key.value().2).map_err(redb_error)))
                }
                None => {
                    let range = index.range((lower, upper)).map_err(redb_error)?;
                    Box::new(range.map(|entry| entry.map(|(key, _)| key.value().1).map_err(redb_error)))
                }
            };
            let ids: Box<dyn Iterator<Item = _>> = if query.oldest_first { ids } else { Box::new(ids.rev()) };
            let mut items = Vec::new();
            for id in ids {
                let id = id?;
                let Some(session) = read_session(&sessions, &activity, id)? else {
                    continue;
                };
                if query.matches(&session) {
                    items.push(session);
                    if items.len() > limit {
                        break;
                    }
                }
            }
            Ok(Page::from_lookahead(items, limit, &kind, |s| {
                format!("{}:{}", s.created_at.unix_micros(), s.id)
            }))
        })
        .await
    }
}

#[async_trait]
impl RunStore for RedbStore {
    async fn put_run(&self, run: &RunRecord, fence: Option<Fence>) -> StoreResult<()> {
        let id = run.id;
        let encoded = EncodedRun::of(run)?;
        self.write(move |transaction| {
            let (session, parent) = (encoded.session_id, encoded.parent_run_id);
            if !session_exists(transaction, session)? {
                return Err(StoreError::not_found("session", session));
            }
            check_fence(transaction, session, fence)?;
            let metas = transaction.open_table(RUN_META).map_err(redb_error)?;
            let existing = metas.get(turn_key(id)).map_err(redb_error)?.map(|value| value.value());
            match existing {
                Some(meta) if meta.0 != session_key(session) => {
                    return Err(StoreError::InvalidInput(format!(
                        "run {id} belongs to session {}, not {session}",
                        session_of(meta)
                    )));
                }
                Some(_) => {
                    drop(metas);
                    rules::check_run_parent(id, parent, stored_parent(transaction, id)?)?;
                }
                None => {
                    drop(metas);
                    insert_run_meta(transaction, id, session, parent)?;
                }
            }
            let mut runs = transaction.open_table(RUNS).map_err(redb_error)?;
            runs.insert(turn_key(id), encoded.body.as_slice()).map_err(redb_error)?;
            drop(runs);
            touch_session(transaction, session, &encoded)
        })
        .await
    }

    async fn get_run(&self, id: TurnId) -> StoreResult<RunRecord> {
        self.read_sized(true, move |transaction| {
            let runs = transaction.open_table(RUNS).map_err(redb_error)?;
            get_json(&runs, turn_key(id), "run")?.ok_or_else(|| StoreError::not_found("run", id))
        })
        .await
    }

    async fn list_runs(
        &self,
        session: SessionId,
        query: &RunQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<RunRecord>> {
        let limit = page.effective_limit();
        let kind = agentry_memory::runs_kind(session, query.order);
        let after: Option<u64> = decode_key(&kind, page)?;
        let query = query.clone();
        self.read_sized(handoff::small_run_page(&query, limit), move |transaction| {
            let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
            if sessions.get(session_key(session)).map_err(redb_error)?.is_none() {
                return Err(StoreError::not_found("session", session));
            }
            // Members through their parent's index, turns through the session's index of
            // turns, every run through the session's.
            let (index, key) = match query.parent {
                ParentFilter::Of(parent) => (MEMBER_RUNS, turn_key(parent)),
                ParentFilter::TopLevel => (SESSION_TURNS, session_key(session)),
                ParentFilter::Any => (SESSION_RUNS, session_key(session)),
            };
            let index = transaction.open_table(index).map_err(redb_error)?;
            let runs = transaction.open_table(RUNS).map_err(redb_error)?;
            let range = match (query.order, after) {
                (Order::Asc, Some(after)) => index.range((key, after.saturating_add(1))..=(key, u64::MAX)),
                (Order::Asc, None) | (Order::Desc, None) => index.range((key, 0)..=(key, u64::MAX)),
                (Order::Desc, Some(after)) => index.range((key, 0)..(key, after)),
            }
            .map_err(redb_error)?;
            let entries: Box<dyn Iterator<Item = _>> =
                if query.order == Order::Desc { Box::new(range.rev()) } else { Box::new(range) };
            // A session's indexes hold exactly the runs wanted unless the query filters on
            // records (a parent's members may lie in other sessions too): the look-ahead
            // entry then tells of a next page undecoded (`None`).
            let decode_all = query.filters_records() || matches!(query.parent, ParentFilter::Of(_));
            let mut items: Vec<(u64, Option<RunRecord>)> = Vec::new();
            for entry in entries {
                let (order_key, run) = entry.map_err(redb_error)?;
                let order = order_key.value().1;
                if items.len() == limit && !decode_all {
                    items.push((order, None));
                    break;
                }
                let Some(record) = get_json::<RunRecord, u128>(&runs, run.value(), "run")? else { continue };
                if record.session_id == session && query.matches(&record) {
                    items.push((order, Some(record)));
                    if items.len() > limit {
                        break;
                    }
                }
            }
            let page = Page::from_lookahead(items, limit, &kind, |(order, _)| order.to_string());
            Ok(Page {
                items: page.items.into_iter().filter_map(|(_, run)| run).collect(),
                next_token: page.next_token,
            })
        })
        .await
    }
}

#[async_trait]
impl EventStore for RedbStore {
    async fn append_events(
        &self,
        turn: TurnId,
        events: &[EventEnvelope],
        fence: Option<Fence>,
    ) -> StoreResult<Vec<u64>> {
        let mut bodies = Vec::with_capacity(events.len());
        for event in events {
            bodies.push(rules::encode_event(event)?);
        }
        let keys: Vec<rules::EventKey> = events.iter().map(rules::EventKey::of).collect();
        self.write(move |transaction| {
            let facts = match transaction.turns.get(turn) {
                Some(facts) => facts,
                None => {
                    let meta = run_meta(&transaction.open_table(RUN_META).map_err(redb_error)?, turn)?;
                    let last_seq =
                        last_stored_seq(&transaction.open_table(TURN_EVENTS).map_err(redb_error)?, turn)?;
                    TurnFacts { session: session_of(meta), last_seq }
                }
            };
            let session = facts.session;
            // The fence first: a holder that lost the lease learns that, whatever its seqs.
            check_fence(transaction, session, fence)?;
            rules::check_event_batch(turn, session, facts.last_seq, keys.iter().copied())?;
            insert_events(transaction, turn, session, &keys, &bodies)
        })
        .await
    }

    async fn turn_events(
        &self,
        turn: TurnId,
        order: Order,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredEvent>> {
        self.read(move |transaction| {
            let metas = transaction.open_table(RUN_META).map_err(redb_error)?;
            run_meta(&metas, turn)?;
            let key = turn_key(turn);
            let by_turn = transaction.open_table(TURN_EVENTS).map_err(redb_error)?;
            let table = transaction.open_table(EVENTS).map_err(redb_error)?;
            let range = match (order, after) {
                (Order::Asc, Some(after)) if after == u64::MAX => return Ok(Vec::new()),
                (Order::Asc, Some(after)) => by_turn.range((key, after + 1)..=(key, u64::MAX)),
                (_, None) => by_turn.range((key, 0)..=(key, u64::MAX)),
                (Order::Desc, Some(after)) => by_turn.range((key, 0)..(key, after)),
            }
            .map_err(redb_error)?;
            let entries: Box<dyn Iterator<Item = _>> =
                if order == Order::Desc { Box::new(range.rev()) } else { Box::new(range) };
            let mut events = Vec::new();
            for entry in entries.take(limit) {
                let (_, position) = entry.map_err(redb_error)?;
                events.push(load_event(&table, position.value())?);
            }
            Ok(events)
        })
        .await
    }

    async fn feed(&self, query: &FeedQuery, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let query = *query;
        self.read(move |transaction| {
            let table = transaction.open_table(EVENTS).map_err(redb_error)?;
            let mut events = Vec::new();
            match query.session_id {
                None => {
                    let range = match (query.order, query.after) {
                        (Order::Asc, Some(after)) => table.range(after.saturating_add(1)..),
                        (_, None) => table.range::<u64>(..),
                        (Order::Desc, Some(after)) => table.range(..after),
                    }
                    .map_err(redb_error)?;
                    let entries: Box<dyn Iterator<Item = _>> =
                        if query.order == Order::Desc { Box::new(range.rev()) } else { Box::new(range) };
                    for entry in entries.take(limit) {
                        let (position, body) = entry.map_err(redb_error)?;
                        events.push(StoredEvent {
                            position: position.value(),
                            event: rules::decode_event(body.value())?,
                        });
                    }
                }
                Some(session) => {
                    let key = session_key(session);
                    let by_session = transaction.open_table(SESSION_EVENTS).map_err(redb_error)?;
                    let range = match (query.order, query.after) {
                        (Order::Asc, Some(after)) => {
                            by_session.range((key, after.saturating_add(1))..=(key, u64::MAX))
                        }
                        (_, None) => by_session.range((key, 0)..=(key, u64::MAX)),
                        (Order::Desc, Some(after)) => by_session.range((key, 0)..(key, after)),
                    }
                    .map_err(redb_error)?;
                    let entries: Box<dyn Iterator<Item = _>> =
                        if query.order == Order::Desc { Box::new(range.rev()) } else { Box::new(range) };
                    for entry in entries.take(limit) {
                        let (key, _) = entry.map_err(redb_error)?;
                        events.push(load_event(&table, key.value().1)?);
                    }
                }
            }
            Ok(events)
        })
        .await
    }

    async fn raise_high_water(&self, turn: TurnId, seq: u64, fence: Option<Fence>) -> StoreResult<u64> {
        rules::check_seq(seq)?;
        self.write(move |transaction| {
            let mut metas = transaction.open_table(RUN_META).map_err(redb_error)?;
            let meta = run_meta(&metas, turn)?;
            check_fence(transaction, session_of(meta), fence)?;
            let stored = last_stored_seq(&transaction.open_table(TURN_EVENTS).map_err(redb_error)?, turn)?;
            let mark = meta.2.max(stored).max(seq);
            if mark != meta.2 {
                metas.insert(turn_key(turn), (meta.0, meta.1, mark)).map_err(redb_error)?;
            }
            Ok(mark)
        })
        .await
    }

    async fn high_water(&self, turn: TurnId) -> StoreResult<u64> {
        self.read_sized(true, move |transaction| {
            let metas = transaction.open_table(RUN_META).map_err(redb_error)?;
            let meta = run_meta(&metas, turn)?;
            Ok(meta.2.max(last_stored_seq(&transaction.open_table(TURN_EVENTS).map_err(redb_error)?, turn)?))
        })
        .await
    }

    async fn write_step(&self, turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<Vec<u64>> {
        let step = rules::encode_step(turn, step, fence)?;
        self.write(move |transaction| write_step_in(transaction, turn, &step, fence)).await
    }

    async fn start_turn(
        &self,
        turn: TurnId,
        step: &TurnStep,
        start: &TurnStart,
    ) -> StoreResult<(Lease, Vec<u64>)> {
        let session = rules::check_start_shape(turn, step)?.session_id;
        let step = rules::encode_step(turn, step, None)?;
        let start = start.clone();
        self.write(move |transaction| {
            // Every part is checked before any table changes (see the module's note).
            let run_exists = match run_meta(&transaction.open_table(RUN_META).map_err(redb_error)?, turn) {
                Ok(_) => true,
                Err(error) if error.is_not_found() => false,
                Err(error) => return Err(error),
            };
            let current = lease_of(transaction, session)?;
            let facts = rules::StartFacts {
                session_exists: session_exists(transaction, session)?,
                lease: current.as_ref(),
                last_token: counter(transaction, "last_token")?,
                run_exists,
            };
            let lease =
                rules::check_turn_start(turn, session, &start, &facts, || latest_turn(transaction, session))?;
            let body = rules::encode("lease", &lease)?;
            // The lease is new, so the step needs no fence; it checks before it changes.
            let positions = write_step_in(transaction, turn, &step, None)?;
            set_counter(transaction, "last_token", lease.token)?;
            put_lease(transaction, &lease, &body)?;
            Ok((lease, positions))
        })
        .await
    }
}

/// [`EventStore::write_step`] inside a write, its step encoded and checked. Every part is
/// checked before any table changes.
fn write_step_in(
    transaction: &mut Tx<'_>,
    turn: TurnId,
    step: &rules::EncodedStep,
    fence: Option<Fence>,
) -> StoreResult<Vec<u64>> {
    // Every part is checked before any table changes (see the module's note).
    let found = run_meta(&transaction.open_table(RUN_META).map_err(redb_error)?, turn);
    let (meta, new_run) = match (found, &step.run) {
        (Ok(meta), _) => (meta, false),
        // The turn's first step creates its run: checked here, stored below.
        (Err(error), Some(run)) if error.is_not_found() => {
            if !session_exists(transaction, run.session_id)? {
                return Err(StoreError::not_found("session", run.session_id));
            }
            ((session_key(run.session_id), 0, 0), true)
        }
        (Err(error), _) => return Err(error),
    };
    let session = session_of(meta);
    if let Some(run) = &step.run {
        rules::check_run_session_id(turn, run.session_id, session)?;
        if !new_run {
            rules::check_run_parent(turn, run.parent_run_id, stored_parent(transaction, turn)?)?;
        }
    }
    let last_seq = match transaction.turns.get(turn) {
        Some(facts) => facts.last_seq,
        None => last_stored_seq(&transaction.open_table(TURN_EVENTS).map_err(redb_error)?, turn)?,
    };
    // The fence first: a holder that lost the lease learns that, whatever its seqs.
    check_fence(transaction, session, fence)?;
    rules::check_event_batch(turn, session, last_seq, step.keys.iter().copied())?;
    let journal = rules::journal_writes(&step.journal, |call| journal_entry(transaction, turn, call))?
        .into_iter()
        .map(|(order, entry)| Ok((order, rules::encode("journal entry", &entry)?, entry)))
        .collect::<StoreResult<Vec<_>>>()?;
    let meta = match &step.run {
        Some(run) if new_run => insert_run_meta(transaction, turn, session, run.parent_run_id)?,
        _ => meta,
    };
    if let Some(seq) = step.high_water {
        let mark = meta.2.max(last_seq).max(seq);
        if mark != meta.2 {
            let mut metas = transaction.open_table(RUN_META).map_err(redb_error)?;
            metas.insert(turn_key(turn), (meta.0, meta.1, mark)).map_err(redb_error)?;
        }
    }
    if !step.messages.is_empty() {
        insert_messages(transaction, turn, &step.messages)?;
    }
    let positions = insert_events(transaction, turn, session, &step.keys, &step.events)?;
    for (order, body, entry) in journal {
        match order {
            Some(order) => {
                let mut table = transaction.open_table(JOURNAL).map_err(redb_error)?;
                let key = (turn_key(turn), entry.tool_call_id.as_str());
                table.insert(key, (order, body.as_slice())).map_err(redb_error)?;
            }
            None => insert_journal_entry(transaction, &entry, &body)?,
        }
    }
    if let Some(run) = &step.run {
        let mut runs = transaction.open_table(RUNS).map_err(redb_error)?;
        runs.insert(turn_key(turn), run.body.as_slice()).map_err(redb_error)?;
        drop(runs);
        touch_session(transaction, session, run)?;
    }
    if step.release_lease {
        let mut leases = transaction.open_table(LEASES).map_err(redb_error)?;
        leases.remove(session_key(session)).map_err(redb_error)?;
    }
    Ok(positions)
}

/// The session's newest top-level run.
fn latest_turn(transaction: &WriteTransaction, session: SessionId) -> StoreResult<Option<TurnId>> {
    let key = session_key(session);
    let turns = transaction.open_table(SESSION_TURNS).map_err(redb_error)?;
    let last = turns.range((key, 0)..=(key, u64::MAX)).map_err(redb_error)?.next_back();
    match last {
        Some(entry) => {
            Ok(Some(TurnId::from_uuid(uuid::Uuid::from_u128(entry.map_err(redb_error)?.1.value()))))
        }
        None => Ok(None),
    }
}

/// Stores checked, encoded events of a turn under new positions (the changing half of
/// [`EventStore::append_events`]).
fn insert_events(
    transaction: &mut Tx<'_>,
    turn: TurnId,
    session: SessionId,
    keys: &[rules::EventKey],
    bodies: &[Vec<u8>],
) -> StoreResult<Vec<u64>> {
    let Some(last) = keys.last().map(|key| key.seq) else { return Ok(Vec::new()) };
    let first_position = transaction.allocate_positions(keys.len() as u64)?;
    let mut positions = Vec::with_capacity(bodies.len());
    {
        let mut table = transaction.open_table(EVENTS).map_err(redb_error)?;
        let mut by_turn = transaction.open_table(TURN_EVENTS).map_err(redb_error)?;
        let mut by_session = transaction.open_table(SESSION_EVENTS).map_err(redb_error)?;
        for (offset, (key, body)) in keys.iter().zip(bodies).enumerate() {
            let position = first_position + offset as u64;
            table.insert(position, body.as_slice()).map_err(redb_error)?;
            by_turn.insert((turn_key(turn), key.seq), position).map_err(redb_error)?;
            by_session.insert((session_key(session), position), ()).map_err(redb_error)?;
            positions.push(position);
        }
    }
    transaction.turns.remember(turn, TurnFacts { session, last_seq: last });
    Ok(positions)
}

/// Appends encoded messages after a run's last (the changing half of
/// [`MessageStore::append_messages`]).
fn insert_messages(transaction: &WriteTransaction, run: TurnId, bodies: &[Vec<u8>]) -> StoreResult<()> {
    let key = turn_key(run);
    let mut table = transaction.open_table(MESSAGES).map_err(redb_error)?;
    let next = match table.range((key, 0)..=(key, u32::MAX)).map_err(redb_error)?.next_back() {
        Some(entry) => entry.map_err(redb_error)?.0.value().1 + 1,
        None => 0,
    };
    for (offset, body) in bodies.iter().enumerate() {
        let index = next + u32::try_from(offset).unwrap_or(u32::MAX);
        table.insert((key, index), body.as_slice()).map_err(redb_error)?;
    }
    Ok(())
}

fn load_event(table: &impl ReadableTable<u64, &'static [u8]>, position: u64) -> StoreResult<StoredEvent> {
    let body = table
        .get(position)
        .map_err(redb_error)?
        .ok_or_else(|| StoreError::Corrupt(format!("event position {position} is indexed but missing")))?;
    Ok(StoredEvent { position, event: rules::decode_event(body.value())? })
}

#[async_trait]
impl MessageStore for RedbStore {
    async fn append_messages(
        &self,
        run: TurnId,
        messages: &[Arc<Message>],
        fence: Option<Fence>,
    ) -> StoreResult<()> {
        let mut bodies = Vec::with_capacity(messages.len());
        for message in messages {
            bodies.push(rules::encode("message", message)?);
        }
        self.write(move |transaction| {
            let meta = run_meta(&transaction.open_table(RUN_META).map_err(redb_error)?, run)?;
            check_fence(transaction, session_of(meta), fence)?;
            insert_messages(transaction, run, &bodies)
        })
        .await
    }

    async fn history(&self, session: SessionId, query: &HistoryQuery) -> StoreResult<Vec<HistoryMessage>> {
        let query = query.clone();
        self.read_where(handoff::short_history(&query), false, move |transaction| {
            let sessions = transaction.open_table(SESSIONS).map_err(redb_error)?;
            if sessions.get(session_key(session)).map_err(redb_error)?.is_none() {
                return Err(StoreError::not_found("session", session));
            }
            let key = session_key(session);
            // Member runs are not looked at unless the window takes them: turns only, then.
            let index = if query.include_member_runs { SESSION_RUNS } else { SESSION_TURNS };
            let session_runs = transaction.open_table(index).map_err(redb_error)?;
            let runs_table = transaction.open_table(RUNS).map_err(redb_error)?;
            let messages = transaction.open_table(MESSAGES).map_err(redb_error)?;
            let range = session_runs.range((key, 0)..=(key, u64::MAX)).map_err(redb_error)?;
            let runs = range.rev().map(|entry| {
                let (_, run) = entry.map_err(redb_error)?;
                get_json::<rules::RunHead, u128>(&runs_table, run.value(), "run")?
                    .ok_or_else(|| StoreError::Corrupt("a session's run is indexed but missing".to_owned()))
            });
            rules::history_window(runs, &query, |run, window| {
                let key = turn_key(run);
                for entry in messages.range((key, 0)..=(key, u32::MAX)).map_err(redb_error)? {
                    let (index, body) = entry.map_err(redb_error)?;
                    window.push(HistoryMessage {
                        run_id: run,
                        index: index.value().1,
                        // Decoded, then shared: decoding into the `Arc` allocates twice.
                        message: Arc::new(rules::decode("message", body.value())?),
                    });
                }
                Ok(())
            })
        })
        .await
    }
}

#[async_trait]
impl UserStore for RedbStore {
    async fn profile(&self, user_id: &str) -> StoreResult<Option<UserProfile>> {
        let user = user_id.to_owned();
        self.read_sized(true, move |transaction| {
            let profiles = transaction.open_table(PROFILES).map_err(redb_error)?;
            let value = profiles.get(user.as_str()).map_err(redb_error)?;
            value.map(|body| rules::decode("user profile", body.value())).transpose()
        })
        .await
    }

    async fn put_profile(&self, profile: &UserProfile) -> StoreResult<()> {
        let body = rules::encode("user profile", profile)?;
        let user = profile.user_id.clone();
        self.write(move |transaction| {
            let mut profiles = transaction.open_table(PROFILES).map_err(redb_error)?;
            profiles.insert(user.as_str(), body.as_slice()).map_err(redb_error)?;
            Ok(())
        })
        .await
    }

    async fn merge_profile(&self, patch: &UserProfile) -> StoreResult<UserProfile> {
        rules::check_profile_patch(patch)?;
        let patch = patch.clone();
        self.write(move |transaction| {
            let mut profiles = transaction.open_table(PROFILES).map_err(redb_error)?;
            let current = profiles
                .get(patch.user_id.as_str())
                .map_err(redb_error)?
                .map(|body| rules::decode("user profile", body.value()))
                .transpose()?;
            let merged = rules::merged_profile(current, &patch);
            let body = rules::encode("user profile", &merged)?;
            profiles.insert(patch.user_id.as_str(), body.as_slice()).map_err(redb_error)?;
            Ok(merged)
        })
        .await
    }

    async fn add_memory(&self, memory: &UserMemory) -> StoreResult<()> {
        let body = rules::encode("user memory", memory)?;
        let (user, id, created) =
            (memory.user_id.clone(), memory.id.clone(), memory.created_at.unix_micros());
        self.write(move |transaction| {
            let mut memories = transaction.open_table(MEMORIES).map_err(redb_error)?;
            if memories.get((user.as_str(), id.as_str())).map_err(redb_error)?.is_some() {
                return Err(Conflict::AlreadyExists { kind: "user memory", id }.into());
            }
            memories.insert((user.as_str(), id.as_str()), body.as_slice()).map_err(redb_error)?;
            let mut index = transaction.open_table(MEMORY_INDEX).map_err(redb_error)?;
            index.insert((user.as_str(), created, id.as_str()), ()).map_err(redb_error)?;
            Ok(())
        })
        .await
    }

    async fn memories(&self, user_id: &str, limit: usize) -> StoreResult<Vec<UserMemory>> {
        let user = user_id.to_owned();
        self.read(move |transaction| {
            let index = transaction.open_table(MEMORY_INDEX).map_err(redb_error)?;
            let memories = transaction.open_table(MEMORIES).map_err(redb_error)?;
            // Every key of `user` sorts before the first key of the next possible user id,
            // `user` followed by a NUL.
            let after = format!("{user}\0");
            let range = index
                .range((user.as_str(), i64::MIN, "")..(after.as_str(), i64::MIN, ""))
                .map_err(redb_error)?;
            let mut found = Vec::new();
            for entry in range.rev().take(limit) {
                let (key, _) = entry.map_err(redb_error)?;
                let (_, _, id) = key.value();
                if let Some(body) = memories.get((user.as_str(), id)).map_err(redb_error)? {
                    found.push(rules::decode("user memory", body.value())?);
                }
            }
            Ok(found)
        })
        .await
    }

    async fn delete_memory(&self, user_id: &str, id: &str) -> StoreResult<()> {
        let (user, id) = (user_id.to_owned(), id.to_owned());
        self.write(move |transaction| {
            let mut memories = transaction.open_table(MEMORIES).map_err(redb_error)?;
            let memory: UserMemory = match memories.get((user.as_str(), id.as_str())).map_err(redb_error)? {
                Some(body) => rules::decode("user memory", body.value())?,
                None => return Err(StoreError::not_found("user memory", id)),
            };
            memories.remove((user.as_str(), id.as_str())).map_err(redb_error)?;
            let mut index = transaction.open_table(MEMORY_INDEX).map_err(redb_error)?;
            index
                .remove((user.as_str(), memory.created_at.unix_micros(), id.as_str()))
                .map_err(redb_error)?;
            Ok(())
        })
        .await
    }
}

fn journal_entry(
    transaction: &WriteTransaction,
    turn: TurnId,
    call: &str,
) -> StoreResult<Option<(u64, JournalEntry)>> {
    let journal = transaction.open_table(JOURNAL).map_err(redb_error)?;
    let value = journal.get((turn_key(turn), call)).map_err(redb_error)?;
    value
        .map(|value| {
            let (order, body) = value.value();
            rules::decode("journal entry", body).map(|entry| (order, entry))
        })
        .transpose()
}

/// Inserts a checked new journal entry after the turn's others, inside a write.
fn insert_journal_entry(
    transaction: &WriteTransaction,
    entry: &JournalEntry,
    body: &[u8],
) -> StoreResult<()> {
    let order = counter(transaction, "last_journal_order")? + 1;
    set_counter(transaction, "last_journal_order", order)?;
    let key = turn_key(entry.turn_id);
    let mut journal = transaction.open_table(JOURNAL).map_err(redb_error)?;
    journal.insert((key, entry.tool_call_id.as_str()), (order, body)).map_err(redb_error)?;
    let mut orders = transaction.open_table(JOURNAL_ORDER).map_err(redb_error)?;
    orders.insert((key, order), entry.tool_call_id.as_str()).map_err(redb_error)?;
    Ok(())
}

#[async_trait]
impl JournalStore for RedbStore {
    async fn journal_start(&self, entry: &JournalEntry, fence: Option<Fence>) -> StoreResult<JournalEntry> {
        let body = rules::encode("journal entry", entry)?;
        let entry = entry.clone();
        self.write(move |transaction| {
            let meta = run_meta(&transaction.open_table(RUN_META).map_err(redb_error)?, entry.turn_id)?;
            check_fence(transaction, session_of(meta), fence)?;
            let existing = journal_entry(transaction, entry.turn_id, &entry.tool_call_id)?;
            if let Some(stored) = rules::journal_start(existing.as_ref().map(|(_, e)| e), &entry)? {
                return Ok(stored);
            }
            insert_journal_entry(transaction, &entry, &body)?;
            Ok(entry)
        })
        .await
    }

    async fn journal_complete(
        &self,
        turn: TurnId,
        tool_call_id: &str,
        result: &ToolResult,
        completed_at: Timestamp,
        fence: Option<Fence>,
    ) -> StoreResult<JournalEntry> {
        rules::encode("tool result", result)?;
        let (call, result) = (tool_call_id.to_owned(), result.clone());
        self.write(move |transaction| {
            let meta = run_meta(&transaction.open_table(RUN_META).map_err(redb_error)?, turn)?;
            check_fence(transaction, session_of(meta), fence)?;
            let existing = journal_entry(transaction, turn, &call)?;
            let order = existing.as_ref().map_or(0, |(order, _)| *order);
            let (entry, changed) = rules::journal_complete(
                existing.as_ref().map(|(_, e)| e),
                turn,
                &call,
                &result,
                completed_at,
            )?;
            if changed {
                let body = rules::encode("journal entry", &entry)?;
                let mut journal = transaction.open_table(JOURNAL).map_err(redb_error)?;
                journal
                    .insert((turn_key(turn), call.as_str()), (order, body.as_slice()))
                    .map_err(redb_error)?;
            }
            Ok(entry)
        })
        .await
    }

    async fn journal(&self, turn: TurnId) -> StoreResult<Vec<JournalEntry>> {
        self.read(move |transaction| {
            let metas = transaction.open_table(RUN_META).map_err(redb_error)?;
            run_meta(&metas, turn)?;
            let key = turn_key(turn);
            let orders = transaction.open_table(JOURNAL_ORDER).map_err(redb_error)?;
            let journal = transaction.open_table(JOURNAL).map_err(redb_error)?;
            let mut entries = Vec::new();
            for entry in orders.range((key, 0)..=(key, u64::MAX)).map_err(redb_error)? {
                let (_, call) = entry.map_err(redb_error)?;
                if let Some(value) = journal.get((key, call.value())).map_err(redb_error)? {
                    entries.push(rules::decode("journal entry", value.value().1)?);
                }
            }
            Ok(entries)
        })
        .await
    }
}

/// A budget's limit and what is used.
#[derive(Serialize, Deserialize)]
struct BudgetRow {
    limit: BudgetLimit,
    used: BudgetUsage,
}

/// What a scope's reservations that hold at `now` reserve (see
/// [`rules::reservation_holds`]).
fn reserved_in(
    scopes: &impl ReadableTable<(&'static str, &'static str), ()>,
    reservations: &impl ReadableTable<&'static str, &'static [u8]>,
    leases: &impl ReadableTable<u128, &'static [u8]>,
    scope: &str,
    now: Timestamp,
) -> StoreResult<BudgetUsage> {
    let mut total = BudgetUsage::default();
    for id in scope_links(scopes, scope)? {
        if let Some(body) = reservations.get(id.as_str()).map_err(redb_error)? {
            let reservation: BudgetReservation = rules::decode("budget reservation", body.value())?;
            let lease: Option<Lease> = match reservation.lease {
                Some(fence) => get_json(leases, session_key(fence.session_id), "lease")?,
                None => None,
            };
            if rules::reservation_holds(&reservation, lease.as_ref(), now) {
                total = rules::add_usage(&total, &reservation.amount);
            }
        }
    }
    Ok(total)
}

/// The reservation ids linked to `scope`, in order. The range has no upper end (no string
/// sorts above every string: an id starting with U+10FFFF would escape
/// `..=(scope, "\u{10FFFF}")`) and stops at the first link of another scope.
fn scope_links(
    links: &impl ReadableTable<(&'static str, &'static str), ()>,
    scope: &str,
) -> StoreResult<Vec<String>> {
    let mut ids = Vec::new();
    for entry in links.range((scope, "")..).map_err(redb_error)? {
        let (key, _) = entry.map_err(redb_error)?;
        match key.value() {
            (linked, id) if linked == scope => ids.push(id.to_owned()),
            _ => break,
        }
    }
    Ok(ids)
}

/// The scopes of the ledgers `session` owns, in order (an open range, as [`scope_links`]).
fn session_scopes(
    owned: &impl ReadableTable<(u128, &'static str), ()>,
    session: u128,
) -> StoreResult<Vec<String>> {
    let mut scopes = Vec::new();
    for entry in owned.range((session, "")..).map_err(redb_error)? {
        let (key, _) = entry.map_err(redb_error)?;
        let (owner, scope) = key.value();
        if owner != session {
            break;
        }
        scopes.push(scope.to_owned());
    }
    Ok(scopes)
}

/// The ledgers a session owns and every reservation on one of them, with the links of
/// each reservation to its scopes: read, and every record decoded, before anything of the
/// deletion changes (a record that does not parse refuses the deletion untouched).
struct SessionBudgets {
    scopes: Vec<String>,
    reservations: Vec<String>,
    links: Vec<(String, String)>,
}

fn session_budgets(transaction: &WriteTransaction, session: u128) -> StoreResult<SessionBudgets> {
    let scopes = session_scopes(&transaction.open_table(SESSION_BUDGETS).map_err(redb_error)?, session)?;
    let links_table = transaction.open_table(RESERVATION_SCOPES).map_err(redb_error)?;
    let mut links = Vec::new();
    for scope in &scopes {
        links.extend(scope_links(&links_table, scope)?.into_iter().map(|id| (scope.clone(), id)));
    }
    let mut reservations: Vec<String> = links.iter().map(|(_, id)| id.clone()).collect();
    reservations.sort_unstable();
    reservations.dedup();
    let table = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
    for id in &reservations {
        // Its links to scopes of other sessions go too.
        if let Some(body) = table.get(id.as_str()).map_err(redb_error)? {
            let reservation: BudgetReservation = rules::decode("budget reservation", body.value())?;
            links.extend(reservation.scopes.into_iter().map(|scope| (scope, id.clone())));
        }
    }
    links.sort_unstable();
    links.dedup();
    Ok(SessionBudgets { scopes, reservations, links })
}

/// Deletes what [`session_budgets`] read.
fn delete_session_budgets(
    transaction: &WriteTransaction,
    session: u128,
    budgets: &SessionBudgets,
) -> StoreResult<()> {
    let mut reservations = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
    for id in &budgets.reservations {
        reservations.remove(id.as_str()).map_err(redb_error)?;
    }
    drop(reservations);
    let mut links = transaction.open_table(RESERVATION_SCOPES).map_err(redb_error)?;
    for (scope, id) in &budgets.links {
        links.remove((scope.as_str(), id.as_str())).map_err(redb_error)?;
    }
    drop(links);
    let mut ledgers = transaction.open_table(BUDGETS).map_err(redb_error)?;
    for scope in &budgets.scopes {
        ledgers.remove(scope.as_str()).map_err(redb_error)?;
    }
    drop(ledgers);
    let mut owned = transaction.open_table(SESSION_BUDGETS).map_err(redb_error)?;
    for scope in &budgets.scopes {
        owned.remove((session, scope.as_str())).map_err(redb_error)?;
    }
    Ok(())
}

fn take_reservation(transaction: &WriteTransaction, id: &str) -> StoreResult<BudgetReservation> {
    let mut reservations = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
    let reservation: BudgetReservation = match reservations.get(id).map_err(redb_error)? {
        Some(body) => rules::decode("budget reservation", body.value())?,
        None => return Err(StoreError::not_found("budget reservation", id)),
    };
    reservations.remove(id).map_err(redb_error)?;
    let mut scopes = transaction.open_table(RESERVATION_SCOPES).map_err(redb_error)?;
    for scope in &reservation.scopes {
        scopes.remove((scope.as_str(), id)).map_err(redb_error)?;
    }
    Ok(reservation)
}

#[async_trait]
impl BudgetStore for RedbStore {
    async fn create_budget(
        &self,
        scope: &str,
        limit: &BudgetLimit,
        session: Option<SessionId>,
    ) -> StoreResult<()> {
        let body = rules::encode("budget", &BudgetRow { limit: *limit, used: BudgetUsage::default() })?;
        let scope = scope.to_owned();
        self.write(move |transaction| {
            if let Some(session) = session
                && !session_exists(transaction, session)?
            {
                return Err(StoreError::not_found("session", session));
            }
            let mut budgets = transaction.open_table(BUDGETS).map_err(redb_error)?;
            if budgets.get(scope.as_str()).map_err(redb_error)?.is_some() {
                return Err(Conflict::AlreadyExists { kind: "budget", id: scope }.into());
            }
            budgets.insert(scope.as_str(), body.as_slice()).map_err(redb_error)?;
            drop(budgets);
            if let Some(session) = session {
                let mut owned = transaction.open_table(SESSION_BUDGETS).map_err(redb_error)?;
                owned.insert((session_key(session), scope.as_str()), ()).map_err(redb_error)?;
            }
            Ok(())
        })
        .await
    }

    async fn budget(&self, scope: &str, now: Timestamp) -> StoreResult<BudgetLedger> {
        let scope = scope.to_owned();
        self.read(move |transaction| {
            let budgets = transaction.open_table(BUDGETS).map_err(redb_error)?;
            let row: BudgetRow = match budgets.get(scope.as_str()).map_err(redb_error)? {
                Some(body) => rules::decode("budget", body.value())?,
                None => return Err(StoreError::not_found("budget", &scope)),
            };
            let scopes = transaction.open_table(RESERVATION_SCOPES).map_err(redb_error)?;
            let reservations = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
            let leases = transaction.open_table(LEASES).map_err(redb_error)?;
            let reserved = reserved_in(&scopes, &reservations, &leases, &scope, now)?;
            Ok(BudgetLedger { scope, limit: row.limit, used: row.used, reserved })
        })
        .await
    }

    async fn reserve(&self, reservation: &BudgetReservation, now: Timestamp) -> StoreResult<()> {
        rules::check_reservation(reservation)?;
        let body = rules::encode("budget reservation", reservation)?;
        let reservation = reservation.clone();
        self.write(move |transaction| {
            if let Some(fence) = reservation.lease {
                check_fence(transaction, fence.session_id, Some(fence))?;
            }
            let expired: Vec<String> = {
                let budgets = transaction.open_table(BUDGETS).map_err(redb_error)?;
                let scopes = transaction.open_table(RESERVATION_SCOPES).map_err(redb_error)?;
                let reservations = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
                let leases = transaction.open_table(LEASES).map_err(redb_error)?;
                if reservations.get(reservation.id.as_str()).map_err(redb_error)?.is_some() {
                    return Err(Conflict::AlreadyExists {
                        kind: "budget reservation",
                        id: reservation.id.clone(),
                    }
                    .into());
                }
                for scope in &reservation.scopes {
                    let row: BudgetRow = match budgets.get(scope.as_str()).map_err(redb_error)? {
                        Some(body) => rules::decode("budget", body.value())?,
                        None => return Err(StoreError::not_found("budget", scope)),
                    };
                    let held = rules::add_usage(
                        &row.used,
                        &reserved_in(&scopes, &reservations, &leases, scope, now)?,
                    );
                    rules::check_room(scope, &row.limit, &held, &reservation.amount)?;
                }
                // Expired reservations are dropped. One whose lease ended stays until it
                // expires, holding nothing: its holder may still settle what its step used.
                // One that does not decode is left alone here: it refuses the reservations
                // of its own scopes (what they hold is not known), not everyone's.
                let mut expired = Vec::new();
                for entry in reservations.iter().map_err(redb_error)? {
                    let (id, body) = entry.map_err(redb_error)?;
                    let Ok(existing) = rules::decode::<BudgetReservation>("budget reservation", body.value())
                    else {
                        continue;
                    };
                    if existing.expires_at <= now {
                        expired.push(id.value().to_owned());
                    }
                }
                expired
            };
            for id in expired {
                take_reservation(transaction, &id)?;
            }
            let mut reservations = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
            reservations.insert(reservation.id.as_str(), body.as_slice()).map_err(redb_error)?;
            let mut scopes = transaction.open_table(RESERVATION_SCOPES).map_err(redb_error)?;
            for scope in &reservation.scopes {
                scopes.insert((scope.as_str(), reservation.id.as_str()), ()).map_err(redb_error)?;
            }
            Ok(())
        })
        .await
    }

    async fn settle(&self, reservation_id: &str, actual: &BudgetUsage) -> StoreResult<()> {
        rules::check_amount(actual)?;
        let (id, actual) = (reservation_id.to_owned(), *actual);
        self.write(move |transaction| {
            let scopes = {
                let reservations = transaction.open_table(RESERVATIONS).map_err(redb_error)?;
                match reservations.get(id.as_str()).map_err(redb_error)? {
                    Some(body) => {
                        rules::decode::<BudgetReservation>("budget reservation", body.value())?.scopes
                    }
                    None => return Err(StoreError::not_found("budget reservation", &id)),
                }
            };
            let mut updates = Vec::new();
            {
                let budgets = transaction.open_table(BUDGETS).map_err(redb_error)?;
                for scope in &scopes {
                    if let Some(body) = budgets.get(scope.as_str()).map_err(redb_error)? {
                        let mut row: BudgetRow = rules::decode("budget", body.value())?;
                        row.used = rules::add_usage(&row.used, &actual);
                        updates.push((scope.clone(), rules::encode("budget", &row)?));
                    }
                }
            }
            take_reservation(transaction, &id)?;
            let mut budgets = transaction.open_table(BUDGETS).map_err(redb_error)?;
            for (scope, body) in updates {
                budgets.insert(scope.as_str(), body.as_slice()).map_err(redb_error)?;
            }
            Ok(())
        })
        .await
    }

    async fn release(&self, reservation_id: &str) -> StoreResult<()> {
        let id = reservation_id.to_owned();
        self.write(move |transaction| take_reservation(transaction, &id).map(|_| ())).await
    }
}

fn put_lease(transaction: &WriteTransaction, lease: &Lease, body: &[u8]) -> StoreResult<()> {
    let mut leases = transaction.open_table(LEASES).map_err(redb_error)?;
    leases.insert(session_key(lease.session_id), body).map_err(redb_error)?;
    Ok(())
}

/// Nothing to do: redb commits into its file, with no log beside it.
impl agentry_memory::Checkpoint for RedbStore {}

#[async_trait]
impl LeaseStore for RedbStore {
    async fn acquire_lease(
        &self,
        session: SessionId,
        owner: &str,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease> {
        let owner = owner.to_owned();
        self.write(move |transaction| {
            if !session_exists(transaction, session)? {
                return Err(StoreError::not_found("session", session));
            }
            let last = counter(transaction, "last_token")?;
            let lease = rules::grant_lease(
                session,
                lease_of(transaction, session)?.as_ref(),
                &owner,
                ttl,
                now,
                last + 1,
            )?;
            let body = rules::encode("lease", &lease)?;
            set_counter(transaction, "last_token", lease.token)?;
            put_lease(transaction, &lease, &body)?;
            Ok(lease)
        })
        .await
    }

    async fn renew_lease(
        &self,
        session: SessionId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease> {
        self.write(move |transaction| {
            let lease =
                rules::renew_lease(session, lease_of(transaction, session)?.as_ref(), token, ttl, now)?;
            let body = rules::encode("lease", &lease)?;
            put_lease(transaction, &lease, &body)?;
            Ok(lease)
        })
        .await
    }

    async fn release_lease(&self, session: SessionId, token: u64) -> StoreResult<()> {
        self.write(move |transaction| {
            rules::check_release(session, lease_of(transaction, session)?.as_ref(), token)?;
            let mut leases = transaction.open_table(LEASES).map_err(redb_error)?;
            leases.remove(session_key(session)).map_err(redb_error)?;
            Ok(())
        })
        .await
    }

    async fn lease(&self, session: SessionId) -> StoreResult<Option<Lease>> {
        self.read_sized(true, move |transaction| {
            let leases = transaction.open_table(LEASES).map_err(redb_error)?;
            get_json(&leases, session_key(session), "lease")
        })
        .await
    }

    async fn list_leases(&self, after: Option<SessionId>, limit: usize) -> StoreResult<Vec<Lease>> {
        self.read(move |transaction| {
            let leases = transaction.open_table(LEASES).map_err(redb_error)?;
            let range = match after.map(session_key) {
                Some(u128::MAX) => return Ok(Vec::new()),
                Some(after) => leases.range(after + 1..),
                None => leases.range::<u128>(..),
            }
            .map_err(redb_error)?;
            let mut found = Vec::new();
            for entry in range.take(limit) {
                let (_, body) = entry.map_err(redb_error)?;
                found.push(rules::decode("lease", body.value())?);
            }
            Ok(found)
        })
        .await
    }
}
