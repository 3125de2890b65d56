//! A frozen worker (connection open, nothing read, no pong) on each transport: the liveness
//! probe excludes it before the silence window deregisters it as `Timeout`; meanwhile the
//! census says `WorkersUnreachable` and nothing is sent to it; the task it held is
//! re-dispatched to a healthy worker and completes. (Sessions off: with a reconnect grace the
//! silent worker is suspended for the grace first.)
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, DisconnectReason, DispatchExclusion,
    UnservedReason, WorkerEvent, WorkerId,
};
use switchyard_gateway::ConfigDuration;
use switchyard_tests::{
    FaultSpec, FaultWorker, TcpRelay, TestGateway, UdpRelay, Work, grpc_fault_worker,
    quic_fault_worker, wait_eligible,
};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug)]
enum Transport {
    Grpc,
    Quic,
}

enum Relay {
    Tcp(TcpRelay),
    Udp(UdpRelay),
}

impl Relay {
    fn freeze(&self) {
        match self {
            Self::Tcp(relay) => relay.freeze(),
            Self::Udp(relay) => relay.freeze(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_grpc_worker_is_excluded_then_timed_out_and_its_task_redispatched() {
    frozen_worker(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_quic_worker_is_excluded_then_timed_out_and_its_task_redispatched() {
    frozen_worker(Transport::Quic).await;
}

async fn connect(
    gateway: &TestGateway,
    transport: Transport,
    addr: SocketAddr,
    spec: &FaultSpec,
) -> FaultWorker {
    match transport {
        Transport::Grpc => grpc_fault_worker(gateway, addr, spec).await,
        Transport::Quic => quic_fault_worker(gateway, addr, spec).await,
    }
}

async fn frozen_worker(transport: Transport) {
    let gateway = TestGateway::start(|config| {
        config.liveness.heartbeat_window = ConfigDuration::secs(3);
        // The transports' own dead-peer detection must not beat the probe to it.
        config.grpc.keepalive_interval = ConfigDuration::secs(60);
        config.grpc.keepalive_timeout = ConfigDuration::secs(60);
        config.quic.max_idle_timeout = ConfigDuration::secs(60);
        // Without sessions: a silent session worker is suspended for its grace instead (see
        // `grpc_session_resume`, `quic_sessions_survive_link_blackouts` and core's
        // `a_silent_session_worker_is_suspended_and_its_connection_told_to_close`).
        config.grpc.reconnect_grace = ConfigDuration::secs(0);
        config.quic.reconnect_grace = ConfigDuration::secs(0);
    })
    .await;
    let registry = gateway.gateway().core().registry().clone();
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    let mut events = registry.subscribe_events();
    let (direct, relay) = match transport {
        Transport::Grpc => {
            let direct = gateway.gateway().addr("grpc").expect("grpc listens");
            (
                direct,
                Relay::Tcp(TcpRelay::start(direct).await.expect("relay starts")),
            )
        }
        Transport::Quic => {
            let direct = gateway.gateway().addr("quic").expect("quic listens");
            (
                direct,
                Relay::Udp(UdpRelay::start(direct).await.expect("relay starts")),
            )
        }
    };
    let relay_addr = match &relay {
        Relay::Tcp(relay) => relay.addr(),
        Relay::Udp(relay) => relay.addr(),
    };
    // Its handler never returns: the task is only ever finished by someone else.
    let hung = CancellationToken::new();
    let frozen = connect(
        &gateway,
        transport,
        relay_addr,
        &FaultSpec {
            namespace: "freeze".to_owned(),
            activity: "echo".to_owned(),
            capacity: 1,
            work: Work::Until(hung.clone()),
        },
    )
    .await;
    wait_eligible(&gateway, "freeze", "echo", 1).await;

    let held = tokio::spawn({
        let dispatcher = dispatcher.clone();
        async move {
            dispatcher
                .dispatch(&CallerIdentity::trusted("producer"), request(b"held"))
                .await
        }
    });
    assert!(
        frozen.gauge.wait_running(1, Duration::from_secs(10)).await,
        "{transport:?}: the task never reached the worker about to freeze"
    );
    relay.freeze();

    let excluded = wait_for(&mut events, |event| {
        matches!(event, WorkerEvent::Excluded { worker, exclusion: DispatchExclusion::ReachabilityLost }
            if *worker == frozen.id)
            || is_timeout(event, frozen.id)
    })
    .await;
    assert!(
        !is_timeout(&excluded, frozen.id),
        "{transport:?}: the worker was timed out before the probe excluded it"
    );
    let census = registry.pool_census("freeze", "", "echo", None);
    assert_eq!(
        census.classify(),
        Some(UnservedReason::WorkersUnreachable),
        "{transport:?}: census while frozen: {census:?}"
    );

    let healthy = connect(
        &gateway,
        transport,
        direct,
        &FaultSpec {
            namespace: "freeze".to_owned(),
            activity: "echo".to_owned(),
            capacity: 2,
            work: Work::For(Duration::ZERO),
        },
    )
    .await;
    wait_eligible(&gateway, "freeze", "echo", 1).await;
    let fresh = dispatcher
        .dispatch(&CallerIdentity::trusted("producer"), request(b"fresh"))
        .await
        .expect("dispatch accepted");
    assert_eq!(
        fresh,
        ActivityOutcome::Completed(Bytes::from_static(b"fresh"))
    );
    assert_eq!(
        healthy.gauge.finished(),
        1,
        "{transport:?}: the new dispatch went elsewhere than the healthy worker"
    );

    let timed_out = wait_for(&mut events, |event| is_timeout(event, frozen.id)).await;
    assert!(is_timeout(&timed_out, frozen.id));
    let outcome = tokio::time::timeout(Duration::from_secs(15), held)
        .await
        .expect("the held dispatch ends once the frozen worker is gone")
        .expect("dispatch task")
        .expect("dispatch accepted");
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"held")),
        "{transport:?}: the frozen worker's task was not re-dispatched"
    );
    assert_eq!(healthy.gauge.finished(), 2);
    assert_eq!(frozen.gauge.finished(), 0);
    assert!(!registry.is_registered(frozen.id));
    assert!(registry.is_registered(healthy.id));
    hung.cancel();
}

fn is_timeout(event: &WorkerEvent, id: WorkerId) -> bool {
    matches!(event, WorkerEvent::Disconnected { worker, reason: DisconnectReason::Timeout }
        if *worker == id)
}

async fn wait_for(
    events: &mut broadcast::Receiver<WorkerEvent>,
    wanted: impl Fn(&WorkerEvent) -> bool,
) -> WorkerEvent {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match events.recv().await {
                Ok(event) if wanted(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event stream closed"),
            }
        }
    })
    .await
    .expect("the event arrives")
}

fn request(input: &'static [u8]) -> ActivityRequest {
    ActivityRequest {
        namespace: "freeze".to_owned(),
        task_queue: String::new(),
        activity_type: "echo".to_owned(),
        node: None,
        input: Bytes::from_static(input),
        activity_id: None,
        timeout: Duration::from_secs(60),
    }
}
