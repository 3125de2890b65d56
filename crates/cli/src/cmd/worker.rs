//! `switchyard worker`: a ready-made worker over gRPC or QUIC, and the worker builders the demo
//! shares.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use clap::{Args, ValueEnum};
use rustls_pki_types::pem::PemObject;
use switchyard_core::WorkerId;
use switchyard_core::{ActivityContext, ActivityError, Backoff};
use switchyard_transport_grpc::{GrpcWorker, WorkerOptions};
use switchyard_transport_quic::{ClientTls, QuicWorker, QuicWorkerHandle};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::Failure;
use super::behaviour::{self, ActivitySpec, WorkerStats};
use super::client::{ClientArgs, ClientIdentity};

/// Which worker transport to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum TransportKind {
    /// A gRPC stream to the API port.
    Grpc,
    /// QUIC (UDP) to the QUIC port.
    Quic,
}

/// `switchyard worker`.
#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    /// Transport to connect over.
    #[arg(long, value_enum)]
    pub(crate) transport: TransportKind,
    /// An activity it runs, as NAME=echo, NAME=sleep:MS or NAME=fail (repeatable).
    #[arg(long = "activity", required = true)]
    pub(crate) activities: Vec<ActivitySpec>,
    /// Tasks it runs at once.
    #[arg(long, default_value_t = 4)]
    pub(crate) capacity: u32,
    /// A namespace it serves (repeatable).
    #[arg(long = "namespace", default_values_t = ["default".to_owned()])]
    pub(crate) namespaces: Vec<String>,
    /// Task queue [default: default]
    #[arg(long, default_value = "")]
    pub(crate) task_queue: String,
    /// Node (locality) label it advertises.
    #[arg(long)]
    pub(crate) node: Option<String>,
    /// QUIC address of the gateway (with --transport quic).
    #[arg(long, default_value = "127.0.0.1:7701")]
    pub(crate) quic_addr: SocketAddr,
    /// Name the gateway's certificate must be valid for (QUIC).
    #[arg(long, default_value = "localhost")]
    pub(crate) server_name: String,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

/// Where and how a worker connects.
pub(crate) struct WorkerSetup<'a> {
    pub(crate) namespaces: &'a [String],
    pub(crate) task_queue: &'a str,
    pub(crate) node: Option<&'a str>,
    pub(crate) activities: &'a [ActivitySpec],
    pub(crate) capacity: u32,
    pub(crate) ca_pem: &'a str,
    pub(crate) identity: Option<&'a ClientIdentity>,
    pub(crate) token: Option<&'a str>,
    pub(crate) stats: Arc<WorkerStats>,
}

/// Longest wait between the CLI worker's reconnection attempts: a restarted gateway finds it
/// back within a couple of seconds of being ready.
const RECONNECT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// The options both transports' workers share, from the command line: one place for what the
/// worker serves, how much at once, its credential and its reconnection backoff.
fn worker_options(setup: &WorkerSetup<'_>) -> WorkerOptions {
    let mut options = WorkerOptions::default();
    options.namespaces(setup.namespaces.iter().cloned());
    options.task_queue = setup.task_queue.to_owned();
    options.max_concurrency = setup.capacity;
    options.node = setup.node.unwrap_or_default().to_owned();
    options.token = setup.token.map(str::to_owned);
    options.backoff = Backoff {
        max: RECONNECT_MAX,
        ..Backoff::default()
    };
    for spec in setup.activities {
        let (behaviour, stats) = (spec.behaviour, Arc::clone(&setup.stats));
        options.activity(
            spec.name.clone(),
            move |context: ActivityContext, input: Bytes| {
                let stats = Arc::clone(&stats);
                async move {
                    let token = context.cancellation().clone();
                    behaviour::run(behaviour, input, token, stats)
                        .await
                        .map_err(ActivityError::retryable)
                }
            },
        );
    }
    options
}

/// A connected gRPC worker; `run` it to serve.
pub(crate) async fn grpc_worker(
    endpoint: &str,
    setup: &WorkerSetup<'_>,
) -> Result<GrpcWorker, Failure> {
    let mut builder = GrpcWorker::builder(endpoint).options(worker_options(setup));
    if endpoint.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(setup.ca_pem));
        if let Some(identity) = setup.identity {
            tls = tls.identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
        }
        builder = builder.tls(tls);
    }
    builder
        .connect()
        .await
        .map_err(|error| Failure::runtime(format!("gRPC worker: {error}")))
}

