//! The runtime API (seed 002): sessions, turns, streams, cancellation and recovery.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use agentry_events::{EventEnvelope, TurnEmitter, TurnSequencer};
use agentry_memory::{
    Conflict, MAX_RECORD_BYTES, Order, Page, PageRequest, RunQuery, SessionQuery, SessionUpdate, Store,
    StoreError, TurnStart, TurnStep, rules,
};
use agentry_types::{
    CancellationReason, ClientContext, EventId, Lease, RunRecord, RunStatus, SessionId, SessionRecord,
    SessionType, Subject, Timestamp, ToolSpec, TurnId, TurnInputItem, TurnState,
};
// Keyed by turn and session ids this process made, and agent names: nothing a client
// picks to collide.
use foldhash::{HashMap, HashSet};
use serde_json::{Map, Value};

use crate::agent::Agent;
use crate::engine::{CancelWatch, Start, TurnEngine, TurnSink, first_step};
use crate::error::{RunnerError, RuntimeResult};
use crate::input::{check_against_previous, check_shape};
use crate::live::{EventStream, LiveTurn, stored_events, subscribe};

/// The session-state key that marks a cancelled session.
const CANCELLED_KEY: &str = "agentry.cancelled";

/// What a turn's record may gain between its start and its end when the end is as small as
/// it gets (an error state without output or metrics): a new turn whose record, input
/// included, leaves less room than this is refused as too large.
const END_STATE_ROOM: usize = 64 * 1024;

/// The session-state key naming a turn whose cancellation another process asked for: the
/// process running it sees the request when it renews the turn's lease.
const CANCEL_REQUEST_KEY: &str = "agentry.cancel_requested";

/// Settings of a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// How long a turn's lease lasts without renewal; a running turn renews it at a third
    /// of this. A process that dies leaves its turns to be recovered after this long.
    pub lease_ttl: Duration,
    /// How long a finished turn's live log (deltas included) stays in memory for
    /// subscribers; afterwards the stored log serves them.
    pub live_retention: Duration,
    /// About how many bytes of a turn's deltas its live log keeps one by one. Past it, the
    /// log merges each run of adjacent text deltas into one entry (four bytes a delta beside
    /// the text), so a long reply costs about its text rather than a few hundred bytes a
    /// delta; a subscriber behind then gets such a run as one delta with the same text. The
    /// default, 8 MiB, keeps every delta of ordinary turns (about 15,000 of them).
    pub live_delta_budget: usize,
    /// Who creates sessions and turns when the caller does not say.
    pub default_subject: Subject,
    /// How often a runtime looks for cancellations that another process sharing the store
    /// stored for its running turns (one session read per running turn each time): the
    /// longest such a cancel waits. A cancel made through this runtime acts at once.
    /// Default 500 ms; values below 10 ms count as 10 ms. The looks are at most this far
    /// apart: the time between lease renewals (a third of `lease_ttl`) is split evenly
    /// into looks, so they may come a little more often.
    pub cancel_poll: Duration,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(30),
            live_retention: Duration::from_secs(60),
            live_delta_budget: 8 * 1024 * 1024,
            cancel_poll: Duration::from_millis(500),
            default_subject: Subject {
                subject_id: "local".to_owned(),
                subject_type: "user".to_owned(),
                subject_slug: "local".to_owned(),
            },
        }
    }
}

/// Runs agents over a store. Cheap to clone; clones share everything.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use agentry_memory::InMemoryStore;
/// use agentry_model::{ScriptedModel, ScriptedResponse};
/// use agentry_runner::{Agent, Runtime, TurnRequest};
/// use agentry_types::TurnState;
///
/// let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Hello!")]));
/// let runtime = Runtime::new(Arc::new(InMemoryStore::new()));
/// runtime.register(Agent::builder("greeter", model).build());
/// let session = runtime.create_session("greeter", Some("Demo")).await?;
/// let turn = session.create_turn(TurnRequest::message("Hi")).await?;
/// let state = turn.wait().await?;
/// assert!(matches!(state, TurnState::Done { .. }));
/// # Ok::<_, agentry_runner::RunnerError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

#[derive(Debug)]
struct RuntimeInner {
    store: Arc<dyn Store>,
    agents: RwLock<HashMap<String, Agent>>,
    live: Mutex<HashMap<TurnId, Arc<LiveTurn>>>,
    options: RuntimeOptions,
    /// This runtime's name in leases.
    owner: Arc<str>,
    /// Whether the task renewing the leases of this runtime's running turns was started.
    keeper_started: AtomicBool,
    /// Set by [`Runtime::hand_over`]: the leases of running turns are no longer renewed.
    handed_over: AtomicBool,
    /// Held by the lease keeper for each of its rounds, so that [`Runtime::hand_over`]
    /// expires the leases after any round under way (which could otherwise renew one of
    /// them again).
    keeper_round: Arc<tokio::sync::Mutex<()>>,
    /// Turns whose end this runtime could not store, with how often in a row and when a
    /// recovery pass may resume them again (see [`EndRetries`]).
    end_retries: Mutex<EndRetries>,
    /// Told after every durable event this runtime's turns store.
    appended: Arc<tokio::sync::Notify>,
    /// Sessions with a turn start in flight, and how many (see [`Starting`]).
    starting: Mutex<HashMap<SessionId, usize>>,
    /// How many times [`Session::cancel`] has run here: a turn start that sees it change
    /// looks at its session again.
    session_cancels: AtomicU64,
    /// Left turns this process warned of waiting for a process with their agent.
    told_left: Mutex<HashSet<TurnId>>,
}

/// The most left turns [`RuntimeInner::told_left`] holds: past it, no more are warned of
/// (a store with thousands of them has one cause, told by the first).
const MAX_TOLD_LEFT: usize = 4096;

impl RuntimeInner {
    /// The turn's live log in this process, if it has one.
    fn live_turn(&self, id: TurnId) -> Option<Arc<LiveTurn>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner).get(&id).cloned()
    }

    /// Removes `live` from the live turns, unless another log took its turn's place (the
    /// turn was resumed here meanwhile).
    fn forget_live(&self, live: &Arc<LiveTurn>) {
        let mut logs = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if logs.get(&live.turn_id).is_some_and(|current| Arc::ptr_eq(current, live)) {
            logs.remove(&live.turn_id);
        }
    }

    fn running_turns(&self) -> Vec<Arc<LiveTurn>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|turn| !turn.is_done())
            .cloned()
            .collect()
    }
}

/// A turn start in flight in its session, from before its first write until its engine is
/// in the live map: recovery leaves the session alone meanwhile. Without it a pass could
/// read the new turn as running and not live, then (the turn having run and ended in
/// between) take the session's lease and refuse its next turn.
struct Starting {
    runtime: Runtime,
    session: SessionId,
}

impl Starting {
    fn new(runtime: &Runtime, session: SessionId) -> Self {
        *runtime.inner.starting.lock().unwrap_or_else(PoisonError::into_inner).entry(session).or_default() +=
            1;
        Self { runtime: runtime.clone(), session }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mut starting = self.runtime.inner.starting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = starting.get_mut(&self.session) {
            *count -= 1;
            if *count == 0 {
                starting.remove(&self.session);
            }
        }
    }
}

/// Which turn a new turn chains on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PreviousTurn {
    /// The session's latest turn (none for the first turn).
    #[default]
    Auto,
    /// A given turn of the session.
    Turn(TurnId),
}

/// The longest [`TurnRequest::idempotency_key`] taken, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 1024;

/// The id of the turn of `session` created with idempotency key `key`
/// ([`TurnRequest::idempotency_key`]): derived from both, so the same key names the same
/// turn in every process, and never one of another session.
#[must_use]
pub fn turn_id_for_key(session: SessionId, key: &str) -> TurnId {
    TurnId::from_uuid(agentry_types::name_based_uuid(&["agentry turn key", &session.to_string(), key]))
}

/// A request to create a turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnRequest {
    /// The input (seed 002 rules); empty only to resume after `mcp.auth_required`.
    pub input: Vec<TurnInputItem>,
    /// What it chains on.
    pub previous_turn_id: PreviousTurn,
    /// Who creates it; the runtime's default subject when absent.
    pub created_by: Option<Subject>,
    /// Client-side tools offered for this turn alone, beside the agent's (an AG-UI
    /// client's frontend tools): the model may call them, and a call ends the turn with
    /// `tool.response_required`, answered by the next turn's `user.tool_response`. A name
    /// must be a valid tool name (letters, digits, `_` and `-`, at most 64) that none of
    /// the agent's tools has; the parameters must be a JSON Schema object.
    pub client_tools: Vec<ToolSpec>,
    /// Context about the caller's side for this turn alone (an AG-UI client's `context`:
    /// the page open, a selection), shown to the model after the agent's instructions.
    /// Each needs a description. Kept with the turn, so a recovered turn sees it too.
    pub client_context: Vec<ClientContext>,
    /// A key naming this turn among its session's (a client's own id for the request, so
    /// that a retry is recognised): the turn's id is derived from the session and the key
    /// ([`turn_id_for_key`]), and a second request with the same key runs nothing, however
    /// close together the two come, also from another process sharing the store: it is
    /// refused with [`RunnerError::TurnExists`], or with `TurnRunning` while the first is
    /// still being started. At most [`MAX_IDEMPOTENCY_KEY`] bytes, not blank.
    pub idempotency_key: Option<String>,
}

