//! The prober driver against scripted workers, on paused time with the default settings
//! (ping every 2 s, missed after 5 s, 2 probation pings, 3 misses, 30 s of silence).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use crate::delivery::{DeliveryError, TransportName, WorkerDelivery};
use crate::eligibility::{DispatchExclusion, Eligibility};
use crate::handle::{Core, CoreConfig};
use crate::outcome::{ActivityOutcome, ActivityRequest, TaskResult};
use crate::registration::{CallerIdentity, Registration};
use crate::registry::RegistrationToken;

struct Leg(mpsc::Sender<WorkerMessage>);

impl WorkerDelivery for Leg {
    fn transport(&self) -> TransportName {
        TransportName::from_static("test")
    }

    fn is_connected(&self) -> bool {
        !self.0.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        true
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        self.0.try_send(message).map_err(|_| DeliveryError::Full)
    }
}

struct TestWorker {
    id: WorkerId,
    _token: RegistrationToken,
    rx: mpsc::Receiver<WorkerMessage>,
}

impl TestWorker {
    /// The next ping sent to this worker (other messages are skipped).
    async fn ping(&mut self) -> u64 {
        loop {
            match self.rx.recv().await {
                Some(WorkerMessage::Ping { seq }) => return seq,
                Some(_) => {}
                None => panic!("link closed"),
            }
        }
    }

    fn pending_pings(&mut self) -> usize {
        std::iter::from_fn(|| self.rx.try_recv().ok())
            .filter(|m| matches!(m, WorkerMessage::Ping { .. }))
            .count()
    }
}

async fn admit(registry: &Registry) -> TestWorker {
    let (tx, rx) = mpsc::channel(1024);
    let registration = Registration {
        namespaces: BTreeSet::from(["ns".to_owned()]),
        activity_types: BTreeSet::from(["work".to_owned()]),
        max_concurrency: Some(1),
        ..Registration::default()
    };
    let token = registry
        .admit(
            &CallerIdentity::trusted("w"),
            registration,
            Arc::new(Leg(tx)),
        )
        .await
        .expect("admitted");
    TestWorker {
        id: token.worker_id(),
        _token: token,
        rx,
    }
}

fn standing(registry: &Registry, worker: &TestWorker) -> Option<Eligibility> {
    registry.worker(worker.id).map(|w| w.eligibility)
}

/// A registry with opening probation and a running prober, as [`Core`] sets them up.
fn prober() -> (Registry, Liveness, tokio::task::JoinHandle<()>) {
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), LivenessConfig::default());
    let task = liveness.spawn();
    (registry, liveness, task)
}

/// Admits a worker and answers its probation pings.
async fn healthy(registry: &Registry, liveness: &Liveness) -> TestWorker {
    let mut worker = admit(registry).await;
    for _ in 0..2 {
        let seq = worker.ping().await;
        liveness.record_pong(worker.id, seq);
    }
    assert_eq!(standing(registry, &worker), Some(Eligibility::Eligible));
    worker
}

#[tokio::test(start_paused = true)]
async fn a_new_worker_is_on_probation_and_its_probation_pings_go_out_at_once() {
    let (registry, _liveness, _prober) = prober();
    let t0 = Instant::now();
    let mut worker = admit(&registry).await;
    assert_eq!(standing(&registry, &worker), Some(Eligibility::OnProbation));
    let first = worker.ping().await;
    let second = worker.ping().await;
    assert_ne!(first, second);
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "both sent back to back, no interval between"
    );
    assert_eq!(worker.pending_pings(), 0, "exactly the probation pings");
}

