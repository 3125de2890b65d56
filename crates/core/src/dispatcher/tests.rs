//! The dispatcher's rules, each against scripted workers and paused time.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;
use crate::delivery::{TransportName, WorkerDelivery};
use crate::eligibility::{DispatchExclusion, Eligibility};
use crate::registration::Registration;
use crate::registry::{RegistrationToken, UnservedReason};

const NS: &str = "ns";
const ACTIVITY: &str = "work";

/// A delivery leg whose far end the test reads, that can refuse tasks or play disconnected.
struct Leg {
    tx: mpsc::Sender<WorkerMessage>,
    connected: AtomicBool,
    /// Task deliveries still to refuse with `Full`.
    refuse_tasks: AtomicU32,
    /// Largest task frame the leg carries; a task frame is its input plus [`TASK_FRAMING`].
    frame_limit: AtomicUsize,
}

/// Bytes a task frame adds around its input on the test leg.
const TASK_FRAMING: usize = 20;

impl WorkerDelivery for Leg {
    fn transport(&self) -> TransportName {
        TransportName::from_static("test")
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn registration_carries_capacity(&self) -> bool {
        true
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if let WorkerMessage::Task(task) = &message {
            let size = task.input.len() + TASK_FRAMING;
            let limit = self.frame_limit.load(Ordering::Acquire);
            if size > limit {
                return Err(DeliveryError::TooLarge { size, limit });
            }
        }
        if matches!(message, WorkerMessage::Task(_))
            && self
                .refuse_tasks
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(DeliveryError::Full);
        }
        self.tx.try_send(message).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })
    }
}

/// The far end of a [`Leg`]: what the gateway sent this worker.
struct TestWorker {
    id: WorkerId,
    token: Option<RegistrationToken>,
    rx: mpsc::Receiver<WorkerMessage>,
    leg: Arc<Leg>,
}

impl TestWorker {
    /// The next task sent to this worker (skipping other messages); fails the test after a
    /// minute of (paused) time.
    async fn task(&mut self) -> ActivityTask {
        let limit = Instant::now() + Duration::from_secs(60);
        loop {
            match tokio::time::timeout_at(limit, self.rx.recv()).await {
                Ok(Some(WorkerMessage::Task(task))) => return task,
                Ok(Some(_)) => {}
                Ok(None) => panic!("worker {} link closed while waiting for a task", self.id),
                Err(_) => panic!("worker {} got no task", self.id),
            }
        }
    }

    /// Everything sent to this worker and not yet read, without waiting.
    fn sent(&mut self) -> Vec<WorkerMessage> {
        std::iter::from_fn(|| self.rx.try_recv().ok()).collect()
    }

    fn leave(&mut self) {
        drop(self.token.take());
    }
}

struct Setup {
    registry: Registry,
    dispatcher: Dispatcher,
}

fn setup() -> Setup {
    setup_with(DispatchConfig::default())
}

fn setup_with(config: DispatchConfig) -> Setup {
    let registry = Registry::default();
    let dispatcher = Dispatcher::new(registry.clone(), config);
    Setup {
        registry,
        dispatcher,
    }
}

fn caller() -> CallerIdentity {
    CallerIdentity::trusted("producer")
}

fn registration(capacity: u32) -> Registration {
    Registration {
        namespaces: BTreeSet::from([NS.to_owned()]),
        activity_types: BTreeSet::from([ACTIVITY.to_owned()]),
        identity: "test-worker".to_owned(),
        max_concurrency: Some(capacity),
        ..Registration::default()
    }
}

fn request(input: &str, timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: NS.to_owned(),
        task_queue: String::new(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
        input: Bytes::copy_from_slice(input.as_bytes()),
        activity_id: None,
        timeout,
    }
}

fn with_id(mut request: ActivityRequest, id: &str) -> ActivityRequest {
    request.activity_id = Some(id.to_owned());
    request
}

impl Setup {
    async fn worker(&self, capacity: u32) -> TestWorker {
        let (tx, rx) = mpsc::channel(256);
        let leg = Arc::new(Leg {
            tx,
            connected: AtomicBool::new(true),
            refuse_tasks: AtomicU32::new(0),
            frame_limit: AtomicUsize::new(usize::MAX),
        });
        let token = self
            .registry
            .admit(&caller(), registration(capacity), Arc::clone(&leg) as _)
            .await
            .expect("a valid registration is admitted");
        TestWorker {
            id: token.worker_id(),
            token: Some(token),
            rx,
            leg,
        }
    }

    fn spawn(&self, request: ActivityRequest) -> JoinHandle<ActivityOutcome> {
        let dispatcher = self.dispatcher.clone();
        tokio::spawn(async move {
            dispatcher
                .dispatch(&caller(), request)
                .await
                .expect("the dispatch is accepted")
        })
    }

