//! The worker client: bounded concurrency, pings answered while busy, cancels reaching
//! handlers (running or still waiting), drain, stop, and how refusals and closes are reported.
// Helpers outside `#[test]` functions fail their test loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use serde_json::{Value, json};
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, DisconnectReason, WorkerEvent, WorkerId,
};
use switchyard_transport_websocket::client::{RunError, WsLinkError};
use switchyard_transport_websocket::{
    ActivityContext, ActivityError, CloseCode, WsServerConfig, WsWorker, WsWorkerBuilder,
};
use tokio::sync::{Notify, broadcast};

use crate::support::fake::{FakeGateway, task};
use crate::support::gateway::{NAMESPACE, TOKEN, TestGateway};
use crate::support::raw::{self, Raw, STEP};

fn builder(url: String) -> WsWorkerBuilder {
    WsWorker::builder(url).namespaces([NAMESPACE]).token(TOKEN)
}

async fn echo(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
    Ok(input)
}

fn request(input: &'static str) -> ActivityRequest {
    ActivityRequest {
        namespace: NAMESPACE.to_owned(),
        task_queue: String::new(),
        activity_type: "hold".to_owned(),
        node: None,
        input: Bytes::from_static(input.as_bytes()),
        activity_id: None,
        timeout: STEP,
    }
}

async fn departure(
    events: &mut broadcast::Receiver<WorkerEvent>,
    id: WorkerId,
) -> DisconnectReason {
    let wait = async {
        loop {
            if let WorkerEvent::Disconnected { worker, reason } = events.recv().await.unwrap() {
                if worker == id {
                    return reason;
                }
            }
        }
    };
    tokio::time::timeout(STEP, wait)
        .await
        .expect("the worker leaves within the step")
}

