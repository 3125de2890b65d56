//! `[cluster]`: joining other gateway nodes over NATS.

use serde::{Deserialize, Serialize};

use super::duration::ConfigDuration;
use super::error::ConfigError;
use super::{GatewayConfig, StoreBackendName};

/// `[cluster]`: run as one node of a cluster of gateways sharing a NATS server. Off while
/// `nats_url` is empty: NATS is then never contacted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// NATS server URL(s), comma-separated (`nats://127.0.0.1:4222`); empty turns cluster
    /// mode off.
    pub nats_url: String,
    /// The cluster's name; nodes with the same name and NATS server form one cluster.
    pub name: String,
    /// This node's name, unique among the cluster's live nodes; empty means the host name.
    pub node: String,
    /// NATS `.creds` file (user JWT and seed); empty for none.
    pub credentials_file: String,
    /// PEM CA bundle to verify the NATS server with (turns TLS to NATS on); empty for none.
    pub tls_ca: String,
    /// PEM client certificate to present to NATS; set with `tls_key` or not at all.
    pub tls_cert: String,
    /// PEM private key of `tls_cert`.
    pub tls_key: String,
    /// How long a node's membership entry lives without a refresh: a node silent for this
    /// long counts as gone and its forwarded dispatches are offered again.
    pub member_ttl: ConfigDuration,
    /// How often a node refreshes its membership entry; less than `member_ttl`.
    pub refresh_every: ConfigDuration,
    /// How long a pool stays full before the node drops its offer subscription for it; an
    /// offer the node must turn away while its last slot scan also found the pool full drops
    /// it at once.
    pub offer_hold: ConfigDuration,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            nats_url: String::new(),
            name: "switchyard".to_owned(),
            node: String::new(),
            credentials_file: String::new(),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            member_ttl: ConfigDuration::secs(10),
            refresh_every: ConfigDuration::secs(3),
            offer_hold: ConfigDuration(switchyard_cluster::DEFAULT_OFFER_HOLD),
        }
    }
}

impl ClusterSection {
    /// True when cluster mode is on (`nats_url` set).
    pub fn enabled(&self) -> bool {
        !self.nats_url.is_empty()
    }

    /// The node name: `node`, or the host name when empty.
    pub fn node_name(&self) -> String {
        if self.node.is_empty() {
            switchyard_cluster::default_node_name()
        } else {
            self.node.clone()
        }
    }
}

/// Checks `[cluster]` when it is on: names usable as subject tokens, the client certificate
/// and key together, a refresh well within the TTL.
pub(super) fn validate(section: &ClusterSection) -> Result<(), ConfigError> {
    if !section.enabled() {
        return Ok(());
    }
    switchyard_cluster::check_name(&section.name)
        .map_err(|problem| ConfigError::invalid("cluster.name", problem))?;
    if !section.node.is_empty() {
        switchyard_cluster::check_name(&section.node)
            .map_err(|problem| ConfigError::invalid("cluster.node", problem))?;
    }
    if section.tls_cert.is_empty() != section.tls_key.is_empty() {
        return Err(ConfigError::invalid(
            "cluster.tls_cert",
            "set tls_cert and tls_key together or neither".to_owned(),
        ));
    }
    if section.member_ttl.get().is_zero() {
        return Err(ConfigError::invalid(
            "cluster.member_ttl",
            "must be longer than 0s".to_owned(),
        ));
    }
    if section.refresh_every.get().is_zero()
        || section.refresh_every.get() >= section.member_ttl.get()
    {
        return Err(ConfigError::invalid(
            "cluster.refresh_every",
            format!(
                "must be above zero and below cluster.member_ttl ({}s)",
                section.member_ttl.get().as_secs_f64()
            ),
        ));
    }
    Ok(())
}

/// The setting that lets a cluster node take durable dispatches.
pub(crate) const DURABLE_STORE_SETTING: &str = "store.backend = \"jetstream\"";

/// Why this node takes no new durable dispatch, if it does not: in cluster mode a durable
/// dispatch needs a store every node reads, or it would be lost with the node that accepted
/// it (and no other node could finish it).
pub(crate) fn durable_refusal(config: &GatewayConfig) -> Option<DispatchStoreRefusal> {
    if !config.cluster.enabled() || config.store.backend == StoreBackendName::Jetstream {
        return None;
    }
    Some(DispatchStoreRefusal {
        setting: DURABLE_STORE_SETTING,
        reason: format!(
            "in cluster mode (cluster.nats_url set) the store.backend {:?} keeps a durable \
             dispatch on the node that accepted it alone",
            config.store.backend.label()
        ),
    })
}

/// A configuration's refusal of durable dispatches: the setting that would allow them, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DispatchStoreRefusal {
    /// `key = value`.
    pub(crate) setting: &'static str,
    /// Why this configuration refuses them.
    pub(crate) reason: String,
}

impl DispatchStoreRefusal {
    /// The store error a refused `record` answers.
    pub(crate) fn store_error(&self) -> switchyard_core::DispatchStoreError {
        switchyard_core::DispatchStoreError::Refused {
            setting: self.setting.to_owned(),
            reason: self.reason.clone(),
        }
    }
}

/// Refuses `store.backend = "jetstream"` outside cluster mode, and a node whose dispatches are
/// durable by default while it takes no durable dispatch ([`durable_refusal`]): every default
/// dispatch would be refused.
pub(super) fn validate_durability(config: &GatewayConfig) -> Result<(), ConfigError> {
    if config.store.backend == StoreBackendName::Jetstream && !config.cluster.enabled() {
        return Err(ConfigError::invalid(
            "store.backend",
            "is \"jetstream\", which needs cluster mode (cluster.nats_url); use \"sqlite\" on a \
             single node"
                .to_owned(),
        ));
    }
    let Some(refusal) = durable_refusal(config) else {
        return Ok(());
    };
    let durable_by_default = if config.dispatch.durability.is_durable() {
        Some("dispatch.durability".to_owned())
    } else {
        config
            .namespaces
            .known
            .iter()
            .find(|ns| ns.durability.is_some_and(|d| d.is_durable()))
            .map(|ns| format!("the durability of namespace {:?}", ns.name))
    };
    match durable_by_default {
        None => Ok(()),
        Some(what) => Err(ConfigError::invalid(
            "store.backend",
            format!(
                "{what} is \"durable\" but {}; set {} (or make it \"ephemeral\")",
                refusal.reason, refusal.setting
            ),
        )),
    }
}

/// The cluster library's configuration for this section; `grpc_addr` and `ops_addr` are what
/// other nodes are shown, and durable dispatches are forwarded with the `store` backend
/// `jetstream`.
pub(crate) fn cluster_config(
    section: &ClusterSection,
    store: StoreBackendName,
    grpc_addr: Option<String>,
    ops_addr: Option<String>,
) -> switchyard_cluster::ClusterConfig {
    let path = |p: &str| (!p.is_empty()).then(|| std::path::PathBuf::from(p));
    let mut config = switchyard_cluster::ClusterConfig::new(
        &section.nats_url,
        &section.name,
        section.node_name(),
    );
    config.credentials_file = path(&section.credentials_file);
    config.tls_ca_file = path(&section.tls_ca);
    config.tls_client = path(&section.tls_cert).zip(path(&section.tls_key));
    config.member_ttl = section.member_ttl.get();
    config.refresh_every = section.refresh_every.get();
    config.offer_hold = section.offer_hold.get();
    config.grpc_addr = grpc_addr;
    config.ops_addr = ops_addr;
    config.forwards_durable = store == StoreBackendName::Jetstream;
    config
}