impl TurnRequest {
    /// A turn with one user message.
    #[must_use]
    pub fn message(text: impl Into<String>) -> Self {
        Self::input(vec![TurnInputItem::message(text)])
    }

    /// A turn with the given input.
    #[must_use]
    pub fn input(input: Vec<TurnInputItem>) -> Self {
        Self { input, ..Self::default() }
    }
}

/// The rules a turn request breaks whatever turn it follows, besides its input's shape
/// ([`check_shape`]): its client tools and its client context.
fn check_request(agent: &Agent, request: &TurnRequest) -> RuntimeResult<()> {
    if let Some(key) = &request.idempotency_key {
        if key.trim().is_empty() {
            return Err(RunnerError::InvalidInput("the idempotency key is blank".to_owned()));
        }
        if key.len() > MAX_IDEMPOTENCY_KEY {
            return Err(RunnerError::InvalidInput(format!(
                "the idempotency key is {} bytes long; at most {MAX_IDEMPOTENCY_KEY} are taken",
                key.len()
            )));
        }
    }
    check_client_tools(agent, &request.client_tools)?;
    if let Some(at) = request.client_context.iter().position(|item| item.description.trim().is_empty()) {
        return Err(RunnerError::InvalidInput(format!(
            "client context {at} has no description: say what its value is"
        )));
    }
    Ok(())
}

/// Checks a turn's own client-side tools: valid names, none twice and none of the agent's,
/// and object schemas.
fn check_client_tools(agent: &Agent, tools: &[ToolSpec]) -> RuntimeResult<()> {
    let invalid = |message: String| Err(RunnerError::InvalidInput(message));
    for (at, tool) in tools.iter().enumerate() {
        let name = tool.name.as_str();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
        if !valid {
            return invalid(format!(
                "client tool {at}: {name:?} is not a tool name (letters, digits, `_` and `-`, at most 64)"
            ));
        }
        if tools[..at].iter().any(|earlier| earlier.name == name) {
            return invalid(format!("client tool {name:?} is offered twice"));
        }
        if agent.tool(name).is_some() || agent.is_client_tool(name) {
            return invalid(format!(
                "client tool {name:?} has the name of one of agent {:?}'s tools",
                agent.name()
            ));
        }
        if !tool.parameters.is_object() {
            return invalid(format!("client tool {name:?}: its parameters must be a JSON Schema object"));
        }
    }
    Ok(())
}

