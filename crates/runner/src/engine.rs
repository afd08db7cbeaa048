//! The turn engine: one task per running turn drives the agent loop (model, tools,
//! human-in-the-loop pauses) and owns the turn's sequencer, so every event is numbered,
//! stored (when durable), appended to the live log and published in `seq` order.
//!
//! Durable step boundaries (design §8a): the turn's input, each completed model message
//! and each batch of tool results are appended to the run's history messages as they
//! happen, and every tool call is journaled before and after it runs. Recovery rebuilds
//! the model context from those and continues from the last boundary.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentry_events::{
    EventEnvelope, EventPayload, TeamContext, ThreadAgent, ThreadOutcome, ThreadParent, TurnEmitter,
};
use agentry_memory::{
    Conflict, HistoryQuery, MAX_PAGE, Memory, MemoryConfig, MemoryError, Order, PageRequest, ParentFilter,
    RunQuery, Store, StoreError, TurnStep, rules,
};
use agentry_model::ModelRequest;
use agentry_types::agno::ReasoningStep;
use agentry_types::{
    ApprovalDecision, BudgetUsage, CancellationReason, ClientContext, ContextMessage, EventId, Fence,
    HistoryMessage, JournalEntry, McpServerAuth, Message, ModelMessage, PendingToolCall, RequiredAction,
    RequiredActionRecord, Role, RunRecord, SessionId, ThreadId, ThreadMessage, Timestamp, ToolCall, ToolInfo,
    ToolResult, ToolSpec, TurnId, TurnInputItem, TurnMetrics, TurnState, Usage,
};
use futures_util::StreamExt;
use futures_util::future::Either;
use serde_json::Value;
use tokio::sync::{Mutex, watch};

use crate::agent::Agent;
use crate::budget::{Exhausted, Refused, Spent, Step, StepBudget};
use crate::live::LiveTurn;
use crate::tool::{ThreadInstance, ToolContext, ToolError};

/// `seq` numbers reserved durably ahead of use (design §8a).
const HIGH_WATER_BLOCK: u64 = 256;

/// Why an engine stopped without its turn's end stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unfinished {
    /// The turn goes on in another process: its lease was taken over or handed over.
    Elsewhere,
    /// Its end could not be stored (the store failed): the turn is left for the next start
    /// or recovery pass.
    Unstored,
}

/// Why a turn stopped before answering.
#[derive(Debug)]
pub(crate) enum Stop {
    Cancelled(CancellationReason),
    Failed(String),
    /// The lease went to another process: this one must not write anything more.
    LeaseLost,
}

impl From<StoreError> for Stop {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Conflict(Conflict::StaleFence { .. }) => Self::LeaseLost,
            other => Self::Failed(format!("storage failed: {other}")),
        }
    }
}

/// A member thread the previous turn started from a call that the turn left unanswered
/// (because one of the call's threads paused): when the call runs again in this turn, a
/// paused thread resumes with this turn's answers and a finished one gives its stored
/// result without running again.
#[derive(Debug, Clone)]
pub(crate) enum Resume {
    /// It waits for the answers (`parent` and `title` as its `thread.created` said).
    Paused {
        run: Box<RunRecord>,
        thread: ThreadId,
        answers: Vec<TurnInputItem>,
        parent: ThreadParent,
        title: String,
        /// The agent-team context its `thread.created` carried (the instance it ran as).
        team: Option<Box<TeamContext>>,
    },
    /// It finished: its answer and final message.
    Answered { thread: ThreadId, run_id: TurnId, answer: String, output: Option<Box<ThreadMessage>> },
    /// It failed or was cancelled.
    Failed { thread: ThreadId, run_id: TurnId, error: String },
}

/// The most turns [`TurnEngine::prepare_resumes`] looks back through for a member waiting
/// since an earlier turn (one waiting longer starts afresh when its call runs again).
const MAX_RESUME_CHAIN: usize = 64;

/// The previous turn's member threads by the tool call that started them: the calling
/// thread and the call's id (two threads may give their calls the same id).
type Resumes = Arc<std::sync::Mutex<HashMap<(ThreadId, String), Vec<ResumeSlot>>>>;

/// How the error of a thread that a stopped process left begins: recovery tells these
/// ends from the ends threads came to by themselves.
const INTERRUPTED: &str = "interrupted: the process running the turn stopped";

/// The member threads that paused in this turn (a turn local): should the turn end
/// without asking for them (cancelled, failed, or answered regardless), they end with it.
#[derive(Default)]
struct PausedHere(std::sync::Mutex<Vec<Resume>>);

/// A member thread of the previous turn, waiting for the call that started it to run again.
#[derive(Debug)]
struct ResumeSlot {
    /// The agent that ran it.
    agent: String,
    /// The task it was given: a call of the agent takes up a thread of its own task only
    /// (of two tasks assigned to one member, each its own), or one whose task is not known
    /// (empty: its run's input became the answers that resumed it).
    task: String,
    resume: Resume,
    /// A paused thread whose instance a call has taken up (`ThreadScope::resumed_team`):
    /// only the thread of that instance resumes it.
    claimed: bool,
}

/// What a batch of tool calls produced: results, MCP servers waiting for authorization, and
/// what paused member threads wait for.
#[derive(Debug, Default)]
struct ToolRuns {
    results: Vec<(ToolCall, ToolResult)>,
    auth: Vec<McpServerAuth>,
    paused: Vec<RequiredActionRecord>,
}

/// How a sub-agent thread ended: its answer, or why it has none.
#[derive(Debug, Clone)]
pub(crate) struct ThreadRun {
    pub(crate) thread_id: ThreadId,
    pub(crate) run_id: TurnId,
    pub(crate) result: Result<(String, Option<ThreadMessage>), ThreadEnd>,
}

/// Why a sub-agent thread has no answer.
#[derive(Debug, Clone)]
pub(crate) enum ThreadEnd {
    /// It failed or was cancelled.
    Failed(String),
    /// It waits for a person or the client: the turn ends with these required actions and
    /// the next turn resumes the thread.
    Paused(Vec<RequiredActionRecord>),
}

/// What running one call produced.
#[derive(Debug, Clone)]
enum Ran {
    /// A result for the model.
    Result(ToolResult),
    /// The call's MCP server needs the user's authorization; the call has no result yet.
    AuthRequired(McpServerAuth),
    /// The call's sub-agent thread waits for a person or the client; no result yet.
    Paused(Vec<RequiredActionRecord>),
}

/// A call checked and journaled, before it runs.
enum Prepared {
    /// Not run: its result (an error, or the result journaled earlier).
    Done(ToolResult),
    /// To run with these checked arguments (journaled as started in the engine's journal).
    Run { tool: Arc<dyn crate::Tool>, arguments: Value },
}

/// How a turn ended without stopping.
enum Outcome {
    Answered(Option<ThreadMessage>),
    Paused(Option<ThreadMessage>, Vec<RequiredActionRecord>),
}

/// The sequencer owner: numbers, stores, logs and publishes, in that order, under one lock.
///
/// What a turn produces between two waits on the outside world (a model call, tool calls,
/// a person) is *staged* and written as one step ([`Store::write_step`]): events numbered
/// at once, the turn's history messages, and raises of its high-water mark. The engine
/// flushes before every such wait, so nothing staged is held back while the turn waits;
/// events emitted at once take what is staged with them; events are published only once
/// stored, in `seq` order, and deltas only after everything numbered before them.
pub(crate) struct TurnSink {
    store: Arc<dyn Store>,
    pub(crate) live: Arc<LiveTurn>,
    pub(crate) turn_id: TurnId,
    fence: Fence,
    state: Mutex<SinkState>,
    /// Told after every durable event stored (for store-wide feeds).
    appended: Arc<tokio::sync::Notify>,
    /// What tools keep for the length of the turn ([`crate::ToolContext::turn_local`]).
    locals: TurnLocals,
    /// Whether this process took the turn over from another ([`crate::ToolContext::turn_resumed`]).
    pub(crate) resumed: bool,
}

/// Values tools keep for the length of one turn, one per type: shared by every tool call
/// of the turn (the sink is shared by the turn's threads) and dropped with the sink when
/// the turn ends.
#[derive(Default)]
struct TurnLocals(std::sync::Mutex<HashMap<std::any::TypeId, Arc<dyn std::any::Any + Send + Sync>>>);

impl TurnLocals {
    /// The turn's `T`, if something made it.
    fn existing<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let locals = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locals.get(&std::any::TypeId::of::<T>()).cloned()?.downcast::<T>().ok()
    }

    /// The turn's `T`, made with `T::default()` on first use.
    fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut locals = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let value =
            locals.entry(std::any::TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default())).clone();
        // The entry of a type's id always holds that type, so the fallback never runs.
        value.downcast::<T>().unwrap_or_default()
    }
}

struct SinkState {
    emitter: TurnEmitter,
    /// The high-water mark as the next step leaves it.
    high_water: u64,
    /// A raise of the mark not yet written: numbers up to it may be handed out, and are
    /// published only once the step carrying the raise is stored.
    raise: Option<u64>,
    /// Staged events: numbered, not yet stored nor published (the very envelopes the
    /// store keeps and the live log publishes).
    staged: Vec<Arc<EventEnvelope>>,
    /// Staged history messages of the turn's own run.
    messages: Vec<Arc<Message>>,
    /// Staged journal entries of the turn's own tool calls (starts and lone results).
    journal: Vec<JournalEntry>,
    /// The step being written: built here rather than in the writing future, so that
    /// future stays a few words (every emit awaits it, inlined), and its vectors are
    /// swapped with the staged ones rather than allocated for each step. Empty between
    /// writes.
    step: TurnStep,
}

impl TurnSink {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        live: Arc<LiveTurn>,
        fence: Fence,
        emitter: TurnEmitter,
        high_water: u64,
        appended: Arc<tokio::sync::Notify>,
        resumed: bool,
    ) -> Self {
        let turn_id = live.turn_id;
        let state = SinkState {
            emitter,
            high_water,
            raise: None,
            staged: Vec::new(),
            messages: Vec::new(),
            journal: Vec::new(),
            step: TurnStep::default(),
        };
        Self {
            store,
            live,
            turn_id,
            fence,
            state: Mutex::new(state),
            appended,
            locals: TurnLocals::default(),
            resumed,
        }
    }

    /// Raises the high-water mark, in blocks, before numbers above it are handed out; the
    /// raise is written with the next step, before any of those numbers is published.
    fn reserve(state: &mut SinkState, count: u64) {
        let needed = state.emitter.sequencer().last_seq() + count;
        if needed > state.high_water {
            state.high_water = needed + HIGH_WATER_BLOCK;
            state.raise = Some(state.high_water);
        }
    }

    /// Writes what is staged with `last` (if any) and `run` as one step, then publishes the
    /// staged events; returns `last` stored but unpublished.
    ///
    /// The step is built before the returned future starts, in `state`: the future holds
    /// references only, and with nothing to write (each delta asks) it is ready at once.
    fn store_staged<'a>(
        &'a self,
        state: &'a mut SinkState,
        last: Option<Arc<EventEnvelope>>,
        run: Option<Arc<RunRecord>>,
    ) -> impl std::future::Future<Output = Result<Option<Arc<EventEnvelope>>, Stop>> + Send + 'a {
        if !state.step.is_empty() {
            // Left by a write whose future was dropped (a member thread cut off at the end
            // of a cancellation's grace): dropped with it, as a step kept in its future was,
            // but for its raise of the high-water mark, which numbers already handed out
            // rely on: it goes with this step.
            let dropped = std::mem::take(&mut state.step);
            state.raise = state.raise.max(dropped.high_water);
        }
        let has_last = last.is_some();
        // The turn's end (its record with `turn.done`) also gives its lease back.
        state.step.release_lease = run.is_some() && has_last;
        state.step.run = run;
        state.step.high_water = state.raise.take();
        std::mem::swap(&mut state.step.messages, &mut state.messages);
        std::mem::swap(&mut state.step.events, &mut state.staged);
        std::mem::swap(&mut state.step.journal, &mut state.journal);
        state.step.events.extend(last);
        self.write_built(state, has_last)
    }

    /// Writes the step [`Self::store_staged`] built; see there.
    async fn write_built(
        &self,
        state: &mut SinkState,
        has_last: bool,
    ) -> Result<Option<Arc<EventEnvelope>>, Stop> {
        if state.step.is_empty() {
            return Ok(None);
        }
        if let Err(error) = self.store.write_step(self.turn_id, &state.step, Some(self.fence)).await {
            // Nothing of the step is stored. Its raise, messages and events go back in front
            // of what is staged, so a later step (at the latest the turn's end) stores them:
            // the history the turn already uses stays whole, and no number is skipped in
            // the live log. An event whose immediate emit failed is thus stored later. The
            // end's own `turn.done` is not kept (nothing follows it). Sizes are checked
            // before anything is staged; an event too large to store would still be dropped
            // (it would fail every later step).
            let step = std::mem::take(&mut state.step);
            state.raise = step.high_water.max(state.raise);
            let mut events = step.events;
            if step.run.is_some() && has_last {
                events.pop();
            }
            if matches!(error, StoreError::TooLarge { .. }) {
                events.retain(|event| rules::check_event_size(event).is_ok());
            }
            events.append(&mut state.staged);
            state.staged = events;
            let mut messages = step.messages;
            messages.append(&mut state.messages);
            state.messages = messages;
            // Journal entries the store refused as conflicting would fail every later step.
            if !matches!(
                error,
                StoreError::Conflict(Conflict::JournalMismatch { .. } | Conflict::AlreadyCompleted { .. })
            ) {
                let mut journal = step.journal;
                journal.append(&mut state.journal);
                state.journal = journal;
            }
            return Err(error.into());
        }
        let step = &mut state.step;
        step.high_water = None;
        step.messages.clear();
        step.journal.clear();
        step.run = None;
        step.release_lease = false;
        if !step.events.is_empty() {
            self.appended.notify_waiters();
        }
        let last = if has_last { step.events.pop() } else { None };
        for event in step.events.drain(..) {
            self.live.push(event);
        }
        Ok(last)
    }

    /// [`Self::store_staged`] with a last event, which it returns stored but unpublished.
    async fn store_with(
        &self,
        state: &mut SinkState,
        event: Arc<EventEnvelope>,
        run: Option<Arc<RunRecord>>,
    ) -> Result<Arc<EventEnvelope>, Stop> {
        self.store_staged(state, Some(event), run)
            .await?
            .ok_or_else(|| Stop::Failed("the sequencer lost an event it stored".to_owned()))
    }

    /// Checks an event's size, then numbers it under the sequencer's lock (raising the
    /// mark when needed); returns the lock with the event.
    async fn number(
        &self,
        thread_id: Option<ThreadId>,
        team: Option<TeamContext>,
        payload: EventPayload,
    ) -> Result<(tokio::sync::MutexGuard<'_, SinkState>, Arc<EventEnvelope>), Stop> {
        rules::check_payload_size(&payload, team.as_ref(), thread_id.as_ref())?;
        let mut state = self.state.lock().await;
        Self::reserve(&mut state, 1);
        let event = match team {
            Some(team) => state.emitter.emit_team(thread_id, team, payload),
            None => state.emitter.emit(thread_id, payload),
        };
        Ok((state, Arc::new(event)))
    }

    /// Stores what is staged and publishes the staged events.
    pub(crate) async fn flush(&self) -> Result<(), Stop> {
        let mut state = self.state.lock().await;
        self.store_staged(&mut state, None, None).await?;
        Ok(())
    }

    /// Numbers a durable event with an agent-team context and stages it (see the type's
    /// documentation); it is stored and published at the next flush.
    pub(crate) async fn stage_team(
        &self,
        thread_id: Option<ThreadId>,
        team: Option<TeamContext>,
        payload: EventPayload,
    ) -> Result<(), Stop> {
        let (mut state, event) = self.number(thread_id, team, payload).await?;
        state.staged.push(event);
        Ok(())
    }

    /// The history messages and journal entries staged and not yet stored.
    async fn staged_history(&self) -> (Vec<Arc<Message>>, Vec<JournalEntry>) {
        let state = self.state.lock().await;
        (state.messages.clone(), state.journal.clone())
    }

    /// Stages history messages of the turn's own run.
    pub(crate) async fn stage_messages(&self, messages: &[Arc<Message>]) {
        self.state.lock().await.messages.extend_from_slice(messages);
    }

    /// Stages a journal entry of a tool call of the turn's own run: a start, which the flush
    /// before the call runs stores with its `tool.call.started`, or a lone call's result,
    /// stored with its `tool.response`.
    async fn stage_journal(&self, entry: JournalEntry) {
        self.state.lock().await.journal.push(entry);
    }

    /// Stages a complete message and returns a copy for the caller. A message too large to
    /// store already has its number (its deltas are out): a small stand-in takes the number,
    /// so the numbers stay whole, and the turn fails.
    fn stage_message(state: &mut SinkState, mut message: EventEnvelope) -> Result<Arc<EventEnvelope>, Stop> {
        if let Err(error) = rules::check_event_size(&message) {
            if let EventPayload::ModelMessage(model) = &mut message.payload {
                *model = ModelMessage {
                    content: Some(format!("[the message was not kept: {error}]")),
                    finish_reason: model.finish_reason.take(),
                    usage: model.usage,
                    ..ModelMessage::default()
                };
            }
            state.staged.push(Arc::new(message));
            return Err(Stop::Failed(format!("the model's message cannot be kept: {error}")));
        }
        let message = Arc::new(message);
        state.staged.push(message.clone());
        Ok(message)
    }

    /// Emits a durable event.
    pub(crate) async fn emit(
        &self,
        thread_id: Option<ThreadId>,
        payload: EventPayload,
    ) -> Result<Arc<EventEnvelope>, Stop> {
        self.emit_team(thread_id, None, payload).await
    }

    /// Emits a durable event with an agent-team context.
    pub(crate) async fn emit_team(
        &self,
        thread_id: Option<ThreadId>,
        team: Option<TeamContext>,
        payload: EventPayload,
    ) -> Result<Arc<EventEnvelope>, Stop> {
        let (mut state, event) = self.number(thread_id, team, payload).await?;
        // Stored with what is staged, then all published in `seq` order.
        let event = self.store_with(&mut state, event, None).await?;
        self.live.push(event.clone());
        Ok(event)
    }

    /// Ends the turn: stores what is staged, the run's end `record` and `turn.done` (with
    /// `payload`) as one step that also releases the session's lease, publishes the staged
    /// events and returns `turn.done` unpublished (the caller publishes it with
    /// [`LiveTurn::push`]; nothing may be emitted after it).
    pub(crate) async fn finish(
        &self,
        record: Arc<RunRecord>,
        payload: EventPayload,
    ) -> Result<Arc<EventEnvelope>, Stop> {
        let mut state = self.state.lock().await;
        let event = Arc::new(state.emitter.emit(None, payload));
        self.store_with(&mut state, event, Some(record)).await
    }

    /// Emits a delta (after storing and publishing what is staged), and stages the complete
    /// message when the delta finished it.
    async fn delta(
        &self,
        thread_id: ThreadId,
        message_id: EventId,
        delta: agentry_types::ModelMessageDelta,
    ) -> Result<Option<Arc<EventEnvelope>>, Stop> {
        let mut state = self.state.lock().await;
        Self::reserve(&mut state, 2);
        self.store_staged(&mut state, None, None).await?;
        let emission = state
            .emitter
            .delta(thread_id, message_id, delta)
            .map_err(|error| Stop::Failed(format!("the model sent a delta that does not merge: {error}")))?;
        self.live.push(Arc::new(emission.delta));
        emission.message.map(|message| Self::stage_message(&mut state, message)).transpose()
    }

    /// Stages what was built of an unfinished message (on cancellation or a broken stream).
    async fn finish_partial(&self, thread_id: &ThreadId) -> Result<Option<Arc<EventEnvelope>>, Stop> {
        let mut state = self.state.lock().await;
        Self::reserve(&mut state, 1);
        state
            .emitter
            .finish_partial(thread_id)
            .map(|message| Self::stage_message(&mut state, message))
            .transpose()
    }
}

