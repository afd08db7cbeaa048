//! [`InMemoryStore`]: the reference implementation of the storage traits, kept in process
//! memory. Nothing survives the process; everything else behaves as the durable backends.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agentry_events::EventEnvelope;
use agentry_types::{
    BudgetLedger, BudgetLimit, BudgetReservation, BudgetUsage, Fence, HistoryMessage, JournalEntry, Lease,
    Message, RunRecord, SessionId, SessionRecord, Timestamp, ToolResult, TurnId, UserMemory, UserProfile,
};
use async_trait::async_trait;
// Keyed by ids this process made, and in this reference store by user ids and budget
// scopes: nothing a client picks to collide.
use foldhash::HashMap;

use crate::error::{Conflict, StoreError, StoreResult};
use crate::page::{Order, Page, PageRequest, decode_token};
use crate::rules;
use crate::store::{
    BudgetStore, EventStore, FeedQuery, HistoryQuery, JournalStore, LeaseStore, MessageStore, ParentFilter,
    RunQuery, RunStore, SessionQuery, SessionStore, SessionUpdate, StoredEvent, TurnStart, TurnStep,
    UserStore,
};

#[derive(Debug)]
struct RunRow {
    /// Shared with the step that stored it: a turn's record is not copied for the store.
    record: Arc<RunRecord>,
    last_seq: u64,
    high_water: u64,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<SessionId, SessionRecord>,
    /// (created_at, id) of every session, for newest-first listing.
    session_index: BTreeSet<(Timestamp, SessionId)>,
    /// The same for each owner's sessions.
    owner_index: HashMap<String, BTreeSet<(Timestamp, SessionId)>>,
    runs: HashMap<TurnId, RunRow>,
    /// Each session's runs by creation order.
    session_runs: HashMap<SessionId, BTreeMap<u64, TurnId>>,
    /// Each run's member runs by creation order (a run's parent is fixed).
    member_runs: HashMap<TurnId, BTreeMap<u64, TurnId>>,
    next_run_order: u64,
    events: BTreeMap<u64, Arc<EventEnvelope>>,
    turn_events: HashMap<TurnId, BTreeMap<u64, u64>>,
    session_events: HashMap<SessionId, BTreeSet<u64>>,
    next_position: u64,
    /// Shared with the history windows read from them: a window copies no message.
    messages: HashMap<TurnId, Vec<Arc<Message>>>,
    profiles: HashMap<String, UserProfile>,
    memories: HashMap<String, BTreeMap<(Timestamp, String), UserMemory>>,
    journal: HashMap<TurnId, Vec<JournalEntry>>,
    budgets: HashMap<String, (BudgetLimit, BudgetUsage)>,
    /// The ledgers each session owns.
    session_budgets: HashMap<SessionId, Vec<String>>,
    reservations: HashMap<String, BudgetReservation>,
    leases: BTreeMap<SessionId, Lease>,
    last_token: u64,
}

impl State {
    fn run(&self, id: TurnId) -> StoreResult<&RunRow> {
        self.runs.get(&id).ok_or_else(|| StoreError::not_found("run", id))
    }

    /// Stores checked events of a turn under new positions and raises its last `seq`.
    /// Stores checked events (shared with the caller when it gave them shared).
    fn insert_events(
        &mut self,
        turn: TurnId,
        session: SessionId,
        events: impl ExactSizeIterator<Item = Arc<EventEnvelope>>,
    ) -> Vec<u64> {
        if events.len() == 0 {
            return Vec::new();
        }
        let mut positions = Vec::with_capacity(events.len());
        let mut last_seq = None;
        let by_turn = self.turn_events.entry(turn).or_default();
        let by_session = self.session_events.entry(session).or_default();
        for event in events {
            self.next_position += 1;
            let position = self.next_position;
            by_turn.insert(event.seq, position);
            by_session.insert(position);
            last_seq = Some(event.seq);
            self.events.insert(position, event);
            positions.push(position);
        }
        if let (Some(last), Some(row)) = (last_seq, self.runs.get_mut(&turn)) {
            row.last_seq = last;
            row.high_water = row.high_water.max(last);
        }
        positions
    }

