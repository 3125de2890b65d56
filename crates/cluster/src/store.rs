//! [`JetStreamStore`]: durable dispatches in NATS JetStream key-value buckets, read by every
//! node of the cluster, so a dispatch outlives the node that accepted it.
//!
//! Three file-storage buckets per cluster, one entry per key:
//! - `switchyard_<cluster>_dispatches`: each unfinished dispatch by id, naming its *owner*,
//!   the node that drives it. The owner writes its state notes with the revision it last
//!   wrote (a write that finds another revision means another node took it over: the note is
//!   dropped and the owner stops counting the dispatch as its own).
//! - `switchyard_<cluster>_outcomes`: each dispatch's one outcome, written with *create*: the
//!   first outcome recorded wins, whichever node records it.
//! - `switchyard_<cluster>_idempotency`: each producer key (per namespace) to its dispatch
//!   id, also by *create*.
//! - `switchyard_<cluster>_queued`: each namespace's count of unfinished dispatches, bounded
//!   by `store.max_queued_per_namespace` ([`quota`]).
//!
//! Every node watches the outcomes bucket ([`feed`]): an `AwaitOutcome` for a dispatch
//! another node drives waits for its outcome here, and the outcome watchers of every node hear
//! every outcome.
//!
//! A node takes over the unfinished dispatches of an owner whose membership entry
//! (`switchyard_<cluster>_nodes`) has been missing from two scans in a row
//! ([`take_over_lost_nodes`](JetStreamStore::take_over_lost_nodes)), each by an update with
//! the revision it read, so exactly one node wins each dispatch.

mod buckets;
mod codec;
mod feed;
mod orphans;
mod quota;

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use switchyard_core::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchState, DispatchStore,
    DispatchStoreError, NewDispatch, OutcomeRecord, Recorded, StoredDispatch, WorkerId,
    check_idempotency_key,
};
use tokio_util::sync::CancellationToken;

use crate::config::ClusterConfig;
use crate::names::Names;
use crate::status::ClusterStatus;
use buckets::{
    bucket, finished_outcome, idempotency_key, scan, unavailable, unreadable, with_sources,
};
use codec::{Row, decode, encode};
use feed::Feed;
use orphans::Orphans;
use quota::Quota;

/// How long opening waits for NATS before it gives up.
const OPEN_WAIT: Duration = Duration::from_secs(5);

/// Tries of a state note that finds a newer revision of its own dispatch (two notes at once).
const NOTE_TRIES: usize = 3;

/// Why the jetstream store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreOpenError {
    /// NATS did not answer, or refused to make a bucket.
    #[error("jetstream dispatch store on {nats_url}: {detail}")]
    Unavailable {
        /// `cluster.nats_url`.
        nats_url: String,
        /// What failed.
        detail: String,
    },
}

/// The bounds of a [`JetStreamStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JetStreamLimits {
    /// Bytes the dispatches bucket may hold (`store.max_bytes`); a record past it is refused.
    pub max_bytes: u64,
    /// Unfinished dispatches one namespace may have across the cluster
    /// (`store.max_queued_per_namespace`); a record past it is refused.
    pub max_queued_per_namespace: u64,
}

/// A [`DispatchStore`] in JetStream key-value buckets shared by the cluster's nodes.
pub struct JetStreamStore {
    node: String,
    /// The store's NATS connection, asked whether it is up before a new dispatch is recorded.
    client: async_nats::Client,
    js: jetstream::Context,
    members_bucket: String,
    dispatches: kv::Store,
    outcomes: kv::Store,
    keys: kv::Store,
    quota: Quota,
    feed: Feed,
    limits: JetStreamLimits,
    /// The unfinished dispatches this node owns, with the revision it last wrote.
    owned: Mutex<HashMap<DispatchId, (u64, StoredDispatch)>>,
    orphans: Mutex<Orphans>,
}

impl std::fmt::Debug for JetStreamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamStore")
            .field("node", &self.node)
            .field("bucket", &self.dispatches.name)
            .finish_non_exhaustive()
    }
}

