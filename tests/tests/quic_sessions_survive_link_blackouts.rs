//! A QUIC worker whose link goes dark keeps its work: over a real gateway and the QUIC SDK,
//! through a UDP relay that blacks the link out, the connection dies (short idle timeout), the
//! gateway suspends the worker, and the worker resumes its session on a new connection. Each
//! test names the behaviour; the controls are a grace of zero (today's re-dispatch), a grace
//! that expires, and a blackout too short to end the connection at all.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{
    ActivityOutcome, ActivityRequest, Backoff, CallerIdentity, DisconnectReason, WorkerEvent,
    WorkerId,
};
use switchyard_gateway::ConfigDuration;
use switchyard_tests::{TestGateway, UdpRelay};
use switchyard_transport_quic::{
    ActivityContext, ActivityError, ConnectionConfig, QuicWorker, QuicWorkerHandle,
};
use tokio::sync::{Notify, broadcast};

const NS: &str = "blackout";
const ACTIVITY: &str = "work";
/// Longest any step of these tests may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// A QUIC SDK worker of capacity 1 whose handler counts the tasks it starts and runs each for
/// `task_time`.
struct Counted {
    handle: QuicWorkerHandle,
    id: WorkerId,
    started: Arc<AtomicU64>,
    /// Notified when a task starts.
    running: Arc<Notify>,
    _run: tokio::task::JoinHandle<()>,
}

impl Counted {
    async fn connect(
        gateway: &TestGateway,
        addr: SocketAddr,
        task_time: Duration,
        link: ConnectionConfig,
    ) -> Self {
        let started = Arc::new(AtomicU64::new(0));
        let running = Arc::new(Notify::new());
        let (counter, notify) = (Arc::clone(&started), Arc::clone(&running));
        let worker = QuicWorker::builder(addr, "localhost")
            .namespaces([NS])
            .max_concurrency(1)
            .tls(gateway.quic_tls())
            .connection(link)
            .backoff(Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
            })
            .activity(ACTIVITY, move |_: ActivityContext, input: Bytes| {
                counter.fetch_add(1, Ordering::SeqCst);
                notify.notify_one();
                async move {
                    tokio::time::sleep(task_time).await;
                    Ok::<_, ActivityError>(input)
                }
            })
            .connect()
            .await
            .expect("worker connects");
        let handle = worker.handle();
        let id = worker.worker_id();
        let run = tokio::spawn(async move {
            let _ = worker.run().await;
        });
        Self {
            handle,
            id,
            started,
            running,
            _run: run,
        }
    }

    fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }
}

/// A link that dies within half a second of going dark: both ends' idle timeout is 400 ms.
fn short_lived_link() -> ConnectionConfig {
    ConnectionConfig {
        max_idle_timeout: Duration::from_millis(400),
        keep_alive_interval: Some(Duration::from_millis(100)),
        ..ConnectionConfig::default()
    }
}

/// The link of the workers not behind the relay: the SDK's defaults (a 30 s idle timeout), so a
/// busy machine cannot end their connections and dispatch a task once more.
fn steady_link() -> ConnectionConfig {
    ConnectionConfig {
        keep_alive_interval: Some(Duration::from_secs(2)),
        ..ConnectionConfig::default()
    }
}

async fn gateway(grace: Duration) -> TestGateway {
    TestGateway::start(|config| config.quic.reconnect_grace = ConfigDuration(grace)).await
}

fn quic_addr(gateway: &TestGateway) -> SocketAddr {
    gateway.gateway().addr("quic").expect("quic listens")
}

fn request(timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: NS.to_owned(),
        task_queue: String::new(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
        input: Bytes::from_static(b"payload"),
        activity_id: None,
        timeout,
    }
}

/// Dispatches one task in the background.
fn dispatch(gateway: &TestGateway, timeout: Duration) -> tokio::task::JoinHandle<ActivityOutcome> {
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    tokio::spawn(async move {
        dispatcher
            .dispatch(&CallerIdentity::trusted("producer"), request(timeout))
            .await
            .expect("dispatch accepted")
    })
}

async fn wait_eligible(gateway: &TestGateway, count: usize) {
    switchyard_tests::wait_eligible(gateway, NS, ACTIVITY, count).await;
}

