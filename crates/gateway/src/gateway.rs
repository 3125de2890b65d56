//! [`Gateway`]: one process-wide [`Core`] and every transport started against it.
//!
//! [`Gateway::builder`] assembles what `switchyard serve` runs: the core (one registry, one
//! admission gate, one dispatcher, one prober) from configuration, the principal table, the TLS
//! material, the operations listener, and the transports — the built-in gRPC (with the producer
//! API) and QUIC ones from configuration, plus any added with [`GatewayBuilder::transport`], all
//! started through the same [`Transport`] trait. Beside the core it opens the dispatch store
//! (`[store]`) and starts the [`DurableDispatcher`] over the core's dispatcher, which resumes
//! the durable dispatches a previous run left unfinished. [`Gateway::shutdown`] takes no new
//! worker, stops the durable dispatcher from recording (so a durable dispatch the shutdown
//! ends is not recorded `ShuttingDown` but resumes at the next start), tells every worker the
//! gateway is stopping and waits up to `shutdown.drain_timeout` for the tasks in flight
//! (producers still get an answer: new dispatches end `ShuttingDown`), ends what remains
//! `ShuttingDown`, and only then closes the transports' listeners and lets go of the store.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{
    Core, CoreConfig, DispatchConfig, DispatchStore, DispatchStoreError, DurableDispatcher,
    InMemoryNamespaceStore, LivenessConfig, NamespacePolicy, NamespaceRecord, NamespaceStore, Node,
    Placement, Registry,
};
use switchyard_store_sqlite::OpenError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiConfig, DurabilityDefaults};
use crate::auth::Principals;
use crate::config::{GatewayConfig, NamespacePolicyName, NamespaceSection, StoreBackendName};
use crate::grpc_server::GrpcTransport;
use crate::ops;
use crate::quic::QuicTransport;
use crate::readiness::Readiness;
use crate::tls::{TlsError, TlsMaterial, resolve_data_dir};
use crate::transport::{ListenAddr, Transport, TransportContext, TransportError};

