//! The dispatch store `[store]` names, opened at start, and the durable dispatcher's settings.

use std::path::Path;
use std::sync::Arc;

use switchyard_cluster::{JetStreamLimits, JetStreamStore};
use switchyard_core::{
    DispatchStore, DurableConfig, DurableDispatcher, MemoryDispatchStore, MemoryStoreLimits,
};
use switchyard_store_sqlite::{OpenError, SqliteOptions, SqliteStore};
use tokio_util::sync::CancellationToken;

use crate::config::{ClusterSection, GatewayConfig, StoreBackendName, StoreSection};

mod refusal;

use refusal::RefusingNewDispatches;

/// Opens the store `config.store` names, and returns the jetstream store again when it is
/// that one (its takeover loop needs it); the SQLite file defaults to `dispatches.sqlite3` in
/// `data_dir` (the store creates its directory when missing). In cluster mode without the
/// shared store the node's own store takes no new durable dispatch
/// ([`durable_refusal`](crate::config::cluster::durable_refusal)): what it holds still runs.
pub(crate) async fn open(
    config: &GatewayConfig,
    data_dir: &Path,
) -> Result<(Arc<dyn DispatchStore>, Option<Arc<JetStreamStore>>), OpenError> {
    if config.store.backend == StoreBackendName::Jetstream {
        let settings = crate::config::cluster::cluster_config(
            &config.cluster,
            config.store.backend,
            None,
            None,
        );
        let limits = JetStreamLimits {
            max_bytes: config.store.max_bytes,
            max_queued_per_namespace: config.store.max_queued_per_namespace,
        };
        tracing::info!(nats_url = %settings.nats_url, cluster = %settings.name,
            "opening the jetstream dispatch store");
        let store = JetStreamStore::open(&settings, limits)
            .await
            .map(Arc::new)
            .map_err(|error| OpenError::Failed {
                path: format!("jetstream (cluster {})", settings.name),
                detail: error.to_string(),
            })?;
        return Ok((Arc::clone(&store) as Arc<dyn DispatchStore>, Some(store)));
    }
    let store = open_backend(&config.store, data_dir).await?;
    Ok(match crate::config::cluster::durable_refusal(config) {
        Some(refusal) => {
            tracing::warn!(setting = refusal.setting, reason = %refusal.reason,
                "durable dispatches are refused on this node");
            (
                Arc::new(RefusingNewDispatches::new(store, refusal.store_error())),
                None,
            )
        }
        None => (store, None),
    })
}

/// Starts taking over the durable dispatches of nodes lost from the cluster, checking every
/// `cluster.member_ttl`, until `stop`: `durable` drives each one this node wins.
pub(crate) fn take_over(
    store: Arc<JetStreamStore>,
    durable: &DurableDispatcher,
    cluster: &ClusterSection,
    stop: CancellationToken,
) {
    let durable = durable.clone();
    let every = cluster.member_ttl.get();
    tokio::spawn(async move {
        store
            .take_over_lost_nodes(every, move |rows| durable.adopt(rows), stop)
            .await;
    });
}

async fn open_backend(
    section: &StoreSection,
    data_dir: &Path,
) -> Result<Arc<dyn DispatchStore>, OpenError> {
    match section.backend {
        StoreBackendName::Memory => Ok(Arc::new(MemoryDispatchStore::new(MemoryStoreLimits {
            max_queued_per_namespace: section.max_queued_per_namespace,
            max_bytes: section.max_bytes,
        }))),
        // Opened by `open`; validation refuses it outside cluster mode.
        StoreBackendName::Jetstream => Err(OpenError::Failed {
            path: "store.backend".to_owned(),
            detail: "jetstream needs cluster mode (cluster.nats_url)".to_owned(),
        }),
        StoreBackendName::Sqlite => {
            let path = section.resolved_path(data_dir);
            let options = sqlite_options(section);
            tracing::info!(path = %path.display(), synchronous = options.synchronous.label(),
                "opening the dispatch store");
            let opened = tokio::task::spawn_blocking(move || SqliteStore::open(&path, options))
                .await
                .map_err(|join| OpenError::Failed {
                    path: section.resolved_path(data_dir).display().to_string(),
                    detail: format!("the opening task failed: {join}"),
                })??;
            Ok(Arc::new(opened))
        }
    }
}

/// The SQLite store's options for `section`; group commit keeps the library's defaults.
pub(crate) fn sqlite_options(section: &StoreSection) -> SqliteOptions {
    SqliteOptions {
        synchronous: section.synchronous.library(),
        max_queued_per_namespace: section.max_queued_per_namespace,
        max_bytes: section.max_bytes,
        ..SqliteOptions::default()
    }
}

/// The durable dispatcher's settings for `section`.
pub(crate) fn durable_config(section: &StoreSection) -> DurableConfig {
    DurableConfig {
        outcome_retention: section.outcome_retention.get(),
        ..DurableConfig::default()
    }
}
