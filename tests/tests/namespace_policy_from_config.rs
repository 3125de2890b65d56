//! `namespaces.policy = "closed"` and `namespaces.known[].pinned`, set in the gateway's
//! configuration, are enforced at registration over gRPC, with the status a worker in any
//! language reads (`docs/configuration.md`, `[namespaces]`).
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use switchyard_gateway::{NamespacePolicyName, NamespaceSection};
use switchyard_proto::v1 as pb;
use switchyard_tests::{RawGrpcWorker, TestGateway, raw_registration};
use tonic::{Code, Status};

/// A registration for `namespace` from a worker on `node` ("" for none).
fn on_node(namespace: &str, node: &str) -> pb::WorkerFrame {
    let mut frame = raw_registration(namespace, "work", 1);
    if let Some(pb::worker_frame::Frame::Register(register)) = frame.frame.as_mut() {
        register.node = node.to_owned();
    }
    frame
}

/// What the gateway answers to `frame` on a fresh stream, and the stream (an admitted worker
/// stays registered while it is open).
async fn register(
    gateway: &TestGateway,
    frame: pb::WorkerFrame,
) -> (RawGrpcWorker, Result<u64, Status>) {
    let mut worker = RawGrpcWorker::open(gateway)
        .await
        .expect("the stream opens");
    let answer = worker.try_register(frame).await.map(|ack| ack.worker_id);
    (worker, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_policy_and_a_pinned_namespace_from_the_configuration_refuse_by_status() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.namespaces.policy = NamespacePolicyName::Closed;
        config.namespaces.known = vec![
            NamespaceSection {
                name: "billing".to_owned(),
                ..NamespaceSection::default()
            },
            NamespaceSection {
                name: "edge".to_owned(),
                pinned: vec!["n1".to_owned()],
                ..NamespaceSection::default()
            },
        ];
    })
    .await;
    let unknown = register(&gateway, on_node("other", ""))
        .await
        .1
        .expect_err("a namespace the closed policy does not know");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert!(
        unknown
            .message()
            .contains("does not exist and the namespace policy is closed"),
        "{unknown:?}"
    );
    for node in ["", "n2"] {
        let misplaced = register(&gateway, on_node("edge", node))
            .await
            .1
            .expect_err("a worker off the pinned node");
        assert_eq!(misplaced.code(), Code::FailedPrecondition, "{misplaced:?}");
        assert!(
            misplaced.message().contains("pinned to nodes [n1]"),
            "{misplaced:?}"
        );
    }
    assert!(gateway.gateway().core().registry().is_empty());
    // Control: a listed namespace, and the pinned one from its node, are admitted.
    let (_billing, known) = register(&gateway, on_node("billing", "")).await;
    known.expect("a known namespace");
    let (_edge, pinned) = register(&gateway, on_node("edge", "n1")).await;
    pinned.expect("the pinned node");
    assert_eq!(gateway.gateway().core().registry().len(), 2);
}
