//! Worker ids across a cluster, and a worker session that resumes on another node: real
//! `switchyard serve` nodes on one real `nats-server -js`, SDK workers in this process.
//!
//! The resume test puts a loopback TCP proxy between the worker and the nodes: the worker
//! dials the proxy, which forwards to node A and later to node B (which serves A's TLS
//! material), so the SDK's own reconnect lands on another node within the grace.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;
#[path = "cluster_support/nodes.rs"]
mod nodes;

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use harness::{NAMESPACE, PATIENCE, Site, tag_of, tagged};
use nodes::{completed, http_until_with, node_site, sample, serve_with_ops, takes_offers};
use switchyard_core::{NodeNumber, WorkerId};
use switchyard_proto::v1 as pb;
use switchyard_test_support::NatsServer;
use switchyard_transport_grpc::{ActivityContext, ActivityError, Backoff, GrpcWorker};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ACTIVITY: &str = "ids-echo";
/// `grpc.reconnect_grace`'s default: how long node A keeps a lost worker's session.
const GRPC_GRACE: Duration = Duration::from_secs(5);

/// A worker of [`ACTIVITY`] with one slot dialing `port` (trusting `site`'s CA) whose handler
/// runs `handler`; returns its registrations and its stop token.
async fn worker<F, Fut>(
    site: &Site,
    port: u16,
    handler: F,
) -> (watch::Receiver<Option<WorkerId>>, CancellationToken)
where
    F: Fn(ActivityContext, Bytes) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Bytes, ActivityError>> + Send + 'static,
{
    let worker = GrpcWorker::builder(format!("https://localhost:{port}"))
        .namespaces([NAMESPACE])
        .max_concurrency(1)
        .tls(site.client_tls())
        .backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        })
        .activity(ACTIVITY, handler)
        .connect()
        .await
        .expect("the worker registers");
    let registrations = worker.handle().registrations();
    let stop = worker.shutdown_token();
    tokio::spawn(async move {
        let _ = worker.run().await;
    });
    (registrations, stop)
}

/// The id of the registration `registrations` shows, waiting for one that `fits`.
async fn registered(
    registrations: &mut watch::Receiver<Option<WorkerId>>,
    fits: impl Fn(WorkerId) -> bool,
) -> WorkerId {
    let id = tokio::time::timeout(PATIENCE, registrations.wait_for(|id| id.is_some_and(&fits)))
        .await
        .expect("the worker registers within the patience")
        .expect("the worker runs");
    id.expect("fits only Some")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_workers_of_two_nodes_get_different_ids() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (node_site(&nats, "ids", "a"), node_site(&nats, "ids", "b"));
    let _a = a.serve().await;
    let _b = b.serve().await;
    let echo = |_: ActivityContext, input: Bytes| async move { Ok(input) };
    let (mut on_a, stop_a) = worker(&a, a.port, echo).await;
    let (mut on_b, stop_b) = worker(&b, b.port, echo).await;
    let (id_a, id_b) = (
        registered(&mut on_a, |_| true).await,
        registered(&mut on_b, |_| true).await,
    );
    assert_ne!(id_a, id_b, "each node's first worker");
    let (number_a, number_b) = (NodeNumber::of(id_a), NodeNumber::of(id_b));
    assert_ne!(
        number_a, number_b,
        "{id_a} and {id_b}: minted under one number"
    );
    assert!(number_a != NodeNumber::NONE && number_b != NodeNumber::NONE);
    stop_a.cancel();
    stop_b.cancel();

    // Control: two gateways without `[cluster]` both call their first worker 1.
    let (alone_1, alone_2) = (Site::new(), Site::new());
    let _alone_1 = alone_1.serve().await;
    let _alone_2 = alone_2.serve().await;
    let (mut first, stop_1) = worker(&alone_1, alone_1.port, echo).await;
    let (mut second, stop_2) = worker(&alone_2, alone_2.port, echo).await;
    let (one, two) = (
        registered(&mut first, |_| true).await,
        registered(&mut second, |_| true).await,
    );
    assert_eq!((one, two), (WorkerId::from_raw(1), WorkerId::from_raw(1)));
    stop_1.cancel();
    stop_2.cancel();
}

