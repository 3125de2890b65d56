//! A gateway on loopback, SDK workers for it, and a raw protocol client that speaks frames
//! by hand (to send what no well-behaved worker would).
// Test layout, the same in every transport crate (gRPC, QUIC, WebSocket): one test binary,
// `tests/transport/main.rs`, with one module per behaviour next to this `support` module. One
// binary links once per crate rather than once per file, and `support.rs` needs neither a
// `mod.rs` nor an `autotests = false` list to keep it from being a test target of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, ConnectionError, Endpoint, RecvStream, SendStream};
use switchyard_auth::{AllowAll, Authenticate};
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, Core, CoreConfig, PoolCensus, Registry,
    RegistryBuilder, WorkerEvent,
};
use switchyard_proto::v1::{
    QuicCancel, QuicControlDown, QuicControlUp, QuicLaneDown, QuicLaneUp, QuicPong, QuicRegister,
    QuicRegistered, QuicTask, quic_control_down, quic_control_up, quic_lane_down, quic_lane_up,
};
use switchyard_transport_quic::frame::{FrameDecoder, decode, encode_frame};
use switchyard_transport_quic::{
    ALPN, ActivityContext, ActivityError, ErrorCode, QuicServer, QuicServerConfig, QuicWorker,
    QuicWorkerBuilder, SelfSigned,
};
use tokio::sync::{Mutex, broadcast, mpsc};

pub(crate) use switchyard_test_support::PATIENCE;
/// The namespace every test worker serves.
pub(crate) const NS: &str = "ns";

/// A core and a QUIC listener on 127.0.0.1.
pub(crate) struct Gateway {
    pub(crate) core: Core,
    pub(crate) server: QuicServer,
    pub(crate) ca: Arc<SelfSigned>,
}

impl Gateway {
    pub(crate) async fn start() -> Self {
        Self::with(QuicServerConfig::default(), AllowAll).await
    }

    pub(crate) async fn with(config: QuicServerConfig, auth: impl Authenticate) -> Self {
        Self::with_tls(config, auth, false).await
    }

    pub(crate) async fn with_tls(
        config: QuicServerConfig,
        auth: impl Authenticate,
        mutual: bool,
    ) -> Self {
        Self::over(Registry::builder(), config, auth, mutual).await
    }

    /// A gateway whose registry admits at most `limit` slots per worker.
    pub(crate) async fn with_ceiling(limit: u32) -> Self {
        let registry = Registry::builder().max_concurrency_limit(limit);
        Self::over(registry, QuicServerConfig::default(), AllowAll, false).await
    }

    /// A gateway whose core runs with `core`.
    pub(crate) async fn with_core(core: CoreConfig) -> Self {
        Self::over_core(
            Registry::builder(),
            core,
            QuicServerConfig::default(),
            AllowAll,
            false,
        )
        .await
    }

    async fn over(
        registry: RegistryBuilder,
        config: QuicServerConfig,
        auth: impl Authenticate,
        mutual: bool,
    ) -> Self {
        Self::over_core(registry, CoreConfig::default(), config, auth, mutual).await
    }

