//! Bad input on the gRPC worker wire that the SDK never sends, put there by a raw client
//! through the whole gateway: each gets a refusal, leaves the registry as it was (or removes
//! only the offender), and a healthy worker next to it goes on serving.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, Eligibility, RefusedCounts, WorkerId,
};
use switchyard_proto::v1 as pb;
use switchyard_tests::{
    RawEnd, RawGrpcWorker, TestGateway, WorkerSpec, grpc_worker, pong, raw_registration, success,
    wait_eligible,
};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(10);

/// A gateway with one healthy SDK worker serving `ok/work`.
async fn gateway_with_a_healthy_worker(
    configure: impl FnOnce(&mut switchyard_gateway::GatewayConfig),
) -> (TestGateway, switchyard_tests::RunningWorker) {
    let gateway = TestGateway::start(configure).await;
    let healthy = grpc_worker(&gateway, &WorkerSpec::new("ok", "work"))
        .await
        .expect("healthy worker registers");
    wait_eligible(&gateway, "ok", "work", 1).await;
    (gateway, healthy)
}

fn registered(gateway: &TestGateway) -> BTreeSet<WorkerId> {
    gateway
        .gateway()
        .core()
        .registry()
        .workers()
        .iter()
        .map(|w| w.worker.id())
        .collect()
}

async fn healthy_still_serves(gateway: &TestGateway) {
    let outcome = gateway
        .gateway()
        .core()
        .dispatcher()
        .dispatch(&CallerIdentity::trusted("producer"), request("work"))
        .await
        .expect("dispatch accepted");
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"grpc"))
    );
}

fn request(activity: &str) -> ActivityRequest {
    ActivityRequest {
        namespace: "ok".to_owned(),
        task_queue: String::new(),
        activity_type: activity.to_owned(),
        node: None,
        input: Bytes::from_static(b"in"),
        activity_id: None,
        timeout: Duration::from_secs(20),
    }
}

fn length_delimited(buf: &mut BytesMut, field: u8, bytes: &[u8]) {
    buf.put_u8(field << 3 | 2);
    buf.put_u8(u8::try_from(bytes.len()).expect("short field"));
    buf.put_slice(bytes);
}

/// The stream ended (with any status): the offender is out.
fn assert_ended(end: &RawEnd, what: &str) {
    assert!(
        matches!(end, RawEnd::Status(_)),
        "{what}: the stream stayed open"
    );
}

/// The stream ended with `code` and a message starting with `prefix`.
fn assert_refused(end: RawEnd, code: Code, prefix: &str, what: &str) {
    match end {
        RawEnd::Status(status) => assert!(
            status.code() == code && status.message().starts_with(prefix),
            "{what}: ended with {status:?}, expected {code:?} \"{prefix}…\""
        ),
        RawEnd::StillOpen => panic!("{what}: the stream stayed open"),
    }
}

async fn invalid_utf8_registration() -> RawEnd {
    let (gateway, _healthy) = gateway_with_a_healthy_worker(|_| {}).await;
    let before = registered(&gateway);

    // RegisterWorker { namespaces: [0xC3 0x28], activity_types: ["work"], max_concurrency: 1 }
    let mut register = BytesMut::new();
    length_delimited(&mut register, 1, &[0xC3, 0x28]);
    length_delimited(&mut register, 4, b"work");
    register.put_slice(&[6 << 3, 1]);
    let mut frame = BytesMut::new();
    length_delimited(&mut frame, 1, &register);

    let mut raw = RawGrpcWorker::open(&gateway).await.expect("call opens");
    raw.send_raw(frame.freeze()).await;
    let end = raw.end(WAIT).await;
    assert_ended(&end, "invalid UTF-8 namespace");
    assert_eq!(registered(&gateway), before, "the registry changed");
    healthy_still_serves(&gateway).await;
    end
}

async fn malformed_frame_after_registration() -> RawEnd {
    let (gateway, healthy) = gateway_with_a_healthy_worker(|_| {}).await;
    let before = registered(&gateway);
    let mut raw = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let id = raw.register(raw_registration("ok", "other", 1)).await;
    assert!(
        gateway
            .gateway()
            .core()
            .registry()
            .is_registered(WorkerId::from_raw(id))
    );

    // A truncated varint tag: not a protobuf message at all.
    raw.send_raw(Bytes::from_static(&[0xFF, 0xFF, 0xFF])).await;
    let end = raw.end(WAIT).await;
    assert_ended(&end, "malformed frame");
    wait_until_registered(&gateway, &before).await;
    assert!(
        gateway
            .gateway()
            .core()
            .registry()
            .is_registered(healthy.id)
    );
    healthy_still_serves(&gateway).await;
    end
}

