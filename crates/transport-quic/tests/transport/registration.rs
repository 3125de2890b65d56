//! Registration without capacity, the capacity announcement, and every refusal on the way.

use std::time::Duration;

use quinn::ConnectionError;
use switchyard_auth::{AllowAll, CallerTable};
use switchyard_core::{
    ActivityOutcome, CallerIdentity, DisconnectReason, UnservedReason, WorkerEvent,
};
use switchyard_proto::v1::{QuicResult, quic_control_up, quic_lane_up, quic_result};
use switchyard_transport_quic::{ErrorCode, QuicLinkError, QuicServerConfig};

use crate::support::{
    Gateway, NS, PATIENCE, Raw, closed_with, event, eventually, register_frame, request,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unannounced_worker_is_never_dispatched_to_until_it_announces() {
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::connect(&gateway).await;
    let registered = raw.register(register_frame(&["work"])).await;
    let worker = switchyard_core::WorkerId::from_raw(registered.worker_id);
    // The raw client answers the probation pings on lane 0, so only the missing capacity
    // keeps it out of selection.
    event(
        &mut events,
        "probation lifted",
        |e| matches!(e, WorkerEvent::ProbationPassed { worker: w } if *w == worker),
    )
    .await;
    let census = gateway.census("work");
    assert_eq!(census.capacity_unannounced, 1, "{census:?}");
    assert_eq!(census.eligible, 0);
    let outcome = gateway
        .dispatch_with(request("work", b"x", Duration::from_millis(300)))
        .await;
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::CapacityUnannounced,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(raw.lanes.try_recv().is_err(), "no task reached the worker");

    // Announcing makes it eligible: the next dispatch reaches it.
    raw.announce(1).await;
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, capacity: 1 } if *w == worker),
    )
    .await;
    assert_eq!(gateway.census("work").eligible, 1);
    let dispatch = gateway.dispatch("work", b"in");
    let answer = async {
        let (lane, task) = raw.next_task().await;
        assert_eq!(&task.input[..], b"in");
        assert_eq!(task.attempt, 1);
        lane.send(quic_lane_up::Frame::Result(QuicResult {
            task_id: task.task_id,
            outcome: Some(quic_result::Outcome::Output("out".into())),
        }))
        .await;
    };
    let (outcome, ()) = tokio::join!(dispatch, answer);
    assert_eq!(outcome, ActivityOutcome::Completed("out".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_capacity_is_refused_by_name_and_the_worker_leaves() {
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::connect(&gateway).await;
    let registered = raw.register(register_frame(&["work"])).await;
    raw.announce(0).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::CapacityRefused);
    assert!(reason.contains("max_concurrency 0"), "{reason}");
    let worker = switchyard_core::WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "deregistered",
        |e| matches!(e, WorkerEvent::Disconnected { worker: w, .. } if *w == worker),
    )
    .await;
    assert!(!gateway.registry().is_registered(worker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_above_the_registry_ceiling_is_refused_and_the_ceiling_is_announced() {
    let gateway = Gateway::with_ceiling(8).await;
    let mut raw = Raw::connect(&gateway).await;
    let registered = raw.register(register_frame(&["work"])).await;
    assert_eq!(registered.max_concurrency_limit, 8, "core's ceiling");
    raw.announce(9).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::CapacityRefused);
    assert_eq!(
        reason,
        "max_concurrency 9 exceeds this gateway's limit of 8"
    );
    assert_eq!(gateway.registry().admission_audit().refusals(), 1);

    // Control: at the ceiling the same announcement applies.
    let mut events = gateway.registry().subscribe_events();
    let mut at = Raw::connect(&gateway).await;
    let registered = at.register(register_frame(&["work"])).await;
    let worker = switchyard_core::WorkerId::from_raw(registered.worker_id);
    at.announce(8).await;
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, capacity: 8 } if *w == worker),
    )
    .await;
    assert_eq!(gateway.registry().worker(worker).unwrap().capacity, Some(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_who_registers_and_what_they_are_granted() {
    let tokens = CallerTable::new().with_token("good", CallerIdentity::granted("team", [NS]));
    let gateway = Gateway::with(QuicServerConfig::default(), tokens).await;

    let refused = gateway.worker().token("bad").connect().await.unwrap_err();
    assert!(
        matches!(refused.link_error::<QuicLinkError>(), Some(QuicLinkError::Refused { code: ErrorCode::Unauthenticated, reason }) if reason.contains("not recognised")),
        "{refused}"
    );
    assert!(refused.is_permanent());

    let outside = gateway
        .worker()
        .token("good")
        .namespaces(["elsewhere"])
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(outside.link_error::<QuicLinkError>(), Some(QuicLinkError::Refused { code: ErrorCode::NamespaceNotGranted, reason }) if reason.contains("\"elsewhere\"")),
        "{outside}"
    );

    let worker = gateway.worker().token("good").connect().await.unwrap();
    let id = worker.worker_id();
    let snapshot = gateway.registry().worker(id).unwrap();
    assert_eq!(snapshot.worker.principal(), "team");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate() {
    let gateway = Gateway::with_tls(QuicServerConfig::default(), AllowAll, true).await;
    let without = gateway
        .worker()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    assert!(without.is_err(), "a worker without a certificate got in");
    let with = gateway
        .worker()
        .tls(gateway.ca.client_tls_with_cert("worker-1").unwrap())
        .connect()
        .await
        .unwrap();
    assert!(gateway.registry().is_registered(with.worker_id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_protocol_version_is_refused() {
    let gateway = Gateway::start().await;
    let mut raw = Raw::connect(&gateway).await;
    let mut register = register_frame(&["work"]);
    register.protocol_version = 2;
    raw.send_control(switchyard_proto::v1::quic_control_up::Frame::Register(
        register,
    ))
    .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::UnsupportedVersion);
    assert!(reason.contains("protocol_version 2"), "{reason}");
    assert!(gateway.registry().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_before_the_version_so_a_bad_token_with_a_wrong_version_is_unauthenticated()
 {
    let tokens = CallerTable::new().with_token("good", CallerIdentity::granted("team", [NS]));
    let gateway = Gateway::with(QuicServerConfig::default(), tokens).await;
    let refused_with = |token: &str| {
        let mut register = register_frame(&["work"]);
        register.protocol_version = 2;
        register.auth_token = token.to_owned();
        let gateway = &gateway;
        async move {
            let mut raw = Raw::connect(gateway).await;
            raw.send_control(switchyard_proto::v1::quic_control_up::Frame::Register(
                register,
            ))
            .await;
            raw.closed().await.0
        }
    };
    assert_eq!(refused_with("bad").await, ErrorCode::Unauthenticated);
    // Control: the same wrong version with a good token is refused for the version.
    assert_eq!(refused_with("good").await, ErrorCode::UnsupportedVersion);
    assert!(gateway.registry().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_registers_is_closed_at_the_deadline() {
    let config = QuicServerConfig {
        registration_timeout: Duration::from_millis(200),
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let raw = Raw::connect(&gateway).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::RegistrationTimeout);
    assert!(reason.contains("200 ms"), "{reason}");
}

/// Lane 0 is opened by the gateway before it answers `registered`; a worker that grants no
/// bidirectional stream credit never gets it, and the registration deadline closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_granting_no_stream_credit_is_closed_at_the_registration_deadline() {
    let config = QuicServerConfig {
        registration_timeout: Duration::from_millis(300),
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let with_credit = |credit: u32| {
        let mut transport = quinn::TransportConfig::default();
        transport.max_concurrent_bidi_streams(quinn::VarInt::from_u32(credit));
        let mut client = crate::support::client_config(&gateway);
        client.transport_config(std::sync::Arc::new(transport));
        client
    };
    // Control: one stream of credit is enough to register.
    let mut granted = Raw::connect_with(&gateway, with_credit(1), None).await;
    granted.register(register_frame(&["work"])).await;
    assert_eq!(gateway.registry().len(), 1);

    let mut none = Raw::connect_with(&gateway, with_credit(0), None).await;
    none.send_control(switchyard_proto::v1::quic_control_up::Frame::Register(
        register_frame(&["work"]),
    ))
    .await;
    let (code, reason) = none.closed().await;
    assert_eq!(code, ErrorCode::RegistrationTimeout, "{reason}");
    assert!(reason.contains("300 ms"), "{reason}");
    assert_eq!(
        gateway.registry().len(),
        1,
        "only the control is registered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_connections_beyond_the_cap_are_refused_until_one_registers() {
    let config = QuicServerConfig {
        max_unregistered_connections: 1,
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let mut first = Raw::connect(&gateway).await;
    // The client's handshake ends before the server's: the gateway counts the connection
    // only once its side is through.
    eventually("the first connection is counted", || {
        gateway.server.unregistered_connections() == 1
    })
    .await;

    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let config = crate::support::client_config(&gateway);
    let refused = endpoint
        .connect_with(config.clone(), gateway.addr(), "localhost")
        .unwrap()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, quinn::ConnectionError::ConnectionClosed(close)
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED),
        "{refused}"
    );

    assert_eq!(
        gateway.server.unregistered_connections(),
        1,
        "a refusal holds nothing"
    );

    // Once the first registers it no longer counts, and a new connection gets in: the slot is
    // given back before the worker hears it is registered.
    first.register(register_frame(&["work"])).await;
    assert_eq!(gateway.server.unregistered_connections(), 0);
    let admitted = tokio::time::timeout(
        PATIENCE,
        endpoint
            .connect_with(config, gateway.addr(), "localhost")
            .unwrap(),
    )
    .await
    .unwrap();
    assert!(admitted.is_ok(), "{admitted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_core_deregisters_is_closed_with_deregistered() {
    let gateway = Gateway::start().await;
    let mut raw = Raw::connect(&gateway).await;
    let registered = raw.register(register_frame(&["work"])).await;
    let worker = switchyard_core::WorkerId::from_raw(registered.worker_id);
    gateway
        .registry()
        .deregister(worker, DisconnectReason::Timeout);
    let (code, reason) = closed_with(&raw.conn).await;
    assert_eq!(code, ErrorCode::Deregistered);
    assert!(reason.contains("timeout"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_alpn_or_none_fails_the_handshake_with_crypto_error_0x178() {
    use std::sync::Arc;

    let gateway = Gateway::start().await;
    let connect = |alpn: &[&[u8]]| {
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(gateway.ca.roots().unwrap())
        .with_no_client_auth();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let config = quinn::ClientConfig::new(Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
        ));
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let connecting = endpoint
            .connect_with(config, gateway.addr(), "localhost")
            .unwrap();
        async move { (connecting.await, endpoint) }
    };
    for (offered, alpn) in [("h3", &[b"h3".as_slice()][..]), ("no ALPN", &[])] {
        match connect(alpn).await.0 {
            Err(quinn::ConnectionError::ConnectionClosed(close)) => {
                assert_eq!(u64::from(close.error_code), 0x178, "{offered}: {close}");
            }
            other => panic!("{offered}: expected CRYPTO_ERROR 0x178, got {other:?}"),
        }
    }
    // Control: the protocol's ALPN gets through the handshake.
    assert!(
        connect(&[switchyard_transport_quic::ALPN]).await.0.is_ok(),
        "the right ALPN connects"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_announced_without_stream_credit_has_its_own_standing() {
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let mut config = crate::support::client_config(&gateway);
    let mut transport = quinn::TransportConfig::default();
    // Credit for lane 0 only, as the protocol asks before capacity is announced.
    transport.max_concurrent_bidi_streams(quinn::VarInt::from_u32(1));
    config.transport_config(std::sync::Arc::new(transport));
    let mut raw = Raw::connect_with(&gateway, config, None).await;
    let registered = raw.register(register_frame(&["work"])).await;
    let worker = switchyard_core::WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "probation lifted",
        |e| matches!(e, WorkerEvent::ProbationPassed { worker: w } if *w == worker),
    )
    .await;
    // Three slots announced, but the stream limit left at the one lane 0 took.
    raw.send_control(switchyard_proto::v1::quic_control_up::Frame::Capabilities(
        switchyard_proto::v1::QuicCapabilities { max_concurrency: 3 },
    ))
    .await;
    crate::support::eventually("awaiting streams", || {
        gateway.census("work").awaiting_streams == 1
    })
    .await;
    let census = gateway.census("work");
    assert_eq!(
        census.capacity_unannounced, 0,
        "not unannounced: {census:?}"
    );
    let explained = gateway
        .registry()
        .explain(crate::support::NS, "", "work", None);
    assert_eq!(
        explained[0].eligibility,
        switchyard_core::Eligibility::AwaitingStreams { announced: 3 }
    );
    let sentence = census.describe().unwrap();
    assert!(
        sentence.contains("cannot carry tasks yet (no stream credit granted)"),
        "{sentence}"
    );
    let outcome = gateway
        .dispatch_with(request("work", b"x", Duration::from_millis(300)))
        .await;
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::AwaitingStreams,
                ..
            }
        ),
        "{outcome:?}"
    );

    // Control: granting the credit lets the lanes open and the capacity take effect.
    raw.conn
        .set_max_concurrent_bi_streams(quinn::VarInt::from_u32(3));
    event(
        &mut events,
        "capacity 3",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, capacity: 3 } if *w == worker),
    )
    .await;
    assert_eq!(gateway.census("work").eligible, 1);
    assert_eq!(gateway.census("work").awaiting_streams, 0);
}

/// A refusal is the connection's close, sent while the gateway's side of the control stream is
/// still open: a worker reading that stream for its answer meets the close and its reason,
/// never a clean end it could only take for a broken gateway. The window this closes is a race
/// (the stream's end could go out just before the close), so each kind of refusal is tried
/// many times: one a frame causes, one of core's gate, and the deadline striking mid-frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_ends_the_control_stream_with_the_close_never_a_clean_end() {
    const TRIES: usize = 40;
    let config = QuicServerConfig {
        registration_timeout: Duration::from_millis(100),
        ..QuicServerConfig::default()
    };
    let tokens = CallerTable::new().with_token("good", CallerIdentity::granted("team", [NS]));
    let gateway = Gateway::with(config, tokens).await;
    let mut clean_ends = Vec::new();
    for attempt in 0..TRIES {
        for expected in [
            ErrorCode::UnsupportedVersion,
            ErrorCode::NamespaceNotGranted,
            ErrorCode::RegistrationTimeout,
        ] {
            let mut raw = Raw::connect(&gateway).await;
            let mut register = register_frame(&["work"]);
            register.auth_token = "good".to_owned();
            match expected {
                ErrorCode::UnsupportedVersion => register.protocol_version = 2,
                ErrorCode::NamespaceNotGranted => register.namespaces = vec!["other".to_owned()],
                _ => {}
            }
            if expected == ErrorCode::RegistrationTimeout {
                // A length prefix and no body: the gateway has the stream and waits for the rest.
                raw.send_control_bytes(&[0, 0, 0, 9]).await;
            } else {
                raw.send_control(quic_control_up::Frame::Register(register))
                    .await;
            }
            match raw.control_stream_end().await {
                Err(quinn::ReadError::ConnectionLost(ConnectionError::ApplicationClosed(
                    close,
                ))) => assert_eq!(
                    close.error_code,
                    expected.var_int(),
                    "attempt {attempt}: {:?}",
                    String::from_utf8_lossy(&close.reason)
                ),
                other => clean_ends.push(format!("attempt {attempt}, {expected:?}: {other:?}")),
            }
        }
    }
    assert!(clean_ends.is_empty(), "{clean_ends:#?}");
    // Control: the same stream of an admitted worker carries `registered`.
    let mut admitted = Raw::connect(&gateway).await;
    let mut register = register_frame(&["work"]);
    register.auth_token = "good".to_owned();
    admitted.register(register).await;
    assert_eq!(gateway.registry().len(), 1);
}
