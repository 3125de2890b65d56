//! The WebSocket transport plugged into a gateway of one's own through the gateway's
//! `Transport` trait: a gRPC, a QUIC and a WebSocket worker share one pool.
// Helpers outside `#[test]` functions fail their test loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, Eligibility, Registry, WorkerEvent,
};
use switchyard_gateway::{ConfigDuration, Gateway, GatewayConfig, PrincipalSection, RoleName};
use switchyard_transport_grpc::GrpcWorker;
use switchyard_transport_quic::{ClientTls, QuicWorker};
use switchyard_transport_websocket::client::WsLinkError;
use switchyard_transport_websocket::{
    ActivityContext, ActivityError, CloseCode, WsTransport, WsWorker,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::{Certificate, ClientTlsConfig};

const NAMESPACE: &str = "mixed";
const TOKEN: &str = "mixed-token";
/// The token of a principal granted [`NAMESPACE`] without the `worker` role.
const PRODUCER_TOKEN: &str = "producer-token";
const ACTIVITY: &str = "whoami";
/// Served by the WebSocket worker only: holds until the test releases it.
const HOLD: &str = "hold";
const STEP: Duration = Duration::from_secs(10);

/// A gateway on loopback with gRPC, QUIC and the WebSocket transport, one principal granted
/// [`NAMESPACE`], and liveness fast enough for a test.
async fn gateway(data_dir: &std::path::Path) -> Gateway {
    let mut config = GatewayConfig::default();
    config.grpc.listen = "127.0.0.1:0".parse().unwrap();
    config.quic.listen = "127.0.0.1:0".parse().unwrap();
    config.ops.listen = "127.0.0.1:0".parse().unwrap();
    config.tls.data_dir = data_dir.display().to_string();
    config.liveness.ping_interval = ConfigDuration::millis(100);
    config.liveness.ping_timeout = ConfigDuration::millis(300);
    config.shutdown.drain_timeout = ConfigDuration::secs(2);
    config.principals = vec![
        PrincipalSection {
            name: "mixed-workers".to_owned(),
            token: TOKEN.to_owned(),
            cert_subject: String::new(),
            namespaces: vec![NAMESPACE.to_owned()],
            ..PrincipalSection::default()
        },
        PrincipalSection {
            name: "producer-only".to_owned(),
            token: PRODUCER_TOKEN.to_owned(),
            namespaces: vec![NAMESPACE.to_owned()],
            roles: Some(vec![RoleName::Producer]),
            ..PrincipalSection::default()
        },
    ];
    Gateway::builder(config)
        .transport(WsTransport::new("127.0.0.1:0".parse().unwrap()))
        .start()
        .await
        .expect("the gateway starts with the websocket transport")
}

fn ca_pem(gateway: &Gateway) -> String {
    std::fs::read_to_string(gateway.tls().dev_ca_path().expect("development material")).unwrap()
}

fn ws_tls(gateway: &Gateway) -> Arc<rustls::ClientConfig> {
    let ca = CertificateDer::from_pem_slice(ca_pem(gateway).as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

fn ws_url(gateway: &Gateway) -> String {
    format!(
        "wss://127.0.0.1:{}/",
        gateway.addr("websocket").unwrap().port()
    )
}

fn request(activity: &str, input: &str) -> ActivityRequest {
    ActivityRequest {
        namespace: NAMESPACE.to_owned(),
        task_queue: String::new(),
        activity_type: activity.to_owned(),
        node: None,
        input: Bytes::from(input.to_owned()),
        activity_id: None,
        timeout: STEP,
    }
}

/// Waits (re-checking on every registry wake, never on a timer) until `condition` holds.
async fn wait_for(registry: &Registry, condition: impl Fn(&Registry) -> bool) {
    let until = Instant::now() + STEP;
    for _ in 0..10_000 {
        let arrival = registry.worker_arrival();
        if condition(registry) {
            return;
        }
        if tokio::time::timeout_at(until, arrival).await.is_err() {
            break;
        }
    }
    assert!(
        condition(registry),
        "not within {STEP:?}: {:?}",
        registry.workers()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_quic_and_websocket_workers_share_one_pool() {
    let data_dir = tempfile::tempdir().unwrap();
    let gateway = gateway(data_dir.path()).await;

    let grpc_port = gateway.addr("grpc").unwrap().port();
    let grpc = GrpcWorker::builder(format!("https://127.0.0.1:{grpc_port}"))
        .namespaces([NAMESPACE])
        .activity(
            ACTIVITY,
            |_: switchyard_transport_grpc::ActivityContext, _: Bytes| async {
                Ok(Bytes::from_static(b"grpc"))
            },
        )
        .max_concurrency(1)
        .tls(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem(&gateway))))
        .token(TOKEN)
        .connect()
        .await
        .expect("the gRPC worker registers");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem(&gateway).as_bytes()).unwrap())
        .unwrap();
    let quic = QuicWorker::builder(gateway.addr("quic").unwrap(), "localhost")
        .namespaces([NAMESPACE])
        .activity(
            ACTIVITY,
            |_: switchyard_transport_quic::ActivityContext, _: Bytes| async {
                Ok(Bytes::from_static(b"quic"))
            },
        )
        .max_concurrency(1)
        .tls(ClientTls::new(roots).unwrap())
        .token(TOKEN)
        .connect()
        .await
        .expect("the QUIC worker registers");
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (start_signal, held) = (Arc::clone(&started), Arc::clone(&release));
    let websocket = WsWorker::builder(ws_url(&gateway))
        .namespaces([NAMESPACE])
        .activity(ACTIVITY, |_: ActivityContext, _: Bytes| async {
            Ok::<_, ActivityError>(Bytes::from_static(b"websocket"))
        })
        .activity(HOLD, move |_: ActivityContext, input: Bytes| {
            let (started, held) = (Arc::clone(&start_signal), Arc::clone(&held));
            async move {
                started.notify_one();
                held.notified().await;
                Ok::<_, ActivityError>(input)
            }
        })
        .max_concurrency(1)
        .tls(ws_tls(&gateway))
        .token(TOKEN)
        .connect()
        .await
        .expect("the WebSocket worker registers");
    let websocket_id = websocket.worker_id();
    let grpc_run = tokio::spawn(grpc.run());
    let quic_run = tokio::spawn(quic.run());
    let websocket_run = tokio::spawn(websocket.run());

    let registry = gateway.core().registry();
    wait_for(registry, |r| {
        r.workers()
            .iter()
            .filter(|w| w.eligibility == Eligibility::Eligible)
            .count()
            == 3
    })
    .await;
    let transports: BTreeSet<String> = registry
        .workers()
        .iter()
        .map(|w| w.worker.transport().to_string())
        .collect();
    assert_eq!(
        transports,
        BTreeSet::from(["grpc", "quic", "websocket"].map(String::from))
    );

    let producer = CallerIdentity::granted("producer", [NAMESPACE]);
    let mut served = Vec::new();
    for i in 0..9 {
        let request = ActivityRequest {
            namespace: NAMESPACE.to_owned(),
            task_queue: String::new(),
            activity_type: ACTIVITY.to_owned(),
            node: None,
            input: Bytes::from(format!("call {i}")),
            activity_id: None,
            timeout: STEP,
        };
        match gateway
            .core()
            .dispatcher()
            .dispatch(&producer, request)
            .await
            .unwrap()
        {
            ActivityOutcome::Completed(by) => served.push(String::from_utf8(by.to_vec()).unwrap()),
            other => panic!("dispatch {i} ended {other:?}"),
        }
    }
    let servers: BTreeSet<&str> = served.iter().map(String::as_str).collect();
    assert_eq!(
        servers,
        BTreeSet::from(["grpc", "quic", "websocket"]),
        "every transport's worker served from the shared pool: {served:?}"
    );

    // A graceful shutdown drains the WebSocket worker: the task it holds finishes, the worker
    // leaves and `run` ends well, whether the drain or the result crosses the wire first.
    let core = gateway.core().clone();
    let mut events = core.registry().subscribe_events();
    let held_dispatch = {
        let core = core.clone();
        let mut request = request(HOLD, "held through the drain");
        request.timeout = STEP * 2;
        tokio::spawn(async move { core.dispatcher().dispatch(&producer, request).await })
    };
    tokio::time::timeout(STEP, started.notified())
        .await
        .expect("the held task starts on the WebSocket worker");
    let shutdown = tokio::spawn(gateway.shutdown());
    release.notify_one();
    let held = tokio::time::timeout(STEP, held_dispatch)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        held,
        ActivityOutcome::Completed(Bytes::from_static(b"held through the drain"))
    );
    let websocket_end = tokio::time::timeout(STEP, websocket_run)
        .await
        .unwrap()
        .unwrap();
    assert!(
        websocket_end.is_ok(),
        "the WebSocket worker drained: {websocket_end:?}"
    );
    let left = async {
        loop {
            if let Ok(WorkerEvent::Disconnected { worker, .. }) = events.recv().await {
                if worker == websocket_id {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(STEP, left)
        .await
        .expect("the drained worker leaves");
    tokio::time::timeout(STEP * 2, shutdown)
        .await
        .unwrap()
        .unwrap();
    grpc_run.abort();
    quic_run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_workers_authenticate_against_the_gateway_principal_table() {
    let data_dir = tempfile::tempdir().unwrap();
    let gateway = gateway(data_dir.path()).await;
    let attempt = |token: &'static str, namespace: &'static str| {
        WsWorker::builder(ws_url(&gateway))
            .namespaces([namespace])
            .activity(ACTIVITY, |_: ActivityContext, input: Bytes| async move {
                Ok::<_, ActivityError>(input)
            })
            .tls(ws_tls(&gateway))
            .token(token)
            .connect()
    };
    let unknown = attempt("guess", NAMESPACE).await.unwrap_err();
    assert_eq!(
        unknown.close_code(),
        Some(CloseCode::Unauthenticated),
        "{unknown}"
    );
    let foreign = attempt(TOKEN, "elsewhere").await.unwrap_err();
    assert_eq!(
        foreign.close_code(),
        Some(CloseCode::NamespaceNotGranted),
        "{foreign}"
    );
    assert!(
        matches!(&foreign, WsLinkError::Refused { message, .. } if message.contains("mixed-workers")),
        "{foreign}"
    );
    let roleless = attempt(PRODUCER_TOKEN, NAMESPACE).await.unwrap_err();
    assert_eq!(
        roleless.close_code(),
        Some(CloseCode::NamespaceNotGranted),
        "{roleless}"
    );
    assert!(
        matches!(&roleless, WsLinkError::Refused { message, .. }
            if message.contains("lacks role `worker`")),
        "{roleless}"
    );
    // Control: the principal's own token and namespace register.
    let admitted = attempt(TOKEN, NAMESPACE).await.unwrap();
    assert!(
        gateway
            .core()
            .registry()
            .is_registered(admitted.worker_id())
    );
    // Its socket goes with it, so the shutdown has no close handshake to wait out.
    drop(admitted);
    gateway.shutdown().await;
}

/// How a raw WebSocket registration through the gateway ended: admitted, or the close code.
async fn raw_registration(gateway: &Gateway, authorization: Option<&str>) -> Result<(), u16> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::Connector;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;

    let mut request = ws_url(gateway).into_client_request().unwrap();
    if let Some(value) = authorization {
        request
            .headers_mut()
            .insert("authorization", HeaderValue::from_str(value).unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(gateway.addr("websocket").unwrap())
        .await
        .unwrap();
    let connector = Connector::Rustls(ws_tls(gateway));
    let (mut socket, _) =
        tokio_tungstenite::client_async_tls_with_config(request, tcp, None, Some(connector))
            .await
            .unwrap();
    let register = serde_json::json!({
        "type": "register",
        "namespaces": [NAMESPACE],
        "activity_types": [ACTIVITY],
        "identity": "raw credential row",
        "max_concurrency": 1,
    });
    socket
        .send(Message::text(register.to_string()))
        .await
        .unwrap();
    for _ in 0..100 {
        let message = tokio::time::timeout(STEP, socket.next())
            .await
            .expect("an answer within the step")
            .expect("an answer before the stream ends")
            .expect("a healthy socket until the close");
        match message {
            Message::Text(text) if text.contains("\"registered\"") => return Ok(()),
            Message::Close(Some(close)) => return Err(close.code.into()),
            _ => {}
        }
    }
    panic!("no registration answer within 100 messages");
}

/// The WebSocket column of `docs/security.md` "Credentials × transports": the header's scheme
/// in any case, an unknown token and no credential at all, against the gateway's principal
/// table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_answers_each_websocket_credential_like_every_transport() {
    let data_dir = tempfile::tempdir().unwrap();
    let gateway = gateway(data_dir.path()).await;
    let unauthenticated = Err(CloseCode::Unauthenticated.code());
    let rows = [
        (Some(format!("Bearer {TOKEN}")), Ok(())),
        (Some(format!("bearer {TOKEN}")), Ok(())),
        (Some("Bearer guess".to_owned()), unauthenticated),
        (Some(format!("Basic {TOKEN}")), unauthenticated),
        (None, unauthenticated),
    ];
    for (authorization, expected) in rows {
        let answer = raw_registration(&gateway, authorization.as_deref()).await;
        assert_eq!(answer, expected, "{authorization:?}");
    }
    gateway.shutdown().await;
}
