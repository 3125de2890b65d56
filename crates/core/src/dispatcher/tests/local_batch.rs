//! The local batch: capacity never exceeded when the batch is larger than the free slots (the
//! rest is busy), round-robin across the batch, one end per delivered dispatch, cancel by
//! index, deadlines, a lost worker replaced locally or the dispatch unserved, a dropped batch
//! cancelling its tasks, and one quota hold for the whole batch.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::dispatcher::*;
use crate::outcome::ActivityOutcome;

use super::fixture::*;

fn pool() -> LocalPool {
    LocalPool {
        namespace: NS.to_owned(),
        task_queue: String::new(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
    }
}

fn entries(n: usize, timeout: Duration) -> Vec<LocalEntry> {
    (0..n)
        .map(|i| LocalEntry {
            input: Bytes::from(format!("in-{i}")),
            timeout,
            attempt_offset: 0,
        })
        .collect()
}

fn start(s: &Setup, n: usize) -> LocalBatch {
    s.dispatcher
        .dispatch_local_batch(
            &caller(),
            pool(),
            entries(n, Duration::from_secs(30)),
            BatchCancel::default(),
        )
        .expect("the batch is accepted")
}

fn tasks(worker: &mut TestWorker) -> Vec<ActivityTask> {
    worker
        .sent()
        .into_iter()
        .filter_map(|message| match message {
            WorkerMessage::Task(task) => Some(task),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_batch_larger_than_the_free_slots_takes_what_fits_and_the_rest_is_busy() {
    let s = setup();
    let mut a = s.worker(2).await;
    let mut b = s.worker(2).await;
    let mut batch = start(&s, 6);
    let mut expected = vec![LocalStart::Delivered; 4];
    expected.extend([LocalStart::Busy; 2]);
    assert_eq!(batch.starts(), expected);
    assert_eq!(batch.running(), 4);
    assert_eq!(
        (s.in_flight(&a), s.in_flight(&b)),
        (2, 2),
        "never past capacity"
    );
    let to_a = tasks(&mut a);
    assert_eq!((to_a.len(), tasks(&mut b).len()), (2, 2));
    let full = start(&s, 1);
    assert_eq!(full.starts(), [LocalStart::Busy], "no slot left");
    assert_eq!(s.in_flight(&a), 2);
    // Control: once a slot is freed, the next batch's first dispatch takes it.
    s.dispatcher
        .complete(a.id, to_a[0].task_id, success("x"))
        .expect("pending");
    assert!(matches!(
        batch.next().await,
        Some((_, ActivityOutcome::Completed(_)))
    ));
    let freed = start(&s, 2);
    assert_eq!(freed.starts(), [LocalStart::Delivered, LocalStart::Busy]);
    assert_eq!((s.in_flight(&a), s.in_flight(&b)), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn round_robin_is_kept_across_the_batch() {
    let s = setup();
    let mut a = s.worker(8).await;
    let mut b = s.worker(8).await;
    let batch = start(&s, 6);
    assert_eq!(batch.running(), 6);
    let inputs = |worker: &mut TestWorker| -> Vec<String> {
        tasks(worker)
            .into_iter()
            .map(|task| String::from_utf8_lossy(&task.input).into_owned())
            .collect()
    };
    let (to_a, to_b) = (inputs(&mut a), inputs(&mut b));
    // Alternating, whichever worker's turn it was first; choosing the first worker with a
    // free slot would give one of them all six.
    let (first, second) = if to_a.iter().any(|input| input == "in-0") {
        (to_a, to_b)
    } else {
        (to_b, to_a)
    };
    assert_eq!(first, ["in-0", "in-2", "in-4"]);
    assert_eq!(second, ["in-1", "in-3", "in-5"]);
}

#[tokio::test(start_paused = true)]
async fn each_delivered_dispatch_ends_once_with_its_workers_result() {
    let s = setup();
    let mut w = s.worker(4).await;
    let mut batch = start(&s, 3);
    let tasks = tasks(&mut w);
    assert_eq!(tasks.len(), 3);
    for task in tasks.iter().rev() {
        let input = String::from_utf8_lossy(&task.input).into_owned();
        s.dispatcher
            .complete(w.id, task.task_id, success(&format!("out-{input}")))
            .expect("pending");
    }
    let mut ends = Vec::new();
    while let Some(end) = batch.next().await {
        ends.push(end);
    }
    ends.sort_by_key(|(index, _)| *index);
    assert_eq!(
        ends,
        vec![
            (0, completed("out-in-0")),
            (1, completed("out-in-1")),
            (2, completed("out-in-2")),
        ]
    );
    assert_eq!(s.in_flight(&w), 0);
    // Control: a second result for the same task is refused, not a second end.
    assert!(
        s.dispatcher
            .complete(w.id, tasks[0].task_id, success("again"))
            .is_err()
    );
    assert_eq!(batch.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_by_index_stops_only_that_dispatch_and_tells_its_worker() {
    let s = setup();
    let mut w = s.worker(4).await;
    let cancel = BatchCancel::default();
    let mut batch = s
        .dispatcher
        .dispatch_local_batch(
            &caller(),
            pool(),
            entries(2, Duration::from_secs(30)),
            cancel.clone(),
        )
        .expect("accepted");
    let first = w.task().await;
    let second = w.task().await;
    cancel.cancel(1);
    let started = Instant::now();
    assert_eq!(batch.next().await, Some((1, ActivityOutcome::Cancelled)));
    assert_eq!(started.elapsed(), Duration::ZERO, "ended at once");
    assert_eq!(
        w.sent(),
        vec![WorkerMessage::Cancel {
            task_id: second.task_id,
            reason: CancelReason::Requested,
        }]
    );
    assert_eq!(s.in_flight(&w), 2, "the slot stays held until acknowledged");
    s.dispatcher
        .cancel_acknowledged(w.id, second.task_id)
        .expect("acknowledged");
    assert_eq!(s.in_flight(&w), 1);
    // Control: the other dispatch is untouched and ends with its result.
    s.dispatcher
        .complete(w.id, first.task_id, success("done"))
        .expect("pending");
    assert_eq!(batch.next().await, Some((0, completed("done"))));
    assert_eq!(batch.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_asked_before_the_batch_starts_is_not_lost() {
    let s = setup();
    let mut w = s.worker(4).await;
    let cancel = BatchCancel::default();
    cancel.cancel(0);
    let mut batch = s
        .dispatcher
        .dispatch_local_batch(
            &caller(),
            pool(),
            entries(1, Duration::from_secs(30)),
            cancel,
        )
        .expect("accepted");
    let task = w.task().await;
    assert_eq!(batch.next().await, Some((0, ActivityOutcome::Cancelled)));
    assert_eq!(
        w.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::Requested,
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn deadlines_end_each_dispatch_timed_out_at_its_own_time() {
    let s = setup();
    let mut w = s.worker(4).await;
    let mut list = entries(2, Duration::from_secs(1));
    list[1].timeout = Duration::from_secs(2);
    let mut batch = s
        .dispatcher
        .dispatch_local_batch(&caller(), pool(), list, BatchCancel::default())
        .expect("accepted");
    let started = Instant::now();
    let first = w.task().await;
    let second = w.task().await;
    assert_eq!(batch.next().await, Some((0, ActivityOutcome::TimedOut)));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(batch.next().await, Some((1, ActivityOutcome::TimedOut)));
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    let cancels: Vec<_> = w.sent();
    assert_eq!(
        cancels,
        vec![
            WorkerMessage::Cancel {
                task_id: first.task_id,
                reason: CancelReason::DeadlineExceeded,
            },
            WorkerMessage::Cancel {
                task_id: second.task_id,
                reason: CancelReason::DeadlineExceeded,
            },
        ]
    );
    // Control: a result that beats its deadline ends the dispatch with that result.
    let mut batch = s
        .dispatcher
        .dispatch_local_batch(
            &caller(),
            pool(),
            entries(1, Duration::from_secs(1)),
            BatchCancel::default(),
        )
        .expect("accepted");
    let task = w.task().await;
    s.dispatcher
        .complete(w.id, task.task_id, success("in time"))
        .expect("pending");
    assert_eq!(batch.next().await, Some((0, completed("in time"))));
}

#[tokio::test(start_paused = true)]
async fn a_lost_worker_is_replaced_by_another_local_worker_or_the_dispatch_is_unserved() {
    let s = setup();
    let mut a = s.worker(1).await;
    let b = s.worker(1).await;
    let mut batch = start(&s, 1);
    let (mut holder, mut other) = if a.sent().is_empty() { (b, a) } else { (a, b) };
    holder.leave();
    let again = tokio::time::timeout(Duration::from_secs(1), batch.next()).await;
    assert!(again.is_err(), "no end yet: delivered again");
    let task = other.task().await;
    assert_eq!(task.attempt, 2);
    // Control: with no worker left, the loss ends the dispatch unserved.
    other.leave();
    assert!(matches!(
        batch.next().await,
        Some((0, ActivityOutcome::Unserved { .. }))
    ));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_batch_cancels_its_running_tasks() {
    let s = setup();
    let mut w = s.worker(2).await;
    let batch = start(&s, 1);
    let task = w.task().await;
    assert!(
        w.sent().is_empty(),
        "control: no cancel while the batch lives"
    );
    drop(batch);
    assert_eq!(
        w.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::CallerGone,
        }]
    );
    assert_eq!(
        s.dispatcher.inner.quotas.entries(),
        0,
        "the hold is given back"
    );
}

#[tokio::test(start_paused = true)]
async fn one_hold_covers_the_batch_and_a_batch_past_the_quota_is_refused_whole() {
    let s = setup_with(DispatchConfig {
        max_held_input_bytes_per_namespace: 10,
        ..DispatchConfig::default()
    });
    let mut w = s.worker(8).await;
    // Three inputs of 4 bytes: 12 > 10.
    let refused = s.dispatcher.dispatch_local_batch(
        &caller(),
        pool(),
        entries(3, Duration::from_secs(30)),
        BatchCancel::default(),
    );
    assert!(matches!(refused, Err(DispatchError::QuotaExceeded { .. })));
    assert!(w.sent().is_empty(), "nothing started");
    // Control: two of them (8 bytes) fit, and are held until the batch ends.
    let mut batch = start(&s, 2);
    assert_eq!(
        s.dispatcher.inner.quotas.entries(),
        2,
        "namespace and principal"
    );
    for message in w.sent() {
        if let WorkerMessage::Task(task) = message {
            s.dispatcher
                .complete(w.id, task.task_id, success("x"))
                .expect("pending");
        }
    }
    while batch.next().await.is_some() {}
    drop(batch);
    assert_eq!(s.dispatcher.inner.quotas.entries(), 0);
}