async fn oversized_frame() -> RawEnd {
    let (gateway, healthy) = gateway_with_a_healthy_worker(|config| {
        config.grpc.max_message_size = 64 * 1024;
    })
    .await;
    let before = registered(&gateway);
    let mut raw = RawGrpcWorker::open(&gateway).await.expect("call opens");
    raw.register(raw_registration("ok", "other", 1)).await;

    let oversized = pb::WorkerFrame {
        frame: Some(pb::worker_frame::Frame::Result(pb::ActivityResult {
            task_id: 1,
            outcome: Some(pb::activity_result::Outcome::Output(Bytes::from(vec![
                0u8;
                128 * 1024
            ]))),
        })),
    };
    raw.send(oversized).await;
    let end = raw.end(WAIT).await;
    assert_ended(&end, "oversized frame");
    wait_until_registered(&gateway, &before).await;
    assert!(
        gateway
            .gateway()
            .core()
            .registry()
            .is_registered(healthy.id)
    );
    healthy_still_serves(&gateway).await;
    end
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_result_is_refused_and_the_dispatch_ends_once() {
    let (gateway, _healthy) = gateway_with_a_healthy_worker(|_| {}).await;
    let mut raw = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let id = WorkerId::from_raw(raw.register(raw_registration("ok", "dup", 2)).await);
    // The dispatch waits out the probation the raw worker passes while it reads.
    let core = gateway.gateway().core().clone();
    let dispatch = tokio::spawn({
        let core = core.clone();
        async move {
            core.dispatcher()
                .dispatch(&CallerIdentity::trusted("producer"), request("dup"))
                .await
        }
    });
    let task = match raw.next_frame().await {
        Ok(Some(pb::gateway_frame::Frame::Task(task))) => task,
        other => panic!("expected a task, got {other:?}"),
    };
    raw.send(success(task.task_id, b"first")).await;
    raw.send(success(task.task_id, b"second")).await;
    let outcome = dispatch
        .await
        .expect("dispatch task")
        .expect("dispatch accepted");
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"first"))
    );
    // Frames of one stream are handled in order: a second task completing proves the
    // duplicate was processed (refused) and the stream survived it.
    let second = tokio::spawn({
        let core = core.clone();
        async move {
            core.dispatcher()
                .dispatch(&CallerIdentity::trusted("producer"), request("dup"))
                .await
        }
    });
    let task = match raw.next_frame().await {
        Ok(Some(pb::gateway_frame::Frame::Task(task))) => task,
        other => panic!("expected a task, got {other:?}"),
    };
    raw.send(success(task.task_id, b"again")).await;
    assert_eq!(
        second.await.expect("dispatch task").expect("accepted"),
        ActivityOutcome::Completed(Bytes::from_static(b"again"))
    );
    let refused = core.dispatcher().refused();
    assert_eq!(
        refused.unknown + refused.foreign + refused.late,
        1,
        "the duplicate was counted once: {refused:?}"
    );
    assert_ne!(refused, RefusedCounts::default());
    assert!(core.registry().is_registered(id));
    healthy_still_serves(&gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pongs_with_the_wrong_sequence_never_make_a_worker_eligible() {
    let (gateway, healthy) = gateway_with_a_healthy_worker(|_| {}).await;
    let registry = gateway.gateway().core().registry().clone();
    let mut raw = RawGrpcWorker::open(&gateway).await.expect("call opens");
    raw.send(raw_registration("ok", "work", 4)).await;
    let id = match raw.next_any().await {
        Ok(Some(pb::gateway_frame::Frame::RegisterAck(ack))) => WorkerId::from_raw(ack.worker_id),
        other => panic!("expected an acknowledgement, got {other:?}"),
    };
    // Answer every ping, always with a sequence the gateway never sent: past the probation
    // pings and the miss threshold (2 + 3 with the defaults) and some more.
    let mut pings = 0;
    let mut tasks = 0;
    tokio::time::timeout(Duration::from_secs(20), async {
        while pings < 8 {
            match raw.next_any().await {
                Ok(Some(pb::gateway_frame::Frame::Ping(ping))) => {
                    pings += 1;
                    raw.send(pong(ping.seq.wrapping_add(1_000_000))).await;
                }
                Ok(Some(pb::gateway_frame::Frame::Task(_))) => tasks += 1,
                Ok(Some(_)) => {}
                other => panic!("the stream ended: {other:?}"),
            }
        }
    })
    .await
    .expect("pings keep coming");
    let standing = registry.worker(id).map(|w| w.eligibility);
    assert!(
        matches!(&standing, Some(e) if *e != Eligibility::Eligible),
        "a worker answering with wrong sequences became {standing:?}"
    );
    assert_eq!(
        registry.pool_census("ok", "", "work", None).eligible,
        1,
        "only the healthy worker is eligible"
    );
    for _ in 0..4 {
        healthy_still_serves(&gateway).await;
    }
    // Anything sent to it meanwhile is ahead of the next pings on its stream.
    let mut more = 0;
    while more < 2 {
        match raw.next_any().await {
            Ok(Some(pb::gateway_frame::Frame::Ping(ping))) => {
                more += 1;
                raw.send(pong(ping.seq.wrapping_add(1_000_000))).await;
            }
            Ok(Some(pb::gateway_frame::Frame::Task(_))) => tasks += 1,
            Ok(Some(_)) => {}
            other => panic!("the stream ended: {other:?}"),
        }
    }
    assert_eq!(tasks, 0, "the unproven worker was sent tasks");
    assert!(registry.is_registered(healthy.id));
}

async fn wait_until_registered(gateway: &TestGateway, expected: &BTreeSet<WorkerId>) {
    let settled = tokio::time::timeout(WAIT, async {
        loop {
            if registered(gateway) == *expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "registry {:?}, expected {expected:?}",
        registered(gateway)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_in_a_registration_name_is_refused_and_nothing_registers() {
    invalid_utf8_registration().await;
}

/// Regression for finding F1: a register message that fails to decode gets INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_registration_gets_a_named_status() {
    assert_refused(
        invalid_utf8_registration().await,
        Code::InvalidArgument,
        "malformed frame: ",
        "invalid UTF-8 namespace",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_after_registration_ends_only_that_workers_stream() {
    malformed_frame_after_registration().await;
}

/// Regression for finding F1: a frame that fails to decode gets INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frame_after_registration_gets_a_named_status() {
    assert_refused(
        malformed_frame_after_registration().await,
        Code::InvalidArgument,
        "malformed frame: ",
        "malformed frame",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_ends_only_that_workers_stream() {
    oversized_frame().await;
}

/// Regression for finding F1: a message over grpc.max_message_size gets RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_gets_a_named_status() {
    assert_refused(
        oversized_frame().await,
        Code::ResourceExhausted,
        "frame too large: ",
        "oversized frame",
    );
}
