//! The configuration's sections, their keys and their defaults.
//!
//! Every field here is a documented key of `docs/configuration.md` (a test holds the two
//! together). Optional paths are empty strings rather than absent keys, so every key has a
//! default that can be listed and overridden from the environment.
//!
//! A key that configures a library setting takes its default from that library's `Default`
//! (`GrpcServerConfig`, the QUIC `QuicServerConfig`, core's `DispatchConfig`, `LivenessConfig`,
//! `DurableConfig` and registry ceiling, the producer API's `ApiConfig`, the SQLite store's
//! `SqliteOptions`), so the two cannot drift; the few
//! the gateway sets differently on purpose are listed, with why, in `config/overrides.rs`,
//! whose test fails on any other difference.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use switchyard_core::{
    DEFAULT_MAX_CONCURRENCY_LIMIT, DEFAULT_MAX_NAMESPACES_LIVE, DEFAULT_MAX_WORKERS_PER_PRINCIPAL,
    DEFAULT_NAMESPACE_IDLE_EXPIRY, DispatchConfig, DurableConfig, LivenessConfig, Role,
};
use switchyard_store_sqlite::{SqliteOptions, Synchronous};
use switchyard_transport_grpc::GrpcServerConfig;
use switchyard_transport_quic::{CongestionControl, QuicServerConfig, Redundancy, RetryPolicy};

use super::duration::ConfigDuration;
use crate::api::ApiConfig;

/// `grpc.listen`'s default: loopback, first of the gateway's three adjacent ports.
const GRPC_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7700);
/// `quic.listen`'s default: loopback, next to `grpc.listen`.
const QUIC_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7701);

/// The whole gateway configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gRPC listener: producer API and gRPC workers on one port.
    pub grpc: GrpcSection,
    /// The QUIC worker listener.
    pub quic: QuicSection,
    /// The operations HTTP listener.
    pub ops: OpsSection,
    /// TLS material.
    pub tls: TlsSection,
    /// Who may call: principals with their credentials and granted namespaces.
    pub principals: Vec<PrincipalSection>,
    /// Namespace policy and per-namespace placement.
    pub namespaces: NamespacesSection,
    /// The admission gate's rules shared by every transport.
    pub registry: RegistrySection,
    /// Dispatch limits.
    pub dispatch: DispatchSection,
    /// Where durable dispatches are kept.
    pub store: StoreSection,
    /// Liveness probing of workers.
    pub liveness: LivenessSection,
    /// Graceful shutdown.
    pub shutdown: ShutdownSection,
    /// Logging.
    pub log: LogSection,
    /// Cluster mode (off unless `cluster.nats_url` is set).
    pub cluster: super::cluster::ClusterSection,
}

/// `[grpc]`: one TCP port carrying the producer API, health, reflection and gRPC workers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcSection {
    /// Address the gRPC listener binds.
    pub listen: SocketAddr,
    /// Serve the gRPC worker transport on the listener (the producer API is always served).
    pub workers: bool,
    /// Serve TLS on the listener (with `tls.*` material); plaintext when false.
    pub tls: bool,
    /// How long a new worker stream has to send its registration.
    pub registration_deadline: ConfigDuration,
    /// Interval of HTTP/2 keepalive pings the server sends.
    pub keepalive_interval: ConfigDuration,
    /// How long an HTTP/2 keepalive ping may stay unanswered before the connection is closed.
    pub keepalive_timeout: ConfigDuration,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_size: usize,
    /// Set TCP_NODELAY on accepted connections.
    pub tcp_nodelay: bool,
    /// Worker streams one connection may carry at once; one more is refused.
    pub max_workers_per_connection: usize,
    /// Time a new connection has to complete its TLS handshake before it is closed.
    pub handshake_timeout: ConfigDuration,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Connections the listener holds at once; more are closed at accept.
    pub max_connections: usize,
    /// Connections the listener holds from one source IP address; more are closed at accept.
    pub max_connections_per_address: usize,
    /// `grpc.health.v1.Health/Watch` streams open at once, over all callers; more are refused
    /// `RESOURCE_EXHAUSTED`.
    pub max_health_watchers: usize,
    /// Server reflection: `authenticated` (needs a principal's credential when principals
    /// are configured), `open` or `off`.
    pub reflection: ReflectionName,
    /// How long a resumable worker's session outlives its lost stream; `0s` turns sessions off.
    pub reconnect_grace: ConfigDuration,
}