/// How long stopped transports get to end their serving futures before they are abandoned.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// TLS material could not be loaded or generated.
    #[error("{0}")]
    Tls(#[from] TlsError),
    /// The dispatch store could not be opened (the message names its path and why).
    #[error("{0}")]
    Store(#[from] OpenError),
    /// The dispatch store opened but its unfinished dispatches could not be read back.
    #[error("dispatch store: cannot resume the unfinished durable dispatches: {0}")]
    Resume(DispatchStoreError),
    /// The node could not join its cluster (`[cluster]`).
    #[error("{0}")]
    Cluster(#[from] switchyard_cluster::JoinError),
    /// The operations listener could not bind.
    #[error("operations listener: {0}")]
    Ops(TransportError),
    /// A transport could not start.
    #[error("transport {name}: {source}")]
    Transport {
        /// The transport's name.
        name: String,
        /// Why.
        source: TransportError,
    },
}

/// Assembles a [`Gateway`]; see the module documentation.
pub struct GatewayBuilder {
    config: GatewayConfig,
    builtin: bool,
    transports: Vec<Box<dyn Transport>>,
    namespace_store: Option<Arc<dyn NamespaceStore>>,
}

impl std::fmt::Debug for GatewayBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayBuilder")
            .field("builtin", &self.builtin)
            .field(
                "transports",
                &self.transports.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl GatewayBuilder {
    /// Adds a transport, started after the built-in ones.
    pub fn transport(mut self, transport: impl Transport + 'static) -> Self {
        self.transports.push(Box::new(transport));
        self
    }

    /// Adds an already boxed transport.
    pub fn boxed_transport(mut self, transport: Box<dyn Transport>) -> Self {
        self.transports.push(transport);
        self
    }

    /// Whether to start the built-in transports the configuration enables (default true).
    /// Without them no producer API is served unless an added transport serves one.
    pub fn builtin_transports(mut self, on: bool) -> Self {
        self.builtin = on;
        self
    }

    /// Replaces the in-memory namespace store seeded from `namespaces.known`.
    pub fn namespace_store(mut self, store: Arc<dyn NamespaceStore>) -> Self {
        self.namespace_store = Some(store);
        self
    }

    /// Starts the core, the operations listener and every transport; returns once all of them
    /// listen. On any failure what was started is stopped again.
    pub async fn start(self) -> Result<Gateway, StartError> {
        let config = self.config;
        // Before core starts, so core's first metrics land in the recorder.
        ops::install_metrics_recorder();
        let data_dir = resolve_data_dir(&config.tls.data_dir);
        let tls = Arc::new(TlsMaterial::load(&config.tls, &data_dir)?);
        let principals = Arc::new(Principals::new(&config.principals));
        let store = self
            .namespace_store
            .unwrap_or_else(|| Arc::new(known_namespaces(&config.namespaces.known)));
        let registry = Registry::builder()
            .namespace_store(store)
            .namespace_policy(match config.namespaces.policy {
                NamespacePolicyName::Open => NamespacePolicy::Open,
                NamespacePolicyName::Closed => NamespacePolicy::Closed,
            })
            .max_concurrency_limit(config.registry.max_concurrency_limit)
            .max_namespaces(config.registry.max_namespaces)
            .namespace_idle_expiry(config.registry.namespace_idle_expiry.get());
        let (dispatch_store, shared_store) = crate::store::open(&config, &data_dir).await?;
        let store_path = (config.store.backend == StoreBackendName::Sqlite)
            .then(|| config.store.resolved_path(&data_dir));
        let core = Core::start(registry, core_config(&config));
        let durable = match DurableDispatcher::start(
            core.dispatcher().clone(),
            Arc::clone(&dispatch_store),
            crate::store::durable_config(&config.store),
        )
        .await
        {
            Ok(durable) => durable,
            Err(error) => {
                core.shutdown(Duration::ZERO).await;
                return Err(StartError::Resume(error));
            }
        };
        let backlog = ops::Backlog::default();
        let backlog_stop = CancellationToken::new();
        if let Some(shared) = shared_store {
            crate::store::take_over(shared, &durable, &config.cluster, backlog_stop.clone());
        }
        tokio::spawn(backlog.clone().refresh(
            durable.clone(),
            ops::BACKLOG_REFRESH,
            backlog_stop.clone(),
        ));
        let readiness = Readiness::default();
        let cluster = if config.cluster.enabled() {
            let settings = crate::config::cluster::cluster_config(
                &config.cluster,
                config.store.backend,
                Some(config.grpc.listen.to_string()),
                config.ops.enabled.then(|| config.ops.listen.to_string()),
            );
            match switchyard_cluster::Cluster::start(settings, core.dispatcher().clone()).await {
                Ok(cluster) => {
                    readiness.cluster(cluster.status().clone());
                    Some(cluster)
                }
                Err(error) => {
                    durable.shutdown();
                    backlog_stop.cancel();
                    core.shutdown(Duration::ZERO).await;
                    return Err(StartError::Cluster(error));
                }
            }
        } else {
            None
        };
        let stop_accepting = CancellationToken::new();
        let close = CancellationToken::new();
        let admin = cluster.as_ref().map(|cluster| cluster.admin().clone());
        let events = ops::EventFeed::default();
        if let Some(admin) = &admin {
            crate::ops::answer_cluster_views(admin, &core, &events, &durable, &principals, &close);
        }

        let mut transports: Vec<Box<dyn Transport>> = Vec::new();
        if self.builtin {
            transports.extend(builtin_transports(&config));
        }
        transports.extend(self.transports);
        for transport in &transports {
            readiness.expect(transport.name());
        }

        let ops_stop = CancellationToken::new();
        let mut ops_addr = None;
        let mut ops_task = None;
        ops::warn_if_remote(&config.ops);
        if config.ops.enabled {
            let listener = match ops::bind(config.ops.listen).await {
                Ok(listener) => listener,
                Err(error) => {
                    durable.shutdown();
                    backlog_stop.cancel();
                    core.shutdown(Duration::ZERO).await;
                    return Err(StartError::Ops(error));
                }
            };
            ops_addr = listener.local_addr().ok();
            ops_task = Some(tokio::spawn(ops::serve(
                listener,
                &config.ops,
                core.clone(),
                readiness.clone(),
                backlog,
                events,
                admin.clone(),
                ops_stop.clone(),
            )));
        }

        let context = TransportContext {
            core: core.clone(),
            durable: durable.clone(),
            principals: Arc::clone(&principals),
            tls: Arc::clone(&tls),
            stop_accepting: stop_accepting.clone(),
            close: close.clone(),
            cluster: admin,
        };
        let mut gateway = Gateway {
            core,
            durable,
            dispatch_store,
            store_path,
            backlog_stop,
            principals,
            tls,
            data_dir,
            readiness,
            listeners: Vec::new(),
            ops_addr,
            ops_task,
            ops_stop,
            stop_accepting,
            close,
            cluster,
            serving: JoinSet::new(),
            drain_timeout: config.shutdown.drain_timeout.get(),
        };
        for transport in transports {
            let name = transport.name().to_owned();
            match transport.start(context.clone()).await {
                Ok(listening) => {
                    for addr in &listening.addrs {
                        tracing::info!(transport = %name, protocol = %addr.protocol,
                            addr = %addr.addr, "listening");
                        gateway.listeners.push((name.clone(), *addr));
                    }
                    gateway.readiness.listening(&name);
                    let serving = listening.serving;
                    let task_name = name.clone();
                    gateway
                        .serving
                        .spawn(async move { (task_name, serving.await) });
                }
                Err(source) => {
                    gateway.shutdown().await;
                    return Err(StartError::Transport { name, source });
                }
            }
        }
        Ok(gateway)
    }
}

pub(crate) fn core_config(config: &GatewayConfig) -> CoreConfig {
    CoreConfig {
        dispatch: DispatchConfig {
            loss_budget: config.dispatch.loss_budget,
            loss_window: config.dispatch.loss_window.get(),
            max_timeout: config.dispatch.max_timeout.get(),
            max_input_bytes: crate::limits::max_input_bytes(config)
                .unwrap_or(switchyard_core::DEFAULT_MAX_INPUT_BYTES),
            max_parked_per_namespace: config.dispatch.max_parked_per_namespace,
            max_parked_per_principal: config.dispatch.max_parked_per_principal,
            max_held_input_bytes_per_namespace: config.dispatch.max_held_input_bytes_per_namespace,
            max_held_input_bytes_per_principal: config.dispatch.max_held_input_bytes_per_principal,
            cancel_ack_timeout: config.dispatch.cancel_ack_timeout.get(),
            max_unresponsive_tasks: config.dispatch.max_unresponsive_tasks,
        },
        liveness: LivenessConfig {
            ping_interval: config.liveness.ping_interval.get(),
            ping_timeout: config.liveness.ping_timeout.get(),
            probation_pings: config.liveness.probation_pings,
            miss_threshold: config.liveness.miss_threshold,
            heartbeat_window: config.liveness.heartbeat_window.get(),
        },
    }
}

fn known_namespaces(known: &[NamespaceSection]) -> InMemoryNamespaceStore {
    let nodes = |labels: &[String]| labels.iter().filter_map(|l| Node::new(l.clone())).collect();
    InMemoryNamespaceStore::with_records(known.iter().map(|ns| NamespaceRecord {
        name: ns.name.clone(),
        placement: if !ns.pinned.is_empty() {
            Placement::Pinned(nodes(&ns.pinned))
        } else if !ns.prefer.is_empty() {
            Placement::Prefer(nodes(&ns.prefer))
        } else {
            Placement::Unplaced
        },
    }))
}

pub(crate) fn api_settings(config: &GatewayConfig) -> ApiConfig {
    ApiConfig {
        default_timeout: config.dispatch.default_timeout.get(),
        max_in_flight_per_stream: config.dispatch.max_in_flight_per_stream,
        max_stream_outstanding: config.dispatch.max_stream_outstanding,
        slow_consumer_timeout: config.dispatch.slow_consumer_timeout.get(),
    }
}

fn builtin_transports(config: &GatewayConfig) -> Vec<Box<dyn Transport>> {
    let mut transports: Vec<Box<dyn Transport>> = vec![Box::new(
        GrpcTransport::new(config.grpc.clone(), api_settings(config))
            .with_durability(DurabilityDefaults::from_config(config)),
    )];
    if config.quic.enabled {
        transports.push(Box::new(QuicTransport::new(config.quic.clone())));
    }
    transports
}

/// A running gateway; see the module documentation.
pub struct Gateway {
    core: Core,
    durable: DurableDispatcher,
    dispatch_store: Arc<dyn DispatchStore>,
    store_path: Option<PathBuf>,
    backlog_stop: CancellationToken,
    principals: Arc<Principals>,
    tls: Arc<TlsMaterial>,
    data_dir: PathBuf,
    readiness: Readiness,
    listeners: Vec<(String, ListenAddr)>,
    ops_addr: Option<SocketAddr>,
    ops_task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    ops_stop: CancellationToken,
    stop_accepting: CancellationToken,
    close: CancellationToken,
    /// This node's cluster membership, in cluster mode.
    cluster: Option<switchyard_cluster::Cluster>,
    serving: JoinSet<(String, Result<(), TransportError>)>,
    drain_timeout: Duration,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("listeners", &self.listeners)
            .field("ops_addr", &self.ops_addr)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Starts assembling a gateway from `config`.
    pub fn builder(config: GatewayConfig) -> GatewayBuilder {
        GatewayBuilder {
            config,
            builtin: true,
            transports: Vec::new(),
            namespace_store: None,
        }
    }

    /// The process-wide core every transport shares.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The durable dispatcher, over the core's dispatcher and the dispatch store.
    pub fn durable(&self) -> &DurableDispatcher {
        &self.durable
    }

    /// The dispatch store's file; `None` with `store.backend = "memory"`.
    pub fn store_path(&self) -> Option<&std::path::Path> {
        self.store_path.as_deref()
    }

    /// The principal table.
    pub fn principals(&self) -> &Principals {
        &self.principals
    }

    /// The TLS material in use.
    pub fn tls(&self) -> &TlsMaterial {
        &self.tls
    }

    /// The data directory (development TLS material lives under it).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// Readiness as `/readyz` reports it.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// Every bound address, by transport name.
    pub fn listeners(&self) -> &[(String, ListenAddr)] {
        &self.listeners
    }

    /// The first address `transport` listens on.
    pub fn addr(&self, transport: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(name, _)| name == transport)
            .map(|(_, listen)| listen.addr)
    }

    /// The operations listener's address, when enabled.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops_addr
    }

    /// Serves until `signal` resolves or a transport stops on its own, then shuts down.
    /// Returns the error of a transport that stopped on its own, if one did.
    pub async fn run_until(mut self, signal: impl Future<Output = ()>) -> Result<(), StartError> {
        let failed = tokio::select! {
            () = signal => None,
            Some(joined) = self.serving.join_next() => Some(joined),
        };
        let failure = match failed {
            Some(Ok((name, Err(source)))) => {
                tracing::error!(transport = %name, error = %source, "transport failed");
                Some(StartError::Transport { name, source })
            }
            Some(Ok((name, Ok(())))) => {
                tracing::error!(transport = %name, "transport stopped on its own");
                None
            }
            Some(Err(join)) => {
                tracing::error!(error = %join, "transport task ended abnormally");
                None
            }
            None => None,
        };
        self.shutdown().await;
        failure.map_or(Ok(()), Err)
    }

    /// Graceful shutdown: not ready, take no new worker, tell every worker the gateway is
    /// stopping and wait up to the drain timeout for tasks in flight (the producer API keeps
    /// answering, new dispatches end `ShuttingDown`), end what remains `ShuttingDown`, then
    /// close the transports and the operations listener.
    pub async fn shutdown(mut self) {
        tracing::info!(
            drain_timeout_ms = self.drain_timeout.as_millis() as u64,
            "shutting down"
        );
        self.readiness.shutting_down();
        self.stop_accepting.cancel();
        // Before core's shutdown: a durable dispatch core ends `ShuttingDown` is then left
        // unfinished in the store (it resumes at the next start) instead of recorded.
        self.durable.shutdown();
        self.core.shutdown(self.drain_timeout).await;
        if tokio::time::timeout(STOP_GRACE, self.durable.drivers_ended())
            .await
            .is_err()
        {
            tracing::warn!("durable dispatch drivers did not end within the grace");
        }
        // After core's shutdown, so the outcomes of dispatches taken from other nodes went out.
        if let Some(cluster) = self.cluster.take() {
            cluster.shutdown().await;
        }
        self.backlog_stop.cancel();
        self.close.cancel();
        let stopped = tokio::time::timeout(STOP_GRACE, async {
            while let Some(joined) = self.serving.join_next().await {
                if let Ok((name, Err(error))) = joined {
                    tracing::warn!(transport = %name, %error, "transport ended with an error");
                }
            }
        })
        .await;
        if stopped.is_err() {
            tracing::warn!("transports did not stop within the grace; abandoning them");
            self.serving.abort_all();
        }
        self.ops_stop.cancel();
        if let Some(task) = self.ops_task.take() {
            let _ = tokio::time::timeout(STOP_GRACE, task).await;
        }
        release_store(self.dispatch_store, self.durable).await;
        tracing::info!("gateway stopped");
    }
}

/// How often shutdown looks whether the last user of the dispatch store has let go.
const RELEASE_POLL: Duration = Duration::from_millis(10);

/// Drops the gateway's hold on the dispatch store and waits, up to [`STOP_GRACE`], until no
/// one else holds it either (connections the transports abandon may hold the producer API a
/// moment longer), so that the store's file lock is free when `shutdown` returns and a gateway
/// started next on the same file opens it.
async fn release_store(store: Arc<dyn DispatchStore>, durable: DurableDispatcher) {
    drop(durable);
    let released = tokio::time::timeout(STOP_GRACE, async {
        // The store has no close signal to wait on; its holders are tasks ending on their own.
        while Arc::strong_count(&store) > 1 {
            tokio::time::sleep(RELEASE_POLL).await;
        }
    })
    .await;
    if released.is_err() {
        tracing::warn!(
            "the dispatch store is still held after the grace; it closes with the \
            process"
        );
    }
}
