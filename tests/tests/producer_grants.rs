//! Producers are authenticated like workers and reach only the namespaces they are granted.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use switchyard_core::CallerIdentity;
use switchyard_gateway::PrincipalSection;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{ScriptedTransport, TestGateway, registration};
use tonic::Code;

fn principal(name: &str, token: &str, namespaces: &[&str]) -> PrincipalSection {
    PrincipalSection {
        name: name.to_owned(),
        token: token.to_owned(),
        cert_subject: String::new(),
        namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
        ..PrincipalSection::default()
    }
}

fn echo(namespace: &str) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: namespace.to_owned(),
        activity_type: "echo".to_owned(),
        input: Bytes::from_static(b"hello"),
        timeout_ms: 10_000,
        ..pb::DispatchRequest::default()
    }
}

async fn gateway_with_workers() -> (TestGateway, Vec<tokio::task::JoinHandle<()>>) {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.principals = vec![
                principal("billing", "t-billing", &["billing"]),
                principal("ops", "t-ops", &["*"]),
            ];
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let mut workers = Vec::new();
    for namespace in ["billing", "payroll"] {
        let worker = scripted
            .connect(
                &CallerIdentity::trusted("test"),
                registration(&[namespace], &["echo"], Some(4)),
                true,
            )
            .await
            .expect("admitted");
        workers.push(worker.serve_echo());
    }
    (gateway, workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_dispatches_only_into_granted_namespaces() {
    let (gateway, workers) = gateway_with_workers().await;
    let mut billing = gateway.client(Some("t-billing")).await;

    let granted = billing.dispatch(echo("billing")).await.expect("granted");
    let outcome = granted.into_inner().outcome.and_then(|o| o.outcome);
    assert!(
        matches!(&outcome, Some(Outcome::Completed(done)) if done.output == "hello"),
        "{outcome:?}"
    );

    let refused = billing.dispatch(echo("payroll")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("payroll"),
        "{}",
        refused.message()
    );

    // Control: a principal granted every namespace reaches the payroll worker.
    let mut ops = gateway.client(Some("t-ops")).await;
    let outcome = ops
        .dispatch(echo("payroll"))
        .await
        .expect("granted")
        .into_inner();
    assert!(matches!(
        outcome.outcome.and_then(|o| o.outcome),
        Some(Outcome::Completed(_))
    ));
    workers.iter().for_each(|w| w.abort());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_a_known_credential_are_unauthenticated() {
    let (gateway, workers) = gateway_with_workers().await;
    for token in [None, Some("guessed")] {
        let mut client = gateway.client(token).await;
        let refused = client.dispatch(echo("billing")).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "token {token:?}");
        let listed = client
            .list_workers(pb::ListWorkersRequest::default())
            .await
            .unwrap_err();
        assert_eq!(listed.code(), Code::Unauthenticated);
    }
    workers.iter().for_each(|w| w.abort());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_views_are_limited_to_granted_namespaces() {
    let (gateway, workers) = gateway_with_workers().await;
    let mut billing = gateway.client(Some("t-billing")).await;
    let listed = billing
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("listed")
        .into_inner();
    let namespaces: Vec<_> = listed
        .workers
        .iter()
        .flat_map(|w| w.namespaces.clone())
        .collect();
    assert_eq!(namespaces, vec!["billing".to_owned()]);

    let denied = billing
        .describe_pool(pb::DescribePoolRequest {
            namespace: "payroll".to_owned(),
            activity_type: "echo".to_owned(),
            ..pb::DescribePoolRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    // Watching is answered, with only the granted namespaces' events: see
    // `roles_and_ownership.rs` `watching_shows_only_the_workers_of_granted_namespaces`.
    billing
        .watch_events(pb::WatchEventsRequest {})
        .await
        .expect("a principal granted some namespaces watches them");

    let mut ops = gateway.client(Some("t-ops")).await;
    let all = ops
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("listed")
        .into_inner();
    assert_eq!(all.workers.len(), 2);
    workers.iter().for_each(|w| w.abort());
}
