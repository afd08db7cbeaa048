//! Gathering writes into group commits, for the writer threads of durable backends.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::handoff::recv_hot;

/// Collects the writes of each group commit from a writer thread's queue.
///
/// A batch takes every job waiting (writes, and reads a writer thread may run between its
/// transactions), up to `max`. With a non-zero `linger` it also waits, at most that long,
/// for the writers it just acknowledged to come back: after each commit the writer thread
/// calls [`GroupCommit::committed`] *before* acknowledging, which sets aside the writes
/// that queued during the transaction, and the next batch waits until it holds as many
/// writes as the last batch plus those set aside. Concurrent writers that
/// each wait for their own commit then share one batch instead of alternating between two
/// half-size ones. A lone writer does not wait: its batch of one is complete at once
/// (only the first write after a burst may wait out the linger, once).
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// use agentry_memory::GroupCommit;
///
/// let (send, queue) = mpsc::channel();
/// for job in 0..5 {
///     send.send(job).unwrap();
/// }
/// let mut gather = GroupCommit::new(4, Duration::ZERO);
/// assert_eq!(gather.next_batch(&queue, None).unwrap(), [0, 1, 2, 3]);
/// gather.committed(4, &queue);
/// assert_eq!(gather.next_batch(&queue, None).unwrap(), [4]);
/// ```
#[derive(Debug)]
pub struct GroupCommit<T> {
    max: usize,
    linger: Duration,
    carried: VecDeque<T>,
    expected: usize,
}

impl<T> GroupCommit<T> {
    /// Batches of at most `max` writes (at least 1), waiting at most `linger` for more.
    #[must_use]
    pub fn new(max: usize, linger: Duration) -> Self {
        Self { max: max.max(1), linger, carried: VecDeque::new(), expected: 0 }
    }

    /// The next batch. Waits for its first write at most `wait` (for ever when `None`);
    /// fails with `Timeout` when none came, `Disconnected` once the queue is closed and
    /// empty.
    ///
    /// # Errors
    /// As above.
    pub fn next_batch(
        &mut self,
        queue: &Receiver<T>,
        wait: Option<Duration>,
    ) -> Result<Vec<T>, RecvTimeoutError> {
        let mut batch: Vec<T> = Vec::with_capacity(self.expected.clamp(1, self.max));
        while batch.len() < self.max {
            match self.carried.pop_front() {
                Some(job) => batch.push(job),
                None => break,
            }
        }
        if batch.is_empty() {
            // A writer that was just acknowledged often sends its next write within
            // microseconds: `recv_hot` looks for it briefly before sleeping, so neither
            // side pays a wake-up for it.
            batch.push(recv_hot(queue, wait)?);
        }
        while batch.len() < self.max {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let target = self.expected.min(self.max);
        if !self.linger.is_zero() && batch.len() < target {
            let deadline = Instant::now() + self.linger;
            while batch.len() < target {
                let left = deadline.saturating_duration_since(Instant::now());
                match queue.recv_timeout(left) {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
        }
        Ok(batch)
    }

    /// Records that a batch of `len` writes committed; call it before acknowledging them.
    pub fn committed(&mut self, len: usize, queue: &Receiver<T>) {
        while self.carried.len() < self.max {
            match queue.try_recv() {
                Ok(job) => self.carried.push_back(job),
                Err(_) => break,
            }
        }
        self.expected = len + self.carried.len();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::mpsc;
    use std::time::Duration;

    use super::GroupCommit;

    #[test]
    fn an_empty_queue_times_out_and_a_closed_one_says_so() {
        let (send, queue) = mpsc::channel::<u32>();
        let mut gather = GroupCommit::new(8, Duration::ZERO);
        assert_eq!(
            gather.next_batch(&queue, Some(Duration::from_millis(1))),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        drop(send);
        assert_eq!(gather.next_batch(&queue, None), Err(mpsc::RecvTimeoutError::Disconnected));
    }

    #[test]
    fn writes_queued_during_a_commit_are_set_aside_and_come_first() {
        let (send, queue) = mpsc::channel();
        let mut gather = GroupCommit::new(8, Duration::ZERO);
        send.send(1).unwrap();
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [1]);
        send.send(2).unwrap();
        send.send(3).unwrap();
        gather.committed(1, &queue);
        send.send(4).unwrap();
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [2, 3, 4]);
    }

    #[test]
    fn a_batch_waits_for_the_writers_just_acknowledged() {
        let (send, queue) = mpsc::channel();
        // A long linger: the batch ends when the expected writers are back, not on time.
        let mut gather = GroupCommit::new(8, Duration::from_secs(60));
        for job in 0..2 {
            send.send(job).unwrap();
        }
        assert_eq!(gather.next_batch(&queue, None).unwrap().len(), 2);
        // Two more queued during the commit of those two: four writers in all.
        send.send(2).unwrap();
        send.send(3).unwrap();
        gather.committed(2, &queue);
        let returning = std::thread::spawn(move || {
            for job in 4..6 {
                send.send(job).unwrap();
            }
            send
        });
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [2, 3, 4, 5]);
        drop(returning.join().unwrap());
        gather.committed(4, &queue);
        assert!(gather.next_batch(&queue, None).is_err(), "closed and empty");
    }

    #[test]
    fn a_lone_writer_never_waits_and_a_missing_writer_costs_at_most_the_linger() {
        let (send, queue) = mpsc::channel();
        let mut gather = GroupCommit::new(8, Duration::from_millis(5));
        send.send(1).unwrap();
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [1]);
        gather.committed(1, &queue);
        send.send(2).unwrap();
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [2]);
        // Three were expected but only one came back: the batch goes after the linger.
        gather.committed(3, &queue);
        send.send(3).unwrap();
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [3]);
    }

    #[test]
    fn batches_never_exceed_the_maximum() {
        let (send, queue) = mpsc::channel();
        let mut gather = GroupCommit::new(3, Duration::ZERO);
        for job in 0..7 {
            send.send(job).unwrap();
        }
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [0, 1, 2]);
        gather.committed(3, &queue);
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [3, 4, 5]);
        gather.committed(3, &queue);
        assert_eq!(gather.next_batch(&queue, None).unwrap(), [6]);
        assert_eq!(
            gather.next_batch(&queue, Some(Duration::from_millis(1))).unwrap_err(),
            mpsc::RecvTimeoutError::Timeout
        );
    }
}