    /// A top-level run written: its session shows it as its latest activity (see
    /// [`SessionStore::get_session`]).
    fn touch_session(&mut self, run: &RunRecord) {
        if run.parent_run_id.is_none()
            && let Some(session) = self.sessions.get_mut(&run.session_id)
        {
            session.updated_at = session.updated_at.max(run.updated_at);
        }
    }

    /// Stores a new run (checked) after the session's others.
    fn insert_run(&mut self, run: Arc<RunRecord>) {
        self.next_run_order += 1;
        let order = self.next_run_order;
        self.session_runs.entry(run.session_id).or_default().insert(order, run.id);
        if let Some(parent) = run.parent_run_id {
            self.member_runs.entry(parent).or_default().insert(order, run.id);
        }
        self.runs.insert(run.id, RunRow { record: run, last_seq: 0, high_water: 0 });
    }

    /// Drops a deleted member run (created `order`th) from its parent's index.
    fn forget_member(&mut self, parent: TurnId, order: u64) {
        if let Some(members) = self.member_runs.get_mut(&parent) {
            members.remove(&order);
            if members.is_empty() {
                self.member_runs.remove(&parent);
            }
        }
    }

    fn fence(&self, session: SessionId, fence: Option<Fence>) -> StoreResult<()> {
        rules::check_fence(session, self.leases.get(&session), fence)
    }

    fn reserved(&self, scope: &str, now: Timestamp) -> BudgetUsage {
        self.reservations
            .values()
            .filter(|reservation| {
                reservation.scopes.iter().any(|s| s == scope) && self.holds(reservation, now)
            })
            .fold(BudgetUsage::default(), |total, reservation| rules::add_usage(&total, &reservation.amount))
    }

    fn holds(&self, reservation: &BudgetReservation, now: Timestamp) -> bool {
        let lease = reservation.lease.and_then(|fence| self.leases.get(&fence.session_id));
        rules::reservation_holds(reservation, lease, now)
    }
}

/// A store in process memory.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    state: Mutex<State>,
}

