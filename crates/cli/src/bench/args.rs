//! The flags of `switchyard bench` and their limits.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;
use switchyard_transport_quic::{ConnectionConfig, MAX_ACK_ELICITING_THRESHOLD};

use crate::cmd::Failure;

/// Most dispatches one run may ask for.
const MAX_TASKS: u32 = 20_000_000;
/// Most workers (load or idle) one run may connect.
const MAX_WORKERS: u32 = 50_000;
/// Most dispatches tenant A may park in `--scenario tenant-fairness`.
const MAX_PARKED: u32 = 1_000_000;
/// Largest payload, in bytes.
const MAX_PAYLOAD: usize = 4 * 1024 * 1024;
/// Longest service time, in microseconds (10 s).
const MAX_SERVICE_TIME_US: u64 = 10_000_000;
/// Most producer connections one run may open.
const MAX_CONNECTIONS: u32 = 64;
/// Most nodes `--cluster` starts.
const MAX_NODES: u32 = 8;
/// The most worker threads `--node-worker-threads` gives a node.
const MAX_NODE_WORKER_THREADS: u16 = 64;

/// Which worker transport the bench's workers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BenchTransport {
    /// Every worker over gRPC.
    Grpc,
    /// Every worker over QUIC.
    Quic,
    /// Workers alternate gRPC and QUIC.
    Mixed,
}

/// What `switchyard bench` measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Scenario {
    /// The load run (or `--idle-workers`, `--workers-only`).
    #[default]
    Load,
    /// Tenant B's sequential dispatch rate alone and while tenant A parks `--parked`
    /// dispatches in its own namespace; reports both rates and their ratio.
    TenantFairness,
}

/// How dispatches enter the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Via {
    /// One `Dispatch` call per task, P calls at once spread over `--connections` HTTP/2
    /// connections.
    Unary,
    /// One `DispatchStream` per connection (`--connections`), P requests outstanding in all.
    Stream,
    /// Straight into core's dispatcher, no producer API (in-process gateway only).
    Core,
    /// `Submit` calls, P at once, each outcome read from one `WatchOutcomes` stream (with
    /// `--durable` only).
    Submit,
}

/// QUIC congestion controller of the in-process gateway and of the bench's QUIC workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Congestion {
    /// CUBIC.
    Cubic,
    /// BBR.
    Bbr,
    /// NewReno.
    Newreno,
}

/// QUIC redundancy for small frames (`quic.redundancy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RedundancyArg {
    /// Lanes only.
    #[default]
    Off,
    /// Small tasks and results also travel as QUIC datagrams.
    Datagram,
}

impl Congestion {
    /// The QUIC library's setting.
    pub(crate) fn library(self) -> switchyard_transport_quic::CongestionControl {
        match self {
            Self::Cubic => switchyard_transport_quic::CongestionControl::Cubic,
            Self::Bbr => switchyard_transport_quic::CongestionControl::Bbr,
            Self::Newreno => switchyard_transport_quic::CongestionControl::NewReno,
        }
    }
}

impl BenchArgs {
    /// The QUIC link settings of the bench's QUIC workers, the gateway's the same.
    pub(crate) fn quic_link(&self) -> ConnectionConfig {
        ConnectionConfig {
            congestion: self.congestion.library(),
            send_fairness: self.quic_send_fairness,
            ack_eliciting_threshold: (self.quic_ack_threshold != 0)
                .then_some(self.quic_ack_threshold),
            ..ConnectionConfig::default()
        }
    }
}

impl RedundancyArg {
    /// The QUIC library's setting.
    pub(crate) fn library(self) -> switchyard_transport_quic::Redundancy {
        match self {
            Self::Off => switchyard_transport_quic::Redundancy::Off,
            Self::Datagram => switchyard_transport_quic::Redundancy::Datagram,
        }
    }
}

/// The in-process gateway's dispatch store (`[store]`) for `--durable` runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StoreArg {
    /// SQLite, `synchronous = full` (the default: every acknowledged write survives power loss).
    #[default]
    Sqlite,
    /// SQLite, `synchronous = normal` (survives a process crash, not power loss).
    SqliteNormal,
    /// Process memory (durable dispatches do not survive a restart): the durable path's cost
    /// without the file.
    Memory,
}

