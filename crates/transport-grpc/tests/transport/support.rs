//! Shared setup for the loopback tests: a test PKI, a TLS gateway, raw generated clients.
// Test layout, the same in every transport crate (gRPC, QUIC, WebSocket): one test binary,
// `tests/transport/main.rs`, with one module per behaviour next to this `support` module. One
// binary links once per crate rather than once per file, and `support.rs` needs neither a
// `mod.rs` nor an `autotests = false` list to keep it from being a test target of its own.
// Test scaffolding: a failed setup step should fail the test loudly, and each test file uses
// a different subset of the helpers.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::panic)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use switchyard_auth::CallerTable;
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, Core, CoreConfig, LivenessConfig,
    NamespaceGrant, Registry, RegistryBuilder, WorkerEvent, WorkerId,
};
use switchyard_proto::v1::worker_gateway_client::WorkerGatewayClient;
use switchyard_proto::v1::{
    ActivityResult, GatewayFrame, Pong, RegisterWorker, WorkerFrame, activity_result,
    gateway_frame, worker_frame,
};
use switchyard_test_support::{Issued, TestCa};
pub use switchyard_test_support::{PATIENCE, TcpRelay, within};
use switchyard_transport_grpc::{GrpcServerConfig, WorkerService, serve};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};
use tonic::{Request, Status, Streaming};

/// Token of a caller granted every namespace.
pub const TRUSTED_TOKEN: &str = "token-trusted";
/// Token of a caller granted only `billing`.
pub const BILLING_TOKEN: &str = "token-billing";
/// Principal of [`BILLING_TOKEN`].
pub const BILLING_PRINCIPAL: &str = "billing-team";
/// Common name of the client certificate the directory grants `billing`.
pub const CERT_PRINCIPAL: &str = "worker-cert";

/// A CA and a server certificate for `localhost` / 127.0.0.1, made fresh per test, as the
/// tonic TLS configs these tests use.
pub struct Pki {
    ca: TestCa,
    server: Issued,
}

impl Pki {
    pub fn new() -> Self {
        let ca = TestCa::new("switchyard test ca");
        let server = ca.server();
        Self { ca, server }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    pub fn server_tls(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(
                &self.server.cert_pem,
                &self.server.key_pem,
            ))
            .client_ca_root(Certificate::from_pem(self.ca_pem()))
            .client_auth_optional(true)
    }

    /// Client TLS trusting the test CA, without a client certificate.
    pub fn client_tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca_pem()))
            .domain_name("localhost")
    }

    /// Client TLS presenting a certificate whose subject common name is `common_name`.
    pub fn client_tls_as(&self, common_name: &str) -> ClientTlsConfig {
        let client = self.ca.client(common_name);
        self.client_tls()
            .identity(Identity::from_pem(client.cert_pem, client.key_pem))
    }
}

/// Liveness fast enough for tests: new workers are eligible within a round trip.
pub fn fast_liveness() -> LivenessConfig {
    LivenessConfig {
        ping_interval: Duration::from_millis(200),
        ping_timeout: Duration::from_secs(2),
        probation_pings: 2,
        miss_threshold: 3,
        heartbeat_window: Duration::from_secs(60),
    }
}

/// A gateway serving only the worker service over TLS on an ephemeral loopback port.
pub struct Gateway {
    pub core: Core,
    pub addr: SocketAddr,
    pub pki: Pki,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Builds gateways for tests.
pub struct GatewayBuilder {
    registry: RegistryBuilder,
    config: GrpcServerConfig,
    liveness: LivenessConfig,
    anonymous: Option<CallerIdentity>,
}

impl GatewayBuilder {
    pub fn registry(mut self, registry: RegistryBuilder) -> Self {
        self.registry = registry;
        self
    }