impl JetStreamStore {
    /// Connects to `config.nats_url` and opens (creating if needed) the cluster's buckets.
    pub async fn open(
        config: &ClusterConfig,
        limits: JetStreamLimits,
    ) -> Result<Self, StoreOpenError> {
        let failed = |detail: String| StoreOpenError::Unavailable {
            nats_url: config.nats_url.clone(),
            detail,
        };
        let options = crate::cluster::options(config, ClusterStatus::new(&config.node))
            .await
            .map_err(|error| failed(error.to_string()))?;
        let names = Names::new(&config.name);
        let opened = tokio::time::timeout(OPEN_WAIT, async {
            let client = options
                .connect(crate::cluster::servers(&config.nats_url))
                .await
                .map_err(|error| error.to_string())?;
            let js = jetstream::new(client.clone());
            let max_bytes = i64::try_from(limits.max_bytes).unwrap_or(i64::MAX);
            let dispatches = bucket(&js, &names.dispatches_bucket(), max_bytes).await?;
            let outcomes = bucket(&js, &names.outcomes_bucket(), -1).await?;
            let keys = bucket(&js, &names.idempotency_bucket(), -1).await?;
            let counts = bucket(&js, &names.queued_bucket(), -1).await?;
            // Outcomes are heard from the first one recorded after the store opened.
            let outcomes_from = outcomes
                .status()
                .await
                .map_err(|error| format!("bucket {}: {error}", outcomes.name))?
                .info
                .state
                .last_sequence
                .saturating_add(1);
            Ok::<_, String>((
                client,
                js,
                dispatches,
                outcomes,
                keys,
                counts,
                outcomes_from,
            ))
        })
        .await
        .map_err(|_| {
            failed(format!(
                "NATS did not answer within {}s",
                OPEN_WAIT.as_secs()
            ))
        })?
        .map_err(failed)?;
        let (client, js, dispatches, outcomes, keys, counts, outcomes_from) = opened;
        Ok(Self {
            client,
            quota: Quota::new(counts, limits.max_queued_per_namespace),
            feed: Feed::start(outcomes.clone(), config.node.clone(), outcomes_from),
            node: config.node.clone(),
            js,
            members_bucket: names.members_bucket(),
            dispatches,
            outcomes,
            keys,
            limits,
            owned: Mutex::default(),
            orphans: Mutex::default(),
        })
    }

