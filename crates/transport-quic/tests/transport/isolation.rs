//! Lanes are independent: a lane held back by flow control does not hold up the others.

use std::sync::Arc;

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, WorkerEvent};
use switchyard_proto::v1::{QuicResult, quic_lane_up, quic_result};

use crate::support::{
    Gateway, PATIENCE, Raw, STALL_ABOVE, Stall, client_config, event, register_frame, request,
};

const BIG: usize = 256 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_held_back_by_flow_control_does_not_hold_up_the_others() {
    let gateway = Arc::new(Gateway::start().await);
    let mut events = gateway.registry().subscribe_events();
    // A 4 KiB stream window: a lane whose reader stops can hold no more than that in flight.
    let mut config = client_config(&gateway);
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(4096));
    config.transport_config(Arc::new(transport));
    let stall = Arc::new(Stall::default());
    let mut raw = Raw::connect_with(&gateway, config, Some(Arc::clone(&stall))).await;
    let registered = raw.register(register_frame(&["work"])).await;
    raw.announce(2).await;
    let id = switchyard_core::WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "capacity 2",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker, capacity: 2 } if *worker == id),
    )
    .await;

    let mut big_request = request("work", b"", PATIENCE);
    big_request.input = Bytes::from(vec![0xa5; BIG]);
    let big = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch_with(big_request).await }
    });
    tokio::time::timeout(PATIENCE, stall.stalled.notified())
        .await
        .expect("the big task never started arriving");

    // Its lane is stuck behind flow control; a small task takes the other lane meanwhile.
    let small = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"small").await }
    });
    let (lane, task) = raw.next_task().await;
    assert_eq!(&task.input[..], b"small", "the small task arrived first");
    answer(&lane, task.task_id, "small done").await;
    assert_eq!(
        small.await.unwrap(),
        ActivityOutcome::Completed("small done".into())
    );
    assert!(!big.is_finished());

    // Released, the big task arrives whole and in order.
    stall.release.add_permits(1);
    let (lane, task) = raw.next_task().await;
    assert_eq!(task.input.len(), BIG);
    assert!(task.input.len() > STALL_ABOVE);
    assert!(task.input.iter().all(|b| *b == 0xa5));
    answer(&lane, task.task_id, "big done").await;
    assert_eq!(
        big.await.unwrap(),
        ActivityOutcome::Completed("big done".into())
    );
}

async fn answer(lane: &crate::support::RawLane, task_id: u64, output: &'static str) {
    lane.send(quic_lane_up::Frame::Result(QuicResult {
        task_id,
        outcome: Some(quic_result::Outcome::Output(output.into())),
    }))
    .await;
}
