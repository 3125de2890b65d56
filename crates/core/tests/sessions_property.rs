//! 10,000 dispatches over 8 session workers whose links black out at random, some blackouts
//! shorter than the reconnect grace and some longer, on paused time with a seeded schedule.
//!
//! Each worker is simulated on core's public API only: a [`WorkerDelivery`] over a bounded
//! channel, tasks run for a random time and reported with `Core::complete`. A blackout drops
//! the registration token (the connection is lost) and everything sent meanwhile; the worker
//! keeps running its tasks and keeps their results as unacknowledged. Back within the grace it
//! resumes with `Core::resume`, lets go of what is not held and re-sends held results; after a
//! longer blackout its resume is refused and it registers afresh, abandoning its tasks.
//!
//! Checked: every dispatch ends exactly once, with its own output; no worker runs more than
//! its capacity at once; a task runs twice only when a worker abandoned it after a long
//! blackout; with only short blackouts nothing runs twice, while the same schedule with no
//! session (grace 0) runs tasks twice.
//!
//! `SESSIONS_SEED=<n>` replays one seed; the seed of every run is printed.
// Test scaffolding asserts and unwraps outside `#[test]` functions.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, CompletionRefused, Core, CoreConfig,
    DeliveryError, Registration, RegistrationToken, Registry, ResumeRequest, SessionGrant, TaskId,
    TaskResult, TransportName, WorkerDelivery, WorkerId, WorkerMessage,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
use tokio::time::Instant;

const WORKERS: usize = 8;
const CAPACITY: u32 = 4;
/// The session workers' reconnect grace; also the yardstick for short and long blackouts in
/// the runs without a session.
const GRACE: Duration = Duration::from_secs(2);
/// Dispatches in flight at once (more than the 32 slots, so some always wait).
const IN_FLIGHT: usize = 64;
const DISPATCH_TIMEOUT: Duration = Duration::from_secs(600);
/// One dispatch in [`SHORT_EVERY`] asks for this timeout, shorter than a long blackout, so some
/// end `TimedOut` while their worker is suspended and its result comes back late.
const SHORT_TIMEOUT: Duration = Duration::from_millis(1_500);
const SHORT_EVERY: u64 = 20;
/// Wall-clock bound on one run, whatever happens.
const WALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);
/// A task sent this close to a blackout is lost with the link.
const ON_THE_WIRE: Duration = Duration::from_millis(30);
const DEFAULT_SEEDS: [u64; 2] = [0x5e55_1035, 0x000b_1ac0];

/// One run's shape.
#[derive(Clone, Copy, Debug)]
struct Plan {
    seed: u64,
    dispatches: usize,
    /// The grace registrations ask for; zero = no session.
    grace: Duration,
    /// Whether some blackouts outlast the grace.
    long_blackouts: bool,
}

/// What the workers saw, summed over all of them.
#[derive(Debug, Default)]
struct Tally {
    /// Per dispatch: how many times a worker started running it.
    executions: Vec<u32>,
    /// Dispatches a worker let go of after running them (refused resume or no session).
    abandoned: HashSet<u64>,
    short_blackouts: usize,
    long_blackouts: usize,
    resumes: usize,
    refused_resumes: usize,
    refused_after_short: usize,
    fresh_registrations: usize,
    resent_results: usize,
    redeliveries: usize,
    /// Tasks sent to a worker that its blackout swallowed.
    lost_on_the_wire: usize,
    results_refused: usize,
    /// Results refused as late (their dispatch ended while the worker was away).
    results_late: usize,
    peak_running: usize,
    overcommits: usize,
}

/// The simulated connection's leg: a bounded queue whose far end the worker reads.
struct Leg(mpsc::Sender<WorkerMessage>);

impl WorkerDelivery for Leg {
    fn transport(&self) -> TransportName {
        TransportName::from_static("sim")
    }
    fn is_connected(&self) -> bool {
        !self.0.is_closed()
    }
    fn registration_carries_capacity(&self) -> bool {
        true
    }
    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        self.0.try_send(message).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })
    }
}