    fn owned(&self) -> MutexGuard<'_, HashMap<DispatchId, (u64, StoredDispatch)>> {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every `every` until `stop`, takes over the unfinished dispatches of nodes lost from the
    /// membership bucket and hands them to `adopt` (which drives them).
    pub async fn take_over_lost_nodes(
        &self,
        every: Duration,
        adopt: impl Fn(Vec<StoredDispatch>) + Send,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            match self.take_over().await {
                Ok(rows) if rows.is_empty() => {}
                Ok(rows) => {
                    tracing::warn!(dispatches = rows.len(), node = %self.node,
                        "took over the durable dispatches of a lost node");
                    adopt(rows);
                }
                Err(error) => tracing::debug!(%error, "cluster: takeover scan failed"),
            }
        }
    }

    /// One takeover scan: the dispatches this node won from lost owners.
    async fn take_over(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        let Some(live) = self.live_nodes().await? else {
            return Ok(Vec::new());
        };
        let rows = scan(&self.dispatches).await?;
        let lost = self
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .scan(
                &self.node,
                &live,
                rows.iter().map(|(_, _, row)| row.owner.as_str()),
            );
        let mut taken = Vec::new();
        for (key, revision, mut row) in rows {
            if !lost.contains(&row.owner) || self.drop_if_finished(&key).await? {
                continue;
            }
            row.owner.clone_from(&self.node);
            if let Ok(next) = self.dispatches.update(&key, encode(&row), revision).await {
                let id = row.stored.dispatch.id.clone();
                self.owned().insert(id, (next, row.stored.clone()));
                taken.push(row.stored);
            }
        }
        Ok(taken)
    }

    /// The nodes with a membership entry; `None` while the bucket cannot be read.
    async fn live_nodes(&self) -> Result<Option<HashSet<String>>, DispatchStoreError> {
        let Ok(members) = self.js.get_key_value(&self.members_bucket).await else {
            return Ok(None);
        };
        let keys = members.keys().await.map_err(unavailable("members"))?;
        Ok(Some(
            keys.try_collect().await.map_err(unavailable("members"))?,
        ))
    }

    /// True (and the leftover entry deleted) when `key` already has its outcome: a node
    /// stopped between recording the outcome and deleting the dispatch's entry.
    async fn drop_if_finished(&self, key: &str) -> Result<bool, DispatchStoreError> {
        let finished = self
            .outcomes
            .get(key)
            .await
            .map_err(unavailable("outcomes"))?
            .is_some();
        if finished {
            let _ = self.dispatches.delete(key).await;
        }
        Ok(finished)
    }

    /// The outcome row of `id`, if recorded.
    async fn outcome_row(&self, id: &DispatchId) -> Result<Option<Row>, DispatchStoreError> {
        let value = self
            .outcomes
            .get(id.as_str())
            .await
            .map_err(unavailable("outcomes"))?;
        value
            .map(|v| decode(&v).map_err(unreadable(id)))
            .transpose()
    }

    /// The unfinished row of `id`, if recorded.
    async fn dispatch_row(&self, id: &DispatchId) -> Result<Option<Row>, DispatchStoreError> {
        let value = self
            .dispatches
            .get(id.as_str())
            .await
            .map_err(unavailable("dispatches"))?;
        value
            .map(|v| decode(&v).map_err(unreadable(id)))
            .transpose()
    }

    /// Changes the state of an unfinished dispatch this node owns; a dispatch it does not own
    /// (finished, or taken over by another node) is left alone.
    async fn note(
        &self,
        id: &DispatchId,
        change: impl Fn(&mut StoredDispatch),
    ) -> Result<(), DispatchStoreError> {
        for _ in 0..NOTE_TRIES {
            let Some((revision, mut stored)) = self.owned().get(id).cloned() else {
                return Ok(());
            };
            change(&mut stored);
            let row = Row {
                stored: stored.clone(),
                owner: self.node.clone(),
            };
            match self
                .dispatches
                .update(id.as_str(), encode(&row), revision)
                .await
            {
                Ok(next) => {
                    let mut owned = self.owned();
                    if let Some(entry) = owned.get_mut(id)
                        && entry.0 == revision
                    {
                        *entry = (next, stored);
                    }
                    return Ok(());
                }
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    // Another note of ours landed first, or another node owns it now.
                    let current = self
                        .dispatches
                        .entry(id.as_str())
                        .await
                        .map_err(unavailable("dispatches"))?;
                    let mine = current
                        .filter(|e| e.operation == kv::Operation::Put)
                        .and_then(|e| decode(&e.value).ok().map(|row| (e.revision, row)))
                        .filter(|(_, row)| row.owner == self.node);
                    let mut owned = self.owned();
                    match mine {
                        Some((revision, row)) => {
                            owned.insert(id.clone(), (revision, row.stored));
                        }
                        None => {
                            owned.remove(id);
                            return Ok(());
                        }
                    }
                }
                Err(error) => return Err(unavailable("dispatches")(error)),
            }
        }
        Ok(())
    }

    /// Every row of both buckets, the finished ones from the outcomes bucket.
    async fn all_rows(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        let finished = scan(&self.outcomes).await?;
        let done: HashSet<String> = finished.iter().map(|(key, _, _)| key.clone()).collect();
        let mut rows: Vec<StoredDispatch> = scan(&self.dispatches)
            .await?
            .into_iter()
            .filter(|(key, _, _)| !done.contains(key))
            .chain(finished)
            .map(|(_, _, row)| row.stored)
            .collect();
        rows.sort_by(|a, b| {
            (a.dispatch.submitted_at, &a.dispatch.id)
                .cmp(&(b.dispatch.submitted_at, &b.dispatch.id))
        });
        Ok(rows)
    }
}

