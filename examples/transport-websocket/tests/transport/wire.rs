//! The wire protocol as a browser script would speak it: JSON written by hand, tokens in the
//! register frame, and every refusal or violation ending in a close code that names it.
// Helpers outside `#[test]` functions fail their test loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::{Value, json};
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, DEFAULT_TASK_QUEUE, DisconnectReason,
    WorkerEvent, WorkerId,
};
use switchyard_transport_websocket::{SUBPROTOCOL, WsServerConfig};
use tokio::sync::broadcast;

use crate::support::gateway::{NAMESPACE, TOKEN, TestGateway};
use crate::support::raw::{self, STEP};

fn worker_id(registered: &Value) -> WorkerId {
    assert_eq!(registered["type"], "registered", "{registered}");
    let id = registered["worker_id"]
        .as_str()
        .expect("worker_id is a decimal string");
    WorkerId::from_raw(id.parse().unwrap())
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

fn request(input: &'static [u8]) -> ActivityRequest {
    ActivityRequest {
        namespace: NAMESPACE.to_owned(),
        task_queue: String::new(),
        activity_type: "add".to_owned(),
        node: None,
        input: Bytes::from_static(input),
        activity_id: None,
        timeout: STEP,
    }
}

#[tokio::test]
async fn browser_style_worker_registers_with_a_frame_token_and_completes_a_task() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let (mut socket, response) =
        raw::connect(gateway.server.local_addr(), None, &["chat", SUBPROTOCOL]).await;
    assert_eq!(
        response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some(SUBPROTOCOL),
        "the gateway picks its protocol from the offered list"
    );
    let mut register = raw::register(1);
    register["token"] = json!(TOKEN);
    raw::send(&mut socket, &register).await;
    let registered = raw::next(&mut socket).await;
    let id = worker_id(&registered);
    assert_eq!(registered["task_queue"], DEFAULT_TASK_QUEUE);
    assert_eq!(registered["ping_interval_ms"], 100);

    let core = gateway.core.clone();
    let producer = CallerIdentity::trusted("producer");
    let dispatch = tokio::spawn(async move {
        core.dispatcher()
            .dispatch(&producer, request(b"\x00\xff2+2"))
            .await
    });
    let task = raw::until(&mut socket, "task").await;
    assert_eq!(task["namespace"], NAMESPACE);
    assert_eq!(task["activity_type"], "add");
    assert_eq!(task["attempt"], 1);
    assert_eq!(
        STANDARD.decode(task["input"].as_str().unwrap()).unwrap(),
        b"\x00\xff2+2"
    );
    assert!(task["deadline_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    raw::send(
        &mut socket,
        &json!({"type": "result", "task_id": task["task_id"], "output": STANDARD.encode("4")}),
    )
    .await;
    let outcome = tokio::time::timeout(STEP, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"4"))
    );
    assert!(gateway.core.registry().is_registered(id));
}

#[tokio::test]
async fn a_failure_result_reaches_the_producer_with_its_retry_hint() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let bearer = format!("Bearer {TOKEN}");
    let (mut socket, _) = raw::connect(gateway.server.local_addr(), Some(&bearer), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    worker_id(&raw::next(&mut socket).await);
    let core = gateway.core.clone();
    let producer = CallerIdentity::trusted("producer");
    let dispatch =
        tokio::spawn(async move { core.dispatcher().dispatch(&producer, request(b"1/0")).await });
    let task = raw::until(&mut socket, "task").await;
    let failure = json!({"message": "division by zero", "retryable": false});
    raw::send(
        &mut socket,
        &json!({"type": "result", "task_id": task["task_id"], "failure": failure}),
    )
    .await;
    let outcome = tokio::time::timeout(STEP, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        ActivityOutcome::Failed {
            message: "division by zero".to_owned(),
            retryable: false
        }
    );
}

/// One connection that must be refused before registration.
struct Refused {
    case: &'static str,
    authorization: Option<&'static str>,
    first: Message,
    code: u16,
    names: &'static str,
}