fn connection() -> (Arc<dyn WorkerDelivery>, mpsc::Receiver<WorkerMessage>) {
    let (tx, rx) = mpsc::channel(128);
    (Arc::new(Leg(tx)), rx)
}

struct Running {
    dispatch: u64,
    input: Bytes,
    handle: AbortHandle,
}

/// One simulated worker process, across its connections and registrations.
struct Sim {
    core: Core,
    plan: Plan,
    rng: StdRng,
    tally: Arc<Mutex<Tally>>,
    running: HashMap<TaskId, Running>,
    /// Results sent (or, during a blackout, written into the void) and not yet acknowledged.
    unacked: HashMap<TaskId, (u64, Bytes)>,
    finished_tx: mpsc::UnboundedSender<TaskId>,
    finished_rx: mpsc::UnboundedReceiver<TaskId>,
}

fn caller() -> CallerIdentity {
    CallerIdentity::trusted("sim-worker")
}

fn dispatch_of(input: &Bytes) -> u64 {
    std::str::from_utf8(input)
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("inputs are dispatch numbers")
}

impl Sim {
    async fn register(&mut self) -> (WorkerId, RegistrationToken, mpsc::Receiver<WorkerMessage>) {
        let registration = Registration {
            namespaces: ["sessions".to_owned()].into(),
            activity_types: ["echo".to_owned()].into(),
            max_concurrency: Some(CAPACITY),
            reconnect_grace: self.plan.grace,
            ..Registration::default()
        };
        let (leg, rx) = connection();
        let token = self
            .core
            .registry()
            .admit(&caller(), registration, leg)
            .await
            .expect("admitted");
        self.tally.lock().unwrap().fresh_registrations += 1;
        (token.worker_id(), token, rx)
    }

    fn start(&mut self, task: switchyard_core::ActivityTask) {
        let dispatch = dispatch_of(&task.input);
        let run_for = Duration::from_millis(self.rng.random_range(10..=300));
        let finished = self.finished_tx.clone();
        let task_id = task.task_id;
        let handle = tokio::spawn(async move {
            tokio::time::sleep(run_for).await;
            let _ = finished.send(task_id);
        })
        .abort_handle();
        self.running.insert(
            task_id,
            Running {
                dispatch,
                input: task.input,
                handle,
            },
        );
        let mut tally = self.tally.lock().unwrap();
        tally.executions[dispatch as usize] += 1;
        if task.attempt > 1 {
            tally.redeliveries += 1;
        }
        tally.peak_running = tally.peak_running.max(self.running.len());
        if self.running.len() > CAPACITY as usize {
            tally.overcommits += 1;
        }
    }

    fn report(&mut self, worker: WorkerId, task: TaskId, input: Bytes) {
        match self.core.complete(worker, task, TaskResult::Success(input)) {
            Ok(()) => {}
            Err(CompletionRefused::Late { .. }) => self.tally.lock().unwrap().results_late += 1,
            Err(_) => self.tally.lock().unwrap().results_refused += 1,
        }
    }

