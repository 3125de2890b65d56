//! The offering side: the [`Overflow`] a node installs on its dispatcher.
//!
//! An offer is one NATS request on the pool's offer subject carrying a batch of the dispatches
//! parked on the pool ([`crate::offers`]): the queue group hands it to one node subscribed
//! there (only nodes with a free slot are), which answers for each forward "taken", "busy" or
//! "ended" with its end; no subscriber at all is NATS's immediate no-responders, the
//! dispatch's "no taker". A taken dispatch's end arrives in the answer (a task that ended at
//! once) or on this node's outcome subject, matched by forward id. A forward answered "busy"
//! in a batch that had another forward taken is queued again at once (that taker filled up,
//! others may not have); one answered "busy" by a batch nobody took counts one of its
//! [`BUSY_RETRIES`]. While forwarded dispatches run, one sweep a second checks
//! each one's taker against the membership view, and a taker whose entry aged out (or whose
//! name another process holds now) counts as lost: the dispatch is offered again within the
//! loss budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{Client, Request};
use futures::StreamExt;
use switchyard_core::{
    ActivityRequest, Forwarded, Offered, Overflow, OverflowFuture, OverflowOffer,
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hints::Hints;
use crate::id_hash::IdHash;
use crate::members::Members;
use crate::names::{Names, pool_key};
use crate::offers::{Address, Heard, OfferQueues, PoolRef, Queued, Tries};
use crate::status::{ClusterStatus, Standing};
use crate::wire::{self, CancelMeta, EntryAnswer, OfferEntry, RemoteEnd};

/// How long an offer waits for its "taken" or "busy".
const OFFER_TIMEOUT: Duration = Duration::from_secs(2);
/// Offers one dispatch makes in a row while takers answer "busy" and take nothing else.
const BUSY_RETRIES: usize = 3;
/// Offers one dispatch makes in all before it parks, "busy" in partly taken batches included.
const MAX_OFFERS: usize = 32;
/// The most dispatches one offer carries (the wire allows more): about a taker's share of a
/// busy pool, so a batch is mostly taken by the one node it reaches.
const OFFER_BATCH: usize = 64;
/// How often the forwarded dispatches' takers are checked against the membership view.
const TAKER_CHECK: Duration = Duration::from_secs(1);
/// A parked dispatch offers again at least this often, in case a capacity announcement was
/// lost (NATS restarting, say).
const REOFFER_EVERY: Duration = Duration::from_secs(5);

/// The offering side, shared between the overflow and its subscription tasks.
pub(crate) struct Forwarder {
    client: Client,
    names: Names,
    node: String,
    status: ClusterStatus,
    members: Arc<Mutex<Members>>,
    member_ttl: Duration,
    next_forward: AtomicU64,
    /// Forwarded dispatches waiting for their end, by forward id.
    waiting: Mutex<HashMap<u64, Waiting, IdHash>>,
    /// The capacity announcements and joins heard, which wake parked dispatches.
    hints: Hints,
    /// Dispatches waiting to be offered, per pool.
    queues: Mutex<OfferQueues>,
}

impl Forwarder {
    pub(crate) fn new(
        client: Client,
        names: Names,
        node: String,
        status: ClusterStatus,
        members: Arc<Mutex<Members>>,
        member_ttl: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            names,
            node,
            status,
            members,
            member_ttl,
            next_forward: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::default()),
            hints: Hints::default(),
            queues: Mutex::new(OfferQueues::default()),
        })
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, OfferQueues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting, IdHash>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A node joined: every parked dispatch may find a taker there.
    pub(crate) fn node_joined(&self) {
        self.hints.joined();
    }

    /// A forward's offer was taken by `taker`: from now on the sweep checks it.
    fn taken_by(&self, forward: u64, taker: &str) {
        // The process that answered "taken" is the one the view holds now: a successor under
        // its name can only write after its entry aged out.
        let instance = self
            .members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .instance(taker);
        if let Some(waiting) = self.waiting().get_mut(&forward) {
            waiting.taker = Some((taker.to_owned(), instance));
        }
    }

    /// Ends every forwarded dispatch whose taker is gone as lost (it is offered again).
    fn sweep_lost_takers(&self) {
        let now = Instant::now();
        let lost = {
            let members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
            // Only a node connected for a whole TTL has seen every live node's refresh.
            let settled = self.status.connected_for(self.member_ttl, now);
            let mut waiting = self.waiting();
            lost_takers(&mut waiting, &members, settled, self.member_ttl, now)
        };
        for (forward, taker, ended) in lost {
            tracing::info!(%taker, forward,
                "cluster: the node holding a forwarded dispatch left; offering again");
            let _ = ended.send(RemoteEnd::Lost);
        }
    }

    /// Offers a dispatch: finds its pool's queue now (the request is borrowed), then the
    /// returned future queues it and hears the answers.
    fn offer(self: &Arc<Self>, offer: OverflowOffer<'_>) -> OverflowFuture<Offered> {
        if self.status.standing() != Standing::Joined {
            return Box::pin(std::future::ready(Offered::NoTaker));
        }
        let OverflowOffer {
            request,
            deadline,
            attempt_offset,
        } = offer;
        let address = Address {
            namespace: &request.namespace,
            task_queue: switchyard_core::normalise_task_queue(&request.task_queue),
            activity_type: &request.activity_type,
            node: request.node.as_deref().filter(|n| !n.is_empty()),
        };
        let pool = self
            .queues()
            .find(&self.node, address, |key| self.offer_subject(key));
        let timeout = deadline.saturating_duration_since(Instant::now());
        let entry = OfferEntry {
            forward: self.next_forward.fetch_add(1, Ordering::Relaxed),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            attempt_offset,
            input: request.input.clone(),
        };
        Box::pin(Arc::clone(self).offered(pool, entry))
    }

    /// The offer subject of the pool whose key is `key`.
    fn offer_subject(&self, key: u64) -> String {
        self.names.offer(&format!("{key:016x}"))
    }

    /// Queues `entry` in `pool` and hears its answer, again while a "busy" answer allows.
    async fn offered(self: Arc<Self>, pool: PoolRef, entry: OfferEntry) -> Offered {
        let forward = entry.forward;
        let (ended_tx, ended) = oneshot::channel();
        self.waiting().insert(
            forward,
            Waiting {
                ended: ended_tx,
                taker: None,
            },
        );
        let mut watch = ForwardWatch {
            forwarder: Arc::clone(&self),
            forward,
            taker: None,
            unanswered: false,
        };
        let mut tries = Tries::new(MAX_OFFERS, BUSY_RETRIES);
        while tries.offer() {
            watch.unanswered = true;
            let (heard_tx, heard) = oneshot::channel();
            self.enqueue(
                &pool,
                Queued {
                    entry: entry.clone(),
                    heard: heard_tx,
                },
            );
            match heard.await.unwrap_or(Heard::Unanswered) {
                Heard::NoResponders => {
                    watch.unanswered = false;
                    break;
                }
                // A lost or late answer may hide a taker: dropping the watch cancels it.
                Heard::Unanswered => return Offered::Unanswered,
                Heard::Answered {
                    taker,
                    answer,
                    progress,
                } => {
                    watch.unanswered = false;
                    match answer {
                        EntryAnswer::Taken => {
                            self.taken_by(forward, &taker);
                            watch.taker = Some(taker.as_ref().to_owned());
                            return Offered::Taken(Box::pin(watch.wait(ended)));
                        }
                        EntryAnswer::Ended(end) => {
                            return Offered::Taken(Box::pin(std::future::ready(forwarded(end))));
                        }
                        EntryAnswer::Busy => tries.busy(progress),
                    }
                }
            }
        }
        Offered::NoTaker
    }

    /// Queues a dispatch for its pool's next batch, starting a sender when the pool has a
    /// batch slot free.
    fn enqueue(self: &Arc<Self>, pool: &PoolRef, queued: Queued) {
        let start = self
            .queues()
            .push(pool, queued, Instant::now(), |key| self.offer_subject(key));
        if start {
            self.start_sender(pool);
        }
    }

    /// Starts a sender for `pool`, which holds the batch slot its caller counted.
    fn start_sender(self: &Arc<Self>, pool: &PoolRef) {
        tokio::spawn(Arc::clone(self).send_batches(pool.clone()));
    }

    /// Offers the pool's queued dispatches, a batch at a time, until none is queued; each
    /// dispatch hears its own answer.
    async fn send_batches(self: Arc<Self>, pool: PoolRef) {
        let mut answered_in = None;
        loop {
            let sent = Instant::now();
            let next = {
                let mut queues = self.queues();
                queues.get_mut(&pool).and_then(|queue| {
                    let batch = queue.next_batch(OFFER_BATCH, sent, answered_in)?;
                    let widen = queue.widen_after_answer(answered_in, sent);
                    Some((batch, queue.subject.clone(), widen))
                })
            };
            let Some((batch, subject, widen)) = next else {
                return;
            };
            if widen {
                self.start_sender(&pool);
            }
            let (entries, listeners): (Vec<OfferEntry>, Vec<oneshot::Sender<Heard>>) = batch
                .into_iter()
                .map(|queued| (queued.entry, queued.heard))
                .unzip();
            let body = wire::encode_offers(&pool.header, &entries);
            let asked = self
                .client
                .send_request(
                    subject,
                    Request::new().payload(body).timeout(Some(OFFER_TIMEOUT)),
                )
                .await;
            let heard: Vec<Heard> = match asked {
                Ok(answer) => match wire::decode_answers(&answer.payload) {
                    Ok(answer) => crate::offers::hear(&answer.taker, answer.entries, &entries),
                    Err(error) => {
                        tracing::debug!(%error, "cluster: unreadable answer to an offer");
                        entries.iter().map(|_| Heard::Unanswered).collect()
                    }
                },
                Err(error) if error.kind() == RequestErrorKind::NoResponders => {
                    entries.iter().map(|_| Heard::NoResponders).collect()
                }
                Err(error) => {
                    tracing::debug!(%error, "cluster: offer unanswered");
                    entries.iter().map(|_| Heard::Unanswered).collect()
                }
            };
            // Only an answer that took something tells the pool's pace (see `next_batch`).
            let progress = heard
                .iter()
                .any(|heard| matches!(heard, Heard::Answered { progress: true, .. }));
            answered_in = progress.then(|| sent.elapsed());
            for (listener, heard) in listeners.into_iter().zip(heard) {
                let _ = listener.send(heard);
            }
        }
    }
}