    fn in_flight(&self, worker: &TestWorker) -> u32 {
        self.registry
            .worker(worker.id)
            .map(|w| w.in_flight)
            .expect("worker registered")
    }

    fn eligibility(&self, worker: &TestWorker) -> Eligibility {
        self.registry
            .worker(worker.id)
            .map(|w| w.eligibility)
            .expect("worker registered")
    }

    /// Lets spawned dispatches run until `n` wait parked (bounded; paused time stays put).
    async fn parked(&self, n: usize) {
        for _ in 0..1000 {
            let waiting: usize = self
                .dispatcher
                .unserved_queues()
                .iter()
                .map(|q| q.waiting)
                .sum();
            if waiting == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{n} dispatches never parked");
    }
}

fn success(input: &str) -> TaskResult {
    TaskResult::Success(Bytes::copy_from_slice(input.as_bytes()))
}

fn completed(input: &str) -> ActivityOutcome {
    ActivityOutcome::Completed(Bytes::copy_from_slice(input.as_bytes()))
}

// Rule 1: select, deliver; a delivery error frees the slot and selects again, attempt-neutral.

#[tokio::test(start_paused = true)]
async fn a_refused_delivery_frees_the_slot_and_selects_again_without_an_attempt() {
    let s = setup();
    let mut refusing = s.worker(1).await;
    let mut taking = s.worker(1).await;
    refusing.leg.refuse_tasks.store(1, Ordering::Release);
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = taking.task().await;
    assert_eq!(
        task.attempt, 1,
        "the refused delivery must not count as an attempt"
    );
    assert_eq!(s.in_flight(&refusing), 0, "the refused slot was freed");
    assert_eq!(
        s.in_flight(&taking),
        1,
        "control: the taken slot is counted"
    );
    assert!(refusing.sent().is_empty());
    s.dispatcher
        .complete(taking.id, task.task_id, success("x"))
        .expect("result accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn a_worker_refusing_every_delivery_backs_off_instead_of_spinning() {
    let s = setup();
    let mut worker = s.worker(1).await;
    worker.leg.refuse_tasks.store(u32::MAX, Ordering::Release);
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("x", Duration::from_secs(1)))
        .await
        .expect("accepted");
    assert!(
        matches!(outcome, ActivityOutcome::Unserved { .. }),
        "{outcome:?}"
    );
    let tries = s.dispatcher.selections();
    // One second of backoff capped at 100 ms between tries: a few dozen, not millions.
    assert!(
        (5..=40).contains(&tries),
        "{tries} selection attempts in one second"
    );
    assert!(worker.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_input_over_max_input_bytes_is_refused_up_front_and_nothing_is_sent() {
    let s = setup_with(DispatchConfig {
        max_input_bytes: 10,
        ..DispatchConfig::default()
    });
    let mut worker = s.worker(1).await;
    let refused = s
        .dispatcher
        .dispatch(&caller(), request(&"x".repeat(11), Duration::from_secs(5)))
        .await;
    assert_eq!(
        refused,
        Err(DispatchError::InputTooLarge {
            size: 11,
            limit: 10
        })
    );
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err("input is 11 bytes, more than the limit of 10 bytes a worker can receive".to_owned())
    );
    assert!(worker.sent().is_empty(), "no worker was offered the task");
    // Control: an input exactly at the limit is delivered.
    let running = s.spawn(request(&"x".repeat(10), Duration::from_secs(5)));
    let task = worker.task().await;
    assert_eq!(task.input.len(), 10);
    s.dispatcher
        .complete(worker.id, task.task_id, success("ok"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("ok"));
}

#[tokio::test(start_paused = true)]
async fn a_leg_refusing_a_task_as_too_large_ends_the_dispatch_at_once_and_keeps_the_worker() {
    let s = setup();
    let mut small = s.worker(1).await;
    let mut other = s.worker(1).await;
    small.leg.frame_limit.store(30, Ordering::Release);
    other.leg.frame_limit.store(30, Ordering::Release);
    let started = Instant::now();
    let refused = s
        .dispatcher
        .dispatch(&caller(), request(&"x".repeat(15), Duration::from_secs(30)))
        .await;
    assert_eq!(
        refused,
        Err(DispatchError::InputTooLarge {
            size: 15,
            limit: 30 - TASK_FRAMING
        }),
        "the limit is restated for the input, less the leg's framing"
    );
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "refused at once, not at the deadline"
    );
    for worker in [&small, &other] {
        assert!(s.registry.is_registered(worker.id), "no worker leaves");
        assert_eq!(s.in_flight(worker), 0, "no slot stays held");
    }
    assert!(small.sent().is_empty() && other.sent().is_empty());
    // Control: the next input that fits is served by the same pool.
    let running = s.spawn(request(&"x".repeat(10), Duration::from_secs(30)));
    let (worker, task) = tokio::select! {
        task = small.task() => (small.id, task),
        task = other.task() => (other.id, task),
    };
    s.dispatcher
        .complete(worker, task.task_id, success("fits"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("fits"));
}

// Rule 2: park on a miss, listed in unserved_queues, one WARN per episode, never spin.

#[tokio::test(start_paused = true)]
async fn a_parked_dispatch_is_listed_with_reason_census_and_count_then_removed() {
    let s = setup();
    assert!(s.dispatcher.unserved_queues().is_empty());
    let running: Vec<_> = (0..3)
        .map(|i| s.spawn(request(&format!("p{i}"), Duration::from_secs(60))))
        .collect();
    s.parked(3).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let listed = s.dispatcher.unserved_queues();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let queue = &listed[0];
    assert_eq!(queue.address.namespace, NS);
    assert_eq!(queue.address.task_queue, crate::DEFAULT_TASK_QUEUE);
    assert_eq!(queue.address.activity_type, ACTIVITY);
    assert_eq!(queue.reason, UnservedReason::NoWorkers);
    assert_eq!(queue.census.pool_workers, 0);
    assert_eq!(queue.waiting, 3);
    assert_eq!(queue.oldest_wait, Duration::from_secs(2));

    let mut worker = s.worker(3).await;
    for _ in 0..3 {
        let task = worker.task().await;
        let input = String::from_utf8_lossy(&task.input).into_owned();
        s.dispatcher
            .complete(worker.id, task.task_id, success(&input))
            .expect("accepted");
    }
    for (i, running) in running.into_iter().enumerate() {
        assert_eq!(running.await.expect("joined"), completed(&format!("p{i}")));
    }
    assert!(
        s.dispatcher.unserved_queues().is_empty(),
        "served queues leave the list"
    );
}

#[tokio::test(start_paused = true)]
async fn the_listing_takes_a_fresh_census() {
    let s = setup();
    let mut busy = s.worker(1).await;
    let holding = s.spawn(request("hold", Duration::from_secs(60)));
    let task = busy.task().await;
    let _parked = s.spawn(request("wait", Duration::from_secs(60)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::AllAtCapacity
    );
    // The worker leaves (no wake for parked dispatches); the listing still tells the truth.
    busy.leave();
    let queue = &s.dispatcher.unserved_queues()[0];
    assert_eq!(queue.reason, UnservedReason::NoWorkers);
    assert_eq!(queue.census.last_compatible_departure, Some(Duration::ZERO));
    drop((holding, task));
}

#[tokio::test(start_paused = true)]
async fn one_warn_per_address_per_episode() {
    let s = setup();
    let first: Vec<_> = (0..5)
        .map(|_| s.spawn(request("a", Duration::from_secs(5))))
        .collect();
    s.parked(5).await;
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        1,
        "five dispatches, one episode"
    );
    let mut other = request("b", Duration::from_secs(5));
    other.activity_type = "other".to_owned();
    let second = s.spawn(other);
    s.parked(6).await;
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        2,
        "another address is another episode"
    );
    for running in first {
        assert!(matches!(
            running.await.expect("joined"),
            ActivityOutcome::Unserved { .. }
        ));
    }
    assert!(matches!(
        second.await.expect("joined"),
        ActivityOutcome::Unserved { .. }
    ));
    assert!(s.dispatcher.unserved_queues().is_empty());
    let again = s.spawn(request("c", Duration::from_secs(5)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        3,
        "the address parks again: a new episode"
    );
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn probation_parks_quietly_and_warns_once_it_turns_into_an_incident() {
    let s = setup();
    let worker = s.worker(1).await;
    s.registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::OpeningProbation,
    )]));
    let running = s.spawn(request("x", Duration::from_secs(30)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::OnProbation
    );
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        0,
        "probation is not an incident"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    s.registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::ReachabilityLost,
    )]));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(s.dispatcher.unserved_warnings(), 1);
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::WorkersUnreachable
    );
    drop(running);
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_workers_are_all_unreachable_is_reported_unreachable() {
    let s = setup();
    let lost = s.worker(1).await;
    let new = s.worker(1).await;
    s.registry.set_dispatch_ineligible(HashMap::from([
        (lost.id, DispatchExclusion::ReachabilityLost),
        (new.id, DispatchExclusion::OpeningProbation),
    ]));
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("x", Duration::from_secs(1)))
        .await
        .expect("accepted");
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::OnProbation,
                ..
            }
        ),
        "control: one worker on probation makes the wait transient, got {outcome:?}"
    );
    s.registry.set_dispatch_ineligible(HashMap::from([
        (lost.id, DispatchExclusion::ReachabilityLost),
        (new.id, DispatchExclusion::ReachabilityLost),
    ]));
    let running = s.spawn(request("x", Duration::from_secs(1)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::WorkersUnreachable
    );
    let outcome = running.await.expect("joined");
    let ActivityOutcome::Unserved { reason, detail } = outcome else {
        panic!("expected unserved, got {outcome:?}");
    };
    assert_eq!(reason, UnservedReason::WorkersUnreachable);
    assert!(detail.contains("unreachable"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn a_dispatch_waiting_out_probation_selects_once_per_wake_not_in_a_loop() {
    let s = setup();
    let mut worker = s.worker(1).await;
    s.registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::OpeningProbation,
    )]));
    let running = s.spawn(request("x", Duration::from_secs(30)));
    s.parked(1).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(s.dispatcher.selections(), 1, "parked, not polling");
    s.registry.set_dispatch_ineligible(HashMap::new());
    let task = worker.task().await;
    assert_eq!(
        s.dispatcher.selections(),
        2,
        "control: the verdict wakes it once"
    );
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_link_dropped_before_it_left_parks_without_spinning() {
    let s = setup();
    let worker = s.worker(1).await;
    // Registered and counted eligible by the registry, but selection skips it.
    worker.leg.connected.store(false, Ordering::Release);
    let running = s.spawn(request("x", Duration::from_secs(10)));
    s.parked(1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(s.dispatcher.selections(), 1);
    assert!(matches!(
        running.await.expect("joined"),
        ActivityOutcome::Unserved { .. }
    ));
}

// Rule 3: one entry point for results; unknown, foreign, duplicate and late ones are refused.

#[tokio::test(start_paused = true)]
async fn results_for_tasks_a_worker_does_not_hold_are_refused_counted_and_never_delivered() {
    let s = setup();
    let mut holder = s.worker(1).await;
    let stranger = s.worker(1).await;
    let running = s.spawn(request("mine", Duration::from_secs(30)));
    let task = holder.task().await;

    assert_eq!(
        s.dispatcher
            .complete(stranger.id, task.task_id, success("forged")),
        Err(CompletionRefused::NotHeldByWorker {
            task: task.task_id,
            worker: stranger.id
        })
    );
    let unknown = TaskId::from_raw(task.task_id.get() + 1000);
    assert_eq!(
        s.dispatcher.complete(holder.id, unknown, success("forged")),
        Err(CompletionRefused::UnknownTask { task: unknown })
    );
    assert_eq!(
        s.dispatcher.refused(),
        RefusedCounts {
            unknown: 1,
            foreign: 1,
            late: 0
        }
    );
    assert!(!running.is_finished(), "a refused result ends nothing");

    s.dispatcher
        .complete(holder.id, task.task_id, success("mine"))
        .expect("the holder's result is accepted");
    assert_eq!(running.await.expect("joined"), completed("mine"));
    assert_eq!(
        s.dispatcher
            .complete(holder.id, task.task_id, success("again")),
        Err(CompletionRefused::UnknownTask { task: task.task_id }),
        "a duplicate result finds nothing pending"
    );
    assert_eq!(s.dispatcher.refused().unknown, 2);
}

#[tokio::test(start_paused = true)]
async fn a_result_instead_of_a_cancel_ack_frees_the_slot_and_is_not_a_refusal() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("slow", Duration::from_secs(5)));
    let task = worker.task().await;
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::DeadlineExceeded
        }]
    );
    assert_eq!(s.in_flight(&worker), 1, "the worker still runs it");
    assert_eq!(
        s.dispatcher
            .complete(worker.id, task.task_id, success("slow")),
        Ok(()),
        "answered instead of acknowledging the cancel: accepted like a cancel_ack"
    );
    assert_eq!(s.dispatcher.refused(), RefusedCounts::default());
    assert_eq!(s.dispatcher.results_after_cancel(), 1);
    assert_eq!(s.in_flight(&worker), 0, "the answer lets go of the slot");
    let next = s.spawn(request("next", Duration::from_secs(5)));
    let second = worker.task().await;
    s.dispatcher
        .complete(worker.id, second.task_id, success("next"))
        .expect("served on the freed slot");
    assert_eq!(next.await.expect("joined"), completed("next"));
    assert_eq!(
        s.dispatcher.results_after_cancel(),
        1,
        "an ordinary result is not counted as one after a cancel"
    );
    // Control: a result for the same task again finds nothing held and is refused.
    assert_eq!(
        s.dispatcher
            .complete(worker.id, task.task_id, success("again")),
        Err(CompletionRefused::UnknownTask { task: task.task_id })
    );
    assert_eq!(s.dispatcher.refused().unknown, 1);
}

