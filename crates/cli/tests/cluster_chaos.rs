//! Cluster chaos: three real `switchyard serve` nodes on one real `nats-server -js`, the
//! producer on A, SDK workers (in this process) connected to B and C, and 2,000 ephemeral
//! dispatches while B and C are SIGKILLed at seeded random points and restarted under their
//! names (their workers reconnect by themselves).
//!
//! It asserts every dispatch gets exactly one outcome (and that it is the task's output), no
//! worker ever runs more tasks at once than its capacity, and a task runs more than once only
//! when a run of it was on a node killed before the next run began. `CLUSTER_CHAOS_SEED`
//! replays one schedule; the seed is printed.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;
#[path = "cluster_support/nodes.rs"]
mod nodes;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use harness::{NAMESPACE, Process, Site, tag_of, tagged};
use nodes::{completed, node_site, spawn_with_ops, takes_offers};
use switchyard_proto::v1 as pb;
use switchyard_test_support::NatsServer;
use switchyard_transport_grpc::{ActivityContext, ActivityError, Backoff, GrpcWorker};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ACTIVITY: &str = "chaos-echo";
/// Dispatches in the run.
const DISPATCHES: u64 = 2_000;
/// Dispatch calls the producer keeps open at once.
const CALLS_AT_ONCE: usize = 48;
/// Node kills in the run (each followed by a restart).
const KILLS: usize = 4;
/// Workers per worker node, and the slots of each.
const WORKERS_PER_NODE: usize = 2;
const CAPACITY: u32 = 3;
/// Each dispatch's own deadline.
const DISPATCH_TIMEOUT: Duration = Duration::from_secs(40);
/// The whole run's bound.
const RUN_BOUND: Duration = Duration::from_secs(150);
/// How long a killed node's successor keeps retrying its name (held until the dead entry
/// ages out of the 3 s membership TTL).
const RESTART_TRIES: usize = 40;

/// splitmix64: the seeded source of kill points, victims and service times.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One handler run.
#[derive(Clone, Copy, Debug)]
struct Run {
    node: usize,
    started: Instant,
}

/// What the workers saw: runs per tag, and per worker the tasks at once now and at most.
#[derive(Default)]
struct Ledger {
    runs: Mutex<HashMap<u64, Vec<Run>>>,
    now: Vec<AtomicU32>,
    most: Vec<AtomicU32>,
}

/// Counts a run in its worker's concurrency for as long as the handler runs (or until the SDK
/// drops it).
struct Running<'a> {
    ledger: &'a Ledger,
    worker: usize,
}

impl<'a> Running<'a> {
    fn enter(ledger: &'a Ledger, worker: usize) -> Self {
        let at_once = ledger.now[worker].fetch_add(1, Ordering::SeqCst) + 1;
        ledger.most[worker].fetch_max(at_once, Ordering::SeqCst);
        Self { ledger, worker }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.ledger.now[self.worker].fetch_sub(1, Ordering::SeqCst);
    }
}

/// A worker of `node` (index into the sites) connected to `site`, reconnecting by itself.
async fn worker(
    site: &Site,
    node: usize,
    index: usize,
    ledger: Arc<Ledger>,
    seed: u64,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let worker = GrpcWorker::builder(format!("https://localhost:{}", site.port))
        .namespaces([NAMESPACE])
        .max_concurrency(CAPACITY)
        .tls(site.client_tls())
        .backoff(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(300),
        })
        .activity(ACTIVITY, move |ctx: ActivityContext, input: Bytes| {
            let ledger = Arc::clone(&ledger);
            async move {
                let tag = tag_of(&input).ok_or_else(|| ActivityError::fatal("untagged input"))?;
                let _running = Running::enter(&ledger, index);
                ledger
                    .runs
                    .lock()
                    .unwrap()
                    .entry(tag)
                    .or_default()
                    .push(Run {
                        node,
                        started: Instant::now(),
                    });
                let service = Duration::from_millis(2 + mix(seed ^ tag) % 20);
                tokio::select! {
                    () = ctx.cancelled() => {}
                    () = tokio::time::sleep(service) => {}
                }
                Ok(input)
            }
        })
        .connect()
        .await
        .expect("the worker registers");
    let shutdown = worker.shutdown_token();
    tokio::spawn(async move {
        tokio::select! {
            _ = worker.run() => {}
            () = stop.cancelled() => shutdown.cancel(),
        }
    })
}