    async fn over_core(
        registry: RegistryBuilder,
        core: CoreConfig,
        config: QuicServerConfig,
        auth: impl Authenticate,
        mutual: bool,
    ) -> Self {
        let ca = Arc::new(SelfSigned::new(["localhost"]).unwrap());
        let tls = if mutual {
            ca.server_tls_mutual().unwrap()
        } else {
            ca.server_tls().unwrap()
        };
        let core = Core::start(registry, core);
        let server = QuicServer::builder(core.clone(), tls)
            .config(QuicServerConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                ..config
            })
            .authenticator(Arc::new(auth))
            .bind()
            .await
            .unwrap();
        Self { core, server, ca }
    }

    /// A fresh core and listener at `addr` with `ca`'s certificate, as after a restart; with
    /// `reset_material`, its stateless-reset key is derived from it. Retries the bind while
    /// the previous listener's socket is still being released.
    pub(crate) async fn at(
        addr: SocketAddr,
        ca: Arc<SelfSigned>,
        reset_material: Option<&[u8]>,
    ) -> Self {
        let core = Core::start(Registry::builder(), CoreConfig::default());
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let mut builder = QuicServer::builder(core.clone(), ca.server_tls().unwrap()).config(
                QuicServerConfig {
                    listen: addr,
                    ..QuicServerConfig::default()
                },
            );
            if let Some(material) = reset_material {
                builder = builder.stateless_reset_key(material);
            }
            match builder.bind().await {
                Ok(server) => return Self { core, server, ca },
                Err(error) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(%error, "address still in use");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("cannot bind {addr} again: {error}"),
            }
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub(crate) fn registry(&self) -> &Registry {
        self.core.registry()
    }

    /// An SDK worker serving `echo` in [`NS`], not yet connected.
    pub(crate) fn worker(&self) -> QuicWorkerBuilder {
        QuicWorker::builder(self.addr(), "localhost")
            .namespaces([NS])
            .tls(self.ca.client_tls().unwrap())
            .activity("echo", |_ctx: ActivityContext, input: Bytes| async move {
                Ok::<_, ActivityError>(input)
            })
    }

    pub(crate) async fn dispatch(&self, activity: &str, input: &'static [u8]) -> ActivityOutcome {
        self.dispatch_with(request(activity, input, PATIENCE)).await
    }

    pub(crate) async fn dispatch_with(&self, request: ActivityRequest) -> ActivityOutcome {
        self.core
            .dispatcher()
            .dispatch(&CallerIdentity::trusted("test"), request)
            .await
            .unwrap()
    }

    pub(crate) fn census(&self, activity: &str) -> PoolCensus {
        self.registry().pool_census(NS, "", activity, None)
    }
}

pub(crate) fn request(activity: &str, input: &'static [u8], timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: NS.to_owned(),
        task_queue: String::new(),
        activity_type: activity.to_owned(),
        node: None,
        input: Bytes::from_static(input),
        activity_id: None,
        timeout,
    }
}

/// Waits for the first event `matches` accepts; panics after [`PATIENCE`].
pub(crate) async fn event(
    events: &mut broadcast::Receiver<WorkerEvent>,
    what: &str,
    matches: impl Fn(&WorkerEvent) -> bool,
) -> WorkerEvent {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let event = events.recv().await.unwrap();
            if matches(&event) {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event: {what}"))
}

/// The outcome a spawned dispatch ends with; fails the test after [`PATIENCE`].
pub(crate) async fn outcome_of(
    dispatch: tokio::task::JoinHandle<ActivityOutcome>,
) -> ActivityOutcome {
    tokio::time::timeout(PATIENCE, dispatch)
        .await
        .expect("the dispatch ends in time")
        .expect("the dispatch task runs to its end")
}

/// Re-checks `condition` every 10 ms until it holds; panics after [`PATIENCE`]. For state
/// with no event to wait on.
pub(crate) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never happened: {what}"));
}

/// A registration frame for a worker of [`NS`] serving `activities`.
pub(crate) fn register_frame(activities: &[&str]) -> QuicRegister {
    QuicRegister {
        protocol_version: 1,
        namespaces: vec![NS.to_owned()],
        task_queue: String::new(),
        node: String::new(),
        activity_types: activities.iter().map(|a| (*a).to_owned()).collect(),
        identity: "raw".to_owned(),
        auth_token: String::new(),
        redundancy: 0,
        resumable: false,
    }
}

/// A task delivered on a raw client's lane (pings are answered automatically, cancels
/// ignored).
#[derive(Debug)]
pub(crate) struct LaneEvent(RawLane, QuicTask);

/// The write side of a lane of a raw client.
#[derive(Clone, Debug)]
pub(crate) struct RawLane {
    pub(crate) index: u64,
    send: Arc<Mutex<SendStream>>,
}

impl RawLane {
    pub(crate) async fn send(&self, frame: quic_lane_up::Frame) {
        let bytes = encode_frame(&QuicLaneUp { frame: Some(frame) }, u32::MAX).unwrap();
        self.send_bytes(&bytes).await;
    }