/// One forwarded dispatch: waits for its end; dropped before it, asks the taker to cancel
/// (every node, when an offer's answer never arrived: someone may have taken it).
struct ForwardWatch {
    forwarder: Arc<Forwarder>,
    forward: u64,
    taker: Option<String>,
    /// An offer is out and its answer has not been read.
    unanswered: bool,
}

impl ForwardWatch {
    async fn wait(mut self, ended: oneshot::Receiver<RemoteEnd>) -> Forwarded {
        let end = ended.await;
        self.taker = None;
        match end {
            Ok(end) => forwarded(end),
            Err(_) => Forwarded::Lost,
        }
    }
}

/// What the dispatcher hears of a remote end.
fn forwarded(end: RemoteEnd) -> Forwarded {
    match end {
        RemoteEnd::Outcome(outcome) => Forwarded::Outcome(outcome),
        RemoteEnd::Lost => Forwarded::Lost,
    }
}

/// One forwarded dispatch waiting for its end.
struct Waiting {
    ended: oneshot::Sender<RemoteEnd>,
    /// The node that took it, and its process instance as the view held it then; `None`
    /// until "taken" is heard.
    taker: Option<(String, Option<u64>)>,
}

/// Removes the forwards whose taker is gone at `now` from `waiting`, with their taker and
/// channel: another process holds the taker's name now, or (once this node has been
/// connected for a whole TTL, `settled`) its entry aged out.
fn lost_takers(
    waiting: &mut HashMap<u64, Waiting, IdHash>,
    members: &Members,
    settled: bool,
    ttl: Duration,
    now: Instant,
) -> Vec<(u64, String, oneshot::Sender<RemoteEnd>)> {
    let lost: Vec<u64> = waiting
        .iter_mut()
        .filter_map(|(forward, waiting)| {
            let (taker, instance) = waiting.taker.as_mut()?;
            let gone =
                members.replaced(taker, instance) || (settled && !members.is_live(taker, ttl, now));
            gone.then_some(*forward)
        })
        .collect();
    lost.into_iter()
        .filter_map(|forward| {
            let waiting = waiting.remove(&forward)?;
            let (taker, _) = waiting.taker?;
            Some((forward, taker, waiting.ended))
        })
        .collect()
}