impl Runtime {
    /// A runtime over `store` with default options.
    #[must_use]
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_options(store, RuntimeOptions::default())
    }

    /// A runtime over `store`.
    #[must_use]
    pub fn with_options(store: Arc<dyn Store>, options: RuntimeOptions) -> Self {
        Self {
            inner: Arc::new(RuntimeInner {
                store,
                agents: RwLock::new(HashMap::default()),
                live: Mutex::new(HashMap::default()),
                options,
                owner: Arc::from(format!("runtime-{}", EventId::new())),
                keeper_started: AtomicBool::new(false),
                handed_over: AtomicBool::new(false),
                keeper_round: Arc::new(tokio::sync::Mutex::new(())),
                end_retries: Mutex::new(EndRetries::default()),
                appended: Arc::new(tokio::sync::Notify::new()),
                starting: Mutex::new(HashMap::default()),
                session_cancels: AtomicU64::new(0),
                told_left: Mutex::new(HashSet::default()),
            }),
        }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Told (`notify_waiters`) after every durable event this runtime's turns store, so a
    /// store-wide feed can read the new events at once instead of polling. Events stored by
    /// other processes sharing the store are not signalled: poll for those as well.
    #[must_use]
    pub fn events_appended(&self) -> Arc<tokio::sync::Notify> {
        self.inner.appended.clone()
    }

    /// Registers an agent under its name, replacing one of the same name. Turns already
    /// running keep the agent they started with.
    pub fn register(&self, agent: Agent) {
        self.inner
            .agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.name().to_owned(), agent);
    }

    /// The agent registered as `name`.
    #[must_use]
    pub fn agent(&self, name: &str) -> Option<Agent> {
        self.inner.agents.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    /// The agent registered as `name`, refused when its definition has a problem.
    fn require_agent(&self, name: &str) -> RuntimeResult<Agent> {
        let agent = self.agent(name).ok_or_else(|| RunnerError::not_found("agent", name))?;
        if let Some(problem) = agent.problem() {
            return Err(RunnerError::InvalidAgent { agent: name.to_owned(), problem: problem.to_owned() });
        }
        Ok(agent)
    }

    /// Creates a session with a registered agent, owned by the default subject.
    ///
    /// Errors: `NotFound` for an unknown agent; `Store` when the store fails.
    pub async fn create_session(&self, agent_name: &str, title: Option<&str>) -> RuntimeResult<Session> {
        self.create_session_as(self.inner.options.default_subject.clone(), agent_name, title).await
    }

    /// Creates a session owned by `owner`.
    ///
    /// Errors: as [`Runtime::create_session`].
    pub async fn create_session_as(
        &self,
        owner: Subject,
        agent_name: &str,
        title: Option<&str>,
    ) -> RuntimeResult<Session> {
        self.create_session_with_id(SessionId::new(), owner, agent_name, title).await
    }

    /// Creates a session owned by `owner` under an id the caller chose, for sessions that an
    /// outside name must find again (a name-based id: see the server's AG-UI threads).
    ///
    /// Errors: as [`Runtime::create_session`]; `Store` with `Conflict::AlreadyExists` when a
    /// session has that id.
    pub async fn create_session_with_id(
        &self,
        id: SessionId,
        owner: Subject,
        agent_name: &str,
        title: Option<&str>,
    ) -> RuntimeResult<Session> {
        let agent = self.require_agent(agent_name)?;
        let mut record = SessionRecord::new(agent.session_type(), agent_name, owner);
        record.id = id;
        record.title = title.map(str::to_owned);
        self.inner.store.create_session(&record).await?;
        Ok(Session { runtime: self.clone(), record })
    }

    /// A session by id. Errors: `NotFound`.
    pub async fn get_session(&self, id: SessionId) -> RuntimeResult<Session> {
        let record = self.inner.store.get_session(id).await?;
        Ok(Session { runtime: self.clone(), record })
    }

    /// Sessions newest first, filtered and paginated. Errors: `Store` for a foreign token.
    pub async fn list_sessions(
        &self,
        query: &SessionQuery,
        page: &PageRequest,
    ) -> RuntimeResult<Page<SessionRecord>> {
        Ok(self.inner.store.list_sessions(query, page).await?)
    }

    /// A turn by id (of any session). Errors: `NotFound`.
    pub async fn get_turn(&self, id: TurnId) -> RuntimeResult<TurnHandle> {
        let record = Arc::new(self.inner.store.get_run(id).await?);
        Ok(TurnHandle { runtime: self.clone(), record })
    }

    fn live_turn(&self, id: TurnId) -> Option<Arc<LiveTurn>> {
        self.inner.live_turn(id)
    }

    /// [`Runtime::live_turn`], unless its log was abandoned here (the turn was handed over
    /// or lost its lease): such a turn is followed, and cancelled, through the store.
    fn running_here(inner: &RuntimeInner, id: TurnId) -> Option<Arc<LiveTurn>> {
        inner.live_turn(id).filter(|live| !live.is_abandoned())
    }

    fn running_turn_of(&self, session: SessionId) -> Option<Arc<LiveTurn>> {
        self.inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .find(|turn| turn.session_id == session && !turn.is_done())
            .cloned()
    }

    /// How many turns this runtime runs now: started, resumed or recovered here.
    #[must_use]
    pub fn running_count(&self) -> usize {
        self.inner.running_turns().len()
    }

    /// Waits until this runtime runs no turn (those started, resumed or recovered here,
    /// whoever asked), as a process about to stop does before it hands the rest over
    /// ([`Runtime::hand_over`]).
    pub async fn idle(&self) {
        loop {
            let running = self.inner.running_turns();
            if running.is_empty() {
                return;
            }
            for turn in running {
                turn.wait_done().await;
            }
        }
    }

    /// Lets the next process recover this runtime's running turns at once, for a process
    /// about to exit with turns still running: their leases are no longer renewed and are
    /// made to expire now, so a recovery pass ([`Runtime::recover`]) on the same store takes
    /// them over without waiting out the lease time. Each lease is then replaced by one of a
    /// new token, lapsed as it is granted, so the turn's engine here finds its durable
    /// writes refused, and the engine is cancelled: it stops at once (a model reply it is
    /// streaming is dropped, running tools get the cancellation grace) without ending the
    /// turn, its end being one of the refused writes. A tool call it has not journaled never
    /// starts; one under way is in doubt, as after a crash. From then on the runtime takes no
    /// new turns ([`RunnerError::HandedOver`]) and recovers none. A turn whose start was
    /// under way is handed over the same way as soon as it is running. Returns how many of
    /// the turns running when it was called were handed over (a start under way may or may
    /// not be among them).
    pub async fn hand_over(&self) -> usize {
        self.inner.handed_over.store(true, Ordering::Release);
        // A keeper round under way ends first; the next one sees the flag and stops.
        let _round = self.inner.keeper_round.lock().await;
        let mut handed = 0;
        for turn in self.inner.running_turns() {
            if self.hand_over_one(&turn).await {
                handed += 1;
            }
        }
        handed
    }

    /// Hands one running turn over (see [`Runtime::hand_over`]); returns whether its lease
    /// was given back.
    async fn hand_over_one(&self, turn: &LiveTurn) -> bool {
        if !give_back(self.inner.store.as_ref(), turn.session_id, turn.lease_token).await {
            return false;
        }
        // Fenced, the engine's end is refused: cancelled, it stops now (a model reply it is
        // streaming is dropped) instead of at its next write, and the turn is left for
        // recovery. Unfenced, its end would stand: it runs on.
        if self.fence_out(turn).await {
            turn.request_cancel(CancellationReason::Abandoned);
        }
        true
    }

    /// Takes a lease of a new token, lapsed as it is granted, over a handed-over turn's
    /// session: the turn's engine here finds its writes refused (a tool call it has not
    /// journaled never starts), and recovery passes still find the session. Returns whether
    /// the turn's own token no longer holds the lease.
    async fn fence_out(&self, turn: &LiveTurn) -> bool {
        let store = self.inner.store.as_ref();
        let now = Timestamp::now();
        match store.acquire_lease(turn.session_id, &self.inner.owner, Duration::ZERO, now).await {
            Ok(_) => true,
            // Held: by another process that took the lease meanwhile (which fences this
            // engine too), or still by this one, should the clock have stepped back since the
            // give-back.
            Err(StoreError::Conflict(_)) => store
                .lease(turn.session_id)
                .await
                .is_ok_and(|lease| lease.is_none_or(|lease| lease.token != turn.lease_token)),
            // The session was deleted once the lease was given back: no write of the engine
            // can land any more, and it stops.
            Err(StoreError::NotFound { .. }) => true,
            Err(error) => {
                tracing::warn!(turn = %turn.turn_id, %error, "fencing a handed-over turn failed; it runs on here until the process exits");
                false
            }
        }
    }

    /// Resumes the turns that a dead process left running: for every running turn whose
    /// session lease lapsed, takes the lease over and finishes the turn from its stored
    /// state (completed tool calls are not run again). Returns the turns it resumed.
    ///
    /// A pass looks only at the sessions whose lease has lapsed (see
    /// [`LeaseStore::list_leases`]): a turn is written under its session's lease and gives
    /// it back with its last write, and every other give-back of the runtime (a start that
    /// does not use the lease it took, a pass that leaves a turn) lets the lease lapse
    /// rather than deleting it, so a turn a process left running keeps a lease a pass can
    /// find. A running turn on a session without a lease (a run an application stored as
    /// running through the store) is not the runtime's to resume. A lapsed lease with no
    /// running turn under it is taken over and deleted, so each pass costs what the leases
    /// cost (the turns under way and the leases left since the last pass), not what the
    /// store holds.
    ///
    /// Errors: `Store` when listing the leases fails before any turn was resumed (after,
    /// the pass returns what it resumed and logs the error); a session the pass cannot read is
    /// logged and left to the next pass, and a turn that cannot be resumed (its agent is not
    /// registered here, or its definition has a problem) is ended with an error state
    /// instead.
    ///
    /// [`LeaseStore::list_leases`]: agentry_memory::LeaseStore::list_leases
    pub async fn recover(&self) -> RuntimeResult<Vec<TurnHandle>> {
        const PAGE: usize = 100;
        // Its own handed-over turns are for the next process, not for this one.
        if self.inner.handed_over.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let store = &self.inner.store;
        let mut resumed = Vec::new();
        let mut after = None;
        loop {
            let leases = match store.list_leases(after, PAGE).await {
                Ok(leases) => leases,
                // The turns already resumed are running: the caller gets them, to follow
                // them; the rest waits for the next pass.
                Err(error) if !resumed.is_empty() => {
                    tracing::warn!(%error, "listing leases failed part way through a recovery pass");
                    return Ok(resumed);
                }
                Err(error) => return Err(error.into()),
            };
            let now = Timestamp::now();
            for lease in leases.iter().filter(|lease| lease.is_expired(now)) {
                if let Err(error) = self.recover_session(lease, &mut resumed).await {
                    tracing::warn!(session = %lease.session_id, %error, "recovering a session's turns failed");
                }
            }
            match leases.last() {
                Some(last) if leases.len() == PAGE => after = Some(last.session_id),
                _ => return Ok(resumed),
            }
        }
    }

    /// The part of a recovery pass for one session whose lease lapsed.
    async fn recover_session(&self, lease: &Lease, resumed: &mut Vec<TurnHandle>) -> RuntimeResult<()> {
        let store = &self.inner.store;
        let session = match store.get_session(lease.session_id).await {
            Ok(session) => session,
            // Deleted since the listing.
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let runs = self.running_turns(session.id, 10).await?;
        if runs.is_empty() {
            return self.clear_lapsed(session.id).await;
        }
        for run in runs {
            let turn = run.id;
            match self.recover_turn(&session, run).await {
                Ok(Some(handle)) => resumed.push(handle),
                Ok(None) => {}
                // One turn that cannot be recovered now does not stop the others; its lease
                // lapses, and a later pass tries again.
                Err(error) => tracing::warn!(%turn, %error, "recovering a turn failed"),
            }
        }
        Ok(())
    }

    /// A session's running top-level turns, newest first, at most `limit` (see
    /// [`left_running`]). Runs an application saved as running through the Memory facade
    /// or the session views are passed over, however many there are: a turn older than
    /// them is still found.
    async fn running_turns(&self, session: SessionId, limit: usize) -> RuntimeResult<Vec<RunRecord>> {
        let query =
            RunQuery { order: Order::Desc, statuses: vec![RunStatus::Running], ..RunQuery::default() };
        // Pages of many, however few are asked for: checkpoints may be many.
        let size = limit.max(100);
        let mut page = PageRequest::first(size);
        let mut turns = Vec::new();
        loop {
            let listed = self.inner.store.list_runs(session, &query, &page).await?;
            turns.extend(listed.items.into_iter().filter(left_running));
            match listed.next_token {
                Some(token) if turns.len() < limit => page = PageRequest::after(token, size),
                _ => {
                    turns.truncate(limit);
                    return Ok(turns);
                }
            }
        }
    }

    /// Whether this runtime is starting a turn of the session (see [`Starting`]).
    fn is_starting(&self, session: SessionId) -> bool {
        self.inner.starting.lock().unwrap_or_else(PoisonError::into_inner).contains_key(&session)
    }

    /// Deletes a session's lapsed lease that no running turn is under (left by a start that
    /// never wrote its turn). The pass takes the lease over first: that fences out the
    /// holder of the lapsed one (a start slower than the lease time would otherwise still
    /// write its turn under it), and under its own lease it reads the running turns again.
    /// One found then is left under a lapsed lease for the next pass.
    async fn clear_lapsed(&self, session: SessionId) -> RuntimeResult<()> {
        if self.is_starting(session) || self.running_turn_of(session).is_some() {
            return Ok(());
        }
        let store = &self.inner.store;
        let lease = match store
            .acquire_lease(session, &self.inner.owner, self.inner.options.lease_ttl, Timestamp::now())
            .await
        {
            Ok(lease) => lease,
            Err(StoreError::Conflict(Conflict::LeaseHeld { .. }) | StoreError::NotFound { .. }) => {
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        };
        match self.running_turns(session, 1).await {
            Ok(runs) if runs.is_empty() => match store.release_lease(session, lease.token).await {
                Ok(()) | Err(StoreError::Conflict(Conflict::StaleFence { .. })) => Ok(()),
                Err(error) => Err(error.into()),
            },
            other => {
                give_back(store.as_ref(), session, lease.token).await;
                other.map(drop)
            }
        }
    }

    async fn recover_turn(
        &self,
        session: &SessionRecord,
        run: RunRecord,
    ) -> RuntimeResult<Option<TurnHandle>> {
        let store = &self.inner.store;
        // A turn this runtime runs, or is starting, is not abandoned, whatever its lease
        // says. Starts first: a start leaves that set only once its turn is live. A log left
        // by an engine that stopped here without its end does not count.
        if self.is_starting(session.id) {
            return Ok(None);
        }
        let running_here = self
            .inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&run.id)
            // A log kept after an earlier turn of the same id ended (its session deleted and
            // created again under a derived id) is not this turn's.
            .is_some_and(|live| !live.is_abandoned() && live.created_at == run.created_at);
        if running_here {
            return Ok(None);
        }
        // A turn whose end this runtime could not store waits before a pass resumes it
        // again: each resumption calls the model again, and a full disk may stay full.
        if self.inner.end_retries.lock().unwrap_or_else(PoisonError::into_inner).waiting(run.id) {
            return Ok(None);
        }
        // A turn of an agent this process does not have is left for a process that has it
        // (servers of one store running different agents, a rolling deploy), as a worker
        // takes only the work it can do; a cancellation stored for it ends it here, which
        // needs no agent.
        if self.agent(&session.name).is_none() && !cancel_requested(session, run.id) {
            self.tell_left_for_others(session, run.id).await;
            return Ok(None);
        }
        // The listing may be older than the turn's end: a turn that ended since is left as
        // it is (read again here, and under the lease below, so that a pass seldom takes
        // the lease of a session between two turns, where it would refuse the next one).
        if store.get_run(run.id).await?.status != RunStatus::Running {
            return Ok(None);
        }
        let now = Timestamp::now();
        if store.lease(session.id).await?.is_some_and(|lease| !lease.is_expired(now)) {
            return Ok(None);
        }
        let lease =
            match store.acquire_lease(session.id, &self.inner.owner, self.inner.options.lease_ttl, now).await
            {
                Ok(lease) => lease,
                Err(StoreError::Conflict(Conflict::LeaseHeld { .. })) => return Ok(None),
                Err(error) => return Err(error.into()),
            };
        // Under the lease the turn cannot end any more: one that ended meanwhile, or went
        // with its session, is left. Either way, or when the read fails, the lease lapses
        // for a later pass (another running turn of the session stays findable).
        let run = match store.get_run(run.id).await {
            Ok(run) if run.status == RunStatus::Running => run,
            other => {
                give_back(store.as_ref(), session.id, lease.token).await;
                return match other {
                    Ok(_) | Err(StoreError::NotFound { .. }) => Ok(None),
                    Err(error) => Err(error.into()),
                };
            }
        };
        self.resume_under(session, run, lease).await
    }

    /// Warns, once in this process, that a turn left running by a stopped process waits for
    /// a process with its agent, which this one does not have: an operator who removed the
    /// agent would otherwise see the turn running for ever. Only once its lease has been
    /// lapsed for a whole lease time (a process with the agent, whose passes come every
    /// half of one, would have taken it: servers of one store running different agents see
    /// no warning), and while it still runs. For the first [`MAX_TOLD_LEFT`] such turns.
    async fn tell_left_for_others(&self, session: &SessionRecord, turn: TurnId) {
        let told = |turn| self.inner.told_left.lock().unwrap_or_else(PoisonError::into_inner).contains(&turn);
        if told(turn) {
            return;
        }
        let store = &self.inner.store;
        let long_lapsed = match store.lease(session.id).await {
            Ok(Some(lease)) => {
                lease.expires_at.saturating_add(self.inner.options.lease_ttl) <= Timestamp::now()
            }
            _ => false,
        };
        let running =
            long_lapsed && store.get_run(turn).await.is_ok_and(|run| run.status == RunStatus::Running);
        if !running {
            tracing::debug!(turn = %turn, agent = %session.name, "a turn of an agent this process does not have");
            return;
        }
        let mut told = self.inner.told_left.lock().unwrap_or_else(PoisonError::into_inner);
        if told.len() < MAX_TOLD_LEFT && told.insert(turn) {
            tracing::warn!(
                turn = %turn,
                session = %session.id,
                agent = %session.name,
                "a turn left running by a stopped process waits for a process that has its agent, which this one \
                 does not: it stays running until one has it, or until its session is cancelled (which ends it here)"
            );
        }
    }

    /// Resumes `run`, left running by a dead process, under `lease`, the session's lease
    /// just taken. Without the session's agent in this process, or with one whose
    /// definition has a problem (which `create_turn` refuses to run: a misnamed
    /// `requires_approval` would let its tool run ungated), the turn ends, its `turn.done`
    /// stored, and the lease is released: cancelled when its cancellation was stored (a
    /// recovery pass leaves a turn of an agent it does not have to a process that has it
    /// otherwise), with an error else.
    async fn resume_under(
        &self,
        session: &SessionRecord,
        run: RunRecord,
        lease: Lease,
    ) -> RuntimeResult<Option<TurnHandle>> {
        let store = &self.inner.store;
        let agent = match self.require_agent(&session.name) {
            Ok(agent) => Ok(agent),
            Err(RunnerError::InvalidAgent { problem, .. }) => Err(format!(
                "agent {} cannot resume the turn in the process that recovered it: {problem}",
                session.name
            )),
            Err(_) => Err(format!(
                "agent {} is not registered in the process that recovered the turn",
                session.name
            )),
        };
        let agent = match agent {
            Ok(agent) => agent,
            Err(message) => {
                let completed_at = Timestamp::now();
                let state = if cancel_requested(session, run.id) {
                    TurnState::Cancelled {
                        reason: CancellationReason::ClientCancelled,
                        completed_at,
                        metrics: None,
                    }
                } else {
                    TurnState::Error { message, completed_at, metrics: None }
                };
                let ended = crate::engine::end_left_turn(store.as_ref(), run, state, lease.fence()).await;
                if ended.is_err() {
                    give_back(store.as_ref(), session.id, lease.token).await;
                }
                ended?;
                return Ok(None);
            }
        };
        let loaded = async {
            let previous = match run.previous_turn_id {
                Some(id) => Some(store.get_run(id).await?),
                None => None,
            };
            let high_water = store.high_water(run.id).await?;
            let journal = store.journal(run.id).await?;
            let stored = stored_events(store.as_ref(), run.id, Order::Asc).await?;
            Ok::<_, RunnerError>((previous, high_water, journal, stored))
        }
        .await;
        // On failure the lease lapses at once (it is not deleted): the next pass finds the
        // turn under it and tries again, and the session's next start can end it meanwhile.
        let (previous, high_water, journal, stored) = match loaded {
            Ok(loaded) => loaded,
            Err(error) => {
                give_back(store.as_ref(), session.id, lease.token).await;
                return Err(error);
            }
        };
        let emitter = TurnEmitter::new(TurnSequencer::resuming_after(session.id, run.id, high_water));
        let run = Arc::new(run);
        let handle = TurnHandle { runtime: self.clone(), record: Arc::clone(&run) };
        self.start(agent, run, lease, emitter, high_water, Start::Recovered { previous, journal, stored });
        Ok(Some(handle))
    }

    /// Takes the session's lease for a new turn (see [`LeaseStore::acquire_lease`]). A call
    /// that does not finish at once finishes on a task of its own, which gives the lease
    /// back if the caller went away meanwhile.
    async fn take_lease(&self, session: SessionId) -> Result<Lease, StoreError> {
        let store = self.inner.store.clone();
        let owner = self.inner.owner.clone();
        let ttl = self.inner.options.lease_ttl;
        let mut taking =
            Box::pin(async move { store.acquire_lease(session, &owner, ttl, Timestamp::now()).await });
        if let std::task::Poll::Ready(taken) = futures_util::poll!(taking.as_mut()) {
            return taken;
        }
        let (reply, receiver) = tokio::sync::oneshot::channel();
        let store = self.inner.store.clone();
        tokio::spawn(async move {
            if let Err(Ok(lease)) = reply.send(taking.await) {
                // Nobody waits for it any more.
                give_back(store.as_ref(), session, lease.token).await;
            }
        });
        let mut answer = LeaseAnswer { receiver, store: Some(self.inner.store.clone()) };
        let taken = (&mut answer.receiver).await;
        answer.store = None;
        taken.map_err(|_| StoreError::Closed)?
    }

    /// Starts a new turn with one write, which takes the session's lease and stores the
    /// turn's first step (see [`EventStore::start_turn`]), then its engine. A write that
    /// does not finish at once finishes on a task of its own, which starts the turn even if
    /// the caller went away meanwhile, as the caller would have.
    ///
    /// [`EventStore::start_turn`]: agentry_memory::EventStore::start_turn
    async fn start_turn(
        &self,
        agent: Agent,
        run: RunRecord,
        previous: Option<RunRecord>,
        cancels_seen: u64,
    ) -> Result<TurnHandle, StoreError> {
        let start = TurnStart {
            owner: self.inner.owner.clone(),
            ttl: self.inner.options.lease_ttl,
            now: Timestamp::now(),
            previous: previous.as_ref().map(|run| run.id),
        };
        let (step, pending) = PendingStart::new(self, agent, Arc::new(run), previous, cancels_seen);
        let handle = TurnHandle { runtime: self.clone(), record: Arc::clone(&pending.run) };
        let store = self.inner.store.clone();
        let turn = handle.id();
        let mut writing = Box::pin(async move { store.start_turn(turn, &step, &start).await });
        if let std::task::Poll::Ready(written) = futures_util::poll!(writing.as_mut()) {
            let (lease, _) = written?;
            self.start_new(lease, pending);
            return Ok(handle);
        }
        // The task, not the caller, starts the engine: whether the caller is still there
        // to hear of it does not matter.
        let (reply, answer) = tokio::sync::oneshot::channel();
        let runtime = self.clone();
        tokio::spawn(async move {
            let started = writing.await.map(|(lease, _)| runtime.start_new(lease, pending));
            let _ = reply.send(started);
        });
        answer.await.map_err(|_| StoreError::Closed)??;
        Ok(handle)
    }

    /// Starts a new turn whose first step is stored (see [`Session::create_turn`]).
    fn start_new(&self, lease: Lease, pending: PendingStart) {
        let PendingStart { agent, run, emitter, high_water, previous, created, starting, cancels_seen } =
            pending;
        self.inner.appended.notify_waiters();
        self.start(agent, run, lease, emitter, high_water, Start::New { previous, created, cancels_seen });
        drop(starting);
    }

    /// Finishes what a dropped [`Session::create_turn`] left while it held the session's
    /// lease: starts the turn when its first step was stored, as the call would have, and
    /// otherwise gives the lease back. When the store cannot tell, the lease is kept: it
    /// expires, and recovery takes over a stored turn as after a crash.
    async fn finish_dropped_start(&self, session: SessionId, token: u64, pending: Option<PendingStart>) {
        let store = &self.inner.store;
        // A store applies its writes in order, and answers a successful one once it is
        // committed: after a renewal, a lookup sees the first step if the dropped call's
        // write stored it. Under the lease, nobody else can start a turn in between.
        // Without a pending start, the release alone is such a write.
        if let Some(pending) = pending {
            let renewed = store.renew_lease(session, token, self.inner.options.lease_ttl, Timestamp::now());
            let lease = match renewed.await {
                Ok(lease) => lease,
                Err(error) => {
                    // Taken over after it expired, or the store failed: not ours to give back.
                    tracing::warn!(%session, %error, "renewing the lease of a dropped turn start failed");
                    return;
                }
            };
            match store.get_run(pending.run.id).await {
                Ok(_) => return self.start_new(lease, pending),
                Err(StoreError::NotFound { .. }) => {}
                Err(error) => {
                    tracing::warn!(turn = %pending.run.id, %error, "looking up the turn of a dropped turn start failed");
                    return;
                }
            }
        }
        give_back(store.as_ref(), session, token).await;
    }

    /// Registers the turn's live log and spawns its engine and lease keeper.
    fn start(
        &self,
        agent: Agent,
        run: Arc<RunRecord>,
        lease: Lease,
        emitter: TurnEmitter,
        high_water: u64,
        start: Start,
    ) {
        self.ensure_lease_keeper();
        let first_seq = match &start {
            Start::New { created, .. } => created.seq,
            Start::Recovered { .. } => emitter.sequencer().last_seq() + 1,
        };
        let live = Arc::new(LiveTurn::new(
            (run.session_id, run.id, run.created_at),
            lease.token,
            first_seq,
            self.inner.options.live_delta_budget,
        ));
        if let Start::New { created, .. } = &start {
            // Stored with the run: published before anyone can subscribe.
            live.push(created.clone());
        }
        self.inner.live.lock().unwrap_or_else(PoisonError::into_inner).insert(run.id, live.clone());
        let store = self.inner.store.clone();
        // A start that was under way when the runtime handed its turns over (whose snapshot
        // of the live turns came before this one) hands this turn over too, as `hand_over`
        // does its own: fenced out and cancelled, before its engine writes anything.
        let hand_over_first = self.inner.handed_over.load(Ordering::Acquire);
        // A recovered turn may have been cancelled while no process ran it (the request is
        // stored in its session): it acts on that at once, not at the lease keeper's round.
        let recovered = matches!(start, Start::Recovered { .. });
        // A session cancelled here after the start read it, before the turn was live, found
        // no turn to cancel (`Session::cancel` counts after storing the flag): counted now,
        // with the turn live, the turn looks at its session again.
        let cancelled_meanwhile = matches!(start, Start::New { cancels_seen, .. }
            if self.inner.session_cancels.load(Ordering::SeqCst) != cancels_seen);
        let fence = lease.fence();
        let sink = Arc::new(TurnSink::new(
            store.clone(),
            live.clone(),
            fence,
            emitter,
            high_water,
            self.inner.appended.clone(),
            recovered,
        ));
        let cancel = CancelWatch::new(live.cancel_receiver(), agent.limits().timeout);
        let panic_sink = sink.clone();
        let engine = TurnEngine::new(store.clone(), agent, run, sink, fence, cancel);
        let runtime = self.clone();
        // Boxed: the turn's future is large (about 15 KB), and tokio would otherwise copy it
        // several times on the way into its task and again when the task completes. The box
        // is allocated before the future is built, which lets the optimiser build it in
        // place rather than on the stack and then copy it (it does in release builds; with
        // `Box::pin` the copy was 7% of a turn's instructions).
        let task = Box::new_uninit();
        tokio::spawn(Box::into_pin(Box::write(task, async move {
            if hand_over_first {
                runtime.hand_over_one(&live).await;
            } else if recovered || cancelled_meanwhile {
                cancel_if_requested(store.as_ref(), &live).await;
            }
            // A panic in the engine (a model, a tool, a bug) ends the turn with an error
            // instead of leaving it running with its lease renewed for ever.
            let finished = match futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
                engine.drive(start),
            ))
            .await
            {
                Ok(finished) => finished,
                Err(panic) => {
                    let message = crate::engine::panic_message(panic.as_ref());
                    tracing::error!(turn = %live.turn_id, panic = %message, "the turn's engine panicked; the turn ends with an error");
                    crate::engine::fail_after_panic(
                        store.as_ref(),
                        live.turn_id,
                        fence,
                        &panic_sink,
                        &message,
                    )
                    .await
                    .ok_or(crate::engine::Unfinished::Unstored)
                }
            };
            // The sink goes before anyone sees the end: what tools kept for the turn
            // (`ToolContext::turn_local`) is gone once `turn.done` is out.
            drop(panic_sink);
            // The lease was released with the turn's end (one write with `turn.done`), and the
            // live log is retired before `turn.done` is published: whoever sees the end of the
            // turn can start the next one at once, and a subscriber arriving after it (with
            // no retention) reads the stored log.
            match finished {
                Ok(done) => {
                    runtime.retire(&live);
                    live.push(done);
                }
                // The turn goes on in another process (its lease was taken over or handed
                // over): the closed log stays for the retention time, telling this
                // process's callers so.
                Err(crate::engine::Unfinished::Elsewhere) => {
                    runtime.retire(&live);
                    live.close();
                }
                // Its end could not be stored: it is left for the next start or recovery
                // pass at once, not after the live log's retention and the lease's expiry.
                Err(crate::engine::Unfinished::Unstored) => {
                    runtime.inner.forget_live(&live);
                    live.close();
                    let wait = runtime
                        .inner
                        .end_retries
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .failed(live.turn_id);
                    tracing::info!(turn = %live.turn_id, ?wait, "recovery passes here resume the turn again after this wait");
                    // After the lease keeper's round under way, if any: it may have listed
                    // the turn before it was forgotten, and its renewal would otherwise
                    // make the lease live again after the give-back.
                    let _round = runtime.inner.keeper_round.lock().await;
                    give_back(store.as_ref(), live.session_id, live.lease_token).await;
                }
            }
        })));
    }

    /// Starts, once, the task that renews the leases of this runtime's running turns at a
    /// third of their lifetime; a lease found taken over stops its turn. One task for all
    /// turns keeps starting a turn cheap.
    fn ensure_lease_keeper(&self) {
        if self.inner.keeper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let runtime = Arc::downgrade(&self.inner);
        let ttl = self.inner.options.lease_ttl;
        // Not below 10 ms: renewals are counted in wake-ups, which a shorter interval (or
        // slow rounds) would put off.
        let cancel_poll = self.inner.options.cancel_poll.max(Duration::from_millis(10));
        let rounds = self.inner.keeper_round.clone();
        tokio::spawn(async move {
            // Leases are renewed every third of their time; cancellations another process
            // stored are looked for more often, so a cancel sent to any server of a shared
            // store stops the turn (and its model request) within about that interval.
            // Counted in wake-ups, not measured: a renewal never slips past its third.
            let renew_every = (ttl / 3).max(Duration::from_millis(1));
            let per_renewal = renew_every.as_nanos().div_ceil(cancel_poll.as_nanos()).max(1);
            let wake_every = renew_every / u32::try_from(per_renewal).unwrap_or(u32::MAX);
            let mut interval = tokio::time::interval(wake_every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval.tick().await;
            let mut wake_ups: u128 = 0;
            loop {
                interval.tick().await;
                wake_ups += 1;
                let _round = rounds.lock().await;
                let Some(inner) = runtime.upgrade() else { return };
                if inner.handed_over.load(Ordering::Acquire) {
                    return;
                }
                let store = inner.store.clone();
                let running = inner.running_turns();
                drop(inner);
                let renew = wake_ups.is_multiple_of(per_renewal);
                // Several turns at once: a round over many turns stays within its interval
                // (a SQLite store reads them in its reader pool and commits the renewals
                // together).
                let keep = |turn: Arc<LiveTurn>| {
                    let store = &store;
                    async move {
                        if renew {
                            // A transient failure is retried at the next renewal, before expiry.
                            let renewed = store
                                .renew_lease(turn.session_id, turn.lease_token, ttl, Timestamp::now())
                                .await;
                            if let Err(StoreError::Conflict(_)) = renewed {
                                turn.request_cancel(CancellationReason::Abandoned);
                                return;
                            }
                        }
                        // A cancellation asked for by another process sharing the store.
                        cancel_if_requested(store.as_ref(), &turn).await;
                    }
                };
                futures_util::StreamExt::for_each_concurrent(
                    futures_util::stream::iter(running),
                    KEEPER_CONCURRENCY,
                    keep,
                )
                .await;
            }
        });
    }

    /// Drops a finished turn's live log after the retention time.
    fn retire(&self, live: &Arc<LiveTurn>) {
        let retention = self.inner.options.live_retention;
        // Weak references: a retiring log does not keep a dropped runtime (and its agents'
        // connections) alive. Only this log goes: the turn may have been resumed here
        // meanwhile, under a log of its own.
        let runtime = Arc::downgrade(&self.inner);
        let log = Arc::downgrade(live);
        let remove = move || {
            if let (Some(inner), Some(log)) = (runtime.upgrade(), log.upgrade()) {
                inner.forget_live(&log);
            }
        };
        if retention.is_zero() {
            remove();
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(retention).await;
                remove();
            });
        }
    }
}

