//! [`Cluster`]: joining, the cluster's background tasks, and leaving.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::{ConnectOptions, Event};
use switchyard_core::Dispatcher;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::config::ClusterConfig;
use crate::error::JoinError;
use crate::forward::{self, ClusterOverflow, Forwarder};
use crate::members::{Members, NodeInfo};
use crate::membership::{self, ClaimError};
use crate::names::{Names, check_name};
use crate::numbers;
use crate::status::{ClusterStatus, Standing};
use crate::taker::{self, Taker};

/// How long start waits for NATS before it goes on degraded (and joins later by itself).
const START_WAIT: Duration = Duration::from_secs(5);

/// A node's membership in its cluster; [`Cluster::shutdown`] leaves it.
pub struct Cluster {
    status: ClusterStatus,
    admin: Admin,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("status", &self.status.describe())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connects to NATS, claims the node name and starts forwarding and taking dispatches
    /// for `dispatcher`.
    ///
    /// Refused when a name breaks the subject rules or another live node holds the node name.
    /// NATS unreachable is not a refusal: the node starts degraded (serving its own workers)
    /// and joins once NATS answers.
    pub async fn start(config: ClusterConfig, dispatcher: Dispatcher) -> Result<Self, JoinError> {
        for (field, value) in [("name", &config.name), ("node", &config.node)] {
            check_name(value).map_err(|problem| JoinError::InvalidName { field, problem })?;
        }
        let status = ClusterStatus::new(&config.node);
        let client = options(&config, status.clone())
            .await?
            .connect(servers(&config.nats_url))
            .await
            .map_err(|error| {
                JoinError::Options(format!("nats_url {}: {error}", config.nats_url))
            })?;
        let js = async_nats::jetstream::new(client.clone());
        let names = Names::new(&config.name);
        let me = NodeInfo {
            node: config.node.clone(),
            instance: rand_instance(),
            grpc_addr: config.grpc_addr.clone(),
            ops_addr: config.ops_addr.clone(),
            started_unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
        };
        let bucket = names.members_bucket();
        let numbers_bucket = names.numbers_bucket();
        let holder = numbers::Holder {
            node: me.node.clone(),
            instance: me.instance,
        };
        let registry = dispatcher.registry().clone();
        let mut number = None;
        let revision = match tokio::time::timeout(START_WAIT, async {
            let kv = membership::bucket(&js, &bucket, config.member_ttl)
                .await
                .map_err(ClaimError::Nats)?;
            let revision = membership::claim(&kv, &me).await?;
            let numbers = membership::bucket(&js, &numbers_bucket, config.member_ttl)
                .await
                .map_err(ClaimError::Nats)?;
            let held = numbers::claim(&numbers, &holder, registry.node_number()).await?;
            numbers::apply(&registry, held, &me.node);
            number = Some(held);
            Ok(revision)
        })
        .await
        {
            Ok(Ok(revision)) => {
                status.set(Standing::Joined);
                Some(revision)
            }
            Ok(Err(ClaimError::Taken(holder))) => {
                return Err(JoinError::NodeNameTaken {
                    cluster: config.name.clone(),
                    node: config.node.clone(),
                    holder,
                });
            }
            Ok(Err(ClaimError::Nats(reason))) => {
                status.set(Standing::Degraded(reason));
                None
            }
            Err(_) => {
                status.set(Standing::Degraded(format!(
                    "NATS at {} did not answer within {}s",
                    config.nats_url,
                    START_WAIT.as_secs()
                )));
                None
            }
        };
        let stop = CancellationToken::new();
        let members = Arc::new(Mutex::new(Members::default()));
        let forwarder = Forwarder::new(
            client.clone(),
            names.clone(),
            config.node.clone(),
            status.clone(),
            Arc::clone(&members),
            config.member_ttl,
        );
        let admin = Admin::new(
            client.clone(),
            names.clone(),
            config.node.clone(),
            Arc::clone(&members),
            config.member_ttl,
            status.clone(),
        );
        let taker = Taker::new(
            client.clone(),
            names,
            &config,
            dispatcher.clone(),
            status.clone(),
            Arc::clone(&members),
        );
        let mut tasks = JoinSet::new();
        let shared_bucket = membership::Bucket {
            js,
            name: bucket,
            ttl: config.member_ttl,
        };
        tasks.spawn(membership::hold(
            shared_bucket.clone(),
            me,
            status.clone(),
            config.refresh_every,
            stop.clone(),
            revision,
        ));
        tasks.spawn(numbers::hold(
            membership::Bucket {
                js: shared_bucket.js.clone(),
                name: numbers_bucket,
                ttl: config.member_ttl,
            },
            holder,
            registry,
            config.refresh_every,
            stop.clone(),
            number,
        ));
        let joined = Arc::clone(&forwarder);
        tasks.spawn(membership::watch(
            shared_bucket,
            members,
            move || joined.node_joined(),
            stop.clone(),
        ));
        tasks.spawn(forward::follow_outcomes(
            Arc::clone(&forwarder),
            stop.clone(),
        ));
        tasks.spawn(forward::follow_capacity(
            Arc::clone(&forwarder),
            stop.clone(),
        ));
        tasks.spawn(taker::follow_slots(Arc::clone(&taker), stop.clone()));
        tasks.spawn(taker::follow_cancels(taker, stop.clone()));
        tasks.spawn(admin.clone().follow(stop.clone()));
        if !dispatcher.set_overflow(Arc::new(ClusterOverflow(
            forwarder,
            config.forwards_durable,
        ))) {
            tracing::warn!("cluster: the dispatcher already has an overflow; not forwarding");
        }
        Ok(Self {
            status,
            admin,
            stop,
            tasks,
        })
    }