impl Default for GrpcSection {
    fn default() -> Self {
        let library = GrpcServerConfig::default();
        Self {
            listen: GRPC_LISTEN,
            workers: true,
            tls: true,
            registration_deadline: ConfigDuration(library.registration_deadline),
            keepalive_interval: ConfigDuration(library.keepalive_interval.unwrap_or_default()),
            keepalive_timeout: ConfigDuration(library.keepalive_timeout),
            max_message_size: library.max_message_bytes,
            tcp_nodelay: library.tcp_nodelay,
            max_workers_per_connection: library.max_workers_per_connection,
            handshake_timeout: ConfigDuration(library.handshake_timeout),
            max_concurrent_streams: library.max_concurrent_streams,
            max_connections: library.max_connections,
            max_connections_per_address: library.max_connections_per_address,
            max_health_watchers: crate::grpc_server::DEFAULT_MAX_HEALTH_WATCHERS,
            reflection: ReflectionName::Authenticated,
            reconnect_grace: ConfigDuration(library.reconnect_grace),
        }
    }
}

/// Who may use server reflection on the gRPC listener.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReflectionName {
    /// Callers a principal's credential identifies (everyone in development mode).
    #[default]
    Authenticated,
    /// Every caller, without a credential.
    Open,
    /// Not served.
    Off,
}

/// `[quic]`: the QUIC push transport for constrained links (UDP).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuicSection {
    /// Start the QUIC transport.
    pub enabled: bool,
    /// UDP address the QUIC endpoint binds.
    pub listen: SocketAddr,
    /// Congestion controller: `cubic`, `bbr` or `newreno`.
    pub congestion: CongestionName,
    /// Interval of QUIC keep-alive packets on an idle connection; `0s` sends none.
    pub keep_alive_interval: ConfigDuration,
    /// A connection without any packet from the peer this long is closed.
    pub max_idle_timeout: ConfigDuration,
    /// Round-trip time assumed before the first measurement.
    pub initial_rtt: ConfigDuration,
    /// Bytes one stream may receive ahead of its reader.
    pub stream_receive_window: u32,
    /// Bytes a whole connection may receive ahead of its readers.
    pub receive_window: u32,
    /// Bytes a connection buffers unacknowledged for sending.
    pub send_window: u64,
    /// Round-robin between lanes with data to send; `false` sends frames in the order they
    /// were written (fewer, fuller packets; a large frame delays the small ones behind it).
    pub send_fairness: bool,
    /// Ask each worker to acknowledge only after this many ack-eliciting packets (or its
    /// `max_ack_delay`); `0` asks nothing (the worker's own policy).
    pub ack_eliciting_threshold: u32,
    /// Largest control-stream frame accepted, in bytes.
    pub max_control_frame: u32,
    /// Largest lane frame (task input, result output) accepted, in bytes.
    pub max_lane_frame: u32,
    /// Keep a worker's session when its address changes (NAT rebinding, network switch).
    pub migration: bool,
    /// Time from a connection's first packet to its completed registration.
    pub registration_timeout: ConfigDuration,
    /// Connections through their handshake but not yet registered, at once; more are refused.
    pub max_unregistered_connections: usize,
    /// When a new connection gets a stateless Retry (address validation): `under_load`,
    /// `always` or `off`.
    pub retry: RetryName,
    /// Handshakes under way at once from addresses not yet validated; beyond, a Retry (or
    /// with `retry = "off"`, a refusal).
    pub max_unvalidated_handshakes: usize,
    /// Connections at once from one IP address, registered or not; more are refused.
    pub max_connections_per_address: usize,
    /// Receive and send buffer asked of the kernel for the UDP socket, in bytes (capped by
    /// `net.core.rmem_max` / `wmem_max`); every worker's packets share this one socket.
    pub socket_buffer: usize,
    /// Redundancy for small frames, for workers that ask for it: `off` or `datagram`.
    pub redundancy: RedundancyName,
    /// How long a resumable worker's session outlives its lost connection; `0s` grants none.
    pub reconnect_grace: ConfigDuration,
}