impl InMemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every write
        // validates first and mutates last, so the state stays consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl SessionStore for InMemoryStore {
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()> {
        rules::check_size("session", session)?;
        let mut state = self.state();
        if state.sessions.contains_key(&session.id) {
            return Err(Conflict::AlreadyExists { kind: "session", id: session.id.to_string() }.into());
        }
        state.session_index.insert((session.created_at, session.id));
        state
            .owner_index
            .entry(session.owner.subject_id.clone())
            .or_default()
            .insert((session.created_at, session.id));
        state.sessions.insert(session.id, session.clone());
        Ok(())
    }

    async fn get_session(&self, id: SessionId) -> StoreResult<SessionRecord> {
        self.state().sessions.get(&id).cloned().ok_or_else(|| StoreError::not_found("session", id))
    }

    async fn update_session(&self, id: SessionId, update: &SessionUpdate) -> StoreResult<SessionRecord> {
        let mut state = self.state();
        let mut session =
            state.sessions.get(&id).cloned().ok_or_else(|| StoreError::not_found("session", id))?;
        rules::check_fence(id, state.leases.get(&id), update.fence)?;
        update.apply(&mut session, Timestamp::now());
        rules::check_size("session", &session)?;
        state.sessions.insert(id, session.clone());
        Ok(session)
    }

    async fn delete_session(&self, id: SessionId) -> StoreResult<()> {
        let mut state = self.state();
        let session = state.sessions.remove(&id).ok_or_else(|| StoreError::not_found("session", id))?;
        state.session_index.remove(&(session.created_at, id));
        if let Some(owned) = state.owner_index.get_mut(&session.owner.subject_id) {
            owned.remove(&(session.created_at, id));
            if owned.is_empty() {
                state.owner_index.remove(&session.owner.subject_id);
            }
        }
        for (order, run) in state.session_runs.remove(&id).unwrap_or_default() {
            let parent = state.runs.remove(&run).and_then(|row| row.record.parent_run_id);
            if let Some(parent) = parent {
                state.forget_member(parent, order);
            }
            state.turn_events.remove(&run);
            state.messages.remove(&run);
            state.journal.remove(&run);
        }
        for position in state.session_events.remove(&id).unwrap_or_default() {
            state.events.remove(&position);
        }
        state.leases.remove(&id);
        let scopes = state.session_budgets.remove(&id).unwrap_or_default();
        for scope in &scopes {
            state.budgets.remove(scope);
        }
        state
            .reservations
            .retain(|_, reservation| !reservation.scopes.iter().any(|scope| scopes.contains(scope)));
        Ok(())
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
            Some(token) => Some(session_key(&decode_token(&kind, token)?, token)?),
            None => None,
        };
        let state = self.state();
        let empty = BTreeSet::new();
        let index = match &query.owner {
            Some(owner) => state.owner_index.get(owner).unwrap_or(&empty),
            None => &state.session_index,
        };
        // The creation bounds, cut at the cursor, bound the range read.
        let low = (
            query.created_from.unwrap_or(Timestamp::from_unix_micros(i64::MIN)),
            SessionId::from_uuid(uuid::Uuid::nil()),
        );
        let high = (
            query.created_until.unwrap_or(Timestamp::from_unix_micros(i64::MAX)),
            SessionId::from_uuid(uuid::Uuid::from_u128(u128::MAX)),
        );
        let keys: Box<dyn Iterator<Item = &(Timestamp, SessionId)>> =
            match rules::listing_range(low, high, after, query.oldest_first) {
                Some(range) if query.oldest_first => Box::new(index.range(range)),
                Some(range) => Box::new(index.range(range).rev()),
                None => Box::new(std::iter::empty()),
            };
        let items: Vec<SessionRecord> = keys
            .filter_map(|(_, id)| state.sessions.get(id))
            .filter(|session| query.matches(session))
            .take(limit + 1)
            .cloned()
            .collect();
        Ok(Page::from_lookahead(items, limit, &kind, |s| format!("{}:{}", s.created_at.unix_micros(), s.id)))
    }
}

/// Parses a session listing key `micros:id`.
pub(crate) fn session_key(key: &str, token: &str) -> StoreResult<(Timestamp, SessionId)> {
    let invalid = || StoreError::InvalidInput(format!("invalid page token {token:?}"));
    let (micros, id) = key.split_once(':').ok_or_else(invalid)?;
    Ok((
        Timestamp::from_unix_micros(micros.parse().map_err(|_| invalid())?),
        id.parse().map_err(|_| invalid())?,
    ))
}

#[async_trait]
impl RunStore for InMemoryStore {
    async fn put_run(&self, run: &RunRecord, fence: Option<Fence>) -> StoreResult<()> {
        rules::check_size("run", run)?;
        let mut state = self.state();
        if !state.sessions.contains_key(&run.session_id) {
            return Err(StoreError::not_found("session", run.session_id));
        }
        state.fence(run.session_id, fence)?;
        if let Some(row) = state.runs.get_mut(&run.id) {
            rules::check_run_session_id(run.id, run.session_id, row.record.session_id)?;
            rules::check_run_parent(run.id, run.parent_run_id, row.record.parent_run_id)?;
            row.record = Arc::new(run.clone());
        } else {
            state.insert_run(Arc::new(run.clone()));
        }
        state.touch_session(run);
        Ok(())
    }

    async fn get_run(&self, id: TurnId) -> StoreResult<RunRecord> {
        Ok(RunRecord::clone(&self.state().run(id)?.record))
    }