#[tokio::test(start_paused = true)]
async fn a_result_after_a_producer_cancel_is_taken_as_the_acknowledgement() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(with_id(request("x", Duration::from_secs(30)), "job-r"));
    let task = worker.task().await;
    s.dispatcher
        .cancel(&caller(), NS, "job-r")
        .expect("in flight");
    assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
    assert_eq!(
        s.in_flight(&worker),
        1,
        "control: the cancelled task holds its slot"
    );
    assert_eq!(
        s.dispatcher
            .complete(worker.id, task.task_id, success("done anyway")),
        Ok(())
    );
    assert_eq!(s.in_flight(&worker), 0);
    assert_eq!(s.dispatcher.refused(), RefusedCounts::default());
    assert_eq!(
        s.dispatcher.cancel_acknowledged(worker.id, task.task_id),
        Err(CompletionRefused::UnknownTask { task: task.task_id }),
        "a cancel_ack after the result finds nothing held"
    );
}

// Rule 4: exactly one terminal outcome; each kind.

#[tokio::test(start_paused = true)]
async fn worker_results_become_completed_or_failed() {
    let s = setup();
    let mut worker = s.worker(2).await;
    let ok = s.spawn(request("ok", Duration::from_secs(30)));
    let bad = s.spawn(request("bad", Duration::from_secs(30)));
    for _ in 0..2 {
        let task = worker.task().await;
        let result = if &task.input[..] == b"ok" {
            success("out")
        } else {
            TaskResult::Failure {
                message: "boom".to_owned(),
                retryable: false,
            }
        };
        s.dispatcher
            .complete(worker.id, task.task_id, result)
            .expect("accepted");
    }
    assert_eq!(ok.await.expect("joined"), completed("out"));
    assert_eq!(
        bad.await.expect("joined"),
        ActivityOutcome::Failed {
            message: "boom".to_owned(),
            retryable: false
        }
    );
    assert_eq!(s.dispatcher.pending_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passing_while_parked_is_unserved_with_the_reason() {
    let s = setup();
    let started = Instant::now();
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("x", Duration::from_secs(3)))
        .await
        .expect("accepted");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    let ActivityOutcome::Unserved { reason, detail } = outcome else {
        panic!("expected unserved, got {outcome:?}");
    };
    assert_eq!(reason, UnservedReason::NoWorkers);
    assert!(detail.starts_with("no_workers"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn a_result_arriving_as_the_deadline_passes_is_not_lost() {
    // The dispatch is polled by hand so that, when it looks, both its result and its deadline
    // are ready; `select!` then picks a branch at random. The result core accepted must win.
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    for round in 0..16 {
        let s = setup();
        let mut worker = s.worker(1).await;
        let producer = caller();
        let mut dispatch = std::pin::pin!(
            s.dispatcher
                .dispatch(&producer, request("x", Duration::from_secs(5)))
        );
        assert!(dispatch.as_mut().poll(&mut context).is_pending());
        let task = worker.task().await;
        tokio::time::advance(Duration::from_secs(6)).await;
        s.dispatcher
            .complete(worker.id, task.task_id, success("x"))
            .expect("the dispatch has not looked at its deadline yet");
        let std::task::Poll::Ready(outcome) = dispatch.as_mut().poll(&mut context) else {
            panic!("round {round}: both wake-ups are ready");
        };
        assert_eq!(outcome, Ok(completed("x")), "round {round}");
        assert!(
            worker.sent().is_empty(),
            "round {round}: no cancel for a finished task"
        );
    }
}

// Rule 5: a lost worker's tasks go to another worker, within the transport-loss budget.

#[tokio::test(start_paused = true)]
async fn a_lost_workers_task_is_delivered_again_to_another_worker() {
    let s = setup();
    let mut first = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let lost = first.task().await;
    assert_eq!(lost.attempt, 1);
    let mut second = s.worker(1).await;
    first.leave();
    let again = second.task().await;
    assert_eq!(again.attempt, 2);
    assert_ne!(again.task_id, lost.task_id, "each delivery has its own id");
    assert_eq!(again.input, lost.input);
    assert_eq!(
        s.dispatcher
            .complete(first.id, lost.task_id, success("old")),
        Err(CompletionRefused::UnknownTask { task: lost.task_id }),
        "the lost delivery cannot answer any more"
    );
    s.dispatcher
        .complete(second.id, again.task_id, success("x"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn losses_past_the_budget_end_transport_lost_naming_the_transport() {
    let s = setup_with(DispatchConfig {
        loss_budget: 2,
        ..DispatchConfig::default()
    });
    let running = s.spawn(request("x", Duration::from_secs(60)));
    for attempt in 1..=3 {
        let mut worker = s.worker(1).await;
        assert_eq!(worker.task().await.attempt, attempt);
        worker.leave();
    }
    assert_eq!(
        running.await.expect("joined"),
        ActivityOutcome::TransportLost {
            transport: TransportName::from_static("test"),
            attempts: 3
        }
    );
}

#[tokio::test(start_paused = true)]
async fn losses_spread_wider_than_the_window_stay_within_the_budget() {
    let s = setup_with(DispatchConfig {
        loss_budget: 1,
        loss_window: Duration::from_secs(10),
        ..DispatchConfig::default()
    });
    let running = s.spawn(request("x", Duration::from_secs(120)));
    for attempt in 1..=3 {
        let mut worker = s.worker(1).await;
        assert_eq!(worker.task().await.attempt, attempt);
        tokio::time::advance(Duration::from_secs(11)).await;
        worker.leave();
    }
    let mut last = s.worker(1).await;
    let task = last.task().await;
    assert_eq!(task.attempt, 4, "three losses, each alone in its window");
    // Control: a second loss inside the window exceeds a budget of one.
    last.leave();
    assert!(matches!(
        running.await.expect("joined"),
        ActivityOutcome::TransportLost { attempts: 4, .. }
    ));
}

// Rule 6: cancel and deadline send CancelActivity on the task's delivery and end at once; the
// slot is freed on acknowledgement or departure.

#[tokio::test(start_paused = true)]
async fn cancel_ends_the_dispatch_at_once_and_holds_the_slot_until_acknowledged() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let _other = s.worker(1).await;
    let running = s.spawn(with_id(request("x", Duration::from_secs(30)), "job-1"));
    let task = worker.task().await;
    s.dispatcher
        .cancel(&caller(), NS, "job-1")
        .expect("in flight");
    let started = Instant::now();
    assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
    assert_eq!(started.elapsed(), Duration::ZERO, "ended at once");
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::Requested
        }]
    );
    assert!(matches!(
        s.eligibility(&worker),
        Eligibility::AtCapacity { .. }
    ));
    let census = s.registry.pool_census(NS, "", ACTIVITY, None);
    assert_eq!((census.at_capacity, census.eligible), (1, 1));
    s.dispatcher
        .cancel_acknowledged(worker.id, task.task_id)
        .expect("acknowledged");
    assert_eq!(s.eligibility(&worker), Eligibility::Eligible);
    assert_eq!(
        s.dispatcher.cancel_acknowledged(worker.id, task.task_id),
        Err(CompletionRefused::UnknownTask { task: task.task_id })
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_sends_a_cancel_and_the_slot_is_freed_when_the_worker_leaves() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(5)));
    let task = worker.task().await;
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::DeadlineExceeded
        }]
    );
    assert_eq!(
        s.dispatcher.pending_tasks(),
        1,
        "held until the worker lets go"
    );
    worker.leave();
    assert_eq!(s.dispatcher.pending_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn cancelling_what_a_worker_holds_ends_only_its_dispatches() {
    let s = setup();
    let mut drained = s.worker(2).await;
    let mut other = s.worker(2).await;
    let mut running: HashMap<String, JoinHandle<ActivityOutcome>> = (0..4)
        .map(|i| {
            let input = format!("d{i}");
            (
                input.clone(),
                s.spawn(request(&input, Duration::from_secs(30))),
            )
        })
        .collect();
    let held = [drained.task().await, drained.task().await];
    let kept = [other.task().await, other.task().await];
    // Control: a worker holding nothing has nothing cancelled.
    assert_eq!(
        s.dispatcher
            .cancel_held_by(WorkerId::from_raw(u64::MAX), CancelReason::Requested),
        0
    );

    assert_eq!(
        s.dispatcher
            .cancel_held_by(drained.id, CancelReason::Requested),
        2
    );
    let cancelled: BTreeSet<TaskId> = drained
        .sent()
        .into_iter()
        .map(|message| match message {
            WorkerMessage::Cancel { task_id, reason } => {
                assert_eq!(reason, CancelReason::Requested);
                task_id
            }
            other => panic!("only cancels were expected, got {other:?}"),
        })
        .collect();
    assert_eq!(cancelled, held.iter().map(|t| t.task_id).collect());
    for task in &held {
        let input = String::from_utf8(task.input.to_vec()).expect("utf-8 input");
        let handle = running.remove(&input).expect("a dispatch per input");
        assert_eq!(handle.await.expect("joined"), ActivityOutcome::Cancelled);
    }
    assert!(other.sent().is_empty(), "the other worker is not touched");
    assert_eq!(
        s.dispatcher.pending_tasks(),
        4,
        "slots held until the workers let go"
    );
    for task in &kept {
        let input = String::from_utf8(task.input.to_vec()).expect("utf-8 input");
        s.dispatcher
            .complete(other.id, task.task_id, success(&input))
            .expect("pending");
        let handle = running.remove(&input).expect("a dispatch per input");
        assert_eq!(handle.await.expect("joined"), completed(&input));
    }
    assert_eq!(
        s.dispatcher
            .cancel_held_by(drained.id, CancelReason::Requested),
        0,
        "already cancelled"
    );
}

#[tokio::test(start_paused = true)]
async fn an_acknowledgement_for_a_task_nobody_cancelled_changes_nothing() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = worker.task().await;
    assert!(
        s.dispatcher
            .cancel_acknowledged(worker.id, task.task_id)
            .is_err()
    );
    assert_eq!(s.in_flight(&worker), 1);
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn cancel_reaches_a_parked_dispatch_and_refuses_unknown_or_foreign_ids() {
    let s = setup();
    let running = s.spawn(with_id(request("x", Duration::from_secs(30)), "job-2"));
    s.parked(1).await;
    assert!(matches!(
        s.dispatcher.cancel(&caller(), NS, "job-unknown"),
        Err(CancelError::NotFound { .. })
    ));
    let outsider = CallerIdentity::granted("outsider", ["elsewhere"]);
    assert!(matches!(
        s.dispatcher.cancel(&outsider, NS, "job-2"),
        Err(CancelError::NamespaceNotGranted { .. })
    ));
    assert!(!running.is_finished());
    s.dispatcher.cancel(&caller(), NS, "job-2").expect("parked");
    assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropping_its_dispatch_cancels_the_task_on_the_worker() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = worker.task().await;
    running.abort();
    assert!(running.await.is_err());
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::CallerGone
        }]
    );
    assert_eq!(s.in_flight(&worker), 1, "held until acknowledged");
}

