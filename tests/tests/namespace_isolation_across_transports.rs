//! Namespaces isolate across transports: a dispatch reaches only workers of its namespace,
//! whichever transport they use, and a worker's principal can only register into the
//! namespaces it is granted, on gRPC and on QUIC alike.

use bytes::Bytes;
use switchyard_gateway::PrincipalSection;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{TestGateway, WorkerSpec, grpc_worker, quic_worker, wait_eligible};

fn principal(name: &str, token: &str, namespaces: &[&str]) -> PrincipalSection {
    PrincipalSection {
        name: name.to_owned(),
        token: token.to_owned(),
        cert_subject: String::new(),
        namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
        ..PrincipalSection::default()
    }
}

fn spec(namespace: &str, token: &str) -> WorkerSpec {
    WorkerSpec {
        token: Some(token.to_owned()),
        ..WorkerSpec::new(namespace, "echo")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatches_and_registrations_stay_inside_their_namespace() {
    let gateway = TestGateway::start(|config| {
        config.principals = vec![
            principal("team-a", "t-a", &["alpha"]),
            principal("team-b", "t-b", &["beta"]),
            principal("producer", "t-p", &["*"]),
        ];
    })
    .await;
    let alpha = grpc_worker(&gateway, &spec("alpha", "t-a"))
        .await
        .expect("team-a on gRPC");
    let beta = quic_worker(&gateway, &spec("beta", "t-b"))
        .await
        .expect("team-b on QUIC");
    wait_eligible(&gateway, "alpha", "echo", 1).await;
    wait_eligible(&gateway, "beta", "echo", 1).await;

    let mut client = gateway.client(Some("t-p")).await;
    for (namespace, transport) in [("alpha", "grpc"), ("beta", "quic")] {
        for _ in 0..10 {
            let reply = client
                .dispatch(pb::DispatchRequest {
                    namespace: namespace.to_owned(),
                    activity_type: "echo".to_owned(),
                    input: Bytes::from_static(b"x"),
                    timeout_ms: 10_000,
                    ..pb::DispatchRequest::default()
                })
                .await
                .expect("dispatched")
                .into_inner();
            match reply.outcome.and_then(|o| o.outcome) {
                Some(Outcome::Completed(done)) => assert_eq!(done.output, transport.as_bytes()),
                other => panic!("{namespace}: {other:?}"),
            }
        }
    }
    assert_eq!((alpha.served(), beta.served()), (10, 10));

    // Crossing over is refused at the gate, whichever transport tries.
    let refused = grpc_worker(&gateway, &spec("beta", "t-a"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("beta"), "{refused}");
    let refused = quic_worker(&gateway, &spec("alpha", "t-b"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("alpha"), "{refused}");
    assert_eq!(
        gateway.gateway().core().registry().len(),
        2,
        "nothing else registered"
    );

    // A namespace nobody serves stays unserved even though both transports have workers.
    let reply = client
        .dispatch(pb::DispatchRequest {
            namespace: "gamma".to_owned(),
            activity_type: "echo".to_owned(),
            timeout_ms: 200,
            ..pb::DispatchRequest::default()
        })
        .await
        .expect("dispatched")
        .into_inner();
    assert!(matches!(
        reply.outcome.and_then(|o| o.outcome),
        Some(Outcome::Unserved(u)) if u.reason == pb::UnservedReason::NoWorkers as i32
    ));
    alpha.stop();
    beta.stop();
}
