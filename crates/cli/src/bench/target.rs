//! The gateway under test: one started in-process, or one already running at `--connect`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use switchyard_core::Core;
use switchyard_gateway::{
    ConfigDuration, CongestionName, Gateway, StoreBackendName, SynchronousName,
};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_client::GatewayClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use super::args::{BenchArgs, Congestion, RedundancyArg, Scenario, StoreArg};
use super::{NAMESPACE, system};
use crate::cmd::Failure;
use crate::cmd::worker::read_ca;

/// Most dispatches one `ListDispatches` call returns.
pub(crate) const MAX_LISTED: u32 = 1000;

/// The producer API client the bench uses.
pub(crate) type Api = GatewayClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>` when a token is set.
#[derive(Clone, Debug)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Where the gateway under test runs.
enum Host {
    /// Started by the bench; its data directory is removed on stop.
    InProcess {
        gateway: Box<Gateway>,
        data_dir: PathBuf,
    },
    /// Already running; `pid` is reported on when given.
    Remote { pid: Option<u32> },
}

/// The gateway under test and how to reach it.
pub(crate) struct Target {
    host: Host,
    /// API (and gRPC worker) address.
    pub(crate) api_addr: SocketAddr,
    /// QUIC worker address.
    pub(crate) quic_addr: SocketAddr,
    /// PEM CA the gateway's certificate chains to.
    pub(crate) ca_pem: String,
    /// Name its certificate is valid for.
    pub(crate) server_name: String,
    /// Bearer token workers and the producer present.
    pub(crate) token: Option<String>,
}

impl Target {
    /// Starts a gateway on loopback ephemeral ports, or describes the one at `--connect`.
    pub(crate) async fn start(args: &BenchArgs) -> Result<Self, Failure> {
        if let Some(api_addr) = args.connect {
            let ca_path = args
                .ca
                .clone()
                .ok_or_else(|| Failure::usage("--connect needs --ca (the gateway's ca.pem)"))?;
            return Ok(Self {
                host: Host::Remote {
                    pid: args.gateway_pid,
                },
                api_addr,
                quic_addr: args.quic_target().unwrap_or(api_addr),
                ca_pem: read_ca(&ca_path)?,
                server_name: args.server_name.clone(),
                token: args.token.clone(),
            });
        }
        let data_dir =
            std::env::temp_dir().join(format!("switchyard-bench-{}", std::process::id()));
        let mut config = crate::cmd::in_process_config(&data_dir);
        config.shutdown.drain_timeout = ConfigDuration::secs(2);
        config.dispatch.max_in_flight_per_stream = usize::try_from(args.outstanding)
            .unwrap_or(usize::MAX)
            .max(config.dispatch.max_in_flight_per_stream);
        // Every bench worker dials from this host's one address (`--idle-workers` up to 50,000).
        config.quic.max_connections_per_address = usize::MAX;
        // Unary mode opens `--outstanding` streams on one connection, and every bench worker
        // connects from loopback: the listener limits are for hostile peers, not for this.
        config.grpc.max_concurrent_streams =
            args.outstanding.max(config.grpc.max_concurrent_streams);
        config.grpc.max_connections = usize::MAX;
        config.grpc.max_connections_per_address = usize::MAX;
        if args.scenario == Scenario::TenantFairness {
            // Tenant A parks more than the default quota allows, on purpose.
            let parked = usize::try_from(args.parked).unwrap_or(usize::MAX);
            config.dispatch.max_parked_per_namespace =
                config.dispatch.max_parked_per_namespace.max(parked);
            config.dispatch.max_parked_per_principal =
                config.dispatch.max_parked_per_principal.max(parked);
        }
        config.quic.congestion = match args.congestion {
            Congestion::Cubic => CongestionName::Cubic,
            Congestion::Bbr => CongestionName::Bbr,
            Congestion::Newreno => CongestionName::Newreno,
        };
        config.quic.send_fairness = args.quic_send_fairness;
        config.quic.ack_eliciting_threshold = args.quic_ack_threshold;
        (config.store.backend, config.store.synchronous) = match args.store {
            StoreArg::Sqlite => (StoreBackendName::Sqlite, SynchronousName::Full),
            StoreArg::SqliteNormal => (StoreBackendName::Sqlite, SynchronousName::Normal),
            StoreArg::Memory => (StoreBackendName::Memory, SynchronousName::Full),
        };
        config.quic.redundancy = match args.redundancy {
            RedundancyArg::Off => switchyard_gateway::RedundancyName::Off,
            RedundancyArg::Datagram => switchyard_gateway::RedundancyName::Datagram,
        };
        let gateway = Gateway::builder(config)
            .start()
            .await
            .map_err(|error| Failure::runtime(format!("gateway: {error}")))?;
        let described = describe_in_process(&gateway);
        match described {
            Ok((api_addr, quic_addr, ca_pem)) => Ok(Self {
                host: Host::InProcess {
                    gateway: Box::new(gateway),
                    data_dir,
                },
                api_addr,
                quic_addr,
                ca_pem,
                server_name: "localhost".to_owned(),
                token: None,
            }),
            Err(failure) => {
                gateway.shutdown().await;
                let _ = std::fs::remove_dir_all(&data_dir);
                Err(failure)
            }
        }
    }

    /// A gateway the bench started in another process (`--cluster`), reported on by `pid`.
    pub(crate) fn child(
        api_addr: SocketAddr,
        quic_addr: SocketAddr,
        ca_pem: String,
        pid: u32,
    ) -> Self {
        Self {
            host: Host::Remote { pid: Some(pid) },
            api_addr,
            quic_addr,
            ca_pem,
            server_name: "localhost".to_owned(),
            token: None,
        }
    }

    /// The in-process gateway's core, if the gateway is in-process.
    pub(crate) fn core(&self) -> Option<&Core> {
        match &self.host {
            Host::InProcess { gateway, .. } => Some(gateway.core()),
            Host::Remote { .. } => None,
        }
    }

    /// The API endpoint URL.
    pub(crate) fn endpoint(&self) -> String {
        format!("https://{}", self.api_addr)
    }

    /// A TLS client configuration trusting the gateway's CA under its certificate name.
    pub(crate) fn client_tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(self.server_name.clone())
    }

    /// Opens a producer API connection (one HTTP/2 connection).
    pub(crate) async fn api(&self) -> Result<Api, Failure> {
        let endpoint = Endpoint::from_shared(self.endpoint())
            .map_err(|error| Failure::usage(format!("--connect {}: {error}", self.api_addr)))?
            .tls_config(self.client_tls())
            .map_err(|error| Failure::runtime(format!("tls: {error}")))?;
        let channel = endpoint.connect().await.map_err(|error| {
            Failure::runtime(format!("cannot connect to {}: {error}", self.api_addr))
        })?;
        let token = match &self.token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| Failure::usage("--token holds characters not allowed"))?,
            ),
            None => None,
        };
        Ok(GatewayClient::with_interceptor(channel, Bearer(token)))
    }

    /// Waits until `want` workers serving `activity` are eligible; returns how long it took.
    pub(crate) async fn wait_eligible(
        &self,
        activity: &str,
        want: u32,
        deadline: Duration,
    ) -> Result<Duration, Failure> {
        let started = Instant::now();
        let mut api = match self.core() {
            Some(_) => None,
            None => Some(self.api().await?),
        };
        loop {
            let eligible = match (self.core(), api.as_mut()) {
                (Some(core), _) => core
                    .registry()
                    .pool_census(NAMESPACE, "", activity, None)
                    .eligible
                    .try_into()
                    .unwrap_or(u32::MAX),
                (None, Some(api)) => describe(api, activity)
                    .await?
                    .census
                    .map_or(0, |census| census.eligible),
                (None, None) => 0,
            };
            let late = || format!("only {eligible} of {want} workers eligible");
            if let Some(end) = turn(started, deadline, eligible >= want, late).await {
                return end;
            }
        }
    }

    /// How many workers serving `activity` are registered on this cluster node (`node`, its
    /// `cluster.node`), suspended ones included: this node's part of the cluster's census.
    pub(crate) async fn node_workers(
        api: &mut Api,
        node: &str,
        activity: &str,
    ) -> Result<u32, Failure> {
        let pool = describe(api, activity).await?;
        Ok(pool
            .nodes
            .iter()
            .find(|part| part.gateway_node == node)
            .and_then(|part| part.census.as_ref())
            .map_or(0, |census| census.compatible))
    }

    /// Waits until [`Target::node_workers`] reads 0 (a worker stopped without a drain keeps
    /// its session, suspended, for the reconnect grace); returns how long it took.
    pub(crate) async fn wait_no_workers(
        &self,
        node: &str,
        activity: &str,
        deadline: Duration,
    ) -> Result<Duration, Failure> {
        let started = Instant::now();
        let mut api = self.api().await?;
        loop {
            let workers = Self::node_workers(&mut api, node, activity).await?;
            let late = || format!("{workers} workers still registered on {node}");
            if let Some(end) = turn(started, deadline, workers == 0, late).await {
                return end;
            }
        }
    }

    /// How many finished durable dispatches of namespace `bench` the gateway's store lists
    /// (at most [`MAX_LISTED`]); `None` when the listing is refused (it needs the operator
    /// role) or fails.
    pub(crate) async fn finished_durable_dispatches(&self) -> Option<u64> {
        let mut api = self.api().await.ok()?;
        let listed = api
            .list_dispatches(pb::ListDispatchesRequest {
                namespace: NAMESPACE.to_owned(),
                state: "finished".to_owned(),
                limit: MAX_LISTED,
                ..pb::ListDispatchesRequest::default()
            })
            .await
            .ok()?;
        u64::try_from(listed.into_inner().dispatches.len()).ok()
    }

    /// Peak resident memory of the gateway's process, when it can be read.
    pub(crate) fn peak_rss_bytes(&self) -> Option<u64> {
        system::memory(self.pid()?).map(|memory| memory.peak_rss_bytes)
    }

    /// Current resident memory of the gateway's process, when it can be read.
    pub(crate) fn rss_bytes(&self) -> Option<u64> {
        system::memory(self.pid()?).map(|memory| memory.rss_bytes)
    }

    /// Whether the gateway's memory is measured in the bench's own process (so it includes
    /// the workers and the load generator).
    pub(crate) fn shares_process(&self) -> bool {
        matches!(self.host, Host::InProcess { .. })
    }

    /// `Some(None)`: this process; `Some(Some(pid))`: that one; `None`: unknown.
    fn pid(&self) -> Option<Option<u32>> {
        match self.host {
            Host::InProcess { .. } => Some(None),
            Host::Remote { pid } => pid.map(Some),
        }
    }

    /// Shuts an in-process gateway down and removes its data directory.
    pub(crate) async fn stop(self) {
        if let Host::InProcess { gateway, data_dir } = self.host {
            gateway.shutdown().await;
            let _ = std::fs::remove_dir_all(&data_dir);
        }
    }
}

fn describe_in_process(gateway: &Gateway) -> Result<(SocketAddr, SocketAddr, String), Failure> {
    let api_addr = gateway
        .addr("grpc")
        .ok_or_else(|| Failure::runtime("the gateway has no gRPC listener"))?;
    let quic_addr = gateway
        .addr("quic")
        .ok_or_else(|| Failure::runtime("the gateway has no QUIC listener"))?;
    let ca_path = gateway
        .tls()
        .dev_ca_path()
        .ok_or_else(|| Failure::runtime("the bench needs development TLS material"))?;
    Ok((api_addr, quic_addr, read_ca(ca_path)?))
}

/// `DescribePool` of `activity` in namespace `bench`.
async fn describe(api: &mut Api, activity: &str) -> Result<pb::DescribePoolReply, Failure> {
    api.describe_pool(pb::DescribePoolRequest {
        namespace: NAMESPACE.to_owned(),
        activity_type: activity.to_owned(),
        ..pb::DescribePoolRequest::default()
    })
    .await
    .map(tonic::Response::into_inner)
    .map_err(|status| Failure::status(&status))
}

/// One turn of a wait started at `started`: the time it took once `done`, a failure saying
/// `late()` once past `deadline`, else `None` after a 10 ms pause.
async fn turn(
    started: Instant,
    deadline: Duration,
    done: bool,
    late: impl FnOnce() -> String,
) -> Option<Result<Duration, Failure>> {
    if done {
        return Some(Ok(started.elapsed()));
    }
    if started.elapsed() > deadline {
        return Some(Err(Failure::runtime(format!(
            "{} after {} s",
            late(),
            deadline.as_secs()
        ))));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    None
}