/// A session: create turns on it, list them, cancel it, delete it.
#[derive(Debug, Clone)]
pub struct Session {
    runtime: Runtime,
    record: SessionRecord,
}

impl Session {
    /// Its id.
    #[must_use]
    pub const fn id(&self) -> SessionId {
        self.record.id
    }

    /// Its record as read when this handle was made.
    #[must_use]
    pub const fn record(&self) -> &SessionRecord {
        &self.record
    }

    /// Creates a turn and starts it; returns once the turn is stored and running.
    ///
    /// Errors: `TurnExists` when the request's idempotency key names a stored turn (told
    /// before any other check but the input's shape); `TurnRunning` when the session has a
    /// running turn (here or in another process sharing the store); `TurnResumed` when that
    /// turn was left by a process that stopped and the call resumed it; `SessionCancelled`; `InvalidInput` for input that breaks
    /// seed 002's rules (no turn is stored then; a lease the call took is left lapsed, see
    /// [`Runtime::recover`]); `NotFound` when the session, its agent or
    /// the given previous turn does not exist.
    pub async fn create_turn(&self, request: TurnRequest) -> RuntimeResult<TurnHandle> {
        let runtime = &self.runtime;
        let store = &runtime.inner.store;
        if runtime.inner.handed_over.load(Ordering::Acquire) {
            return Err(RunnerError::HandedOver);
        }
        check_shape(&request.input)?;
        // A cancel of the session here, after the read below, finds no turn of this call
        // running yet: the turn looks at its session again once it is live (see
        // `Runtime::start`).
        let cancels_seen = runtime.inner.session_cancels.load(Ordering::SeqCst);
        // The three reads do not depend on each other: on a file store each is a hop to a
        // reader thread, and they run together.
        let (session, previous, copy) = tokio::join!(
            store.get_session(self.id()),
            self.previous_turn(&request),
            self.refuse_started_copy(&request)
        );
        // A copy of a keyed request that already started is told so first, whatever else
        // changed since (the session cancelled, the agent gone from this process), and also
        // while its turn runs (the start would find the lease held first).
        copy?;
        let session = session?;
        if session.state.get(CANCELLED_KEY) == Some(&Value::Bool(true)) {
            return Err(RunnerError::SessionCancelled { session_id: session.id });
        }
        let agent = runtime.require_agent(&session.name)?;
        // What the request breaks whatever turn it follows is refused at once, as invalid:
        // not as `TurnRunning` (which a caller may retry) while a turn runs, and without
        // taking the session's lease.
        check_request(&agent, &request)?;
        // A failed read is read again under the lease.
        let previous = previous.ok();
        let run = self
            .new_run(&request, previous.as_ref().and_then(|previous| previous.as_ref().map(|run| run.id)))?;
        // A turn usually starts with one write: it is built on the latest turn as read, and
        // the store takes the lease and stores the turn's first step together, refusing
        // the start if another turn was stored meanwhile. The turn is prepared again under
        // the lease when the latest turn was left running by a dead process (it is resumed,
        // and the caller told `TurnResumed`), when the start lost such a race, and when the
        // request does not fit the latest turn as read (under the lease a running turn wins:
        // `TurnRunning`, which a caller may retry).
        if let Some(previous) = previous
            && previous.as_ref().is_none_or(|run| run.state.is_terminal())
            && check_against_previous(&request.input, previous.as_ref()).is_ok()
        {
            let turn_id = run.id;
            match runtime.start_turn(agent.clone(), run, previous, cancels_seen).await {
                Err(StoreError::Conflict(Conflict::LatestTurnChanged { .. })) => {}
                Err(StoreError::Conflict(Conflict::LeaseHeld { .. })) => {
                    return Err(RunnerError::TurnRunning { session_id: session.id });
                }
                Err(StoreError::Conflict(Conflict::AlreadyExists { .. })) => {
                    return Err(RunnerError::TurnExists { session_id: session.id, turn_id });
                }
                started => return Ok(started?),
            }
        }
        // A turn this runtime runs keeps its session even when its lease lapsed (a keeper
        // that could not renew it for a while): taking the lease would fence its engine out.
        if runtime.running_turn_of(session.id).is_some() {
            return Err(RunnerError::TurnRunning { session_id: session.id });
        }
        // A caller that drops this future (an HTTP client that disconnects) must neither
        // leave the session's lease held nor a stored turn that never runs: the lease is
        // taken by a call that finishes even if this future does not, and a guard hands
        // what follows to a task of its own.
        let lease = match runtime.take_lease(session.id).await {
            Ok(lease) => lease,
            Err(StoreError::Conflict(Conflict::LeaseHeld { .. })) => {
                return Err(RunnerError::TurnRunning { session_id: session.id });
            }
            Err(error) => return Err(error.into()),
        };
        let mut guard = StartGuard {
            runtime: Some(runtime.clone()),
            session: session.id,
            token: lease.token,
            pending: None,
        };
        let (run, previous) = match self.prepare_leased(&session, &request, &lease).await {
            Ok(Leased::New(prepared)) => *prepared,
            Ok(Leased::Resumed(turn_id)) => {
                // The lease went with the resumed turn.
                guard.disarm();
                return Err(RunnerError::TurnResumed { session_id: session.id, turn_id });
            }
            Err(error) => {
                guard.disarm();
                give_back(store.as_ref(), session.id, lease.token).await;
                return Err(error);
            }
        };
        // The run and `turn.created` are one write: the turn exists exactly when its first
        // event does.
        let (step, pending) = PendingStart::new(runtime, agent, Arc::new(run), previous, cancels_seen);
        let handle = TurnHandle { runtime: runtime.clone(), record: Arc::clone(&pending.run) };
        guard.pending = Some(pending);
        let written = store.write_step(handle.id(), &step, Some(lease.fence())).await;
        let pending = guard.pending.take();
        guard.disarm();
        if let Err(error) = written {
            give_back(store.as_ref(), session.id, lease.token).await;
            return Err(error.into());
        }
        if let Some(pending) = pending {
            runtime.start_new(lease, pending);
        }
        Ok(handle)
    }

