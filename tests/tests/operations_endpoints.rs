//! The operations listener answers health, readiness, Prometheus metrics (with the per-pool
//! gauges computed at scrape time) and the read-only JSON views.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use switchyard_core::CallerIdentity;
use switchyard_proto::v1 as pb;
use switchyard_tests::{
    ScriptedTransport, ScriptedWorker, TestGateway, http_get, http_get_with_head, http_request,
    registration,
};
use tokio::time::{Duration, timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_json_views_answer() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| config.quic.enabled = false,
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");

    assert_eq!(
        http_get(ops, "/healthz").await.unwrap(),
        (200, "ok\n".to_owned())
    );
    let (status, body) = http_get(ops, "/readyz").await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, "ready\n"),
        "every transport listens"
    );

    let worker = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&["metrics"], &["echo"], Some(4)),
            true,
        )
        .await
        .unwrap();
    let worker_id = worker.id().get();
    let _serving = worker.serve_echo();
    let mut client = gateway.client(None).await;
    let reply = client
        .dispatch(pb::DispatchRequest {
            namespace: "metrics".to_owned(),
            activity_type: "echo".to_owned(),
            input: Bytes::from_static(b"x"),
            timeout_ms: 10_000,
            ..pb::DispatchRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        reply.outcome.and_then(|o| o.outcome),
        Some(pb::dispatch_outcome::Outcome::Completed(_))
    ));

    // A dispatch parked on a queue nobody serves, left waiting while we scrape.
    let mut parked_client = client.clone();
    let parked = tokio::spawn(async move {
        parked_client
            .dispatch(pb::DispatchRequest {
                namespace: "nobody".to_owned(),
                activity_type: "echo".to_owned(),
                timeout_ms: 30_000,
                ..pb::DispatchRequest::default()
            })
            .await
    });
    timeout(Duration::from_secs(10), async {
        // Parking raises no event; poll the dispatcher's book.
        while gateway
            .gateway()
            .core()
            .dispatcher()
            .unserved_queues()
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the dispatch parks");

    let (status, metrics) = http_get(ops, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for expected in [
        "switchyard_dispatches_total{outcome=\"completed\"}",
        "switchyard_dispatch_latency_seconds_bucket",
        "switchyard_workers_connected{",
        "switchyard_pool_capacity{namespace=\"metrics\",task_queue=\"default\"} 4",
        "switchyard_pool_workers{namespace=\"metrics\",task_queue=\"default\"} 1",
        "switchyard_pool_in_flight{namespace=\"metrics\",task_queue=\"default\"} 0",
        "switchyard_parked_dispatches{reason=\"no_workers\"} 1",
        "switchyard_pool_parked_dispatches{namespace=\"nobody\",task_queue=\"default\"} 1",
        "switchyard_pool_oldest_parked_seconds{namespace=\"nobody\",task_queue=\"default\"}",
    ] {
        assert!(
            metrics.contains(expected),
            "/metrics lacks {expected}:\n{metrics}"
        );
    }

    let (status, workers) = http_get(ops, "/v1/workers").await.unwrap();
    assert_eq!(status, 200);
    let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
    assert_eq!(workers["workers"][0]["worker_id"], worker_id);
    assert_eq!(workers["workers"][0]["transport"], "scripted");

    let (_, pools) = http_get(ops, "/v1/pools").await.unwrap();
    let pools: serde_json::Value = serde_json::from_str(&pools).unwrap();
    let names: Vec<&str> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["metrics", "nobody"]);
    // Every field `docs/operations.md` lists for a pool.
    let served = &pools["pools"][0];
    assert_eq!(served["task_queue"], "default");
    assert_eq!(served["workers"], 1);
    assert_eq!(served["capacity"], 4);
    assert_eq!(served["in_flight"], 0);
    assert_eq!(served["activity_types"], serde_json::json!(["echo"]));
    assert_eq!(served["parked"], 0);
    let waiting = &pools["pools"][1];
    assert_eq!(waiting["parked"], 1);
    assert!(
        waiting["oldest_parked_seconds"].as_f64().is_some(),
        "{waiting}"
    );

    let (_, unserved) = http_get(ops, "/v1/unserved").await.unwrap();
    let unserved: serde_json::Value = serde_json::from_str(&unserved).unwrap();
    let row = &unserved["unserved"][0];
    assert_eq!(row["namespace"], "nobody");
    assert_eq!(row["task_queue"], "default");
    assert_eq!(row["activity_type"], "echo");
    assert!(row["node"].is_null(), "{row}");
    assert_eq!(row["reason"], "no_workers");
    assert!(
        row["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{row}"
    );
    assert_eq!(row["waiting"], 1);
    assert!(row["oldest_wait_seconds"].as_f64().is_some(), "{row}");
    assert_eq!(row["eligible"], 0);
    assert_eq!(row["compatible"], 0);
    assert_eq!(row["pool_workers"], 0);

    let (_, about) = http_get(ops, "/v1/about").await.unwrap();
    let about: serde_json::Value = serde_json::from_str(&about).unwrap();
    assert_eq!(about["service"], "switchyard", "{about}");
    assert!(
        about["version"].as_str().is_some_and(|v| !v.is_empty()),
        "{about}"
    );
    assert!(about["host"].as_str().is_some(), "{about}");
    assert_eq!(about["pid"], std::process::id(), "{about}");
    assert_eq!(about["ops_addr"], ops.to_string(), "{about}");
    assert!(
        about["started_unix_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{about}"
    );
    assert_eq!(about["read_only"], true, "{about}");
    assert!(
        about.get("cluster_node").is_none(),
        "outside a cluster: {about}"
    );
    parked.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_shutting_down_while_the_gateway_drains() {
    let scripted = ScriptedTransport::default();
    let mut gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.shutdown.drain_timeout = switchyard_gateway::ConfigDuration::secs(2);
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");
    // A task the worker holds keeps the drain going until its timeout.
    let worker = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&["drain"], &["hold"], Some(1)),
            true,
        )
        .await
        .unwrap();
    let (_control, mut tasks, _serving) = worker.answer_pings_in_background();
    let mut client = gateway.client(None).await;
    let dispatch = tokio::spawn(async move {
        client
            .dispatch(pb::DispatchRequest {
                namespace: "drain".to_owned(),
                activity_type: "hold".to_owned(),
                input: Bytes::from_static(b"x"),
                timeout_ms: 30_000,
                ..pb::DispatchRequest::default()
            })
            .await
    });
    timeout(Duration::from_secs(15), tasks.recv())
        .await
        .expect("the task reaches the worker")
        .expect("the worker runs");
    // Control: ready until shutdown begins.
    assert_eq!(
        http_get(ops, "/readyz").await.unwrap(),
        (200, "ready\n".to_owned())
    );

    let probe = async {
        // Polled: an HTTP prober has no other way to learn it.
        for _ in 0..200 {
            match http_get(ops, "/readyz").await {
                Ok((200, _)) => tokio::time::sleep(Duration::from_millis(10)).await,
                other => return other,
            }
        }
        panic!("/readyz still answered 200 two seconds into the shutdown");
    };
    let (answer, ()) = tokio::join!(probe, gateway.shutdown());
    assert_eq!(answer.unwrap(), (503, "shutting down\n".to_owned()));
    let ended = dispatch.await.unwrap().unwrap().into_inner();
    assert!(
        matches!(
            ended.outcome.and_then(|o| o.outcome),
            Some(pb::dispatch_outcome::Outcome::ShuttingDown(_))
        ),
        "the held task ends shutting down once the drain times out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_and_its_assets_allow_only_their_own_script_and_styles() {
    let gateway = TestGateway::start(|config| config.quic.enabled = false).await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");
    let csp =
        "content-security-policy: default-src 'self'; img-src 'self' data:; frame-ancestors 'none'";
    for path in ["/", "/console.js", "/console.css"] {
        let (status, head, body) = http_get_with_head(ops, path).await.unwrap();
        assert_eq!(status, 200, "{path}");
        assert!(!body.is_empty(), "{path}");
        let head = head.to_ascii_lowercase();
        for header in [
            csp,
            "x-frame-options: deny",
            "x-content-type-options: nosniff",
        ] {
            assert!(head.contains(header), "{path} lacks {header}:\n{head}");
        }
    }
    // Control: the JSON and probe endpoints are not pages and carry no policy.
    let (_, head, _) = http_get_with_head(ops, "/healthz").await.unwrap();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("content-security-policy"),
        "{head}"
    );
}

/// Reads from `stream` until `until`: every byte read, and whether the gateway closed it.
async fn read_until(
    stream: &mut tokio::net::TcpStream,
    until: tokio::time::Instant,
) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&text).into_owned(), false),
            Ok(Ok(0) | Err(_)) => return (String::from_utf8_lossy(&text).into_owned(), true),
            Ok(Ok(n)) => text.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_event_stream_is_kept_open_by_comments_past_the_idle_timeout() {
    use tokio::io::AsyncWriteExt;
    const IDLE: Duration = Duration::from_millis(600);
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.ops.idle_timeout = switchyard_gateway::ConfigDuration::millis(600);
    })
    .await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");
    let request = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {ops}\r\nAccept: text/event-stream\r\n\r\n")
    };

    // No worker, so no event: only the keep-alive comments (every 300 ms here) move bytes.
    let mut events = tokio::net::TcpStream::connect(ops).await.unwrap();
    events
        .write_all(request("/v1/events").as_bytes())
        .await
        .unwrap();
    let (text, closed) = read_until(&mut events, tokio::time::Instant::now() + IDLE * 4).await;
    assert!(!closed, "the event stream was closed:\n{text}");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let comments = text.lines().filter(|line| line.starts_with(':')).count();
    assert!(
        comments >= 3,
        "{comments} comments in four idle timeouts:\n{text}"
    );

    // Control: a kept-alive connection whose response is over moves nothing and is closed.
    let mut idle = tokio::net::TcpStream::connect(ops).await.unwrap();
    idle.write_all(request("/healthz").as_bytes())
        .await
        .unwrap();
    let (text, closed) = read_until(&mut idle, tokio::time::Instant::now() + IDLE * 4).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "an idle connection outlived four idle timeouts");
}

