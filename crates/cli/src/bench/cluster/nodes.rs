//! The processes of a cluster run: a `nats-server` (unless `--nats-url` names one) and
//! `switchyard serve` nodes started from this binary, each killed when its handle drops, so an
//! error, a panic or a signal never leaves one behind.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::super::args::BenchArgs;
use super::super::target::Target;
use crate::cmd::Failure;
use crate::cmd::worker::read_ca;

/// How long a started process gets to say it is ready.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// Most tries at finding free loopback ports for the NATS server.
const PORT_TRIES: u32 = 3;

/// A child process, killed and reaped when dropped.
struct Owned {
    child: Child,
}

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The scratch directory of a run, removed when dropped (after the processes in it).
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory under the system's temporary directory.
    pub(crate) fn create() -> Result<Self, Failure> {
        let dir =
            std::env::temp_dir().join(format!("switchyard-bench-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|error| Failure::runtime(format!("{}: {error}", dir.display())))?;
        Ok(Self(dir))
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The NATS server the nodes join: one this run started, or one already running.
pub(crate) struct Nats {
    /// `nats://HOST:PORT`.
    pub(crate) url: String,
    /// Its monitoring address, when known.
    pub(crate) monitor: Option<SocketAddr>,
    /// Its process id, when this run started it.
    pub(crate) pid: Option<u32>,
    _process: Option<Owned>,
}

impl Nats {
    /// `--nats-url` (with `--nats-monitor`), or a `nats-server -js` started on free loopback
    /// ports with its store under `scratch`.
    pub(crate) fn start(args: &BenchArgs, scratch: &Scratch) -> Result<Self, Failure> {
        if let Some(url) = &args.nats_url {
            return Ok(Self {
                url: url.clone(),
                monitor: args.nats_monitor,
                pid: None,
                _process: None,
            });
        }
        let program = args
            .nats_server
            .clone()
            .unwrap_or_else(|| PathBuf::from("nats-server"));
        let mut last = Failure::runtime("no free ports for nats-server");
        for attempt in 0..PORT_TRIES {
            match Self::spawn(&program, scratch, attempt) {
                Ok(nats) => return Ok(nats),
                Err(failure) => last = failure,
            }
        }
        Err(last)
    }

    fn spawn(program: &Path, scratch: &Scratch, attempt: u32) -> Result<Self, Failure> {
        let (port, monitor) = (free_port()?, free_port()?);
        let log = scratch.path().join(format!("nats-{attempt}.log"));
        let child = Command::new(program)
            .arg("-js")
            .arg("-sd")
            .arg(scratch.path().join(format!("jetstream-{attempt}")))
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string(), "-l"])
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| {
                Failure::usage(format!(
                    "cannot start {} ({error}): install nats-server (Debian: apt-get install \
                     -y nats-server), or pass --nats-server PATH or --nats-url URL",
                    program.display()
                ))
            })?;
        let mut process = Owned { child };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Server is ready")
                && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                break;
            }
            let exited = process.child.try_wait().ok().flatten();
            if exited.is_some() || started.elapsed() > START_DEADLINE {
                return Err(Failure::runtime(format!(
                    "nats-server did not become ready on {addr}: {}",
                    last_lines(&text)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            url: format!("nats://{addr}"),
            monitor: Some(SocketAddr::from(([127, 0, 0, 1], monitor))),
            pid: Some(process.child.id()),
            _process: Some(process),
        })
    }
}

/// What a node's configuration file says beyond its defaults.
pub(crate) struct NodeSpec<'a> {
    /// The node's name, also its directory under the scratch directory.
    pub(crate) name: &'a str,
    /// `[cluster]` on this NATS URL and cluster name, or a lone gateway.
    pub(crate) cluster: Option<(&'a str, &'a str)>,
}

/// The environment that sizes a node's async runtime: `TOKIO_WORKER_THREADS` (tokio reads it
/// when `serve` builds its runtime) as `--node-worker-threads` resolves for this machine, or
/// nothing for `inherit` (the node inherits the bench's environment).
fn runtime_env(args: &BenchArgs) -> Option<(&'static str, String)> {
    node_worker_threads(args).map(|threads| ("TOKIO_WORKER_THREADS", threads.to_string()))
}

