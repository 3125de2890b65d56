//! The node's worker-id number: one no other live node of the cluster holds, so the worker ids
//! the node mints (`(number << 40) | counter`, [`switchyard_core::NodeNumber`]) are unique
//! across the cluster, not merely likely to be.
//!
//! Bucket `switchyard_<cluster>_numbers`: key the number in decimal, value the holder's node
//! name and instance. A node takes the lowest number not below the one it holds now with a
//! **create** (create-if-absent: of two nodes racing for a number, one gets it), refreshes it
//! with `update` at its membership pace, and deletes it on a clean stop. The entries age out
//! with the membership TTL (`max_age`), so a killed node's number is free again once the
//! cluster holds the node dead anyway. A node never goes back to a lower number, so its ids
//! keep rising in admission order.

use std::time::Duration;

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use switchyard_core::{MAX_NODE_NUMBER, NodeNumber, Registry};
use tokio_util::sync::CancellationToken;

use crate::membership::{Bucket, ClaimError};

/// How long to wait before retrying NATS after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// Who holds a number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// The holder's node name.
    pub(crate) node: String,
    /// The holder's process instance ([`crate::NodeInfo::instance`]).
    pub(crate) instance: u64,
}

/// A number held, with the revision of its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) number: NodeNumber,
    pub(crate) revision: u64,
}

/// The numbers to try, in order, for a node holding `current` now: never below it, never 0.
fn candidates(current: NodeNumber) -> impl Iterator<Item = NodeNumber> {
    (current.get().max(1)..=MAX_NODE_NUMBER).filter_map(NodeNumber::new)
}

/// Claims the lowest free number not below `current` (keeping `current` when this process
/// still holds it).
pub(crate) async fn claim(
    store: &kv::Store,
    me: &Holder,
    current: NodeNumber,
) -> Result<Held, ClaimError> {
    let body: bytes::Bytes = serde_json::to_vec(me).unwrap_or_default().into();
    for number in candidates(current) {
        let key = number.to_string();
        match store.create(&key, body.clone()).await {
            Ok(revision) => return Ok(Held { number, revision }),
            Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(error) => return Err(ClaimError::Nats(error.to_string())),
        }
        let entry = store
            .entry(key.clone())
            .await
            .map_err(|error| ClaimError::Nats(error.to_string()))?;
        let holder = entry
            .as_ref()
            .filter(|entry| entry.operation == kv::Operation::Put)
            .and_then(|entry| serde_json::from_slice::<Holder>(&entry.value).ok());
        if let (Some(entry), Some(holder)) = (entry, holder)
            && holder.instance == me.instance
        {
            let revision = store
                .update(&key, body.clone(), entry.revision)
                .await
                .map_err(|error| ClaimError::Nats(error.to_string()))?;
            return Ok(Held { number, revision });
        }
        // Held by another process (or aged out a moment ago: the next number will do).
    }
    Err(ClaimError::Nats(format!(
        "every worker-id number from {} to {MAX_NODE_NUMBER} is held",
        current.get().max(1)
    )))
}

/// Mints `registry`'s worker ids under `held` from now on.
pub(crate) fn apply(registry: &Registry, held: Held, node: &str) {
    let before = registry.node_number();
    if registry.set_node_number(held.number) && before != held.number {
        tracing::info!(node, number = %held.number, "cluster: worker ids minted under this number");
    }
}

/// Keeps the node's number until `stop`, refreshing it every `every` and claiming one again
/// after a failure (a higher one when another node took it meanwhile); deletes it on a clean
/// stop.
pub(crate) async fn hold(
    bucket: Bucket,
    me: Holder,
    registry: Registry,
    every: Duration,
    stop: CancellationToken,
    mut held: Option<Held>,
) {
    let body: bytes::Bytes = serde_json::to_vec(&me).unwrap_or_default().into();
    let mut store: Option<kv::Store> = None;
    loop {
        let pause = if held.is_some() { every } else { RETRY };
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
        let kv = match &store {
            Some(kv) => kv.clone(),
            None => match bucket.open().await {
                Ok(kv) => store.insert(kv).clone(),
                Err(_) => continue,
            },
        };
        if let Some(last) = held
            && let Ok(revision) = kv
                .update(last.number.to_string(), body.clone(), last.revision)
                .await
        {
            held = Some(Held { revision, ..last });
            continue;
        }
        held = match claim(&kv, &me, registry.node_number()).await {
            Ok(next) => {
                apply(&registry, next, &me.node);
                Some(next)
            }
            Err(ClaimError::Nats(reason) | ClaimError::Taken(reason)) => {
                tracing::warn!(node = %me.node, %reason, "cluster: no worker-id number held");
                None
            }
        };
    }
    if let (Some(held), Some(kv)) = (held, store) {
        let _ = kv.delete(held.number.to_string()).await;
    }
}

#[cfg(test)]
mod tests {
    use switchyard_test_support::NatsServer;

    use super::*;
    use crate::membership::test_bucket;

    fn number(raw: u16) -> NodeNumber {
        NodeNumber::new(raw).unwrap_or(NodeNumber::NONE)
    }

    #[test]
    fn a_node_tries_numbers_from_its_own_upwards_never_zero() {
        let fresh: Vec<u16> = candidates(NodeNumber::NONE)
            .take(3)
            .map(NodeNumber::get)
            .collect();
        assert_eq!(
            fresh,
            vec![1, 2, 3],
            "0 is the number of ids outside a cluster"
        );
        let holding: Vec<u16> = candidates(number(5)).take(2).map(NodeNumber::get).collect();
        assert_eq!(
            holding,
            vec![5, 6],
            "its own number first, then only higher ones"
        );
        assert_eq!(
            candidates(number(MAX_NODE_NUMBER)).count(),
            1,
            "the last number is the last try"
        );
    }

    /// `docs/cluster.md`, `switchyard_<cluster>_numbers`: a clean stop deletes the node's
    /// number once its first refresh has run; a node stopped before that leaves it to age out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clean_stop_deletes_the_number_once_the_first_refresh_has_run() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        let (bucket, store) = test_bucket::open(&nats.url(), "switchyard_stop_numbers").await;
        for (instance, refreshed) in [(1, true), (2, false)] {
            let me = Holder {
                node: format!("node-{instance}"),
                instance,
            };
            let registry = Registry::builder().build();
            let first = claim(&store, &me, NodeNumber::NONE).await.unwrap();
            apply(&registry, first, &me.node);
            let key = first.number.to_string();
            // The early node's first refresh would come only after a minute.
            let every = if refreshed {
                Duration::from_millis(50)
            } else {
                Duration::from_secs(60)
            };
            let stop = CancellationToken::new();
            let holding = tokio::spawn(hold(
                bucket.clone(),
                me.clone(),
                registry.clone(),
                every,
                stop.clone(),
                Some(first),
            ));
            if refreshed {
                test_bucket::refreshed(&store, &key, first.revision).await;
            }
            stop.cancel();
            holding.await.unwrap();
            let left = store.get(&key).await.unwrap();
            assert_eq!(
                left.is_none(),
                refreshed,
                "{}: entry left {left:?}",
                me.node
            );
        }
    }
}
