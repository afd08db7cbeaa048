//! Handing store calls to a backend's own threads and getting the answer back, for the
//! SQLite and redb backends (their calls never run on the async executor).
//!
//! Each hop between threads costs a wake-up when the receiving side sleeps: a futex call
//! and, when the sleeper is on the other core, an inter-processor interrupt. On a virtual
//! machine that is tens of microseconds a hop (a round trip between two sleeping threads
//! took ~55 µs on the 2-core development VM, against ~1 µs when both sides look for the
//! other's item before sleeping). A turn makes its store calls one after the other, so
//! both sides look for their next item briefly before they sleep:
//! - the writer thread looks for its next job for [`SPIN`], yielding its core between
//!   looks ([`recv_hot`]);
//! - a task whose write, or small read, is the only store call in flight polls for the
//!   answer for [`REPLY_SPIN`], yielding to the executor's other tasks between polls,
//!   before it sleeps ([`Replies`]).
//!
//! Reads run on tokio's blocking threads, but for short ones made while the writer thread
//! has no write waiting, which it runs itself between its transactions ([`WriterLoad`]):
//! it is awake then, so they need no wake-up. Polling for every read made the long ones
//! slower (the polling thread slows the reading one down), and reader threads of our own
//! that looked for work before sleeping were slower than tokio's pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use tokio::sync::oneshot;

use crate::{HistoryQuery, RunQuery, StoreError, StoreResult};

/// How long a writer thread looks for its next job before it sleeps.
pub const SPIN: Duration = Duration::from_micros(30);

