//! Holding the node's name in the membership bucket, and watching everyone else's.
//!
//! The bucket's entries age out after the member TTL (`max_age`: NATS 2.9 has no per-key
//! TTL), so a node refreshes its own entry well within it, always with the revision it last
//! wrote: a write that finds another revision means someone else holds the name now.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::kv_bucket::{self, BucketLimits};
use crate::members::{Members, NodeInfo};
use crate::status::{ClusterStatus, Standing};

/// How long to wait before retrying NATS after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// Why a node could not claim its name.
#[derive(Debug)]
pub(crate) enum ClaimError {
    /// Another live node holds it; what that node published.
    Taken(String),
    /// NATS could not answer.
    Nats(String),
}

/// Opens (creating if needed) the membership bucket (or the numbers bucket, of the same
/// shape): entries live `ttl` unless refreshed.
pub(crate) async fn bucket(
    js: &jetstream::Context,
    name: &str,
    ttl: Duration,
) -> Result<kv::Store, String> {
    let limits = BucketLimits {
        max_age: ttl,
        max_bytes: -1,
    };
    kv_bucket::open(js, "membership bucket", name, limits).await
}

/// Where the membership bucket lives, to open it again after an outage.
#[derive(Clone)]
pub(crate) struct Bucket {
    pub(crate) js: jetstream::Context,
    pub(crate) name: String,
    pub(crate) ttl: Duration,
}

impl Bucket {
    pub(crate) async fn open(&self) -> Result<kv::Store, String> {
        bucket(&self.js, &self.name, self.ttl).await
    }
}

/// Claims `me.node`: creates the entry, or takes it over when it is this process's own
/// (same instance); refuses when another live process holds it. Returns the revision.
pub(crate) async fn claim(store: &kv::Store, me: &NodeInfo) -> Result<u64, ClaimError> {
    let body: bytes::Bytes = serde_json::to_vec(me).unwrap_or_default().into();
    for _ in 0..3 {
        match store.create(&me.node, body.clone()).await {
            Ok(revision) => return Ok(revision),
            Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(error) => return Err(ClaimError::Nats(error.to_string())),
        }
        let entry = store
            .entry(me.node.clone())
            .await
            .map_err(|error| ClaimError::Nats(error.to_string()))?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            // Aged out or deleted between the two calls: create again.
            continue;
        };
        let holder: Option<NodeInfo> = serde_json::from_slice(&entry.value).ok();
        match holder {
            Some(holder) if holder.instance == me.instance => {
                return store
                    .update(&me.node, body.clone(), entry.revision)
                    .await
                    .map_err(|error| ClaimError::Nats(error.to_string()));
            }
            Some(holder) => return Err(ClaimError::Taken(holder.to_string())),
            None => return Err(ClaimError::Taken("an unreadable entry".to_owned())),
        }
    }
    Err(ClaimError::Nats("the entry kept changing".to_owned()))
}

/// Keeps the name claimed until `stop`, refreshing every `every`; on a failure claims it
/// again (rejoining after an outage), reporting the standing on `status`. Deletes the entry
/// on a clean stop so other nodes see the node gone at once.
pub(crate) async fn hold(
    bucket: Bucket,
    me: NodeInfo,
    status: ClusterStatus,
    every: Duration,
    stop: CancellationToken,
    mut revision: Option<u64>,
) {
    let body: bytes::Bytes = serde_json::to_vec(&me).unwrap_or_default().into();
    let mut store: Option<kv::Store> = None;
    loop {
        let pause = if revision.is_some() { every } else { RETRY };
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
        let kv = match &store {
            Some(kv) => kv.clone(),
            None => match bucket.open().await {
                Ok(kv) => store.insert(kv).clone(),
                Err(reason) => {
                    status.set(Standing::Degraded(reason));
                    continue;
                }
            },
        };
        if let Some(last) = revision
            && let Ok(next) = kv.update(&me.node, body.clone(), last).await
        {
            revision = Some(next);
            status.set(Standing::Joined);
            continue;
        }
        match claim(&kv, &me).await {
            Ok(next) => {
                revision = Some(next);
                status.set(Standing::Joined);
            }
            Err(ClaimError::Taken(holder)) => {
                revision = None;
                status.set(Standing::Degraded(format!(
                    "node name {:?} is held by another live node ({holder})",
                    me.node
                )));
            }
            Err(ClaimError::Nats(reason)) => {
                revision = None;
                status.set(Standing::Degraded(reason));
            }
        }
    }
    if revision.is_some()
        && let Some(kv) = store
    {
        let _ = kv.delete(&me.node).await;
    }
}