    /// Serves the connection until `until`: runs tasks, answers pings and cancels, reports
    /// results, and has them acknowledged every 20 ms.
    async fn connected(
        &mut self,
        worker: WorkerId,
        rx: &mut mpsc::Receiver<WorkerMessage>,
        until: Instant,
    ) {
        let mut acks = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                message = rx.recv() => match message {
                    // A task on the wire when the link goes down never arrives.
                    Some(WorkerMessage::Task(_)) if until - Instant::now() < ON_THE_WIRE => {
                        self.tally.lock().unwrap().lost_on_the_wire += 1;
                    }
                    Some(WorkerMessage::Task(task)) => self.start(task),
                    Some(WorkerMessage::Ping { seq }) => self.core.record_pong(worker, seq),
                    Some(WorkerMessage::Cancel { task_id, .. }) => {
                        if let Some(running) = self.running.remove(&task_id) {
                            running.handle.abort();
                            let _ = self.core.cancel_acknowledged(worker, task_id);
                        }
                    }
                    Some(_) => {}
                    None => panic!("core closed a live connection"),
                },
                Some(task) = self.finished_rx.recv() => {
                    if let Some(running) = self.running.remove(&task) {
                        self.report(worker, task, running.input.clone());
                        self.unacked.insert(task, (running.dispatch, running.input));
                    }
                },
                _ = acks.tick() => self.unacked.clear(),
                () = tokio::time::sleep_until(until) => return,
            }
        }
    }

    /// The link is down until `until`: tasks keep running, their results go nowhere.
    async fn blackout(&mut self, until: Instant) {
        loop {
            tokio::select! {
                Some(task) = self.finished_rx.recv() => {
                    if let Some(running) = self.running.remove(&task) {
                        self.unacked.insert(task, (running.dispatch, running.input));
                    }
                },
                () = tokio::time::sleep_until(until) => return,
            }
        }
    }

    /// Lets go of everything: running tasks stop, unacknowledged results are dropped.
    fn abandon(&mut self) {
        let mut tally = self.tally.lock().unwrap();
        for (_, running) in self.running.drain() {
            running.handle.abort();
            tally.abandoned.insert(running.dispatch);
        }
        for (_, (dispatch, _)) in self.unacked.drain() {
            tally.abandoned.insert(dispatch);
        }
    }

    /// Tries to resume `grant`'s session; on success re-sends held results and lets go of
    /// the rest, returning the new connection.
    async fn resume(
        &mut self,
        grant: &SessionGrant,
        short: bool,
    ) -> Option<(RegistrationToken, mpsc::Receiver<WorkerMessage>)> {
        let request = ResumeRequest {
            session_id: grant.session_id,
            secret: grant.secret.as_bytes().to_vec(),
            running: self.running.keys().copied().collect(),
            unacked: self.unacked.keys().copied().collect(),
        };
        let (leg, rx) = connection();
        let resumed = match self.core.resume(&caller(), request, leg).await {
            Ok(resumed) => resumed,
            Err(_) => {
                let mut tally = self.tally.lock().unwrap();
                tally.refused_resumes += 1;
                if short {
                    tally.refused_after_short += 1;
                }
                return None;
            }
        };
        assert_eq!(resumed.token.worker_id(), grant.session_id, "same worker");
        assert!(resumed.token.announce());
        let held: HashSet<TaskId> = resumed.held.iter().copied().collect();
        self.running.retain(|task, running| {
            let keep = held.contains(task);
            if !keep {
                running.handle.abort();
            }
            keep
        });
        let unacked: Vec<(TaskId, (u64, Bytes))> = self.unacked.drain().collect();
        let mut resent = 0;
        for (task, (dispatch, input)) in unacked {
            if held.contains(&task) {
                self.report(grant.session_id, task, input.clone());
                self.unacked.insert(task, (dispatch, input));
                resent += 1;
            }
        }
        let mut tally = self.tally.lock().unwrap();
        tally.resumes += 1;
        tally.resent_results += resent;
        Some((resumed.token, rx))
    }

    /// Connects, serves, blacks out and comes back, for ever (the test aborts it).
    async fn run(mut self) {
        let (mut worker, mut token, mut rx) = self.register().await;
        loop {
            let uptime = Duration::from_millis(self.rng.random_range(1_000..=5_000));
            self.connected(worker, &mut rx, Instant::now() + uptime)
                .await;

            let long = self.plan.long_blackouts && self.rng.random_bool(0.3);
            let factor = if long {
                self.rng.random_range(1.5..3.0)
            } else {
                self.rng.random_range(0.1..0.6)
            };
            let grant = token.session().cloned();
            // The connection is lost: whatever was on its way to the worker with it.
            drop(rx);
            drop(token);
            {
                let mut tally = self.tally.lock().unwrap();
                if long {
                    tally.long_blackouts += 1;
                    // Marked now, not at the fresh registration: the run may end first.
                    let held = self.running.values().map(|running| running.dispatch);
                    let sent = self.unacked.values().map(|(dispatch, _)| *dispatch);
                    let at_risk: Vec<u64> = held.chain(sent).collect();
                    tally.abandoned.extend(at_risk);
                } else {
                    tally.short_blackouts += 1;
                }
            }
            self.blackout(Instant::now() + GRACE.mul_f64(factor)).await;

            let resumed = match &grant {
                Some(grant) => self.resume(grant, !long).await,
                None => None,
            };
            (worker, token, rx) = match resumed {
                Some((new_token, new_rx)) => (worker, new_token, new_rx),
                None => {
                    self.abandon();
                    self.register().await
                }
            };
        }
    }
}