enum Message {
    Json(Value),
    Text(&'static str),
    Binary(&'static [u8]),
}

fn with(mut frame: Value, field: &str, value: Value) -> Value {
    frame[field] = value;
    frame
}

fn without(mut frame: Value, field: &str) -> Value {
    frame.as_object_mut().unwrap().remove(field);
    frame
}

#[tokio::test]
async fn refusals_send_the_whole_sentence_then_close_with_a_code_naming_the_rule() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let bearer = "Bearer shop-token";
    let cases = [
        Refused {
            case: "an unknown header token",
            authorization: Some("Bearer guess"),
            first: Message::Json(raw::register(1)),
            code: 4401,
            names: "not recognised",
        },
        Refused {
            case: "an unknown frame token",
            authorization: None,
            first: Message::Json(with(raw::register(1), "token", json!("guess"))),
            code: 4401,
            names: "not recognised",
        },
        Refused {
            case: "no token at all",
            authorization: None,
            first: Message::Json(raw::register(1)),
            code: 4401,
            names: "no credential",
        },
        Refused {
            case: "a token in the header and the frame",
            authorization: Some(bearer),
            first: Message::Json(with(raw::register(1), "token", json!(TOKEN))),
            code: 4401,
            names: "given twice",
        },
        Refused {
            case: "a basic authorization header",
            authorization: Some("Basic c2hvcA=="),
            first: Message::Json(raw::register(1)),
            code: 4401,
            names: "Bearer <token>",
        },
        Refused {
            case: "a namespace outside the grant",
            authorization: Some(bearer),
            first: Message::Json(with(
                raw::register(1),
                "namespaces",
                json!(["shop", "bank"]),
            )),
            code: 4403,
            names: "\"bank\"",
        },
        Refused {
            case: "capacity zero",
            authorization: Some(bearer),
            first: Message::Json(raw::register(0)),
            code: 4400,
            names: "max_concurrency 0",
        },
        Refused {
            case: "no capacity",
            authorization: Some(bearer),
            first: Message::Json(without(raw::register(1), "max_concurrency")),
            code: 4400,
            names: "max_concurrency is required",
        },
        Refused {
            case: "no activity types",
            authorization: Some(bearer),
            first: Message::Json(with(raw::register(1), "activity_types", json!([]))),
            code: 4400,
            names: "activity_types",
        },
        Refused {
            case: "a pong before registering",
            authorization: Some(bearer),
            first: Message::Json(json!({"type": "pong", "seq": "1"})),
            code: 1002,
            names: "first frame must be register",
        },
        Refused {
            case: "text that is not JSON",
            authorization: Some(bearer),
            first: Message::Text("register please"),
            code: 1007,
            names: "not valid protocol JSON",
        },
        Refused {
            case: "a binary message",
            authorization: Some(bearer),
            first: Message::Binary(b"\x08\x01"),
            code: 1003,
            names: "binary",
        },
    ];
    for refused in cases {
        let (mut socket, _) =
            raw::connect(gateway.server.local_addr(), refused.authorization, &[]).await;
        match &refused.first {
            Message::Json(frame) => raw::send(&mut socket, frame).await,
            Message::Text(text) => raw::send_text(&mut socket, text).await,
            Message::Binary(bytes) => raw::send_binary(&mut socket, bytes).await,
        }
        let closed = raw::closed(&mut socket, false).await;
        let case = refused.case;
        assert_eq!(closed.code, refused.code, "{case}: {closed:?}");
        assert!(
            closed.reason.contains(refused.names),
            "{case}: reason {:?}",
            closed.reason
        );
        let [sentence] = closed.frames.as_slice() else {
            panic!(
                "{case}: expected exactly one refused frame, got {:?}",
                closed.frames
            );
        };
        assert_eq!(sentence["type"], "refused", "{case}");
        assert_eq!(sentence["code"], refused.code, "{case}");
        assert!(
            sentence["message"]
                .as_str()
                .unwrap()
                .contains(refused.names),
            "{case}: {sentence}"
        );
        assert!(
            gateway.core.registry().is_empty(),
            "{case} left a worker registered"
        );
    }
    // Control: the same path with a valid registration is admitted.
    let (mut socket, _) = raw::connect(gateway.server.local_addr(), Some(bearer), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut socket).await);
    assert!(gateway.core.registry().is_registered(id));
}

#[tokio::test]
async fn a_long_refusal_is_cut_in_the_close_reason_but_whole_in_the_refused_frame() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let long = "n".repeat(200);
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    raw::send(
        &mut socket,
        &with(raw::register(1), "namespaces", json!([long])),
    )
    .await;
    let closed = raw::closed(&mut socket, false).await;
    assert_eq!(closed.code, 4403);
    assert!(closed.reason.len() <= 123, "{} bytes", closed.reason.len());
    let message = closed.frames[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&long),
        "the refused frame carries the whole sentence"
    );
    assert!(message.starts_with(&closed.reason));
}

#[tokio::test]
async fn a_connection_that_never_registers_is_closed_with_4408() {
    let gateway = TestGateway::start(WsServerConfig {
        registration_timeout: Duration::from_millis(200),
        ..WsServerConfig::default()
    })
    .await;
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    let closed = raw::closed(&mut socket, false).await;
    assert_eq!(closed.code, 4408, "{closed:?}");
    assert!(closed.reason.contains("no register frame"), "{closed:?}");
}