/// `switchyard bench`.
#[derive(Args, Debug, Clone, Serialize)]
pub(crate) struct BenchArgs {
    /// Worker transport.
    #[arg(long, value_enum, default_value_t = BenchTransport::Grpc)]
    pub(crate) transport: BenchTransport,
    /// Workers to connect, each over its own socket.
    #[arg(long, default_value_t = 4)]
    pub(crate) workers: u32,
    /// Tasks each worker runs at once (its advertised capacity).
    #[arg(long, default_value_t = 64)]
    pub(crate) capacity: u32,
    /// Dispatches to run.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) tasks: u32,
    /// Dispatches outstanding at once.
    #[arg(long, default_value_t = 256)]
    pub(crate) outstanding: u32,
    /// Input bytes per dispatch (echoed back as the output).
    #[arg(long, default_value_t = 64)]
    pub(crate) payload: usize,
    /// Seconds a dispatch waits for its outcome (the producer's deadline), 1 to 600; the bench
    /// gives up on a reply 30 s after it.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) dispatch_timeout_secs: u64,
    /// Microseconds each task takes in the worker (0: returns at once).
    #[arg(long, default_value_t = 0)]
    pub(crate) service_time_us: u64,
    /// How dispatches enter the gateway.
    #[arg(long, value_enum, default_value_t = Via::Stream)]
    pub(crate) via: Via,
    /// HTTP/2 connections the producer spreads its outstanding dispatches over (`--via unary`:
    /// calls round-robin over them; `--via stream`: one `DispatchStream` on each).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub(crate) connections: u32,
    /// Instead of the load run: connect K idle workers (alternating gRPC and QUIC; a failed
    /// connect is tried up to 3 times and counted), report memory per worker and the time until
    /// all K are eligible.
    #[arg(long, value_name = "K")]
    pub(crate) idle_workers: Option<u32>,
    /// Drive a running gateway at this API address (HOST:PORT) instead of starting one.
    #[arg(long, value_name = "ADDR")]
    pub(crate) connect: Option<SocketAddr>,
    /// QUIC address of the gateway with --connect [default: the --connect host, port + 1]
    #[arg(long, value_name = "ADDR")]
    pub(crate) quic_connect: Option<SocketAddr>,
    /// CA the gateway's certificate chains to (with --connect).
    #[arg(long, requires = "connect")]
    #[serde(skip)]
    pub(crate) ca: Option<PathBuf>,
    /// Name the gateway's certificate is valid for (with --connect).
    #[arg(long, default_value = "localhost")]
    #[serde(skip)]
    pub(crate) server_name: String,
    /// Bearer token of a principal granted namespace `bench` (with --connect).
    #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true)]
    #[serde(skip)]
    pub(crate) token: Option<String>,
    /// Process id of the gateway whose memory to report (with --connect).
    #[arg(long, requires = "connect")]
    pub(crate) gateway_pid: Option<u32>,
    /// Producer only: connect no workers, wait for `--workers` eligible ones another process
    /// connected (with --connect; see `--workers-only`).
    #[arg(long, requires = "connect", conflicts_with = "workers_only")]
    pub(crate) external_workers: bool,
    /// Workers only: connect `--workers` workers and serve until SIGINT/SIGTERM or this many
    /// seconds, then print their counters (with --connect).
    #[arg(long, value_name = "SECONDS", requires = "connect")]
    pub(crate) workers_only: Option<u64>,
    /// QUIC congestion controller of both ends: the in-process gateway's and the bench's QUIC
    /// workers' (each end controls what it sends: results travel under the workers').
    #[arg(long, value_enum, default_value_t = Congestion::Cubic)]
    pub(crate) congestion: Congestion,
    /// QUIC send fairness of both ends (`quic.send_fairness` of the in-process gateway or the
    /// cluster's nodes, `ConnectionConfig::send_fairness` of the bench's QUIC workers): `false`
    /// sends each connection's frames in write order instead of round-robin between lanes.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) quic_send_fairness: bool,
    /// QUIC ACK frequency both ends ask of their peer (`quic.ack_eliciting_threshold` of the
    /// in-process gateway or the cluster's nodes, `ConnectionConfig::ack_eliciting_threshold` of
    /// the bench's QUIC workers): acknowledge after this many ack-eliciting packets; 0 asks
    /// nothing.
    #[arg(long, value_name = "N", default_value_t = 0,
        value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_ACK_ELICITING_THRESHOLD)))]
    pub(crate) quic_ack_threshold: u32,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Scenario::Load)]
    pub(crate) scenario: Scenario,
    /// Dispatches tenant A parks in `--scenario tenant-fairness`.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) parked: u32,
    /// QUIC redundancy for small frames: what QUIC workers ask for, and the in-process
    /// gateway's `quic.redundancy` (a gateway at --connect decides with its own).
    #[arg(long, value_enum, default_value_t = RedundancyArg::Off)]
    pub(crate) redundancy: RedundancyArg,
    /// Durable dispatches: each is recorded in the gateway's store (fsynced) before it runs and
    /// its outcome recorded before it is returned. `--via stream` and `--via unary` set
    /// `durable` on each request; `--via submit` uses `Submit` and `WatchOutcomes`.
    #[arg(long)]
    pub(crate) durable: bool,
    /// The in-process gateway's dispatch store (a gateway at --connect uses its own).
    #[arg(long, value_enum, default_value_t = StoreArg::Sqlite)]
    pub(crate) store: StoreArg,
    /// Cluster mode: start N `switchyard serve` nodes (2..=8) joined over NATS, each its own
    /// process, and report a single node, the local path (workers on the producer's node 1)
    /// and the cross-node path (workers on nodes 2..N), with NATS messages per dispatch.
    #[arg(long, value_name = "N")]
    pub(crate) cluster: Option<u32>,
    /// The nats-server program --cluster starts [default: nats-server on PATH].
    #[arg(
        long,
        value_name = "PATH",
        requires = "cluster",
        conflicts_with = "nats_url"
    )]
    pub(crate) nats_server: Option<PathBuf>,
    /// A running NATS server with JetStream for --cluster, instead of starting one.
    #[arg(long, value_name = "URL", requires = "cluster")]
    pub(crate) nats_url: Option<String>,
    /// Monitoring address (HOST:PORT, `nats-server -m`) of the server at --nats-url, read for
    /// the messages per dispatch.
    #[arg(long, value_name = "ADDR", requires = "nats_url")]
    pub(crate) nats_monitor: Option<SocketAddr>,
    /// Worker threads of each --cluster node's async runtime (the nodes get it as
    /// `TOKIO_WORKER_THREADS`): N (1..=64); `share`, each node's share of this machine's
    /// cores, the cores ÷ (nodes + 1) counting the bench's own process, at least 1 (nodes on
    /// one machine standing for nodes on machines of their own); `inherit`, the bench's
    /// environment's `TOKIO_WORKER_THREADS`, else one per core.
    #[arg(
        long,
        value_name = "N|share|inherit",
        default_value = "share",
        requires = "cluster"
    )]
    pub(crate) node_worker_threads: NodeThreads,
}

