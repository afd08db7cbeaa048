//! Live streams: each running turn keeps every event it emitted, deltas included, in a
//! live log; subscribers read it from their cursor and wait for more, so a slow subscriber
//! is never skipped. Events before the log's first `seq` (a turn recovered by this process)
//! and turns not live here are read from the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agentry_events::{EventEnvelope, EventPayload};
use agentry_memory::{Order, Store};
use agentry_types::{CancellationReason, SessionId, TurnId, TurnState};
use futures_core::Stream;
use tokio::sync::{Notify, watch};

use crate::error::RuntimeResult;

/// How often a subscriber following a turn that runs in another process reads the store.
const STORE_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Events read from the store per page.
const STORE_PAGE: usize = 256;

/// One running (or recently finished) turn of this process.
#[derive(Debug)]
pub(crate) struct LiveTurn {
    pub(crate) session_id: SessionId,
    pub(crate) turn_id: TurnId,
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
    /// The `seq` of `events[0]`: 1, or above the high-water mark for a recovered turn.
    first_seq: u64,
    events: Vec<Arc<EventEnvelope>>,
    done: bool,
}

impl LiveTurn {
    pub(crate) fn new(session_id: SessionId, turn_id: TurnId, lease_token: u64, first_seq: u64) -> Self {
        Self {
            session_id,
            turn_id,
            lease_token,
            log: Mutex::new(LiveLog { first_seq, events: Vec::new(), done: false }),
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
        {
            let mut log = self.log();
            debug_assert!(log.events.last().is_none_or(|last| last.seq < event.seq), "pushed out of order");
            log.events.push(event);
            log.done |= done;
        }
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
        match self.log().events.last().map(|event| &event.payload) {
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
        log.done && !log.events.last().is_some_and(|event| event.payload.is_terminal())
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
    /// whether the log is complete.
    fn read_after(&self, after: u64, max: usize, into: &mut VecDeque<Arc<EventEnvelope>>) -> (u64, bool) {
        let log = self.log();
        // By `seq`, not by offset: a number missing from the log (a step that could not be
        // kept) must not shift what every later reader gets.
        let start = log.events.partition_point(|event| event.seq <= after);
        if let Some(slice) = log.events.get(start..) {
            into.extend(slice.iter().take(max).cloned());
        }
        let complete = log.done && start.saturating_add(max) >= log.events.len();
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
                        self.buffer.clear();
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