    /// `TurnExists` when the request has an idempotency key whose turn is stored.
    async fn refuse_started_copy(&self, request: &TurnRequest) -> RuntimeResult<()> {
        let Some(key) = &request.idempotency_key else { return Ok(()) };
        let turn_id = turn_id_for_key(self.id(), key);
        match self.runtime.inner.store.get_run(turn_id).await {
            Ok(_) => Err(RunnerError::TurnExists { session_id: self.id(), turn_id }),
            Err(error) if error.is_not_found() => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// The turn a new turn chains on: the session's latest, or the one the request names,
    /// which must be the latest.
    async fn previous_turn(&self, request: &TurnRequest) -> RuntimeResult<Option<RunRecord>> {
        let store = &self.runtime.inner.store;
        let query = RunQuery { order: Order::Desc, ..RunQuery::default() };
        match request.previous_turn_id {
            PreviousTurn::Auto => {
                Ok(store.list_runs(self.id(), &query, &PageRequest::first(1)).await?.items.into_iter().next())
            }
            PreviousTurn::Turn(id) => {
                let run = store.get_run(id).await?;
                if run.session_id != self.id() || run.parent_run_id.is_some() {
                    return Err(RunnerError::not_found("turn", id));
                }
                // Turns chain in a line: only the latest can be continued, so no pending call
                // is answered twice.
                let latest = store.list_runs(self.id(), &query, &PageRequest::first(1)).await?.items;
                if latest.first().is_some_and(|latest| latest.id != id) {
                    return Err(RunnerError::NotLatestTurn { turn_id: id });
                }
                Ok(Some(run))
            }
        }
    }

    /// Builds a new turn chained on `chained_on` from a request [`check_request`] passed;
    /// refuses one too large to leave room for its end. Its input is checked against the
    /// turn it chains on by the caller ([`check_against_previous`]).
    fn new_run(&self, request: &TurnRequest, chained_on: Option<TurnId>) -> RuntimeResult<RunRecord> {
        let created_by =
            request.created_by.clone().unwrap_or_else(|| self.runtime.inner.options.default_subject.clone());
        let mut run = RunRecord::new(self.id(), request.input.clone(), created_by);
        if let Some(key) = &request.idempotency_key {
            run.id = turn_id_for_key(self.id(), key);
        }
        run.previous_turn_id = chained_on;
        run.client_tools.clone_from(&request.client_tools);
        run.client_context.clone_from(&request.client_context);
        if self.record.session_type == SessionType::Team {
            run.team_id = Some(self.record.name.clone());
        } else {
            run.agent_id = Some(self.record.name.clone());
        }
        // The turn's record keeps its input to the end: one that fills the record leaves no
        // room for any end state, and a turn whose end cannot be stored is resumed for ever.
        rules::check_size_within("a new turn with its input", &run, MAX_RECORD_BYTES - END_STATE_ROOM)?;
        Ok(run)
    }

    /// Under the lease: resolves the previous turn, checks the input against it, builds
    /// the new turn (stored with its first event by the caller). A previous turn left
    /// running by a dead process (its lease lapsed before a recovery pass found it) is
    /// resumed under the lease instead, as a recovery pass would: its work is not thrown
    /// away, and the caller gets `TurnResumed`, to retry once it is done.
    async fn prepare_leased(
        &self,
        session: &SessionRecord,
        request: &TurnRequest,
        lease: &Lease,
    ) -> RuntimeResult<Leased> {
        let previous = match self.previous_turn(request).await {
            Ok(previous) => previous,
            // The named previous turn is no longer the latest: a copy of a keyed request
            // whose turn started (and ended) since is told its turn exists.
            Err(error) => {
                self.refuse_started_copy(request).await?;
                return Err(error);
            }
        };
        if let Some(running) = previous.as_ref().filter(|run| left_running(run)) {
            // No engine runs it here: that was checked before the lease was taken (a log
            // left by an engine that stopped without its end does not count).
            self.runtime.resume_under(session, running.clone(), lease.clone()).await?;
            return Ok(Leased::Resumed(running.id));
        }
        // Under the lease no other turn of the session can be stored, and a key's turn id
        // is the session's own: this look-up decides for good. Before the input's check:
        // a retry is told its turn exists, not that its input no longer fits.
        self.refuse_started_copy(request).await?;
        check_against_previous(&request.input, previous.as_ref())?;
        let run = self.new_run(request, previous.as_ref().map(|run| run.id))?;
        Ok(Leased::New(Box::new((run, previous))))
    }

    /// Creates a turn and streams its events from `turn.created` to `turn.done`.
    ///
    /// Errors: as [`Session::create_turn`].
    pub async fn create_turn_streaming(&self, request: TurnRequest) -> RuntimeResult<EventStream> {
        Ok(self.create_turn(request).await?.stream(None))
    }

    /// Creates a turn and returns it as AdalFlow's streaming result (`stream_events`,
    /// `stream_to_json`, `wait_for_completion`, `cancel`).
    ///
    /// Errors: as [`Session::create_turn`].
    pub async fn run_streamed(&self, request: TurnRequest) -> RuntimeResult<crate::RunnerStreamingResult> {
        Ok(crate::RunnerStreamingResult::new(self.create_turn(request).await?))
    }

    /// The session's turns in creation order (`Desc`: newest first), paginated.
    ///
    /// Errors: `NotFound` when the session was deleted; `Store` for a foreign token.
    pub async fn list_turns(&self, order: Order, page: &PageRequest) -> RuntimeResult<Page<TurnHandle>> {
        let query = RunQuery { order, ..RunQuery::default() };
        let runs = self.runtime.inner.store.list_runs(self.id(), &query, page).await?;
        Ok(Page {
            items: runs
                .items
                .into_iter()
                .map(|record| TurnHandle { runtime: self.runtime.clone(), record: Arc::new(record) })
                .collect(),
            next_token: runs.next_token,
        })
    }

    /// A turn of this session. Errors: `NotFound` (also for another session's turn).
    pub async fn get_turn(&self, id: TurnId) -> RuntimeResult<TurnHandle> {
        let handle = self.runtime.get_turn(id).await?;
        if handle.record.session_id != self.id() {
            return Err(RunnerError::not_found("turn", id));
        }
        Ok(handle)
    }

    /// Cancels the session and its running turn. Idempotent; afterwards `create_turn`
    /// fails with `SessionCancelled`. A turn this runtime is starting meanwhile is cancelled
    /// as soon as it is live, even when its `create_turn` caller went away; one running in
    /// another process sharing the store, when that process next looks
    /// ([`RuntimeOptions::cancel_poll`]).
    ///
    /// Errors: `NotFound` when the session does not exist.
    pub async fn cancel(&self) -> RuntimeResult<()> {
        let store = &self.runtime.inner.store;
        let session = store.get_session(self.id()).await?;
        if session.state.get(CANCELLED_KEY) != Some(&Value::Bool(true)) {
            let state = Map::from_iter([(CANCELLED_KEY.to_owned(), Value::Bool(true))]);
            store
                .update_session(self.id(), &SessionUpdate { state: Some(state), ..SessionUpdate::default() })
                .await?;
        }
        // Counted after the session is stored cancelled: a turn start that read it before
        // then sees the count change once its turn is live, and the turn looks at its
        // session again (see `Runtime::start`); one that reads it after is refused.
        self.runtime.inner.session_cancels.fetch_add(1, Ordering::SeqCst);
        // A turn running in another process sees the cancelled session within
        // `RuntimeOptions::cancel_poll`.
        if let Some(turn) = self.runtime.running_turn_of(self.id()) {
            turn.request_cancel(CancellationReason::ClientCancelled);
            turn.wait_done().await;
        }
        Ok(())
    }

    /// Deletes the session with everything stored for it: its turns, their events and
    /// history messages, the tool journal, its lease and budget ledgers
    /// ([`SessionStore::delete_session`](agentry_memory::SessionStore::delete_session)).
    ///
    /// Refused with `TurnRunning` while a turn of it runs, here or in another process
    /// sharing the store (cancel it first, [`Session::cancel`]), and while anything else
    /// holds its lease (a turn being started or recovered, another deletion): the deletion
    /// takes the session's lease, so no turn starts while it is under way. A turn a stopped process
    /// left running, its lease lapsed, goes with the session. `NotFound` when the session
    /// does not exist (or was deleted meanwhile).
    pub async fn delete(&self) -> RuntimeResult<()> {
        let runtime = &self.runtime;
        let running = RunnerError::TurnRunning { session_id: self.id() };
        if runtime.is_starting(self.id()) || runtime.running_turn_of(self.id()).is_some() {
            return Err(running);
        }
        let lease = match runtime.take_lease(self.id()).await {
            Ok(lease) => lease,
            Err(StoreError::Conflict(Conflict::LeaseHeld { .. })) => return Err(running),
            Err(error) => return Err(error.into()),
        };
        // An engine of this runtime whose lease lapsed (its keeper could not renew it) may
        // have become live since the check above: it keeps its session.
        if runtime.running_turn_of(self.id()).is_some() {
            give_back(runtime.inner.store.as_ref(), self.id(), lease.token).await;
            return Err(running);
        }
        // The live logs kept after its turns ended go with it (they would still serve
        // them): those there now, as none can come while the lease is held, and not one of
        // a turn of the session created again under the same id once it is deleted.
        let session = self.id();
        let kept: Vec<Arc<LiveTurn>> = runtime
            .inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|turn| turn.session_id == session)
            .cloned()
            .collect();
        let store = &runtime.inner.store;
        if let Err(error) = store.delete_session(self.id()).await {
            give_back(store.as_ref(), self.id(), lease.token).await;
            return Err(error.into());
        }
        for turn in &kept {
            runtime.inner.forget_live(turn);
        }
        Ok(())
    }
}

/// Turns whose end could not be stored (a failing disk), by turn: how many times in a row,
/// and until when a recovery pass leaves them. The wait doubles from a second up to
/// [`END_RETRY_MAX`]; an entry is dropped once its wait is long past (a turn that ended is
/// no recovery candidate anyway). In memory only: another process, or a new start of the
/// session, resumes such a turn at once.
#[derive(Debug, Default)]
struct EndRetries(HashMap<TurnId, (u32, std::time::Instant)>);

/// The longest a recovery pass waits before resuming a turn whose end could not be stored.
const END_RETRY_MAX: Duration = Duration::from_secs(600);

impl EndRetries {
    /// Records a failure to store `turn`'s end; returns how long passes leave it.
    fn failed(&mut self, turn: TurnId) -> Duration {
        // Turns that ended, or went elsewhere, long ago are dropped as the list is used.
        let now = std::time::Instant::now();
        self.0.retain(|_, (_, until)| now.saturating_duration_since(*until) < END_RETRY_MAX);
        let failures = self.0.get(&turn).map_or(1, |(failures, _)| failures + 1);
        let wait = Duration::from_secs(1 << failures.min(10)).min(END_RETRY_MAX);
        self.0.insert(turn, (failures, now + wait));
        wait
    }