    pub(crate) async fn send_bytes(&self, bytes: &[u8]) {
        // The gateway may close the connection for what was sent; that is what tests look at.
        let _ = self.send.lock().await.write_all(bytes).await;
    }

    /// Finishes the worker's side of the lane (a FIN), as no well-behaved worker does first.
    pub(crate) async fn finish(&self) {
        let _ = self.send.lock().await.finish();
    }

    /// Resets the worker's side of the lane with application code `code`.
    pub(crate) async fn reset(&self, code: u32) {
        let _ = self.send.lock().await.reset(quinn::VarInt::from_u32(code));
    }
}

/// A client that speaks the wire protocol by hand.
pub(crate) struct Raw {
    pub(crate) conn: Connection,
    /// Kept so the client socket lives as long as the connection.
    _endpoint: Endpoint,
    control: SendStream,
    control_recv: Option<RecvStream>,
    control_decoder: FrameDecoder,
    pub(crate) lanes: mpsc::UnboundedReceiver<LaneEvent>,
    /// Every cancel the gateway sent, with the lane it came on.
    pub(crate) cancels: mpsc::UnboundedReceiver<(RawLane, QuicCancel)>,
    /// Every `held` frame the gateway sent after a resume: the lane and the task id.
    pub(crate) held: mpsc::UnboundedReceiver<(RawLane, u64)>,
    /// How each lane's gateway side ended, by lane index: `Ok` for a FIN, else the read's
    /// error (a reset, or the connection's close).
    pub(crate) lane_ends: mpsc::UnboundedReceiver<(u64, Result<(), quinn::ReadError>)>,
    /// While set, pings go unanswered: the worker falls silent with its connection up.
    pub(crate) silent: Arc<AtomicBool>,
}

impl Raw {
    /// Connects and opens (without using) the control stream; lanes are accepted and pings
    /// answered in the background from the start.
    pub(crate) async fn connect(gateway: &Gateway) -> Self {
        Self::connect_with(gateway, client_config(gateway), None).await
    }

    /// Connects with `config`; with `stall`, a lane stops reading when a frame larger than
    /// [`STALL_ABOVE`] starts arriving on it, until the stall is released.
    pub(crate) async fn connect_with(
        gateway: &Gateway,
        config: quinn::ClientConfig,
        stall: Option<Arc<Stall>>,
    ) -> Self {
        Self::connect_from(gateway, "127.0.0.1:0", config, stall).await
    }

    /// [`Self::connect_with`] from the local address `local`.
    pub(crate) async fn connect_from(
        gateway: &Gateway,
        local: &str,
        config: quinn::ClientConfig,
        stall: Option<Arc<Stall>>,
    ) -> Self {
        Self::dial(gateway.addr(), local, config, stall).await
    }

    /// Connects to `addr` (the gateway, or a relay in front of it) with `config`.
    pub(crate) async fn dial(
        addr: SocketAddr,
        local: &str,
        config: quinn::ClientConfig,
        stall: Option<Arc<Stall>>,
    ) -> Self {
        let endpoint = Endpoint::client(local.parse().unwrap()).unwrap();
        let conn = endpoint
            .connect_with(config, addr, "localhost")
            .unwrap()
            .await
            .unwrap();
        let (control, control_recv) = conn.open_bi().await.unwrap();
        let (events, lanes) = mpsc::unbounded_channel();
        let (cancel_tx, cancels) = mpsc::unbounded_channel();
        let (held_tx, held) = mpsc::unbounded_channel();
        let (ends_tx, lane_ends) = mpsc::unbounded_channel();
        let silent = Arc::new(AtomicBool::new(false));
        let senders = LaneSenders {
            events,
            cancels: cancel_tx,
            held: held_tx,
            ends: ends_tx,
            silent: Arc::clone(&silent),
        };
        tokio::spawn(accept_lanes(conn.clone(), senders, stall));
        Self {
            conn,
            _endpoint: endpoint,
            control,
            control_recv: Some(control_recv),
            control_decoder: FrameDecoder::new(u32::MAX),
            lanes,
            cancels,
            held,
            lane_ends,
            silent,
        }
    }