    async fn list_runs(
        &self,
        session: SessionId,
        query: &RunQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<RunRecord>> {
        let limit = page.effective_limit();
        let kind = crate::page::runs_kind(session, query.order);
        let after: Option<u64> = crate::page::decode_key(&kind, page)?;
        let state = self.state();
        if !state.sessions.contains_key(&session) {
            return Err(StoreError::not_found("session", session));
        }
        let empty = BTreeMap::new();
        let runs = match query.parent {
            ParentFilter::Of(parent) => state.member_runs.get(&parent),
            ParentFilter::TopLevel | ParentFilter::Any => state.session_runs.get(&session),
        }
        .unwrap_or(&empty);
        let ordered: Box<dyn Iterator<Item = (&u64, &TurnId)>> = match (query.order, after) {
            (Order::Asc, None) => Box::new(runs.iter()),
            (Order::Asc, Some(after)) => Box::new(runs.range(after.saturating_add(1)..)),
            (Order::Desc, None) => Box::new(runs.iter().rev()),
            (Order::Desc, Some(after)) => Box::new(runs.range(..after).rev()),
        };
        let items: Vec<(u64, RunRecord)> = ordered
            .filter_map(|(order, id)| state.runs.get(id).map(|row| (*order, row)))
            // A parent's members may lie in other sessions too.
            .filter(|(_, row)| row.record.session_id == session && query.matches(&row.record))
            .take(limit + 1)
            .map(|(order, row)| (order, RunRecord::clone(&row.record)))
            .collect();
        let page = Page::from_lookahead(items, limit, &kind, |(order, _)| order.to_string());
        Ok(Page { items: page.items.into_iter().map(|(_, run)| run).collect(), next_token: page.next_token })
    }
}

#[async_trait]
impl EventStore for InMemoryStore {
    async fn append_events(
        &self,
        turn: TurnId,
        events: &[EventEnvelope],
        fence: Option<Fence>,
    ) -> StoreResult<Vec<u64>> {
        for event in events {
            rules::check_event_size(event)?;
        }
        let mut state = self.state();
        let row = state.run(turn)?;
        let session = row.record.session_id;
        let last_seq = row.last_seq;
        state.fence(session, fence)?;
        rules::check_event_batch(turn, session, last_seq, events.iter().map(rules::EventKey::of))?;
        Ok(state.insert_events(turn, session, events.iter().map(|event| Arc::new(event.clone()))))
    }