    /// The node's standing, for readiness.
    pub fn status(&self) -> &ClusterStatus {
        &self.status
    }

    /// Cluster-wide views and drains: asking the other nodes, answering them.
    pub fn admin(&self) -> &Admin {
        &self.admin
    }

    /// Leaves the cluster: stops taking offers and deletes the node's membership entry.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
    }
}

/// The NATS connection options: retry the first connect in the background (a node starts
/// without NATS), and report connection changes on `status`.
pub(crate) async fn options(
    config: &ClusterConfig,
    status: ClusterStatus,
) -> Result<ConnectOptions, JoinError> {
    let mut options = ConnectOptions::new()
        .name(format!("switchyard {}/{}", config.name, config.node))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(100u64.saturating_mul(1 << attempts.min(4)))
        })
        .event_callback(move |event| {
            let status = status.clone();
            async move {
                match event {
                    Event::Connected => status.connected(Instant::now()),
                    Event::Disconnected => status.disconnected("NATS connection lost"),
                    Event::Closed => status.disconnected("NATS connection closed"),
                    _ => {}
                }
            }
        });
    if let Some(path) = &config.credentials_file {
        options = options.credentials_file(path).await.map_err(|error| {
            JoinError::Options(format!("credentials_file {}: {error}", path.display()))
        })?;
    }
    if let Some(ca) = &config.tls_ca_file {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &config.tls_client {
        options = options
            .add_client_certificate(cert.clone(), key.clone())
            .require_tls(true);
    }
    Ok(options)
}

/// The servers `nats_url` lists, comma-separated (async-nats reads a string as one URL).
pub(crate) fn servers(nats_url: &str) -> Vec<&str> {
    nats_url
        .split(',')
        .map(str::trim)
        .filter(|server| !server.is_empty())
        .collect()
}

/// A random process instance number (tells two processes with one node name apart).
fn rand_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |age| age.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nats_url_lists_its_servers_comma_separated() {
        assert_eq!(
            servers("nats://a:4222, nats://b:4222,,"),
            ["nats://a:4222", "nats://b:4222"]
        );
        assert_eq!(servers("nats://a:4222"), ["nats://a:4222"]);
    }

    #[tokio::test]
    async fn a_credentials_file_that_cannot_be_read_is_refused_naming_it() {
        let missing = std::env::temp_dir().join(format!(
            "switchyard-test-{}-missing.creds",
            std::process::id()
        ));
        let mut config = ClusterConfig::new("nats://127.0.0.1:4222", "c", "a");
        // Control: without credentials the options build.
        assert!(options(&config, ClusterStatus::new("a")).await.is_ok());
        config.credentials_file = Some(missing.clone());
        let refused = options(&config, ClusterStatus::new("a")).await.err();
        let text = refused.map(|error| error.to_string()).unwrap_or_default();
        assert!(
            text.contains("credentials_file") && text.contains(&missing.display().to_string()),
            "{text}"
        );
    }
}
