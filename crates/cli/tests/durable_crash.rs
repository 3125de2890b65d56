//! Durable dispatch survives SIGKILL: the real `switchyard serve` binary with the SQLite store
//! in a temporary data directory, 4 SDK workers in this process with seeded service times that
//! count their runs per input tag, and 2,000 durable submissions (each with an idempotency key,
//! so a submission cut off by a kill is submitted again without running twice). The gateway is
//! killed with SIGKILL after a seeded number of outcomes, three times, and restarted on the
//! same data directory and port; the workers reconnect by themselves and the producers submit
//! and await again. After each restart every outcome the producers had seen is awaited again
//! and must be the same. At the end: every tag has one dispatch id and one outcome (completed,
//! its input echoed), and a tag ran more than once only if it was running at a kill, as many
//! extra times at most as kills caught it running.
//!
//! `SWITCHYARD_LONG_TESTS=1` adds the long variant: 20,000 dispatches, ten kills.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Ledger, PATIENCE, Producer, Site, TestWorker, completed_output, tagged};
use switchyard_proto::v1 as pb;
use tokio::sync::watch;
use tokio::time::Instant;

const ACTIVITY: &str = "crash-echo";
const WORKERS: usize = 4;
const CAPACITY: u32 = 4;
/// Producer tasks, each submitting and awaiting one tag at a time.
const PRODUCERS: usize = 48;
/// The deadline of every dispatch: far beyond the run, so no restart makes one time out.
const DISPATCH_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one `AwaitOutcome` call waits before the producer asks again.
const AWAIT_WAIT: Duration = Duration::from_secs(5);
/// The seed of the kill points and the service times.
const SEED: u64 = 0x5eed_d0ab_1e17;

