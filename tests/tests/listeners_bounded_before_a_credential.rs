//! What a peer without a credential can hold on the gateway's TCP listeners is bounded: a
//! silent TLS connection is closed at `grpc.handshake_timeout`, a slowloris request on the
//! operations port at `ops.header_read_timeout`, connections from one address beyond
//! `grpc.max_connections_per_address` are closed at accept while another address still
//! connects, health `Watch` streams stop at `grpc.max_health_watchers`, and reflection needs a
//! credential in principals mode. Loopback only; every wait is bounded.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::StreamExt;
use switchyard_gateway::{ConfigDuration, PrincipalSection};
use switchyard_tests::{TestGateway, counter, http_get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

/// Longest any single wait in these tests may take before it counts as a failure.
const PATIENCE: Duration = Duration::from_secs(15);

const OPS_TOKEN: &str = "ops-token-0123456789abcdef";

/// Waits for the peer to close `stream`: true on EOF or a reset, false if it is still open
/// after `PATIENCE`.
async fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // Bytes the server sent before closing (a TLS alert, an HTTP 408) are read past.
            Ok(Ok(_)) => continue,
        }
    }
}

async fn channel(gateway: &TestGateway, local: Option<IpAddr>) -> Channel {
    let addr = gateway.gateway().addr("grpc").unwrap();
    Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(gateway.ca_pem())))
        .unwrap()
        .local_address(local)
        .connect_timeout(PATIENCE)
        .connect()
        .await
        .unwrap()
}

async fn serving(channel: Channel) -> bool {
    let mut health = HealthClient::new(channel);
    let check = health.check(HealthCheckRequest {
        service: String::new(),
    });
    matches!(tokio::time::timeout(PATIENCE, check).await, Ok(Ok(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_at_the_handshake_timeout() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.grpc.handshake_timeout = ConfigDuration::secs(1);
    })
    .await;
    let addr = gateway.gateway().addr("grpc").unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_by_peer(&mut silent).await,
        "a connection that never starts TLS is still open after {PATIENCE:?}"
    );
    // Control: a client that completed its handshake before is not cut off by the timeout.
    let channel = channel(&gateway, None).await;
    assert!(serving(channel.clone()).await);
    let mut later = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_peer(&mut later).await);
    assert!(
        serving(channel).await,
        "a handshaken connection outlives the timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_request_is_closed_at_the_header_read_timeout() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.ops.header_read_timeout = ConfigDuration::secs(1);
    })
    .await;
    let ops = gateway.gateway().ops_addr().unwrap();
    let mut slow = TcpStream::connect(ops).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: ops\r\n")
        .await
        .unwrap();
    // One more header line, never the blank line that ends them.
    slow.write_all(b"X-Slow: 1\r\n").await.unwrap();
    assert!(
        closed_by_peer(&mut slow).await,
        "a request whose headers never end is still open after {PATIENCE:?}"
    );
    // Control: a whole request on the same listener is answered.
    let (status, body) = http_get(ops, "/healthz").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
}