    /// Whether a recovery pass leaves `turn` for now.
    fn waiting(&self, turn: TurnId) -> bool {
        self.0.get(&turn).is_some_and(|(_, until)| std::time::Instant::now() < *until)
    }
}

/// How many running turns a keeper round renews and checks at once.
const KEEPER_CONCURRENCY: usize = 16;

/// Cancels a turn running here when its session asks for it: the session is cancelled, or
/// the cancellation of this turn was stored (by a process where it was not running).
async fn cancel_if_requested(store: &dyn Store, turn: &LiveTurn) {
    if let Ok(session) = store.get_session(turn.session_id).await
        && cancel_requested(&session, turn.turn_id)
    {
        turn.request_cancel(CancellationReason::ClientCancelled);
    }
}

/// Whether `session` asks for `turn` to be cancelled: the session is cancelled, or the
/// turn's cancellation was stored by a process where it was not running.
fn cancel_requested(session: &SessionRecord, turn: TurnId) -> bool {
    session.state.get(CANCEL_REQUEST_KEY).and_then(Value::as_str) == Some(turn.to_string().as_str())
        || session.state.get(CANCELLED_KEY) == Some(&Value::Bool(true))
}

/// Whether a run not in a terminal state was left so by an engine (a turn to resume). A
/// run with an output document was saved by the Memory facade or the session views
/// (another runner's checkpoint): it is never resumed as a turn.
fn left_running(run: &RunRecord) -> bool {
    !run.state.is_terminal() && run.output.is_none()
}

/// Gives back a lease that a turn start or a recovery pass took and will not use, by
/// letting it lapse at once rather than deleting it: the lease may have replaced the lapsed
/// one of a dead process whose turn is still running, and recovery passes find such turns
/// through the sessions' leases. A pass deletes a lapsed lease once it sees no running turn
/// under it. [`Runtime::hand_over`] gives back running turns' leases the same way. Returns
/// whether the lease lapsed now (not when its token is no longer the session's: the turn
/// ended, or another process took the lease).
async fn give_back(store: &dyn Store, session: SessionId, token: u64) -> bool {
    match store.renew_lease(session, token, Duration::ZERO, Timestamp::now()).await {
        Ok(_) => true,
        Err(StoreError::Conflict(_)) => false,
        Err(error) => {
            tracing::warn!(%session, %error, "giving back a lease failed; it lapses in its own time");
            false
        }
    }
}

/// The caller's end of [`Runtime::take_lease`] finishing on a task: dropped before it took
/// the answer, it gives back a lease sent meanwhile (a send that comes after the drop fails,
/// and the task gives the lease back itself).
struct LeaseAnswer {
    receiver: tokio::sync::oneshot::Receiver<Result<Lease, StoreError>>,
    /// `None` once the answer was taken.
    store: Option<Arc<dyn Store>>,
}

impl Drop for LeaseAnswer {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else { return };
        self.receiver.close();
        if let Ok(Ok(lease)) = self.receiver.try_recv()
            && let Ok(tokio) = tokio::runtime::Handle::try_current()
        {
            tokio.spawn(async move { give_back(store.as_ref(), lease.session_id, lease.token).await });
        }
    }
}