/// The next item of a thread's queue. Looks for one for at most [`SPIN`] (yielding the
/// core between looks), then sleeps until one comes; waits at most `wait` in all (for ever
/// when `None`).
///
/// # Errors
/// `Timeout` when nothing came within `wait`; `Disconnected` once the queue is closed and
/// empty.
pub fn recv_hot<T>(queue: &Receiver<T>, wait: Option<Duration>) -> Result<T, RecvTimeoutError> {
    let spin = wait.map_or(SPIN, |wait| wait.min(SPIN));
    let spin_until = Instant::now() + spin;
    while Instant::now() < spin_until {
        match queue.try_recv() {
            Ok(item) => return Ok(item),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    match wait {
        // The spin counts against the wait.
        Some(wait) => queue.recv_timeout(wait.saturating_sub(spin)),
        None => queue.recv().map_err(|_| RecvTimeoutError::Disconnected),
    }
}

/// How long a lone call's task looks for its answer before it sleeps: long enough for a
/// write without a sync, for most single-page syncs on the development VM, and for a
/// small read.
pub const REPLY_SPIN: Duration = Duration::from_micros(300);

/// The longest page of runs a backend counts as a small read (see [`small_run_page`]).
pub const SMALL_PAGE: usize = 8;

/// Whether listing a page of `limit` runs with `query` is a small read: a short page
/// without filters that could skip over many runs to fill it (the parent filter does not:
/// backends index runs by parent).
#[must_use]
pub fn small_run_page(query: &RunQuery, limit: usize) -> bool {
    limit <= SMALL_PAGE && query.statuses.is_empty() && query.agent_id.is_none() && query.team_id.is_none()
}

/// The store calls of one backend (writes and reads, counted together) waiting for their
/// answers from its threads.
///
/// A write or small read that starts while no other call is in flight polls for its
/// answer for at most [`REPLY_SPIN`], letting the executor run its other tasks between
/// polls, before it sleeps: a turn's store calls come one after the other, and each answer
/// to a sleeping task costs the answering thread a wake-up of the executor's thread. A
/// call that starts while another is in flight does not poll: the backend is busy, the
/// executor has other work, and polling would only take its time.
#[derive(Debug, Default)]
pub struct Replies {
    waiting: AtomicUsize,
}

impl Replies {
    /// Awaits the writer's answer to one write, or to a read it runs ([`WriterLoad`]).
    ///
    /// # Errors
    /// `Closed` when the writer dropped the sender without answering (the store is
    /// closing).
    pub async fn wait<T>(&self, answer: oneshot::Receiver<T>) -> StoreResult<T> {
        self.poll_first(answer).await.map_err(|_| StoreError::Closed)
    }

    /// Awaits a read running on a blocking thread. A `small` read (one record or a
    /// handful) that is alone in flight is polled for at most [`REPLY_SPIN`] first; a larger
    /// one is not, because the polling thread measurably slows a long read down.
    pub async fn read<F: Future + Unpin>(&self, read: F, small: bool) -> F::Output {
        if small { self.poll_first(read).await } else { read.await }
    }

    async fn poll_first<F: Future + Unpin>(&self, mut answer: F) -> F::Output {
        let alone = self.waiting.fetch_add(1, Ordering::Relaxed) == 0;
        let _waiting = Waiting(&self.waiting);
        if alone {
            let spin_until = Instant::now() + REPLY_SPIN;
            loop {
                if let Some(output) = (&mut answer).now_or_never() {
                    return output;
                }
                if Instant::now() >= spin_until {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        answer.await
    }
}

/// The error of a write whose work panicked on a backend's writer thread, and of the
/// writes committed with it: the transaction they shared is rolled back.
#[must_use]
pub fn write_panicked() -> StoreError {
    StoreError::Io("a write panicked; its transaction was rolled back".to_owned())
}

/// The answer channel of a write handed to a backend's writer thread. A write whose work
/// panics drops it unanswered as the panic unwinds; its caller then gets
/// [`write_panicked`], not `Closed` (which tells a caller the store is closing).
#[derive(Debug)]
pub struct Reply<R>(Option<oneshot::Sender<StoreResult<R>>>);

impl<R> Reply<R> {
    /// Wraps the sender a caller awaits.
    #[must_use]
    pub const fn new(sender: oneshot::Sender<StoreResult<R>>) -> Self {
        Self(Some(sender))
    }

    /// Answers the caller (who may have gone away meanwhile).
    pub fn send(mut self, result: StoreResult<R>) {
        if let Some(sender) = self.0.take() {
            let _ = sender.send(result);
        }
    }
}

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        if let Some(sender) = self.0.take()
            && std::thread::panicking()
        {
            let _ = sender.send(Err(write_panicked()));
        }
    }
}

/// The most runs a history window may take and still count as a short read (see
/// [`short_history`]): the runner's default window is 50.
pub const SHORT_HISTORY_RUNS: usize = 64;

/// Whether reading the history window `query` asks for is a short read, which may run on
/// the writer thread ([`WriterLoad`]): one that stops after at most [`SHORT_HISTORY_RUNS`]
/// runs, as a turn's own window does. A window bounded only by its number of messages,
/// or filtered by status, agent or team, may read a long way back to fill itself, and is
/// not short. (A team session's member runs do not count towards the window unless
/// asked for; a turn has as many of them as its team spawned.)
#[must_use]
pub fn short_history(query: &HistoryQuery) -> bool {
    query.run_bound().is_some_and(|runs| runs <= SHORT_HISTORY_RUNS)
        && query.skip_statuses.is_empty()
        && query.agent_id.is_none()
        && query.team_id.is_none()
}

/// The most small reads waiting on a writer thread at once (see [`WriterLoad`]).
pub const MAX_READS_ON_WRITER: usize = 2;

/// What a backend's writer thread has been sent and not yet answered: whether a short
/// read may run there.
///
/// A turn makes its store calls one after another, so between its writes the writer
/// thread is idle, and right after one it is still looking for its next job
/// ([`recv_hot`]). A short read it runs answers in a few microseconds, where a blocking
/// thread would first have to be woken: about 30 µs a read on the development VM. A read
/// goes to the writer only while no write is waiting there (it would wait behind the
/// write's commit, or hold the write up) and fewer than [`MAX_READS_ON_WRITER`] reads are
/// (many concurrent reads are served better by the reader threads, side by side).
///
/// The counts follow the callers' waits: a call whose caller stops waiting (its future is
/// dropped) is no longer counted, though its job may still be queued. That costs a read
/// sent meanwhile only time, never a wrong answer.
#[derive(Debug, Default)]
pub struct WriterLoad {
    writes: AtomicUsize,
    reads: AtomicUsize,
}

impl WriterLoad {
    /// Counts a write sent to the writer for as long as the guard lives.
    #[must_use]
    pub fn write(&self) -> InFlight<'_> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.writes)
    }

    /// Counts a read sent to the writer for as long as the guard lives; `None` when the
    /// read should go to a reader thread instead.
    #[must_use]
    pub fn read(&self) -> Option<InFlight<'_>> {
        if self.writes.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.reads
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (now < MAX_READS_ON_WRITER).then_some(now + 1)
            })
            .ok()?;
        Some(InFlight(&self.reads))
    }
}