/// What one run came to.
#[derive(Debug, Default)]
struct Report {
    completed: usize,
    transport_lost: usize,
    timed_out: usize,
    late: usize,
    duplicates: usize,
    duplicates_not_abandoned: Vec<u64>,
}

async fn run(plan: Plan) -> (Report, Tally) {
    let started = std::time::Instant::now();
    let virtual_start = Instant::now();
    let core = Core::start(Registry::builder(), CoreConfig::default());
    let tally = Arc::new(Mutex::new(Tally {
        executions: vec![0; plan.dispatches],
        ..Tally::default()
    }));
    let mut seeds = StdRng::seed_from_u64(plan.seed);
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (finished_tx, finished_rx) = mpsc::unbounded_channel();
            let sim = Sim {
                core: core.clone(),
                plan,
                rng: StdRng::seed_from_u64(seeds.random()),
                tally: Arc::clone(&tally),
                running: HashMap::new(),
                unacked: HashMap::new(),
                finished_tx,
                finished_rx,
            };
            tokio::spawn(sim.run())
        })
        .collect();

    let (outcomes, mut collected) = mpsc::channel(IN_FLIGHT);
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let producer = {
        let core = core.clone();
        tokio::spawn(async move {
            for id in 0..plan.dispatches as u64 {
                let permit = Arc::clone(&permits).acquire_owned().await.expect("open");
                let core = core.clone();
                let outcomes = outcomes.clone();
                tokio::spawn(async move {
                    let request = ActivityRequest {
                        namespace: "sessions".to_owned(),
                        task_queue: String::new(),
                        activity_type: "echo".to_owned(),
                        node: None,
                        input: Bytes::from(id.to_string()),
                        activity_id: None,
                        timeout: if id % SHORT_EVERY == 0 {
                            SHORT_TIMEOUT
                        } else {
                            DISPATCH_TIMEOUT
                        },
                    };
                    let outcome = core
                        .dispatcher()
                        .dispatch(&CallerIdentity::trusted("producer"), request)
                        .await
                        .expect("accepted");
                    outcomes.send((id, outcome)).await.expect("collector alive");
                    drop(permit);
                });
            }
        })
    };

    let mut ended = vec![0_u32; plan.dispatches];
    let mut report = Report::default();
    for _ in 0..plan.dispatches {
        assert!(
            started.elapsed() < WALL_LIMIT,
            "seed {:#x}: run exceeded {WALL_LIMIT:?} of wall time",
            plan.seed
        );
        let (id, outcome) = tokio::time::timeout(DISPATCH_TIMEOUT * 2, collected.recv())
            .await
            .unwrap_or_else(|_| panic!("seed {:#x}: outcomes stopped coming", plan.seed))
            .expect("producer alive");
        ended[id as usize] += 1;
        match outcome {
            ActivityOutcome::Completed(output) => {
                assert_eq!(output, Bytes::from(id.to_string()), "its own output");
                report.completed += 1;
            }
            ActivityOutcome::TransportLost { .. } => report.transport_lost += 1,
            ActivityOutcome::TimedOut => {
                assert_eq!(
                    id % SHORT_EVERY,
                    0,
                    "dispatch {id} timed out on a long timeout"
                );
                report.timed_out += 1;
            }
            other => panic!("seed {:#x}: dispatch {id} ended {other:?}", plan.seed),
        }
    }
    producer.await.expect("producer finished");
    for worker in &workers {
        worker.abort();
    }
    assert!(
        collected.try_recv().is_err(),
        "no dispatch resolves a second time"
    );
    assert!(
        ended.iter().all(|count| *count == 1),
        "seed {:#x}: every dispatch ends exactly once",
        plan.seed
    );
    let refused = core.dispatcher().refused();
    assert_eq!(
        (refused.unknown, refused.foreign),
        (0, 0),
        "seed {:#x}: no result for a task its worker did not hold",
        plan.seed
    );
    // The aborted workers may not have dropped their handles yet: take the figures out.
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    for (id, runs) in tally.executions.iter().enumerate() {
        if *runs > 1 {
            report.duplicates += 1;
            if !tally.abandoned.contains(&(id as u64)) {
                report.duplicates_not_abandoned.push(id as u64);
            }
        }
    }
    println!(
        "seed={:#x} grace={:?} dispatches={} blackouts short={} long={} resumes={} \
         refused_resumes={} fresh_registrations={} resent_results={} lost_on_the_wire={} \
         redeliveries={} duplicates={} outcomes completed={} transport_lost={} timed_out={} late_results={} peak_running={} \
         virtual={:?} wall={:?}",
        plan.seed,
        plan.grace,
        plan.dispatches,
        tally.short_blackouts,
        tally.long_blackouts,
        tally.resumes,
        tally.refused_resumes,
        tally.fresh_registrations,
        tally.resent_results,
        tally.lost_on_the_wire,
        tally.redeliveries,
        report.duplicates,
        report.completed,
        report.transport_lost,
        report.timed_out,
        tally.results_late,
        tally.peak_running,
        virtual_start.elapsed(),
        started.elapsed(),
    );
    assert_eq!(tally.overcommits, 0, "no worker ran more than its capacity");
    assert!(tally.peak_running <= CAPACITY as usize);
    assert_eq!(
        tally.results_refused, 0,
        "every result a worker sent was taken or refused as late"
    );
    assert_eq!(refused.late, tally.results_late as u64);
    report.late = tally.results_late;
    (report, tally)
}