    pub fn config(mut self, config: GrpcServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Who callers presenting no credential are (default: refused).
    pub fn anonymous(mut self, caller: CallerIdentity) -> Self {
        self.anonymous = Some(caller);
        self
    }

    pub fn liveness(mut self, liveness: LivenessConfig) -> Self {
        self.liveness = liveness;
        self
    }

    pub async fn start(self) -> Gateway {
        let (core, directory, config) = self.parts();
        Gateway::serve(core, directory, config).await
    }

    /// Stops `old` and starts a new gateway (a fresh core) on its address with its PKI, as a
    /// gateway restarted in place would be; workers connected to `old` reconnect to it.
    pub async fn restart_of(self, mut old: Gateway) -> Gateway {
        let (core, directory, config) = self.parts();
        if let Some(stop) = old.stop.take() {
            let _ = stop.send(());
        }
        let addr = old.addr;
        let pki = std::mem::replace(&mut old.pki, Pki::new());
        drop(old);
        // The old server lets go of the port once its accept loop sees the stop.
        let listener = within("the old gateway's port to be free", async {
            loop {
                match TcpListener::bind(addr).await {
                    Ok(listener) => return listener,
                    Err(_) => tokio::task::yield_now().await,
                }
            }
        })
        .await;
        Gateway::serve_on(listener, pki, core, directory, config)
    }

    fn parts(self) -> (Core, CallerTable, GrpcServerConfig) {
        let core = Core::start(
            self.registry,
            CoreConfig {
                liveness: self.liveness,
                ..CoreConfig::default()
            },
        );
        let mut directory = CallerTable::new()
            .with_token(TRUSTED_TOKEN, CallerIdentity::trusted("tester"))
            .with_token(
                BILLING_TOKEN,
                CallerIdentity::granted(BILLING_PRINCIPAL, ["billing"]),
            )
            .with_certificate(
                CERT_PRINCIPAL,
                CallerIdentity {
                    grant: NamespaceGrant::Only(["billing".to_owned()].into()),
                    ..CallerIdentity::trusted(CERT_PRINCIPAL)
                },
            );
        if let Some(anonymous) = self.anonymous {
            directory = directory.anonymous(anonymous);
        }
        (core, directory, self.config)
    }
}

impl Gateway {
    /// Serves `core` over TLS on an ephemeral loopback port with a fresh PKI.
    pub async fn serve(core: Core, directory: CallerTable, config: GrpcServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve_on(listener, Pki::new(), core, directory, config)
    }

    /// Serves `core` over TLS from `pki` on `listener`.
    fn serve_on(
        listener: TcpListener,
        pki: Pki,
        core: Core,
        directory: CallerTable,
        config: GrpcServerConfig,
    ) -> Self {
        let service = WorkerService::new(core.clone(), Arc::new(directory), config);
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let tls = pki.server_tls();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            serve(listener, Some(tls), service, shutdown).await.unwrap();
        });
        Gateway {
            core,
            addr,
            pki,
            stop: Some(stop),
        }
    }

    pub fn builder() -> GatewayBuilder {
        GatewayBuilder {
            registry: Registry::builder(),
            config: GrpcServerConfig::default(),
            liveness: fast_liveness(),
            anonymous: None,
        }
    }

    pub async fn start() -> Self {
        Self::builder().start().await
    }

    pub fn endpoint(&self) -> String {
        https_endpoint(self.addr)
    }

    /// A raw generated client over TLS (no client certificate).
    pub async fn raw_client(&self) -> WorkerGatewayClient<Channel> {
        self.raw_client_with(self.pki.client_tls()).await
    }

    pub async fn raw_client_with(&self, tls: ClientTlsConfig) -> WorkerGatewayClient<Channel> {
        raw_client_at(&self.endpoint(), tls).await
    }
}

/// The `https://localhost:<port>` endpoint of `addr`, as a worker dials it (through a
/// [`TcpRelay`] or straight to the gateway).
pub fn https_endpoint(addr: SocketAddr) -> String {
    format!("https://localhost:{}", addr.port())
}

pub async fn raw_client_at(endpoint: &str, tls: ClientTlsConfig) -> WorkerGatewayClient<Channel> {
    let channel = Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    WorkerGatewayClient::new(channel)
}

/// The worker half of a raw stream.
pub struct RawStream {
    pub send: mpsc::Sender<WorkerFrame>,
    pub recv: Streaming<GatewayFrame>,
    /// Frames read while waiting for something else, oldest first.
    pending: VecDeque<gateway_frame::Frame>,
}