impl Default for QuicSection {
    fn default() -> Self {
        let library = QuicServerConfig::default();
        let link = library.connection;
        Self {
            enabled: true,
            listen: QUIC_LISTEN,
            congestion: CongestionName::from_library(link.congestion),
            keep_alive_interval: ConfigDuration(link.keep_alive_interval.unwrap_or_default()),
            max_idle_timeout: ConfigDuration(link.max_idle_timeout),
            initial_rtt: ConfigDuration(link.initial_rtt),
            stream_receive_window: link.stream_receive_window,
            receive_window: link.receive_window,
            send_window: link.send_window,
            send_fairness: link.send_fairness,
            ack_eliciting_threshold: link.ack_eliciting_threshold.unwrap_or(0),
            max_control_frame: library.frames.control,
            max_lane_frame: library.frames.lane,
            migration: library.migration,
            registration_timeout: ConfigDuration(library.registration_timeout),
            max_unregistered_connections: library.max_unregistered_connections,
            retry: RetryName::from_library(library.retry),
            max_unvalidated_handshakes: library.max_unvalidated_handshakes,
            max_connections_per_address: library.max_connections_per_address,
            socket_buffer: library.socket_buffer,
            redundancy: RedundancyName::from_library(library.redundancy),
            reconnect_grace: ConfigDuration(library.reconnect_grace),
        }
    }
}

/// QUIC congestion controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CongestionName {
    /// CUBIC.
    #[default]
    Cubic,
    /// BBR: far less sensitive to random loss.
    Bbr,
    /// NewReno.
    Newreno,
}

impl CongestionName {
    /// The key's value for the library's controller. A controller the gateway has no name
    /// for yet reads as the default, CUBIC; the defaults test catches a library default
    /// changing to one.
    fn from_library(congestion: CongestionControl) -> Self {
        match congestion {
            CongestionControl::Bbr => Self::Bbr,
            CongestionControl::NewReno => Self::Newreno,
            _ => Self::Cubic,
        }
    }
}

/// When the QUIC listener answers a new connection with a stateless Retry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryName {
    /// When handshakes from unvalidated addresses or unregistered connections pile up.
    #[default]
    UnderLoad,
    /// For every connection whose address is not validated yet.
    Always,
    /// Never (a flood of forged Initial packets can then lock workers out).
    Off,
}

impl RetryName {
    /// The key's value for the library's policy. A policy the gateway has no name for yet
    /// reads as the default; the defaults test catches a library default changing to one.
    fn from_library(retry: RetryPolicy) -> Self {
        match retry {
            RetryPolicy::Always => Self::Always,
            RetryPolicy::Off => Self::Off,
            _ => Self::UnderLoad,
        }
    }

    /// The library's policy for the key's value.
    pub(crate) fn to_library(self) -> RetryPolicy {
        match self {
            Self::UnderLoad => RetryPolicy::UnderLoad,
            Self::Always => RetryPolicy::Always,
            Self::Off => RetryPolicy::Off,
        }
    }
}

/// QUIC redundancy for small frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedundancyName {
    /// Lanes only.
    #[default]
    Off,
    /// A task or result that fits one QUIC datagram is also sent as one.
    Datagram,
}

impl RedundancyName {
    /// The key's value for the library's setting (one the gateway has no name for reads as
    /// `off`; the defaults test catches a library default changing to one).
    fn from_library(redundancy: Redundancy) -> Self {
        match redundancy {
            Redundancy::Datagram => Self::Datagram,
            _ => Self::Off,
        }
    }

    /// The library's setting for the key's value.
    pub fn library(self) -> Redundancy {
        match self {
            Self::Off => Redundancy::Off,
            Self::Datagram => Redundancy::Datagram,
        }
    }
}

/// `[ops]`: the operations HTTP listener (health, readiness, metrics, read-only JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpsSection {
    /// Start the operations listener.
    pub enabled: bool,
    /// Address it binds. It is unauthenticated and read-only: keep it on a private address.
    pub listen: SocketAddr,
    /// Allow `listen` on a non-loopback address while principals are configured (it serves
    /// every worker's identity without a credential).
    pub allow_remote: bool,
    /// Time a request's headers have to arrive, counted from when the connection is ready
    /// for a request; a connection slower than this is closed.
    pub header_read_timeout: ConfigDuration,
    /// A connection that moves no byte either way for this long is closed.
    pub idle_timeout: ConfigDuration,
    /// Connections the listener holds at once; more are closed at accept.
    pub max_connections: usize,
}