#[tokio::test(start_paused = true)]
async fn a_round_before_the_prober_reads_a_registration_keeps_its_probation() {
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), LivenessConfig::default());
    let worker = admit(&registry).await;
    // The prober has not seen the worker yet (its tracker is empty) when a round publishes.
    liveness.round();
    assert_eq!(standing(&registry, &worker), Some(Eligibility::OnProbation));
    liveness.admit(worker.id);
    let newcomer = admit(&registry).await;
    liveness.round();
    assert_eq!(
        standing(&registry, &newcomer),
        Some(Eligibility::OnProbation),
        "control: a worker newer than the tracker's newest keeps its probation too"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_is_eligible_after_its_probation_pings_are_answered() {
    let (registry, liveness, _prober) = prober();
    let mut worker = admit(&registry).await;
    let first = worker.ping().await;
    let second = worker.ping().await;
    liveness.record_pong(worker.id, first);
    assert_eq!(
        standing(&registry, &worker),
        Some(Eligibility::OnProbation),
        "one answer of two is not enough"
    );
    liveness.record_pong(worker.id, second);
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Eligible));
}

#[tokio::test(start_paused = true)]
async fn three_missed_pings_publish_reachability_lost() {
    let (registry, liveness, _prober) = prober();
    let t0 = Instant::now();
    let worker = healthy(&registry, &liveness).await;
    // Pings go out at 2, 4, 6 s and are missed at 7, 9, 11 s.
    tokio::time::sleep_until(t0 + Duration::from_millis(10_500)).await;
    assert_eq!(
        standing(&registry, &worker),
        Some(Eligibility::Eligible),
        "two misses are not three"
    );
    tokio::time::sleep_until(t0 + Duration::from_secs(12)).await;
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Unreachable));
    assert!(
        registry.is_registered(worker.id),
        "unreachable, not yet silent for 30 s"
    );
}

#[tokio::test(start_paused = true)]
async fn recovery_needs_a_full_probation_not_one_answer_among_misses() {
    let (registry, liveness, _prober) = prober();
    let mut worker = healthy(&registry, &liveness).await;
    let mut events = registry.subscribe_events();
    loop {
        if let Ok(WorkerEvent::Excluded {
            exclusion: DispatchExclusion::ReachabilityLost,
            ..
        }) = events.recv().await
        {
            break;
        }
    }
    worker.pending_pings();
    let p = worker.ping().await;
    liveness.record_pong(worker.id, p);
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Unreachable));
    let _skipped = worker.ping().await;
    let r = worker.ping().await;
    liveness.record_pong(worker.id, r);
    assert_eq!(
        standing(&registry, &worker),
        Some(Eligibility::Unreachable),
        "answer, miss, answer is not two in a row"
    );
    let s = worker.ping().await;
    liveness.record_pong(worker.id, s);
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Eligible));
}

#[tokio::test(start_paused = true)]
async fn verdicts_are_republished_whole_each_round_so_stale_exclusions_clear() {
    let (registry, liveness, _prober) = prober();
    let worker = healthy(&registry, &liveness).await;
    registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::ReachabilityLost,
    )]));
    assert_eq!(
        standing(&registry, &worker),
        Some(Eligibility::Unreachable),
        "control: the stale entry excludes it"
    );
    // One round (every second with these settings) later.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Eligible));
}

#[tokio::test(start_paused = true)]
async fn reconcile_tracks_missed_workers_and_forgets_departed_ones() {
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), LivenessConfig::default());
    // Not spawned: the test plays the events the prober would have missed.
    let mut tracked = admit(&registry).await;
    liveness.admit(tracked.id);
    for _ in 0..2 {
        let seq = tracked.ping().await;
        liveness.record_pong(tracked.id, seq);
    }
    let departed = admit(&registry).await;
    liveness.admit(departed.id);
    let departed_id = departed.id;
    drop(departed);
    let mut missed = admit(&registry).await;

    liveness.reconcile();
    assert_eq!(
        tracked.pending_pings(),
        0,
        "a tracked worker keeps its standing"
    );
    assert_eq!(standing(&registry, &tracked), Some(Eligibility::Eligible));
    assert_eq!(
        missed.pending_pings(),
        2,
        "a missed worker starts its probation"
    );
    let known: Vec<WorkerId> = liveness.tracker().workers().collect();
    assert!(known.contains(&missed.id));
    assert!(!known.contains(&departed_id));
}