/// A 64-bit mix of `seed` and `value` (splitmix64's finaliser).
fn mix(seed: u64, value: u64) -> u64 {
    let mut z = seed ^ value.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 1 to 20 ms, fixed per tag by the seed.
fn service_time(tag: u64) -> Duration {
    Duration::from_millis(1 + mix(SEED, tag) % 20)
}

/// `kills` distinct outcome counts between 10% and 90% of `dispatches`, ascending.
fn kill_points(dispatches: u64, kills: usize) -> Vec<u64> {
    let (low, span) = (dispatches / 10, dispatches * 8 / 10);
    let mut points = HashSet::new();
    let mut draw = 0;
    while points.len() < kills {
        points.insert(low + mix(SEED ^ 0x4b11, draw) % span);
        draw += 1;
    }
    let mut points: Vec<u64> = points.into_iter().collect();
    points.sort_unstable();
    points
}

/// What the producers saw, shared with the test's controller.
struct Seen {
    /// The dispatch id `Submit` acknowledged, by tag.
    ids: Mutex<HashMap<u64, String>>,
    /// The outcome `AwaitOutcome` returned, by tag.
    outcomes: Mutex<HashMap<u64, pb::DispatchOutcome>>,
    /// How many outcomes have been seen.
    count: watch::Sender<u64>,
    /// Bumped each time a restarted gateway is serving again.
    epoch: watch::Sender<u64>,
}

/// One producer task's connection, made again after each restart.
struct Caller {
    site: Arc<Site>,
    producer: Option<Producer>,
    epoch: watch::Receiver<u64>,
}

impl Caller {
    async fn producer(&mut self) -> &mut Producer {
        if self.producer.is_none() {
            self.producer = Some(
                self.site
                    .producer()
                    .await
                    .expect("the gateway of this epoch is listening"),
            );
        }
        self.producer.as_mut().unwrap()
    }

    /// After a failed call made during `epoch`: waits for the next restart to be serving.
    async fn wait_restart(&mut self, epoch: u64, error: &tonic::Status) {
        self.producer = None;
        // A restart includes re-awaiting every outcome seen so far (up to 20,000 calls).
        let restarted =
            tokio::time::timeout(PATIENCE * 5, self.epoch.wait_for(|e| *e > epoch)).await;
        assert!(
            matches!(restarted, Ok(Ok(_))),
            "a call failed with no restart to follow: {error:?}"
        );
    }

    async fn submit(&mut self, tag: u64) -> String {
        loop {
            let epoch = *self.epoch.borrow();
            let key = format!("crash-{tag}");
            match self
                .producer()
                .await
                .submit(ACTIVITY, tag, Some(key), DISPATCH_TIMEOUT)
                .await
            {
                Ok(submitted) => return submitted.id,
                Err(error) => self.wait_restart(epoch, &error).await,
            }
        }
    }

    async fn await_outcome(&mut self, id: &str) -> pb::DispatchOutcome {
        loop {
            let epoch = *self.epoch.borrow();
            match self.producer().await.await_outcome(id, AWAIT_WAIT).await {
                Ok(Some(outcome)) => return outcome,
                Ok(None) => {}
                Err(error) => self.wait_restart(epoch, &error).await,
            }
        }
    }
}

async fn produce(site: Arc<Site>, seen: Arc<Seen>, next: Arc<AtomicU64>, dispatches: u64) {
    let mut caller = Caller {
        site,
        producer: None,
        epoch: seen.epoch.subscribe(),
    };
    loop {
        let tag = next.fetch_add(1, Ordering::SeqCst);
        if tag >= dispatches {
            return;
        }
        let id = caller.submit(tag).await;
        let earlier = seen.ids.lock().unwrap().insert(tag, id.clone());
        assert!(earlier.is_none(), "tag {tag} submitted by two producers");
        let outcome = caller.await_outcome(&id).await;
        seen.outcomes.lock().unwrap().insert(tag, outcome);
        seen.count.send_modify(|count| *count += 1);
    }
}

/// Awaits every outcome seen so far again (wait 0: it must be there) and compares.
async fn outcomes_stand(site: &Site, seen: &Seen) -> usize {
    let known: Vec<(u64, pb::DispatchOutcome)> = seen
        .outcomes
        .lock()
        .unwrap()
        .iter()
        .map(|(tag, outcome)| (*tag, outcome.clone()))
        .collect();
    let ids = seen.ids.lock().unwrap().clone();
    let mut producer = site.producer().await.expect("the gateway is listening");
    for (tag, outcome) in &known {
        let again = producer
            .await_outcome(&ids[tag], Duration::ZERO)
            .await
            .unwrap_or_else(|status| panic!("tag {tag}: AwaitOutcome after a restart: {status:?}"));
        assert_eq!(
            again.as_ref(),
            Some(outcome),
            "tag {tag}: the outcome changed or went missing across a restart"
        );
    }
    known.len()
}

/// Runs the scenario; returns a one-line summary of what happened.
async fn crash_and_recover(dispatches: u64, kills: usize) -> String {
    let started = Instant::now();
    let site = Arc::new(Site::new());
    let mut gateway = site.serve().await;
    let ledger = Arc::new(Ledger::default());
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(
            TestWorker::connect(&site, ACTIVITY, CAPACITY, Arc::clone(&ledger), service_time).await,
        );
    }
    let seen = Arc::new(Seen {
        ids: Mutex::default(),
        outcomes: Mutex::default(),
        count: watch::Sender::new(0),
        epoch: watch::Sender::new(0),
    });
    let next = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            tokio::spawn(produce(
                Arc::clone(&site),
                Arc::clone(&seen),
                Arc::clone(&next),
                dispatches,
            ))
        })
        .collect();

    // For each kill: the tags a worker had started whose outcome no producer had seen.
    let mut snapshots: Vec<HashSet<u64>> = Vec::new();
    let mut rechecked = 0;
    for point in kill_points(dispatches, kills) {
        let mut count = seen.count.subscribe();
        tokio::time::timeout(PATIENCE, count.wait_for(|seen| *seen >= point))
            .await
            .expect("the producers reach the kill point")
            .unwrap();
        gateway.kill_9();
        for worker in &mut workers {
            worker.lost().await;
        }
        let finished: HashSet<u64> = seen.outcomes.lock().unwrap().keys().copied().collect();
        snapshots.push(
            ledger
                .started()
                .into_iter()
                .filter(|tag| !finished.contains(tag))
                .collect(),
        );
        gateway = site.serve().await;
        rechecked += outcomes_stand(&site, &seen).await;
        seen.epoch.send_modify(|epoch| *epoch += 1);
    }
    for producer in producers {
        tokio::time::timeout(PATIENCE * 5, producer)
            .await
            .expect("the producers finish")
            .expect("no producer failed");
    }

    // Every tag: one id, one outcome, completed with its input.
    let ids = seen.ids.lock().unwrap().clone();
    let outcomes = seen.outcomes.lock().unwrap().clone();
    assert_eq!(
        ids.len() as u64,
        dispatches,
        "every submission acknowledged"
    );
    assert_eq!(outcomes.len() as u64, dispatches, "no dispatch lost");
    let distinct: HashSet<&String> = ids.values().collect();
    assert_eq!(distinct.len(), ids.len(), "one id per tag");
    for (tag, outcome) in &outcomes {
        assert_eq!(
            completed_output(outcome),
            Some(&tagged(*tag)),
            "tag {tag} completed with its input: {outcome:?}"
        );
    }
    rechecked += outcomes_stand(&site, &seen).await;

    // Executions beyond one only for tags running at a kill, at most once per such kill.
    let mut extra = 0;
    for tag in 0..dispatches {
        let runs = ledger.executions(tag);
        assert!(runs >= 1, "tag {tag} completed without running");
        let caught = snapshots.iter().filter(|s| s.contains(&tag)).count();
        assert!(
            runs - 1 <= caught,
            "tag {tag} ran {runs} times but was running at {caught} kills: {:?}",
            ledger.runs(tag)
        );
        extra += runs - 1;
    }
    // Control: the kills did land on running work (a kill between runs would prove nothing).
    let caught: Vec<usize> = snapshots.iter().map(HashSet::len).collect();
    assert!(
        caught.iter().all(|running| *running > 0),
        "every kill caught work in flight: {caught:?}"
    );
    let _ = gateway.terminate().await;
    for worker in workers {
        worker.stop().await;
    }
    format!(
        "{dispatches} durable dispatches, {kills} SIGKILLs: every id one outcome (all completed), \
         outcomes re-awaited after restarts {rechecked}, handler runs {}, extra runs {extra}, \
         tags running at each kill {caught:?}, {:.1} s",
        ledger.total(),
        started.elapsed().as_secs_f64()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sigkills_lose_no_dispatch_and_rerun_only_what_was_running() {
    let summary = tokio::time::timeout(Duration::from_secs(600), crash_and_recover(2_000, 3))
        .await
        .expect("the crash scenario is bounded");
    eprintln!("{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ten_sigkills_over_20_000_dispatches() {
    if !harness::long_tests() {
        eprintln!("skipped: set SWITCHYARD_LONG_TESTS=1");
        return;
    }
    let summary = tokio::time::timeout(Duration::from_secs(1_800), crash_and_recover(20_000, 10))
        .await
        .expect("the crash scenario is bounded");
    eprintln!("{summary}");
}