/// The age of an entry the watch replays (written before the watch started) by the server's
/// timestamp, `created_unix_nanos`, at `now_unix_nanos` on this node's clock; `None` when it
/// is not within `[0, ttl)`, which only clocks apart can make it (the bucket's `max_age` is
/// the TTL): such an entry counts from its arrival, as a live write does.
pub(crate) fn replayed_age(
    created_unix_nanos: i128,
    now_unix_nanos: i128,
    ttl: Duration,
) -> Option<Duration> {
    let age = u64::try_from(now_unix_nanos.checked_sub(created_unix_nanos)?).ok()?;
    let age = Duration::from_nanos(age);
    (age < ttl).then_some(age)
}

/// This node's wall clock, in nanoseconds since the Unix epoch.
fn unix_nanos_now() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i128::try_from(since.as_nanos()).unwrap_or(i128::MAX)
        })
}

/// Follows every node's entry into `members` until `stop`; `joined` hears each node that
/// appears (a new node may have free slots). Each (re)start of the watch first replays every
/// node's last entry, so a node that starts, or comes back after an outage, knows the others
/// at once rather than at their next refresh; a replayed entry counts from when it was
/// written ([`replayed_age`]).
pub(crate) async fn watch(
    bucket: Bucket,
    members: Arc<Mutex<Members>>,
    joined: impl Fn() + Send,
    stop: CancellationToken,
) {
    loop {
        let ttl = bucket.ttl;
        let watching = match bucket.open().await {
            Ok(kv) => kv
                .watch_with_history(">")
                .await
                .map_err(|error| error.to_string()),
            Err(reason) => Err(reason),
        };
        match watching {
            Ok(mut entries) => {
                // The replay ends with the first entry nothing is pending behind (there is
                // always one: this node's own).
                let mut replaying = true;
                loop {
                    let next = tokio::select! {
                        () = stop.cancelled() => return,
                        next = entries.next() => next,
                    };
                    let Some(Ok(entry)) = next else { break };
                    let mut members = members.lock().unwrap_or_else(PoisonError::into_inner);
                    match entry.operation {
                        kv::Operation::Put => {
                            let now = Instant::now();
                            let written = replaying
                                .then(|| {
                                    let created = entry.created.unix_timestamp_nanos();
                                    replayed_age(created, unix_nanos_now(), ttl)
                                })
                                .flatten()
                                .and_then(|age| now.checked_sub(age))
                                .unwrap_or(now);
                            let instance = serde_json::from_slice::<NodeInfo>(&entry.value)
                                .map_or(0, |info| info.instance);
                            let new = !members.is_live(&entry.key, ttl, now);
                            members.seen(&entry.key, instance, written);
                            drop(members);
                            if new {
                                joined();
                            }
                        }
                        kv::Operation::Delete | kv::Operation::Purge => {
                            members.left(&entry.key);
                        }
                    }
                    if entry.delta == 0 {
                        replaying = false;
                    }
                }
            }
            Err(reason) => tracing::debug!(%reason, "cluster: membership watch unavailable"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// What the tests of the buckets a node holds share: a bucket on a test server, and waiting for
/// a key's first refresh.
#[cfg(test)]
pub(crate) mod test_bucket {
    use std::time::Duration;

    use async_nats::jetstream::{self, kv};

    use super::Bucket;

    /// Bucket `name` (60 s TTL) on the NATS server at `url`, opened.
    pub(crate) async fn open(url: &str, name: &str) -> (Bucket, kv::Store) {
        let client = async_nats::connect(url).await.unwrap();
        let bucket = Bucket {
            js: jetstream::new(client),
            name: name.to_owned(),
            ttl: Duration::from_secs(60),
        };
        let store = bucket.open().await.unwrap();
        (bucket, store)
    }

    /// Waits (at most 10 s) until `key` has a revision above `first`.
    pub(crate) async fn refreshed(store: &kv::Store, key: &str, first: u64) {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let entry = store.entry(key).await.unwrap();
                if entry.is_some_and(|e| e.revision > first) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the entry was refreshed");
    }
}

#[cfg(test)]
mod tests {
    use switchyard_test_support::NatsServer;

    use super::*;

    const SECOND: i128 = 1_000_000_000;

    /// A node that starts watching knows at once the nodes that wrote their entry before it
    /// started, without waiting for their next refresh (none comes here), and a node written
    /// after it started too (the control: the watch is live).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_starting_watch_knows_the_nodes_already_in_the_bucket() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        let ttl = Duration::from_secs(60);
        let client = async_nats::connect(nats.url()).await.unwrap();
        let bucket = Bucket {
            js: jetstream::new(client),
            name: "switchyard_replay_nodes".to_owned(),
            ttl,
        };
        let store = bucket.open().await.unwrap();
        let info = |node: &str| NodeInfo {
            node: node.to_owned(),
            instance: 7,
            grpc_addr: None,
            ops_addr: None,
            started_unix_ms: 0,
        };
        claim(&store, &info("earlier")).await.unwrap();
        claim(&store, &info("me")).await.unwrap();
        let members = Arc::new(Mutex::new(Members::default()));
        let (joined_tx, mut joined) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        tokio::spawn(watch(
            bucket,
            Arc::clone(&members),
            move || {
                let _ = joined_tx.send(());
            },
            stop.clone(),
        ));
        let patience = Duration::from_secs(10);
        let live =
            |members: &Arc<Mutex<Members>>| members.lock().unwrap().live(ttl, Instant::now());
        tokio::time::timeout(patience, async {
            while live(&members) != ["earlier", "me"] {
                joined.recv().await.unwrap();
            }
        })
        .await
        .expect("the nodes written before the watch started are known");
        claim(&store, &info("later")).await.unwrap();
        tokio::time::timeout(patience, async {
            while live(&members) != ["earlier", "later", "me"] {
                joined.recv().await.unwrap();
            }
        })
        .await
        .expect("a node written after it started is known");
        stop.cancel();
    }

    #[test]
    fn a_replayed_entry_counts_from_when_it_was_written_within_the_ttl() {
        let ttl = Duration::from_secs(3);
        let now = 1_000 * SECOND;
        assert_eq!(
            replayed_age(now - 2 * SECOND, now, ttl),
            Some(Duration::from_secs(2))
        );
        assert_eq!(replayed_age(now, now, ttl), Some(Duration::ZERO));
        // Clocks apart: written "in the future", or older than the bucket keeps anything.
        assert_eq!(replayed_age(now + SECOND, now, ttl), None);
        assert_eq!(replayed_age(now - 3 * SECOND, now, ttl), None);
    }

    /// `docs/cluster.md`: a clean stop deletes the node's entry once its first refresh has run;
    /// a node stopped before that leaves it to age out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clean_stop_deletes_the_entry_once_the_first_refresh_has_run() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        let (bucket, store) = test_bucket::open(&nats.url(), "switchyard_stop_nodes").await;
        for refreshed in [true, false] {
            let me = NodeInfo {
                node: if refreshed { "refreshed" } else { "early" }.to_owned(),
                instance: 7,
                grpc_addr: None,
                ops_addr: None,
                started_unix_ms: 0,
            };
            let first = claim(&store, &me).await.unwrap();
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
                ClusterStatus::new(&me.node),
                every,
                stop.clone(),
                Some(first),
            ));
            if refreshed {
                test_bucket::refreshed(&store, &me.node, first).await;
            }
            stop.cancel();
            holding.await.unwrap();
            let left = store.get(&me.node).await.unwrap();
            assert_eq!(
                left.is_none(),
                refreshed,
                "{}: entry left {left:?}",
                me.node
            );
        }
    }
}