/// Waits for the first event about `worker` that `matches` accepts.
async fn event_of(
    events: &mut broadcast::Receiver<WorkerEvent>,
    worker: WorkerId,
    what: &str,
    matches: impl Fn(&WorkerEvent) -> bool,
) -> WorkerEvent {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let event = events.recv().await.expect("events flow");
            if about(&event) == Some(worker) && matches(&event) {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event: {what}"))
}

fn about(event: &WorkerEvent) -> Option<WorkerId> {
    match event {
        WorkerEvent::Suspended { worker, .. }
        | WorkerEvent::Resumed { worker }
        | WorkerEvent::Disconnected { worker, .. } => Some(*worker),
        _ => None,
    }
}

async fn outcome(dispatch: tokio::task::JoinHandle<ActivityOutcome>) -> ActivityOutcome {
    tokio::time::timeout(PATIENCE, dispatch)
        .await
        .expect("the dispatch ends")
        .expect("dispatch task")
}

/// Once the worker behind `relay` has started the dispatched task, blacks the link out for
/// `blackout`, then restores it; returns the dispatch.
async fn blackout_during_task(
    worker: &Counted,
    relay: &UdpRelay,
    dispatch: tokio::task::JoinHandle<ActivityOutcome>,
    blackout: Duration,
) -> tokio::task::JoinHandle<ActivityOutcome> {
    tokio::time::timeout(PATIENCE, worker.running.notified())
        .await
        .expect("the worker behind the relay starts the task");
    relay.freeze();
    tokio::time::sleep(blackout).await;
    relay.thaw();
    dispatch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_running_through_a_one_second_blackout_completes_once_on_its_worker() {
    let gateway = gateway(Duration::from_secs(15)).await;
    let mut events = gateway.gateway().core().registry().subscribe_events();
    let relay = UdpRelay::start(quic_addr(&gateway)).await.expect("relay");
    let task_time = Duration::from_secs(2);
    let dark = Counted::connect(&gateway, relay.addr(), task_time, short_lived_link()).await;
    wait_eligible(&gateway, 1).await;
    let dispatch = dispatch(&gateway, PATIENCE);
    tokio::time::timeout(PATIENCE, dark.running.notified())
        .await
        .expect("the worker behind the relay starts the task");
    // Only now a second worker: it could take the task only if the gateway dispatched it again.
    let other = Counted::connect(&gateway, quic_addr(&gateway), task_time, steady_link()).await;
    relay.freeze();
    event_of(&mut events, dark.id, "suspended", |e| {
        matches!(e, WorkerEvent::Suspended { .. })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.thaw();
    event_of(&mut events, dark.id, "resumed", |e| {
        matches!(e, WorkerEvent::Resumed { .. })
    })
    .await;

    assert_eq!(
        outcome(dispatch).await,
        ActivityOutcome::Completed(Bytes::from_static(b"payload"))
    );
    assert_eq!(dark.started(), 1, "the task ran once, on its worker");
    assert_eq!(other.started(), 0, "no other worker ran it");
    assert_eq!(
        dark.handle.worker_id(),
        Some(dark.id),
        "same session, same id"
    );
    let refused = gateway.gateway().core().dispatcher().refused();
    assert_eq!((refused.unknown, refused.late), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_grace_the_same_blackout_dispatches_the_task_again() {
    // Control for the test above: grace 0 is today's behaviour.
    let gateway = gateway(Duration::ZERO).await;
    let mut events = gateway.gateway().core().registry().subscribe_events();
    let relay = UdpRelay::start(quic_addr(&gateway)).await.expect("relay");
    let task_time = Duration::from_secs(2);
    let dark = Counted::connect(&gateway, relay.addr(), task_time, short_lived_link()).await;
    wait_eligible(&gateway, 1).await;
    let dispatch = dispatch(&gateway, PATIENCE);
    tokio::time::timeout(PATIENCE, dark.running.notified())
        .await
        .expect("the worker behind the relay starts the task");
    let other = Counted::connect(&gateway, quic_addr(&gateway), task_time, steady_link()).await;
    relay.freeze();
    let left = event_of(&mut events, dark.id, "left", |e| {
        matches!(
            e,
            WorkerEvent::Disconnected { .. } | WorkerEvent::Suspended { .. }
        )
    })
    .await;
    assert!(
        matches!(left, WorkerEvent::Disconnected { .. }),
        "no session, no suspension: {left:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.thaw();

    assert_eq!(
        outcome(dispatch).await,
        ActivityOutcome::Completed(Bytes::from_static(b"payload"))
    );
    assert_eq!(
        dark.started() + other.started(),
        2,
        "the task was dispatched again and ran twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_computed_during_the_blackout_is_delivered_after_the_resume_once() {
    let gateway = gateway(Duration::from_secs(15)).await;
    let mut events = gateway.gateway().core().registry().subscribe_events();
    let relay = UdpRelay::start(quic_addr(&gateway)).await.expect("relay");
    // The task ends 300 ms into a 1.2 s blackout: its result is written into the dark (or
    // waits), and must cross the resume.
    let dark = Counted::connect(
        &gateway,
        relay.addr(),
        Duration::from_millis(300),
        short_lived_link(),
    )
    .await;
    wait_eligible(&gateway, 1).await;
    let dispatch = blackout_during_task(
        &dark,
        &relay,
        dispatch(&gateway, PATIENCE),
        Duration::from_millis(1_200),
    )
    .await;
    event_of(&mut events, dark.id, "resumed", |e| {
        matches!(e, WorkerEvent::Resumed { .. })
    })
    .await;
    assert_eq!(
        outcome(dispatch).await,
        ActivityOutcome::Completed(Bytes::from_static(b"payload"))
    );
    assert_eq!(dark.started(), 1);
    let refused = gateway.gateway().core().dispatcher().refused();
    assert_eq!(
        (refused.unknown, refused.foreign, refused.late),
        (0, 0, 0),
        "applied once, no second copy refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_grace_expires_gives_its_task_to_another_worker() {
    let gateway = gateway(Duration::from_secs(1)).await;
    let mut events = gateway.gateway().core().registry().subscribe_events();
    let relay = UdpRelay::start(quic_addr(&gateway)).await.expect("relay");
    let dark = Counted::connect(
        &gateway,
        relay.addr(),
        Duration::from_secs(2),
        short_lived_link(),
    )
    .await;
    wait_eligible(&gateway, 1).await;
    let dispatch = dispatch(&gateway, PATIENCE);
    tokio::time::timeout(PATIENCE, dark.running.notified())
        .await
        .expect("the worker behind the relay starts the task");
    let other = Counted::connect(
        &gateway,
        quic_addr(&gateway),
        Duration::from_millis(10),
        steady_link(),
    )
    .await;
    // Dark for good.
    relay.freeze();
    event_of(&mut events, dark.id, "suspended", |e| {
        matches!(e, WorkerEvent::Suspended { .. })
    })
    .await;
    assert_eq!(
        other.started(),
        0,
        "suspended: the task waits for its worker"
    );
    event_of(&mut events, dark.id, "expired", |e| {
        matches!(
            e,
            WorkerEvent::Disconnected {
                reason: DisconnectReason::ReconnectGraceExpired,
                ..
            }
        )
    })
    .await;
    assert_eq!(
        outcome(dispatch).await,
        ActivityOutcome::Completed(Bytes::from_static(b"payload"))
    );
    assert_eq!(other.started(), 1, "dispatched again after the grace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_that_times_out_during_the_suspension_refuses_the_late_result() {
    let gateway = gateway(Duration::from_secs(15)).await;
    let mut events = gateway.gateway().core().registry().subscribe_events();
    let relay = UdpRelay::start(quic_addr(&gateway)).await.expect("relay");
    let dark = Counted::connect(
        &gateway,
        relay.addr(),
        Duration::from_millis(300),
        short_lived_link(),
    )
    .await;
    wait_eligible(&gateway, 1).await;
    // The deadline passes while the worker is away; its result (computed in the dark) comes
    // back only after the resume.
    let dispatch = blackout_during_task(
        &dark,
        &relay,
        dispatch(&gateway, Duration::from_millis(800)),
        Duration::from_millis(1_500),
    )
    .await;
    assert_eq!(
        outcome(dispatch).await,
        ActivityOutcome::TimedOut,
        "the producer's deadline ran during the suspension"
    );
    event_of(&mut events, dark.id, "resumed", |e| {
        matches!(e, WorkerEvent::Resumed { .. })
    })
    .await;
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    tokio::time::timeout(PATIENCE, async {
        while dispatcher.refused().late == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the late result is refused as late");
    assert_eq!(dispatcher.refused().late, 1);
    assert_eq!(dark.started(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackout_shorter_than_the_idle_timeout_needs_no_resume() {
    // QUIC retransmits across a short blackout: with the default 30 s idle timeout the
    // connection survives a 1 s one, and nothing is suspended or resumed.
    let gateway = gateway(Duration::from_secs(15)).await;
    let mut events = gateway.gateway().core().registry().subscribe_events();
    let relay = UdpRelay::start(quic_addr(&gateway)).await.expect("relay");
    let link = ConnectionConfig {
        keep_alive_interval: Some(Duration::from_millis(100)),
        ..ConnectionConfig::default()
    };
    let dark = Counted::connect(&gateway, relay.addr(), Duration::from_secs(2), link).await;
    wait_eligible(&gateway, 1).await;
    let dispatch = blackout_during_task(
        &dark,
        &relay,
        dispatch(&gateway, PATIENCE),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(
        outcome(dispatch).await,
        ActivityOutcome::Completed(Bytes::from_static(b"payload"))
    );
    assert_eq!(dark.started(), 1);
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(
                event,
                WorkerEvent::Suspended { .. }
                    | WorkerEvent::Resumed { .. }
                    | WorkerEvent::Disconnected { .. }
            ),
            "the connection survived: {event:?}"
        );
    }
}