/// A connected QUIC worker; `run` it to serve.
pub(crate) async fn quic_worker(
    addr: SocketAddr,
    server_name: &str,
    setup: &WorkerSetup<'_>,
) -> Result<QuicWorker, Failure> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(setup.ca_pem.as_bytes()) {
        let cert = cert.map_err(|error| Failure::runtime(format!("CA: {error}")))?;
        roots
            .add(cert)
            .map_err(|error| Failure::runtime(format!("CA: {error}")))?;
    }
    let tls = match setup.identity {
        None => ClientTls::new(roots),
        Some(identity) => {
            let chain =
                rustls_pki_types::CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| Failure::runtime(format!("--cert: {error}")))?;
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
                .map_err(|error| Failure::runtime(format!("--key: {error}")))?;
            ClientTls::with_client_cert(roots, chain, key)
        }
    }
    .map_err(|error| Failure::runtime(error.to_string()))?;
    QuicWorker::builder(addr, server_name)
        .options(worker_options(setup))
        .tls(tls)
        .connect()
        .await
        .map_err(|error| Failure::runtime(format!("QUIC worker: {error}")))
}

/// Reads a CA file, saying where it comes from when it is missing.
pub(crate) fn read_ca(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|error| {
        Failure::runtime(format!(
            "cannot read the CA {}: {error} (start `switchyard serve` once, or pass --ca)",
            path.display()
        ))
    })
}

pub(crate) async fn worker(args: WorkerArgs) -> Result<(), Failure> {
    let ca_pem =
        if args.transport == TransportKind::Quic || args.client.endpoint.starts_with("https://") {
            read_ca(&args.client.ca_path())?
        } else {
            String::new()
        };
    let identity = args.client.identity()?;
    let setup = WorkerSetup {
        namespaces: &args.namespaces,
        task_queue: &args.task_queue,
        node: args.node.as_deref(),
        activities: &args.activities,
        capacity: args.capacity,
        ca_pem: &ca_pem,
        identity: identity.as_ref(),
        token: args.client.token.as_deref(),
        stats: Arc::new(WorkerStats::default()),
    };
    let names: Vec<&str> = args.activities.iter().map(|a| a.name.as_str()).collect();
    // Either SDK says on stderr when it loses the gateway and when it is back; a subscriber
    // installed already (by an embedding test, say) is kept.
    let _ = switchyard_gateway::init_logging(&switchyard_gateway::LogSection::default());
    match args.transport {
        TransportKind::Grpc => {
            let worker = grpc_worker(&args.client.endpoint, &setup).await?;
            announce("grpc", Some(worker.worker_id()), &names, args.capacity);
            let stop = worker.shutdown_token();
            tokio::spawn(async move {
                super::serve::shutdown_signal().await;
                stop.cancel();
            });
            worker
                .run()
                .await
                .map_err(|error| Failure::runtime(error.to_string()))
        }
        TransportKind::Quic => {
            let worker = quic_worker(args.quic_addr, &args.server_name, &setup).await?;
            announce("quic", Some(worker.worker_id()), &names, args.capacity);
            let handle = worker.handle();
            tokio::spawn(report_reconnections(handle.clone(), args.quic_addr));
            tokio::spawn(async move {
                super::serve::shutdown_signal().await;
                if let Err(error) = handle.drain() {
                    tracing::warn!(%error, "could not drain the worker");
                }
            });
            // Returns only on a final drain (the operator's, or Ctrl-C's own) or a refusal
            // reconnecting cannot cure; a gateway shutting down or restarting is waited out.
            worker
                .run()
                .await
                .map_err(|error| Failure::runtime(error.to_string()))
        }
    }
}

/// Tells the operator when the QUIC worker loses its gateway and when it is registered again
/// (the SDK reconnects by itself, with jittered backoff).
async fn report_reconnections(handle: QuicWorkerHandle, gateway: SocketAddr) {
    let mut registrations = handle.registrations();
    let mut lost = false;
    while registrations.changed().await.is_ok() {
        let current = *registrations.borrow_and_update();
        match current {
            None if !lost => {
                lost = true;
                eprintln!("lost the gateway at {gateway}; reconnecting with backoff");
            }
            Some(id) if lost => {
                lost = false;
                println!("worker {id} registered again over quic");
            }
            _ => {}
        }
    }
}

fn announce(transport: &str, id: Option<WorkerId>, activities: &[&str], capacity: u32) {
    let id = id.map_or_else(|| "?".to_owned(), |id| id.to_string());
    println!(
        "worker {id} connected over {transport}: activities {}, capacity {capacity}; Ctrl-C to stop",
        activities.join(", ")
    );
}