/// `WsServerConfig::max_connections`: past the limit a client waits in the listen backlog (its
/// TCP connect completes, its WebSocket handshake is not answered) until a connection ends.
#[tokio::test]
async fn past_max_connections_a_client_waits_until_a_connection_ends() {
    let gateway = TestGateway::start(WsServerConfig {
        max_connections: 1,
        ..WsServerConfig::default()
    })
    .await;
    let addr = gateway.server.local_addr();
    let (first, _) = raw::connect(addr, Some("Bearer shop-token"), &[]).await;
    let mut second = tokio::spawn(raw::connect(addr, Some("Bearer shop-token"), &[]));
    // Held while the first connection lives (bounded wait: no answer is the behaviour).
    let early = tokio::time::timeout(Duration::from_millis(500), &mut second).await;
    assert!(
        early.is_err(),
        "the second handshake was answered past the limit"
    );
    // Control: once the first connection ends, the second is served.
    drop(first);
    let (mut second, _) = tokio::time::timeout(STEP, second)
        .await
        .expect("the second handshake is answered once a slot frees")
        .expect("the second connect task");
    raw::send(&mut second, &raw::register(1)).await;
    let registered = raw::next(&mut second).await;
    assert_eq!(registered["type"], "registered", "{registered}");
}

#[tokio::test]
async fn oversized_messages_close_with_1009_and_deregister_the_worker() {
    let gateway = TestGateway::start(WsServerConfig {
        max_message_bytes: 1024,
        ..WsServerConfig::default()
    })
    .await;
    let mut events = gateway.core.registry().subscribe_events();
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    // Control: a register frame under the limit is admitted.
    raw::send(&mut socket, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut socket).await);
    let padding = "x".repeat(2048);
    raw::send(
        &mut socket,
        &json!({"type": "telemetry", "padding": padding}),
    )
    .await;
    let closed = raw::closed(&mut socket, true).await;
    assert_eq!(closed.code, 1009, "{closed:?}");
    assert_eq!(departure(&mut events, id).await, DisconnectReason::Closed);
}

#[tokio::test]
async fn frames_after_registration_are_checked() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let cases = [
        (raw::register(1), 1002, "register sent twice"),
        (
            json!({"type": "result", "task_id": "1", "output": "", "failure": {"message": "x"}}),
            1007,
            "exactly one of output and failure",
        ),
        (
            json!({"type": "pong", "seq": "minus one"}),
            1007,
            "not valid protocol JSON",
        ),
    ];
    for (frame, code, names) in cases {
        let mut events = gateway.core.registry().subscribe_events();
        let (mut socket, _) =
            raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
        raw::send(&mut socket, &raw::register(1)).await;
        let id = worker_id(&raw::next(&mut socket).await);
        // Control: an unknown frame type is skipped, and the socket stays open for the next.
        raw::send(&mut socket, &json!({"type": "telemetry", "cpu": 0.5})).await;
        raw::send(&mut socket, &frame).await;
        let closed = raw::closed(&mut socket, true).await;
        assert_eq!(closed.code, code, "{frame}: {closed:?}");
        assert!(closed.reason.contains(names), "{frame}: {closed:?}");
        // A protocol fault: the worker leaves at once, never suspended.
        assert_eq!(departure(&mut events, id).await, DisconnectReason::Closed);
    }
}

#[tokio::test]
async fn a_worker_that_never_answers_pings_is_deregistered_and_closed_with_4410() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let mut events = gateway.core.registry().subscribe_events();
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut socket).await);
    let closed = raw::closed(&mut socket, false).await;
    assert_eq!(closed.code, 4410, "{closed:?}");
    assert_eq!(closed.reason, "deregistered by the gateway: timeout");
    assert!(
        closed.frames.iter().any(|frame| frame["type"] == "ping"),
        "it was pinged"
    );
    assert_eq!(departure(&mut events, id).await, DisconnectReason::Timeout);
}

#[tokio::test]
async fn closing_after_a_drain_leaves_as_drained_and_without_one_as_disconnected() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let mut events = gateway.core.registry().subscribe_events();
    for drained in [true, false] {
        let (mut socket, _) =
            raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
        raw::send(&mut socket, &raw::register(1)).await;
        let id = worker_id(&raw::next(&mut socket).await);
        if drained {
            assert!(gateway.core.registry().drain_worker(id));
            raw::until(&mut socket, "drain").await;
        }
        socket.close(None).await.unwrap();
        let expected = if drained {
            DisconnectReason::Drained
        } else {
            DisconnectReason::Disconnect
        };
        assert_eq!(
            departure(&mut events, id).await,
            expected,
            "drained: {drained}"
        );
    }
}