/// Opens a stream with `token` (if any); `Err` is the status the call itself failed with.
pub async fn open(
    client: &mut WorkerGatewayClient<Channel>,
    token: Option<&str>,
) -> Result<RawStream, Status> {
    let (send, frames) = mpsc::channel(64);
    let mut request = Request::new(ReceiverStream::new(frames));
    if let Some(token) = token {
        let value = MetadataValue::try_from(format!("Bearer {token}")).unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    let recv = client.connect_worker(request).await?.into_inner();
    Ok(RawStream {
        send,
        recv,
        pending: VecDeque::new(),
    })
}

pub fn register(namespaces: &[&str], activities: &[&str], capacity: Option<u32>) -> WorkerFrame {
    frame(worker_frame::Frame::Register(RegisterWorker {
        namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
        task_queue: String::new(),
        node: String::new(),
        activity_types: activities.iter().map(|s| (*s).to_owned()).collect(),
        identity: "raw test worker".to_owned(),
        max_concurrency: capacity,
        resumable: false,
    }))
}

pub fn frame(inner: worker_frame::Frame) -> WorkerFrame {
    WorkerFrame { frame: Some(inner) }
}

enum Read {
    Frame(gateway_frame::Frame),
    Answered,
    End,
}

impl RawStream {
    pub async fn send(&self, frame: WorkerFrame) {
        self.send.send(frame).await.unwrap();
    }

    /// The next gateway frame, answering pings on the way; `Err` is the closing status and
    /// `Ok(None)` a clean end.
    pub async fn next_non_ping(&mut self) -> Result<Option<gateway_frame::Frame>, Status> {
        if let Some(frame) = self.pending.pop_front() {
            return Ok(Some(frame));
        }
        within("a gateway frame", async {
            loop {
                match self.read_one().await? {
                    Read::Frame(frame) => return Ok(Some(frame)),
                    Read::End => return Ok(None),
                    Read::Answered => {}
                }
            }
        })
        .await
    }

    /// Reads one frame, answering it if it is a ping.
    async fn read_one(&mut self) -> Result<Read, Status> {
        Ok(match self.recv.message().await? {
            Some(GatewayFrame {
                frame: Some(gateway_frame::Frame::Ping(ping)),
            }) => {
                let pong = frame(worker_frame::Frame::Pong(Pong { seq: ping.seq }));
                // The stream may be closing; the next read says so.
                let _ = self.send.send(pong).await;
                Read::Answered
            }
            Some(GatewayFrame { frame: Some(frame) }) => Read::Frame(frame),
            Some(GatewayFrame { frame: None }) => Read::Answered,
            None => Read::End,
        })
    }

    /// Answers `count` pings (keeping other frames for later).
    pub async fn answer_pings(&mut self, count: usize) {
        within("pings", async {
            let mut answered = 0;
            while answered < count {
                match self.read_one().await {
                    Ok(Read::Frame(frame)) => self.pending.push_back(frame),
                    Ok(Read::Answered) => answered += 1,
                    Ok(Read::End) => panic!("stream ended while answering pings"),
                    Err(status) => panic!("stream failed while answering pings: {status:?}"),
                }
            }
        })
        .await;
    }

    /// Answers pings (keeping other frames for later) until core makes `worker` eligible.
    pub async fn until_eligible(&mut self, core: &Core, worker: WorkerId) {
        within("the worker to become eligible", async {
            loop {
                let arrival = core.registry().worker_arrival();
                if is_eligible(core, worker) {
                    return;
                }
                tokio::select! {
                    () = arrival => {}
                    read = self.read_one() => match read {
                        Ok(Read::Frame(frame)) => self.pending.push_back(frame),
                        Ok(Read::Answered) => {}
                        Ok(Read::End) => panic!("stream ended while waiting"),
                        Err(status) => panic!("stream failed while waiting: {status:?}"),
                    },
                }
            }
        })
        .await;
    }

    /// Registers and returns the acknowledged worker id.
    pub async fn register(&mut self, frame: WorkerFrame) -> WorkerId {
        self.send(frame).await;
        match self.next_non_ping().await {
            Ok(Some(gateway_frame::Frame::RegisterAck(ack))) => WorkerId::from_raw(ack.worker_id),
            other => panic!("expected a register ack, got {other:?}"),
        }
    }

    /// The status the gateway closes the stream with.
    pub async fn closing_status(&mut self) -> Status {
        loop {
            match self.next_non_ping().await {
                Err(status) => return status,
                Ok(None) => panic!("stream ended without a status"),
                Ok(Some(_)) => {}
            }
        }
    }
}

/// Waits until `worker` is dispatchable: registered and past opening probation.
pub async fn eligible(core: &Core, worker: WorkerId) {
    within("the worker to become eligible", async {
        loop {
            let arrival = core.registry().worker_arrival();
            if is_eligible(core, worker) {
                return;
            }
            arrival.await;
        }
    })
    .await;
}

fn is_eligible(core: &Core, worker: WorkerId) -> bool {
    core.registry()
        .worker(worker)
        .is_some_and(|s| s.eligibility.is_eligible())
}

/// Waits for `worker`'s `Disconnected` event and returns its reason.
pub async fn disconnected(
    events: &mut broadcast::Receiver<WorkerEvent>,
    worker: WorkerId,
) -> switchyard_core::DisconnectReason {
    within("the worker to be deregistered", async {
        loop {
            if let WorkerEvent::Disconnected { worker: w, reason } = events.recv().await.unwrap() {
                if w == worker {
                    return reason;
                }
            }
        }
    })
    .await
}

/// A dispatch request with a generous timeout.
pub fn request(namespace: &str, activity_type: &str, input: &'static [u8]) -> ActivityRequest {
    ActivityRequest {
        namespace: namespace.to_owned(),
        task_queue: String::new(),
        activity_type: activity_type.to_owned(),
        node: None,
        input: Bytes::from_static(input),
        activity_id: None,
        timeout: PATIENCE,
    }
}

/// Dispatches `request` on its own task as a trusted producer.
pub fn dispatch(core: &Core, request: ActivityRequest) -> tokio::task::JoinHandle<ActivityOutcome> {
    let core = core.clone();
    tokio::spawn(async move {
        core.dispatcher()
            .dispatch(&CallerIdentity::trusted("producer"), request)
            .await
            .unwrap()
    })
}

/// A `result` frame reporting success with `output`.
pub fn success(task_id: u64, output: &'static [u8]) -> WorkerFrame {
    frame(worker_frame::Frame::Result(ActivityResult {
        task_id,
        outcome: Some(activity_result::Outcome::Output(Bytes::from_static(output))),
    }))
}

/// Sends each message's bytes as given (malformed protobuf included), decodes replies as
/// `GatewayFrame`s.
#[derive(Clone, Copy, Debug, Default)]
struct BytesCodec;

struct BytesEncoder;

struct FrameDecoder;

impl tonic::codec::Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = GatewayFrame;
    type Encoder = BytesEncoder;
    type Decoder = FrameDecoder;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> FrameDecoder {
        FrameDecoder
    }
}

