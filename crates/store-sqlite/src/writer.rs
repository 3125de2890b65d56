//! The writer thread: the one connection that writes, committing commands in batches.
//!
//! Group commit: the writer takes every command queued (at most `max_batch`; with a
//! `max_delay`, it first waits that long after the first was sent for more), applies them all
//! in one transaction and commits it (one fsync), and only then replies to those that wait
//! for a reply. Under load the commands that arrive while a batch commits form the next one,
//! so a batch costs one fsync however many submitters share it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};
use switchyard_core::{Completion, DispatchStoreError, Recorded};
use tokio::sync::oneshot;

use crate::backlog::Backlog;
use crate::fold::{Plan, Step};
use crate::hold::Held;
use crate::inbox::Inbox;
use crate::insert::{NewRow, insert_many};
use crate::ops::{self, Answer, Finished, Limits, Op, StepError, StoreSize};
use crate::schema;
use crate::statements::Statements;
use crate::sync::{self, Answers, Syncer};

/// The reply to one command.
pub(crate) type Reply = Result<Answer, DispatchStoreError>;

/// One write waiting for the writer.
#[derive(Debug)]
pub(crate) struct Command {
    pub(crate) op: Op,
    /// Where the answer goes; `None` for a note nobody waits on.
    pub(crate) reply: Option<oneshot::Sender<Reply>>,
    /// When it was sent: the batch's delay counts from its first command's.
    pub(crate) sent: Instant,
    /// Until when this write (a record, or a claim note) may wait for its dispatch's outcome
    /// to be written with it ([`hold`](crate::hold)); `None` for a write that may not wait.
    pub(crate) hold_until: Option<Instant>,
}

/// When the writer stops gathering a batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchPolicy {
    pub(crate) max_batch: usize,
    pub(crate) max_delay: Duration,
}

impl BatchPolicy {
    /// Gathering stops with `len` commands in hand.
    pub(crate) fn is_full(self, len: usize) -> bool {
        len >= self.max_batch.max(1)
    }

    /// Gathering stops at this instant, for a batch whose first command was sent at `first`.
    pub(crate) fn deadline(self, first: Instant) -> Instant {
        first + self.max_delay
    }
}

/// The writer's state, owned by its thread.
pub(crate) struct Writer {
    pub(crate) conn: Connection,
    pub(crate) backlog: Backlog,
    pub(crate) limits: Limits,
    /// The store's file, for `DiskFull`.
    pub(crate) path: String,
    /// Transactions committed, shared with the store.
    pub(crate) commits: Arc<AtomicU64>,
    /// Fsyncs the WAL and answers each batch after its commit ([`Synchronous::Full`]); `None`
    /// answers at once (the connection syncs as its `synchronous` says).
    ///
    /// [`Synchronous::Full`]: crate::Synchronous::Full
    pub(crate) syncer: Option<Syncer>,
}

impl Writer {
    /// Serves commands until the inbox is closed and empty; the connection closes on return,
    /// after writing every record still held back.
    pub(crate) fn run(mut self, inbox: &Inbox) {
        let mut held = Held::default();
        while let Some(taken) = inbox.take_until(held.next_release()) {
            let write = held.admit(taken, Instant::now());
            if !write.is_empty() {
                self.commit_batch(write);
            }
        }
        let rest = held.release_all();
        if !rest.is_empty() {
            self.commit_batch(rest);
        }
        // Every answer sent before the connection closes.
        if let Some(syncer) = &mut self.syncer {
            syncer.finish();
        }
    }

