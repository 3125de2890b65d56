//! `docs/architecture.md`, sessions: a session worker whose stream is lost is suspended for its
//! reconnect grace, and operators see it so: `/v1/workers` says `suspended` with the grace
//! left in `suspended_for_ms`, and `switchyard_workers_suspended` counts it; after its resume
//! neither does. A file of its own: the gauge is the process's metrics recorder's.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use serde_json::Value;
use switchyard_proto::v1 as pb;
use switchyard_tests::{RawGrpcWorker, TestGateway, counter, http_get, raw_registration};

const NAMESPACE: &str = "suspended";

/// The row of worker `id` on `/v1/workers`.
async fn row(ops: std::net::SocketAddr, id: u64) -> Value {
    let (status, body) = http_get(ops, "/v1/workers").await.unwrap();
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("worker {id} not listed: {body}"))
}

/// Reads worker `id`'s row until its standing is `standing`, within 10 s.
async fn standing(ops: std::net::SocketAddr, id: u64, standing: &str) -> Value {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let row = row(ops, id).await;
            if row["standing"] == standing {
                return row;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("worker {id} never {standing}"))
}

async fn suspended_gauge(ops: std::net::SocketAddr) -> u64 {
    counter(ops, "switchyard_workers_suspended", "")
        .await
        .expect("/metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_worker_is_listed_suspended_and_counted_until_it_resumes() {
    let gateway = TestGateway::start(|config| config.quic.enabled = false).await;
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    let mut register = raw_registration(NAMESPACE, "work", 1);
    if let Some(pb::worker_frame::Frame::Register(frame)) = register.frame.as_mut() {
        frame.resumable = true;
    }
    let mut old = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let ack = old.try_register(register).await.expect("registered");
    let id = ack.worker_id;
    // Control: connected, it is not suspended and nothing is counted.
    let connected = row(ops, id).await;
    assert_ne!(connected["standing"], "suspended", "{connected}");
    assert_eq!(connected["suspended_for_ms"], Value::Null);
    assert_eq!(suspended_gauge(ops).await, 0);

    // The stream is lost: the worker is suspended for its grace (5 s by default).
    drop(old);
    let suspended = standing(ops, id, "suspended").await;
    let left = suspended["suspended_for_ms"]
        .as_u64()
        .expect("the grace left");
    assert!(left <= 5_000, "{suspended}");
    assert_eq!(suspended_gauge(ops).await, 1);

    // It resumes on a new stream: no longer suspended, no longer counted.
    let mut new = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let resumed = new
        .try_register(pb::WorkerFrame {
            frame: Some(pb::worker_frame::Frame::Resume(pb::ResumeWorker {
                session_id: ack.session_id,
                resume_secret: ack.resume_secret.clone(),
                running_task_ids: Vec::new(),
                unacked_task_ids: Vec::new(),
            })),
        })
        .await
        .expect("the session resumes");
    assert!(resumed.resumed);
    tokio::spawn(async move { new.end(Duration::from_secs(60)).await });
    let back = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let row = row(ops, id).await;
            if row["standing"] != "suspended" {
                return row;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("no longer suspended within 10 s");
    assert_eq!(back["suspended_for_ms"], Value::Null, "{back}");
    assert_eq!(suspended_gauge(ops).await, 0);
}