#[tokio::test]
async fn shutdown_closes_every_worker_with_going_away_and_deregisters_it() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let mut events = gateway.core.registry().subscribe_events();
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut socket).await);
    let TestGateway { core, server } = gateway;
    let reader = tokio::spawn(async move { raw::closed(&mut socket, true).await });
    tokio::time::timeout(STEP, server.shutdown())
        .await
        .expect("shutdown finishes");
    let closed = reader.await.unwrap();
    assert_eq!(closed.code, 1001, "{closed:?}");
    assert_eq!(
        departure(&mut events, id).await,
        DisconnectReason::Disconnect
    );
    assert!(core.registry().is_empty());
}

#[tokio::test]
async fn stop_accepting_refuses_newcomers_and_keeps_registered_workers() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let addr = gateway.server.local_addr();
    let (mut registered, _) = raw::connect(addr, Some("Bearer shop-token"), &[]).await;
    raw::send(&mut registered, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut registered).await);
    let (mut unregistered, _) = raw::connect(addr, Some("Bearer shop-token"), &[]).await;

    gateway.server.stop_accepting();
    let closed = raw::closed(&mut unregistered, false).await;
    assert_eq!(closed.code, 1001, "{closed:?}");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
    // The registered worker keeps its socket and still gets work.
    let core = gateway.core.clone();
    let producer = CallerIdentity::trusted("producer");
    let dispatch = tokio::spawn(async move {
        core.dispatcher()
            .dispatch(&producer, request(b"still"))
            .await
    });
    let task = raw::until(&mut registered, "task").await;
    raw::send(
        &mut registered,
        &json!({"type": "result", "task_id": task["task_id"], "output": STANDARD.encode("on")}),
    )
    .await;
    let outcome = tokio::time::timeout(STEP, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"on"))
    );
    assert!(gateway.core.registry().is_registered(id));
}

#[tokio::test]
async fn a_drain_queued_just_before_shutdown_still_reaches_the_worker_before_the_close() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut socket).await);
    let TestGateway { core, server } = gateway;
    assert!(core.registry().drain_worker(id));
    let reader = tokio::spawn(async move { raw::closed(&mut socket, true).await });
    tokio::time::timeout(STEP, server.shutdown())
        .await
        .expect("shutdown finishes");
    let closed = reader.await.unwrap();
    assert_eq!(closed.code, 1001, "{closed:?}");
    assert!(
        closed.frames.iter().any(|frame| frame["type"] == "drain"),
        "the drain came before the close: {:?}",
        closed.frames
    );
}

#[tokio::test]
async fn a_shutdown_notice_is_a_drain_saying_shutting_down_ahead_of_the_going_away_close() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    worker_id(&raw::next(&mut socket).await);
    let TestGateway { core, server } = gateway;
    assert_eq!(core.registry().broadcast_shutdown(), 1);
    let reader = tokio::spawn(async move { raw::closed(&mut socket, true).await });
    tokio::time::timeout(STEP, server.shutdown())
        .await
        .expect("shutdown finishes");
    let closed = reader.await.unwrap();
    assert_eq!(closed.code, 1001, "{closed:?}");
    let drains: Vec<&Value> = closed
        .frames
        .iter()
        .filter(|frame| frame["type"] == "drain")
        .collect();
    assert_eq!(drains.len(), 1, "{:?}", closed.frames);
    assert_eq!(drains[0]["reason"], "shutting_down", "{:?}", closed.frames);
}

#[tokio::test]
async fn an_operator_drain_says_requested_and_its_deadline_cancel_says_drain_deadline() {
    let gateway = TestGateway::start(WsServerConfig::default()).await;
    let (mut socket, _) =
        raw::connect(gateway.server.local_addr(), Some("Bearer shop-token"), &[]).await;
    raw::send(&mut socket, &raw::register(1)).await;
    let id = worker_id(&raw::next(&mut socket).await);
    let core = gateway.core.clone();
    let producer = CallerIdentity::trusted("producer");
    let dispatch = tokio::spawn(async move {
        core.dispatcher()
            .dispatch(&producer, request(b"held"))
            .await
    });
    let task = raw::until(&mut socket, "task").await;
    assert!(gateway.core.registry().drain_worker(id));
    let drain = raw::until(&mut socket, "drain").await;
    assert_eq!(drain["reason"], "requested", "{drain}");
    let cancelled = gateway
        .core
        .dispatcher()
        .cancel_held_by(id, switchyard_core::CancelReason::DrainDeadline);
    assert_eq!(cancelled, 1);
    let cancel = raw::until(&mut socket, "cancel").await;
    assert_eq!(cancel["task_id"], task["task_id"]);
    assert_eq!(cancel["reason"], "drain_deadline", "{cancel}");
    let outcome = tokio::time::timeout(STEP, dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(outcome, ActivityOutcome::Cancelled);
}