/// Runs a read on a writer thread when it is `wanted` there and `load` allows: sends
/// `job(work, reply)` to its queue and awaits the answer, waiting as [`Replies::wait`]
/// does. Gives `work` back when the read should go to a reader thread instead.
///
/// # Errors
/// Inside the `Ok`: the read's own error, or `Closed` when the writer is gone.
pub async fn read_on_writer<J, W, R>(
    wanted: bool,
    load: &WriterLoad,
    replies: &Replies,
    writer: Option<&Sender<J>>,
    work: W,
    job: impl FnOnce(W, oneshot::Sender<StoreResult<R>>) -> J,
) -> Result<StoreResult<R>, W> {
    let Some(_in_flight) = wanted.then(|| load.read()).flatten() else { return Err(work) };
    let Some(writer) = writer else { return Ok(Err(StoreError::Closed)) };
    let (reply, answer) = oneshot::channel();
    if writer.send(job(work, reply)).is_err() {
        return Ok(Err(StoreError::Closed));
    }
    Ok(replies.wait(answer).await.and_then(|result| result))
}

/// A call counted in a [`WriterLoad`] until it is dropped (however its wait ends).
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a call out of [`Replies`] however its wait ends (a dropped future too).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;
    use std::time::Duration;

    use futures_util::FutureExt;
    use tokio::sync::oneshot;

    use agentry_types::RunStatus;

    use super::{MAX_READS_ON_WRITER, Replies, SHORT_HISTORY_RUNS, WriterLoad, recv_hot, short_history};
    use crate::HistoryQuery;
    use crate::StoreError;

    #[test]
    fn an_empty_queue_times_out_and_a_closed_one_says_so() {
        let (send, queue) = mpsc::channel::<u32>();
        assert_eq!(recv_hot(&queue, Some(Duration::ZERO)), Err(mpsc::RecvTimeoutError::Timeout));
        assert_eq!(recv_hot(&queue, Some(Duration::from_millis(1))), Err(mpsc::RecvTimeoutError::Timeout));
        send.send(7).unwrap();
        assert_eq!(recv_hot(&queue, None), Ok(7));
        drop(send);
        assert_eq!(recv_hot(&queue, None), Err(mpsc::RecvTimeoutError::Disconnected));
        assert_eq!(
            recv_hot(&queue, Some(Duration::from_secs(60))),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn a_history_window_is_short_only_when_few_runs_bound_it_and_nothing_filters_them() {
        let runs = |runs| HistoryQuery { last_runs: Some(runs), ..HistoryQuery::default() };
        assert!(short_history(&runs(50)));
        assert!(short_history(&runs(SHORT_HISTORY_RUNS)));
        assert!(!short_history(&runs(SHORT_HISTORY_RUNS + 1)));
        // Bounded by messages alone, a window may read a whole session to fill itself.
        assert!(!short_history(&HistoryQuery { last_messages: Some(20), ..HistoryQuery::default() }));
        assert!(!short_history(&HistoryQuery { agent_id: Some("a".to_owned()), ..runs(3) }));
        assert!(!short_history(&HistoryQuery { skip_statuses: vec![RunStatus::Error], ..runs(3) }));
        assert!(short_history(&HistoryQuery { last_messages: Some(20), ..runs(3) }));
    }

    #[test]
    fn reads_go_to_the_writer_only_while_no_write_waits_there_and_few_reads_do() {
        let load = WriterLoad::default();
        let reads: Vec<_> = (0..MAX_READS_ON_WRITER).map(|_| load.read().unwrap()).collect();
        assert!(load.read().is_none(), "one read more than the most");
        drop(reads);
        let write = load.write();
        assert!(load.read().is_none(), "a write is waiting");
        drop(write);
        assert!(load.read().is_some(), "the write was answered");
        assert_eq!(load.reads.load(Ordering::Relaxed), 0);
        assert_eq!(load.writes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_is_awaited_whenever_it_comes_and_a_dropped_sender_is_closed() {
        let replies = Arc::new(Replies::default());
        let (answer, answered) = oneshot::channel();
        answer.send(1).unwrap();
        assert_eq!(replies.wait(answered).await, Ok(1));
        let (start, started) = mpsc::channel::<()>();
        let (answer, answered) = oneshot::channel();
        let thread = std::thread::spawn(move || {
            started.recv().unwrap();
            // Answer after the poll has given up, so the wait sleeps and is woken.
            std::thread::sleep(super::REPLY_SPIN * 4);
            answer.send(2).unwrap();
        });
        let waiting = tokio::spawn({
            let replies = replies.clone();
            async move { replies.wait(answered).await }
        });
        start.send(()).unwrap();
        assert_eq!(waiting.await.unwrap(), Ok(2));
        thread.join().unwrap();
        let (answer, answered) = oneshot::channel::<u32>();
        drop(answer);
        assert_eq!(replies.wait(answered).await, Err(StoreError::Closed));
        // A wait that is dropped unanswered counts itself out.
        let (_answer, answered) = oneshot::channel::<u32>();
        assert!(replies.wait(answered).now_or_never().is_none());
        assert_eq!(replies.waiting.load(Ordering::Relaxed), 0);
    }
}