    /// Applies `batch` in one transaction, commits, then answers each command (through the
    /// syncer, when there is one, after the WAL is fsynced).
    fn commit_batch(&mut self, batch: Vec<Command>) {
        let (ops, replies): (Vec<Op>, Vec<Option<oneshot::Sender<Reply>>>) =
            batch.into_iter().map(|c| (c.op, c.reply)).unzip();
        if ops.iter().all(|op| matches!(op, Op::Barrier)) {
            // Nothing to write: everything sent before these is committed already (and
            // answered, through the syncer, only once it is synced).
            let replies = replies.into_iter().map(|r| (r, Ok(Answer::Done))).collect();
            self.answer(Answers {
                replies,
                wrote: false,
                seq: None,
            });
            return;
        }
        let plan = Plan::new(&ops);
        let seq = self.syncer.as_ref().map(Syncer::begin);
        let (results, wrote) = match self.apply(&ops, &plan) {
            Ok(results) => {
                self.backlog.commit();
                self.commits.fetch_add(1, Ordering::Relaxed);
                (results, true)
            }
            Err(err) => {
                self.backlog.roll_back();
                let err = store_error(&self.path, &err);
                tracing::warn!(%err, commands = ops.len(), "dispatch store batch rolled back");
                (ops.iter().map(|_| Err(err.clone())).collect(), false)
            }
        };
        let mut slots: Vec<_> = replies
            .into_iter()
            .zip(results.into_iter().map(Some))
            .collect();
        let mut replies = Vec::with_capacity(slots.len());
        for i in reply_order(&plan, slots.len()) {
            if let Some((reply, Some(result))) = slots.get_mut(i).map(|(r, a)| (r.take(), a.take()))
            {
                replies.push((reply, result));
            }
        }
        self.answer(Answers {
            replies,
            wrote,
            seq,
        });
    }

    /// Sends `answers`: through the syncer when there is one, else now.
    fn answer(&self, answers: Answers) {
        match &self.syncer {
            Some(syncer) => syncer.hand(answers),
            None => sync::answer(answers, None),
        }
    }

    fn apply(&mut self, ops: &[Op], plan: &Plan) -> rusqlite::Result<Vec<Reply>> {
        let tx = schema::begin_batch(&mut self.conn)?;
        let mut results = Vec::with_capacity(ops.len());
        // Per command: a record that inserted its row finished.
        let mut inserted_finished = vec![false; ops.len()];
        let mut size = StoreSize::default();
        let mut statements = Statements::new(&tx);
        // Finished rows admitted and not yet inserted: inserted several per statement before
        // any other write runs, so every write still sees those before it.
        let mut pending = Pending::default();
        for (i, op) in ops.iter().enumerate() {
            let (backlog, limits) = (&mut self.backlog, self.limits);
            if let Some(row) = gathered(ops, plan, i) {
                match ops::admit(&mut statements, backlog, &mut size, limits, row.dispatch) {
                    Ok(()) => {
                        pending.at.push(i);
                        pending.rows.push(row);
                        // Its answer once inserted.
                        results.push(Ok(Answer::Done));
                    }
                    Err(StepError::Refused(refusal)) => results.push(Err(refusal)),
                    Err(StepError::Sql(err)) => return Err(err),
                }
                continue;
            }
            let step = plan.step(i);
            if step != Step::Superseded {
                insert_pending(
                    &mut statements,
                    backlog,
                    &mut size,
                    &mut pending,
                    &mut results,
                    &mut inserted_finished,
                )?;
            }
            let step = match (step, op) {
                (Step::Superseded, _) => Ok(Answer::Done),
                (Step::RecordFinished { complete }, Op::Record(dispatch)) => {
                    let finished = finished_by(ops, plan, complete);
                    let recorded = ops::record(
                        &mut statements,
                        backlog,
                        &mut size,
                        limits,
                        dispatch,
                        finished,
                    );
                    if let Ok(Recorded::New(_)) = &recorded {
                        inserted_finished[i] = finished.is_some();
                    }
                    recorded.map(Answer::Recorded)
                }
                (Step::CompleteFolded { record }, _) if inserted_finished[record] => {
                    Ok(Answer::Completion(Completion::Recorded))
                }
                _ => op.apply(&mut statements, backlog, &mut size, limits, plan.claimed(i)),
            };
            match step {
                Ok(answer) => results.push(Ok(answer)),
                Err(StepError::Refused(refusal)) => results.push(Err(refusal)),
                Err(StepError::Sql(err)) => return Err(err),
            }
        }
        insert_pending(
            &mut statements,
            &mut self.backlog,
            &mut size,
            &mut pending,
            &mut results,
            &mut inserted_finished,
        )?;
        drop(statements);
        tx.commit()?;
        Ok(results)
    }
}