#[async_trait]
impl DispatchStore for JetStreamStore {
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        // A malformed key is refused for good before anything that may pass.
        if let Some(key) = &dispatch.idempotency_key {
            check_idempotency_key(key)?;
        }
        // Refused at once while the connection is known down, rather than when a request
        // times out (which could leave the producer unsure whether it was recorded).
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(DispatchStoreError::Unavailable {
                detail: "jetstream: not connected to NATS; nothing was recorded".to_owned(),
            });
        }
        let key = match &dispatch.idempotency_key {
            Some(key) => {
                let key = idempotency_key(&dispatch.namespace, key);
                let id = Bytes::from(dispatch.id.as_str().to_owned());
                match self.keys.create(&key, id).await {
                    Ok(_) => {}
                    Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
                        let first = self
                            .keys
                            .get(&key)
                            .await
                            .map_err(unavailable("idempotency"))?
                            .and_then(|v| std::str::from_utf8(&v).ok().and_then(DispatchId::parse));
                        return first.map(Recorded::Existing).ok_or_else(|| {
                            DispatchStoreError::Unavailable {
                                detail: "jetstream idempotency: the key's entry changed while \
                                         it was read"
                                    .to_owned(),
                            }
                        });
                    }
                    Err(error) => return Err(unavailable("idempotency")(error)),
                }
                Some(key)
            }
            None => None,
        };
        if let Err(refused) = self.quota.take(&dispatch.namespace).await {
            if let Some(key) = key {
                let _ = self.keys.purge(&key).await;
            }
            return Err(refused);
        }
        let id = dispatch.id.clone();
        let namespace = dispatch.namespace.clone();
        let stored = StoredDispatch {
            dispatch,
            state: DispatchState::Queued { not_before: None },
            attempts: 0,
        };
        let row = Row {
            stored: stored.clone(),
            owner: self.node.clone(),
        };
        let value = encode(&row);
        let size = u64::try_from(value.len()).unwrap_or(u64::MAX);
        match self.dispatches.create(id.as_str(), value).await {
            Ok(revision) => {
                self.owned().insert(id.clone(), (revision, stored));
                Ok(Recorded::New(id))
            }
            Err(error) => {
                self.quota.give_back(&namespace).await;
                if let Some(key) = key {
                    let _ = self.keys.purge(&key).await;
                }
                // The client keeps no word of why the server refused: a bucket this write
                // would take past its bound is full.
                let held = match self.js.get_stream(&self.dispatches.stream_name).await {
                    Ok(stream) => Some(stream.cached_info().state.bytes),
                    Err(_) => None,
                };
                match held {
                    Some(held) if held.saturating_add(size) > self.limits.max_bytes => {
                        Err(DispatchStoreError::StoreFull {
                            size: held,
                            limit: self.limits.max_bytes,
                        })
                    }
                    _ => Err(unavailable("dispatches")(with_sources(&error))),
                }
            }
        }
    }

    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError> {
        self.note(id, |row| {
            row.state = DispatchState::Parked {
                reason: reason.to_owned(),
            };
        })
        .await
    }

    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError> {
        self.note(id, |row| {
            row.state = DispatchState::Running { worker, attempt };
            row.attempts = row.attempts.max(attempt);
        })
        .await
    }

    async fn extend(&self, _id: &DispatchId) -> Result<(), DispatchStoreError> {
        // Ownership follows the owner's membership entry, not a lease per dispatch.
        Ok(())
    }

    async fn complete(
        &self,
        id: &DispatchId,
        outcome: &OutcomeRecord,
        at: SystemTime,
    ) -> Result<Completion, DispatchStoreError> {
        let cached = self.owned().get(id).map(|(_, stored)| stored.clone());
        let stored = match cached {
            Some(stored) => Some(stored),
            None => self.dispatch_row(id).await?.map(|row| row.stored),
        };
        let Some(mut stored) = stored else {
            return Ok(match self.outcome_row(id).await? {
                Some(row) => {
                    finished_outcome(&row).map_or(Completion::Unknown, Completion::AlreadyFinished)
                }
                None => Completion::Unknown,
            });
        };
        stored.state = DispatchState::Finished {
            outcome: outcome.clone(),
            at,
        };
        let row = Row {
            stored,
            owner: self.node.clone(),
        };
        let completion = match self.outcomes.create(id.as_str(), encode(&row)).await {
            Ok(_) => {
                self.feed.waiters.finish(&row.stored);
                self.quota.give_back(&row.stored.dispatch.namespace).await;
                Completion::Recorded
            }
            Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
                match self
                    .outcome_row(id)
                    .await?
                    .as_ref()
                    .and_then(finished_outcome)
                {
                    Some(first) => Completion::AlreadyFinished(first),
                    None => {
                        return Err(DispatchStoreError::Unavailable {
                            detail: format!("jetstream outcomes: {id} changed while it was read"),
                        });
                    }
                }
            }
            Err(error) => return Err(unavailable("outcomes")(error)),
        };
        self.owned().remove(id);
        // Best effort: a leftover entry is removed by the next scan that meets it.
        let _ = self.dispatches.delete(id.as_str()).await;
        Ok(completion)
    }

    async fn release(&self, id: &DispatchId, delay: Duration) -> Result<(), DispatchStoreError> {
        let not_before = (!delay.is_zero()).then(|| SystemTime::now() + delay);
        self.note(id, |row| {
            row.state = DispatchState::Queued { not_before };
        })
        .await
    }

    /// Waits on this node's watch of the outcomes bucket, which hears every node's outcomes.
    async fn await_recorded(
        &self,
        id: &DispatchId,
        wait: Duration,
    ) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        // Subscribed before the read, so an outcome recorded between the two is not missed.
        let mut heard = self.feed.waiters.subscribe(id);
        let read = self.outcome_row(id).await;
        let result = match read {
            Ok(Some(row)) => Ok(Some(row.stored)),
            Ok(None) => Ok(tokio::time::timeout(wait, heard.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(|row| row.ok().and_then(|row| row.clone()))),
            Err(error) => Err(error),
        };
        drop(heard);
        self.feed.waiters.forget(id);
        result
    }

    fn recorded_elsewhere(&self) -> Option<tokio::sync::mpsc::Receiver<StoredDispatch>> {
        Some(self.feed.elsewhere())
    }

    /// The unfinished dispatches this node owns, each claimed again with the revision read
    /// (so a node that took one over meanwhile keeps it).
    async fn unfinished(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        let mut mine = Vec::new();
        for (key, revision, row) in scan(&self.dispatches).await? {
            if row.owner != self.node || self.drop_if_finished(&key).await? {
                continue;
            }
            if let Ok(next) = self.dispatches.update(&key, encode(&row), revision).await {
                let id = row.stored.dispatch.id.clone();
                self.owned().insert(id, (next, row.stored.clone()));
                mine.push(row.stored);
            }
        }
        mine.sort_by(|a, b| {
            (a.dispatch.submitted_at, &a.dispatch.id)
                .cmp(&(b.dispatch.submitted_at, &b.dispatch.id))
        });
        Ok(mine)
    }

    async fn get(&self, id: &DispatchId) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        if let Some(row) = self.outcome_row(id).await? {
            return Ok(Some(row.stored));
        }
        Ok(self.dispatch_row(id).await?.map(|row| row.stored))
    }

    async fn list(
        &self,
        filter: &DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit
        };
        Ok(self
            .all_rows()
            .await?
            .into_iter()
            .filter(|row| filter.admits(row))
            .take(limit)
            .collect())
    }

    /// The backlog of the dispatches this node drives (each node reports its own).
    async fn census(&self, now: SystemTime) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
        let owned = self.owned();
        Ok(BacklogCensus::tally(
            owned.values().map(|(_, row)| row),
            now,
        ))
    }

    /// Removes outcomes recorded before `finished_before`, with their idempotency keys and
    /// the dispatches' delete markers (stream purges by subject leave nothing behind).
    async fn purge(&self, finished_before: SystemTime) -> Result<u64, DispatchStoreError> {
        let mut purged = 0u64;
        for (key, _, row) in scan(&self.outcomes).await? {
            let expired = matches!(row.stored.state, DispatchState::Finished { at, .. }
                if at < finished_before);
            if !expired {
                continue;
            }
            let d = &row.stored.dispatch;
            if let Some(idempotency) = &d.idempotency_key {
                let subject = format!(
                    "{}{}",
                    self.keys.prefix,
                    idempotency_key(&d.namespace, idempotency)
                );
                self.keys
                    .stream
                    .purge()
                    .filter(subject)
                    .await
                    .map_err(unavailable("idempotency"))?;
            }
            let marker = format!("{}{key}", self.dispatches.prefix);
            self.dispatches
                .stream
                .purge()
                .filter(marker)
                .await
                .map_err(unavailable("dispatches"))?;
            let subject = format!("{}{key}", self.outcomes.prefix);
            self.outcomes
                .stream
                .purge()
                .filter(subject)
                .await
                .map_err(unavailable("outcomes"))?;
            purged += 1;
        }
        Ok(purged)
    }
}