/// What a tool needs to start a sub-agent thread on the turn it runs in.
pub(crate) struct ThreadScope {
    store: Arc<dyn Store>,
    sink: Arc<TurnSink>,
    fence: Fence,
    cancel: CancelWatch,
    created_by: agentry_types::Subject,
    /// The run of the thread whose tool starts the new thread: the new member run's parent.
    parent_run: TurnId,
    /// Where a tool leaves an answer given for the agent.
    direct_answer: Arc<std::sync::Mutex<Option<ThreadMessage>>>,
    /// Member threads to resume instead of starting anew, by the starting tool call.
    resumes: Resumes,
}

impl std::fmt::Debug for ThreadScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadScope").field("turn_id", &self.sink.turn_id).finish_non_exhaustive()
    }
}

impl ThreadScope {
    /// The turn's store.
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// The fence of the turn's lease.
    pub(crate) const fn fence(&self) -> Fence {
        self.fence
    }

    /// See [`crate::ToolContext::turn_resumed`].
    pub(crate) fn turn_resumed(&self) -> bool {
        self.sink.resumed
    }

    /// The turn's `T` (see [`crate::ToolContext::turn_local`]).
    pub(crate) fn turn_local<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.sink.locals.get::<T>()
    }

    /// Emits a durable event with a team context on `thread`.
    pub(crate) async fn emit_team(
        &self,
        thread: ThreadId,
        team: TeamContext,
        payload: EventPayload,
    ) -> Result<(), String> {
        self.sink
            .emit_team(Some(thread), Some(team), payload)
            .await
            .map(|_| ())
            .map_err(|stop| format!("{stop:?}"))
    }

    /// Waits for `future` unless the turn is cancelled first.
    pub(crate) async fn until_cancelled<F: std::future::Future>(&self, future: F) -> Option<F::Output> {
        let mut cancel = self.cancel.clone();
        tokio::select! {
            output = future => Some(output),
            _ = cancel.cancelled() => None,
        }
    }

    /// Makes `output` the calling agent's answer: after this batch of calls the agent's
    /// loop ends with it instead of calling the model again.
    pub(crate) fn answer_directly(&self, output: ThreadMessage) {
        *self.direct_answer.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(output);
    }

    /// The agent-team context of the paused thread that `agent`, called by `tool_call_id`,
    /// resumes in this turn: the instance it runs as again.
    /// Each paused thread is taken up once: a call running the same agent twice (tasks
    /// assigned to one member) takes up its threads one each.
    pub(crate) fn resumed_team(
        &self,
        thread: &ThreadId,
        tool_call_id: &str,
        agent: &str,
        task: &str,
    ) -> Option<TeamContext> {
        let mut resumes = self.resumes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let slots = resumes.get_mut(&(thread.clone(), tool_call_id.to_owned()))?;
        let free = |slot: &ResumeSlot| {
            matches!(&slot.resume, Resume::Paused { team: Some(_), .. })
                && slot.agent == agent
                && !slot.claimed
        };
        let index = slots
            .iter()
            .position(|slot| free(slot) && slot.task == task)
            .or_else(|| slots.iter().position(|slot| free(slot) && slot.task.is_empty()))?;
        let slot = &mut slots[index];
        slot.claimed = true;
        match &slot.resume {
            Resume::Paused { team: Some(team), .. } => Some(team.as_ref().clone()),
            _ => None,
        }
    }

    /// Runs `agent` on a new thread of the turn, started by `parent` (the calling thread
    /// and tool call): the member run is stored with the calling thread's run as its parent
    /// (the turn, or a member run for nested teams).
    pub(crate) async fn run_thread(
        &self,
        agent: Agent,
        task: String,
        title: String,
        parent: ThreadParent,
        instance: Option<ThreadInstance>,
    ) -> ThreadRun {
        let resume = {
            let mut resumes = self.resumes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let instance_id = instance.as_ref().and_then(|instance| instance.team.instance_id.as_deref());
            resumes.get_mut(&(parent.thread_id.clone(), parent.tool_call_id.clone())).and_then(|threads| {
                // The thread of the instance this call took up, or else the agent's next
                // thread no other call took up.
                let claimed = |slot: &ResumeSlot| match &slot.resume {
                    Resume::Paused { team: Some(team), .. } => {
                        slot.claimed && team.instance_id.as_deref() == instance_id
                    }
                    _ => false,
                };
                // A thread whose task is not known any more (its run's input became the
                // answers that resumed it) goes to any call of its agent.
                let free = |slot: &ResumeSlot| slot.agent == agent.name() && !slot.claimed;
                let index = threads
                    .iter()
                    .position(claimed)
                    .or_else(|| threads.iter().position(|slot| free(slot) && slot.task == task))
                    .or_else(|| threads.iter().position(|slot| free(slot) && slot.task.is_empty()))?;
                Some(threads.remove(index).resume)
            })
        };
        let (run, thread, answers) = match resume {
            Some(Resume::Answered { thread, run_id, answer, output }) => {
                return ThreadRun {
                    thread_id: thread,
                    run_id,
                    result: Ok((answer, output.map(|output| *output))),
                };
            }
            Some(Resume::Failed { thread, run_id, error }) => {
                return ThreadRun { thread_id: thread, run_id, result: Err(ThreadEnd::Failed(error)) };
            }
            Some(Resume::Paused { run, thread, answers, .. }) => (*run, thread, Some(answers)),
            None => {
                let thread = ThreadId::new_sub_thread();
                let session_id = self.sink.live.session_id;
                let mut run = RunRecord::new(
                    session_id,
                    vec![TurnInputItem::message(task.clone())],
                    self.created_by.clone(),
                );
                run.parent_run_id = Some(self.parent_run);
                run.thread_id = Some(thread.clone());
                run.agent_id = Some(agent.name().to_owned());
                if let Err(error) = self.store.put_run(&run, Some(self.fence)).await {
                    return ThreadRun {
                        thread_id: thread,
                        run_id: run.id,
                        result: Err(ThreadEnd::Failed(format!("storing the member run failed: {error}"))),
                    };
                }
                (run, thread, None)
            }
        };
        let cancel = match instance.as_ref().and_then(|instance| instance.cancel.as_ref()) {
            Some(token) => self.cancel.with(token),
            None => self.cancel.clone(),
        };
        let mut engine =
            TurnEngine::new(self.store.clone(), agent, Arc::new(run), self.sink.clone(), self.fence, cancel);
        engine.thread = thread;
        // The turn's resumptions, for the members this thread's own calls resume (a team
        // nested in a team).
        engine.resumes = self.resumes.clone();
        engine.team = instance.as_ref().map(|instance| instance.team.clone());
        engine.ledger = instance.as_ref().and_then(|instance| instance.ledger.clone());
        match answers {
            Some(answers) => engine.resume_thread(answers, parent, title, instance).await,
            None => engine.run_thread(task, parent, title, instance).await,
        }
    }
}

/// An instance's `agent_team.instance.started`.
fn instance_started(instance: &ThreadInstance) -> EventPayload {
    EventPayload::InstanceStarted {
        role: instance.role.clone(),
        status: "running".to_owned(),
        budget_limit: instance.budget,
        skill_hash: instance.skill_hash.clone(),
    }
}

/// Watches for cancellation and the turn's deadline.
#[derive(Debug, Clone)]
pub(crate) struct CancelWatch {
    /// The turn's cancellation, then those of the instances the thread runs in.
    receivers: Vec<watch::Receiver<Option<CancellationReason>>>,
    deadline: Option<tokio::time::Instant>,
}

impl CancelWatch {
    pub(crate) fn new(
        receiver: watch::Receiver<Option<CancellationReason>>,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            receivers: vec![receiver],
            // A deadline past the clock's range is none.
            deadline: timeout.and_then(|timeout| tokio::time::Instant::now().checked_add(timeout)),
        }
    }

    /// This watch, also stopped by `token` (a thread's own cancellation).
    pub(crate) fn with(&self, token: &CancelToken) -> Self {
        let mut watch = self.clone();
        watch.receivers.push(token.subscribe());
        watch
    }

    fn check(&self) -> Result<(), Stop> {
        if let Some(reason) = self.receivers.iter().find_map(|receiver| *receiver.borrow()) {
            return Err(Stop::Cancelled(reason));
        }
        if self.deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
            return Err(Stop::Cancelled(CancellationReason::ServerExecutionTimeout));
        }
        Ok(())
    }

    /// Resolves when the turn or one of the thread's instances is cancelled, or the
    /// deadline passes.
    async fn cancelled(&mut self) -> CancellationReason {
        loop {
            if let Some(reason) = self.receivers.iter_mut().find_map(|receiver| *receiver.borrow_and_update())
            {
                return reason;
            }
            let deadline = self.deadline;
            let past_deadline = async move {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending::<()>().await,
                }
            };
            if self.receivers.is_empty() {
                past_deadline.await;
                return CancellationReason::ServerExecutionTimeout;
            }
            let closed = {
                let changes = self.receivers.iter_mut().map(|receiver| Box::pin(receiver.changed()));
                tokio::select! {
                    (changed, index, _) = futures_util::future::select_all(changes) => changed.is_err().then_some(index),
                    () = past_deadline => return CancellationReason::ServerExecutionTimeout,
                }
            };
            if let Some(index) = closed {
                // Nobody can cancel through a dropped handle any more.
                self.receivers.remove(index);
            }
        }
    }
}

/// A cancellation of its own for a thread (an agent-team instance), on top of its turn's.
#[derive(Debug, Clone)]
pub struct CancelToken {
    sender: Arc<watch::Sender<Option<CancellationReason>>>,
}

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelToken {
    /// A token nobody has cancelled.
    #[must_use]
    pub fn new() -> Self {
        Self { sender: Arc::new(watch::channel(None).0) }
    }

    /// Cancels the threads holding the token. Idempotent: the first reason stays.
    pub fn cancel(&self, reason: CancellationReason) {
        self.sender.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Whether it was cancelled.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.sender.borrow().is_some()
    }

    fn subscribe(&self) -> watch::Receiver<Option<CancellationReason>> {
        self.sender.subscribe()
    }
}

/// A turn's first event.
fn turn_created(run: &RunRecord) -> EventPayload {
    EventPayload::TurnCreated {
        previous_turn_id: run.previous_turn_id,
        input: run.input.clone(),
        created_by: run.created_by.clone(),
    }
}

/// A new turn's first step, written before its engine starts: the run itself, `turn.created`
/// (numbered by `emitter`) and, when the input is only user messages, those messages as the
/// run's history, with the high-water mark raised for the numbers the engine will hand out.
/// Returns the step and `turn.created`.
pub(crate) fn first_step(run: &Arc<RunRecord>, emitter: &mut TurnEmitter) -> (TurnStep, Arc<EventEnvelope>) {
    let created = Arc::new(emitter.emit(None, turn_created(run)));
    let messages: Vec<Arc<Message>> = run
        .input
        .iter()
        .map_while(|item| match item {
            TurnInputItem::Message(user) => Some(Arc::new(Message::user(user.content.clone()))),
            _ => None,
        })
        .collect();
    let messages = if messages.len() == run.input.len() { messages } else { Vec::new() };
    let step = TurnStep {
        high_water: Some(created.seq + HIGH_WATER_BLOCK),
        messages,
        events: vec![created.clone()],
        journal: Vec::new(),
        run: Some(Arc::clone(run)),
        release_lease: false,
    };
    (step, created)
}

/// How a turn starts.
pub(crate) enum Start {
    /// A new turn, whose first step ([`first_step`]: the run, `turn.created`) is stored:
    /// apply the input.
    /// `cancels_seen`: how many session cancels the runtime had counted before the start
    /// read its session (see `Runtime::start`).
    New { previous: Option<RunRecord>, created: Arc<EventEnvelope>, cancels_seen: u64 },
    /// A turn taken over after its process died.
    Recovered { previous: Option<RunRecord>, journal: Vec<JournalEntry>, stored: Vec<EventEnvelope> },
}

/// One turn's agent loop.
pub(crate) struct TurnEngine {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) agent: Agent,
    /// Shared with the turn's handle and the steps that store it; changed copy-on-write.
    pub(crate) run: Arc<RunRecord>,
    pub(crate) sink: Arc<TurnSink>,
    pub(crate) fence: Fence,
    pub(crate) cancel: CancelWatch,
    pub(crate) thread: ThreadId,
    context: Arc<Vec<ContextMessage>>,
    /// How many messages of `context` belong to this turn's run.
    own_start: usize,
    metrics: TurnMetrics,
    journal: HashMap<String, JournalEntry>,
    /// Tool calls whose `tool.response` is already in the stored log (recovery).
    responded: HashSet<String>,
    /// After a crash: the last `model.message` the dead process stored on this thread.
    recovered_output: Option<ThreadMessage>,
    /// Steps completed in this turn (`step.completed`): one per tool result and one for the
    /// answer.
    steps: u32,
    /// Tool calls this turn's input approved: they run without asking again.
    approved: HashSet<String>,
    /// The agent-team context of this thread's events (a team member's instance).
    team: Option<TeamContext>,
    /// The instance's budget, reserved before each model and tool call.
    ledger: Option<Arc<dyn StepBudget>>,
    /// An answer a tool gave for the agent (a routed member's), ending the loop.
    direct_answer: Arc<std::sync::Mutex<Option<ThreadMessage>>>,
    /// Member threads this turn's input resumes.
    resumes: Resumes,
    /// Calls a dead process left without a result whose threads had all ended: they run
    /// again on their threads' stored ends, without asking ([`Tool::resumes_threads`]).
    settled: HashSet<String>,
    /// The model message whose tool calls are running (their `message_id`).
    calling_message: std::sync::Mutex<Option<EventId>>,
    model_calls: u32,
    /// What the last model call is charged to the budget: the provider's usage, an
    /// estimate when it reported none or its stream stopped after it began, or nothing when
    /// it stopped before its first delta.
    charged: Option<Usage>,
}

