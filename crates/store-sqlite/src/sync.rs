//! The syncer: with [`Synchronous::Full`](crate::Synchronous::Full), the thread that fsyncs
//! the WAL for the writer's commits and only then answers them, while the writer goes on
//! applying the next batch.
//!
//! The writer's connection commits without syncing (SQLite's `synchronous = NORMAL`: the WAL
//! is written at commit and synced before each checkpoint, the database file after it) and
//! hands each batch's answers here, in commit order. One `fdatasync` of the WAL file (the
//! store's own handle on it: the kernel flushes the file, not a handle) covers every batch
//! committed before it began; the answers of those batches go out after it returns. So an
//! answered write is on the disk exactly as with SQLite's `FULL`, which syncs the WAL inside
//! each commit, but the disk's time no longer stops the writer: a batch's statements run
//! while the batch before it is being synced.
//!
//! A commit is visible to the store's readers once written, before its sync; so a read, once
//! it has run, waits for the sync of every commit begun before it ended ([`Watermark`]), and
//! nobody sees a write the disk may still lose, as with `FULL`. A failed sync answers every write it covered with an error, and every write after it:
//! the kernel may have dropped the pages it could not write, so nothing later is known to be
//! on the disk either (the store must be reopened).

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use switchyard_core::DispatchStoreError;
use tokio::sync::oneshot;

use crate::writer::Reply;

/// Batches the writer may hand on before it waits for the syncer: one, so the writer commits
/// the next batch while the syncer syncs and hands it on at once, and the syncer's next round
/// takes it without waiting for the writer (docs/benchmarks.md, sessions 17, 23 and 26: 1.00
/// to 1.05× the throughput of the rendezvous, never less). Running further ahead commits
/// more, smaller batches for the same syncs: more WAL pages written per dispatch (a fifth more
/// CPU per `Submit`, measured with 4; two against one, 0.98×).
const QUEUED_BATCHES: usize = 1;

/// Makes everything written to the WAL so far durable.
pub(crate) type SyncFn = Box<dyn FnMut() -> std::io::Result<()> + Send>;

/// The answers of one batch, in the order they are sent.
pub(crate) struct Answers {
    /// Each command's reply (`None`: a note nobody waits on) and its answer.
    pub(crate) replies: Vec<(Option<oneshot::Sender<Reply>>, Reply)>,
    /// The batch committed writes that must be synced before it is answered; `false` for a
    /// rolled-back batch or one of barriers only, answered in turn without a sync of its own.
    pub(crate) wrote: bool,
    /// Its number from [`Syncer::begin`], if it began a transaction.
    pub(crate) seq: Option<u64>,
}

/// How far the commits are synced, for readers.
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    /// Transactions begun by the writer (counted before they can commit).
    begun: AtomicU64,
    synced: Mutex<Synced>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Synced {
    /// Every transaction numbered up to this one is synced (or rolled back).
    up_to: u64,
    /// A sync failed: nothing more is known to be on the disk.
    failed: Option<DispatchStoreError>,
    /// The syncer stopped.
    stopped: bool,
}

impl Watermark {
    fn lock(&self) -> MutexGuard<'_, Synced> {
        // Plain numbers and flags, consistent after any panic.
        self.synced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, change: impl FnOnce(&mut Synced)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits until every transaction begun so far is synced: a read calls it after it ran, so
    /// that what it saw is on the disk before anyone hears it.
    pub(crate) fn wait_synced(&self) -> Result<(), DispatchStoreError> {
        let target = self.begun.load(Ordering::SeqCst);
        let mut synced = self.lock();
        loop {
            if let Some(error) = &synced.failed {
                return Err(error.clone());
            }
            if synced.up_to >= target {
                return Ok(());
            }
            if synced.stopped {
                return Err(gone());
            }
            synced = self
                .changed
                .wait(synced)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The writer's end: hands answers on, and waits for the syncer at the end.
pub(crate) struct Syncer {
    tx: Option<SyncSender<Answers>>,
    thread: Option<JoinHandle<()>>,
    watermark: Arc<Watermark>,
}

impl Syncer {
    /// Starts the syncer thread on the WAL file `wal`.
    pub(crate) fn start(wal: File) -> std::io::Result<Self> {
        Self::start_with(Box::new(move || wal.sync_data()))
    }

    /// Starts the syncer thread, syncing with `sync`.
    pub(crate) fn start_with(sync: SyncFn) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel(QUEUED_BATCHES);
        let watermark = Arc::new(Watermark::default());
        let marks = Arc::clone(&watermark);
        let thread = std::thread::Builder::new()
            .name("store-sync".into())
            .spawn(move || {
                run(&rx, sync, &marks);
                marks.set(|synced| synced.stopped = true);
            })?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            watermark,
        })
    }