/// Command `i` as a finished row to insert with others: a record without an idempotency key
/// whose outcome is in the batch (a keyed one first looks its key up, which must see every
/// row before it).
fn gathered<'a>(ops: &'a [Op], plan: &Plan, i: usize) -> Option<NewRow<'a>> {
    let Step::RecordFinished { complete } = plan.step(i) else {
        return None;
    };
    let Some(Op::Record(dispatch)) = ops.get(i) else {
        return None;
    };
    if dispatch.idempotency_key.is_some() {
        return None;
    }
    let finished = finished_by(ops, plan, complete)?;
    Some(NewRow {
        dispatch,
        finished: Some(finished),
    })
}

/// The outcome that command `complete` of the batch gives the record it is folded into.
fn finished_by<'a>(ops: &'a [Op], plan: &Plan, complete: usize) -> Option<Finished<'a>> {
    ops.get(complete)
        .and_then(|op| Finished::of(op, plan.claimed(complete)))
}

/// Finished rows admitted and waiting to be inserted together: per row, its command.
#[derive(Default)]
struct Pending<'a> {
    at: Vec<usize>,
    rows: Vec<NewRow<'a>>,
}

/// Inserts the rows `pending` holds and answers their commands in `results`.
fn insert_pending(
    statements: &mut Statements<'_>,
    backlog: &mut Backlog,
    size: &mut StoreSize,
    pending: &mut Pending<'_>,
    results: &mut [Reply],
    inserted_finished: &mut [bool],
) -> rusqlite::Result<()> {
    if pending.rows.is_empty() {
        return Ok(());
    }
    let inserted = insert_many(statements, &pending.rows)?;
    for ((i, row), inserted) in pending
        .at
        .drain(..)
        .zip(pending.rows.drain(..))
        .zip(inserted)
    {
        if let Some(flag) = inserted_finished.get_mut(i) {
            *flag = inserted;
        }
        if let Some(result) = results.get_mut(i) {
            *result = Ok(Answer::Recorded(ops::recorded(
                backlog, size, row, inserted,
            )));
        }
    }
    Ok(())
}

/// The order in which a batch of `len` commands planned by `plan` is answered: the batch's
/// order, except that the `complete` folded into a record is answered right after that record.
///
/// One task waits for both (a dispatch delivered while it records): answered back to back,
/// the second answer finds the task already woken by the first and not yet run, so it is
/// scheduled and polled once, not once per answer with a batch's other answers between.
fn reply_order(plan: &Plan, len: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(len);
    for i in 0..len {
        match plan.step(i) {
            Step::CompleteFolded { .. } => {}
            Step::RecordFinished { complete } => {
                order.push(i);
                order.push(complete);
            }
            Step::Apply | Step::Superseded => order.push(i),
        }
    }
    order
}