impl TurnEngine {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        agent: Agent,
        run: Arc<RunRecord>,
        sink: Arc<TurnSink>,
        fence: Fence,
        cancel: CancelWatch,
    ) -> Self {
        Self {
            store,
            agent,
            run,
            sink,
            fence,
            cancel,
            thread: ThreadId::main(),
            context: Arc::default(),
            own_start: 0,
            metrics: TurnMetrics::default(),
            journal: HashMap::new(),
            responded: HashSet::new(),
            approved: HashSet::new(),
            direct_answer: Arc::default(),
            resumes: Arc::default(),
            settled: HashSet::new(),
            calling_message: std::sync::Mutex::new(None),
            team: None,
            ledger: None,
            recovered_output: None,
            steps: 0,
            model_calls: 0,
            charged: None,
        }
    }

    fn session_id(&self) -> SessionId {
        self.run.session_id
    }

    /// Reserves a step from the instance's budget (nothing without one). When the budget is
    /// out, emits the exhaustion (once per budget) and stops the thread.
    ///
    /// Without a budget it returns at once; the work with one is boxed, so the agent loop's
    /// future does not carry it on every step.
    async fn reserve(&self, step: Step) -> Result<Option<String>, Stop> {
        let Some(ledger) = &self.ledger else { return Ok(None) };
        Box::pin(self.reserve_from(ledger, step)).await
    }

    async fn reserve_from(&self, ledger: &Arc<dyn StepBudget>, step: Step) -> Result<Option<String>, Stop> {
        match ledger.reserve(step).await {
            Ok(reservation) => Ok(Some(reservation)),
            Err(Refused::Exhausted(exhausted)) => Err(self.exhausted(exhausted).await),
            Err(Refused::Unavailable(error)) => {
                Err(Stop::Failed(format!("the budget is unavailable: {error}")))
            }
            Err(Refused::LeaseLost) => Err(Stop::LeaseLost),
        }
    }

    /// Emits a budget's exhaustion (the first time it is found) and stops the thread.
    async fn exhausted(&self, exhausted: Exhausted) -> Stop {
        if exhausted.first {
            let payload = if exhausted.mission {
                EventPayload::MissionBudgetExhausted {
                    exhausted_by: exhausted.exhausted_by,
                    usage: exhausted.usage,
                }
            } else {
                EventPayload::BudgetExhausted { exhausted_by: exhausted.exhausted_by, usage: exhausted.usage }
            };
            if let Err(stop) = self.emit(payload).await {
                return stop;
            }
        }
        Stop::Cancelled(CancellationReason::BudgetExhausted)
    }

    /// Gives back what `reservations` held, for steps that will not run.
    async fn release_all(&self, reservations: &[String]) {
        if let Some(ledger) = &self.ledger {
            for reservation in reservations {
                ledger.release(reservation).await;
            }
        }
    }

    /// Settles a reservation and reports the instance's usage; a step that took a budget
    /// past its limit stops the thread there.
    async fn settle(&self, reservation: &str, spent: Spent) -> Result<(), Stop> {
        let Some(ledger) = &self.ledger else { return Ok(()) };
        Box::pin(async move {
            if let Some(settled) = ledger.settle(reservation, spent).await {
                self.stage(EventPayload::BudgetUsage { usage: settled.usage, limit: settled.limit }).await?;
                if let Some(exhausted) = settled.exhausted {
                    return Err(self.exhausted(exhausted).await);
                }
            }
            Ok(())
        })
        .await
    }

    /// Emits a durable event on this engine's thread, with its team context.
    async fn emit(&self, payload: EventPayload) -> Result<Arc<EventEnvelope>, Stop> {
        self.sink.emit_team(Some(self.thread.clone()), self.team.clone(), payload).await
    }

    /// Stages a durable event on this engine's thread (see [`TurnSink`]): it is stored and
    /// published with the next flush, before the turn next waits on the outside world.
    async fn stage(&self, payload: EventPayload) -> Result<(), Stop> {
        self.sink.stage_team(Some(self.thread.clone()), self.team.clone(), payload).await
    }

    fn turn_id(&self) -> TurnId {
        self.run.id
    }

    /// Runs the turn to its end and records the end. Returns the stored `turn.done`, or why
    /// the end is not stored: the turn goes on in another process, or the store failed.
    /// The terminal event is stored but not yet published: the caller releases the lease
    /// first, so whoever sees `turn.done` can start the next turn at once.
    pub(crate) async fn drive(mut self, start: Start) -> Result<Arc<EventEnvelope>, Unfinished> {
        let outcome = self.run_loop(start).await;
        self.close_unanswered(&outcome).await;
        self.end_abandoned_resumptions(&outcome).await;
        let completed_at = Timestamp::now();
        let metrics = (self.model_calls > 0).then_some(self.metrics);
        let state = match outcome {
            Ok(Outcome::Answered(output)) => TurnState::Done {
                output: output.map(Box::new),
                required_actions: Vec::new(),
                completed_at,
                metrics,
            },
            Ok(Outcome::Paused(output, required_actions)) => {
                TurnState::Done { output: output.map(Box::new), required_actions, completed_at, metrics }
            }
            Err(Stop::Cancelled(reason)) => TurnState::Cancelled { reason, completed_at, metrics },
            Err(Stop::Failed(message)) => TurnState::Error { message, completed_at, metrics },
            Err(Stop::LeaseLost) => {
                tracing::info!(session = %self.run.session_id, turn = %self.run.id,
                    "the turn's lease went to another process, which goes on with the turn");
                return Err(Unfinished::Elsewhere);
            }
        };
        let (session, turn) = (self.run.session_id, self.run.id);
        match &state {
            TurnState::Error { message, .. } => {
                tracing::warn!(%session, %turn, error = %message, "a turn failed")
            }
            TurnState::Cancelled { reason, .. } => {
                tracing::info!(%session, %turn, reason = reason.as_str(), "a turn was cancelled");
            }
            _ => {}
        }
        let mut finished = self.finish(state).await;
        if finished.is_err()
            && let Err(error) = rules::check_size("run", &*self.run)
        {
            // The end state itself is too large to keep (an input and an answer near the
            // record limit together): resumed, the turn would fail the same way for ever. It
            // ends with an error instead, as small as an end state gets (its answer is kept
            // in its events); only an input within bytes of the limit leaves no room for it.
            tracing::warn!(%session, %turn, %error, "a turn's end is too large to keep with its input");
            let message = "the turn's end is too large to keep with its input; its answer is in its events";
            finished = self
                .finish(TurnState::Error { message: message.to_owned(), completed_at, metrics: None })
                .await;
        }
        let error = match finished {
            Ok(done) => return Ok(done),
            Err(Stop::LeaseLost) => {
                tracing::info!(%session, %turn,
                    "the turn's lease left this process (handed over at shutdown, or lapsed and taken by another \
                     process) before its end was stored: it goes on where it is resumed");
                return Err(Unfinished::Elsewhere);
            }
            Err(Stop::Failed(error)) => error,
            Err(Stop::Cancelled(reason)) => format!("cancelled ({})", reason.as_str()),
        };
        tracing::warn!(%session, %turn, %error,
            "the turn's end could not be stored: its lease is given back, and the next start or recovery pass resumes it");
        Err(Unfinished::Unstored)
    }

    /// Ends the member threads of the previous turn that this turn was to resume and did
    /// not take up again, each with an error or cancelled state, its instance's end (for an
    /// agent-team member) and `thread.done`, as a dead thread of the turn's own (best
    /// effort). A thread this turn did not take up cannot be among what it asks for, so no
    /// later turn would resume it:
    /// - a thread a dead process resumed in this turn (its run was set running again): its
    ///   delegating call was in doubt and put to a person, and a retry starts the member
    ///   afresh; its instance ends in this turn's mission, where it had started again;
    /// - a thread still paused when this turn is cancelled or fails before its delegating
    ///   call ran again (the turn closes that call), or when the call ran without resuming
    ///   it (a delegation that failed first): its instance ends in the mission it paused in.
    ///
    /// A turn that goes on elsewhere (its lease lost) leaves them to its next holder.
    async fn end_abandoned_resumptions(&mut self, outcome: &Result<Outcome, Stop>) {
        let abandoned = match outcome {
            Err(Stop::Cancelled(reason)) => Err(*reason),
            Err(Stop::Failed(message)) => Ok(format!("the turn failed: {message}")),
            Ok(_) => Ok("the turn ended without going on with it".to_owned()),
            Err(Stop::LeaseLost) => return,
        };
        let mut left: Vec<Resume> = {
            let mut resumes = self.resumes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            resumes.drain().flat_map(|(_, threads)| threads).map(|slot| slot.resume).collect()
        };
        // Threads that paused in this turn wait for its required actions: a turn that ends
        // asking for none (cancelled, failed, or answered regardless) leaves them to no one.
        if !matches!(outcome, Ok(Outcome::Paused(..)))
            && let Some(here) = self.sink.locals.existing::<PausedHere>()
        {
            left.extend(here.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain(..));
        }
        let mut stored: Option<Vec<EventEnvelope>> = None;
        for resume in left {
            let Resume::Paused { run, thread, parent, title, team, .. } = resume else { continue };
            let completed_at = Timestamp::now();
            let (state, error, ended, team) = match &run.state {
                TurnState::Running => {
                    let error = format!("{INTERRUPTED} while this thread resumed");
                    // The instance started again in this turn, in its mission: it ends there.
                    if stored.is_none() {
                        stored = crate::live::stored_events(self.store.as_ref(), self.run.id, Order::Asc)
                            .await
                            .ok();
                    }
                    let on_thread =
                        stored.iter().flatten().filter(|event| event.thread_id.as_ref() == Some(&thread));
                    let started = on_thread.fold(None, |started, event| match &event.payload {
                        EventPayload::InstanceStarted { .. } => event.team.clone(),
                        EventPayload::InstanceCompleted { .. }
                        | EventPayload::InstanceFailed { .. }
                        | EventPayload::InstanceCancelled { .. } => None,
                        _ => started,
                    });
                    (
                        TurnState::Error { message: error.clone(), completed_at, metrics: None },
                        error.clone(),
                        EventPayload::InstanceFailed { error },
                        started,
                    )
                }
                TurnState::Done { required_actions, .. } if !required_actions.is_empty() => {
                    match &abandoned {
                        Err(reason) => (
                            TurnState::Cancelled { reason: *reason, completed_at, metrics: None },
                            format!("cancelled: {}", reason.as_str()),
                            EventPayload::InstanceCancelled { reason: Some(reason.as_str().to_owned()) },
                            team.map(|team| *team),
                        ),
                        Ok(error) => (
                            TurnState::Error { message: error.clone(), completed_at, metrics: None },
                            error.clone(),
                            EventPayload::InstanceFailed { error: error.clone() },
                            team.map(|team| *team),
                        ),
                    }
                }
                // Ended meanwhile.
                _ => continue,
            };
            if !end_member(self.store.as_ref(), *run, state, self.fence).await {
                continue;
            }
            if let Some(team) = team.filter(|team| team.instance_id.is_some()) {
                let _staged = self.sink.stage_team(Some(thread.clone()), Some(team), ended).await;
            }
            let outcome = ThreadOutcome::Error { error, output: None };
            let done = EventPayload::ThreadDone { parent: Some(parent), title, outcome };
            let _staged = self.sink.stage_team(Some(thread), None, done).await;
        }
    }

    /// Stores the terminal state with `turn.done` (returned unpublished) and the lease's
    /// release. (See also [`fail_after_panic`] for a turn whose engine is gone.)
    async fn finish(&mut self, state: TurnState) -> Result<Arc<EventEnvelope>, Stop> {
        // The end state, `turn.done` and everything staged are one write: a terminal turn is
        // never recovered, so nothing may be left to store after its state.
        Arc::make_mut(&mut self.run).set_state(state.clone());
        self.sink.finish(self.run.clone(), EventPayload::TurnDone { state }).await
    }

    async fn run_loop(&mut self, start: Start) -> Result<Outcome, Stop> {
        self.approved = approved_calls(&self.run.input, &self.thread);
        let (previous, recovered) = match start {
            Start::New { previous, .. } => {
                // The run, `turn.created` and an input of user messages only were stored in
                // one write before the engine started; the history read below finds those
                // messages as the turn's own.
                if previous.is_none() && !self.agent.mcp_sessions().is_empty() {
                    // The main thread starts with the session's first turn, and with it the
                    // agent's MCP sessions.
                    let servers = self.agent.mcp_sessions().to_vec();
                    self.emit(EventPayload::McpInitialize { servers }).await?;
                }
                (previous, None)
            }
            Start::Recovered { previous, journal, stored } => {
                self.journal = journal.into_iter().map(|entry| (entry.tool_call_id.clone(), entry)).collect();
                if !stored.iter().any(|event| matches!(event.payload, EventPayload::TurnCreated { .. })) {
                    // The dead process stopped before storing the turn's first event.
                    self.sink.emit(None, turn_created(&self.run)).await?;
                }
                // First, so that nothing the turn fails on later leaves them open.
                for (thread, team, payload) in
                    end_dead_threads(self.store.as_ref(), &self.run, &stored, self.fence).await
                {
                    self.sink.stage_team(Some(thread), team, payload).await?;
                }
                end_unstarted_members(self.store.as_ref(), &self.run, &stored, self.fence).await;
                self.deny_undecided_spawns(&stored).await;
                self.prepare_recovered_threads(&stored).await?;
                (previous, Some(stored))
            }
        };
        self.load_context().await?;
        if let Some(previous) = previous.as_ref() {
            self.prepare_resumes(previous).await?;
        }
        let memory = self.prepare_memory().await?;
        // A turn recovered after its answer was stored may not have updated its memory: its
        // process stopped (or handed the turn over) first, or its summary was refused.
        let memory_updated = recovered.as_ref().is_some_and(|stored| {
            stored.iter().any(|event| matches!(event.payload, EventPayload::MemoryUpdateCompleted { .. }))
        });
        if let Some(stored) = recovered {
            self.reconcile(&stored).await?;
        }
        if self.context.len() == self.own_start {
            self.apply_input(previous.as_ref()).await?;
        }
        // A cancellation stored while no process ran the turn is acted on before anything
        // else: a call in doubt is not put to a person for a turn already cancelled.
        self.cancel.check()?;
        // Continue from the last durable boundary: a model message whose calls are not all
        // answered (after a crash, or calls that waited for an MCP authorization), or this
        // turn's answer (after a crash right after it).
        if let Some((index, unanswered)) = self.unanswered_calls() {
            let answer = self.context[index].tool_calls.is_empty();
            if answer && index >= self.own_start {
                if let Some(memory) = memory.as_ref().filter(|_| !memory_updated) {
                    self.update_memory(memory).await?;
                }
                return Ok(Outcome::Answered(self.recovered_output.take()));
            }
            // The stored message that made the calls, as the live turn had it: a pause
            // ends with it as its output, as it would have without the crash.
            let asked = self.recovered_output.clone().filter(|recovered| {
                unanswered
                    .iter()
                    .all(|call| recovered.message.tool_calls.iter().any(|made| made.id == call.id))
            });
            if !unanswered.is_empty()
                && let Some(paused) = self.handle_tool_calls(&unanswered, asked).await?
            {
                return Ok(paused);
            }
        }
        self.agent_loop(memory.as_ref()).await
    }

    /// Calls the model and runs tools until the model answers, a call needs a person or the
    /// client, or the turn stops.
    async fn agent_loop(&mut self, memory: Option<&Memory>) -> Result<Outcome, Stop> {
        loop {
            self.cancel.check()?;
            let limit = self.agent.limits().max_iterations;
            if self.model_calls >= limit {
                return Err(Stop::Failed(format!(
                    "the agent reached its limit of {limit} model call{} in one turn",
                    if limit == 1 { "" } else { "s" }
                )));
            }
            let reservation = self.reserve(Step::Model).await?;
            let called = self.call_model().await;
            let charged = self.charged.take();
            if let Some(reservation) = reservation {
                let spent = Spent {
                    usage: BudgetUsage {
                        tokens_used: charged.map_or(0, |usage| usage.total_tokens()),
                        steps_used: 1,
                        ..BudgetUsage::default()
                    },
                    model: charged.map(|usage| (self.agent.model().info().id, usage)),
                };
                self.settle(&reservation, spent).await?;
            }
            let output = called?;
            if output.message.tool_calls.is_empty() {
                self.complete_step(None, output.message.content.clone()).await?;
                if let Some(memory) = memory {
                    self.update_memory(memory).await?;
                }
                return Ok(Outcome::Answered(Some(output)));
            }
            let calls = output.message.tool_calls.clone();
            if let Some(paused) = self.handle_tool_calls(&calls, Some(output)).await? {
                return Ok(paused);
            }
        }
    }

    /// Runs the agent on a sub-agent thread of the turn (`self.thread`, `self.run` the
    /// member run, already stored): `thread.created`, the task as the thread's first
    /// message, the agent loop, the member run's end state, `thread.done`.
    pub(crate) async fn run_thread(
        mut self,
        task: String,
        parent: ThreadParent,
        title: String,
        instance: Option<ThreadInstance>,
    ) -> ThreadRun {
        let agent = ThreadAgent {
            name: self.agent.name().to_owned(),
            input: task.clone(),
            model: Some(self.agent.model().info().id),
        };
        let created = EventPayload::ThreadCreated { parent: parent.clone(), agent, title: title.clone() };
        let started = match self.emit(created).await {
            Ok(_) => match instance.as_ref() {
                Some(instance) => self.emit(instance_started(instance)).await.map(|_| ()),
                None => Ok(()),
            },
            Err(stop) => Err(stop),
        };
        let outcome = match started {
            Ok(()) => self.thread_loop(task).await,
            Err(stop) => Err(stop),
        };
        self.end_thread(outcome, parent, title, instance).await
    }

    /// Resumes a member thread that paused for a person or the client: its run's messages
    /// are the context, `answers` (this turn's input for the thread) answer its pending
    /// calls, and the loop continues to an answer.
    pub(crate) async fn resume_thread(
        mut self,
        answers: Vec<TurnInputItem>,
        parent: ThreadParent,
        title: String,
        instance: Option<ThreadInstance>,
    ) -> ThreadRun {
        // The instance goes on in this turn's mission: it says so, under its own id, so its
        // lifecycle ends in the mission it runs in.
        let restarted = match instance.as_ref() {
            Some(instance) => self.emit(instance_started(instance)).await.map(|_| ()),
            None => Ok(()),
        };
        let outcome = match restarted {
            Ok(()) => self.resumed_loop(answers).await,
            Err(stop) => Err(stop),
        };
        self.end_thread(outcome, parent, title, instance).await
    }

    async fn resumed_loop(&mut self, answers: Vec<TurnInputItem>) -> Result<Outcome, Stop> {
        let paused = self.run.clone();
        if let Some(instructions) = self.agent.instructions() {
            Arc::make_mut(&mut self.context).push(Message::system(instructions).into());
        }
        self.own_start = self.context.len();
        // The paused run's own messages, from a window of this agent's runs only: other
        // members' runs in between do not push it out.
        let query = HistoryQuery {
            include_member_runs: true,
            agent_id: paused.agent_id.clone(),
            ..HistoryQuery::default()
        };
        let history = self.store.history(self.session_id(), &query).await?;
        Arc::make_mut(&mut self.context).extend(
            history
                .into_iter()
                .filter(|stored| stored.run_id == paused.id)
                .map(|stored| stored.message.into()),
        );
        self.approved = approved_calls(&answers, &self.thread);
        Arc::make_mut(&mut self.run).input = answers;
        Arc::make_mut(&mut self.run).set_state(TurnState::Running);
        self.store.put_run(&self.run, Some(self.fence)).await?;
        self.apply_input(Some(&paused)).await?;
        if let Some((_, unanswered)) = self.unanswered_calls()
            && !unanswered.is_empty()
            && let Some(paused) = self.handle_tool_calls(&unanswered, None).await?
        {
            return Ok(paused);
        }
        self.agent_loop(None).await
    }

    /// Records how a thread ended: the member run's state, the instance's end and
    /// `thread.done` (not for a paused thread, which lives on into the next turn).
    async fn end_thread(
        &mut self,
        outcome: Result<Outcome, Stop>,
        parent: ThreadParent,
        title: String,
        instance: Option<ThreadInstance>,
    ) -> ThreadRun {
        self.close_unanswered(&outcome).await;
        // What the thread staged is stored before its run's end state (best effort: a
        // failed write keeps it staged for the turn's next step).
        let _flushed = self.sink.flush().await;
        let completed_at = Timestamp::now();
        let metrics = (self.model_calls > 0).then_some(self.metrics);
        let (state, result) = match outcome {
            Ok(Outcome::Answered(output)) => {
                let answer =
                    output.as_ref().and_then(|output| output.message.content.clone()).unwrap_or_default();
                let state = TurnState::Done {
                    output: output.clone().map(Box::new),
                    required_actions: Vec::new(),
                    completed_at,
                    metrics,
                };
                (state, Ok((answer, output)))
            }
            Ok(Outcome::Paused(output, required_actions)) => {
                Arc::make_mut(&mut self.run).set_state(TurnState::Done {
                    output: output.map(Box::new),
                    required_actions: required_actions.clone(),
                    completed_at,
                    metrics,
                });
                let result = match self.store.put_run(&self.run, Some(self.fence)).await {
                    Ok(()) => {
                        let paused = Resume::Paused {
                            run: Box::new(RunRecord::clone(&self.run)),
                            thread: self.thread.clone(),
                            answers: Vec::new(),
                            parent,
                            title,
                            team: instance.map(|instance| Box::new(instance.team)),
                        };
                        let here = self.sink.locals.get::<PausedHere>();
                        here.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(paused);
                        Err(ThreadEnd::Paused(required_actions))
                    }
                    Err(error) => {
                        Err(ThreadEnd::Failed(format!("recording the paused thread failed: {error}")))
                    }
                };
                return ThreadRun { thread_id: self.thread.clone(), run_id: self.run.id, result };
            }
            Err(Stop::Cancelled(reason)) => {
                let message = format!("cancelled: {}", reason.as_str());
                (TurnState::Cancelled { reason, completed_at, metrics }, Err(message))
            }
            Err(Stop::Failed(message)) => {
                (TurnState::Error { message: message.clone(), completed_at, metrics }, Err(message))
            }
            Err(Stop::LeaseLost) => {
                return ThreadRun {
                    thread_id: self.thread.clone(),
                    run_id: self.run.id,
                    result: Err(ThreadEnd::Failed("the turn lost its lease".to_owned())),
                };
            }
        };
        if instance.is_some() {
            let ended = match &state {
                TurnState::Cancelled { reason, .. } => {
                    EventPayload::InstanceCancelled { reason: Some(reason.as_str().to_owned()) }
                }
                TurnState::Error { message, .. } => EventPayload::InstanceFailed { error: message.clone() },
                _ => EventPayload::InstanceCompleted {
                    output: result.as_ref().ok().map(|(answer, _)| answer.clone()),
                    usage: None,
                },
            };
            // The thread's end below is recorded whether or not this event could be.
            let _recorded = self.emit(ended).await;
        }
        Arc::make_mut(&mut self.run).set_state(state);
        let mut result = result;
        let mut stored = self.store.put_run(&self.run, Some(self.fence)).await;
        if matches!(stored, Err(StoreError::TooLarge { .. })) {
            // The end state is too large to keep with the member's task (both near the
            // record limit): the thread ends with a small error instead (its answer is in
            // its events) rather than staying open for ever.
            let message = "the thread's end is too large to keep with its task; its answer is in its events";
            tracing::warn!(run = %self.run.id, "{message}");
            Arc::make_mut(&mut self.run).set_state(TurnState::Error {
                message: message.to_owned(),
                completed_at,
                metrics: None,
            });
            result = Err(message.to_owned());
            stored = self.store.put_run(&self.run, Some(self.fence)).await;
        }
        let outcome = match &result {
            Ok((_, Some(output))) => ThreadOutcome::Done { output: Box::new(output.clone()) },
            Ok((_, None)) => {
                ThreadOutcome::Error { error: "the member gave no answer".to_owned(), output: None }
            }
            Err(error) => ThreadOutcome::Error { error: error.clone(), output: None },
        };
        let done = EventPayload::ThreadDone { parent: Some(parent), title, outcome };
        let recorded = match stored {
            Ok(()) => self.emit(done).await.map(|_| ()),
            Err(error) => Err(error.into()),
        };
        let result = match recorded {
            Ok(()) => result.map_err(ThreadEnd::Failed),
            Err(_) => Err(ThreadEnd::Failed("recording the end of the thread failed".to_owned())),
        };
        ThreadRun { thread_id: self.thread.clone(), run_id: self.run.id, result }
    }

    async fn thread_loop(&mut self, task: String) -> Result<Outcome, Stop> {
        if let Some(instructions) = self.agent.instructions() {
            Arc::make_mut(&mut self.context).push(Message::system(instructions).into());
        }
        self.own_start = self.context.len();
        self.persist(vec![Message::user(task)]).await?;
        self.agent_loop(None).await
    }

    /// The system prompt and the history window, this turn's own messages last.
    async fn load_context(&mut self) -> Result<(), Stop> {
        // The turn's own run is the newest and always in the window: with a window of no
        // runs, its input (or a recovered turn's progress) would be applied twice.
        let window = self.agent.limits().history_runs.max(1);
        let mut last_runs = window;
        let turn_id = self.turn_id();
        // A turn that goes on from calls an earlier turn paused on (answering them, or
        // after an authorization, with no input) starts with their results: the message
        // that made the calls is always in the window (providers refuse a result without
        // its call, and the boundary step looks for the calls there). Runs that added no
        // message (a member paused again) may stand between.
        let answers = self.run.input.is_empty()
            || self.run.input.iter().any(|item| !matches!(item, TurnInputItem::Message(_)));
        let history = loop {
            let query = HistoryQuery { last_runs: Some(last_runs), ..HistoryQuery::default() };
            let history = self.store.history(self.session_id(), &query).await?;
            let widest = window.saturating_add(MAX_RESUME_CHAIN);
            let earlier_calls = history.iter().any(|stored| stored.run_id != turn_id && makes_calls(stored));
            if answers && !earlier_calls && last_runs < widest {
                // Doubled: a few reads at most, on this rare path.
                last_runs = last_runs.saturating_mul(2).min(widest);
                continue;
            }
            break history;
        };
        // How many of the earlier runs' messages the window leaves out, counted here so
        // that each message is moved once, into the context.
        let earlier: Vec<&HistoryMessage> =
            history.iter().filter(|stored| stored.run_id != turn_id).collect();
        // Widened, the window starts at the run that made the calls, no earlier.
        let mut start = 0;
        if last_runs > window
            && let Some(calls) = earlier.iter().rposition(|stored| makes_calls(stored))
        {
            let run = earlier[calls].run_id;
            start = earlier.iter().position(|stored| stored.run_id == run).unwrap_or(calls);
        }
        // The window may begin with results of calls made in a run before it (a turn that
        // answered its previous turn's calls): they go, for the same reason.
        let skip =
            start + earlier[start..].iter().take_while(|stored| stored.message.role == Role::Tool).count();
        let own_count = history.len() - earlier.len();
        drop(earlier);
        // A fresh context (clearing a shared one would copy it first).
        let mut context = Vec::with_capacity(1 + history.len() - skip);
        if let Some(system) = self.main_system_prompt(Vec::new()) {
            context.push(Message::system(system).into());
        }
        let mut own = Vec::with_capacity(own_count);
        let mut skipped = 0;
        for stored in history {
            if stored.run_id == turn_id {
                own.push(ContextMessage::new(stored.message));
            } else if skipped < skip {
                skipped += 1;
            } else {
                context.push(ContextMessage::replayed(stored.message));
            }
        }
        self.own_start = context.len();
        context.extend(own);
        self.context = Arc::new(context);
        Ok(())
    }

    /// Finds the member threads the previous turn paused on, and this turn's answers for
    /// each, so their delegating calls resume them when they run again; and how the other
    /// threads of those calls ended, so they give their result without running again.
    ///
    /// A member's run is stored with the turn it started in: one that paused again in the
    /// turn that resumed it is found back along the turns that each ended waiting on it.
    async fn prepare_resumes(&mut self, previous: &RunRecord) -> Result<(), Stop> {
        let waiting_on = |turn: &RunRecord| -> HashSet<ThreadId> {
            let actions = turn.state.required_actions();
            actions.iter().filter_map(|record| record.action.thread_id()).cloned().collect()
        };
        let mut waiting = waiting_on(previous);
        waiting.remove(&self.thread);
        let mut turn = std::borrow::Cow::Borrowed(previous);
        let mut slots: Vec<((ThreadId, String), ResumeSlot)> = Vec::new();
        for depth in 0..MAX_RESUME_CHAIN {
            if waiting.is_empty() {
                break;
            }
            if depth > 0 {
                // The threads not found yet started earlier: in the turn before, if it too
                // ended waiting on them.
                let Some(earlier) = turn.previous_turn_id else { break };
                let earlier = self.store.get_run(earlier).await?;
                let before = waiting_on(&earlier);
                waiting.retain(|thread| before.contains(thread));
                turn = std::borrow::Cow::Owned(earlier);
                if waiting.is_empty() {
                    break;
                }
            }
            self.collect_resumes(&turn, &mut waiting, depth == 0, &mut slots).await?;
        }
        // A call of this thread that a dead process left in doubt, of a tool whose effects
        // are its threads, and that a person was asked to run again: its threads that had
        // answered before the crash give their answers instead of running again (the
        // others, ended as interrupted or failed, start afresh), in the turn that runs it
        // again and in each later turn that goes on with it (a thread it started afresh
        // paused). They are found back along the turns, up to the one that asked.
        let in_doubt_asked = |turn: &RunRecord| -> HashSet<String> {
            turn.state
                .required_actions()
                .iter()
                .filter(|record| record.action.thread_id() == Some(&self.thread))
                .flat_map(|record| match &record.action {
                    RequiredAction::ToolApproval { tool_calls, .. } => tool_calls.as_slice(),
                    _ => &[],
                })
                .filter(|call| call.may_have_run)
                .filter(|call| self.agent.tool(&call.name).is_some_and(|tool| tool.resumes_threads()))
                .map(|call| call.id.clone())
                .collect()
        };
        let mut open: HashSet<String> = in_doubt_asked(previous);
        open.extend(
            slots.iter().filter(|((thread, _), _)| *thread == self.thread).map(|((_, call), _)| call.clone()),
        );
        let mut turn = std::borrow::Cow::Borrowed(previous);
        // (Nothing to look for, the usual case, reads nothing.)
        for depth in 0..if open.is_empty() { 0 } else { MAX_RESUME_CHAIN } {
            if depth > 0 {
                let Some(earlier) = turn.previous_turn_id else { break };
                turn = std::borrow::Cow::Owned(self.store.get_run(earlier).await?);
            }
            let asked: HashSet<String> = in_doubt_asked(&turn).intersection(&open).cloned().collect();
            if asked.is_empty() {
                if depth > 0 {
                    break;
                }
                continue;
            }
            let mut answered = Vec::new();
            self.collect_resumes(&turn, &mut HashSet::new(), true, &mut answered).await?;
            slots.extend(answered.into_iter().filter(|((thread, call), slot)| {
                *thread == self.thread
                    && asked.contains(call)
                    && matches!(slot.resume, Resume::Answered { .. })
            }));
        }
        let mut resumes = self.resumes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (call, slot) in slots {
            resumes.entry(call).or_default().push(slot);
        }
        Ok(())
    }

    /// The resumptions of the members `turn` started (see [`Self::prepare_resumes`]): a
    /// thread in `waiting` (taken out of it) resumes, and so does each member between it
    /// and the turn (a team nested in a team, whose thread's delegating call runs again to
    /// resume it); the others give how they ended, all of them among the previous turn's own
    /// members (`all`), else those of the calls a resuming thread belongs to.
    async fn collect_resumes(
        &self,
        turn: &RunRecord,
        waiting: &mut HashSet<ThreadId>,
        all: bool,
        slots: &mut Vec<((ThreadId, String), ResumeSlot)>,
    ) -> Result<(), Stop> {
        let started_by: HashMap<ThreadId, (ThreadParent, String, Option<TeamContext>)> =
            crate::live::stored_events(self.store.as_ref(), turn.id, Order::Asc)
                .await
                .map_err(|error| Stop::Failed(format!("reading turn {} failed: {error}", turn.id)))?
                .into_iter()
                .filter_map(|event| match &event.payload {
                    EventPayload::ThreadCreated { parent, title, .. } => {
                        Some((event.thread_or_main(), (parent.clone(), title.clone(), event.team.clone())))
                    }
                    _ => None,
                })
                .collect();
        let started = |run: &RunRecord| {
            let (thread, agent) = (run.thread_id.clone()?, run.agent_id.clone()?);
            let (parent, title, team) = started_by.get(&thread)?;
            Some((thread, agent, parent, title, team))
        };
        // A member waiting on a thread resumes: the thread itself, or one it started.
        let resumes =
            |run: &RunRecord, thread: &ThreadId, waiting: &HashSet<ThreadId>| {
                waiting.contains(thread)
                    || run.state.required_actions().iter().any(|record| {
                        record.action.thread_id().is_some_and(|asking| waiting.contains(asking))
                    })
            };
        let mut parents = vec![(turn.id, all)];
        while let Some((parent_run, all)) = parents.pop() {
            let query = RunQuery { parent: ParentFilter::Of(parent_run), ..RunQuery::default() };
            let members =
                self.store.list_runs(self.session_id(), &query, &PageRequest::first(MAX_PAGE)).await?.items;
            let calls: HashSet<&str> = members
                .iter()
                .filter_map(|run| started(run).filter(|(thread, ..)| resumes(run, thread, waiting)))
                .map(|(_, _, parent, ..)| parent.tool_call_id.as_str())
                .collect();
            for run in &members {
                let Some((thread, agent, parent, title, team)) = started(run) else { continue };
                let call = &parent.tool_call_id;
                let resume = if resumes(run, &thread, waiting) {
                    if !waiting.remove(&thread) {
                        // A team between the turn and the waiting thread: its own members
                        // resume under it.
                        parents.push((run.id, false));
                    }
                    let answers = self
                        .run
                        .input
                        .iter()
                        .filter(|item| input_thread(item) == Some(&thread))
                        .cloned()
                        .collect();
                    Resume::Paused {
                        run: Box::new(run.clone()),
                        thread,
                        answers,
                        parent: parent.clone(),
                        title: title.clone(),
                        team: team.clone().map(Box::new),
                    }
                } else if !all && !calls.contains(call.as_str()) {
                    continue;
                } else {
                    match &run.state {
                        TurnState::Done { output, required_actions, .. } if required_actions.is_empty() => {
                            let output = output.clone();
                            let answer = output
                                .as_ref()
                                .and_then(|output| output.message.content.clone())
                                .unwrap_or_default();
                            Resume::Answered { thread, run_id: run.id, answer, output }
                        }
                        TurnState::Cancelled { reason, .. } => Resume::Failed {
                            thread,
                            run_id: run.id,
                            error: format!("cancelled: {}", reason.as_str()),
                        },
                        TurnState::Error { message, .. } => {
                            Resume::Failed { thread, run_id: run.id, error: message.clone() }
                        }
                        _ => continue,
                    }
                };
                let task = run.input.iter().find_map(|item| match item {
                    TurnInputItem::Message(message) => Some(message.content.text()),
                    _ => None,
                });
                slots.push((
                    (parent.thread_id.clone(), call.clone()),
                    ResumeSlot { agent, task: task.unwrap_or_default(), resume, claimed: false },
                ));
            }
        }
        Ok(())
    }

    /// With memory enabled: a Memory facade for this session and user, and its summary,
    /// profile and metadata injected into the system prompt.
    async fn prepare_memory(&mut self) -> Result<Option<Memory>, Stop> {
        let Some(settings) = self.agent.memory() else { return Ok(None) };
        let last_messages = settings.config.num_last_messages;
        let session = self.store.get_session(self.session_id()).await?;
        let config = MemoryConfig {
            session_id: Some(session.id),
            user_id: Some(session.user_id.clone().unwrap_or_else(|| self.run.created_by.subject_id.clone())),
            full_session_memory: false,
            ..settings.config.clone()
        };
        let memory = Memory::new(self.store.clone(), settings.analysis_model.clone(), config)
            .map_err(|error| Stop::Failed(format!("memory: {error}")))?;
        // History is the runner's own window (read by `load_context`), limited here as
        // the settings say; the facade (without `full_session_memory`) does not read it again.
        self.limit_history(last_messages);
        let prepared = memory
            .prepare_inputs_for_task(Some(session.session_type), None)
            .await
            .map_err(|error| Stop::Failed(format!("memory: {error}")))?;
        let injections: Vec<String> =
            [prepared.system_prompt_injection, prepared.context_injection, prepared.metadata_injection]
                .into_iter()
                .flatten()
                .collect();
        if !injections.is_empty()
            && let Some(system) = self.main_system_prompt(injections)
        {
            let message = ContextMessage::from(Message::system(system));
            if self.context.first().is_some_and(|first| first.role == Role::System) {
                Arc::make_mut(&mut self.context)[0] = message;
            } else {
                Arc::make_mut(&mut self.context).insert(0, message);
                self.own_start += 1;
            }
        }
        Ok(Some(memory))
    }

    /// The main thread's system prompt: the agent's instructions, the context the turn's
    /// caller gave (`RunRecord::client_context`), then `injections` (memory's), each a
    /// paragraph; `None` when all are absent.
    fn main_system_prompt(&self, injections: Vec<String>) -> Option<String> {
        if self.run.client_context.is_empty() && injections.is_empty() {
            return self.agent.instructions().map(str::to_owned);
        }
        let parts: Vec<String> = self
            .agent
            .instructions()
            .map(str::to_owned)
            .into_iter()
            .chain(ClientContext::prompt(&self.run.client_context))
            .chain(injections)
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }

    /// Keeps about the last `last` messages of the earlier turns' history in the context
    /// (all when `None`): the cut moves back to before the calls of any tool result right
    /// after it (a result without its call is refused by providers; this turn's own
    /// messages may start with results of calls the previous turn paused on).
    fn limit_history(&mut self, last: Option<usize>) {
        let first = usize::from(self.context.first().is_some_and(|message| message.role == Role::System));
        let earlier = self.own_start.saturating_sub(first);
        let mut cut = earlier - last.map_or(earlier, |last| last.min(earlier));
        while cut > 0 && self.context.get(first + cut).is_some_and(|message| message.role == Role::Tool) {
            cut -= 1;
        }
        if cut > 0 {
            Arc::make_mut(&mut self.context).drain(first..first + cut);
            self.own_start -= cut;
        }
    }

    /// After a completed turn: updates the summary and the profile. A failure is logged and
    /// named in `memory.update.completed`; it does not fail the turn, whose answer stands. A
    /// cancellation or the turn's timeout cuts the update at once, and says so there too.
    async fn update_memory(&mut self, memory: &Memory) -> Result<(), Stop> {
        if !memory.updates_after_runs() {
            return Ok(());
        }
        self.emit(EventPayload::MemoryUpdateStarted {}).await?;
        let messages: Vec<Message> =
            self.context[self.own_start..].iter().map(ContextMessage::to_message).collect();
        // A cancellation (or the turn's timeout) cuts the update at once, its model request
        // with it: the answer stands, and what the update had stored before stays.
        let mut cancel = self.cancel.clone();
        let error = tokio::select! {
            // A cancellation already made wins over an update that could still finish.
            biased;
            reason = cancel.cancelled() => {
                tracing::info!(turn = %self.turn_id(), reason = reason.as_str(), "a memory update was cut short");
                Some(match reason {
                    CancellationReason::ServerExecutionTimeout => {
                        "cut short: the turn's time ran out after its answer".to_owned()
                    }
                    // Stored only where the turn is not fenced out (a hand-over fences it
                    // first), so seldom seen; said plainly all the same.
                    CancellationReason::Abandoned => "cut short: the turn was handed over".to_owned(),
                    other => format!("cut short: the turn was cancelled ({}) after its answer", other.as_str()),
                })
            }
            updated = memory.update_memory_under(self.turn_id(), &messages, Some(self.fence)) => {
                updated.err().map(|error| {
                    tracing::warn!(turn = %self.turn_id(), %error, "updating memory after the turn failed");
                    match error {
                        MemoryError::MemoryUpdate { reason, .. } => reason,
                        other => other.to_string(),
                    }
                })
            }
        };
        self.emit(EventPayload::MemoryUpdateCompleted { error }).await?;
        Ok(())
    }

    /// After a crash: adopt a `model.message` that was stored as an event but not yet as a
    /// history message, and remember which tool results were already emitted.
    async fn reconcile(&mut self, stored: &[EventEnvelope]) -> Result<(), Stop> {
        let messages: Vec<&ModelMessage> = stored
            .iter()
            .filter(|event| event.thread_or_main() == self.thread)
            .filter_map(|event| match &event.payload {
                EventPayload::ModelMessage(message) => Some(message),
                _ => None,
            })
            .collect();
        self.recovered_output = stored.iter().rev().find_map(|event| match &event.payload {
            EventPayload::ModelMessage(message) if event.thread_or_main() == self.thread => {
                Some(ThreadMessage {
                    id: event.event_id,
                    thread_id: self.thread.clone(),
                    created_at: event.created_at,
                    message: message.clone(),
                })
            }
            _ => None,
        });
        // This thread's own steps and answered calls: another thread's calls may have the
        // same ids.
        let own = || stored.iter().filter(|event| event.thread_or_main() == self.thread);
        self.steps = u32::try_from(
            own().filter(|event| matches!(event.payload, EventPayload::StepCompleted { .. })).count(),
        )
        .unwrap_or(u32::MAX);
        self.responded = own()
            .filter_map(|event| match &event.payload {
                EventPayload::ToolResponse { tool_call_id, .. } => Some(tool_call_id.clone()),
                _ => None,
            })
            .collect();
        let persisted =
            self.context[self.own_start..].iter().filter(|message| message.role == Role::Assistant).count();
        self.model_calls = u32::try_from(messages.len()).unwrap_or(u32::MAX);
        // The run's metrics count the calls made before the crash too, as their messages
        // were stored (with the provider's usage; without one, an estimate of the output).
        for message in &messages {
            self.metrics.add(&message.usage.unwrap_or_else(|| Usage::estimate::<Message>(&[], message)));
        }
        if let Some(last) = messages.get(persisted).filter(|_| messages.len() == persisted + 1) {
            self.persist(vec![Message::from_model(last)]).await?;
        }
        Ok(())
    }

    /// Adds messages to the run's history: staged with the turn's next step on the turn's
    /// own run, written at once on a member run.
    async fn persist(&mut self, messages: Vec<Message>) -> Result<(), Stop> {
        if messages.is_empty() {
            return Ok(());
        }
        // Shared by the step, the context and (in memory) the store: none is copied.
        let messages: Vec<Arc<Message>> = messages.into_iter().map(Arc::new).collect();
        if self.turn_id() == self.sink.turn_id {
            // Checked here, not when the step is written: a message the store would refuse
            // must not enter the context the turn goes on with.
            for message in &messages {
                rules::check_size("message", message)?;
            }
            self.sink.stage_messages(&messages).await;
        } else {
            self.store.append_messages(self.turn_id(), &messages, Some(self.fence)).await?;
        }
        Arc::make_mut(&mut self.context).extend(messages.into_iter().map(ContextMessage::new));
        Ok(())
    }

    /// Turns the input into messages, in input order: user messages, or the results of the
    /// previous turn's pending tool calls (running the approved ones).
    async fn apply_input(&mut self, previous: Option<&RunRecord>) -> Result<(), Stop> {
        let input = self.run.input.clone();
        let pending: HashMap<&str, &PendingToolCall> = previous
            .map(|run| run.state.required_actions())
            .unwrap_or_default()
            .iter()
            .filter(|record| record.action.thread_id() == Some(&self.thread))
            .flat_map(|record| match &record.action {
                RequiredAction::ToolApproval { tool_calls, .. }
                | RequiredAction::ToolResponse { tool_calls, .. } => tool_calls.as_slice(),
                _ => &[],
            })
            .map(|call| (call.id.as_str(), call))
            .collect();
        let mut slots: Vec<Option<Message>> = vec![None; input.len()];
        let mut approved = Vec::new();
        let mut denied = Vec::new();
        for (slot, item) in input.iter().enumerate() {
            if input_thread(item).is_some_and(|thread| *thread != self.thread) {
                // An answer for a member's thread: that thread takes it when it resumes.
                continue;
            }
            match item {
                TurnInputItem::Message(user) => slots[slot] = Some(Message::user(user.content.clone())),
                TurnInputItem::ToolResponse(response) => {
                    // A client's result is cut as a server-side tool's is.
                    let mut content = response.content.clone();
                    cap_output(&mut content, self.agent.limits().max_tool_output_bytes);
                    slots[slot] = Some(Message::tool(response.tool_call_id.clone(), content));
                }
                TurnInputItem::ToolApproval(approval) => {
                    let Some(call) = pending.get(approval.tool_call_id.as_str()) else { continue };
                    let call = ToolCall::function(call.id.clone(), call.name.clone(), call.arguments.clone());
                    match &approval.approval {
                        // A call a dead process started without a recorded result is left
                        // unanswered: the boundary step asks again, saying it is in doubt.
                        ApprovalDecision::Allow if self.in_doubt(&call) => {}
                        // A call that runs threads is left to the boundary step too, which
                        // runs it once as approved: a thread of it that pauses pauses the
                        // turn there, where run here its request would be dropped.
                        ApprovalDecision::Allow
                            if self
                                .agent
                                .tool(&call.function.name)
                                .is_some_and(|tool| tool.ends_on_cancel()) => {}
                        ApprovalDecision::Allow => approved.push((slot, call)),
                        ApprovalDecision::Deny { reason } => {
                            let content = denial(reason.as_deref());
                            denied.push((slot, call, ToolResult { content, is_error: true }));
                        }
                    }
                }
            }
        }
        let calls: Vec<ToolCall> = approved.iter().map(|(_, call)| call.clone()).collect();
        // Calls whose MCP server needs authorization stay unanswered; the boundary step
        // after the input pauses the turn for them. An approved call counts against the
        // thread's budget as any other: approving a call does not raise a budget. Whether
        // or not the approved calls run (a budget may refuse them, a cancellation stop
        // them first), the input's messages, answers and denials are kept; the calls that
        // did not run get their results when the thread ends.
        let (ran, stopped) = if calls.is_empty() {
            (ToolRuns::default(), None)
        } else {
            match self.run_budgeted(&calls).await {
                Ok((ran, exhausted)) => (ran, exhausted),
                Err(stop @ Stop::Cancelled(_)) => (ToolRuns::default(), Some(stop)),
                // A failure, or a lost lease (nothing more may be written), ends it at once.
                Err(stop) => return Err(stop),
            }
        };
        let mut results: HashMap<String, (ToolCall, ToolResult)> =
            ran.results.into_iter().map(|(call, result)| (call.id.clone(), (call, result))).collect();
        let decided = approved
            .into_iter()
            .filter_map(|(slot, call)| results.remove(&call.id).map(|(call, result)| (slot, call, result)))
            .chain(denied);
        for (slot, call, result) in decided {
            self.emit_tool_response(&call, &result).await?;
            slots[slot] = Some(Message::tool(call.id, result.content));
        }
        self.persist(slots.into_iter().flatten().collect()).await?;
        // What was answered is kept; then the thread stops (for its budget, a cancellation).
        stopped.map_or(Ok(()), Err)
    }

    /// Streams one model message into deltas and a stored `model.message`.
    async fn call_model(&mut self) -> Result<ThreadMessage, Stop> {
        // Everything before the call is stored and published before the wait on the model.
        self.sink.flush().await?;
        let mut request = ModelRequest::shared(Arc::clone(&self.context)).with_tools(self.tool_specs());
        // The forced first call answers the user's message: a turn that goes on after the
        // answers to required actions (or from a recovered step) has made it already, and
        // forcing it again would start over (a broadcast would ask every member again).
        if self.model_calls == 0 && self.context.last().is_some_and(|message| message.role == Role::User) {
            request.tool_choice = self.agent.first_tool_choice().cloned();
        }
        self.model_calls += 1;
        self.charged = None;
        // The prompt stays the context's first `sent` messages: the call only appends.
        let sent = self.context.len();
        let model = self.agent.model().clone();
        let mut cancel = self.cancel.clone();
        // One watch for the whole call, not a new one per delta.
        let cancelled = cancel.cancelled();
        tokio::pin!(cancelled);
        let mut stream = tokio::select! {
            stream = model.stream(request) => stream.map_err(|error| Stop::Failed(format!("model: {error}")))?,
            reason = &mut cancelled => return Err(Stop::Cancelled(reason)),
        };
        let message_id = EventId::new();
        let mut reasoning_started = false;
        let mut ids = CallIds::default();
        let completed = loop {
            let next = tokio::select! {
                next = stream.next() => next,
                reason = &mut cancelled => {
                    // Dropping the stream closes the provider's request at once.
                    drop(stream);
                    self.adopt_partial(sent).await?;
                    return Err(Stop::Cancelled(reason));
                }
            };
            match next {
                Some(Ok(mut delta)) => {
                    if !reasoning_started
                        && delta.reasoning_content.as_deref().is_some_and(|text| !text.is_empty())
                    {
                        reasoning_started = true;
                        self.emit(EventPayload::ReasoningStarted {}).await?;
                    }
                    for chunk in &mut delta.tool_calls {
                        ids.rename(chunk, |id| self.knows_call(id, sent));
                        if let Some(name) =
                            chunk.function.as_ref().and_then(|function| function.name.as_deref())
                            && chunk.tool_info.is_none()
                        {
                            chunk.tool_info = Some(self.tool_info(name));
                        }
                    }
                    match self.sink.delta(self.thread.clone(), message_id, delta).await {
                        Ok(Some(message)) => break message,
                        Ok(None) => {}
                        // A delta that does not merge: what the client saw so far is kept,
                        // as when the stream breaks off.
                        Err(Stop::Failed(error)) => {
                            drop(stream);
                            self.adopt_partial(sent).await?;
                            return Err(Stop::Failed(error));
                        }
                        Err(stop) => return Err(stop),
                    }
                }
                Some(Err(error)) => {
                    drop(stream);
                    self.adopt_partial(sent).await?;
                    return Err(Stop::Failed(format!("model: {error}")));
                }
                None => {
                    drop(stream);
                    self.adopt_partial(sent).await?;
                    return Err(Stop::Failed(
                        "model: the stream ended before the message was complete".to_owned(),
                    ));
                }
            }
        };
        let EventPayload::ModelMessage(message) = &completed.payload else {
            return Err(Stop::Failed(
                "the sequencer completed a message that is not a model.message".to_owned(),
            ));
        };
        self.charge(sent, message);
        if reasoning_started {
            let step =
                ReasoningStep { reasoning: message.reasoning_content.clone(), ..ReasoningStep::default() };
            self.stage(EventPayload::ReasoningStep { step }).await?;
            self.stage(EventPayload::ReasoningCompleted {}).await?;
        }
        let output = ThreadMessage {
            id: completed.event_id,
            thread_id: self.thread.clone(),
            created_at: completed.created_at,
            message: message.clone(),
        };
        self.persist(vec![Message::from_model(message)]).await?;
        Ok(output)
    }

    /// Records what a model call that sent the context's first `sent` messages and produced
    /// `message` is charged: its usage, or an estimate when the provider sent none (it sends
    /// none for a call cut off, which it bills too). The turn's metrics count the same.
    fn charge(&mut self, sent: usize, message: &ModelMessage) {
        let usage = message.usage.unwrap_or_else(|| Usage::estimate(&self.context[..sent], message));
        self.metrics.add(&usage);
        self.charged = Some(usage);
    }

    /// Keeps what a stopped model stream produced: stored as an event and in the history,
    /// and charged to the budget (estimated unless its usage came) with the prompt, the
    /// context's first `sent` messages. The provider has read the prompt and generated
    /// that much; a stream that stopped before its first delta produced nothing to keep
    /// and is charged nothing.
    async fn adopt_partial(&mut self, sent: usize) -> Result<(), Stop> {
        if let Some(event) = self.sink.finish_partial(&self.thread.clone()).await?
            && let EventPayload::ModelMessage(message) = &event.payload
        {
            self.charge(sent, message);
            let mut message = Message::from_model(message);
            // A cut-off message cannot carry tool calls: they have no results.
            message.tool_calls.clear();
            if message.content.is_some() {
                self.persist(vec![message]).await?;
            }
        }
        Ok(())
    }

    /// When a thread stops (cancelled or failed) after a model message whose calls have no
    /// results, records an error result for each: the history stays a valid conversation
    /// for the next turn (providers refuse tool calls without results). A pause keeps its
    /// calls open on purpose; a lost lease writes nothing.
    async fn close_unanswered(&mut self, outcome: &Result<Outcome, Stop>) {
        let why = match outcome {
            Err(Stop::Cancelled(reason)) => format!("the turn was cancelled ({})", reason.as_str()),
            Err(Stop::Failed(message)) => format!("the turn failed: {message}"),
            Ok(_) | Err(Stop::LeaseLost) => return,
        };
        let Some((_, unanswered)) = self.unanswered_calls() else { return };
        let journal = |id: &str| self.journal.get(id);
        let closing = closing_messages(&unanswered, journal, &self.run.input, &self.thread, &why);
        if !closing.is_empty() {
            // Best effort: the turn's end is recorded either way.
            let _recorded = self.persist(closing).await;
        }
    }

    /// The last assistant message after the last user message, and its calls that have no
    /// tool result after it (empty when it answered without calls, or all are answered).
    fn unanswered_calls(&self) -> Option<(usize, Vec<ToolCall>)> {
        unanswered_in(&self.context)
    }

    /// Runs `calls` within the thread's budget: each reserves a tool call first, all or
    /// none (a refusal stops the thread and none runs, and what was held is given back), and
    /// each settles after. Returns what the calls gave, with the stop of a settlement that
    /// took a budget past its limit: the results are kept first, then the thread stops.
    async fn run_budgeted(&mut self, calls: &[ToolCall]) -> Result<(ToolRuns, Option<Stop>), Stop> {
        let mut reservations = Vec::new();
        // A call outside the agent's capabilities is refused before it would run: it is
        // no tool call to count.
        for _ in calls.iter().filter(|call| self.agent.may_call(&call.function.name)) {
            match self.reserve(Step::Tool).await {
                Ok(Some(reservation)) => reservations.push(reservation),
                Ok(None) => {}
                Err(stop) => {
                    // The calls will not run: give back what was held for them.
                    self.release_all(&reservations).await;
                    return Err(stop);
                }
            }
        }
        // A cancellation that came before the calls start: none starts, and what was held
        // for them is given back rather than charged.
        if let Err(stop) = self.cancel.check() {
            self.release_all(&reservations).await;
            return Err(stop);
        }
        let ran = self.run_tools(calls).await;
        // Every reservation is settled, even after one that took a budget past its limit:
        // the calls ran, and a hold left unsettled would keep the ledgers held.
        let mut exhausted = None;
        for reservation in &reservations {
            let spent =
                Spent { usage: BudgetUsage { tool_calls_used: 1, ..BudgetUsage::default() }, model: None };
            if let Err(stop) = self.settle(reservation, spent).await {
                exhausted.get_or_insert(stop);
            }
        }
        Ok((ran?, exhausted))
    }

    /// Runs the calls of one model message that run on the server, and pauses the turn
    /// for the ones that need a person (approval) or the client (client-side tools).
    async fn handle_tool_calls(
        &mut self,
        calls: &[ToolCall],
        output: Option<ThreadMessage>,
    ) -> Result<Option<Outcome>, Stop> {
        // The model message that made the calls: this loop's, or after a recovery the
        // stored one they came from.
        let source = output.as_ref().map(|output| output.id).or_else(|| {
            self.recovered_output
                .as_ref()
                .filter(|recovered| {
                    calls
                        .iter()
                        .all(|call| recovered.message.tool_calls.iter().any(|made| made.id == call.id))
                })
                .map(|recovered| recovered.id)
        });
        let source_event_id = source.unwrap_or_else(EventId::new);
        *self.calling_message.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = source;
        let mut approvals = Vec::new();
        let mut responses = Vec::new();
        let mut runnable = Vec::new();
        for call in calls {
            // Built only for a call that waits on someone: most calls just run.
            let pending = |may_have_run| PendingToolCall {
                id: call.id.clone(),
                source_event_id,
                name: call.function.name.clone(),
                arguments: call.function.arguments.clone(),
                may_have_run,
            };
            if !self.agent.may_call(&call.function.name) {
                // Refused where it is dispatched, without asking anyone.
                runnable.push(call.clone());
            } else if self.is_client_tool(&call.function.name) {
                responses.push(pending(false));
            } else if self.agent.requires_approval(&call.function.name) && !self.approved.contains(&call.id) {
                approvals.push(pending(false));
            } else if self.in_doubt(call) {
                // Started by a process that died, with no result, and not safe to repeat:
                // the person deciding is told it may already have run (design §8a).
                approvals.push(pending(true));
            } else {
                runnable.push(call.clone());
            }
        }
        let (ran, exhausted) = self.run_budgeted(&runnable).await?;
        let ToolRuns { results, auth, paused } = ran;
        for (call, result) in &results {
            self.emit_tool_response(call, result).await?;
        }
        self.persist(
            results.into_iter().map(|(call, result)| Message::tool(call.id, result.content)).collect(),
        )
        .await?;
        // The results of calls that ran are kept; then the thread stops for its budget.
        if let Some(stop) = exhausted {
            return Err(stop);
        }
        let direct = self.direct_answer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(direct) = direct {
            // The message's calls still waiting (for a person, the client, an authorization
            // or a paused member) will not run: the user has their answer. Each gets a
            // result saying so, so the history stays a conversation providers take.
            if let Some((_, waiting)) = self.unanswered_calls() {
                let note = "The call was left: another call of the same message answered the user directly.";
                self.persist(
                    waiting.iter().map(|call| Message::tool(call.id.clone(), note.to_owned())).collect(),
                )
                .await?;
            }
            self.complete_step(None, direct.message.content.clone()).await?;
            return Ok(Some(Outcome::Answered(Some(direct))));
        }
        if approvals.is_empty() && responses.is_empty() && auth.is_empty() && paused.is_empty() {
            return Ok(None);
        }
        // Member threads' own requests keep their thread; they were emitted on it.
        let mut required = paused;
        if !auth.is_empty() {
            let event = self.emit(EventPayload::McpAuthRequired { servers: auth.clone() }).await?;
            required.push(RequiredActionRecord {
                id: event.event_id,
                created_at: event.created_at,
                action: RequiredAction::McpAuth { thread_id: Some(self.thread.clone()), servers: auth },
            });
        }
        if !approvals.is_empty() {
            let event =
                self.emit(EventPayload::ToolApprovalRequired { tool_calls: approvals.clone() }).await?;
            required.push(RequiredActionRecord {
                id: event.event_id,
                created_at: event.created_at,
                action: RequiredAction::ToolApproval {
                    thread_id: self.thread.clone(),
                    tool_calls: approvals,
                },
            });
        }
        if !responses.is_empty() {
            let event =
                self.emit(EventPayload::ToolResponseRequired { tool_calls: responses.clone() }).await?;
            required.push(RequiredActionRecord {
                id: event.event_id,
                created_at: event.created_at,
                action: RequiredAction::ToolResponse {
                    thread_id: self.thread.clone(),
                    tool_calls: responses,
                },
            });
        }
        Ok(Some(Outcome::Paused(output, required)))
    }

    /// Emits `step.completed`: a tool call with its observation, or the answer.
    async fn complete_step(
        &mut self,
        tool_call: Option<ToolCall>,
        observation: Option<String>,
    ) -> Result<(), Stop> {
        self.steps += 1;
        let payload = EventPayload::StepCompleted { step: self.steps, tool_call, observation };
        self.stage(payload).await
    }

    /// The tools the model is offered: the agent's, then the turn's own client-side tools.
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        let specs = self.agent.tool_specs();
        if self.run.client_tools.is_empty() {
            return specs;
        }
        specs.iter().chain(&self.run.client_tools).cloned().collect()
    }

    /// Whether `name` is a client-side tool: the agent's, or one the turn's caller offered.
    fn is_client_tool(&self, name: &str) -> bool {
        self.agent.is_client_tool(name) || self.run.client_tools.iter().any(|tool| tool.name == name)
    }

    /// The routing metadata of a call of `name`.
    fn tool_info(&self, name: &str) -> ToolInfo {
        let mut info = self.agent.tool_info(name);
        if self.run.client_tools.iter().any(|tool| tool.name == name) {
            info.is_client_side = true;
        }
        info
    }

    /// After a crash: the calls of this thread that asked for a spawn left undecided (denied
    /// by [`end_dead_threads`]) get that denial as their result, journaled with the next
    /// step, as a spawn denied in a live process gives it. Such a call had no effect (no
    /// instance starts without a decision), so it is not in doubt: it is not put to a
    /// person, and the model is told, and may ask again.
    async fn deny_undecided_spawns(&mut self, stored: &[EventEnvelope]) {
        for (request, _) in undecided_spawns(stored) {
            let Some(call) = request.team.as_ref().and_then(|team| team.tool_call_id.as_ref()) else {
                continue;
            };
            if request.thread_or_main() != self.thread {
                continue;
            }
            let Some(entry) = self.journal.get_mut(call).filter(|entry| entry.result.is_none()) else {
                continue;
            };
            let (code, error) = UNDECIDED_SPAWN;
            entry.result = Some(error_result(agentry_events::spawn_denial_result(code, error)));
            entry.completed_at = Some(Timestamp::now());
            let completed = entry.clone();
            self.sink.stage_journal(completed).await;
        }
    }

    /// Whether this thread knows a call `id`: in the context the model was sent (`sent`
    /// messages: the history and the turn's own), approved by the turn's input, journaled.
    fn knows_call(&self, id: &str, sent: usize) -> bool {
        self.approved.contains(id)
            || self.journal.contains_key(id)
            || self.context[..sent].iter().any(|message| message.tool_calls.iter().any(|call| call.id == id))
    }

    fn in_doubt(&self, call: &ToolCall) -> bool {
        self.journal.get(&call.id).is_some_and(|entry| {
            entry.result.is_none()
                && !self.settled.contains(&call.id)
                && !self.agent.tool(&call.function.name).is_some_and(|tool| tool.idempotent())
        })
    }

    /// After a crash: the threads that this thread's calls without a result started, and
    /// that had ended before the process stopped, give their stored ends when those calls
    /// run again (for tools whose only effects are such threads, [`Tool::resumes_threads`]),
    /// so no member runs twice; a call all of whose threads had ended is no longer in doubt.
    /// Threads the recovery ended as interrupted start afresh if a person allows the call.
    async fn prepare_recovered_threads(&mut self, stored: &[EventEnvelope]) -> Result<(), Stop> {
        let open: HashSet<&str> = self
            .journal
            .values()
            .filter(|entry| entry.result.is_none())
            .filter(|entry| self.agent.tool(&entry.tool_name).is_some_and(|tool| tool.resumes_threads()))
            .map(|entry| entry.tool_call_id.as_str())
            .collect();
        if open.is_empty() {
            return Ok(());
        }
        // Threads that ended by themselves: not those an earlier recovery ended as
        // interrupted (their tasks were not done).
        let ended: HashSet<ThreadId> = stored
            .iter()
            .filter(|event| match &event.payload {
                EventPayload::ThreadDone { outcome: ThreadOutcome::Error { error, .. }, .. } => {
                    !error.starts_with(INTERRUPTED)
                }
                EventPayload::ThreadDone { .. } => true,
                _ => false,
            })
            .map(EventEnvelope::thread_or_main)
            .collect();
        let mut threads: HashMap<&str, Vec<ThreadId>> = HashMap::new();
        for event in stored {
            if let EventPayload::ThreadCreated { parent, .. } = &event.payload
                && parent.thread_id == self.thread
                && let Some(call) = open.get(parent.tool_call_id.as_str())
            {
                threads.entry(call).or_default().push(event.thread_or_main());
            }
        }
        let mut slots = Vec::new();
        let run = self.run.clone();
        self.collect_resumes(&run, &mut HashSet::new(), true, &mut slots).await?;
        let mut resumes = self.resumes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for ((thread, call), slot) in slots {
            let ended_before = match &slot.resume {
                Resume::Answered { thread, .. } | Resume::Failed { thread, .. } => ended.contains(thread),
                Resume::Paused { .. } => false,
            };
            if thread == self.thread && open.contains(call.as_str()) && ended_before {
                resumes.entry((thread, call)).or_default().push(slot);
            }
        }
        drop(resumes);
        for (call, started) in threads {
            if started.iter().all(|thread| ended.contains(thread)) {
                self.settled.insert(call.to_owned());
            }
        }
        Ok(())
    }

    async fn emit_tool_response(&mut self, call: &ToolCall, result: &ToolResult) -> Result<(), Stop> {
        if self.responded.contains(&call.id) {
            return Ok(());
        }
        let payload = EventPayload::ToolResponse {
            tool_call_id: call.id.clone(),
            name: call.function.name.clone(),
            arguments: call.function.arguments.clone(),
            content: result.content.clone(),
            is_error: result.is_error,
        };
        self.stage(payload).await?;
        self.complete_step(Some(call.clone()), Some(result.content.clone())).await
    }

    /// Runs calls concurrently. On cancellation, running calls get the grace period to
    /// finish; those that finish in it are kept, then the turn stops.
    async fn run_tools(&mut self, calls: &[ToolCall]) -> Result<ToolRuns, Stop> {
        if calls.is_empty() {
            return Ok(ToolRuns::default());
        }
        // A cancellation that came before the calls start stops them: none starts (the
        // select below would otherwise start them for the grace meant for running ones).
        self.cancel.check()?;
        for call in calls {
            if self.responded.contains(&call.id) {
                continue;
            }
            let payload = EventPayload::ToolCallStarted {
                tool_call_id: call.id.clone(),
                name: call.function.name.clone(),
                arguments: call.function.arguments.clone(),
            };
            self.stage(payload).await?;
        }
        let mut prepared = Vec::with_capacity(calls.len());
        for (index, call) in calls.iter().enumerate() {
            // One id twice in one message would run the call twice: the second gets an error.
            if calls[..index].iter().any(|earlier| earlier.id == call.id) {
                let message = format!("tool call id {} appears twice in one message; it ran once", call.id);
                prepared.push(Prepared::Done(error_result(message)));
                continue;
            }
            prepared.push(self.prepare_call(call).await?);
        }
        let alone = prepared.iter().filter(|prepared| matches!(prepared, Prepared::Run { .. })).count() <= 1;
        // The calls, their journal entries and what led to them are stored and published
        // before any call runs.
        self.sink.flush().await?;
        let mut cancel = self.cancel.clone();
        let grace = self.agent.limits().cancel_grace;
        // Of several calls, those still running when a cancellation's grace runs out give
        // up one by one, so the results of the others are kept.
        let give_up = (calls.len() > 1).then(|| tokio::sync::watch::channel(false));
        let (results, stopped) = {
            let this = &*self;
            let gave_up = give_up.as_ref().map(|(_, gave_up)| gave_up);
            let mut runs = calls.iter().zip(prepared).map(|(call, prepared)| {
                // A thread stops by itself on cancellation and records how it ended: it is
                // waited for rather than dropped.
                let waits = this.agent.tool(&call.function.name).is_some_and(|tool| tool.ends_on_cancel());
                let mut gave_up = gave_up.filter(|_| !waits).cloned();
                async move {
                    let run = this.run_tool(call, prepared, alone);
                    let Some(gave_up) = gave_up.as_mut() else { return (call.clone(), Some(run.await)) };
                    tokio::select! {
                        // A call that finished as the grace ran out is kept.
                        biased;
                        ran = run => (call.clone(), Some(ran)),
                        _ = gave_up.wait_for(|gave_up| *gave_up) => (call.clone(), None),
                    }
                }
            });
            // A lone call (the usual case) runs in place: `join_all` would allocate its
            // future, large enough to make glibc consolidate its free lists each time.
            let mut running = std::pin::pin!(if calls.len() == 1 {
                let lone = runs.next();
                Either::Left(async move {
                    match lone {
                        Some(run) => vec![run.await],
                        None => Vec::new(),
                    }
                })
            } else {
                Either::Right(futures_util::future::join_all(runs))
            });
            let patient = calls
                .iter()
                .all(|call| this.agent.tool(&call.function.name).is_some_and(|tool| tool.ends_on_cancel()));
            tokio::select! {
                results = &mut running => (results, None),
                reason = cancel.cancelled() => {
                    if patient {
                        (running.await, Some(reason))
                    } else {
                        match tokio::time::timeout(grace, &mut running).await {
                            Ok(results) => (results, Some(reason)),
                            Err(_) => match &give_up {
                                Some((give_up, _)) => {
                                    let _sent = give_up.send(true);
                                    (running.await, Some(reason))
                                }
                                None => return Err(Stop::Cancelled(reason)),
                            },
                        }
                    }
                },
            }
        };
        // A cancellation that came as the calls ended (its threads ended on it) stops the
        // turn as well, rather than the turn going on, or pausing for a thread that paused.
        let stopped = stopped.or_else(|| match self.cancel.check() {
            Err(Stop::Cancelled(reason)) => Some(reason),
            _ => None,
        });
        let mut done = Vec::with_capacity(results.len());
        let mut auth: Vec<McpServerAuth> = Vec::new();
        let mut paused = Vec::new();
        let mut failed = None;
        for (call, ran) in results {
            // A call given up past the grace is left unanswered: the turn's end closes it.
            let Some(ran) = ran else { continue };
            let ran = match ran {
                Ok(ran) => ran,
                Err(stop) => {
                    failed.get_or_insert(stop);
                    continue;
                }
            };
            match ran {
                Ran::Result(result) => {
                    // A call id the model uses again in this turn gets this result.
                    if let Some(entry) = self.journal.get_mut(&call.id)
                        && entry.result.is_none()
                    {
                        entry.result = Some(result.clone());
                    }
                    done.push((call, result));
                }
                Ran::AuthRequired(server) => {
                    if !auth.iter().any(|known| known.id == server.id) {
                        auth.push(server);
                    }
                }
                Ran::Paused(required) => paused.extend(required),
            }
        }
        // One call's failure (its journal write refused) stops the turn, as a cancellation
        // does, but the calls that ran keep their results, as their journal does: the model
        // must not be told that work with side effects did not happen.
        if let Some(stop) = failed.or(stopped.map(Stop::Cancelled)) {
            for (call, result) in &done {
                self.emit_tool_response(call, result).await?;
            }
            self.persist(
                done.into_iter().map(|(call, result)| Message::tool(call.id, result.content)).collect(),
            )
            .await?;
            return Err(stop);
        }
        Ok(ToolRuns { results: done, auth, paused })
    }

    /// Checks a call before it runs and journals it as started: staged with the turn's
    /// next step on the turn's own run (so the flush before the calls stores it with their
    /// `tool.call.started`), written at once on a member run. A call journaled as completed
    /// is not run again; its stored result is used.
    async fn prepare_call(&mut self, call: &ToolCall) -> Result<Prepared, Stop> {
        let name = &call.function.name;
        if !self.agent.may_call(name) {
            let reason =
                format!("{} may not call `{name}`: it is not among its capabilities", self.agent.name());
            self.stage(EventPayload::CapabilityDenied { tool: name.clone(), reason: reason.clone() }).await?;
            return Ok(Prepared::Done(error_result(reason)));
        }
        let Some(tool) = self.agent.tool(name).cloned() else {
            return Ok(Prepared::Done(error_result(format!("unknown tool `{name}`"))));
        };
        let raw = call.function.arguments.trim();
        let arguments: Value = if raw.is_empty() {
            Value::Object(serde_json::Map::new())
        } else {
            match serde_json::from_str(raw) {
                Ok(arguments) => arguments,
                Err(error) => {
                    return Ok(Prepared::Done(error_result(format!(
                        "the arguments are not valid JSON: {error}"
                    ))));
                }
            }
        };
        if let Err(error) = tool.validate(&arguments) {
            return Ok(Prepared::Done(error_result(error.to_string())));
        }
        let entry = JournalEntry {
            turn_id: self.turn_id(),
            tool_call_id: call.id.clone(),
            tool_name: name.clone(),
            idempotency_key: format!("{}:{}", self.turn_id(), call.id),
            arguments_hash: arguments_hash(raw),
            started_at: Timestamp::now(),
            result: None,
            completed_at: None,
        };
        let journaled = match self.journal.get(&call.id) {
            // The engine holds the lease: what it journaled (or recovered) is the store's.
            Some(stored) => rules::journal_start(Some(stored), &entry),
            None if self.turn_id() == self.sink.turn_id => {
                self.sink.stage_journal(entry.clone()).await;
                Ok(None)
            }
            None => self.store.journal_start(&entry, Some(self.fence)).await.map(Some),
        };
        let stored = match journaled {
            Ok(stored) => stored,
            Err(StoreError::Conflict(Conflict::JournalMismatch { .. })) => {
                return Ok(Prepared::Done(error_result(format!(
                    "tool call {} was already made with other arguments; it was not run again",
                    call.id
                ))));
            }
            Err(error) => return Err(error.into()),
        };
        let stored = stored.unwrap_or(entry);
        if let Some(result) = &stored.result {
            return Ok(Prepared::Done(result.clone()));
        }
        self.journal.insert(call.id.clone(), stored);
        Ok(Prepared::Run { tool, arguments })
    }

    /// Runs one prepared call and journals its result. On the turn's own run a lone call's
    /// result is staged with the turn's next step, which stores it with its
    /// `tool.response`; otherwise (`alone` is false, as other calls run beside it, or the
    /// call is a member run's) it is written at once.
    async fn run_tool(&self, call: &ToolCall, prepared: Prepared, alone: bool) -> Result<Ran, Stop> {
        let (tool, arguments) = match prepared {
            Prepared::Done(result) => return Ok(Ran::Result(result)),
            Prepared::Run { tool, arguments } => (tool, arguments),
        };
        let Some(entry) = self.journal.get(&call.id) else {
            return Err(Stop::Failed(format!("tool call {} ran without its journal entry", call.id)));
        };
        let idempotency_key = entry.idempotency_key.clone();
        let mut context = ToolContext::new(
            self.session_id(),
            self.sink.turn_id,
            self.thread.clone(),
            call.id.clone(),
            idempotency_key,
        );
        context.scope = Some(Arc::new(ThreadScope {
            store: self.store.clone(),
            sink: self.sink.clone(),
            fence: self.fence,
            cancel: self.cancel.clone(),
            created_by: self.run.created_by.clone(),
            parent_run: self.run.id,
            direct_answer: self.direct_answer.clone(),
            resumes: self.resumes.clone(),
        }));
        context.message_id = *self.calling_message.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A tool that runs threads ends with them (on cancellation too) and records how: a
        // wall-clock limit would drop it part way. Its threads have their own limits.
        let timeout = if tool.ends_on_cancel() {
            Duration::MAX
        } else {
            tool.timeout().unwrap_or(self.agent.limits().tool_timeout)
        };
        // A tool that panics fails its call, not the turn: the model gets the panic's message
        // as an error result (the call ran, so it is journaled complete and not run again).
        // A tool that runs threads (members' engines, which may panic part way) is left to
        // the turn's own panic handling, which ends the threads and member runs it leaves.
        let running = tool.call(arguments, context);
        let ran = if tool.ends_on_cancel() {
            tokio::time::timeout(timeout, running).await.map(Ok)
        } else {
            let running = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(running));
            tokio::time::timeout(timeout, running).await
        };
        let mut result = match ran {
            Ok(Ok(Ok(content))) => ToolResult { content, is_error: false },
            Ok(Ok(Err(ToolError::Paused { required }))) => return Ok(Ran::Paused(required)),
            Ok(Ok(Err(ToolError::AuthRequired { server, auth_url }))) => {
                // Not a result: the call runs again once the user authorized. The journal
                // entry stays open, which is what it is: started, no result.
                return Ok(Ran::AuthRequired(McpServerAuth { id: server.id, name: server.name, auth_url }));
            }
            Ok(Ok(Err(error))) => error_result(error.to_string()),
            Ok(Err(panic)) => {
                let message = panic_message(panic.as_ref());
                tracing::error!(turn = %self.sink.turn_id, tool = %tool.spec().name, panic = %message, "a tool panicked");
                error_result(format!("the tool failed: it panicked ({message})"))
            }
            Err(_) => error_result(format!("the tool did not finish within {timeout:?}")),
        };
        // An error is cut at a floor of its own: a limit set low for outputs would leave
        // the model (and the operator) no word of why a call failed.
        let limit = self.agent.limits().max_tool_output_bytes;
        cap_output(&mut result.content, if result.is_error { limit.max(MIN_ERROR_BYTES) } else { limit });
        if result.is_error {
            // At most the first 200 characters: a tool's error may carry its own output.
            let said: String = result.content.chars().take(200).collect();
            tracing::info!(turn = %self.sink.turn_id, call = %call.id, tool = %tool.spec().name, error = %said, "a tool call failed");
        }
        // A result the store cannot keep would fail the journal after the call ran: the
        // model gets an error result instead, journaled, so the call is not run again.
        let completed = |result: ToolResult| JournalEntry {
            result: Some(result),
            completed_at: Some(Timestamp::now()),
            ..entry.clone()
        };
        let mut journaled = completed(result);
        if let Err(error) = rules::check_size("journal entry", &journaled) {
            journaled = completed(error_result(format!("the tool's result cannot be kept: {error}")));
        }
        let Some(result) = journaled.result.clone() else {
            return Err(Stop::Failed(format!("tool call {} lost its result", call.id)));
        };
        if self.turn_id() == self.sink.turn_id && alone {
            self.sink.stage_journal(journaled).await;
        } else {
            // Written at once, not staged: this result must not wait for the calls still
            // running, and a write of the sink's step here could be dropped part way when
            // the grace period ends.
            self.store
                .journal_complete(self.turn_id(), &call.id, &result, Timestamp::now(), Some(self.fence))
                .await?;
        }
        Ok(Ran::Result(result))
    }
}