/// Reads worker frames on the fake gateway until `count` results or cancel acks arrived,
/// answering nothing; returns them.
async fn reports(socket: &mut Raw, count: usize) -> Vec<Value> {
    let mut seen = Vec::new();
    for _ in 0..1000 {
        if seen.len() == count {
            return seen;
        }
        let frame = raw::next(socket).await;
        if frame["type"] == "result" || frame["type"] == "cancel_ack" {
            seen.push(frame);
        }
    }
    panic!("only {} of {count} reports arrived", seen.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_runs_more_handlers_than_max_concurrency_even_if_over_delivered() {
    let fake = FakeGateway::bind().await;
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r, p) = (Arc::clone(&running), Arc::clone(&peak));
    let connecting = tokio::spawn(
        builder(fake.url())
            .max_concurrency(2)
            .activity("slow", move |_: ActivityContext, input: Bytes| {
                let (running, peak) = (Arc::clone(&r), Arc::clone(&p));
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok(input)
                }
            })
            .connect(),
    );
    let (mut socket, register) = fake.accept().await;
    assert_eq!(register["max_concurrency"], 2);
    assert_eq!(register["activity_types"], json!(["slow"]));
    let worker = connecting.await.unwrap().unwrap();
    let run = tokio::spawn(worker.run());
    for id in 1..=6 {
        raw::send(&mut socket, &task(id, "slow")).await;
    }
    let results = reports(&mut socket, 6).await;
    let ids: BTreeSet<String> = results
        .iter()
        .map(|r| r["task_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 6, "every task answered once: {results:?}");
    assert!(
        results
            .iter()
            .all(|r| r["type"] == "result" && r["output"] == "")
    );
    assert_eq!(peak.load(Ordering::SeqCst), 2, "two at once, never three");
    run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_are_answered_while_every_slot_is_busy() {
    let fake = FakeGateway::bind().await;
    let release = Arc::new(Notify::new());
    let gate = Arc::clone(&release);
    let connecting = tokio::spawn(
        builder(fake.url())
            .max_concurrency(1)
            .activity("hold", move |_: ActivityContext, input: Bytes| {
                let gate = Arc::clone(&gate);
                async move {
                    gate.notified().await;
                    Ok(input)
                }
            })
            .connect(),
    );
    let (mut socket, _) = fake.accept().await;
    let run = tokio::spawn(connecting.await.unwrap().unwrap().run());
    raw::send(&mut socket, &task(1, "hold")).await;
    raw::send(&mut socket, &json!({"type": "ping", "seq": "77"})).await;
    let pong = raw::next(&mut socket).await;
    assert_eq!(pong, json!({"type": "pong", "seq": "77"}));
    release.notify_one();
    let [result] = reports(&mut socket, 1).await.try_into().unwrap();
    assert_eq!(result["task_id"], "1");
    run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_reach_running_handlers_and_tasks_still_waiting_for_a_slot() {
    let fake = FakeGateway::bind().await;
    let (started, mut starts) = tokio::sync::mpsc::channel(4);
    let connecting = tokio::spawn(
        builder(fake.url())
            .max_concurrency(1)
            .activity("hold", move |ctx: ActivityContext, _: Bytes| {
                let started = started.clone();
                async move {
                    let _ = started.send(ctx.task_id().get()).await;
                    let _ = tokio::time::timeout(STEP, ctx.cancelled()).await;
                    Err(ActivityError::retryable("stopped"))
                }
            })
            .connect(),
    );
    let (mut socket, _) = fake.accept().await;
    let run = tokio::spawn(connecting.await.unwrap().unwrap().run());
    raw::send(&mut socket, &task(1, "hold")).await;
    let first = tokio::time::timeout(STEP, starts.recv()).await.unwrap();
    assert_eq!(first, Some(1));
    // Task 2 waits for task 1's slot; cancel it there first, then the running task 1.
    raw::send(&mut socket, &task(2, "hold")).await;
    raw::send(
        &mut socket,
        &json!({"type": "cancel", "task_id": "2", "reason": "requested"}),
    )
    .await;
    let [waiting] = reports(&mut socket, 1).await.try_into().unwrap();
    assert_eq!(waiting, json!({"type": "cancel_ack", "task_id": "2"}));
    raw::send(
        &mut socket,
        &json!({"type": "cancel", "task_id": "1", "reason": "requested"}),
    )
    .await;
    let [running] = reports(&mut socket, 1).await.try_into().unwrap();
    assert_eq!(running, json!({"type": "cancel_ack", "task_id": "1"}));
    assert!(
        starts.try_recv().is_err(),
        "the cancelled waiting task never ran"
    );
    run.abort();
}

#[tokio::test]
async fn failures_panics_and_unknown_activity_types_are_reported_as_failures() {
    let fake = FakeGateway::bind().await;
    let connecting = tokio::spawn(
        builder(fake.url())
            .activity("fail", |_: ActivityContext, _: Bytes| async {
                Err::<Bytes, _>(ActivityError::retryable("disk full"))
            })
            .activity("panic", |_: ActivityContext, _: Bytes| async {
                panic!("handler bug");
                #[allow(unreachable_code)]
                Ok(Bytes::new())
            })
            .connect(),
    );
    let (mut socket, _) = fake.accept().await;
    let run = tokio::spawn(connecting.await.unwrap().unwrap().run());
    raw::send(&mut socket, &task(1, "fail")).await;
    raw::send(&mut socket, &task(2, "panic")).await;
    raw::send(&mut socket, &task(3, "unserved")).await;
    let mut results = reports(&mut socket, 3).await;
    results.sort_by_key(|r| r["task_id"].as_str().unwrap().to_owned());
    let failures: Vec<&Value> = results.iter().map(|r| &r["failure"]).collect();
    assert_eq!(
        failures[0],
        &json!({"message": "disk full", "retryable": true})
    );
    assert_eq!(
        failures[1],
        &json!({"message": "activity handler panicked: handler bug", "retryable": false})
    );
    assert_eq!(
        failures[2],
        &json!({"message": "activity type \"unserved\" is not served here", "retryable": false})
    );
    run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_ok_once_a_drain_has_finished_in_flight_work() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let mut events = gateway.core.registry().subscribe_events();
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (s, r) = (Arc::clone(&started), Arc::clone(&release));
    let worker = builder(gateway.url())
        .activity("hold", move |_: ActivityContext, input: Bytes| {
            let (started, release) = (Arc::clone(&s), Arc::clone(&r));
            async move {
                started.notify_one();
                release.notified().await;
                Ok(input)
            }
        })
        .connect()
        .await
        .unwrap();
    let id = worker.worker_id();
    let run = tokio::spawn(worker.run());
    let core = gateway.core.clone();
    let dispatch = tokio::spawn(async move {
        core.dispatcher()
            .dispatch(&CallerIdentity::trusted("producer"), request("held"))
            .await
    });
    tokio::time::timeout(STEP, started.notified())
        .await
        .expect("the task starts");
    assert!(gateway.core.registry().drain_worker(id));
    assert!(!run.is_finished(), "a draining worker waits for its task");
    release.notify_one();
    let outcome = tokio::time::timeout(STEP, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"held"))
    );
    let ended = tokio::time::timeout(STEP, run).await.unwrap().unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(departure(&mut events, id).await, DisconnectReason::Drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_worker_cancels_its_handlers_and_its_task_moves_to_another_worker() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let mut events = gateway.core.registry().subscribe_events();
    let (handed, mut running) = tokio::sync::mpsc::channel(1);
    let stopping = builder(gateway.url())
        .max_concurrency(1)
        .activity("hold", move |ctx: ActivityContext, _: Bytes| {
            let handed = handed.clone();
            async move {
                let _ = handed.send(ctx.cancellation().clone()).await;
                let _ = tokio::time::timeout(STEP, ctx.cancelled()).await;
                Err(ActivityError::retryable("stopped"))
            }
        })
        .connect()
        .await
        .unwrap();
    let stopped_id = stopping.worker_id();
    let stop = stopping.shutdown_token();
    let run = tokio::spawn(stopping.run());
    let core = gateway.core.clone();
    let dispatch = tokio::spawn(async move {
        core.dispatcher()
            .dispatch(&CallerIdentity::trusted("producer"), request("move me"))
            .await
    });
    let cancellation = tokio::time::timeout(STEP, running.recv())
        .await
        .unwrap()
        .unwrap();
    let rescuer = builder(gateway.url())
        .activity("hold", echo)
        .connect()
        .await
        .unwrap();
    let rescuer_run = tokio::spawn(rescuer.run());
    assert!(!cancellation.is_cancelled());
    stop.cancel();
    let ended = tokio::time::timeout(STEP, run).await.unwrap().unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert!(
        cancellation.is_cancelled(),
        "the running handler's cancellation fired"
    );
    assert_eq!(
        departure(&mut events, stopped_id).await,
        DisconnectReason::Disconnect
    );
    let outcome = tokio::time::timeout(STEP, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"move me"))
    );
    rescuer_run.abort();
}

#[tokio::test]
async fn run_reports_the_close_code_when_the_gateway_goes_away() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let worker = builder(gateway.url())
        .activity("hold", echo)
        .connect()
        .await
        .unwrap();
    let run = tokio::spawn(worker.run());
    tokio::time::timeout(STEP, gateway.server.shutdown())
        .await
        .expect("shutdown finishes");
    let ended = tokio::time::timeout(STEP, run).await.unwrap().unwrap();
    match ended {
        Err(error @ RunError::Closed { code: 1001, .. }) => {
            assert_eq!(error.close_code(), Some(CloseCode::GoingAway));
        }
        other => panic!("expected a 1001 close, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_reports_a_refusal_with_its_close_code_and_whole_sentence() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let cases = [
        (
            WsWorker::builder(gateway.url())
                .namespaces([NAMESPACE])
                .token("guess"),
            CloseCode::Unauthenticated,
            "bearer token not recognised",
        ),
        (
            builder(gateway.url()).namespaces(["bank"]),
            CloseCode::NamespaceNotGranted,
            "principal \"shop-workers\" is not granted namespace \"bank\"",
        ),
    ];
    for (builder, code, sentence) in cases {
        let refused = builder.activity("hold", echo).connect().await.unwrap_err();
        assert_eq!(refused.close_code(), Some(code), "{refused}");
        match &refused {
            WsLinkError::Refused { message, .. } => {
                assert!(message.contains(sentence), "{message:?} names {sentence:?}");
            }
            other => panic!("expected a refusal, got {other}"),
        }
    }
    // An unusable option is refused by the worker runtime before dialling, naming it.
    let invalid = builder(gateway.url())
        .max_concurrency(0)
        .activity("hold", echo)
        .connect()
        .await
        .unwrap_err();
    assert!(invalid.to_string().contains("max_concurrency"), "{invalid}");
    assert!(matches!(invalid, WsLinkError::Invalid(_)), "{invalid}");
    assert!(gateway.core.registry().is_empty());
    // Control: the same builder with valid settings registers.
    let admitted = builder(gateway.url())
        .activity("hold", echo)
        .connect()
        .await
        .unwrap();
    assert!(gateway.core.registry().is_registered(admitted.worker_id()));
}

#[tokio::test]
async fn connect_rejects_urls_that_are_not_websocket_urls() {
    for url in ["http://127.0.0.1:1/", "not a url", "ws:///no-host"] {
        let error = WsWorker::builder(url)
            .namespaces([NAMESPACE])
            .activity("hold", echo)
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(error, WsLinkError::InvalidUrl { .. }),
            "{url}: {error}"
        );
    }
}
