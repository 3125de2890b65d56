//! The offering side: the [`Overflow`] a node installs on its dispatcher.
//!
//! An offer is one NATS request on the pool's offer subject: the queue group hands it to one
//! node subscribed there (only nodes with a free slot are), which answers "taken" or "busy";
//! no subscriber at all is NATS's immediate no-responders, the dispatch's "no taker". A taken
//! dispatch's end arrives on this node's outcome subject, matched by forward id; while it
//! runs, the taker's membership is checked every second, and a taker whose entry aged out
//! counts as lost (the dispatch is offered again within the loss budget).

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
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::members::Members;
use crate::names::{Names, pool_hash};
use crate::status::{ClusterStatus, Standing};
use crate::taker::{BUSY, TAKEN};
use crate::wire::{self, CancelMeta, OfferMeta, RemoteEnd};

/// How long an offer waits for its "taken" or "busy".
const OFFER_TIMEOUT: Duration = Duration::from_secs(2);
/// Offers one dispatch makes in a row while takers answer "busy".
const BUSY_RETRIES: usize = 3;
/// How often a forwarded dispatch checks that its taker is still a member.
const TAKER_CHECK: Duration = Duration::from_secs(1);
/// A parked dispatch offers again at least this often, in case a capacity announcement was
/// lost (NATS restarting, say).
const REOFFER_EVERY: Duration = Duration::from_secs(5);
/// Pools whose capacity announcements are tracked before idle ones are forgotten.
const TRACKED_POOLS: usize = 1024;

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
    waiting: Mutex<HashMap<u64, oneshot::Sender<RemoteEnd>>>,
    /// Per pool hash: woken when a node announces a free slot there.
    capacity: Mutex<HashMap<String, Arc<Notify>>>,
    /// Woken when a node joins.
    joined: Notify,
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
            waiting: Mutex::new(HashMap::new()),
            capacity: Mutex::new(HashMap::new()),
            joined: Notify::new(),
        })
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<RemoteEnd>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pool_notify(&self, pool: &str) -> Arc<Notify> {
        let mut capacity = self.capacity.lock().unwrap_or_else(PoisonError::into_inner);
        if capacity.len() >= TRACKED_POOLS {
            capacity.retain(|_, notify| Arc::strong_count(notify) > 1);
        }
        Arc::clone(capacity.entry(pool.to_owned()).or_default())
    }

    /// A node joined: every parked dispatch may find a taker there.
    pub(crate) fn node_joined(&self) {
        self.joined.notify_waiters();
    }

    /// The process instance holding `node`'s name, as far as the membership view knows.
    fn instance_of(&self, node: &str) -> Option<u64> {
        let members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        members.instance(node)
    }

    /// True when the process of `taker` that took a task (`instance`) is gone: another
    /// process holds the name now, or the entry aged out.
    fn taker_lost(&self, taker: &str, instance: &mut Option<u64>) -> bool {
        let now = Instant::now();
        let members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        if members.replaced(taker, instance) {
            return true;
        }
        // Only a node connected for a whole TTL has seen every live node's refresh.
        self.status.connected_for(self.member_ttl, now)
            && !members.is_live(taker, self.member_ttl, now)
    }

    async fn offer(self: Arc<Self>, offer: OverflowOffer) -> Offered {
        if self.status.standing() != Standing::Joined {
            return Offered::NoTaker;
        }
        let request = &offer.request;
        let pool = pool_hash(
            &request.namespace,
            switchyard_core::normalise_task_queue(&request.task_queue),
            &request.activity_type,
            request.node.as_deref().filter(|n| !n.is_empty()),
        );
        let forward = self.next_forward.fetch_add(1, Ordering::Relaxed);
        let timeout = offer.deadline.saturating_duration_since(Instant::now());
        let meta = OfferMeta {
            forward,
            origin: self.node.clone(),
            namespace: request.namespace.clone(),
            task_queue: request.task_queue.clone(),
            activity_type: request.activity_type.clone(),
            node: request.node.clone(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            attempt_offset: offer.attempt_offset,
        };
        let body = wire::encode_offer(&meta, &request.input);
        let (ended_tx, ended) = oneshot::channel();
        self.waiting().insert(forward, ended_tx);
        let mut watch = ForwardWatch {
            forwarder: Arc::clone(&self),
            forward,
            taker: None,
            unanswered: false,
        };
        let subject = self.names.offer(&pool);
        for _ in 0..BUSY_RETRIES {
            watch.unanswered = true;
            let asked = self
                .client
                .send_request(
                    subject.clone(),
                    Request::new()
                        .payload(body.clone())
                        .timeout(Some(OFFER_TIMEOUT)),
                )
                .await;
            let answer = match asked {
                Ok(answer) => answer,
                Err(error) if error.kind() == RequestErrorKind::NoResponders => {
                    watch.unanswered = false;
                    break;
                }
                // A lost or late answer may hide a taker: dropping the watch cancels it.
                Err(error) => {
                    tracing::debug!(%error, "cluster: offer unanswered");
                    break;
                }
            };
            watch.unanswered = false;
            if let Some(taker) = answer.payload.strip_prefix(TAKEN) {
                let taker = String::from_utf8_lossy(taker).trim().to_owned();
                watch.taker = Some(taker);
                return Offered::Taken(Box::pin(watch.wait(ended)));
            }
            if answer.payload.as_ref() != BUSY {
                break;
            }
        }
        Offered::NoTaker
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
    async fn wait(mut self, mut ended: oneshot::Receiver<RemoteEnd>) -> Forwarded {
        let taker = self.taker.clone().unwrap_or_default();
        // The process that answered "taken" is the one the view holds now: a successor under
        // its name can only write after its entry aged out.
        let mut instance = self.forwarder.instance_of(&taker);
        let mut check = tokio::time::interval(TAKER_CHECK);
        check.tick().await;
        loop {
            tokio::select! {
                end = &mut ended => {
                    self.taker = None;
                    return match end {
                        Ok(RemoteEnd::Outcome(outcome)) => Forwarded::Outcome(outcome),
                        Ok(RemoteEnd::Lost) | Err(_) => Forwarded::Lost,
                    };
                }
                _ = check.tick() => {
                    if self.forwarder.taker_lost(&taker, &mut instance) {
                        tracing::info!(%taker, forward = self.forward,
                            "cluster: the node holding a forwarded dispatch left; offering again");
                        self.taker = None;
                        return Forwarded::Lost;
                    }
                }
            }
        }
    }
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

    fn offer(&self, offer: OverflowOffer) -> OverflowFuture<Offered> {
        Box::pin(Arc::clone(&self.0).offer(offer))
    }

    fn capacity_hint(&self, request: &ActivityRequest) -> OverflowFuture<()> {
        let pool = pool_hash(
            &request.namespace,
            switchyard_core::normalise_task_queue(&request.task_queue),
            &request.activity_type,
            request.node.as_deref().filter(|n| !n.is_empty()),
        );
        let forwarder = Arc::clone(&self.0);
        let notify = forwarder.pool_notify(&pool);
        Box::pin(async move {
            tokio::select! {
                () = notify.notified() => {}
                () = forwarder.joined.notified() => {}
                () = tokio::time::sleep(REOFFER_EVERY) => {}
            }
        })
    }
}

/// Routes the ends of forwarded dispatches to their waiting dispatch, until `stop`.
pub(crate) async fn follow_outcomes(forwarder: Arc<Forwarder>, stop: CancellationToken) {
    let subject = forwarder.names.outcome(&forwarder.node);
    let mut ends = match forwarder.client.subscribe(subject.clone()).await {
        Ok(ends) => ends,
        Err(error) => {
            tracing::warn!(%subject, %error, "cluster: outcome subscription failed");
            return;
        }
    };
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return,
            message = ends.next() => message,
        };
        let Some(message) = message else { return };
        match wire::decode_end(&message.payload) {
            Ok((forward, end)) => {
                if let Some(waiting) = forwarder.waiting().remove(&forward) {
                    let _ = waiting.send(end);
                }
            }
            Err(error) => tracing::debug!(%error, "cluster: unreadable outcome dropped"),
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
        if let Some(pool) = message.subject.rsplit('.').next() {
            let notify = forwarder
                .capacity
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(pool)
                .cloned();
            if let Some(notify) = notify {
                notify.notify_waiters();
            }
        }
    }
}