/// The last assistant message after the last user message of `messages` (its index), and
/// its calls that have no tool result after it.
fn unanswered_in<M: AsRef<Message>>(messages: &[M]) -> Option<(usize, Vec<ToolCall>)> {
    let mut answered = HashSet::new();
    for (index, message) in messages.iter().enumerate().rev() {
        let message = message.as_ref();
        match message.role {
            Role::Tool => {
                answered.extend(message.tool_call_id.iter().cloned());
            }
            Role::Assistant => {
                let calls = message.tool_calls.iter().filter(|call| !answered.contains(&call.id)).cloned();
                return Some((index, calls.collect()));
            }
            _ => return None,
        }
    }
    None
}

/// Results for the calls an ending turn leaves unanswered (see
/// [`TurnEngine::close_unanswered`]), for a turn ended without its engine: the session's
/// next turns send its history to their model, and providers refuse calls without
/// results. The calls are those of the last assistant message of the turn's history as
/// its engine would have seen it (the turn's own stored and `staged` messages after its
/// earlier runs': a turn that answered calls of an earlier turn holds no assistant message
/// of its own); a call whose journal holds its result gets that result, the others say
/// why they did not complete. Best effort: none when the history cannot be read.
async fn closing_results(
    store: &dyn Store,
    run: &RunRecord,
    state: &TurnState,
    staged: Vec<Arc<Message>>,
    staged_journal: Vec<JournalEntry>,
) -> Vec<Arc<Message>> {
    let why = match state {
        TurnState::Cancelled { reason, .. } => format!("the turn was cancelled ({})", reason.as_str()),
        TurnState::Error { message, .. } => format!("the turn failed: {message}"),
        _ => "the turn ended first".to_owned(),
    };
    // Runs that added no message (a member paused again) may stand between the turn and
    // the message that made its calls: as many as a resumption chain may hold.
    let query = HistoryQuery { last_runs: Some(MAX_RESUME_CHAIN), ..HistoryQuery::default() };
    let Ok(history) = store.history(run.session_id, &query).await else { return Vec::new() };
    // Up to the turn's own messages: a newer run (another runner's checkpoint) is not its.
    let seen =
        history.iter().rposition(|stored| stored.run_id == run.id).map_or(history.len(), |last| last + 1);
    let messages: Vec<Arc<Message>> =
        history.into_iter().take(seen).map(|stored| stored.message).chain(staged).collect();
    let Some((_, calls)) = unanswered_in(&messages).filter(|(_, calls)| !calls.is_empty()) else {
        return Vec::new();
    };
    // What the engine had not stored yet first, then the store's.
    let mut journal = staged_journal;
    journal.extend(store.journal(run.id).await.unwrap_or_default());
    let journaled = |id: &str| journal.iter().find(|entry| entry.tool_call_id == id);
    closing_messages(&calls, journaled, &run.input, &ThreadId::main(), &why)
        .into_iter()
        .map(Arc::new)
        .collect()
}

