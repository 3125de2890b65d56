//! `switchyard serve`: load the configuration, start the gateway, run until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use switchyard_gateway::{Gateway, GatewayConfig, Override, StartError, init_logging};

use super::Failure;

/// `switchyard serve`.
#[derive(Args, Debug, Default)]
pub(crate) struct ServeArgs {
    /// TOML configuration file (see docs/configuration.md).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Producer API and gRPC worker address (`grpc.listen`).
    #[arg(long)]
    pub(crate) grpc_listen: Option<SocketAddr>,
    /// QUIC worker address, UDP (`quic.listen`).
    #[arg(long)]
    pub(crate) quic_listen: Option<SocketAddr>,
    /// Operations HTTP address (`ops.listen`).
    #[arg(long)]
    pub(crate) ops_listen: Option<SocketAddr>,
    /// Directory for the generated development TLS material (`tls.data_dir`).
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Do not start the QUIC transport (`quic.enabled = false`).
    #[arg(long)]
    pub(crate) no_quic: bool,
    /// Log filter in RUST_LOG syntax (`log.filter`).
    #[arg(long)]
    pub(crate) log_filter: Option<String>,
    /// Log one JSON object per line (`log.format = "json"`).
    #[arg(long)]
    pub(crate) log_json: bool,
}

impl ServeArgs {
    /// The flags as configuration overrides.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        let mut flags = Vec::new();
        let mut set = |key: &str, flag: &str, value: Option<String>| {
            if let Some(value) = value {
                flags.push(Override::flag(key, flag, value));
            }
        };
        set(
            "grpc.listen",
            "grpc-listen",
            self.grpc_listen.map(|a| a.to_string()),
        );
        set(
            "quic.listen",
            "quic-listen",
            self.quic_listen.map(|a| a.to_string()),
        );
        set(
            "ops.listen",
            "ops-listen",
            self.ops_listen.map(|a| a.to_string()),
        );
        set(
            "tls.data_dir",
            "data-dir",
            self.data_dir.as_ref().map(|d| d.display().to_string()),
        );
        set(
            "quic.enabled",
            "no-quic",
            self.no_quic.then(|| "false".to_owned()),
        );
        set("log.filter", "log-filter", self.log_filter.clone());
        set(
            "log.format",
            "log-json",
            self.log_json.then(|| "json".to_owned()),
        );
        flags
    }

    /// The configuration from the file, the environment and the flags.
    pub(crate) fn load(&self) -> Result<GatewayConfig, Failure> {
        GatewayConfig::load(self.config.as_deref(), std::env::vars(), &self.overrides())
            .map_err(|error| Failure::usage(error.to_string()))
    }
}

pub(crate) async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let config = args.load()?;
    init_logging(&config.log).map_err(|error| Failure::usage(error.to_string()))?;
    // One per core unless tokio's TOKIO_WORKER_THREADS says otherwise (several nodes on one
    // machine each take their share, docs/cluster.md).
    let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(worker_threads, "async runtime");
    let gateway = Gateway::builder(config)
        .start()
        .await
        .map_err(start_failure)?;
    let stop = shutdown_signal();
    print_banner(&gateway);
    gateway
        .run_until(stop)
        .await
        .map_err(|error| Failure::runtime(error.to_string()))
}

/// A start that failed: TLS material or a dispatch store the configuration points at that
/// cannot be used is a configuration error (exit 2, the message names the key or the path);
/// anything else is a run-time one.
fn start_failure(error: StartError) -> Failure {
    match error {
        StartError::Tls(error) => Failure::usage(error.to_string()),
        error @ StartError::Store(_) => Failure::usage(error.to_string()),
        other => Failure::runtime(other.to_string()),
    }
}

/// What a user needs to connect workers and producers, on stdout.
pub(crate) fn print_banner(gateway: &Gateway) {
    println!("switchyard gateway running");
    for (name, listen) in gateway.listeners() {
        println!("  {name:<6} {} {}", listen.protocol, listen.addr);
    }
    if let Some(ops) = gateway.ops_addr() {
        println!(
            "  ops    http://{ops}  (/healthz /readyz /metrics /v1/workers /v1/pools /v1/unserved)"
        );
        println!("  console http://{ops}/  (read-only: pools, workers, unserved queues, events)");
    }
    match gateway.store_path() {
        Some(path) => println!("  store  {} (durable dispatches)", path.display()),
        None => println!("  store  memory: durable dispatches do not survive a restart"),
    }
    let tls = gateway.tls();
    match tls.dev_ca_path() {
        Some(ca) => println!(
            "  tls    development CA {} ({}); workers and clients trust this file",
            ca.display(),
            if tls.generated() {
                "generated now"
            } else {
                "reused"
            }
        ),
        None => println!("  tls    certificate {}", tls.cert_path().display()),
    }
    if gateway.principals().is_development() {
        println!("  auth   development mode: no principals configured, every caller is trusted");
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled: a signal sent as soon as the banner is out (the banner is printed
/// after the call) stops the gateway gracefully instead of killing it.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let streams = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        match streams {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (term, int) => {
                for error in [term.err(), int.err()].into_iter().flatten() {
                    tracing::warn!(%error, "cannot listen for a shutdown signal");
                }
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received");
    }
}
