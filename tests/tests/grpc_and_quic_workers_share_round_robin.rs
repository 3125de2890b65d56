//! A gRPC worker and a QUIC worker in the same pool share its dispatches in round-robin order:
//! the pool is one rotation whatever the transports.

use bytes::Bytes;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{TestGateway, WorkerSpec, grpc_worker, quic_worker, wait_eligible};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_dispatches_alternate_between_the_transports() {
    let gateway = TestGateway::start(|_| {}).await;
    let spec = WorkerSpec::new("shared", "echo");
    let grpc = grpc_worker(&gateway, &spec)
        .await
        .expect("gRPC worker registers");
    let quic = quic_worker(&gateway, &spec)
        .await
        .expect("QUIC worker registers");
    wait_eligible(&gateway, "shared", "echo", 2).await;

    let mut client = gateway.client(None).await;
    let mut served_by = Vec::new();
    for _ in 0..40 {
        let reply = client
            .dispatch(pb::DispatchRequest {
                namespace: "shared".to_owned(),
                activity_type: "echo".to_owned(),
                input: Bytes::from_static(b"x"),
                timeout_ms: 10_000,
                ..pb::DispatchRequest::default()
            })
            .await
            .expect("dispatched")
            .into_inner();
        match reply.outcome.and_then(|o| o.outcome) {
            Some(Outcome::Completed(done)) => {
                served_by.push(String::from_utf8(done.output.to_vec()).unwrap());
            }
            other => panic!("dispatch did not complete: {other:?}"),
        }
    }
    let grpc_count = served_by.iter().filter(|t| *t == "grpc").count();
    let quic_count = served_by.iter().filter(|t| *t == "quic").count();
    assert_eq!((grpc_count, quic_count), (20, 20), "{served_by:?}");
    assert!(
        served_by.windows(2).all(|pair| pair[0] != pair[1]),
        "round-robin alternates: {served_by:?}"
    );
    assert_eq!((grpc.served(), quic.served()), (20, 20));
    grpc.stop();
    quic.stop();
}