/// A result for each of `calls` left open as its thread ends (`why` it ends), saying what
/// is known of it: its journaled result; else the answer or denial the turn's `input`
/// gives it on `thread` (a turn that stopped before applying its input); else that it may
/// have run (its journal says it started); else that it did not complete. The model must
/// not be told that work with side effects did not happen, nor lose a person's answer.
fn closing_messages<'a>(
    calls: &[ToolCall],
    journaled: impl Fn(&str) -> Option<&'a JournalEntry>,
    input: &[TurnInputItem],
    thread: &ThreadId,
    why: &str,
) -> Vec<Message> {
    calls
        .iter()
        .map(|call| {
            let answered = input.iter().find_map(|item| match item {
                TurnInputItem::ToolResponse(response)
                    if response.tool_call_id == call.id && response.thread_id == *thread =>
                {
                    Some(response.content.clone())
                }
                TurnInputItem::ToolApproval(approval)
                    if approval.tool_call_id == call.id && approval.thread_id == *thread =>
                {
                    match &approval.approval {
                        ApprovalDecision::Deny { reason } => Some(denial(reason.as_deref())),
                        ApprovalDecision::Allow => None,
                    }
                }
                _ => None,
            });
            let content = match (journaled(&call.id), answered) {
                (Some(JournalEntry { result: Some(result), .. }), _) => result.content.clone(),
                (_, Some(answer)) => answer,
                // Started, and not known to have ended: it may have had its effect.
                (Some(_), None) => format!("The call may have run; its result is unknown: {why}."),
                (None, None) => format!("The call did not complete: {why}."),
            };
            Message::tool(call.id.clone(), content)
        })
        .collect()
}