/// How many worker threads each `--cluster` node's async runtime gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeThreads {
    /// Its share of the machine's cores ([`NodeThreads::resolve`]).
    Share,
    /// Whatever the bench's environment gives (tokio's default: one per core).
    Inherit,
    /// This many.
    Count(u16),
}

impl NodeThreads {
    /// The worker threads a node gets among `nodes` on a machine of `cores`: `None` leaves the
    /// node's environment as it is. A share is the cores ÷ (nodes + 1), the bench's own
    /// process (producer and workers) counted as one more, and at least 1.
    pub(crate) fn resolve(self, cores: usize, nodes: u32) -> Option<u16> {
        match self {
            Self::Share => {
                let sharers = usize::try_from(nodes)
                    .unwrap_or(usize::MAX)
                    .saturating_add(1);
                let share = (cores / sharers).max(1);
                Some(
                    u16::try_from(share)
                        .unwrap_or(MAX_NODE_WORKER_THREADS)
                        .min(MAX_NODE_WORKER_THREADS),
                )
            }
            Self::Inherit => None,
            Self::Count(threads) => Some(threads),
        }
    }
}

impl std::str::FromStr for NodeThreads {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "share" => Ok(Self::Share),
            "inherit" => Ok(Self::Inherit),
            count => count
                .parse()
                .map(Self::Count)
                .map_err(|_| format!("{count:?}: a number, `share` or `inherit`")),
        }
    }
}

impl Serialize for NodeThreads {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Share => serializer.serialize_str("share"),
            Self::Inherit => serializer.serialize_str("inherit"),
            Self::Count(threads) => serializer.serialize_u16(*threads),
        }
    }
}