/// The worker threads each node's runtime gets on this machine; `None` when inherited.
pub(crate) fn node_worker_threads(args: &BenchArgs) -> Option<u16> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    args.node_worker_threads
        .resolve(cores, args.cluster.unwrap_or(1))
}

/// A running `switchyard serve` node and how to reach it.
pub(crate) struct Node {
    /// Its name.
    pub(crate) name: String,
    /// The gateway as the bench drives it.
    pub(crate) target: Target,
    /// Its process id.
    pub(crate) pid: u32,
    _process: Owned,
}

impl Node {
    /// Writes the node's configuration and starts `switchyard serve` on it (this program),
    /// waiting for the banner that names its listeners.
    pub(crate) async fn start(
        args: &BenchArgs,
        scratch: &Scratch,
        spec: &NodeSpec<'_>,
    ) -> Result<Self, Failure> {
        let dir = scratch.path().join(spec.name);
        std::fs::create_dir_all(&dir)
            .map_err(|error| Failure::runtime(format!("{}: {error}", dir.display())))?;
        let config = dir.join("switchyard.toml");
        std::fs::write(&config, node_config(args, &dir, spec))
            .map_err(|error| Failure::runtime(format!("{}: {error}", config.display())))?;
        let program = std::env::current_exe()
            .map_err(|error| Failure::runtime(format!("cannot find this program: {error}")))?;
        let stderr = std::fs::File::create(dir.join("stderr.log"))
            .map_err(|error| Failure::runtime(format!("{}: {error}", dir.display())))?;
        let mut command = Command::new(program);
        command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove("RUST_LOG")
            .envs(runtime_env(args))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // `serve` reads SWITCHYARD_* variables as configuration and refuses unknown ones; the
        // node's file says everything it needs.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SWITCHYARD_") {
                command.env_remove(name);
            }
        }
        let mut child = command.spawn().map_err(|error| {
            Failure::runtime(format!("cannot start node {}: {error}", spec.name))
        })?;
        let stdout = child.stdout.take();
        let process = Owned { child };
        let pid = process.child.id();
        let banner = match stdout {
            Some(stdout) => tokio::task::spawn_blocking(move || read_banner(stdout))
                .await
                .map_err(|error| Failure::runtime(format!("banner reader: {error}")))?,
            None => None,
        };
        let Some((api_addr, quic_addr)) = banner else {
            let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
            return Err(Failure::runtime(format!(
                "node {} did not start within {START_DEADLINE:?}: {}",
                spec.name,
                last_lines(&log)
            )));
        };
        let ca_pem = read_ca(&dir.join("data").join("tls").join("ca.pem"))?;
        Ok(Self {
            name: spec.name.to_owned(),
            target: Target::child(api_addr, quic_addr, ca_pem, pid),
            pid,
            _process: process,
        })
    }
}

/// The gRPC and QUIC addresses from `serve`'s banner, bounded by [`START_DEADLINE`]; the
/// rest of stdout is drained on a thread so the node never blocks writing it.
fn read_banner(stdout: impl Read + Send + 'static) -> Option<(SocketAddr, SocketAddr)> {
    let (lines, banner) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The receiver is gone once the banner is read; keep draining.
            let _ = lines.send(line);
        }
    });
    let started = Instant::now();
    let (mut grpc, mut quic) = (None, None);
    while grpc.is_none() || quic.is_none() {
        let left = START_DEADLINE.checked_sub(started.elapsed())?;
        let line = banner.recv_timeout(left).ok()?;
        let listener = |name: &str| {
            let rest = line.trim_start().strip_prefix(name)?;
            rest.split_whitespace().last()?.parse::<SocketAddr>().ok()
        };
        grpc = grpc.or_else(|| listener("grpc "));
        quic = quic.or_else(|| listener("quic "));
    }
    grpc.zip(quic)
}