/// A gateway (QUIC off) with one scripted worker of `capacity` serving `echo` in `namespace`.
async fn gateway_with_worker(namespace: &str, capacity: u32) -> (TestGateway, ScriptedWorker) {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| config.quic.enabled = false,
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let worker = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&[namespace], &["echo"], Some(capacity)),
            true,
        )
        .await
        .unwrap();
    (gateway, worker)
}

/// `docs/operations.md`, "Security": the listener is read-only. A method other than GET, on
/// any path it serves, is answered 405 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_listener_answers_only_reads() {
    let (gateway, worker) = gateway_with_worker("ro", 1).await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");
    let listed = format!("\"worker_id\":{}", worker.id().get());
    let paths = [
        "/",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/workers",
        "/v1/pools",
        "/v1/unserved",
        "/v1/history",
        "/v1/explain?namespace=ro&activity_type=echo",
        "/v1/about",
    ];
    for path in paths {
        // Control: each path answers a read.
        let (status, _, _) = http_request(ops, "GET", path).await.unwrap();
        assert_eq!(status, 200, "GET {path}");
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let (status, _, _) = http_request(ops, method, path).await.unwrap();
            assert_eq!(status, 405, "{method} {path}");
        }
    }
    let (_, workers) = http_get(ops, "/v1/workers").await.unwrap();
    assert!(workers.contains(&listed), "{workers}");
    let snapshot = gateway
        .gateway()
        .core()
        .registry()
        .worker(worker.id())
        .expect("still registered");
    assert_ne!(
        snapshot.eligibility,
        switchyard_core::Eligibility::Draining,
        "nothing drained it"
    );
}

