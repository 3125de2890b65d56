//! [`ClusterConfig`]: how a node reaches NATS and what it calls itself.

use std::path::PathBuf;
use std::time::Duration;

/// A node's cluster configuration (the gateway builds it from `[cluster]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// NATS server URL(s), comma-separated (`nats://127.0.0.1:4222`).
    pub nats_url: String,
    /// The cluster's name: nodes with the same name form one cluster (part of every subject
    /// and bucket name).
    pub name: String,
    /// This node's name, unique among the cluster's live nodes.
    pub node: String,
    /// A NATS `.creds` file (user JWT and seed), if the server wants one.
    pub credentials_file: Option<PathBuf>,
    /// CA bundle to verify the NATS server with (turns TLS on).
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key to present to the NATS server.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// How long a membership entry lives without a refresh.
    pub member_ttl: Duration,
    /// How often a node refreshes its membership entry.
    pub refresh_every: Duration,
    /// How long a pool stays full before this node drops its offer subscription for it
    /// (hysteresis against subscribing and unsubscribing many times a second); an offer the
    /// node must turn away while its last slot scan also found the pool full drops it at once.
    pub offer_hold: Duration,
    /// The gRPC address producers and workers reach this node on (shown to other nodes).
    pub grpc_addr: Option<String>,
    /// The operations address of this node (shown to other nodes).
    pub ops_addr: Option<String>,
    /// Offer durable dispatches to other nodes too: true only when every node reads the same
    /// dispatch store ([`JetStreamStore`](crate::JetStreamStore)).
    pub forwards_durable: bool,
}

/// The default [`ClusterConfig::offer_hold`].
pub const DEFAULT_OFFER_HOLD: Duration = Duration::from_millis(500);

impl ClusterConfig {
    /// A configuration with the default timings and no TLS or credentials.
    pub fn new(
        nats_url: impl Into<String>,
        name: impl Into<String>,
        node: impl Into<String>,
    ) -> Self {
        Self {
            nats_url: nats_url.into(),
            name: name.into(),
            node: node.into(),
            credentials_file: None,
            tls_ca_file: None,
            tls_client: None,
            member_ttl: Duration::from_secs(10),
            refresh_every: Duration::from_secs(3),
            offer_hold: DEFAULT_OFFER_HOLD,
            grpc_addr: None,
            ops_addr: None,
            forwards_durable: false,
        }
    }
}

/// The host name, as the default node name (`node` when it cannot be read).
pub fn default_node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| {
            name.trim()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}