impl Drop for ForwardWatch {
    fn drop(&mut self) {
        self.forwarder.waiting().remove(&self.forward);
        let names = &self.forwarder.names;
        let subject = match self.taker.take() {
            Some(taker) => names.cancel(&taker),
            None if self.unanswered => names.cancel_unaddressed(),
            None => return,
        };
        let client = self.forwarder.client.clone();
        let body = wire::frame(
            &CancelMeta {
                origin: self.forwarder.node.clone(),
                forward: self.forward,
            },
            &[],
        );
        // Drop cannot wait; the publish is queued on the client at once.
        tokio::spawn(async move {
            let _ = client.publish(subject, body).await;
        });
    }
}

/// The [`Overflow`] installed on the dispatcher.
/// The second field: durable dispatches are offered too (the dispatch store is shared).
pub(crate) struct ClusterOverflow(pub(crate) Arc<Forwarder>, pub(crate) bool);

impl Overflow for ClusterOverflow {
    fn carries_durable(&self) -> bool {
        self.1
    }

    fn offer(&self, offer: OverflowOffer<'_>) -> OverflowFuture<Offered> {
        self.0.offer(offer)
    }

    fn capacity_hint(&self, request: &ActivityRequest) -> OverflowFuture<()> {
        let pool = pool_key(
            &request.namespace,
            switchyard_core::normalise_task_queue(&request.task_queue),
            &request.activity_type,
            request.node.as_deref().filter(|n| !n.is_empty()),
        );
        Box::pin(self.0.hints.hint(pool, REOFFER_EVERY))
    }
}