fn seeds() -> Vec<u64> {
    match std::env::var("SESSIONS_SEED") {
        Ok(seed) => vec![
            match seed.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => seed.parse(),
            }
            .expect("SESSIONS_SEED is a number (decimal or 0x hex)"),
        ],
        Err(_) => DEFAULT_SEEDS.to_vec(),
    }
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_dispatches_through_blackouts_end_once_and_run_twice_only_after_long_ones() {
    for seed in seeds() {
        let (report, tally) = run(Plan {
            seed,
            dispatches: 10_000,
            grace: GRACE,
            long_blackouts: true,
        })
        .await;
        assert_eq!(
            report.duplicates_not_abandoned,
            Vec::<u64>::new(),
            "seed {seed:#x}: tasks ran twice without a long blackout"
        );
        assert_eq!(
            tally.refused_after_short, 0,
            "seed {seed:#x}: a resume within the grace was refused"
        );
        assert!(
            tally.short_blackouts > 0 && tally.long_blackouts > 0,
            "seed {seed:#x}: control: both kinds of blackout happened"
        );
        assert!(tally.resumes > 0, "control: workers resumed");
        assert!(
            report.timed_out > 0,
            "seed {seed:#x}: control: some dispatches ended while their worker was away"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn blackouts_within_the_grace_run_nothing_twice_and_without_a_session_they_do() {
    for seed in seeds() {
        let short = |grace| Plan {
            seed,
            dispatches: 10_000,
            grace,
            long_blackouts: false,
        };
        let (with_sessions, tally) = run(short(GRACE)).await;
        assert_eq!(with_sessions.duplicates, 0, "seed {seed:#x}: ran twice");
        assert_eq!(tally.refused_resumes, 0);
        assert_eq!(
            tally.redeliveries, tally.lost_on_the_wire,
            "seed {seed:#x}: only tasks the link swallowed go out again"
        );
        assert!(tally.short_blackouts > 0, "control: blackouts happened");
        let (without, _) = run(short(Duration::ZERO)).await;
        assert!(
            without.duplicates > 0,
            "seed {seed:#x}: control: the same blackouts with no session run tasks twice"
        );
    }
}