#[tokio::test(start_paused = true)]
async fn silence_for_the_heartbeat_window_deregisters_and_its_task_moves() {
    let core = Core::start(Registry::builder(), CoreConfig::default());
    let t0 = Instant::now();
    let mut silent = admit(core.registry()).await;
    for _ in 0..2 {
        let seq = silent.ping().await;
        core.record_pong(silent.id, seq);
    }
    let producer = CallerIdentity::trusted("p");
    let request = ActivityRequest {
        namespace: "ns".to_owned(),
        task_queue: String::new(),
        activity_type: "work".to_owned(),
        node: None,
        input: Bytes::from_static(b"x"),
        activity_id: None,
        timeout: Duration::from_secs(120),
    };
    let dispatcher = core.dispatcher().clone();
    let running =
        tokio::spawn(async move { dispatcher.dispatch(&producer, request).await.expect("ok") });
    loop {
        if let Some(WorkerMessage::Task(_)) = silent.rx.recv().await {
            break;
        }
    }
    // A second worker answers everything; the first says nothing from now on.
    let mut answering = admit(core.registry()).await;
    let mut events = core.registry().subscribe_events();
    let responder = {
        let core = core.clone();
        tokio::spawn(async move {
            while let Some(message) = answering.rx.recv().await {
                match message {
                    WorkerMessage::Ping { seq } => core.record_pong(answering.id, seq),
                    WorkerMessage::Task(task) => {
                        assert_eq!(task.attempt, 2);
                        let _ = core.complete(
                            answering.id,
                            task.task_id,
                            TaskResult::Success(task.input),
                        );
                    }
                    _ => {}
                }
            }
        })
    };
    let outcome = running.await.expect("joined");
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"x"))
    );
    let elapsed = t0.elapsed();
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(32)).contains(&elapsed),
        "moved when the heartbeat window ran out, after {elapsed:?}"
    );
    let mut reason = None;
    while let Ok(event) = events.try_recv() {
        if let WorkerEvent::Disconnected { worker, reason: r } = event {
            assert_eq!(worker, silent.id, "only the silent worker leaves");
            reason = Some(r);
        }
    }
    assert_eq!(reason, Some(DisconnectReason::Timeout));
    assert_eq!(core.registry().len(), 1);
    responder.abort();
}

#[tokio::test(start_paused = true)]
async fn pings_arrive_every_ping_interval_whatever_the_round_granularity() {
    // A ping timeout under the interval makes the prober's ticker (half the timeout,
    // 750 ms here) not divide the 2 s interval: pings must still come every 2 s.
    let config = LivenessConfig {
        ping_interval: Duration::from_secs(2),
        ping_timeout: Duration::from_millis(1500),
        ..LivenessConfig::default()
    };
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), config);
    let _prober = liveness.spawn();
    let mut worker = healthy(&registry, &liveness).await;
    let mut last = Instant::now();
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let seq = worker.ping().await;
        liveness.record_pong(worker.id, seq);
        let now = Instant::now();
        gaps.push(now - last);
        last = now;
    }
    assert_eq!(gaps, vec![Duration::from_secs(2); 5]);
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Eligible));
}

/// Admits through the gate without announcing, as a transport whose acknowledgement is not
/// on the wire yet.
async fn admit_unannounced(registry: &Registry) -> TestWorker {
    let (tx, rx) = mpsc::channel(1024);
    let registration = Registration {
        namespaces: BTreeSet::from(["ns".to_owned()]),
        activity_types: BTreeSet::from(["work".to_owned()]),
        max_concurrency: Some(1),
        ..Registration::default()
    };
    let token = registry
        .admit_unannounced(
            &CallerIdentity::trusted("w"),
            registration,
            Arc::new(Leg(tx)),
        )
        .await
        .expect("admitted");
    TestWorker {
        id: token.worker_id(),
        _token: token,
        rx,
    }
}