impl Default for OpsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 7702)),
            allow_remote: false,
            header_read_timeout: ConfigDuration::secs(5),
            idle_timeout: ConfigDuration::secs(60),
            max_connections: 64,
        }
    }
}

/// `[tls]`: server certificate, client CA and the development material directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// Directory for generated development material; empty means the platform data directory
    /// (`$XDG_DATA_HOME/switchyard`, else `$HOME/.local/share/switchyard`, else `.switchyard`).
    pub data_dir: String,
    /// PEM server certificate chain; empty generates development material in `data_dir`.
    pub cert: String,
    /// PEM private key of `cert`; set both or neither.
    pub key: String,
    /// PEM CA bundle that client certificates must chain to; empty disables mutual TLS.
    pub client_ca: String,
    /// Refuse, in the TLS handshake, every caller without a certificate chaining to
    /// `client_ca` (on both listeners); false lets such callers authenticate with a token.
    pub require_client_cert: bool,
}

/// `[[principals]]`: one caller the gateway knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrincipalSection {
    /// The principal's name, as logged and shown on its workers.
    pub name: String,
    /// Bearer token that authenticates it; empty for none.
    pub token: String,
    /// Common name of the client certificate subject that authenticates it; empty for none.
    pub cert_subject: String,
    /// Namespaces it may register workers into and dispatch into; `"*"` grants every one.
    pub namespaces: Vec<String>,
    /// What it may do in those namespaces; absent means `["admin"]` (everything, with a
    /// start-up warning naming the principal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<RoleName>>,
    /// The most workers it may have registered at once, over every transport.
    pub max_workers: u32,
}

impl Default for PrincipalSection {
    fn default() -> Self {
        Self {
            name: String::new(),
            token: String::new(),
            cert_subject: String::new(),
            namespaces: Vec::new(),
            roles: None,
            max_workers: DEFAULT_MAX_WORKERS_PER_PRINCIPAL,
        }
    }
}

/// A role in `principals[].roles`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleName {
    /// Register workers.
    Worker,
    /// Dispatch, and cancel and look up its own dispatches.
    Producer,
    /// List, explain, drain and watch; cancel any dispatch in its namespaces.
    Operator,
    /// Everything.
    Admin,
}

impl RoleName {
    /// Core's role of this name.
    pub fn role(self) -> Role {
        match self {
            Self::Worker => Role::Worker,
            Self::Producer => Role::Producer,
            Self::Operator => Role::Operator,
            Self::Admin => Role::Admin,
        }
    }
}

/// What the admission gate does with a namespace it does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NamespacePolicyName {
    /// Create it on first registration.
    #[default]
    Open,
    /// Refuse registrations into namespaces not listed in `namespaces.known`.
    Closed,
}

/// `[namespaces]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespacesSection {
    /// `open` or `closed`.
    pub policy: NamespacePolicyName,
    /// Namespaces known from the start, with their placement.
    pub known: Vec<NamespaceSection>,
}

/// `[[namespaces.known]]`: a namespace and where its workers run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceSection {
    /// The namespace name.
    pub name: String,
    /// Node labels every worker of the namespace must advertise one of (enforced).
    pub pinned: Vec<String>,
    /// Node labels the namespace prefers (advisory; not enforced).
    pub prefer: Vec<String>,
    /// Whether a dispatch that does not say is durable; absent follows `dispatch.durability`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<DurabilityName>,
}

/// `[registry]`: the admission gate's rules, the same on every transport.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrySection {
    /// Largest capacity (`max_concurrency`) one worker may state, at registration or in a
    /// later announcement, whatever its transport.
    pub max_concurrency_limit: u32,
    /// Most namespaces with workers or dispatches at once; a registration into a new one past
    /// it is refused.
    pub max_namespaces: usize,
    /// How long a namespace with no worker and no dispatch keeps its series and minted record.
    pub namespace_idle_expiry: ConfigDuration,
}