/// SQLite's failure as the store's: a full file system is `DiskFull`, the rest `Unavailable`.
pub(crate) fn store_error(path: &str, err: &rusqlite::Error) -> DispatchStoreError {
    if err.sqlite_error_code() == Some(ErrorCode::DiskFull) {
        DispatchStoreError::DiskFull {
            path: path.to_owned(),
        }
    } else {
        DispatchStoreError::Unavailable {
            detail: err.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use bytes::Bytes;
    use switchyard_core::{DispatchId, NewDispatch, Recorded};

    use super::*;
    use crate::options::Synchronous;

    fn writer(dir: &std::path::Path, max_queued_per_namespace: u64) -> Writer {
        let path = dir.join("s.sqlite3");
        let conn = schema::open_writer(&path, Synchronous::Full).expect("open");
        Writer {
            backlog: Backlog::load(&conn).expect("backlog"),
            conn,
            limits: Limits {
                max_queued_per_namespace,
                max_bytes: 1 << 30,
            },
            path: path.display().to_string(),
            commits: Arc::new(AtomicU64::new(0)),
            syncer: None,
        }
    }

    fn record(namespace: &str) -> (Command, oneshot::Receiver<Reply>) {
        let now = SystemTime::now();
        let (reply, answer) = oneshot::channel();
        let reply = Some(reply);
        let op = Op::Record(Arc::new(NewDispatch {
            id: DispatchId::generate(),
            namespace: namespace.into(),
            task_queue: "q".into(),
            activity_type: "a".into(),
            node: None,
            input: Bytes::from_static(b"in"),
            principal: "p".into(),
            idempotency_key: None,
            submitted_at: now,
            deadline: now,
        }));
        let sent = Instant::now();
        (
            Command {
                op,
                reply,
                sent,
                hold_until: None,
            },
            answer,
        )
    }

    fn answer(mut answer: oneshot::Receiver<Reply>) -> Reply {
        answer.try_recv().expect("replied")
    }

    fn rows(writer: &Writer) -> i64 {
        writer
            .conn
            .query_row("SELECT count(*) FROM dispatches", [], |row| row.get(0))
            .expect("count")
    }

    #[test]
    fn one_batch_is_one_transaction_and_a_refusal_in_it_undoes_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = writer(dir.path(), 2);
        let (commands, answers): (Vec<_>, Vec<_>) = (0..3).map(|_| record("ns")).unzip();
        writer.commit_batch(commands);
        let replies: Vec<_> = answers.into_iter().map(answer).collect();
        assert!(matches!(replies[0], Ok(Answer::Recorded(Recorded::New(_)))));
        assert!(matches!(replies[1], Ok(Answer::Recorded(Recorded::New(_)))));
        assert!(
            matches!(
                replies[2],
                Err(DispatchStoreError::QueueFull { limit: 2, .. })
            ),
            "the third in one batch sees the two before it: {:?}",
            replies[2]
        );
        assert_eq!(
            writer.commits.load(Ordering::Relaxed),
            1,
            "one commit for three"
        );
        assert_eq!(rows(&writer), 2);
        assert_eq!(writer.backlog.unfinished("ns"), 2);
    }

    fn command(op: Op) -> (Command, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        let sent = Instant::now();
        (
            Command {
                op,
                reply: Some(reply),
                sent,
                hold_until: None,
            },
            answer,
        )
    }

    fn finish(id: &DispatchId) -> Op {
        Op::Complete {
            id: id.clone(),
            outcome: switchyard_core::OutcomeRecord {
                kind: "completed".into(),
                output: Bytes::from_static(b"out"),
                message: String::new(),
                retryable: false,
                reason: String::new(),
                attempts: 0,
            },
            at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(9),
        }
    }

    /// The columns of `id`'s row that a record, its claims and its complete decide.
    fn row_of(
        writer: &Writer,
        id: &DispatchId,
    ) -> (String, i64, Option<i64>, Option<String>, Option<Vec<u8>>) {
        writer
            .conn
            .query_row(
                "SELECT state, attempts, finished_at_ns, outcome_kind, outcome_output \
                 FROM dispatches WHERE id = ?1",
                [id.as_str()],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ))
                },
            )
            .expect("row")
    }

    fn id_of(command: &Command) -> DispatchId {
        match &command.op {
            Op::Record(dispatch) => dispatch.id.clone(),
            other => panic!("not a record: {other:?}"),
        }
    }

    #[test]
    fn a_record_claimed_and_completed_in_one_batch_is_one_finished_row_like_three_batches_give() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = writer(dir.path(), 10);
        let claim = |id: &DispatchId| Op::Claim {
            id: id.clone(),
            worker: switchyard_core::WorkerId::from_raw(3),
            attempt: 2,
        };

        let changes = |writer: &Writer| -> i64 {
            writer
                .conn
                .query_row("SELECT total_changes()", [], |row| row.get(0))
                .expect("total_changes")
        };

        // One batch: record, claim, complete.
        let before = changes(&writer);
        let (rec, rec_answer) = record("ns");
        let folded = id_of(&rec);
        let (cl, _) = command(claim(&folded));
        let (done, done_answer) = command(finish(&folded));
        writer.commit_batch(vec![rec, cl, done]);
        assert!(matches!(
            answer(rec_answer),
            Ok(Answer::Recorded(Recorded::New(_)))
        ));
        assert!(matches!(
            answer(done_answer),
            Ok(Answer::Completion(Completion::Recorded))
        ));
        assert_eq!(
            writer.backlog.unfinished("ns"),
            0,
            "a folded row is not backlog"
        );
        assert_eq!(changes(&writer) - before, 1, "one row written once");

        // Control: the same three writes in three batches, as they were always written.
        let before = changes(&writer);
        let (rec, _) = record("ns");
        let apart = id_of(&rec);
        writer.commit_batch(vec![rec]);
        assert_eq!(writer.backlog.unfinished("ns"), 1);
        writer.commit_batch(vec![command(claim(&apart)).0]);
        let (done, done_answer) = command(finish(&apart));
        writer.commit_batch(vec![done]);
        assert!(matches!(
            answer(done_answer),
            Ok(Answer::Completion(Completion::Recorded))
        ));
        assert_eq!(writer.backlog.unfinished("ns"), 0);
        assert_eq!(changes(&writer) - before, 3, "an insert and two updates");

        let row = row_of(&writer, &folded);
        assert_eq!(
            row,
            row_of(&writer, &apart),
            "folding changed the stored row"
        );
        assert_eq!(row.0, "finished");
        assert_eq!(row.1, 2, "the superseded claim's attempt is kept");

        // A second complete of the folded dispatch finds its outcome.
        let (again, again_answer) = command(finish(&folded));
        writer.commit_batch(vec![again]);
        assert!(matches!(
            answer(again_answer),
            Ok(Answer::Completion(Completion::AlreadyFinished(_)))
        ));
    }

    /// Wakes by pushing its tag, to see in which order a batch's answers were sent.
    struct Tag(usize, Arc<std::sync::Mutex<Vec<usize>>>);

    impl std::task::Wake for Tag {
        fn wake(self: Arc<Self>) {
            self.1.lock().expect("tags").push(self.0);
        }
    }

    #[test]
    fn a_record_and_its_folded_complete_are_answered_back_to_back() {
        use std::future::Future;
        use std::task::{Context, Waker};

        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = writer(dir.path(), 10);
        let (rec_a, a0) = record("ns");
        let (rec_b, b0) = record("ns");
        let (rec_c, c0) = record("ns");
        let (a, b) = (id_of(&rec_a), id_of(&rec_b));
        let (done_a, a1) = command(finish(&a));
        let (done_b, b1) = command(finish(&b));
        // Control: a complete of a dispatch recorded in an earlier batch keeps its place.
        let (rec_d, d0) = record("ns");
        let d = id_of(&rec_d);
        writer.commit_batch(vec![rec_d]);
        assert!(matches!(answer(d0), Ok(Answer::Recorded(_))));
        let (done_d, d1) = command(finish(&d));

        let woken = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut answers = [a0, b0, c0, d1, a1, b1];
        for (tag, answer) in answers.iter_mut().enumerate() {
            let waker = Waker::from(Arc::new(Tag(tag, Arc::clone(&woken))));
            let pending = std::pin::Pin::new(answer).poll(&mut Context::from_waker(&waker));
            assert!(pending.is_pending());
        }
        // Sent in this order: record a, record b, record c, complete d, complete a, complete b.
        writer.commit_batch(vec![rec_a, rec_b, rec_c, done_d, done_a, done_b]);
        assert_eq!(
            *woken.lock().expect("tags"),
            [0, 4, 1, 5, 2, 3],
            "each folded complete right after its record, the rest in the batch's order"
        );
        for answer in answers {
            assert!(matches!(
                answer.blocking_recv(),
                Ok(Ok(
                    Answer::Recorded(Recorded::New(_)) | Answer::Completion(Completion::Recorded)
                ))
            ));
        }
    }

    #[test]
    fn records_folded_in_one_batch_are_inserted_together_each_answered_and_a_retry_is_existing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = writer(dir.path(), 3);
        // More than two several-row statements' worth, each record with its outcome behind.
        let n = 2 * crate::insert::ROWS_PER_INSERT + 3;
        let (records, record_answers): (Vec<_>, Vec<_>) = (0..n).map(|_| record("ns")).unzip();
        let ids: Vec<DispatchId> = records.iter().map(id_of).collect();
        // The first id recorded again (a caller retrying) before the outcomes.
        let (retry, retry_answer) = match &records[0].op {
            Op::Record(first) => command(Op::Record(first.clone())),
            other => panic!("not a record: {other:?}"),
        };
        // Control: a queued record in the same batch still counts against the namespace's
        // queue (3 here) after the finished rows, which do not.
        let (queued, queued_answer) = record("ns");
        let (completes, complete_answers): (Vec<_>, Vec<_>) =
            ids.iter().map(|id| command(finish(id))).unzip();
        let mut batch = records;
        batch.push(retry);
        batch.push(queued);
        batch.extend(completes);
        writer.commit_batch(batch);
        for (answer, id) in record_answers.into_iter().zip(&ids) {
            match self::answer(answer) {
                Ok(Answer::Recorded(Recorded::New(new))) => assert_eq!(&new, id),
                other => panic!("record of {id}: {other:?}"),
            }
        }
        assert!(
            matches!(self::answer(retry_answer), Ok(Answer::Recorded(Recorded::Existing(ref first))) if *first == ids[0]),
            "the retry finds the first record"
        );
        assert!(matches!(
            self::answer(queued_answer),
            Ok(Answer::Recorded(Recorded::New(_)))
        ));
        for answer in complete_answers {
            assert!(matches!(
                self::answer(answer),
                Ok(Answer::Completion(Completion::Recorded))
            ));
        }
        let finished: i64 = writer
            .conn
            .query_row(
                "SELECT count(*) FROM dispatches WHERE state = 'finished' AND outcome_kind = 'completed'",
                [],
                |row| row.get(0),
            )
            .expect("count");
        assert_eq!(
            finished, n as i64,
            "every folded record is one finished row"
        );
        assert_eq!(rows(&writer), n as i64 + 1);
        assert_eq!(
            writer.backlog.unfinished("ns"),
            1,
            "only the queued one waits"
        );
        assert_eq!(writer.commits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_refused_record_leaves_its_complete_in_the_batch_nothing_to_finish() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = writer(dir.path(), 1);
        let (first, _) = record("ns");
        let (refused, refused_answer) = record("ns");
        let id = id_of(&refused);
        let (done, done_answer) = command(finish(&id));
        writer.commit_batch(vec![first, refused, done]);
        assert!(matches!(
            answer(refused_answer),
            Err(DispatchStoreError::QueueFull { limit: 1, .. })
        ));
        assert!(
            matches!(
                answer(done_answer),
                Ok(Answer::Completion(Completion::Unknown))
            ),
            "a complete folded into a refused record still answers"
        );
        assert_eq!(rows(&writer), 1);
        assert_eq!(writer.backlog.unfinished("ns"), 1);
    }

    #[test]
    fn a_failing_command_rolls_the_whole_batch_back_and_the_next_batch_works() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = writer(dir.path(), 10);
        writer
            .conn
            .execute_batch(
                "CREATE TEMP TRIGGER refuse_boom BEFORE INSERT ON main.dispatches \
                 WHEN NEW.namespace = 'boom' BEGIN SELECT RAISE(ABORT, 'boom refused'); END;",
            )
            .expect("trigger");
        let (good, good_answer) = record("ns");
        let (bad, bad_answer) = record("boom");
        writer.commit_batch(vec![good, bad]);
        for reply in [answer(good_answer), answer(bad_answer)] {
            assert!(
                matches!(&reply, Err(DispatchStoreError::Unavailable { detail }) if detail.contains("boom refused")),
                "{reply:?}"
            );
        }
        assert_eq!(
            rows(&writer),
            0,
            "the batch's first record was committed anyway"
        );
        assert_eq!(
            writer.backlog.unfinished("ns"),
            0,
            "a rolled-back record still counted"
        );
        assert_eq!(writer.commits.load(Ordering::Relaxed), 0);

        // Control: the same kind of record alone commits.
        let (good, good_answer) = record("ns");
        writer.commit_batch(vec![good]);
        assert!(matches!(
            answer(good_answer),
            Ok(Answer::Recorded(Recorded::New(_)))
        ));
        assert_eq!(rows(&writer), 1);
        assert_eq!(writer.backlog.unfinished("ns"), 1);
    }

    #[test]
    fn a_batch_ends_at_max_batch_or_max_delay_after_its_first_command() {
        let policy = BatchPolicy {
            max_batch: 3,
            max_delay: Duration::from_millis(2),
        };
        assert!(!policy.is_full(2));
        assert!(policy.is_full(3));
        let first = Instant::now();
        assert_eq!(policy.deadline(first), first + Duration::from_millis(2));
        let zero = BatchPolicy {
            max_batch: 0,
            ..policy
        };
        assert!(!zero.is_full(0), "max_batch 0 is taken as 1");
        assert!(zero.is_full(1));
    }

    #[test]
    fn only_a_full_file_system_is_disk_full() {
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        assert_eq!(
            store_error("/s", &full),
            DispatchStoreError::DiskFull { path: "/s".into() }
        );
        let io = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
            None,
        );
        assert!(matches!(
            store_error("/s", &io),
            DispatchStoreError::Unavailable { .. }
        ));
    }
}