    /// What the readers wait on.
    pub(crate) fn watermark(&self) -> Arc<Watermark> {
        Arc::clone(&self.watermark)
    }

    /// Numbers a transaction about to begin: readers from now on wait for its sync.
    pub(crate) fn begin(&self) -> u64 {
        self.watermark.begun.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Hands `answers` on, waiting until the syncer takes them ([`QUEUED_BATCHES`]); answers them
    /// here if the syncer is gone.
    pub(crate) fn hand(&self, answers: Answers) {
        let Some(tx) = &self.tx else {
            answer(answers, Some(&gone()));
            return;
        };
        if let Err(unsent) = tx.send(answers) {
            answer(unsent.0, Some(&gone()));
        }
    }

    /// Waits until every answer handed on is sent.
    pub(crate) fn finish(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.finish();
    }
}

fn gone() -> DispatchStoreError {
    DispatchStoreError::Unavailable {
        detail: "the store's sync thread has stopped".into(),
    }
}

/// Syncs and answers until the writer's end is dropped.
fn run(rx: &Receiver<Answers>, mut sync: SyncFn, watermark: &Watermark) {
    // Set by a failed sync, for good.
    let mut failed: Option<DispatchStoreError> = None;
    while let Ok(first) = rx.recv() {
        let mut round = vec![first];
        while let Ok(next) = rx.try_recv() {
            round.push(next);
        }
        if failed.is_none()
            && round.iter().any(|answers| answers.wrote)
            && let Err(err) = sync()
        {
            tracing::error!(%err, "fsync of the dispatch store's WAL failed; nothing more is acknowledged");
            let error = DispatchStoreError::Unavailable {
                detail: format!("fsync of the store's WAL failed: {err}"),
            };
            watermark.set(|synced| synced.failed = Some(error.clone()));
            failed = Some(error);
        }
        if let Some(up_to) = round.iter().filter_map(|answers| answers.seq).max() {
            watermark.set(|synced| synced.up_to = synced.up_to.max(up_to));
        }
        for answers in round {
            answer(answers, failed.as_ref());
        }
    }
}

/// Sends each answer, or `error` in its place.
pub(crate) fn answer(answers: Answers, error: Option<&DispatchStoreError>) {
    for (reply, result) in answers.replies {
        let result = match error {
            Some(error) => Err(error.clone()),
            None => result,
        };
        match reply {
            // A caller that stopped waiting needs no answer.
            Some(reply) => {
                let _ = reply.send(result);
            }
            None => {
                if let Err(err) = result {
                    tracing::debug!(%err, "dispatch state note not written");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use switchyard_core::Completion;

    use super::*;
    use crate::ops::Answer;

    fn one(wrote: bool) -> (Answers, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        (
            Answers {
                replies: vec![(Some(reply), Ok(Answer::Completion(Completion::Recorded)))],
                wrote,
                seq: None,
            },
            answer,
        )
    }

    #[test]
    fn an_answer_waits_for_the_sync_begun_after_its_commit() {
        // Each sync waits for the test's go and reports that it began.
        let (began_tx, began) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let mut syncer = Syncer::start_with(Box::new(move || {
            let _ = began_tx.send(());
            go_rx.recv().map_err(std::io::Error::other)
        }))
        .expect("start");
        let (first, mut first_answer) = one(true);
        syncer.hand(first);
        began.recv().expect("the first sync began");
        assert!(
            first_answer.try_recv().is_err(),
            "answered before its sync returned"
        );
        // A batch committed while the first sync runs waits for a sync of its own (its
        // hand-over may wait for the syncer to take it).
        let (second, mut second_answer) = one(true);
        std::thread::scope(|scope| {
            scope.spawn(|| syncer.hand(second));
            go.send(()).expect("go");
        });
        assert!(matches!(
            first_answer.blocking_recv(),
            Ok(Ok(Answer::Completion(Completion::Recorded)))
        ));
        began.recv().expect("the second sync began");
        assert!(
            second_answer.try_recv().is_err(),
            "covered by the first sync"
        );
        go.send(()).expect("go");
        assert!(matches!(second_answer.blocking_recv(), Ok(Ok(_))));
        syncer.finish();
    }

    #[test]
    fn a_read_returns_only_once_the_commits_begun_before_it_ended_are_synced() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let (go, go_rx) = mpsc::channel::<()>();
        let synced = Arc::clone(&events);
        let mut syncer = Syncer::start_with(Box::new(move || {
            go_rx.recv().map_err(std::io::Error::other)?;
            synced.lock().expect("events").push("synced");
            Ok(())
        }))
        .expect("start");
        let watermark = syncer.watermark();
        // Control: nothing begun, nothing to wait for.
        watermark.wait_synced().expect("nothing to wait for");
        let seq = syncer.begin();
        let (batch, answer) = one(true);
        syncer.hand(Answers {
            seq: Some(seq),
            ..batch
        });
        let (waiting_tx, waiting) = mpsc::channel();
        let read = Arc::clone(&events);
        let reader = std::thread::spawn(move || {
            let _ = waiting_tx.send(());
            let waited = watermark.wait_synced();
            read.lock().expect("events").push("read returned");
            waited
        });
        waiting.recv().expect("the reader runs");
        go.send(()).expect("go");
        reader.join().expect("reader").expect("synced");
        assert_eq!(*events.lock().expect("events"), ["synced", "read returned"]);
        assert!(matches!(answer.blocking_recv(), Ok(Ok(_))));
        syncer.finish();
    }

    #[test]
    fn a_failed_sync_fails_its_answers_and_every_later_one() {
        let syncs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&syncs);
        let mut syncer = Syncer::start_with(Box::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(std::io::Error::other("EIO"))
        }))
        .expect("start");
        let (first, first_answer) = one(true);
        syncer.hand(first);
        assert!(matches!(
            first_answer.blocking_recv(),
            Ok(Err(DispatchStoreError::Unavailable { detail })) if detail.contains("EIO")
        ));
        let (later, later_answer) = one(true);
        syncer.hand(later);
        assert!(matches!(
            later_answer.blocking_recv(),
            Ok(Err(DispatchStoreError::Unavailable { .. }))
        ));
        assert!(
            syncer.watermark().wait_synced().is_err(),
            "a read after a failed sync is not answered as if synced"
        );
        syncer.finish();
        assert_eq!(
            syncs.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "not retried"
        );
    }

    #[test]
    fn a_batch_that_wrote_nothing_is_answered_in_turn_without_a_sync() {
        let syncs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&syncs);
        let mut syncer = Syncer::start_with(Box::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }))
        .expect("start");
        let (nothing, answer) = one(false);
        syncer.hand(nothing);
        assert!(matches!(answer.blocking_recv(), Ok(Ok(_))));
        syncer.finish();
        assert_eq!(syncs.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Control: a batch that wrote is synced.
        let counted = std::sync::Arc::clone(&syncs);
        let mut syncer = Syncer::start_with(Box::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }))
        .expect("start");
        let (wrote, answer) = one(true);
        syncer.hand(wrote);
        assert!(matches!(answer.blocking_recv(), Ok(Ok(_))));
        syncer.finish();
        assert_eq!(syncs.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