/// What [`Session::prepare_leased`] did under the lease.
enum Leased {
    /// The new turn to store, and the turn it chains on.
    New(Box<(RunRecord, Option<RunRecord>)>),
    /// The previous turn (this one) was left running by a dead process: it was resumed,
    /// and the lease went with it.
    Resumed(TurnId),
}

/// Armed while [`Session::create_turn`] holds the session's lease and its engine has not
/// started: dropped armed (its caller went away), it hands the rest to
/// [`Runtime::finish_dropped_start`] on a task of its own.
struct StartGuard {
    /// `None` once disarmed.
    runtime: Option<Runtime>,
    session: SessionId,
    /// The lease's token.
    token: u64,
    /// The turn being started, while its first step is being written.
    pending: Option<PendingStart>,
}

/// What starting a turn whose first step was written needs (see [`Runtime::start`]).
struct PendingStart {
    agent: Agent,
    run: Arc<RunRecord>,
    emitter: TurnEmitter,
    high_water: u64,
    previous: Option<RunRecord>,
    created: Arc<EventEnvelope>,
    /// Held until the turn is live.
    starting: Starting,
    /// How many session cancels this runtime had counted before the start read its
    /// session (see [`Runtime::start`]).
    cancels_seen: u64,
}

impl PendingStart {
    /// A new turn's start, its numbers from the first, with its first step to store: the
    /// run, `turn.created` and an input of user messages.
    fn new(
        runtime: &Runtime,
        agent: Agent,
        run: Arc<RunRecord>,
        previous: Option<RunRecord>,
        cancels_seen: u64,
    ) -> (TurnStep, Self) {
        let starting = Starting::new(runtime, run.session_id);
        let mut emitter = TurnEmitter::new(TurnSequencer::new(run.session_id, run.id));
        let (step, created) = first_step(&run, &mut emitter);
        let high_water = step.high_water.unwrap_or_default();
        (step, Self { agent, run, emitter, high_water, previous, created, starting, cancels_seen })
    }
}