/// A node's `switchyard.toml`: ephemeral ports on loopback, the listener limits lifted as for
/// the in-process bench gateway, an in-memory store, and `[cluster]` when it is a member.
fn node_config(args: &BenchArgs, dir: &Path, spec: &NodeSpec<'_>) -> String {
    let streams = args.outstanding.max(1024);
    let in_flight = args.outstanding.max(4096);
    let congestion = match args.congestion {
        super::super::args::Congestion::Cubic => "cubic",
        super::super::args::Congestion::Bbr => "bbr",
        super::super::args::Congestion::Newreno => "newreno",
    };
    let redundancy = match args.redundancy {
        super::super::args::RedundancyArg::Off => "off",
        super::super::args::RedundancyArg::Datagram => "datagram",
    };
    let mut config = format!(
        r#"[grpc]
listen = "127.0.0.1:0"
max_concurrent_streams = {streams}
max_connections = 1000000
max_connections_per_address = 1000000

[quic]
listen = "127.0.0.1:0"
max_connections_per_address = 1000000
congestion = "{congestion}"
redundancy = "{redundancy}"
send_fairness = {send_fairness}
ack_eliciting_threshold = {ack_threshold}

[ops]
enabled = false

[tls]
data_dir = {data_dir:?}

[dispatch]
max_in_flight_per_stream = {in_flight}

[store]
backend = "memory"

[shutdown]
drain_timeout = "2s"

[log]
filter = "error"
"#,
        data_dir = dir.join("data").display().to_string(),
        send_fairness = args.quic_send_fairness,
        ack_threshold = args.quic_ack_threshold,
    );
    if let Some((nats_url, cluster)) = spec.cluster {
        // Membership refreshes are NATS traffic too: the first comes 5 minutes after a node
        // starts, so a run shorter than that measures dispatch traffic only (no node is
        // killed during a bench, so the long TTL costs nothing).
        config.push_str(&format!(
            "\n[cluster]\nnats_url = {nats_url:?}\nname = {cluster:?}\nnode = {node:?}\n\
             member_ttl = \"900s\"\nrefresh_every = \"300s\"\n",
            node = spec.name,
        ));
    }
    config
}

/// A loopback TCP port nothing listens on at this instant.
fn free_port() -> Result<u16, Failure> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|error| Failure::runtime(format!("no free loopback port: {error}")))
}

/// The last few lines of a log, for an error message.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_node_gets_the_cluster_table_and_a_lone_node_none() {
        let args = crate::bench::cluster::tests::args(&["--cluster", "3"]);
        let dir = Path::new("/tmp/x");
        let member = node_config(
            &args,
            dir,
            &NodeSpec {
                name: "n2",
                cluster: Some(("nats://127.0.0.1:4222", "bench-1")),
            },
        );
        assert!(member.contains("[cluster]\nnats_url = \"nats://127.0.0.1:4222\""));
        assert!(member.contains("node = \"n2\""));
        // Control: the single-node comparison runs without `[cluster]`.
        let lone = node_config(
            &args,
            dir,
            &NodeSpec {
                name: "single",
                cluster: None,
            },
        );
        assert!(!lone.contains("[cluster]"));
    }

    #[test]
    fn node_worker_threads_reach_the_node_as_tokio_worker_threads() {
        let envs = |flags: &[&str]| {
            let args = crate::bench::cluster::tests::args(flags);
            let mut command = Command::new("serve");
            command.envs(runtime_env(&args));
            command
                .get_envs()
                .map(|(name, value)| (name.to_owned(), value.map(std::ffi::OsStr::to_owned)))
                .collect::<Vec<_>>()
        };
        let threads = |count: u16| {
            vec![(
                std::ffi::OsString::from("TOKIO_WORKER_THREADS"),
                Some(std::ffi::OsString::from(count.to_string())),
            )]
        };
        assert_eq!(
            envs(&["--cluster", "3", "--node-worker-threads", "1"]),
            threads(1)
        );
        // By default each node gets its share of this machine's cores.
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let share = u16::try_from((cores / 4).clamp(1, 64)).expect("at most 64");
        assert_eq!(envs(&["--cluster", "3"]), threads(share));
        // Control: `inherit` leaves the node's environment as it is.
        let inherited = envs(&["--cluster", "3", "--node-worker-threads", "inherit"]);
        assert_eq!(inherited, Vec::new());
    }

    #[test]
    fn the_last_lines_of_a_log_are_kept() {
        assert_eq!(last_lines("a\nb\nc\nd\ne\nf\ng"), "c | d | e | f | g");
        assert_eq!(last_lines(""), "");
    }
}
