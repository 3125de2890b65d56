//! A frame larger than a lane carries is refused at once, by name, and harms no connection.

use std::time::Duration;

use bytes::Bytes;
use switchyard_auth::AllowAll;
use switchyard_core::{ActivityOutcome, CallerIdentity, DispatchError};
use switchyard_transport_quic::{ActivityContext, ActivityError, FrameLimits, QuicServerConfig};

use crate::support::{Gateway, PATIENCE, eventually, request};

const LANE_LIMIT: u32 = 1024;

async fn small_lanes() -> Gateway {
    let config = QuicServerConfig {
        frames: FrameLimits {
            lane: LANE_LIMIT,
            ..FrameLimits::default()
        },
        ..QuicServerConfig::default()
    };
    Gateway::with(config, AllowAll).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_larger_than_the_lane_limit_is_refused_at_once_and_the_worker_stays() {
    let gateway = small_lanes().await;
    let worker = gateway.worker().connect().await.unwrap();
    let id = worker.worker_id();
    tokio::spawn(worker.run());
    eventually("eligible", || gateway.census("echo").eligible == 1).await;
    let mut big = request("echo", b"", PATIENCE);
    big.input = Bytes::from(vec![7u8; 2000]);
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        gateway
            .core
            .dispatcher()
            .dispatch(&CallerIdentity::trusted("test"), big),
    )
    .await
    .expect("refused at once, not spun until the deadline");
    match refused {
        Err(DispatchError::InputTooLarge { size, limit }) => {
            assert_eq!(size, 2000);
            assert!(
                limit < LANE_LIMIT as usize,
                "the input limit left by framing: {limit}"
            );
        }
        other => panic!("expected InputTooLarge, got {other:?}"),
    }
    // Control: the same worker still serves a task that fits.
    assert!(gateway.registry().worker(id).is_some(), "the worker stayed");
    assert_eq!(
        gateway.dispatch("echo", b"fits").await,
        ActivityOutcome::Completed("fits".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_larger_than_the_lane_limit_fails_naming_the_limit() {
    let gateway = small_lanes().await;
    let worker = gateway
        .worker()
        .activity("grow", |_ctx: ActivityContext, input: Bytes| async move {
            let size = if &input[..] == b"big" { 4000 } else { 10 };
            Ok::<_, ActivityError>(Bytes::from(vec![1u8; size]))
        })
        .connect()
        .await
        .unwrap();
    tokio::spawn(worker.run());
    eventually("eligible", || gateway.census("grow").eligible == 1).await;
    match gateway.dispatch("grow", b"big").await {
        ActivityOutcome::Failed { message, retryable } => {
            assert!(!retryable, "sending it again cannot help");
            assert!(
                message.contains(&format!("frame limit of {LANE_LIMIT} bytes")),
                "{message}"
            );
        }
        other => panic!("expected a failure naming the limit, got {other:?}"),
    }
    // Control: a result that fits goes through on the same connection.
    assert_eq!(
        gateway.dispatch("grow", b"small").await,
        ActivityOutcome::Completed(Bytes::from(vec![1u8; 10]))
    );
}