#[tokio::test(start_paused = true)]
async fn an_activity_id_is_unique_while_in_flight_and_free_again_after() {
    let s = setup();
    let running = s.spawn(with_id(request("x", Duration::from_secs(2)), "job-3"));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher
            .dispatch(
                &caller(),
                with_id(request("y", Duration::from_secs(2)), "job-3")
            )
            .await,
        Err(DispatchError::DuplicateActivityId {
            namespace: NS.to_owned(),
            activity_id: "job-3".to_owned()
        })
    );
    let mut elsewhere = with_id(request("z", Duration::from_secs(1)), "job-3");
    elsewhere.namespace = "other".to_owned();
    assert!(
        s.dispatcher.dispatch(&caller(), elsewhere).await.is_ok(),
        "ids are per namespace"
    );
    assert!(matches!(
        running.await.expect("joined"),
        ActivityOutcome::Unserved { .. }
    ));
    assert!(
        s.dispatcher
            .dispatch(
                &caller(),
                with_id(request("y", Duration::from_secs(1)), "job-3")
            )
            .await
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn dispatches_are_refused_up_front_for_empty_fields_and_ungranted_namespaces() {
    let s = setup();
    let mut empty = request("x", Duration::from_secs(1));
    empty.activity_type.clear();
    assert!(matches!(
        s.dispatcher.dispatch(&caller(), empty).await,
        Err(DispatchError::Invalid {
            field: "activity_type",
            ..
        })
    ));
    let long = with_id(request("x", Duration::from_secs(1)), &"i".repeat(256));
    assert!(matches!(
        s.dispatcher.dispatch(&caller(), long).await,
        Err(DispatchError::Invalid {
            field: "activity_id",
            ..
        })
    ));
    let outsider = CallerIdentity::granted("outsider", ["elsewhere"]);
    assert!(matches!(
        s.dispatcher
            .dispatch(&outsider, request("x", Duration::from_secs(1)))
            .await,
        Err(DispatchError::NamespaceNotGranted { .. })
    ));
    // Control: the longest allowed id is accepted.
    let longest = with_id(request("x", Duration::from_millis(1)), &"i".repeat(255));
    assert!(s.dispatcher.dispatch(&caller(), longest).await.is_ok());
}

// Rule 7: the in-flight count follows tracking and completion; a task tracked twice counts once.

#[tokio::test(start_paused = true)]
async fn the_in_flight_count_rises_on_tracking_and_falls_on_completion() {
    let s = setup();
    let mut worker = s.worker(2).await;
    assert_eq!(s.in_flight(&worker), 0);
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = worker.task().await;
    assert_eq!(s.in_flight(&worker), 1);
    assert_eq!(s.dispatcher.pending_tasks(), 1);
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("accepted");
    assert_eq!(s.in_flight(&worker), 0);
    assert_eq!(s.dispatcher.pending_tasks(), 0);
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_free_before_the_caller_hears_back() {
    // A producer dispatching one after another to a worker of capacity 1 must never find the
    // worker still full from the previous task: one selection per dispatch, no parking.
    const ROUNDS: u64 = 300;
    let s = setup();
    let mut worker = s.worker(1).await;
    let dispatcher = s.dispatcher.clone();
    let id = worker.id;
    let responder = tokio::spawn(async move {
        while let Some(message) = worker.rx.recv().await {
            if let WorkerMessage::Task(task) = message {
                let _ = dispatcher.complete(id, task.task_id, TaskResult::Success(task.input));
            }
        }
    });
    for round in 0..ROUNDS {
        let outcome = s
            .dispatcher
            .dispatch(&caller(), request("x", Duration::from_secs(10)))
            .await
            .expect("accepted");
        assert_eq!(outcome, completed("x"), "round {round}");
    }
    assert_eq!(s.dispatcher.selections(), ROUNDS);
    assert_eq!(s.dispatcher.unserved_warnings(), 0);
    responder.abort();
}

#[tokio::test(start_paused = true)]
async fn a_task_tracked_twice_holds_one_slot() {
    let s = setup();
    let worker = s.worker(4).await;
    let reserve = || {
        s.registry
            .select_and_reserve(NS, "", ACTIVITY, None)
            .map(|(_, reservation)| reservation)
            .expect("a free slot")
    };
    let mut table = TaskTable::default();
    let task = TaskId::from_raw(7);
    let pending = |reservation| PendingTask {
        delivery: Arc::clone(&worker.leg) as Arc<dyn WorkerDelivery>,
        reservation,
        signal: None,
    };
    assert!(table.insert(task, pending(reserve())).is_none());
    assert_eq!(s.in_flight(&worker), 1);
    let replaced = table.insert(task, pending(reserve()));
    assert!(replaced.is_some(), "the first entry is handed back");
    drop(replaced);
    assert_eq!(s.in_flight(&worker), 1, "one task, one slot");
    assert_eq!(table.len(), 1);
    assert_eq!(table.worker_lost(worker.id).len(), 1);
    assert_eq!(s.in_flight(&worker), 0);
}

// Drain and shutdown.

#[tokio::test(start_paused = true)]
async fn a_drained_worker_gets_no_new_work_and_finishes_what_it_holds() {
    let s = setup();
    let mut worker = s.worker(2).await;
    let running = s.spawn(request("held", Duration::from_secs(30)));
    let task = worker.task().await;
    assert!(s.registry.drain_worker(worker.id));
    assert_eq!(worker.sent(), vec![WorkerMessage::Drain]);
    let refused = s
        .dispatcher
        .dispatch(&caller(), request("new", Duration::from_secs(1)))
        .await
        .expect("accepted");
    assert!(
        matches!(
            refused,
            ActivityOutcome::Unserved {
                reason: UnservedReason::Draining,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(worker.sent().is_empty(), "no task after the drain");
    s.dispatcher
        .complete(worker.id, task.task_id, success("held"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("held"));
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_new_work_lets_in_flight_finish_and_ends_parked_ones() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let in_flight = s.spawn(request("finish", Duration::from_secs(60)));
    let task = worker.task().await;
    let mut elsewhere = request("parked", Duration::from_secs(60));
    elsewhere.activity_type = "unserved".to_owned();
    let parked = s.spawn(elsewhere);
    s.parked(1).await;

    let dispatcher = s.dispatcher.clone();
    let shutdown = tokio::spawn(async move { dispatcher.shutdown(Duration::from_secs(10)).await });
    assert_eq!(parked.await.expect("joined"), ActivityOutcome::ShuttingDown);
    assert_eq!(worker.sent(), vec![WorkerMessage::ShuttingDown]);
    assert_eq!(
        s.dispatcher
            .dispatch(&caller(), request("late", Duration::from_secs(1)))
            .await,
        Ok(ActivityOutcome::ShuttingDown)
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    s.dispatcher
        .complete(worker.id, task.task_id, success("finish"))
        .expect("accepted within grace");
    assert_eq!(in_flight.await.expect("joined"), completed("finish"));
    let started = Instant::now();
    shutdown.await.expect("joined");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "shutdown returns once nothing is in flight"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_what_is_still_running_after_the_grace_with_one_outcome_each() {
    let s = setup();
    let mut worker = s.worker(3).await;
    let running: Vec<_> = (0..3)
        .map(|i| s.spawn(request(&format!("r{i}"), Duration::from_secs(60))))
        .collect();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(worker.task().await);
    }
    let dispatcher = s.dispatcher.clone();
    let shutdown = tokio::spawn(async move { dispatcher.shutdown(Duration::from_secs(5)).await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // One finishes within the grace; two never answer.
    s.dispatcher
        .complete(worker.id, tasks[0].task_id, success("r0"))
        .expect("accepted");
    shutdown.await.expect("joined");
    let mut outcomes = Vec::new();
    for running in running {
        outcomes.push(running.await.expect("joined"));
    }
    assert_eq!(
        outcomes,
        vec![
            completed("r0"),
            ActivityOutcome::ShuttingDown,
            ActivityOutcome::ShuttingDown
        ]
    );
    let cancels: Vec<_> = worker
        .sent()
        .into_iter()
        .filter(|m| {
            matches!(
                m,
                WorkerMessage::Cancel {
                    reason: CancelReason::ShuttingDown,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(
        cancels.len(),
        2,
        "the unfinished tasks are cancelled on the worker"
    );
}