impl StartGuard {
    fn disarm(&mut self) {
        self.runtime = None;
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else { return };
        // Without a runtime to run on (it is shutting down) the lease expires by itself and
        // recovery resumes a stored turn.
        if let Ok(tokio) = tokio::runtime::Handle::try_current() {
            let (session, token, pending) = (self.session, self.token, self.pending.take());
            tokio.spawn(async move { runtime.finish_dropped_start(session, token, pending).await });
        }
    }
}

/// A turn: its state, its events (live or stored), cancellation.
#[derive(Debug, Clone)]
pub struct TurnHandle {
    runtime: Runtime,
    /// Shared with the turn's engine until the engine changes it.
    record: Arc<RunRecord>,
}

impl TurnHandle {
    /// Its id.
    #[must_use]
    pub fn id(&self) -> TurnId {
        self.record.id
    }

    /// Its session.
    #[must_use]
    pub fn session_id(&self) -> SessionId {
        self.record.session_id
    }

    /// The turn it chains on.
    #[must_use]
    pub fn previous_turn_id(&self) -> Option<TurnId> {
        self.record.previous_turn_id
    }

    /// Who created it.
    #[must_use]
    pub fn created_by(&self) -> &Subject {
        &self.record.created_by
    }

    /// When it was created.
    #[must_use]
    pub fn created_at(&self) -> Timestamp {
        self.record.created_at
    }

    /// Its input.
    #[must_use]
    pub fn input(&self) -> &[TurnInputItem] {
        &self.record.input
    }

    /// The record as read when this handle was made.
    #[must_use]
    pub fn record(&self) -> &RunRecord {
        &self.record
    }

    /// Its current state, read from the store. Errors: `NotFound` when deleted.
    pub async fn state(&self) -> RuntimeResult<TurnState> {
        Ok(self.runtime.inner.store.get_run(self.id()).await?.state)
    }

    /// Waits for the turn to end and returns its terminal state. A turn this runtime handed
    /// over, or whose lease it lost, or whose end the store failed to take, stops here
    /// without ending: for it this returns the stored state as it then is (still running;
    /// another process, or the session's next start or recovery pass, resumes and ends the
    /// turn), so that a process handing its turns over is not held up by them.
    ///
    /// Errors: `NotFound` when deleted; `Store` when the store fails.
    pub async fn wait(&self) -> RuntimeResult<TurnState> {
        if let Some(live) = self.live_log() {
            live.wait_done().await;
            if let Some(state) = live.terminal_state() {
                return Ok(state);
            }
        } else {
            // Running in another process, or finished: follow the stored log to its end.
            let mut events = self.stream(None);
            while let Some(event) = futures_util::StreamExt::next(&mut events).await {
                event?;
            }
        }
        self.state().await
    }

    /// Its events after `after_seq` (all with `None`), live while it runs, ending after
    /// `turn.done`. A turn finished longer ago than the live retention is served from the
    /// stored log (no deltas), and so is a turn running in another process; one that a
    /// recovery pass of this runtime takes over meanwhile is followed live from then on.
    /// A cursor at or past an ended turn's last event gives an empty stream.
    #[must_use]
    pub fn stream(&self, after_seq: Option<u64>) -> EventStream {
        // A weak reference: a stream does not keep a dropped runtime alive.
        let (runtime, id, created_at) =
            (Arc::downgrade(&self.runtime.inner), self.id(), self.record.created_at);
        let find_live = Box::new(move || {
            Runtime::running_here(&*runtime.upgrade()?, id).filter(|live| live.created_at == created_at)
        });
        subscribe(self.runtime.inner.store.clone(), id, find_live, after_seq.unwrap_or(0))
    }

    /// The turn's live log in this process, unless it is the log of an earlier turn of the
    /// same id (deleted with its session, and created again since under a derived id).
    fn live_log(&self) -> Option<Arc<LiveTurn>> {
        self.runtime.live_turn(self.id()).filter(|live| live.created_at == self.record.created_at)
    }

    /// [`TurnHandle::live_log`], unless it was abandoned here (see [`Runtime::running_here`]).
    fn running_here(&self) -> Option<Arc<LiveTurn>> {
        self.live_log().filter(|live| !live.is_abandoned())
    }

    /// A snapshot of its stored events (no deltas: messages are complete), in `order`: of
    /// a running turn, those stored so far.
    ///
    /// Errors: `NotFound` when deleted.
    pub async fn events(&self, order: Order) -> RuntimeResult<Vec<EventEnvelope>> {
        stored_events(self.runtime.inner.store.as_ref(), self.id(), order).await
    }

    /// Requests cancellation. Idempotent: cancelling a finished turn does nothing. A turn
    /// running here is cancelled at once and this waits for its end; for a turn running in
    /// another process sharing the store, the request is stored in the session and that
    /// process acts on it when it next looks ([`RuntimeOptions::cancel_poll`], 500 ms by
    /// default); this returns once the request is stored.
    ///
    /// Errors: `NotFound` when the turn or its session was deleted; `Store` when the request
    /// cannot be stored.
    pub async fn cancel(&self) -> RuntimeResult<()> {
        if let Some(live) = self.running_here() {
            live.request_cancel(CancellationReason::ClientCancelled);
            live.wait_done().await;
            // Handed over (or its lease lost) before it could end here: the turn goes on
            // elsewhere, and the request is stored for whoever runs it.
            if !live.is_abandoned() {
                return Ok(());
            }
        }
        let store = &self.runtime.inner.store;
        if store.get_run(self.id()).await?.state.is_terminal() {
            return Ok(());
        }
        let state = Map::from_iter([(CANCEL_REQUEST_KEY.to_owned(), Value::String(self.id().to_string()))]);
        store
            .update_session(
                self.session_id(),
                &SessionUpdate { state: Some(state), ..SessionUpdate::default() },
            )
            .await?;
        // A recovery pass here may have taken the turn over meanwhile, after it looked for
        // the request: cancel it here too.
        if let Some(live) = self.running_here() {
            live.request_cancel(CancellationReason::ClientCancelled);
            live.wait_done().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_turn_id_is_the_same_in_every_build() {
        // Stored turns are found again by it: the derivation must never change.
        let session: SessionId = "01a22007-62ff-758e-a720-027765b22e0c".parse().unwrap();
        assert_eq!(
            turn_id_for_key(session, "agui-run:r1").to_string(),
            "4f54d138-d66f-8c50-9b06-f7a7e021480b"
        );
    }

    #[test]
    fn a_turn_whose_end_keeps_failing_waits_longer_each_time() {
        let mut retries = EndRetries::default();
        let (turn, other) = (TurnId::new(), TurnId::new());
        assert!(!retries.waiting(turn));
        let waits: Vec<Duration> = (0..12).map(|_| retries.failed(turn)).collect();
        assert_eq!(waits[..3], [Duration::from_secs(2), Duration::from_secs(4), Duration::from_secs(8)]);
        assert_eq!(waits[11], END_RETRY_MAX, "capped");
        assert!(retries.waiting(turn));
        assert!(!retries.waiting(other), "other turns are not held back");
    }
}