/// Starts `site`'s node, retrying while its name is still held by a killed predecessor's
/// entry; returns it with its operations port.
async fn restart(site: &Site) -> (Process, u16) {
    for _ in 0..RESTART_TRIES {
        let (mut node, ops) = spawn_with_ops(site);
        if node.line_or_exit("grpc").await.is_some() {
            return (node, ops);
        }
        // Its stdout closed: wait for the exit and the last of its stderr (the refusal comes
        // after the start-up warnings).
        node.exit().await;
        let refused = node.stderr();
        assert!(
            refused.contains("is held by a live node"),
            "the node failed to start for another reason: {refused}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("the node never got its name back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatches_end_exactly_once_while_worker_nodes_are_killed_and_restarted() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let seed = std::env::var("CLUSTER_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(2);
    println!("cluster chaos seed {seed} (CLUSTER_CHAOS_SEED replays it)");
    let sites = [
        node_site(&nats, "chaos", "a"),
        node_site(&nats, "chaos", "b"),
        node_site(&nats, "chaos", "c"),
    ];
    let _a = sites[0].serve().await;
    let mut nodes: Vec<Option<Process>> = vec![None, None, None];
    let mut ops = [0_u16; 3];
    for node in [1, 2] {
        let (process, port) = restart(&sites[node]).await;
        nodes[node] = Some(process);
        ops[node] = port;
    }
    let workers = 2 * WORKERS_PER_NODE;
    let ledger = Arc::new(Ledger {
        runs: Mutex::default(),
        now: (0..workers).map(|_| AtomicU32::new(0)).collect(),
        most: (0..workers).map(|_| AtomicU32::new(0)).collect(),
    });
    let stop_workers = CancellationToken::new();
    let mut running = Vec::new();
    for index in 0..workers {
        let node = 1 + index / WORKERS_PER_NODE;
        running.push(
            worker(
                &sites[node],
                node,
                index,
                Arc::clone(&ledger),
                seed,
                stop_workers.clone(),
            )
            .await,
        );
    }
    takes_offers(ops[1]).await;
    takes_offers(ops[2]).await;

    // The schedule: after how many outcomes each kill comes, and which node it takes.
    let mut schedule: Vec<(usize, usize)> = (0..KILLS as u64)
        .map(|k| {
            let at = 150 + mix(seed ^ (k << 32)) % (DISPATCHES / 2);
            let victim = 1 + (mix(seed ^ (k << 40) ^ 1) % 2) as usize;
            (usize::try_from(at).unwrap(), victim)
        })
        .collect();
    schedule.sort_unstable();
    println!("kills (after outcomes, node): {schedule:?}");

    let ended = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(Notify::new());
    let producer = sites[0].producer().await.expect("A listens");
    let room = Arc::new(Semaphore::new(CALLS_AT_ONCE));
    let mut calls = tokio::task::JoinSet::new();
    for tag in 0..DISPATCHES {
        let (mut client, room) = (producer.0.clone(), Arc::clone(&room));
        let (ended, progress) = (Arc::clone(&ended), Arc::clone(&progress));
        calls.spawn(async move {
            let _turn = room.acquire_owned().await.unwrap();
            let answer = client
                .dispatch(pb::DispatchRequest {
                    namespace: NAMESPACE.into(),
                    activity_type: ACTIVITY.into(),
                    input: tagged(tag),
                    timeout_ms: u64::try_from(DISPATCH_TIMEOUT.as_millis()).unwrap(),
                    durable: Some(false),
                    ..pb::DispatchRequest::default()
                })
                .await
                .map(|reply| reply.into_inner().outcome);
            ended.fetch_add(1, Ordering::SeqCst);
            progress.notify_waiters();
            (tag, answer)
        });
    }

    let run_started = Instant::now();
    let bound = run_started + RUN_BOUND;
    // Kills: (node, just before SIGKILL, just after the process was reaped).
    let mut kills: Vec<(usize, Instant, Instant)> = Vec::new();
    for (at, victim) in schedule {
        loop {
            let wake = progress.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            if ended.load(Ordering::SeqCst) >= at {
                break;
            }
            tokio::time::timeout_at(bound, wake)
                .await
                .expect("the run goes on within its bound");
        }
        let before = Instant::now();
        nodes[victim].as_mut().unwrap().kill_9();
        kills.push((victim, before, Instant::now()));
        let (process, port) = restart(&sites[victim]).await;
        nodes[victim] = Some(process);
        ops[victim] = port;
    }
    let answers = tokio::time::timeout_at(bound, calls.join_all())
        .await
        .expect("every dispatch ends within the run's bound");
    println!(
        "{DISPATCHES} dispatches, {} kills, in {:?}",
        kills.len(),
        run_started.elapsed()
    );
    stop_workers.cancel();
    for worker in running {
        let _ = tokio::time::timeout(Duration::from_secs(10), worker).await;
    }

    // Exactly one outcome per dispatch, and it is the task's own output.
    let mut outcomes: HashMap<u64, usize> = HashMap::new();
    for (tag, answer) in &answers {
        *outcomes.entry(*tag).or_default() += 1;
        let outcome = answer
            .as_ref()
            .unwrap_or_else(|status| panic!("tag {tag}: Dispatch failed: {status}"))
            .as_ref()
            .unwrap_or_else(|| panic!("tag {tag}: a reply without an outcome"));
        assert_eq!(
            completed(outcome),
            Some(&tagged(*tag)[..]),
            "tag {tag}: {outcome:?}"
        );
    }
    assert_eq!(outcomes.len(), usize::try_from(DISPATCHES).unwrap());
    assert!(outcomes.values().all(|n| *n == 1));

    // No worker ever ran more tasks at once than its capacity ...
    let most: Vec<u32> = ledger
        .most
        .iter()
        .map(|m| m.load(Ordering::SeqCst))
        .collect();
    println!("most tasks at once per worker: {most:?} (capacity {CAPACITY})");
    assert!(most.iter().all(|m| *m <= CAPACITY), "{most:?}");
    // ... and the count is live: some worker was filled to its capacity.
    assert!(
        most.contains(&CAPACITY),
        "the load filled a worker: {most:?}"
    );

    // A task ran again only after a run of it was on a node killed before the rerun began.
    let runs = ledger.runs.lock().unwrap();
    let mut again = 0;
    for tag in 0..DISPATCHES {
        let mut tag_runs = runs.get(&tag).cloned().unwrap_or_default();
        assert!(!tag_runs.is_empty(), "tag {tag} completed yet never ran");
        tag_runs.sort_by_key(|run| run.started);
        for pair in tag_runs.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            again += 1;
            let explained = kills.iter().any(|(node, before, after)| {
                *node == earlier.node
                    && earlier.started <= *after + Duration::from_millis(500)
                    && later.started >= *before
            });
            assert!(
                explained,
                "tag {tag} ran again ({later:?}) though its run {earlier:?} was on no node \
                 killed in between (kills {kills:?})"
            );
        }
    }
    println!("runs beyond the first: {again}");
    // Control: the kills happened, and a killed node's workers came back and took work after
    // its restart.
    assert_eq!(kills.len(), KILLS);
    let (node, _, after) = kills[0];
    assert!(
        runs.values()
            .flatten()
            .any(|run| run.node == node && run.started > after),
        "node {node}'s workers took work after its restart"
    );
}