impl Default for RegistrySection {
    fn default() -> Self {
        Self {
            max_concurrency_limit: DEFAULT_MAX_CONCURRENCY_LIMIT,
            max_namespaces: DEFAULT_MAX_NAMESPACES_LIVE,
            namespace_idle_expiry: ConfigDuration(DEFAULT_NAMESPACE_IDLE_EXPIRY),
        }
    }
}

/// `[dispatch]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchSection {
    /// Timeout of a dispatch that asks for none.
    pub default_timeout: ConfigDuration,
    /// Longest timeout a dispatch may ask for; longer ones are clamped.
    pub max_timeout: ConfigDuration,
    /// How often one dispatch may lose the worker holding it and still be re-delivered.
    pub loss_budget: u32,
    /// The window `loss_budget` counts losses in.
    pub loss_window: ConfigDuration,
    /// Dispatches one `DispatchStream` runs at once before the gateway stops reading it.
    pub max_in_flight_per_stream: usize,
    /// Dispatches running plus replies not yet taken by the producer, per `DispatchStream`;
    /// at the limit the gateway stops reading the stream.
    pub max_stream_outstanding: usize,
    /// How long a `DispatchStream` may stay at `max_stream_outstanding` without the producer
    /// taking a reply before it is ended as a slow consumer.
    pub slow_consumer_timeout: ConfigDuration,
    /// Dispatches of one namespace waiting for a worker at once; one more is refused.
    pub max_parked_per_namespace: usize,
    /// Dispatches of one principal waiting for a worker at once; one more is refused.
    pub max_parked_per_principal: usize,
    /// Bytes of input held by one namespace's parked and in-flight dispatches.
    pub max_held_input_bytes_per_namespace: usize,
    /// Bytes of input held by one principal's parked and in-flight dispatches.
    pub max_held_input_bytes_per_principal: usize,
    /// Time a worker has to answer or acknowledge an ended task before its slot is reclaimed.
    pub cancel_ack_timeout: ConfigDuration,
    /// Reclaimed tasks after which a worker is drained and deregistered as unresponsive.
    pub max_unresponsive_tasks: u32,
    /// Whether a dispatch that does not say, in a namespace that does not say, is durable.
    pub durability: DurabilityName,
}

/// Whether a dispatch is recorded in the dispatch store before it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityName {
    /// Held in memory only: lost with the gateway process, never touches the store.
    #[default]
    Ephemeral,
    /// Recorded before it is acknowledged; survives a gateway restart.
    Durable,
}

impl DurabilityName {
    /// True for `durable`.
    pub fn is_durable(self) -> bool {
        self == Self::Durable
    }
}

/// `[store]`: the dispatch store holding durable dispatches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// `sqlite` (a file in the data directory) or `memory` (lost with the process).
    pub backend: StoreBackendName,
    /// The SQLite file; empty means `dispatches.sqlite3` in the data directory.
    pub path: String,
    /// When a commit reaches the disk: `full` (every acknowledged write survives power loss) or
    /// `normal` (survives a process crash; the last commits may be lost with power).
    pub synchronous: SynchronousName,
    /// How long a finished dispatch's outcome is kept (and its idempotency key remembered).
    pub outcome_retention: ConfigDuration,
    /// Unfinished durable dispatches one namespace may have; one more is refused.
    pub max_queued_per_namespace: u64,
    /// Size the store may reach, in bytes; a submission past it is refused.
    pub max_bytes: u64,
}

/// The store's file name in the data directory when `store.path` is empty.
pub const DEFAULT_STORE_FILE: &str = "dispatches.sqlite3";

impl Default for StoreSection {
    fn default() -> Self {
        let sqlite = SqliteOptions::default();
        Self {
            backend: StoreBackendName::Sqlite,
            path: String::new(),
            synchronous: SynchronousName::from_library(sqlite.synchronous),
            outcome_retention: ConfigDuration(DurableConfig::default().outcome_retention),
            max_queued_per_namespace: sqlite.max_queued_per_namespace,
            max_bytes: sqlite.max_bytes,
        }
    }
}