    pub(crate) async fn send_control(&mut self, frame: quic_control_up::Frame) {
        let bytes = encode_frame(&QuicControlUp { frame: Some(frame) }, u32::MAX).unwrap();
        self.send_control_bytes(&bytes).await;
    }

    pub(crate) async fn send_control_bytes(&mut self, bytes: &[u8]) {
        let _ = self.control.write_all(bytes).await;
    }

    /// Finishes the worker's side of the control stream (a FIN).
    pub(crate) fn finish_control(&mut self) {
        let _ = self.control.finish();
    }

    /// Registers and returns the gateway's answer.
    pub(crate) async fn register(&mut self, register: QuicRegister) -> QuicRegistered {
        self.send_control(quic_control_up::Frame::Register(register))
            .await;
        match self.next_control().await.frame {
            Some(quic_control_down::Frame::Registered(registered)) => registered,
            other => panic!("expected registered, got {other:?}"),
        }
    }

    pub(crate) async fn announce(&mut self, max_concurrency: u32) {
        self.conn
            .set_max_concurrent_bi_streams(quinn::VarInt::from_u32(max_concurrency.max(1)));
        self.send_control(quic_control_up::Frame::Capabilities(
            switchyard_proto::v1::QuicCapabilities { max_concurrency },
        ))
        .await;
    }

    pub(crate) async fn next_control(&mut self) -> QuicControlDown {
        let recv = self.control_recv.as_mut().unwrap();
        tokio::time::timeout(PATIENCE, read_frame(recv, &mut self.control_decoder))
            .await
            .expect("no control frame")
            .expect("control stream ended")
    }

    /// The next task delivered on any lane.
    pub(crate) async fn next_task(&mut self) -> (RawLane, QuicTask) {
        match tokio::time::timeout(PATIENCE, self.lanes.recv()).await {
            Ok(Some(LaneEvent(lane, task))) => (lane, task),
            other => panic!("expected a task, got {other:?}"),
        }
    }

    /// Reads the gateway's side of the control stream to its end: `Ok` for a clean end (a
    /// FIN), else the error the read ended with.
    pub(crate) async fn control_stream_end(&mut self) -> Result<(), quinn::ReadError> {
        let recv = self.control_recv.as_mut().unwrap();
        let end = async {
            while recv.read_chunk(usize::MAX, true).await?.is_some() {}
            Ok(())
        };
        tokio::time::timeout(PATIENCE, end)
            .await
            .expect("the control stream did not end")
    }

    /// How the gateway closed the connection: its code and reason phrase.
    pub(crate) async fn closed(&self) -> (ErrorCode, String) {
        closed_with(&self.conn).await
    }
}

/// The application code and reason `conn` was closed with by its peer.
pub(crate) async fn closed_with(conn: &Connection) -> (ErrorCode, String) {
    match tokio::time::timeout(PATIENCE, conn.closed()).await {
        Ok(ConnectionError::ApplicationClosed(close)) => (
            ErrorCode::from_value(close.error_code.into_inner()).expect("a documented code"),
            String::from_utf8_lossy(&close.reason).into_owned(),
        ),
        Ok(other) => panic!("closed without an application code: {other}"),
        Err(_) => panic!("the gateway did not close the connection"),
    }
}

pub(crate) fn client_config(gateway: &Gateway) -> quinn::ClientConfig {
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(gateway.ca.roots().unwrap())
    .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()))
}

async fn read_frame<M: prost::Message + Default>(
    recv: &mut RecvStream,
    decoder: &mut FrameDecoder,
) -> Option<M> {
    read_frame_or_end(recv, decoder).await.ok().flatten()
}

/// The next frame on `recv`; `Ok(None)` when the stream ends cleanly (a FIN), the read's
/// error when it ends otherwise (a reset, or the connection's close).
async fn read_frame_or_end<M: prost::Message + Default>(
    recv: &mut RecvStream,
    decoder: &mut FrameDecoder,
) -> Result<Option<M>, quinn::ReadError> {
    loop {
        if let Some(body) = decoder.next_frame().unwrap() {
            return Ok(Some(decode(body).unwrap()));
        }
        let Some(chunk) = recv.read_chunk(usize::MAX, true).await? else {
            return Ok(None);
        };
        decoder.push(&chunk.bytes);
    }
}

