//! Live streams: each running turn keeps every event it emitted, deltas included, in a
//! live log; subscribers read it from their cursor and wait for more, so a slow subscriber
//! is never skipped. Events before the log's first `seq` (a turn recovered by this process)
//! and turns not live here are read from the store.
//!
//! A delta costs the log a few hundred bytes beside its text, so once a turn's deltas pass
//! [`RuntimeOptions::live_delta_budget`](crate::RuntimeOptions::live_delta_budget) the log
//! merges each run of adjacent text deltas (one message, one kind of text, consecutive
//! `seq`s) into one entry holding the text and where each delta ended in it: four bytes a
//! delta. A reader behind gets such a run as one delta numbered like its last, carrying the
//! text of the deltas after its cursor; no text is lost or repeated, and every other event
//! stays as it was. A lone delta (threads streaming at once interleave theirs) stays as it
//! is.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agentry_events::{EventEnvelope, EventPayload};
use agentry_memory::{Order, Store};
use agentry_types::{
    CancellationReason, FunctionCallDelta, ModelMessageDelta, SessionId, Timestamp, ToolCallDelta,
    ToolCallKind, TurnId, TurnState,
};
use futures_core::Stream;
use tokio::sync::{Notify, watch};

use crate::error::RuntimeResult;

/// How often a subscriber following a turn that runs in another process reads the store.
const STORE_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Events read from the store per page.
const STORE_PAGE: usize = 256;
/// The most text one merged run of deltas holds: a reader far behind gets a long message
/// in pieces of at most this many bytes (more only when one delta alone is longer).
const MERGED_TEXT_MAX: usize = 64 * 1024;
/// About the most merged text one read copies for a reader (it takes one run at least).
const READ_TEXT_MAX: usize = 4 * MERGED_TEXT_MAX;
/// What a delta kept whole costs the log beside its text, counted against the budget: the
/// envelope, its `Arc` and the allocator's overhead of each allocation.
const DELTA_OVERHEAD: usize = std::mem::size_of::<EventEnvelope>() + 96;

/// One running (or recently finished) turn of this process.
#[derive(Debug)]
pub(crate) struct LiveTurn {
    pub(crate) session_id: SessionId,
    pub(crate) turn_id: TurnId,
    /// When its run was created: a turn of the same id created again (a session deleted and
    /// created again under a derived id, in this process or another) is another turn, and
    /// this log is not its.
    pub(crate) created_at: Timestamp,
    /// The fencing token of the lease the turn runs under.
    pub(crate) lease_token: u64,
    log: Mutex<LiveLog>,
    /// Bumped after every change of the log; subscribers wait on it.
    changed: watch::Sender<u64>,
    /// Told once the log is complete; [`LiveTurn::wait_done`] waits on it, so waiting for
    /// the end costs nothing per event.
    ended: Notify,
    /// The cancellation request, once made.
    cancel: watch::Sender<Option<CancellationReason>>,
}

#[derive(Debug)]
struct LiveLog {
    /// The `seq` of the first event: 1, or above the high-water mark for a recovered turn.
    first_seq: u64,
    /// In `seq` order.
    entries: Vec<Entry>,
    done: bool,
    /// Bytes of the deltas pushed since the last merge (see [`DELTA_OVERHEAD`]).
    loose_delta_bytes: usize,
    /// Past this many loose delta bytes, the log merges its deltas.
    delta_budget: usize,
    /// Where the next merge starts: entries before it were merged already or kept whole.
    merged_upto: usize,
}

/// One entry of a live log.
#[derive(Debug)]
enum Entry {
    /// An event as it was pushed.
    Event(Arc<EventEnvelope>),
    /// A run of text deltas merged into one.
    Merged(Box<MergedDeltas>),
}

impl Entry {
    /// The `seq` of the last event it holds.
    fn last_seq(&self) -> u64 {
        match self {
            Self::Event(event) => event.seq,
            Self::Merged(merged) => merged.last.seq,
        }
    }

    /// What a reader whose cursor is `after` gets of it.
    fn after(&self, after: u64) -> Arc<EventEnvelope> {
        match self {
            Self::Event(event) => event.clone(),
            Self::Merged(merged) => merged.after(after),
        }
    }