/// Routes the ends of forwarded dispatches to their waiting dispatch, and sweeps for lost
/// takers, until `stop`.
pub(crate) async fn follow_outcomes(forwarder: Arc<Forwarder>, stop: CancellationToken) {
    let subject = forwarder.names.outcome(&forwarder.node);
    let mut ends = match forwarder.client.subscribe(subject.clone()).await {
        Ok(ends) => ends,
        Err(error) => {
            tracing::warn!(%subject, %error, "cluster: outcome subscription failed");
            return;
        }
    };
    let mut sweep = tokio::time::interval(TAKER_CHECK);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return,
            _ = sweep.tick() => {
                forwarder.sweep_lost_takers();
                continue;
            }
            message = ends.next() => message,
        };
        let Some(message) = message else { return };
        match wire::decode_ends(&message.payload) {
            Ok(ends) => {
                let mut waiting = forwarder.waiting();
                for (forward, end) in ends {
                    if let Some(waiting) = waiting.remove(&forward) {
                        let _ = waiting.ended.send(end);
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "cluster: unreadable outcomes dropped"),
        }
    }
}

/// Wakes the dispatches parked on a pool when a node announces a free slot there, until
/// `stop`.
pub(crate) async fn follow_capacity(forwarder: Arc<Forwarder>, stop: CancellationToken) {
    let subject = forwarder.names.all_capacity();
    let mut announcements = match forwarder.client.subscribe(subject.clone()).await {
        Ok(announcements) => announcements,
        Err(error) => {
            tracing::warn!(%subject, %error, "cluster: capacity subscription failed");
            return;
        }
    };
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return,
            message = announcements.next() => message,
        };
        let Some(message) = message else { return };
        // The subject's last token is the pool's key in hex (`Names::capacity`).
        if let Some(pool) = message.subject.rsplit('.').next()
            && let Ok(pool) = u64::from_str_radix(pool, 16)
        {
            forwarder.hints.announced(pool);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The origin's bounds as `docs/cluster.md` states them: an answer awaited 2 s, at most 3
    /// offers in a row answered "busy", up to 64 dispatches a request, a parked dispatch
    /// offered again every 5 s.
    #[test]
    fn the_bounds_are_the_documented_ones() {
        assert_eq!(OFFER_TIMEOUT, Duration::from_secs(2));
        assert_eq!(BUSY_RETRIES, 3);
        assert_eq!(OFFER_BATCH, 64);
        assert_eq!(REOFFER_EVERY, Duration::from_secs(5));
        assert_eq!(MAX_OFFERS, 32, "at most 32 offers per dispatch");
        assert_eq!(
            TAKER_CHECK,
            Duration::from_secs(1),
            "takers checked every second"
        );
    }

    fn waiting_on(taker: &str, instance: Option<u64>) -> (Waiting, oneshot::Receiver<RemoteEnd>) {
        let (ended, receiver) = oneshot::channel();
        let taker = Some((taker.to_owned(), instance));
        (Waiting { ended, taker }, receiver)
    }

    #[test]
    fn the_sweep_ends_only_the_forwards_of_a_gone_taker() {
        let ttl = Duration::from_secs(10);
        let start = Instant::now();
        let mut members = Members::default();
        members.seen("a", 1, start);
        members.seen("b", 2, start);
        let mut waiting = HashMap::default();
        let (on_a, _a) = waiting_on("a", Some(1));
        let (on_b, _b) = waiting_on("b", Some(2));
        let (offered, _o) = oneshot::channel();
        waiting.insert(1, on_a);
        waiting.insert(2, on_b);
        waiting.insert(
            3,
            Waiting {
                ended: offered,
                taker: None,
            },
        );
        // Control: every taker is live, nothing ends.
        assert!(lost_takers(&mut waiting, &members, true, ttl, start).is_empty());
        // "b" restarts under its name: its forward ends, "a"'s and the unanswered one stay.
        members.seen("b", 3, start + Duration::from_secs(1));
        let lost = lost_takers(
            &mut waiting,
            &members,
            true,
            ttl,
            start + Duration::from_secs(1),
        );
        let lost: Vec<(u64, String)> = lost.into_iter().map(|(f, t, _)| (f, t)).collect();
        assert_eq!(lost, vec![(2, "b".to_owned())]);
        assert_eq!(waiting.len(), 2);
        // "a" ages out, but only a settled node trusts that.
        let late = start + ttl;
        assert!(lost_takers(&mut waiting, &members, false, ttl, late).is_empty());
        let lost = lost_takers(&mut waiting, &members, true, ttl, late);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].0, 1);
        assert!(
            waiting.contains_key(&3),
            "an offer not yet taken is not swept"
        );
    }
}