/// `ops.header_read_timeout` also bounds a keep-alive connection idle between requests, well
/// before `ops.idle_timeout` (60 s here, longer than this test waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_the_header_read_timeout() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.ops.header_read_timeout = ConfigDuration::secs(1);
        config.ops.idle_timeout = ConfigDuration::secs(60);
    })
    .await;
    let ops = gateway.gateway().ops_addr().unwrap();
    let mut kept = TcpStream::connect(ops).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: ops\r\n\r\n")
        .await
        .unwrap();
    // The whole answer (a 200 with the body "ok"), on a connection kept alive after it.
    let mut answer = Vec::new();
    while !answer.ends_with(b"ok\n") {
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(PATIENCE, kept.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(read > 0, "closed before the answer: {answer:?}");
        answer.extend_from_slice(&buf[..read]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    assert!(
        closed_by_peer(&mut kept).await,
        "an idle keep-alive connection is still open after {PATIENCE:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_connections_beyond_the_limit_are_closed_and_a_closed_one_makes_room() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.ops.max_connections = 2;
        config.ops.header_read_timeout = ConfigDuration::secs(60);
    })
    .await;
    let ops = gateway.gateway().ops_addr().unwrap();
    // Two idle connections (no request yet) hold both places.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(ops).await.unwrap());
    }
    let mut extra = TcpStream::connect(ops).await.unwrap();
    assert!(
        closed_by_peer(&mut extra).await,
        "a third ops connection is still open"
    );
    // Control: once one is closed, a request is answered.
    drop(held.pop());
    let answered = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok((200, body)) = http_get(ops, "/healthz").await {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the freed place takes a request");
    assert_eq!(answered, "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_per_address_limit_are_closed_and_others_still_connect() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.grpc.max_connections_per_address = 2;
        config.grpc.handshake_timeout = ConfigDuration::secs(60);
    })
    .await;
    let addr = gateway.gateway().addr("grpc").unwrap();
    let ops = gateway.gateway().ops_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_by_peer(&mut extra).await,
        "a third connection from 127.0.0.1 is still open"
    );
    let (_, metrics) = http_get(ops, "/metrics").await.unwrap();
    let refused = metrics.lines().any(|line| {
        line.starts_with("switchyard_connections_refused_total{")
            && line.contains("listener=\"grpc\"")
            && line.contains("limit=\"max_connections_per_address\"")
    });
    assert!(refused, "no refusal counted:\n{metrics}");

    // Another source address is not held back by 127.0.0.1's connections.
    let other = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    assert!(serving(channel(&gateway, Some(other)).await).await);
    // A raw socket from it stays open while 127.0.0.1's third does not.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(other, 0)).unwrap();
    let mut from_other = socket.connect(addr).await.unwrap();
    let mut byte = [0u8; 1];
    let still_open =
        tokio::time::timeout(Duration::from_millis(500), from_other.read(&mut byte)).await;
    assert!(still_open.is_err(), "127.0.0.2 was refused: {still_open:?}");

    // Control: once one of 127.0.0.1's connections ends, it may connect again.
    drop(held.pop());
    let mut admitted = false;
    for _ in 0..50 {
        let mut again = TcpStream::connect(addr).await.unwrap();
        if tokio::time::timeout(Duration::from_millis(200), again.read(&mut byte))
            .await
            .is_err()
        {
            admitted = true;
            break;
        }
    }
    assert!(admitted, "the freed place was not given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_streams_beyond_the_limit_are_refused_naming_it() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.grpc.max_health_watchers = 2;
    })
    .await;
    let mut health = HealthClient::new(channel(&gateway, None).await);
    let request = || HealthCheckRequest {
        service: String::new(),
    };
    let mut first = health.watch(request()).await.unwrap().into_inner();
    let _second = health.watch(request()).await.unwrap().into_inner();
    assert!(first.next().await.is_some(), "an admitted watch answers");
    let ops = gateway.gateway().ops_addr().unwrap();
    let refusals = || {
        counter(
            ops,
            "switchyard_health_watch_refused_total",
            "limit=\"grpc.max_health_watchers\"",
        )
    };
    assert_eq!(
        refusals().await.unwrap(),
        0,
        "two watches are within the limit"
    );
    let refused = health.watch(request()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("grpc.max_health_watchers (2) reached"),
        "{}",
        refused.message()
    );
    assert_eq!(refusals().await.unwrap(), 1, "the refusal is counted");
    // `Check` is not limited: at the limit it still answers.
    let checked = health
        .check(request())
        .await
        .expect("Check at the watch limit");
    assert_eq!(
        checked.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // Control: a watch that ends gives its place back.
    drop(first);
    let mut admitted = false;
    for _ in 0..50 {
        if health.watch(request()).await.is_ok() {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(admitted, "the ended watch's place was not given back");
}

fn ops_principal() -> PrincipalSection {
    PrincipalSection {
        name: "ops".to_owned(),
        token: OPS_TOKEN.to_owned(),
        namespaces: vec!["*".to_owned()],
        ..PrincipalSection::default()
    }
}

async fn list_services(channel: Channel, token: Option<&str>) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(futures::stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    let mut replies = ServerReflectionClient::new(channel)
        .server_reflection_info(request)
        .await?
        .into_inner();
    match replies.next().await {
        Some(Ok(_)) => Ok(()),
        Some(Err(status)) => Err(status),
        None => Err(tonic::Status::unknown("no reply")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_needs_a_credential_in_principals_mode() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.principals = vec![ops_principal()];
    })
    .await;
    let channel = channel(&gateway, None).await;
    let refused = list_services(channel.clone(), None).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    // Control: the same call with the principal's token is answered.
    list_services(channel.clone(), Some(OPS_TOKEN))
        .await
        .unwrap();
    // Health stays open to callers without a credential.
    assert!(serving(channel).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_can_be_opened_or_turned_off() {
    let open = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.principals = vec![ops_principal()];
        config.grpc.reflection = switchyard_gateway::ReflectionName::Open;
    })
    .await;
    list_services(channel(&open, None).await, None)
        .await
        .unwrap();
    let off = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.grpc.reflection = switchyard_gateway::ReflectionName::Off;
    })
    .await;
    let unserved = list_services(channel(&off, None).await, None)
        .await
        .unwrap_err();
    assert_eq!(unserved.code(), tonic::Code::Unimplemented, "{unserved}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_per_connection_limit_wait_for_one_to_end() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.grpc.max_concurrent_streams = 2;
    })
    .await;
    // One channel is one HTTP/2 connection.
    let mut health = HealthClient::new(channel(&gateway, None).await);
    let request = || HealthCheckRequest {
        service: String::new(),
    };
    let first = health.watch(request()).await.unwrap().into_inner();
    let _second = health.watch(request()).await.unwrap().into_inner();
    let mut third = Box::pin({
        let mut health = health.clone();
        async move { health.watch(request()).await }
    });
    let early = tokio::time::timeout(Duration::from_millis(500), third.as_mut()).await;
    assert!(
        early.is_err(),
        "a third stream opened while the connection allows two: {early:?}"
    );
    // Control: when a stream ends, the waiting one opens.
    drop(first);
    let opened = tokio::time::timeout(PATIENCE, third).await;
    assert!(matches!(opened, Ok(Ok(_))), "{opened:?}");
}