    fn as_event(&self) -> Option<&EventEnvelope> {
        match self {
            Self::Event(event) => Some(event),
            Self::Merged(_) => None,
        }
    }
}

/// Which text of a message a mergeable delta extends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextKind {
    Content,
    Reasoning,
    Refusal,
    /// The arguments of the tool call at this index.
    Arguments(u32),
}

impl TextKind {
    /// The kind and text of a delta that carries one piece of text and nothing else.
    fn of(delta: &ModelMessageDelta) -> Option<(Self, &str)> {
        if delta.finish_reason.is_some() || delta.usage.is_some() {
            return None;
        }
        match (&delta.content, &delta.reasoning_content, &delta.refusal, delta.tool_calls.as_slice()) {
            (Some(text), None, None, []) => Some((Self::Content, text)),
            (None, Some(text), None, []) => Some((Self::Reasoning, text)),
            (None, None, Some(text), []) => Some((Self::Refusal, text)),
            // A chunk naming no function continues its call (the builder refuses a first
            // chunk without a name); the id and type it may repeat go with its run.
            (None, None, None, [chunk]) if chunk.tool_info.is_none() => match &chunk.function {
                Some(FunctionCallDelta { name: None, arguments: Some(text) }) => {
                    Some((Self::Arguments(chunk.index), text))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// A delta carrying `text` of this kind.
    fn delta(self, text: String) -> ModelMessageDelta {
        match self {
            Self::Content => ModelMessageDelta { content: Some(text), ..ModelMessageDelta::default() },
            Self::Reasoning => {
                ModelMessageDelta { reasoning_content: Some(text), ..ModelMessageDelta::default() }
            }
            Self::Refusal => ModelMessageDelta { refusal: Some(text), ..ModelMessageDelta::default() },
            Self::Arguments(index) => ModelMessageDelta {
                tool_calls: vec![ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: Some(FunctionCallDelta { name: None, arguments: Some(text) }),
                    tool_info: None,
                }],
                ..ModelMessageDelta::default()
            },
        }
    }
}

/// A run of text deltas of one message, of one kind, with consecutive `seq`s.
#[derive(Debug)]
struct MergedDeltas {
    /// The last delta's envelope (its `seq`, ids, thread and time) without its text.
    last: EventEnvelope,
    kind: TextKind,
    /// The call id and type that argument chunks of the run repeat (each has the same):
    /// given again on the merged delta, so one that came late is not lost.
    repeats: (Option<String>, Option<ToolCallKind>),
    text: String,
    /// Where each delta's text ends in `text`, in order: the i-th has `seq`
    /// `last.seq + 1 - ends.len() + i`.
    ends: Vec<u32>,
}

/// The call id and type an argument chunk carries (none for other deltas).
fn repeats(delta: &ModelMessageDelta) -> (Option<String>, Option<ToolCallKind>) {
    match delta.tool_calls.as_slice() {
        [chunk] => (chunk.id.clone(), chunk.kind),
        _ => (None, None),
    }
}

impl MergedDeltas {
    /// A run of two deltas, if `second` continues `first` (one alone would cost more
    /// merged than kept).
    fn pair(first: &EventEnvelope, second: &EventEnvelope) -> Option<Self> {
        let EventPayload::ModelMessageDelta(delta) = &first.payload else { return None };
        let (kind, text) = TextKind::of(delta)?;
        let end = u32::try_from(text.len()).ok()?;
        let last = EventEnvelope {
            payload: EventPayload::ModelMessageDelta(ModelMessageDelta::default()),
            thread_id: first.thread_id.clone(),
            team: first.team.clone(),
            ..*first
        };
        let mut run = Self { last, kind, repeats: repeats(delta), text: text.to_owned(), ends: vec![end] };
        run.extend(second).then_some(run)
    }

    /// Takes the event in when it continues the run; says whether it did.
    fn extend(&mut self, event: &EventEnvelope) -> bool {
        let EventPayload::ModelMessageDelta(delta) = &event.payload else { return false };
        let Some((kind, text)) = TextKind::of(delta) else { return false };
        let fits = self.text.len() + text.len() <= MERGED_TEXT_MAX;
        if !(fits
            && kind == self.kind
            && repeats(delta) == self.repeats
            && event.seq == self.last.seq + 1
            && event.event_id == self.last.event_id
            && event.thread_id == self.last.thread_id
            && event.team == self.last.team)
        {
            return false;
        }
        self.text.push_str(text);
        // Within `MERGED_TEXT_MAX`, so within `u32`.
        self.ends.push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
        self.last.seq = event.seq;
        self.last.created_at = event.created_at;
        true
    }

    /// The text of the deltas after `after` (before the last), as one delta numbered like
    /// the last.
    fn after(&self, after: u64) -> Arc<EventEnvelope> {
        debug_assert!(after < self.last.seq, "a run read from its end");
        let first = self.last.seq + 1 - self.ends.len() as u64;
        let start = after
            .checked_sub(first)
            .and_then(|read| usize::try_from(read).ok())
            .and_then(|read| self.ends.get(read))
            .map_or(0, |&end| end as usize);
        let text = self.text.get(start..).unwrap_or_default().to_owned();
        let mut event = self.last.clone();
        let mut delta = self.kind.delta(text);
        if let [chunk] = delta.tool_calls.as_mut_slice() {
            (chunk.id, chunk.kind) = self.repeats.clone();
        }
        event.payload = EventPayload::ModelMessageDelta(delta);
        Arc::new(event)
    }
}

impl LiveLog {
    fn push(&mut self, event: Arc<EventEnvelope>) {
        debug_assert!(
            self.entries.last().is_none_or(|last| last.last_seq() < event.seq),
            "pushed out of order"
        );
        self.done |= event.payload.is_terminal();
        if let EventPayload::ModelMessageDelta(delta) = &event.payload {
            self.loose_delta_bytes += DELTA_OVERHEAD + delta_text_bytes(delta);
        }
        self.entries.push(Entry::Event(event));
        if self.loose_delta_bytes > self.delta_budget {
            self.merge_deltas();
        }
    }

    /// Merges the runs of text deltas pushed since the last merge (the last merged run may
    /// go on), leaving every other event as it was.
    fn merge_deltas(&mut self) {
        let pushed = self.entries.split_off(self.merged_upto.min(self.entries.len()));
        self.entries.reserve(pushed.len());
        for entry in pushed {
            let event = match entry {
                Entry::Event(event) => event,
                merged @ Entry::Merged(_) => {
                    self.entries.push(merged);
                    continue;
                }
            };
            if let Some(Entry::Merged(run)) = self.entries.last_mut()
                && run.extend(&event)
            {
                continue;
            }
            if let Some(last @ Entry::Event(_)) = self.entries.last_mut()
                && let Some(run) = last.as_event().and_then(|first| MergedDeltas::pair(first, &event))
            {
                *last = Entry::Merged(Box::new(run));
                continue;
            }
            self.entries.push(Entry::Event(event));
        }
        self.entries.shrink_to(self.entries.len() * 2);
        // The last entry may still grow: the next merge starts at it.
        self.merged_upto = self.entries.len().saturating_sub(1);
        self.loose_delta_bytes = 0;
    }
}

/// The bytes of text a delta carries.
fn delta_text_bytes(delta: &ModelMessageDelta) -> usize {
    let text = |text: &Option<String>| text.as_ref().map_or(0, String::len);
    let calls: usize = delta
        .tool_calls
        .iter()
        .map(|chunk| {
            chunk.function.as_ref().map_or(0, |function| text(&function.name) + text(&function.arguments))
        })
        .sum();
    text(&delta.content) + text(&delta.reasoning_content) + text(&delta.refusal) + calls
}

impl LiveTurn {
    pub(crate) fn new(
        (session_id, turn_id, created_at): (SessionId, TurnId, Timestamp),
        lease_token: u64,
        first_seq: u64,
        delta_budget: usize,
    ) -> Self {
        Self {
            session_id,
            turn_id,
            created_at,
            lease_token,
            log: Mutex::new(LiveLog {
                first_seq,
                entries: Vec::new(),
                done: false,
                loose_delta_bytes: 0,
                delta_budget,
                merged_upto: 0,
            }),
            changed: watch::channel(0).0,
            ended: Notify::new(),
            cancel: watch::channel(None).0,
        }
    }

    fn log(&self) -> MutexGuard<'_, LiveLog> {
        // A panic while holding the lock cannot leave the log half-written (pushes are
        // single operations), so a poisoned lock is still usable.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a numbered event and wakes the subscribers. The caller (the turn's
    /// sequencer) pushes in `seq` order.
    pub(crate) fn push(&self, event: Arc<EventEnvelope>) {
        let done = event.payload.is_terminal();
        self.log().push(event);
        self.announce();
        if done {
            self.ended.notify_waiters();
        }
    }

    /// Wakes the subscribers after a change of the log. With none there is nobody to wake:
    /// one subscribing later reads the log after subscribing, so it sees the change.
    fn announce(&self) {
        if self.changed.receiver_count() > 0 {
            self.changed.send_modify(|version| *version += 1);
        }
    }

    /// Marks the log complete without a terminal event (the turn lost its lease).
    pub(crate) fn close(&self) {
        self.log().done = true;
        self.announce();
        self.ended.notify_waiters();
    }

    /// The state the terminal event carries, once it was pushed.
    pub(crate) fn terminal_state(&self) -> Option<TurnState> {
        match self.log().entries.last().and_then(Entry::as_event).map(|event| &event.payload) {
            Some(EventPayload::TurnDone { state }) => Some(state.clone()),
            _ => None,
        }
    }

    /// Whether the terminal event was pushed.
    pub(crate) fn is_done(&self) -> bool {
        self.log().done
    }

    /// Whether the log was closed without a terminal event: the turn was handed over or
    /// lost its lease, and goes on (if at all) in another process or a later recovery.
    pub(crate) fn is_abandoned(&self) -> bool {
        let log = self.log();
        log.done
            && !log.entries.last().and_then(Entry::as_event).is_some_and(|event| event.payload.is_terminal())
    }

    /// Asks the turn to stop. Idempotent: the first reason wins.
    pub(crate) fn request_cancel(&self, reason: CancellationReason) {
        self.cancel.send_if_modified(|current| {
            if current.is_none() && !self.is_done() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn cancel_receiver(&self) -> watch::Receiver<Option<CancellationReason>> {
        self.cancel.subscribe()
    }

    /// Waits until the turn's terminal event was pushed.
    pub(crate) async fn wait_done(&self) {
        let ended = self.ended.notified();
        tokio::pin!(ended);
        // Registered before the check: an end marked after it wakes this waiter.
        ended.as_mut().enable();
        if self.is_done() {
            return;
        }
        ended.await;
    }

    /// Copies the events after `after` (up to `max`), the `seq` the log starts at, and
    /// whether the log is complete. Copies nothing when `after` is before the log's start:
    /// those events are read from the store first.
    fn read_after(&self, after: u64, max: usize, into: &mut VecDeque<Arc<EventEnvelope>>) -> (u64, bool) {
        let log = self.log();
        if after.saturating_add(1) < log.first_seq {
            return (log.first_seq, false);
        }
        // By `seq`, not by offset: a number missing from the log (a step that could not be
        // kept) must not shift what every later reader gets.
        let start = log.entries.partition_point(|entry| entry.last_seq() <= after);
        // Merged runs are copied for the reader under the lock: a few at a time, so a reader
        // far behind does not hold up the turn's pushes.
        let mut copied = 0;
        let mut taken = 0;
        for entry in log.entries.get(start..).unwrap_or_default().iter().take(max) {
            if copied >= READ_TEXT_MAX {
                break;
            }
            let event = entry.after(after);
            if let (Entry::Merged(_), EventPayload::ModelMessageDelta(delta)) = (entry, &event.payload) {
                copied += delta_text_bytes(delta);
            }
            into.push_back(event);
            taken += 1;
        }
        let complete = log.done && start.saturating_add(taken) >= log.entries.len();
        (log.first_seq, complete)
    }
}

/// A stream of a turn's events, in `seq` order, ending after the terminal event.
pub type EventStream = std::pin::Pin<Box<dyn Stream<Item = RuntimeResult<Arc<EventEnvelope>>> + Send>>;

enum Source {
    /// The turn is live in this process.
    Live { turn: Arc<LiveTurn>, changed: watch::Receiver<u64> },
    /// The turn is followed through the store (finished, or running in another process).
    Stored,
}

/// Looks the turn up among the turns live in this process.
pub(crate) type FindLive = Box<dyn Fn() -> Option<Arc<LiveTurn>> + Send + Sync>;

struct Subscription {
    store: Arc<dyn Store>,
    turn_id: TurnId,
    source: Source,
    /// For a turn followed through the store: whether it has become live here since (a
    /// recovery pass of this process took it over), to follow it live from then on.
    find_live: FindLive,
    /// The last `seq` handed out.
    cursor: u64,
    buffer: VecDeque<Arc<EventEnvelope>>,
    finished: bool,
}

/// Subscribes to a turn after `after`: live when the turn is live here, else from the store
/// until it becomes live here (`find_live`).
pub(crate) fn subscribe(
    store: Arc<dyn Store>,
    turn_id: TurnId,
    find_live: FindLive,
    after: u64,
) -> EventStream {
    let source = find_live().map_or(Source::Stored, live_source);
    let subscription = Subscription {
        store,
        turn_id,
        source,
        find_live,
        cursor: after,
        buffer: VecDeque::new(),
        finished: false,
    };
    Box::pin(futures_util::stream::unfold(subscription, |mut subscription| async move {
        let next = subscription.next().await;
        next.map(|item| (item, subscription))
    }))
}

fn live_source(turn: Arc<LiveTurn>) -> Source {
    // Subscribe to changes before the first read so no push is missed.
    let changed = turn.changed.subscribe();
    Source::Live { turn, changed }
}

impl Subscription {
    async fn next(&mut self) -> Option<RuntimeResult<Arc<EventEnvelope>>> {
        loop {
            if let Some(event) = self.buffer.pop_front() {
                self.cursor = event.seq;
                if event.payload.is_terminal() {
                    self.finished = true;
                    self.buffer.clear();
                }
                return Some(Ok(event));
            }
            if self.finished {
                return None;
            }
            if let Err(error) = self.fill().await {
                self.finished = true;
                return Some(Err(error));
            }
        }
    }

    /// Fills the buffer with the next events, waiting for them when there are none yet.
    async fn fill(&mut self) -> RuntimeResult<()> {
        loop {
            match &mut self.source {
                Source::Live { turn, changed } => {
                    changed.borrow_and_update();
                    let (first_seq, complete) = turn.read_after(self.cursor, 1024, &mut self.buffer);
                    if self.cursor.saturating_add(1) < first_seq {
                        // Events numbered before this process took the turn over: stored
                        // events only (the deltas of a dead process are gone).
                        let limit = first_seq - 1;
                        self.read_store(Some(limit)).await?;
                        if self.buffer.is_empty() {
                            self.cursor = limit;
                        }
                        return Ok(());
                    }
                    if !self.buffer.is_empty() {
                        return Ok(());
                    }
                    if complete {
                        if turn.is_abandoned() {
                            // Handed over or lost here: its end is for whoever runs it now.
                            self.source = Source::Stored;
                            continue;
                        }
                        self.finished = true;
                        return Ok(());
                    }
                    if changed.changed().await.is_err() {
                        self.finished = true;
                        return Ok(());
                    }
                }
                Source::Stored => {
                    // Running elsewhere, or not yet taken over by this process's recovery:
                    // once it runs here, its live log has what the store lacks (deltas).
                    if let Some(turn) = (self.find_live)() {
                        self.source = live_source(turn);
                        continue;
                    }
                    self.read_store(None).await?;
                    if !self.buffer.is_empty() {
                        return Ok(());
                    }
                    let run = self.store.get_run(self.turn_id).await?;
                    if run.state.is_terminal() {
                        // Read once more: the terminal event is appended after the state.
                        self.read_store(None).await?;
                        if self.buffer.is_empty() {
                            self.finished = true;
                        }
                        return Ok(());
                    }
                    tokio::time::sleep(STORE_POLL_INTERVAL).await;
                }
            }
        }
    }

    /// Reads stored events after the cursor, up to `through` when given.
    async fn read_store(&mut self, through: Option<u64>) -> RuntimeResult<()> {
        let events = self.store.turn_events(self.turn_id, Order::Asc, Some(self.cursor), STORE_PAGE).await?;
        self.buffer.extend(
            events
                .into_iter()
                .map(|stored| stored.event)
                .take_while(|event| through.is_none_or(|through| event.seq <= through))
                .map(Arc::new),
        );
        Ok(())
    }
}

/// Reads a stored event log whole, in `order`.
pub(crate) async fn stored_events(
    store: &dyn Store,
    turn_id: TurnId,
    order: Order,
) -> RuntimeResult<Vec<EventEnvelope>> {
    let mut events = Vec::new();
    let mut after = None;
    loop {
        let page = store.turn_events(turn_id, order, after, STORE_PAGE).await?;
        let full = page.len() == STORE_PAGE;
        after = page.last().map(|stored| stored.event.seq);
        events.extend(page.into_iter().map(|stored| stored.event));
        if !full {
            return Ok(events);
        }
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("turn_id", &self.turn_id).field("cursor", &self.cursor).finish()
    }
}

#[cfg(test)]
mod tests {
    use agentry_events::{TurnEmitter, TurnSequencer};
    use agentry_types::{EventId, FinishReason, ThreadId, ToolCallKind, Usage};

    use super::*;

    /// A test log's ids: its emitter's session and turn, created at the epoch.
    fn ids(emitter: &TurnEmitter) -> (SessionId, TurnId, Timestamp) {
        (emitter.sequencer().session_id(), emitter.sequencer().turn_id(), Timestamp::from_unix_micros(0))
    }

    fn chunk(index: u32, name: Option<&str>, arguments: &str) -> ModelMessageDelta {
        ModelMessageDelta {
            tool_calls: vec![ToolCallDelta {
                index,
                id: name.map(|name| format!("call-{name}")),
                kind: name.map(|_| ToolCallKind::Function),
                function: Some(FunctionCallDelta {
                    name: name.map(str::to_owned),
                    arguments: Some(arguments.to_owned()),
                }),
                tool_info: None,
            }],
            ..ModelMessageDelta::default()
        }
    }

    /// A turn's events: two threads streaming at once (their deltas interleaved), each kind
    /// of text, tool calls with their first chunks, a last delta with usage, and other events
    /// in between.
    fn turn_events() -> Vec<Arc<EventEnvelope>> {
        let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
        let (main, sub) = (ThreadId::main(), ThreadId::new_sub_thread());
        let (first, second) = (EventId::new(), EventId::new());
        let mut events = vec![emitter.emit(None, EventPayload::ReasoningStarted {})];
        let mut delta = |emitter: &mut TurnEmitter, thread: &ThreadId, id, delta| {
            let emission = emitter.delta(thread.clone(), id, delta).unwrap();
            events.push(emission.delta);
            events.extend(emission.message);
        };
        for piece in ["Let", " me", " think", "é…"] {
            delta(
                &mut emitter,
                &main,
                first,
                ModelMessageDelta {
                    reasoning_content: Some(piece.to_owned()),
                    ..ModelMessageDelta::default()
                },
            );
        }
        for (at, piece) in ["Hel", "lo,", " wo", "rld", "!"].into_iter().enumerate() {
            delta(&mut emitter, &main, first, ModelMessageDelta::text(piece));
            if at % 2 == 1 {
                delta(&mut emitter, &sub, second, ModelMessageDelta::text(format!("sub {at} ")));
            }
        }
        delta(&mut emitter, &main, first, chunk(0, Some("add"), ""));
        for piece in ["{\"a\"", ": 1,", " \"b\": 2}"] {
            delta(&mut emitter, &main, first, chunk(0, None, piece));
        }
        delta(&mut emitter, &main, first, chunk(1, Some("echo"), "{"));
        delta(&mut emitter, &main, first, chunk(1, None, "}"));
        delta(
            &mut emitter,
            &sub,
            second,
            ModelMessageDelta { refusal: Some("no".to_owned()), ..ModelMessageDelta::default() },
        );
        let end = |reason| ModelMessageDelta {
            finish_reason: Some(reason),
            usage: Some(Usage { input_tokens: 3, output_tokens: 5, ..Usage::default() }),
            ..ModelMessageDelta::default()
        };
        delta(&mut emitter, &main, first, end(FinishReason::ToolCalls));
        delta(&mut emitter, &sub, second, end(FinishReason::Stop));
        events.push(emitter.emit(None, EventPayload::ReasoningCompleted {}));
        events.into_iter().map(Arc::new).collect()
    }

    fn log_of(events: &[Arc<EventEnvelope>], budget: usize) -> LiveTurn {
        let turn = LiveTurn::new(
            (events[0].session_id, events[0].turn_id, Timestamp::from_unix_micros(0)),
            1,
            1,
            budget,
        );
        for event in events {
            turn.push(event.clone());
        }
        turn
    }

    /// Everything after `after`, read as a subscriber does: from the last `seq` it got, until
    /// nothing is left.
    fn read(turn: &LiveTurn, after: u64) -> Vec<Arc<EventEnvelope>> {
        let mut events: Vec<Arc<EventEnvelope>> = Vec::new();
        loop {
            let mut into = VecDeque::new();
            let cursor = events.last().map_or(after, |event| event.seq);
            turn.read_after(cursor, usize::MAX, &mut into);
            if into.is_empty() {
                return events;
            }
            events.extend(into);
        }
    }

    /// What a client makes of a stream: adjacent text deltas of one message and one kind
    /// joined, every other event as it is (in JSON, `seq` left out of joined runs).
    fn as_client_sees(events: &[Arc<EventEnvelope>]) -> Vec<String> {
        let mut seen: Vec<(Option<(EventId, TextKind)>, String)> = Vec::new();
        for event in events {
            let text = match &event.payload {
                EventPayload::ModelMessageDelta(delta) => TextKind::of(delta),
                _ => None,
            };
            match (text, seen.last_mut()) {
                (Some((kind, text)), Some((Some(last), joined))) if *last == (event.event_id, kind) => {
                    joined.push_str(text);
                }
                (Some((kind, text)), _) => seen.push((Some((event.event_id, kind)), text.to_owned())),
                (None, _) => seen.push((None, serde_json::to_string(event.as_ref()).unwrap())),
            }
        }
        seen.into_iter().map(|(_, item)| item).collect()
    }

    #[test]
    fn a_merged_log_gives_every_reader_the_same_text_and_events_as_the_whole_one() {
        let events = turn_events();
        let whole = log_of(&events, usize::MAX);
        let last = events.last().unwrap().seq;
        assert_eq!(read(&whole, 0).len(), events.len(), "the whole log keeps every delta");
        for budget in [0, 1_000, 2_500] {
            let merged = log_of(&events, budget);
            assert!(merged.log().entries.len() < events.len(), "budget {budget}: nothing merged");
            let lone = |entry: &Entry| matches!(entry, Entry::Merged(run) if run.ends.len() < 2);
            assert!(!merged.log().entries.iter().any(lone), "budget {budget}: a run of one delta");
            for after in 0..=last {
                let (expected, got) = (read(&whole, after), read(&merged, after));
                assert!(got.iter().all(|event| event.seq > after), "budget {budget}, after {after}");
                assert!(
                    got.windows(2).all(|pair| pair[0].seq < pair[1].seq),
                    "budget {budget}, after {after}"
                );
                assert_eq!(got.last().map(|event| event.seq), expected.last().map(|event| event.seq));
                assert_eq!(as_client_sees(&got), as_client_sees(&expected), "budget {budget}, after {after}");
            }
        }
    }

    /// A server that repeats a call's id and type on each of its argument chunks costs the
    /// log the arguments' text, as one that sends bare chunks does.
    #[test]
    fn argument_chunks_repeating_their_calls_id_merge() {
        use agentry_types::{ToolCallDelta, ToolCallKind};
        let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
        let message = EventId::new();
        let turn = LiveTurn::new(ids(&emitter), 1, 1, 0);
        let chunk = |name: Option<&str>, arguments: &str| ModelMessageDelta {
            tool_calls: vec![ToolCallDelta {
                index: 0,
                id: Some("call_a".to_owned()),
                kind: Some(ToolCallKind::Function),
                function: Some(FunctionCallDelta {
                    name: name.map(str::to_owned),
                    arguments: Some(arguments.to_owned()),
                }),
                tool_info: None,
            }],
            ..ModelMessageDelta::default()
        };
        let mut deltas = vec![chunk(Some("search"), "")];
        deltas.extend((0..1_000).map(|at| chunk(None, if at == 0 { "[" } else { "0," })));
        for delta in deltas {
            turn.push(Arc::new(emitter.delta(ThreadId::main(), message, delta).unwrap().delta));
        }
        let entries = turn.log().entries.len();
        assert!(entries < 10, "{entries} entries for 1,001 deltas");
        let arguments: String = read(&turn, 0)
            .iter()
            .filter_map(|event| match &event.payload {
                EventPayload::ModelMessageDelta(delta) => delta.tool_calls[0].function.clone()?.arguments,
                _ => None,
            })
            .collect();
        assert_eq!(arguments, format!("[{}", "0,".repeat(999)));
        // What the chunks repeated is given again on the merged ones (a late id is kept).
        for event in read(&turn, 0) {
            let EventPayload::ModelMessageDelta(delta) = &event.payload else { panic!("not a delta") };
            assert_eq!(delta.tool_calls[0].id.as_deref(), Some("call_a"), "{delta:?}");
        }
    }

    #[test]
    fn a_reader_before_a_recovered_logs_start_gets_nothing_from_it() {
        let sequencer = TurnSequencer::resuming_after(SessionId::new(), TurnId::new(), 9);
        let mut emitter = TurnEmitter::new(sequencer);
        let turn = LiveTurn::new(ids(&emitter), 1, 10, 0);
        let message = EventId::new();
        for piece in ["a", "b", "c"] {
            turn.push(Arc::new(
                emitter.delta(ThreadId::main(), message, ModelMessageDelta::text(piece)).unwrap().delta,
            ));
        }
        let mut into = VecDeque::new();
        assert_eq!(turn.read_after(3, 1024, &mut into), (10, false));
        assert!(into.is_empty(), "{into:?}");
        assert_eq!(turn.read_after(9, 1024, &mut into), (10, false));
        assert_eq!(into.len(), 1, "one merged run");
        assert_eq!(into[0].seq, 12);
    }

    #[test]
    fn a_long_reply_costs_its_text_not_an_envelope_a_delta() {
        let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
        let message = EventId::new();
        let turn = LiveTurn::new(ids(&emitter), 1, 1, 64 * 1024);
        let mut text = String::new();
        for at in 0..200_000 {
            let piece = format!("{} ", at % 10);
            text.push_str(&piece);
            turn.push(Arc::new(
                emitter.delta(ThreadId::main(), message, ModelMessageDelta::text(piece)).unwrap().delta,
            ));
        }
        let entries = turn.log().entries.len();
        // 400 KB of text in runs of at most 64 KiB, and what came after the last merge.
        assert!(entries < 400, "{entries} entries for 200,000 deltas");
        // One read copies a bounded amount of the text, however far behind its reader is.
        let mut first_read = VecDeque::new();
        turn.read_after(0, usize::MAX, &mut first_read);
        let copied: usize = first_read
            .iter()
            .map(|event| match &event.payload {
                EventPayload::ModelMessageDelta(delta) => delta_text_bytes(delta),
                _ => 0,
            })
            .sum();
        assert!(copied <= READ_TEXT_MAX + MERGED_TEXT_MAX, "{copied} bytes copied in one read");
        let got = read(&turn, 0);
        assert_eq!(got.last().unwrap().seq, 200_000);
        let EventPayload::ModelMessageDelta(first) = &got[0].payload else { panic!("not a delta") };
        assert!(first.content.as_ref().is_some_and(|content| content.len() <= MERGED_TEXT_MAX));
        let joined: String = got
            .iter()
            .map(|event| match &event.payload {
                EventPayload::ModelMessageDelta(delta) => delta.content.clone().unwrap(),
                _ => panic!("not a delta"),
            })
            .collect();
        assert_eq!(joined, text);
        // A reader in the middle of a run gets the rest of it.
        let from_middle: String = read(&turn, 150_001)
            .iter()
            .map(|event| match &event.payload {
                EventPayload::ModelMessageDelta(delta) => delta.content.clone().unwrap(),
                _ => panic!("not a delta"),
            })
            .collect();
        assert_eq!(from_middle, text[150_001 * 2..]);
    }
}