impl StoreSection {
    /// The store file: `path`, else `dispatches.sqlite3` in `data_dir` (the directory the
    /// gateway resolved from `tls.data_dir`).
    pub fn resolved_path(&self, data_dir: &std::path::Path) -> std::path::PathBuf {
        if self.path.is_empty() {
            data_dir.join(DEFAULT_STORE_FILE)
        } else {
            std::path::PathBuf::from(&self.path)
        }
    }
}

/// Which dispatch store backs durable dispatches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackendName {
    /// An embedded SQLite file (WAL journal, group commit).
    #[default]
    Sqlite,
    /// Process memory: durable dispatches get ids and outcomes but do not survive a restart.
    Memory,
    /// NATS JetStream at `cluster.nats_url`, shared by every node of the cluster (cluster
    /// mode only).
    Jetstream,
}

impl StoreBackendName {
    /// The name as written in `store.backend`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Memory => "memory",
            Self::Jetstream => "jetstream",
        }
    }
}

/// `store.synchronous`: when a SQLite commit is on the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SynchronousName {
    /// fsync at every commit: an acknowledged write survives power loss.
    #[default]
    Full,
    /// fsync at WAL checkpoints only: survives a process crash, may lose the last commits
    /// on power loss.
    Normal,
}

impl SynchronousName {
    /// The key's value for the library's mode (one the gateway has no name for reads as
    /// `full`; the defaults test catches a library default changing to one).
    fn from_library(synchronous: Synchronous) -> Self {
        match synchronous {
            Synchronous::Normal => Self::Normal,
            _ => Self::Full,
        }
    }

    /// The library's mode for the key's value.
    pub(crate) fn library(self) -> Synchronous {
        match self {
            Self::Full => Synchronous::Full,
            Self::Normal => Synchronous::Normal,
        }
    }
}

impl Default for DispatchSection {
    fn default() -> Self {
        let core = DispatchConfig::default();
        let api = ApiConfig::default();
        Self {
            default_timeout: ConfigDuration(api.default_timeout),
            max_timeout: ConfigDuration(core.max_timeout),
            loss_budget: core.loss_budget,
            loss_window: ConfigDuration(core.loss_window),
            max_in_flight_per_stream: api.max_in_flight_per_stream,
            max_stream_outstanding: api.max_stream_outstanding,
            slow_consumer_timeout: ConfigDuration(api.slow_consumer_timeout),
            max_parked_per_namespace: core.max_parked_per_namespace,
            max_parked_per_principal: core.max_parked_per_principal,
            max_held_input_bytes_per_namespace: core.max_held_input_bytes_per_namespace,
            max_held_input_bytes_per_principal: core.max_held_input_bytes_per_principal,
            cancel_ack_timeout: ConfigDuration(core.cancel_ack_timeout),
            max_unresponsive_tasks: core.max_unresponsive_tasks,
            durability: DurabilityName::Ephemeral,
        }
    }
}

/// `[liveness]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LivenessSection {
    /// Time between pings to a proven worker.
    pub ping_interval: ConfigDuration,
    /// A ping unanswered this long counts as missed.
    pub ping_timeout: ConfigDuration,
    /// Answered pings that lift opening probation and restore a lost worker.
    pub probation_pings: u32,
    /// Consecutive missed pings that mark a worker unreachable.
    pub miss_threshold: u32,
    /// Silence after which a worker is deregistered as timed out.
    pub heartbeat_window: ConfigDuration,
}

impl Default for LivenessSection {
    fn default() -> Self {
        let core = LivenessConfig::default();
        Self {
            ping_interval: ConfigDuration(core.ping_interval),
            ping_timeout: ConfigDuration(core.ping_timeout),
            probation_pings: core.probation_pings,
            miss_threshold: core.miss_threshold,
            heartbeat_window: ConfigDuration(core.heartbeat_window),
        }
    }
}

/// `[shutdown]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownSection {
    /// How long shutdown waits for tasks in flight before ending them `shutting_down`.
    pub drain_timeout: ConfigDuration,
}

impl Default for ShutdownSection {
    fn default() -> Self {
        Self {
            drain_timeout: ConfigDuration::secs(30),
        }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// Filter in `RUST_LOG` syntax; `RUST_LOG` itself wins when set.
    pub filter: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            filter: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}