/// Frames above this many bytes make a stalling raw client stop reading their lane.
pub(crate) const STALL_ABOVE: usize = 8 * 1024;

/// Makes a raw client's lanes stop reading big frames until released.
pub(crate) struct Stall {
    /// Notified when a lane stops reading.
    pub(crate) stalled: tokio::sync::Notify,
    /// One permit lets one stalled lane read on.
    pub(crate) release: tokio::sync::Semaphore,
}

impl Default for Stall {
    fn default() -> Self {
        Self {
            stalled: tokio::sync::Notify::new(),
            release: tokio::sync::Semaphore::new(0),
        }
    }
}

/// Where a raw client's lanes hand what they read.
#[derive(Clone)]
struct LaneSenders {
    events: mpsc::UnboundedSender<LaneEvent>,
    cancels: mpsc::UnboundedSender<(RawLane, QuicCancel)>,
    held: mpsc::UnboundedSender<(RawLane, u64)>,
    ends: mpsc::UnboundedSender<(u64, Result<(), quinn::ReadError>)>,
    silent: Arc<AtomicBool>,
}

async fn accept_lanes(conn: Connection, senders: LaneSenders, stall: Option<Arc<Stall>>) {
    while let Ok((send, mut recv)) = conn.accept_bi().await {
        let lane = RawLane {
            index: send.id().index(),
            send: Arc::new(Mutex::new(send)),
        };
        let LaneSenders {
            events,
            cancels,
            held,
            ends,
            silent,
        } = senders.clone();
        let stall = stall.clone();
        tokio::spawn(async move {
            let mut decoder = FrameDecoder::new(u32::MAX);
            loop {
                let down = match &stall {
                    Some(stall) => {
                        read_stalling::<QuicLaneDown>(&mut recv, &mut decoder, stall).await
                    }
                    None => read_frame_or_end::<QuicLaneDown>(&mut recv, &mut decoder).await,
                };
                let down = match down {
                    Ok(Some(down)) => down,
                    Ok(None) => {
                        let _ = ends.send((lane.index, Ok(())));
                        break;
                    }
                    Err(error) => {
                        let _ = ends.send((lane.index, Err(error)));
                        break;
                    }
                };
                match down.frame {
                    Some(quic_lane_down::Frame::Ping(_)) if silent.load(Ordering::Relaxed) => {}
                    Some(quic_lane_down::Frame::Ping(ping)) => {
                        lane.send(quic_lane_up::Frame::Pong(QuicPong { seq: ping.seq }))
                            .await;
                    }
                    Some(quic_lane_down::Frame::Task(task)) => {
                        let _ = events.send(LaneEvent(lane.clone(), task));
                    }
                    Some(quic_lane_down::Frame::Cancel(cancel)) => {
                        let _ = cancels.send((lane.clone(), cancel));
                    }
                    Some(quic_lane_down::Frame::Held(task)) => {
                        let _ = held.send((lane.clone(), task.task_id));
                    }
                    None => {}
                }
            }
        });
    }
}

async fn read_stalling<M: prost::Message + Default>(
    recv: &mut RecvStream,
    decoder: &mut FrameDecoder,
    stall: &Stall,
) -> Result<Option<M>, quinn::ReadError> {
    let mut stalled = false;
    loop {
        if let Some(body) = decoder.next_frame().unwrap() {
            return Ok(Some(decode(body).unwrap()));
        }
        if !stalled && decoder.wanted() > STALL_ABOVE {
            stalled = true;
            stall.stalled.notify_one();
            stall.release.acquire().await.unwrap().forget();
        }
        // Small reads, so the stream's flow-control window is what limits the sender.
        let Some(chunk) = recv.read_chunk(1024, true).await? else {
            return Ok(None);
        };
        decoder.push(&chunk.bytes);
    }
}
