//! Handing writes to a backend's writer thread and getting the answer back, for the SQLite
//! and redb backends (their calls never run on the async executor).
//!
//! Each hop between threads costs a wake-up when the receiving side sleeps: a futex call
//! and, when the sleeper is on the other core, an inter-processor interrupt. On a virtual
//! machine that is tens of microseconds a hop (a round trip between two sleeping threads
//! took ~55 µs on the 2-core development VM, against ~1 µs when both sides look for the
//! other's item before sleeping). A turn makes its writes one after the other, so both
//! sides look for their next item briefly before they sleep:
//! - the writer thread looks for its next job for [`SPIN`], yielding its core between
//!   looks ([`recv_hot`]);
//! - a task waiting alone for the writer's answer polls for it for [`REPLY_SPIN`],
//!   yielding to the executor's other tasks between polls, before it sleeps
//!   ([`Replies::wait`]).
//!
//! Reads stay on tokio's blocking threads: reader threads that also looked for work before
//! sleeping made a 25-turn SQLite conversation slower on the 2-core VM (each spinning
//! thread took a core another thread needed), and so did callers polling for reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use tokio::sync::oneshot;

use crate::{StoreError, StoreResult};

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

/// How long a lone write's task looks for the writer's answer before it sleeps: long
/// enough for a write without a sync, and for most single-page syncs on the development VM.
pub const REPLY_SPIN: Duration = Duration::from_micros(300);

/// The longest page of records a backend counts as a small read (see [`Replies::read`]).
pub const SMALL_PAGE: usize = 8;

/// The writes of one backend waiting for their answers from its writer thread.
///
/// A write that is alone in flight polls for its answer for at most [`REPLY_SPIN`],
/// letting the executor run its other tasks between polls, before it sleeps: a turn's
/// writes come one after the other, and each answer to a sleeping task costs the writer
/// thread a wake-up of the executor's thread. Writes that overlap do not poll: the writer
/// is busy with them, the executor has other work, and polling would only take its time.
#[derive(Debug, Default)]
pub struct Replies {
    waiting: AtomicUsize,
}

impl Replies {
    /// Awaits the writer's answer to one write.
    ///
    /// # Errors
    /// `Closed` when the writer dropped the sender without answering (the store is
    /// closing).
    pub async fn wait<T>(&self, answer: oneshot::Receiver<T>) -> StoreResult<T> {
        self.poll_first(answer, REPLY_SPIN).await.map_err(|_| StoreError::Closed)
    }

    /// Awaits a read running on a blocking thread. A `small` read (one record or a
    /// handful) that is alone in flight is polled for at most [`REPLY_SPIN`] first; a larger
    /// one is not, because the polling thread measurably slows a long read down.
    pub async fn read<F: Future + Unpin>(&self, read: F, small: bool) -> F::Output {
        if small { self.poll_first(read, REPLY_SPIN).await } else { read.await }
    }

    async fn poll_first<F: Future + Unpin>(&self, mut answer: F, spin: Duration) -> F::Output {
        let alone = self.waiting.fetch_add(1, Ordering::Relaxed) == 0;
        let _waiting = Waiting(&self.waiting);
        if alone {
            let spin_until = Instant::now() + spin;
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

/// Counts a write out of [`Replies`] however its wait ends (a dropped future too).
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
    use std::sync::mpsc;
    use std::time::Duration;

    use futures_util::FutureExt;
    use tokio::sync::oneshot;

    use super::{Replies, recv_hot};
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_is_awaited_whenever_it_comes_and_a_dropped_sender_is_closed() {
        let replies = Arc::new(Replies::default());
        let (answer, answered) = oneshot::channel();
        answer.send(1).unwrap();
        assert_eq!(replies.wait(answered).await, Ok(1));
        // Answered from another thread, after the spin or during it: either way it arrives.
        let (start, started) = std::sync::mpsc::channel::<()>();
        let (answer, answered) = oneshot::channel();
        let thread = std::thread::spawn(move || {
            started.recv().unwrap();
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
        assert_eq!(replies.waiting.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
