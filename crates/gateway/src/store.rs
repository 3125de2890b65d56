//! The dispatch store `[store]` names, opened at start, and the durable dispatcher's settings.

use std::path::Path;
use std::sync::Arc;

use switchyard_core::{DispatchStore, DurableConfig, MemoryDispatchStore, MemoryStoreLimits};
use switchyard_store_sqlite::{OpenError, SqliteOptions, SqliteStore};

use crate::config::{GatewayConfig, StoreBackendName, StoreSection};

mod refusal;

use refusal::RefusingNewDispatches;

/// Opens the store `config.store` names; the SQLite file defaults to `dispatches.sqlite3` in
/// `data_dir` (the store creates its directory when missing). In cluster mode without a
/// shared store the node's own store takes no new durable dispatch
/// ([`durable_refusal`](crate::config::cluster::durable_refusal)): what it holds still runs.
pub(crate) async fn open(
    config: &GatewayConfig,
    data_dir: &Path,
) -> Result<Arc<dyn DispatchStore>, OpenError> {
    let store = open_backend(&config.store, data_dir).await?;
    Ok(match crate::config::cluster::durable_refusal(config) {
        Some(refusal) => {
            tracing::warn!(setting = refusal.setting, reason = %refusal.reason,
                "durable dispatches are refused on this node");
            Arc::new(RefusingNewDispatches::new(store, refusal.store_error()))
        }
        None => store,
    })
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
        StoreBackendName::Jetstream => Err(OpenError::Failed {
            path: "store.backend".to_owned(),
            detail: "the jetstream store is not built yet".to_owned(),
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