    async fn turn_events(
        &self,
        turn: TurnId,
        order: Order,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredEvent>> {
        let state = self.state();
        state.run(turn)?;
        let empty = BTreeMap::new();
        let events = state.turn_events.get(&turn).unwrap_or(&empty);
        let ordered: Box<dyn Iterator<Item = (&u64, &u64)>> = match (order, after) {
            (Order::Asc, None) => Box::new(events.iter()),
            (Order::Asc, Some(after)) => Box::new(events.range(after.saturating_add(1)..)),
            (Order::Desc, None) => Box::new(events.iter().rev()),
            (Order::Desc, Some(after)) => Box::new(events.range(..after).rev()),
        };
        Ok(ordered
            .take(limit)
            .filter_map(|(_, position)| {
                state
                    .events
                    .get(position)
                    .map(|event| StoredEvent { position: *position, event: EventEnvelope::clone(event) })
            })
            .collect())
    }

    async fn feed(&self, query: &FeedQuery, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let state = self.state();
        let positions: Box<dyn Iterator<Item = u64>> = match query.session_id {
            Some(session) => match state.session_events.get(&session) {
                Some(set) => match (query.order, query.after) {
                    (Order::Asc, None) => Box::new(set.iter().copied()),
                    (Order::Asc, Some(after)) => Box::new(set.range(after.saturating_add(1)..).copied()),
                    (Order::Desc, None) => Box::new(set.iter().rev().copied()),
                    (Order::Desc, Some(after)) => Box::new(set.range(..after).rev().copied()),
                },
                None => Box::new(std::iter::empty()),
            },
            None => match (query.order, query.after) {
                (Order::Asc, None) => Box::new(state.events.keys().copied()),
                (Order::Asc, Some(after)) => {
                    Box::new(state.events.range(after.saturating_add(1)..).map(|(p, _)| *p))
                }
                (Order::Desc, None) => Box::new(state.events.keys().rev().copied()),
                (Order::Desc, Some(after)) => Box::new(state.events.range(..after).rev().map(|(p, _)| *p)),
            },
        };
        Ok(positions
            .take(limit)
            .filter_map(|position| {
                state
                    .events
                    .get(&position)
                    .map(|event| StoredEvent { position, event: EventEnvelope::clone(event) })
            })
            .collect())
    }

    async fn raise_high_water(&self, turn: TurnId, seq: u64, fence: Option<Fence>) -> StoreResult<u64> {
        rules::check_seq(seq)?;
        let mut state = self.state();
        let session = state.run(turn)?.record.session_id;
        state.fence(session, fence)?;
        let row = state.runs.get_mut(&turn).ok_or_else(|| StoreError::not_found("run", turn))?;
        row.high_water = row.high_water.max(seq);
        Ok(row.high_water)
    }

    async fn high_water(&self, turn: TurnId) -> StoreResult<u64> {
        let state = self.state();
        let row = state.run(turn)?;
        Ok(row.high_water.max(row.last_seq))
    }

    async fn write_step(&self, turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<Vec<u64>> {
        rules::check_step_shape(turn, step, fence)?;
        check_step_sizes(step)?;
        self.state().write_step(turn, step, fence)
    }

    async fn start_turn(
        &self,
        turn: TurnId,
        step: &TurnStep,
        start: &TurnStart,
    ) -> StoreResult<(Lease, Vec<u64>)> {
        let session = rules::check_start_shape(turn, step)?.session_id;
        check_step_sizes(step)?;
        let mut state = self.state();
        let facts = rules::StartFacts {
            session_exists: state.sessions.contains_key(&session),
            lease: state.leases.get(&session),
            last_token: state.last_token,
            run_exists: state.runs.contains_key(&turn),
        };
        let lease = rules::check_turn_start(turn, session, start, &facts, || Ok(state.latest_turn(session)))?;
        // The lease is new, so no fence is needed; the step checks everything before it
        // changes anything, and nothing below can fail.
        let positions = state.write_step(turn, step, None)?;
        state.last_token = lease.token;
        state.leases.insert(session, lease.clone());
        Ok((lease, positions))
    }
}

/// The size checks of a step's records.
fn check_step_sizes(step: &TurnStep) -> StoreResult<()> {
    for message in &step.messages {
        rules::check_size("message", message)?;
    }
    for event in &step.events {
        rules::check_event_size(event)?;
    }
    if let Some(run) = &step.run {
        rules::check_size("run", &**run)?;
    }
    for entry in &step.journal {
        rules::check_size("journal entry", entry)?;
    }
    Ok(())
}

impl State {
    /// [`EventStore::write_step`] after the checks that need no state. Everything is
    /// checked before anything changes: the step is stored whole or not.
    fn write_step(&mut self, turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<Vec<u64>> {
        let (session, last_seq, new_run) = match (self.runs.get(&turn), &step.run) {
            (Some(row), run) => {
                let session = row.record.session_id;
                if let Some(run) = run {
                    rules::check_run_session_id(turn, run.session_id, session)?;
                    rules::check_run_parent(turn, run.parent_run_id, row.record.parent_run_id)?;
                }
                (session, row.last_seq, None)
            }
            // The turn's first step creates its run.
            (None, Some(run)) => {
                if !self.sessions.contains_key(&run.session_id) {
                    return Err(StoreError::not_found("session", run.session_id));
                }
                (run.session_id, 0, Some(run))
            }
            (None, None) => return Err(StoreError::not_found("run", turn)),
        };
        // The fence first: a holder that lost the lease learns that, whatever its seqs.
        self.fence(session, fence)?;
        rules::check_event_batch(
            turn,
            session,
            last_seq,
            step.events.iter().map(|event| rules::EventKey::of(event)),
        )?;
        let journal = self.journal.get(&turn);
        let writes = rules::journal_writes(&step.journal, |call| {
            let stored = journal.and_then(|journal| {
                journal.iter().enumerate().find(|(_, stored)| stored.tool_call_id == call)
            });
            Ok(stored.map(|(index, stored)| (index, stored.clone())))
        })?;
        if !writes.is_empty() {
            let journal = self.journal.entry(turn).or_default();
            for (index, entry) in writes {
                match index.and_then(|index| journal.get_mut(index)) {
                    Some(stored) => *stored = entry,
                    None => journal.push(entry),
                }
            }
        }
        let created = new_run.is_some();
        if let Some(run) = new_run {
            self.insert_run(Arc::clone(run));
        }
        if !step.messages.is_empty() {
            self.messages.entry(turn).or_default().extend(step.messages.iter().cloned());
        }
        let positions = self.insert_events(turn, session, step.events.iter().cloned());
        let row = self.runs.get_mut(&turn).ok_or_else(|| StoreError::not_found("run", turn))?;
        row.high_water = row.high_water.max(step.high_water.unwrap_or(0));
        // A run this step created already holds the record.
        if let Some(run) = step.run.as_ref().filter(|_| !created) {
            row.record = Arc::clone(run);
        }
        if let Some(run) = &step.run {
            self.touch_session(run);
        }
        if step.release_lease {
            self.leases.remove(&session);
        }
        Ok(positions)
    }

    /// The session's newest top-level run.
    fn latest_turn(&self, session: SessionId) -> Option<TurnId> {
        let runs = self.session_runs.get(&session)?;
        runs.values()
            .rev()
            .copied()
            .find(|id| self.runs.get(id).is_some_and(|row| row.record.parent_run_id.is_none()))
    }
}

#[async_trait]
impl MessageStore for InMemoryStore {
    async fn append_messages(
        &self,
        run: TurnId,
        messages: &[Arc<Message>],
        fence: Option<Fence>,
    ) -> StoreResult<()> {
        for message in messages {
            rules::check_size("message", message)?;
        }
        let mut state = self.state();
        let session = state.run(run)?.record.session_id;
        state.fence(session, fence)?;
        state.messages.entry(run).or_default().extend(messages.iter().cloned());
        Ok(())
    }

    async fn history(&self, session: SessionId, query: &HistoryQuery) -> StoreResult<Vec<HistoryMessage>> {
        let state = self.state();
        if !state.sessions.contains_key(&session) {
            return Err(StoreError::not_found("session", session));
        }
        let empty = BTreeMap::new();
        let runs = state
            .session_runs
            .get(&session)
            .unwrap_or(&empty)
            .values()
            .rev()
            .map(|id| state.run(*id).map(|row| &*row.record))
            // Member runs are not looked at unless the window takes them.
            .filter(|run| {
                query.include_member_runs || !matches!(run, Ok(run) if run.parent_run_id.is_some())
            });
        rules::history_window(runs, query, |run, window| {
            if let Some(messages) = state.messages.get(&run) {
                window.extend(messages.iter().enumerate().map(|(index, message)| HistoryMessage {
                    run_id: run,
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    message: Arc::clone(message),
                }));
            }
            Ok(())
        })
    }
}

#[async_trait]
impl UserStore for InMemoryStore {
    async fn profile(&self, user_id: &str) -> StoreResult<Option<UserProfile>> {
        Ok(self.state().profiles.get(user_id).cloned())
    }

    async fn put_profile(&self, profile: &UserProfile) -> StoreResult<()> {
        rules::check_size("user profile", profile)?;
        self.state().profiles.insert(profile.user_id.clone(), profile.clone());
        Ok(())
    }

    async fn merge_profile(&self, patch: &UserProfile) -> StoreResult<UserProfile> {
        rules::check_profile_patch(patch)?;
        let mut state = self.state();
        let merged = rules::merged_profile(state.profiles.get(&patch.user_id).cloned(), patch);
        rules::check_size("user profile", &merged)?;
        state.profiles.insert(patch.user_id.clone(), merged.clone());
        Ok(merged)
    }

    async fn add_memory(&self, memory: &UserMemory) -> StoreResult<()> {
        rules::check_size("user memory", memory)?;
        let mut state = self.state();
        let memories = state.memories.entry(memory.user_id.clone()).or_default();
        if memories.values().any(|existing| existing.id == memory.id) {
            return Err(Conflict::AlreadyExists { kind: "user memory", id: memory.id.clone() }.into());
        }
        memories.insert((memory.created_at, memory.id.clone()), memory.clone());
        Ok(())
    }

    async fn memories(&self, user_id: &str, limit: usize) -> StoreResult<Vec<UserMemory>> {
        let state = self.state();
        Ok(state
            .memories
            .get(user_id)
            .map(|memories| memories.values().rev().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn delete_memory(&self, user_id: &str, id: &str) -> StoreResult<()> {
        let mut state = self.state();
        let memories = state.memories.get_mut(user_id);
        let key = memories
            .as_ref()
            .and_then(|m| m.iter().find(|(_, memory)| memory.id == id).map(|(k, _)| k.clone()));
        match (memories, key) {
            (Some(memories), Some(key)) => {
                memories.remove(&key);
                Ok(())
            }
            _ => Err(StoreError::not_found("user memory", id)),
        }
    }
}

#[async_trait]
impl JournalStore for InMemoryStore {
    async fn journal_start(&self, entry: &JournalEntry, fence: Option<Fence>) -> StoreResult<JournalEntry> {
        rules::check_size("journal entry", entry)?;
        let mut state = self.state();
        let session = state.run(entry.turn_id)?.record.session_id;
        state.fence(session, fence)?;
        let journal = state.journal.entry(entry.turn_id).or_default();
        let existing = journal.iter().find(|stored| stored.tool_call_id == entry.tool_call_id);
        if let Some(stored) = rules::journal_start(existing, entry)? {
            return Ok(stored);
        }
        journal.push(entry.clone());
        Ok(entry.clone())
    }

    async fn journal_complete(
        &self,
        turn: TurnId,
        tool_call_id: &str,
        result: &ToolResult,
        completed_at: Timestamp,
        fence: Option<Fence>,
    ) -> StoreResult<JournalEntry> {
        rules::check_size("tool result", result)?;
        let mut state = self.state();
        let session = state.run(turn)?.record.session_id;
        state.fence(session, fence)?;
        let journal = state.journal.entry(turn).or_default();
        let slot = journal.iter_mut().find(|stored| stored.tool_call_id == tool_call_id);
        let (completed, _) =
            rules::journal_complete(slot.as_deref(), turn, tool_call_id, result, completed_at)?;
        if let Some(slot) = slot {
            *slot = completed.clone();
        }
        Ok(completed)
    }

    async fn journal(&self, turn: TurnId) -> StoreResult<Vec<JournalEntry>> {
        let state = self.state();
        state.run(turn)?;
        Ok(state.journal.get(&turn).cloned().unwrap_or_default())
    }
}

#[async_trait]
impl BudgetStore for InMemoryStore {
    async fn create_budget(
        &self,
        scope: &str,
        limit: &BudgetLimit,
        session: Option<SessionId>,
    ) -> StoreResult<()> {
        let mut state = self.state();
        if let Some(session) = session
            && !state.sessions.contains_key(&session)
        {
            return Err(StoreError::not_found("session", session));
        }
        if state.budgets.contains_key(scope) {
            return Err(Conflict::AlreadyExists { kind: "budget", id: scope.to_owned() }.into());
        }
        if let Some(session) = session {
            state.session_budgets.entry(session).or_default().push(scope.to_owned());
        }
        state.budgets.insert(scope.to_owned(), (*limit, BudgetUsage::default()));
        Ok(())
    }

    async fn budget(&self, scope: &str, now: Timestamp) -> StoreResult<BudgetLedger> {
        let state = self.state();
        let (limit, used) = state.budgets.get(scope).ok_or_else(|| StoreError::not_found("budget", scope))?;
        Ok(BudgetLedger {
            scope: scope.to_owned(),
            limit: *limit,
            used: *used,
            reserved: state.reserved(scope, now),
        })
    }

    async fn reserve(&self, reservation: &BudgetReservation, now: Timestamp) -> StoreResult<()> {
        rules::check_reservation(reservation)?;
        let mut state = self.state();
        if let Some(fence) = reservation.lease {
            state.fence(fence.session_id, Some(fence))?;
        }
        if state.reservations.contains_key(&reservation.id) {
            return Err(
                Conflict::AlreadyExists { kind: "budget reservation", id: reservation.id.clone() }.into()
            );
        }
        for scope in &reservation.scopes {
            let (limit, used) =
                state.budgets.get(scope).ok_or_else(|| StoreError::not_found("budget", scope))?;
            let held = rules::add_usage(used, &state.reserved(scope, now));
            rules::check_room(scope, limit, &held, &reservation.amount)?;
        }
        // Expired reservations are dropped. One whose lease ended stays until it expires,
        // holding nothing: its holder may still settle what its step really used.
        state.reservations.retain(|_, existing| existing.expires_at > now);
        state.reservations.insert(reservation.id.clone(), reservation.clone());
        Ok(())
    }

    async fn settle(&self, reservation_id: &str, actual: &BudgetUsage) -> StoreResult<()> {
        rules::check_amount(actual)?;
        let mut state = self.state();
        let reservation = state
            .reservations
            .remove(reservation_id)
            .ok_or_else(|| StoreError::not_found("budget reservation", reservation_id))?;
        for scope in &reservation.scopes {
            if let Some((_, used)) = state.budgets.get_mut(scope) {
                *used = rules::add_usage(used, actual);
            }
        }
        Ok(())
    }

    async fn release(&self, reservation_id: &str) -> StoreResult<()> {
        self.state()
            .reservations
            .remove(reservation_id)
            .map(|_| ())
            .ok_or_else(|| StoreError::not_found("budget reservation", reservation_id))
    }
}

/// Nothing to make whole: the store is the process's memory.
impl crate::Checkpoint for InMemoryStore {}

#[async_trait]
impl LeaseStore for InMemoryStore {
    async fn acquire_lease(
        &self,
        session: SessionId,
        owner: &str,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease> {
        let mut state = self.state();
        if !state.sessions.contains_key(&session) {
            return Err(StoreError::not_found("session", session));
        }
        let lease =
            rules::grant_lease(session, state.leases.get(&session), owner, ttl, now, state.last_token + 1)?;
        state.last_token = lease.token;
        state.leases.insert(session, lease.clone());
        Ok(lease)
    }

    async fn renew_lease(
        &self,
        session: SessionId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease> {
        let mut state = self.state();
        let lease = rules::renew_lease(session, state.leases.get(&session), token, ttl, now)?;
        state.leases.insert(session, lease.clone());
        Ok(lease)
    }

    async fn release_lease(&self, session: SessionId, token: u64) -> StoreResult<()> {
        let mut state = self.state();
        rules::check_release(session, state.leases.get(&session), token)?;
        state.leases.remove(&session);
        Ok(())
    }

    async fn lease(&self, session: SessionId) -> StoreResult<Option<Lease>> {
        Ok(self.state().leases.get(&session).cloned())
    }

    async fn list_leases(&self, after: Option<SessionId>, limit: usize) -> StoreResult<Vec<Lease>> {
        let state = self.state();
        let from = match after {
            Some(after) => Bound::Excluded(after),
            None => Bound::Unbounded,
        };
        Ok(state.leases.range((from, Bound::Unbounded)).take(limit).map(|(_, lease)| lease.clone()).collect())
    }
}