/// `ops.enabled = false` binds no operations listener: nothing answers on the address it
/// would have taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_disabled_binds_no_listener() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.ops.enabled = false;
            config.ops.listen = addr;
        },
        |builder| builder,
    )
    .await;
    assert_eq!(gateway.gateway().ops_addr(), None);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "something listens on {addr}"
    );
    drop(gateway);
    // Control: enabled on the same address, it answers there.
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.ops.listen = addr;
        },
        |builder| builder,
    )
    .await;
    assert_eq!(gateway.gateway().ops_addr(), Some(addr));
    assert_eq!(
        http_get(addr, "/healthz").await.unwrap(),
        (200, "ok\n".to_owned())
    );
}

/// `docs/operations.md`: the pools' history records the dispatches run through the producer
/// API, `DispatchStream` as well as `Dispatch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_records_dispatch_stream_dispatches() {
    const NAMESPACE: &str = "history-stream";
    let (gateway, worker) = gateway_with_worker(NAMESPACE, 4).await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");
    let _serving = worker.serve_echo();
    // The history's dispatches of this test's pool, summed over its points.
    let recorded = || async {
        let (status, body) = http_get(ops, "/v1/history").await.unwrap();
        assert_eq!(status, 200);
        let history: serde_json::Value = serde_json::from_str(&body).unwrap();
        history["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|pool| pool["namespace"] == NAMESPACE)
            .flat_map(|pool| pool["points"].as_array().unwrap().clone())
            .map(|point| point["outcomes"]["completed"].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    // Control: nothing recorded for the pool before the stream.
    assert_eq!(recorded().await, 0);
    let mut client = gateway.client(None).await;
    let requests = (0..3u64).map(|correlation_id| pb::DispatchStreamRequest {
        correlation_id,
        request: Some(pb::DispatchRequest {
            namespace: NAMESPACE.to_owned(),
            activity_type: "echo".to_owned(),
            input: Bytes::from_static(b"hi"),
            timeout_ms: 10_000,
            ..pb::DispatchRequest::default()
        }),
    });
    let mut replies = client
        .dispatch_stream(tokio_stream::iter(requests))
        .await
        .expect("stream opens")
        .into_inner();
    let mut completed = 0;
    while let Some(reply) = timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("replies within 10 s")
        .unwrap()
    {
        if matches!(
            reply.result,
            Some(pb::dispatch_stream_reply::Result::Outcome(
                pb::DispatchOutcome {
                    outcome: Some(pb::dispatch_outcome::Outcome::Completed(_)),
                    ..
                }
            ))
        ) {
            completed += 1;
        }
    }
    assert_eq!(completed, 3);
    assert_eq!(recorded().await, 3);
}