impl BenchArgs {
    /// Refuses combinations that cannot run, naming the flag.
    pub(crate) fn validate(&self) -> Result<(), Failure> {
        let in_range = |name: &str, value: u64, max: u64| {
            if value == 0 || value > max {
                Err(Failure::usage(format!("{name} {value}: must be 1..={max}")))
            } else {
                Ok(())
            }
        };
        in_range("--workers", self.workers.into(), MAX_WORKERS.into())?;
        in_range("--capacity", self.capacity.into(), 1_000_000)?;
        in_range("--tasks", self.tasks.into(), MAX_TASKS.into())?;
        in_range("--outstanding", self.outstanding.into(), 1_000_000)?;
        in_range("--parked", self.parked.into(), MAX_PARKED.into())?;
        in_range(
            "--connections",
            self.connections.into(),
            MAX_CONNECTIONS.into(),
        )?;
        if self.connections > 1 && !matches!(self.via, Via::Unary | Via::Stream) {
            return Err(Failure::usage(
                "--connections spreads --via unary or --via stream; use 1 with core or submit",
            ));
        }
        if self.connections > self.outstanding {
            return Err(Failure::usage(format!(
                "--connections {}: at most --outstanding ({}), one dispatch per connection",
                self.connections, self.outstanding
            )));
        }
        if self.scenario == Scenario::TenantFairness && self.connect.is_some() {
            return Err(Failure::usage(
                "--scenario tenant-fairness needs the in-process gateway; it cannot be used \
                 with --connect",
            ));
        }
        if let Some(idle) = self.idle_workers {
            in_range("--idle-workers", idle.into(), MAX_WORKERS.into())?;
        }
        if self.payload > MAX_PAYLOAD {
            return Err(Failure::usage(format!(
                "--payload {}: at most {MAX_PAYLOAD} bytes",
                self.payload
            )));
        }
        if self.service_time_us > MAX_SERVICE_TIME_US {
            return Err(Failure::usage(format!(
                "--service-time-us {}: at most {MAX_SERVICE_TIME_US}",
                self.service_time_us
            )));
        }
        if self.via == Via::Submit && !self.durable {
            return Err(Failure::usage("--via submit needs --durable"));
        }
        if self.durable && self.via == Via::Core {
            return Err(Failure::usage(
                "--durable needs the producer API: --via stream, unary or submit, not core",
            ));
        }
        if self.durable && self.scenario == Scenario::TenantFairness {
            return Err(Failure::usage(
                "--durable measures the load run; --scenario tenant-fairness is ephemeral",
            ));
        }
        if self.via == Via::Core && self.connect.is_some() {
            return Err(Failure::usage(
                "--via core needs the in-process gateway; it cannot be used with --connect",
            ));
        }
        if let Some(nodes) = self.cluster {
            self.validate_cluster(nodes)?;
        }
        Ok(())
    }

    /// `--cluster N`: a node count in range and only the flags its load run uses.
    fn validate_cluster(&self, nodes: u32) -> Result<(), Failure> {
        if !(2..=MAX_NODES).contains(&nodes) {
            return Err(Failure::usage(format!(
                "--cluster {nodes}: must be 2..={MAX_NODES}"
            )));
        }
        if let NodeThreads::Count(threads) = self.node_worker_threads
            && !(1..=MAX_NODE_WORKER_THREADS).contains(&threads)
        {
            return Err(Failure::usage(format!(
                "--node-worker-threads {threads}: must be 1..={MAX_NODE_WORKER_THREADS}"
            )));
        }
        let refused = [
            ("--connect", self.connect.is_some()),
            ("--idle-workers", self.idle_workers.is_some()),
            ("--workers-only", self.workers_only.is_some()),
            ("--external-workers", self.external_workers),
            ("--durable", self.durable),
            ("--via core", self.via == Via::Core),
            (
                "--scenario tenant-fairness",
                self.scenario == Scenario::TenantFairness,
            ),
        ];
        match refused.iter().find(|(_, set)| *set) {
            Some((flag, _)) => Err(Failure::usage(format!(
                "--cluster starts its own nodes and measures ephemeral load through the \
                 producer API; it cannot be used with {flag}"
            ))),
            None => Ok(()),
        }
    }

    /// The QUIC address to dial when driving a running gateway.
    pub(crate) fn quic_target(&self) -> Option<SocketAddr> {
        self.quic_connect.or_else(|| {
            self.connect.map(|mut addr| {
                addr.set_port(addr.port().wrapping_add(1));
                addr
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::bench::cluster::tests::args;

    use super::MAX_ACK_ELICITING_THRESHOLD;

    #[test]
    fn the_quic_link_flags_reach_the_workers_settings() {
        let tuned = args(&["--quic-send-fairness", "false", "--quic-ack-threshold", "8"]);
        let link = tuned.quic_link();
        assert!(!link.send_fairness);
        assert_eq!(link.ack_eliciting_threshold, Some(8));
        // Control: without the flags, quinn's own scheduling and no ACK frequency request.
        let default = args(&[]).quic_link();
        assert!(default.send_fairness);
        assert_eq!(default.ack_eliciting_threshold, None);
    }

    #[test]
    fn an_ack_threshold_beyond_the_limit_is_refused_by_the_parser() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: super::BenchArgs,
        }
        let at = |n: u32| Cli::try_parse_from(["bench", "--quic-ack-threshold", &n.to_string()]);
        assert!(at(MAX_ACK_ELICITING_THRESHOLD).is_ok());
        let error = at(MAX_ACK_ELICITING_THRESHOLD + 1)
            .err()
            .map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("--quic-ack-threshold")),
            "{error:?}"
        );
    }
}