/// What the model is told of a call a person denied, with their reason if they gave one.
fn denial(reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("The user denied this tool call: {reason}"),
        None => "The user denied this tool call.".to_owned(),
    }
}

/// Whether a stored message made tool calls.
fn makes_calls(stored: &HistoryMessage) -> bool {
    stored.message.role == Role::Assistant && !stored.message.tool_calls.is_empty()
}

/// The thread an input item answers on (none for a user message).
fn input_thread(item: &TurnInputItem) -> Option<&ThreadId> {
    match item {
        TurnInputItem::Message(_) => None,
        TurnInputItem::ToolApproval(approval) => Some(&approval.thread_id),
        TurnInputItem::ToolResponse(response) => Some(&response.thread_id),
    }
}

/// The tool calls an input approves.
fn approved_calls(input: &[TurnInputItem], thread: &ThreadId) -> HashSet<String> {
    input
        .iter()
        .filter_map(|item| match item {
            TurnInputItem::ToolApproval(approval)
                if approval.approval == ApprovalDecision::Allow && approval.thread_id == *thread =>
            {
                Some(approval.tool_call_id.clone())
            }
            _ => None,
        })
        .collect()
}

/// Cuts a tool's output to at most `limit` bytes (at a character boundary), followed by a
/// note of how much was left out.
fn cap_output(content: &mut String, limit: usize) {
    if content.len() > limit {
        let mut end = limit;
        while !content.is_char_boundary(end) {
            end -= 1;
        }
        let left_out = content.len() - end;
        content.truncate(end);
        content.push_str(&format!(
            "\n[{left_out} more bytes of the tool's output were left out: at most {limit} bytes are kept]"
        ));
    }
}

