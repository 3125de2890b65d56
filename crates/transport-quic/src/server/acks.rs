//! Result acknowledgements of one connection: the task ids whose result frames the gateway has
//! processed, batched into `results_ack` control frames.
//!
//! A worker with a session keeps every result it sent until the gateway acknowledges it, so
//! that a result crossing a broken connection can be sent again after a resume. One frame per
//! result would double the control traffic under load, so ids wait in an [`AckBatch`]: a frame
//! goes out once [`ACK_BATCH_IDS`] are pending, or [`ACK_BATCH_DELAY`] after the first pending
//! one, whichever comes first. The batch is plain data driven by `now`; [`Acks`] is the
//! connection's shared, awaitable copy.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use switchyard_core::TaskId;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Pending ids that send a `results_ack` at once; also the most one frame carries. Each frame
/// is a packet each way (the frame and the worker's acknowledgement of it), so a busy
/// connection acknowledges in batches this large.
pub(crate) const ACK_BATCH_IDS: usize = 256;

/// Longest an id waits for its `results_ack`.
pub(crate) const ACK_BATCH_DELAY: Duration = Duration::from_millis(20);

/// The ids waiting for their `results_ack`, and since when.
#[derive(Debug, Default)]
pub(crate) struct AckBatch {
    ids: Vec<TaskId>,
    /// When the oldest pending id arrived.
    since: Option<Instant>,
}

impl AckBatch {
    /// Adds `task`, processed at `now()`. Returns true when this moved the time the next frame
    /// is due (the first pending id starts the delay, the id that fills the batch makes it due
    /// at once): only then does a writer waiting for [`AckBatch::due`] need waking.
    ///
    /// Only the first pending id's time counts, so `now` is called for it alone: a busy
    /// connection reads the clock once per frame, not once per result.
    pub(crate) fn push(&mut self, task: TaskId, now: impl FnOnce() -> Instant) -> bool {
        if self.ids.is_empty() {
            self.since = Some(now());
        }
        self.ids.push(task);
        self.ids.len() == 1 || self.ids.len() == ACK_BATCH_IDS
    }

    /// When the next frame is due: at once with a full batch, [`ACK_BATCH_DELAY`] after the
    /// oldest pending id otherwise, never with none pending.
    pub(crate) fn due(&self) -> Option<Instant> {
        let since = self.since?;
        if self.ids.len() >= ACK_BATCH_IDS {
            Some(since)
        } else {
            Some(since + ACK_BATCH_DELAY)
        }
    }

    /// The ids of the next frame, oldest first, at most [`ACK_BATCH_IDS`]; those left over
    /// count as arrived at `now`.
    pub(crate) fn take(&mut self, now: Instant) -> Vec<TaskId> {
        let count = self.ids.len().min(ACK_BATCH_IDS);
        let taken: Vec<TaskId> = self.ids.drain(..count).collect();
        self.since = (!self.ids.is_empty()).then_some(now);
        taken
    }
}

/// An [`AckBatch`] shared by a connection's readers (which add ids) and its control writer
/// (which waits for a due frame).
#[derive(Debug, Default)]
pub(crate) struct Acks {
    batch: Mutex<AckBatch>,
    added: Notify,
}

impl Acks {
    fn batch(&self) -> MutexGuard<'_, AckBatch> {
        // Batch operations cannot panic part-way.
        self.batch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that the result of `task` was processed. The writer is woken only when the
    /// due time moved, not once per result: a connection under load would otherwise wake it
    /// (and rebuild its wait) for every result.
    pub(crate) fn processed(&self, task: TaskId) {
        let due_moved = self.batch().push(task, Instant::now);
        if due_moved {
            self.added.notify_one();
        }
    }

