//! What a worker in any language may ask of the gateway on its stream: to be drained, and a new
//! capacity; driven over raw generated-client frames as a non-Rust worker would send them.
#![allow(clippy::unwrap_used, clippy::panic)]

use switchyard_core::{DisconnectReason, Registry};
use switchyard_proto::v1::{
    CapacityUpdate, WorkerDrainRequest, drain_request, gateway_frame, worker_frame,
};
use tonic::Code;

use crate::support::{Gateway, TRUSTED_TOKEN, frame, open, register};

#[tokio::test]
async fn a_drain_request_is_answered_with_a_requested_drain_and_a_clean_end() {
    let gateway = Gateway::start().await;
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let mut events = gateway.core.registry().subscribe_events();
    let worker = stream.register(register(&["ns"], &["echo"], Some(2))).await;
    // Control: registered and serving before it asks.
    assert!(gateway.core.registry().is_registered(worker));

    stream
        .send(frame(worker_frame::Frame::DrainRequest(
            WorkerDrainRequest {},
        )))
        .await;
    match stream.next_non_ping().await {
        Ok(Some(gateway_frame::Frame::Drain(drain))) => {
            assert_eq!(drain.reason(), drain_request::Reason::Requested);
        }
        other => panic!("expected a drain, got {other:?}"),
    }
    // Holding nothing, the worker's stream ends OK and the worker is gone.
    assert!(matches!(stream.next_non_ping().await, Ok(None)));
    assert_eq!(
        crate::support::disconnected(&mut events, worker).await,
        DisconnectReason::Drained
    );
}

#[tokio::test]
async fn a_capacity_update_applies_and_one_over_the_ceiling_ends_the_stream_naming_it() {
    let gateway = Gateway::builder()
        .registry(Registry::builder().max_concurrency_limit(8))
        .start()
        .await;
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let worker = stream.register(register(&["ns"], &["echo"], Some(2))).await;
    let mut events = gateway.core.registry().subscribe_events();

    let update = |max_concurrency| {
        frame(worker_frame::Frame::Capacity(CapacityUpdate {
            max_concurrency,
        }))
    };
    stream.send(update(6)).await;
    crate::support::within("the capacity event", async {
        loop {
            if let switchyard_core::WorkerEvent::CapacityAnnounced {
                worker: w,
                capacity: 6,
            } = events.recv().await.unwrap()
            {
                assert_eq!(w, worker);
                break;
            }
        }
    })
    .await;
    assert_eq!(
        gateway.core.registry().worker(worker).unwrap().capacity,
        Some(6)
    );

    stream.send(update(9)).await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains('8'), "{}", status.message());
    crate::support::disconnected(&mut events, worker).await;
}