impl tonic::codec::Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for FrameDecoder {
    type Item = GatewayFrame;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<GatewayFrame>, Status> {
        <GatewayFrame as prost::Message>::decode(src)
            .map(Some)
            .map_err(|error| Status::internal(error.to_string()))
    }
}

/// A worker stream whose messages are raw bytes: what a broken worker can put on the wire.
pub struct RawBytesStream {
    pub send: mpsc::Sender<Bytes>,
    pub recv: Streaming<GatewayFrame>,
}

impl RawBytesStream {
    /// Opens a call to `gateway` as the trusted caller.
    pub async fn open(gateway: &Gateway) -> Self {
        let channel = Endpoint::from_shared(gateway.endpoint())
            .unwrap()
            .tls_config(gateway.pki.client_tls())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
        grpc.ready().await.unwrap();
        let (send, outbound) = mpsc::channel(16);
        let mut request = Request::new(ReceiverStream::new(outbound));
        let token = MetadataValue::try_from(format!("Bearer {TRUSTED_TOKEN}")).unwrap();
        request.metadata_mut().insert("authorization", token);
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/switchyard.v1.WorkerGateway/ConnectWorker",
        );
        let recv = grpc
            .streaming(request, path, BytesCodec)
            .await
            .unwrap()
            .into_inner();
        Self { send, recv }
    }

    /// Sends a well-formed frame.
    pub async fn send(&self, frame: WorkerFrame) {
        self.send_raw(Bytes::from(prost::Message::encode_to_vec(&frame)))
            .await;
    }

    /// Sends one message's bytes as they are.
    pub async fn send_raw(&self, message: Bytes) {
        self.send.send(message).await.unwrap();
    }

    /// Registers and returns the acknowledged worker id.
    pub async fn register(&mut self, frame: WorkerFrame) -> WorkerId {
        WorkerId::from_raw(self.register_ack(frame).await.worker_id)
    }

    /// Registers and returns the acknowledgement.
    pub async fn register_ack(&mut self, frame: WorkerFrame) -> switchyard_proto::v1::RegisterAck {
        self.send(frame).await;
        match within("the acknowledgement", self.recv.message()).await {
            Ok(Some(GatewayFrame {
                frame: Some(gateway_frame::Frame::RegisterAck(ack)),
            })) => ack,
            other => panic!("expected a register ack, got {other:?}"),
        }
    }

    /// The status the call ends with, answering pings and dropping other frames on the way.
    pub async fn closing_status(&mut self) -> Status {
        within("the stream to end", async {
            loop {
                match self.recv.message().await {
                    Ok(Some(GatewayFrame {
                        frame: Some(gateway_frame::Frame::Ping(ping)),
                    })) => {
                        let pong = frame(worker_frame::Frame::Pong(Pong { seq: ping.seq }));
                        let _ = self
                            .send
                            .send(Bytes::from(prost::Message::encode_to_vec(&pong)))
                            .await;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("stream ended without a status"),
                    Err(status) => return status,
                }
            }
        })
        .await
    }
}