/// A loopback TCP proxy to a port that can change; [`Proxy::cut`] ends every connection
/// through it.
struct Proxy {
    port: u16,
    target: Arc<AtomicU16>,
    cut: Arc<Mutex<CancellationToken>>,
    stop: CancellationToken,
}

impl Proxy {
    async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let cut = Arc::new(Mutex::new(CancellationToken::new()));
        let stop = CancellationToken::new();
        let (to, cuts, stopped) = (Arc::clone(&target), Arc::clone(&cut), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let cut = cuts.lock().unwrap().clone();
                let port = to.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        () = cut.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Self {
            port,
            target,
            cut,
            stop,
        }
    }

    /// Ends every connection through the proxy; new ones go to `port`.
    fn cut(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
        let old = std::mem::take(&mut *self.cut.lock().unwrap());
        old.cancel();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut.lock().unwrap().cancel();
    }
}

/// What the resume test's handler reports.
#[derive(Debug)]
enum Seen {
    Started { tag: u64, at: Instant },
    LetGo { tag: u64 },
}

/// Reports [`Seen::LetGo`] unless disarmed: the worker cancelled the handler, or stopped it
/// (dropped it) outright.
struct LetGo {
    tag: u64,
    seen: Option<mpsc::UnboundedSender<Seen>>,
}

impl Drop for LetGo {
    fn drop(&mut self) {
        if let Some(seen) = self.seen.take() {
            let _ = seen.send(Seen::LetGo { tag: self.tag });
        }
    }
}