fn error_result(content: String) -> ToolResult {
    ToolResult { content, is_error: true }
}

/// A stable hash of a call's arguments (FNV-1a, 64 bits): the journal uses it to notice a
/// call id reused with other arguments.
fn arguments_hash(arguments: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in arguments.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The code and reason of the denial of a spawn its process left undecided.
const UNDECIDED_SPAWN: (&str, &str) =
    ("approval_denied", "the process running the turn stopped before the spawn was decided");

/// The spawn requests among a turn's stored events that were never decided (a gated spawn
/// waiting for a person when its process stopped), with their roles. A decision closes
/// the request of the tool call it names; one stored without a call (by an earlier
/// version) closes the latest open request of its thread and role.
fn undecided_spawns(stored: &[EventEnvelope]) -> Vec<(&EventEnvelope, &str)> {
    let call = |event: &EventEnvelope| event.team.as_ref().and_then(|team| team.tool_call_id.clone());
    let mut open: Vec<(&EventEnvelope, &str)> = Vec::new();
    for event in stored {
        match &event.payload {
            EventPayload::SpawnRequested { requested_role, .. } => open.push((event, requested_role)),
            EventPayload::SpawnApproved { requested_role, .. }
            | EventPayload::SpawnDenied { requested_role, .. } => {
                let decided = call(event);
                let position = open.iter().rposition(|(request, role)| {
                    request.thread_id == event.thread_id
                        && role == requested_role
                        && (decided.is_none() || call(request).is_none() || call(request) == decided)
                });
                if let Some(position) = position {
                    open.remove(position);
                }
            }
            _ => {}
        }
    }
    open
}

/// The call ids of one model message, made unique: a provider may reuse the id of a call
/// the turn knows (some number their calls per response: `call_0` in every step), or give
/// two calls of one message the same id. The turn keys its journal, approvals and answers
/// by call id, so a reused id would make a call look made already (it would not run, or
/// get another call's result, or pass as the call an approval allowed). Such a call gets
/// the id with a suffix, in every chunk (a call is its chunks' `index`) and so in the
/// stored message, its events and the history sent back to the provider.
#[derive(Default)]
struct CallIds {
    /// The id each call of this message has, by the call's index.
    given: Vec<(u32, String)>,
}

impl CallIds {
    /// Gives `chunk` its call's id: the one given at the call's first chunk with an id;
    /// else the provider's, unless a call the turn knows (`known`) or another call of this
    /// message has it, which a suffix makes unique.
    fn rename(&mut self, chunk: &mut agentry_types::ToolCallDelta, known: impl Fn(&str) -> bool) {
        let Some(id) = chunk.id.as_mut() else { return };
        if let Some((_, given)) = self.given.iter().find(|(index, _)| *index == chunk.index) {
            id.clone_from(given);
            return;
        }
        let taken =
            |candidate: &str| known(candidate) || self.given.iter().any(|(_, other)| other == candidate);
        if taken(id) {
            *id = (2..).map(|n| format!("{id}_{n}")).find(|candidate| !taken(candidate)).unwrap_or_default();
        }
        self.given.push((chunk.index, id.clone()));
    }
}

/// The least of a tool's error kept, whatever [`crate::AgentLimits::max_tool_output_bytes`] says.
const MIN_ERROR_BYTES: usize = 1024;

/// Ends the sub-agent threads a dead process started in `run` (a turn) and left unfinished,
/// given the turn's stored events: their engines are gone, and a call that runs again starts
/// a thread of its own. Each thread's open member run (running, paused or pending) gets an
/// error state (best effort: one that cannot be stored stays open, and is logged); returned
/// are the events that end the threads, for the caller to emit on them:
/// `agent_team.instance.failed` for an instance that started, then `thread.done`. So clients
/// and the instance listings see them end instead of running for ever. A spawn requested
/// and not yet decided (waiting for a person's approval) is denied the same way
/// (`agent_team.spawn.denied`, `approval_denied`); see [`TurnEngine::deny_undecided_spawns`]
/// for its call.
pub(crate) async fn end_dead_threads(
    store: &dyn Store,
    run: &RunRecord,
    stored: &[EventEnvelope],
    fence: Fence,
) -> Vec<(ThreadId, Option<TeamContext>, EventPayload)> {
    let error = format!("{INTERRUPTED} before the thread ended");
    let mut ends = Vec::new();
    let mut dead = HashSet::new();
    for created in stored {
        let EventPayload::ThreadCreated { parent, title, .. } = &created.payload else { continue };
        let on_thread = || stored.iter().filter(|event| event.thread_id == created.thread_id);
        if on_thread().any(|event| matches!(event.payload, EventPayload::ThreadDone { .. })) {
            continue;
        }
        let thread = created.thread_or_main();
        let instance_ended = on_thread().any(|event| {
            matches!(
                event.payload,
                EventPayload::InstanceCompleted { .. }
                    | EventPayload::InstanceFailed { .. }
                    | EventPayload::InstanceCancelled { .. }
            )
        });
        let started = on_thread().find(|event| matches!(event.payload, EventPayload::InstanceStarted { .. }));
        if let Some(started) = started.filter(|_| !instance_ended) {
            let failed = EventPayload::InstanceFailed { error: error.clone() };
            ends.push((thread.clone(), started.team.clone(), failed));
        }
        let outcome = ThreadOutcome::Error { error: error.clone(), output: None };
        let done = EventPayload::ThreadDone { parent: Some(parent.clone()), title: title.clone(), outcome };
        ends.push((thread.clone(), created.team.clone(), done));
        dead.insert(thread);
    }
    // Spawns requested and not yet decided (a gated spawn waiting for a person when the
    // process stopped): denied, so the feed's lifecycle of each request closes. The call
    // that asked gets the denial as its result when the recovered turn runs it on.
    for (request, requested_role) in undecided_spawns(stored) {
        let denied = EventPayload::SpawnDenied {
            requested_role: requested_role.to_owned(),
            code: UNDECIDED_SPAWN.0.to_owned(),
            error: UNDECIDED_SPAWN.1.to_owned(),
        };
        ends.push((request.thread_or_main(), request.team.clone(), denied));
    }
    if dead.is_empty() {
        return ends;
    }
    use agentry_types::RunStatus;
    let open = RunQuery {
        parent: ParentFilter::Any,
        statuses: vec![RunStatus::Running, RunStatus::Paused, RunStatus::Pending],
        ..RunQuery::default()
    };
    let state = TurnState::Error { message: error, completed_at: Timestamp::now(), metrics: None };
    let mut page = PageRequest::first(MAX_PAGE);
    loop {
        let runs = match store.list_runs(run.session_id, &open, &page).await {
            Ok(runs) => runs,
            Err(failure) => {
                tracing::warn!(turn = %run.id, error = %failure, "the member runs of a dead thread could not be read");
                break;
            }
        };
        for member in runs.items {
            if member.thread_id.as_ref().is_some_and(|thread| dead.contains(thread)) {
                end_member(store, member, state.clone(), fence).await;
            }
        }
        match runs.next_token {
            Some(token) => page = PageRequest::after(token, MAX_PAGE),
            None => break,
        }
    }
    ends
}

/// Ends a turn no engine runs (left by a dead process) with `state`, under `fence`, the
/// session's lease just taken: its running member runs end the same way, and its
/// `turn.done` is stored with its end state and the lease's release, numbered above every
/// `seq` the dead process may have sent, so that a client following the turn sees it end.
pub(crate) async fn end_left_turn(
    store: &dyn Store,
    mut run: RunRecord,
    state: TurnState,
    fence: Fence,
) -> Result<(), StoreError> {
    let stored = crate::live::stored_events(store, run.id, Order::Asc).await.unwrap_or_default();
    let ends = end_dead_threads(store, &run, &stored, fence).await;
    end_running_members(store, &run, &state, fence).await;
    let high_water = store.high_water(run.id).await?;
    let mut emitter =
        TurnEmitter::new(agentry_events::TurnSequencer::resuming_after(run.session_id, run.id, high_water));
    let mut events: Vec<Arc<EventEnvelope>> = ends
        .into_iter()
        .map(|(thread, team, payload)| {
            Arc::new(match team {
                Some(team) => emitter.emit_team(Some(thread), team, payload),
                None => emitter.emit(Some(thread), payload),
            })
        })
        .collect();
    let messages = closing_results(store, &run, &state, Vec::new(), Vec::new()).await;
    let done = emitter.emit(None, EventPayload::TurnDone { state: state.clone() });
    run.set_state(state);
    let high_water = Some(done.seq);
    events.push(Arc::new(done));
    let step = TurnStep {
        high_water,
        events,
        messages,
        run: Some(Arc::new(run.clone())),
        release_lease: true,
        ..TurnStep::default()
    };
    store.write_step(run.id, &step, Some(fence)).await.map(drop)
}

/// Ends the running member runs of `run` with `state` (best effort: one that fails stays
/// running under a run that is over).
/// Stores `state` as a member run's end; whether it was stored (best effort: one that
/// cannot be stored stays open, and is logged).
async fn end_member(store: &dyn Store, mut member: RunRecord, state: TurnState, fence: Fence) -> bool {
    member.set_state(state);
    let stored = store.put_run(&member, Some(fence)).await;
    if let Err(error) = &stored {
        tracing::warn!(run = %member.id, %error, "a member run of a turn that ended stays open");
    }
    stored.is_ok()
}

/// Ends the member runs of `run` (at any depth) that a dead process stored and stopped
/// before their thread's first event (`thread.created`): no client saw those threads, so
/// they end with an error state and no event, instead of staying running for ever (best
/// effort, as [`end_dead_threads`]).
async fn end_unstarted_members(store: &dyn Store, run: &RunRecord, stored: &[EventEnvelope], fence: Fence) {
    /// Nesting levels looked into.
    const MAX_NESTING: usize = 8;
    let started: HashSet<ThreadId> = stored
        .iter()
        .filter(|event| matches!(event.payload, EventPayload::ThreadCreated { .. }))
        .map(EventEnvelope::thread_or_main)
        .collect();
    let mut parents = vec![run.id];
    for _ in 0..MAX_NESTING {
        let mut below = Vec::new();
        for parent in parents {
            let query = RunQuery { parent: ParentFilter::Of(parent), ..RunQuery::default() };
            let Ok(page) = store.list_runs(run.session_id, &query, &PageRequest::first(MAX_PAGE)).await
            else {
                continue;
            };
            for member in page.items {
                below.push(member.id);
                let unstarted = member.thread_id.as_ref().is_none_or(|thread| !started.contains(thread));
                if unstarted && matches!(member.state, TurnState::Running) {
                    let state = TurnState::Error {
                        message: format!("{INTERRUPTED} as this thread started"),
                        completed_at: Timestamp::now(),
                        metrics: None,
                    };
                    end_member(store, member, state, fence).await;
                }
            }
        }
        if below.is_empty() {
            break;
        }
        parents = below;
    }
}

async fn end_running_members(store: &dyn Store, run: &RunRecord, state: &TurnState, fence: Fence) {
    let members = RunQuery {
        parent: ParentFilter::Of(run.id),
        statuses: vec![agentry_types::RunStatus::Running],
        ..RunQuery::default()
    };
    if let Ok(page) = store.list_runs(run.session_id, &members, &PageRequest::first(MAX_PAGE)).await {
        for member in page.items {
            end_member(store, member, state.clone(), fence).await;
        }
    }
}

/// Ends a turn whose engine panicked: stores an error state and `turn.done` (returned
/// unpublished, like [`TurnEngine::drive`]'s); `None` when the store refuses (the lease was
/// lost, or the store failed), in which case a start or recovery pass ends the turn later
/// (the caller gives back the lease it may still hold).
/// The message a panic was raised with (`panic!("…")` and `expect` carry one).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

pub(crate) async fn fail_after_panic(
    store: &dyn Store,
    turn: TurnId,
    fence: Fence,
    sink: &TurnSink,
    panic: &str,
) -> Option<Arc<EventEnvelope>> {
    // As last stored (the engine's copy went with it): read only on this rare path rather
    // than kept aside for every turn. One that cannot be read, or that ended before the
    // panic, is left as it is (for the next start or recovery pass).
    let mut run = match store.get_run(turn).await {
        Ok(run) if !run.state.is_terminal() => run,
        Ok(_) => return None,
        Err(error) => {
            tracing::warn!(%turn, %error, "reading the run of a turn whose engine panicked failed");
            return None;
        }
    };
    let state = TurnState::Error {
        message: format!("internal error: the turn stopped unexpectedly: it panicked ({panic})"),
        completed_at: Timestamp::now(),
        metrics: None,
    };
    // Threads unwound with it: their member runs end, and the threads with them.
    let stored = crate::live::stored_events(store, run.id, Order::Asc).await.unwrap_or_default();
    for (thread, team, payload) in end_dead_threads(store, &run, &stored, fence).await {
        sink.stage_team(Some(thread), team, payload).await.ok()?;
    }
    end_running_members(store, &run, &state, fence).await;
    let (staged, staged_journal) = sink.staged_history().await;
    sink.stage_messages(&closing_results(store, &run, &state, staged, staged_journal).await).await;
    run.set_state(state.clone());
    sink.finish(Arc::new(run), EventPayload::TurnDone { state }).await.ok()
}

#[cfg(test)]
mod tests {
    use agentry_events::{TurnEmitter, TurnSequencer};
    use agentry_types::{SessionId, TurnId};

    use super::*;

    fn spawn_event(emitter: &mut TurnEmitter, call: Option<&str>, payload: EventPayload) -> EventEnvelope {
        let team = TeamContext { tool_call_id: call.map(str::to_owned), ..TeamContext::default() };
        emitter.emit_team(Some(ThreadId::main()), team, payload)
    }

    fn requested(role: &str) -> EventPayload {
        EventPayload::SpawnRequested {
            requested_role: role.to_owned(),
            template: None,
            task: None,
            justification: None,
            budget_override: None,
        }
    }

    fn approved(role: &str) -> EventPayload {
        EventPayload::SpawnApproved { requested_role: role.to_owned(), approval_id: None }
    }

    fn undecided_calls(stored: &[EventEnvelope]) -> Vec<Option<String>> {
        undecided_spawns(stored)
            .into_iter()
            .map(|(event, _)| event.team.as_ref().and_then(|team| team.tool_call_id.clone()))
            .collect()
    }

    #[test]
    fn a_reused_call_id_gets_one_no_call_of_the_turn_or_the_message_has() {
        let chunk = |index: u32, id: Option<&str>| agentry_types::ToolCallDelta {
            index,
            id: id.map(str::to_owned),
            kind: None,
            function: None,
            tool_info: None,
        };
        let known = |id: &str| ["call_0", "call_1"].contains(&id);
        let mut ids = CallIds::default();
        // Call 0's new `call_0_2` is kept; call 1's reused `call_0` becomes `call_0_3`, in
        // its later chunks too (an id sent again, or none); call 2's `x` is kept and
        // call 3's `x`, the same id in one message, becomes `x_2`; call 4's reused
        // `call_1` becomes `call_1_2`.
        let chunks = [
            (0, Some("call_0_2")),
            (1, Some("call_0")),
            (1, None),
            (1, Some("call_0")),
            (2, Some("x")),
            (3, Some("x")),
            (2, Some("x")),
            (4, Some("call_1")),
        ];
        let mut given = Vec::new();
        for (index, id) in chunks {
            let mut delta = chunk(index, id);
            ids.rename(&mut delta, known);
            given.push(delta.id);
        }
        let given: Vec<Option<&str>> = given.iter().map(Option::as_deref).collect();
        assert_eq!(
            given,
            [
                Some("call_0_2"),
                Some("call_0_3"),
                None,
                Some("call_0_3"),
                Some("x"),
                Some("x_2"),
                Some("x"),
                Some("call_1_2")
            ]
        );
    }

    #[test]
    fn a_decision_closes_the_request_of_its_own_call() {
        let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
        // Two spawns of one role wait; the first asked is approved: the second is open.
        let stored = vec![
            spawn_event(&mut emitter, Some("a"), requested("auditor")),
            spawn_event(&mut emitter, Some("b"), requested("auditor")),
            spawn_event(&mut emitter, Some("a"), approved("auditor")),
        ];
        assert_eq!(undecided_calls(&stored), [Some("b".to_owned())]);
        // Events stored without their call close the latest open request of the role.
        let stored = vec![
            spawn_event(&mut emitter, None, requested("auditor")),
            spawn_event(&mut emitter, None, requested("auditor")),
            spawn_event(&mut emitter, None, approved("auditor")),
            spawn_event(&mut emitter, Some("c"), requested("analyst")),
        ];
        let open = undecided_spawns(&stored);
        assert_eq!(
            open.iter().map(|(event, role)| (event.seq, *role)).collect::<Vec<_>>(),
            [(stored[0].seq, "auditor"), (stored[3].seq, "analyst")]
        );
    }
}