#[tokio::test(start_paused = true)]
async fn an_unannounced_worker_is_not_pinged_nor_connected_until_announced() {
    let (registry, liveness, _prober) = prober();
    let mut events = registry.subscribe_events();
    let mut worker = admit_unannounced(&registry).await;
    assert!(registry.is_registered(worker.id), "registered and listed");
    // Several prober rounds pass, and a reconcile that offers every announced worker.
    tokio::time::sleep(Duration::from_secs(5)).await;
    liveness.reconcile();
    assert_eq!(worker.pending_pings(), 0, "no ping before the announcement");
    assert!(
        std::iter::from_fn(|| events.try_recv().ok())
            .all(|event| !matches!(event, WorkerEvent::Connected { .. })),
        "no Connected before the announcement"
    );
    assert!(
        registry
            .select_and_reserve("ns", "", "work", None)
            .is_none(),
        "not dispatched to before the announcement"
    );

    // Control: announcing starts both.
    assert!(worker._token.announce());
    assert!(!worker._token.announce(), "announced once");
    assert!(matches!(
        events.recv().await,
        Ok(WorkerEvent::Connected { worker: id, .. }) if id == worker.id
    ));
    for _ in 0..2 {
        let seq = worker.ping().await;
        liveness.record_pong(worker.id, seq);
    }
    assert_eq!(standing(&registry, &worker), Some(Eligibility::Eligible));
}

#[tokio::test(start_paused = true)]
async fn an_unannounced_worker_keeps_its_probation_when_a_newer_one_is_proven() {
    let (registry, liveness, _prober) = prober();
    let mut waiting = admit_unannounced(&registry).await;
    let newer = healthy(&registry, &liveness).await;
    assert!(newer.id > waiting.id);
    assert!(waiting._token.announce());
    assert_eq!(
        standing(&registry, &waiting),
        Some(Eligibility::OnProbation),
        "a verdict published while it waited did not clear its probation"
    );
    for _ in 0..2 {
        let seq = waiting.ping().await;
        liveness.record_pong(waiting.id, seq);
    }
    assert_eq!(standing(&registry, &waiting), Some(Eligibility::Eligible));
}

#[tokio::test(start_paused = true)]
async fn a_silent_worker_departs_with_the_timeout_reason() {
    let (registry, liveness, _prober) = prober();
    let worker = healthy(&registry, &liveness).await;
    let departure = worker._token.departure();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        departure.reason(),
        None,
        "control: 10 s of silence is not 30"
    );
    let reason = tokio::time::timeout(Duration::from_secs(60), departure.departed()).await;
    assert_eq!(reason.ok(), Some(DisconnectReason::Timeout));
    assert!(!registry.is_registered(worker.id));
}

#[tokio::test(start_paused = true)]
async fn pings_falling_due_within_the_round_gap_share_a_round() {
    let (registry, liveness, _prober) = prober();
    // 40 proven workers admitted 1 ms apart: their regular pings fall due 1 ms apart.
    let mut workers = Vec::new();
    for _ in 0..40 {
        workers.push(healthy(&registry, &liveness).await);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first_due = Instant::now() - Duration::from_millis(40) + Duration::from_secs(2);
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (n, mut worker) in workers.into_iter().enumerate() {
        let arrivals = Arc::clone(&arrivals);
        let liveness = liveness.clone();
        let due = first_due + Duration::from_millis(n as u64);
        tasks.push(tokio::spawn(async move {
            let seq = worker.ping().await;
            let at = Instant::now();
            liveness.record_pong(worker.id, seq);
            arrivals.lock().expect("not poisoned").push((due, at));
            worker
        }));
    }
    for task in tasks {
        task.await.expect("joined");
    }
    let arrivals = arrivals.lock().expect("not poisoned").clone();
    for (due, at) in &arrivals {
        assert!(*at >= *due, "never before its due time");
        assert!(
            *at - *due <= MIN_ROUND_GAP,
            "at most the round gap late: {:?}",
            *at - *due
        );
    }
    let rounds: BTreeSet<Instant> = arrivals.iter().map(|(_, at)| *at).collect();
    assert!(
        rounds.len() <= 40 / 5 + 2,
        "40 pings due 1 ms apart went out in {} rounds",
        rounds.len()
    );
    assert!(
        rounds.len() > 1,
        "control: pings 40 ms apart do not all wait for one round"
    );
}