/// The producer's `Dispatch` of [`ACTIVITY`] with input [`tagged`]`(tag)` through `site`,
/// in the background.
fn dispatch_in_background(
    site: &Site,
    producer: &harness::Producer,
    tag: u64,
) -> tokio::task::JoinHandle<pb::DispatchOutcome> {
    let _ = site;
    let mut client = producer.0.clone();
    tokio::spawn(async move {
        client
            .dispatch(pb::DispatchRequest {
                namespace: NAMESPACE.into(),
                activity_type: ACTIVITY.into(),
                input: tagged(tag),
                timeout_ms: 60_000,
                durable: Some(false),
                ..pb::DispatchRequest::default()
            })
            .await
            .expect("Dispatch answers")
            .into_inner()
            .outcome
            .expect("an outcome")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumed_on_another_node_is_refused_and_its_task_runs_again_after_the_grace() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (node_site(&nats, "roam", "a"), node_site(&nats, "roam", "b"));
    let _node_a = a.serve().await;
    // B serves A's TLS material, so the worker's TLS check passes on either node.
    let b_tls = b.data_dir.join("tls");
    std::fs::create_dir_all(&b_tls).unwrap();
    for file in std::fs::read_dir(a.data_dir.join("tls")).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), b_tls.join(file.file_name())).unwrap();
    }
    let (_node_b, b_ops) = serve_with_ops(&b).await;
    let proxy = Proxy::start(a.port).await;

    // Tag 1's first run holds its slot until it is let go; tag 2 holds it until released.
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<Seen>();
    let release = Arc::new(Semaphore::new(0));
    let held = Arc::clone(&release);
    // The attempt number does not tell the first run: a forwarded task runs as the taker's
    // own first attempt.
    let ran_1 = Arc::new(AtomicBool::new(false));
    let (mut registrations, stop) = worker(&a, proxy.port, move |ctx: ActivityContext, input| {
        let (seen, release, ran_1) = (seen_tx.clone(), Arc::clone(&held), Arc::clone(&ran_1));
        async move {
            let tag = tag_of(&input).ok_or_else(|| ActivityError::fatal("untagged input"))?;
            let _ = seen.send(Seen::Started {
                tag,
                at: Instant::now(),
            });
            let mut let_go = LetGo {
                tag,
                seen: Some(seen),
            };
            let first_of_1 = tag == 1 && !ran_1.swap(true, Ordering::SeqCst);
            let hold = async {
                match tag {
                    1 if first_of_1 => tokio::time::sleep(PATIENCE).await,
                    2 => drop(release.acquire().await),
                    _ => {}
                }
            };
            tokio::select! {
                () = ctx.cancelled() => {}
                () = hold => { let_go.seen = None; }
            }
            Ok(input)
        }
    })
    .await;
    let on_a = registered(&mut registrations, |_| true).await;
    let producer = a.producer().await.expect("A listens");
    let first = dispatch_in_background(&a, &producer, 1);
    let next = tokio::time::timeout(PATIENCE, seen.recv()).await.unwrap();
    assert!(
        matches!(next, Some(Seen::Started { tag: 1, .. })),
        "{next:?}"
    );

    // The link to A breaks; the worker's reconnect reaches B within A's grace.
    let cut_at = Instant::now();
    proxy.cut(b.port);
    let on_b = registered(&mut registrations, |id| id != on_a).await;
    assert_ne!(
        NodeNumber::of(on_b),
        NodeNumber::of(on_a),
        "B minted {on_b}, A had minted {on_a}"
    );
    // B does not know the session: refused as unknown_session, the worker registered afresh
    // and let go of the task it held.
    http_until_with(b_ops, "/metrics", |metrics| {
        metrics.lines().any(|line| {
            line.starts_with("switchyard_resume_refused_total")
                && line.contains("unknown_session")
                && !line.ends_with(" 0")
        })
    })
    .await;
    let next = tokio::time::timeout(PATIENCE, seen.recv()).await.unwrap();
    assert!(matches!(next, Some(Seen::LetGo { tag: 1 })), "{next:?}");

    // A still holds the task for the suspended worker until its grace ends, then dispatches it
    // again: its only worker is on B now, so the task is forwarded there and runs once more.
    takes_offers(b_ops).await;
    let next = tokio::time::timeout(PATIENCE, seen.recv()).await.unwrap();
    let Some(Seen::Started { tag: 1, at, .. }) = next else {
        panic!("the task ran again: {next:?}");
    };
    assert!(
        at.duration_since(cut_at) >= GRPC_GRACE,
        "not before A's grace ended: {:?} after the cut",
        at.duration_since(cut_at)
    );
    let outcome = tokio::time::timeout(PATIENCE, first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(completed(&outcome), Some(&tagged(1)[..]), "{outcome:?}");

    // Control: the same break with the reconnect back on the node that holds the session
    // resumes it: same id, the task kept, run once.
    let second = dispatch_in_background(&a, &producer, 2);
    let next = tokio::time::timeout(PATIENCE, seen.recv()).await.unwrap();
    assert!(
        matches!(next, Some(Seen::Started { tag: 2, .. })),
        "{next:?}"
    );
    let resumed_before = sample(
        &nodes::http_get(b_ops, "/metrics").await,
        "switchyard_sessions_resumed_total",
    );
    proxy.cut(b.port);
    http_until_with(b_ops, "/metrics", |metrics| {
        sample(metrics, "switchyard_sessions_resumed_total") > resumed_before
    })
    .await;
    assert_eq!(
        *registrations.borrow(),
        Some(on_b),
        "the same session, the same id"
    );
    release.add_permits(1);
    let outcome = tokio::time::timeout(PATIENCE, second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(completed(&outcome), Some(&tagged(2)[..]), "{outcome:?}");
    assert!(
        seen.try_recv().is_err(),
        "tag 2 ran once and was not let go"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_without_nats_mints_under_a_number_once_it_joins() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    nats.kill();
    let a = node_site(&nats, "late", "a");
    let (_a, a_ops) = serve_with_ops(&a).await;
    nodes::http_until(a_ops, "/readyz", "cluster: degraded (").await;
    let echo = |_: ActivityContext, input: Bytes| async move { Ok(input) };
    // Control: degraded from the start, the node holds no number yet.
    let (mut early, stop_early) = worker(&a, a.port, echo).await;
    let early_id = registered(&mut early, |_| true).await;
    assert_eq!(NodeNumber::of(early_id), NodeNumber::NONE, "{early_id}");
    stop_early.cancel();
    nats.restart();
    nodes::http_until(a_ops, "/readyz", "cluster: joined as a").await;
    // The number is claimed beside the name, within a retry; each try is a fresh worker.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (mut late, stop_late) = worker(&a, a.port, echo).await;
        let id = registered(&mut late, |_| true).await;
        stop_late.cancel();
        if NodeNumber::of(id) != NodeNumber::NONE {
            assert!(id > early_id, "ids keep rising: {id} after {early_id}");
            break;
        }
        assert!(Instant::now() < deadline, "no number claimed: {id}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