    /// Waits until a frame is due and returns its ids. Cancel-safe: the ids stay in the batch
    /// until returned.
    pub(crate) async fn next_frame(&self) -> Vec<TaskId> {
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let due = self.batch().due();
            match due {
                Some(due) if due <= Instant::now() => {}
                Some(due) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = added => continue,
                    }
                }
                None => {
                    added.await;
                    continue;
                }
            }
            let ids = self.batch().take(Instant::now());
            if !ids.is_empty() {
                return ids;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> TaskId {
        TaskId::from_raw(n)
    }

    #[test]
    fn a_batch_is_due_after_the_delay_or_at_once_when_full() {
        let start = Instant::now();
        let mut batch = AckBatch::default();
        assert_eq!(batch.due(), None, "nothing pending, nothing due");
        for n in 0..ACK_BATCH_IDS as u64 - 1 {
            batch.push(t(n), || start + Duration::from_millis(n));
        }
        assert_eq!(
            batch.due(),
            Some(start + ACK_BATCH_DELAY),
            "below the count, the oldest id sets the time"
        );
        batch.push(t(999), || start + Duration::from_millis(100));
        assert_eq!(batch.due(), Some(start), "a full batch is due at once");
        let later = start + Duration::from_secs(1);
        assert_eq!(batch.take(later).len(), ACK_BATCH_IDS);
        assert_eq!(batch.due(), None);
    }

    #[test]
    fn a_frame_carries_at_most_the_batch_size_and_the_rest_waits_its_turn() {
        let start = Instant::now();
        let mut batch = AckBatch::default();
        for n in 0..ACK_BATCH_IDS as u64 + 3 {
            batch.push(t(n), || start);
        }
        let first = batch.take(start);
        assert_eq!(first.first(), Some(&t(0)), "oldest first");
        assert_eq!(first.len(), ACK_BATCH_IDS);
        assert_eq!(batch.due(), Some(start + ACK_BATCH_DELAY));
        assert_eq!(
            batch.take(start),
            (ACK_BATCH_IDS as u64..ACK_BATCH_IDS as u64 + 3)
                .map(t)
                .collect::<Vec<_>>(),
            "the rest, in order"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn many_results_make_one_frame_and_a_lone_one_waits_the_delay() {
        let acks = Acks::default();
        for n in 0..ACK_BATCH_IDS as u64 {
            acks.processed(t(n));
        }
        let start = Instant::now();
        let frame = acks.next_frame().await;
        assert_eq!(frame.len(), ACK_BATCH_IDS, "one frame for the whole batch");
        assert_eq!(Instant::now(), start, "a full batch leaves at once");

        acks.processed(t(500));
        let lone = acks.next_frame().await;
        assert_eq!(lone, vec![t(500)]);
        // Control for the first frame: a lone id waited for the delay.
        assert_eq!(Instant::now(), start + ACK_BATCH_DELAY);
    }

    #[test]
    fn only_the_first_and_the_filling_id_move_the_due_time() {
        let start = Instant::now();
        let mut batch = AckBatch::default();
        let moved: Vec<bool> = (0..ACK_BATCH_IDS as u64 + 1)
            .map(|n| batch.push(t(n), || start))
            .collect();
        assert!(moved[0], "the first id starts the delay");
        assert!(
            moved[ACK_BATCH_IDS - 1],
            "the id that fills the batch makes it due"
        );
        // Control: every other id leaves the due time where it was.
        let others = moved.iter().filter(|moved| **moved).count();
        assert_eq!(others, 2, "{moved:?}");
    }

    #[test]
    fn the_clock_is_read_for_the_first_pending_id_only() {
        let start = Instant::now();
        let reads = std::cell::Cell::new(0);
        let now = || {
            reads.set(reads.get() + 1);
            start
        };
        let mut batch = AckBatch::default();
        for n in 0..ACK_BATCH_IDS as u64 + 10 {
            batch.push(t(n), now);
        }
        assert_eq!(reads.get(), 1, "one read for a batch and its overflow");
        assert_eq!(
            batch.due(),
            Some(start),
            "the first id's time still sets the due time"
        );
        // Control: once the batch is taken, the next id starts a new delay and reads again.
        let _ = batch.take(start);
        let _ = batch.take(start);
        batch.push(t(1_000), now);
        assert_eq!(reads.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_waiting_out_the_delay_leaves_at_once_when_the_batch_fills() {
        let acks = std::sync::Arc::new(Acks::default());
        let start = Instant::now();
        acks.processed(t(0));
        let writer = tokio::spawn({
            let acks = std::sync::Arc::clone(&acks);
            async move { acks.next_frame().await }
        });
        // The writer starts waiting out the delay of the lone id.
        tokio::task::yield_now().await;
        assert!(!writer.is_finished());
        for n in 1..ACK_BATCH_IDS as u64 {
            acks.processed(t(n));
        }
        let frame = writer.await.unwrap_or_default();
        assert_eq!(frame.len(), ACK_BATCH_IDS);
        // Control: without the wake-up on the filling id it would leave after the delay.
        assert_eq!(
            Instant::now(),
            start,
            "woken by the full batch, not the timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_sends_no_frame() {
        let acks = Acks::default();
        let waited = tokio::time::timeout(Duration::from_secs(60), acks.next_frame()).await;
        assert!(waited.is_err(), "no id, no frame");
        acks.processed(t(1));
        assert_eq!(acks.next_frame().await, vec![t(1)]);
    }
}
