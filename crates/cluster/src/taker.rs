//! The taking side: offer subscriptions for the pools with a free slot, and running what
//! another node offers on a local worker.
//!
//! A taker runs each dispatch of an offer batch as a `local_only` dispatch: a local worker
//! takes it at once or its answer is "busy" (another offer or a local dispatch got the slot
//! first). One answer goes back for the whole batch once every dispatch of it is delivered or
//! turned away, after a linger for the delivered ones to end: an end within it rides in the
//! answer, a later one follows on the origin's outcome subject, with the other ends that are
//! ready at the same moment.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::{Client, Message};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use switchyard_core::{ActivityOutcome, CallerIdentity, DispatchHooks, Dispatcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::names::{Names, TAKERS};
use crate::slots::{Announcements, Subscriptions, free_slots};
use crate::status::{ClusterStatus, Standing};
use crate::wire::{self, BatchAnswer, CancelMeta, EntryAnswer, RemoteEnd};

/// How often the node looks at its free slots.
const SLOT_SCAN: Duration = Duration::from_millis(50);
/// How long a pool stays full before its offer subscription goes.
const SUBSCRIPTION_HOLD: Duration = Duration::from_millis(500);
/// The fewest seconds between two capacity announcements for one pool.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// `switchyard_cluster_offer_pools`: pools this node is subscribed to for offers (it has a
/// free slot there, or had one within the hold).
pub const OFFER_POOLS: &str = "switchyard_cluster_offer_pools";

/// How long a taker holds its "taken" after the delivery, for the end to ride in the answer
/// instead of a message of its own. The origin's outcome is never later for it: a task that
/// ends within it is answered with its end, one that runs longer sends its end as before.
const ANSWER_LINGER: Duration = Duration::from_millis(5);

/// What the taking side shares between its tasks.
pub(crate) struct Taker {
    pub(crate) client: Client,
    pub(crate) names: Names,
    pub(crate) node: String,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) status: ClusterStatus,
    /// Forwarded dispatches running here, and cancels that came before their offer.
    cancels: Mutex<Cancels>,
    /// Pools this node answered "busy" for since the last slot scan (it owes them an
    /// announcement, see [`Announcements`]); at most one entry per pool.
    busy: Mutex<HashSet<String>>,
}

/// How long a cancel that found no dispatch is remembered, for an offer still on its way.
const EARLY_CANCEL_KEPT: Duration = Duration::from_secs(30);

/// Forwarded dispatches running here by `(origin, forward id)`, and the cancels that arrived
/// before their offer was handled (an origin that stopped waiting before it heard "taken").
#[derive(Default)]
struct Cancels {
    running: HashMap<(Arc<str>, u64), CancellationToken>,
    early: HashMap<(Arc<str>, u64), Instant>,
}

impl Cancels {
    /// A token for a forwarded dispatch about to run; `None` when its cancel came first.
    fn start(&mut self, key: (Arc<str>, u64)) -> Option<CancellationToken> {
        if self.early.remove(&key).is_some() {
            return None;
        }
        let token = CancellationToken::new();
        self.running.insert(key, token.clone());
        Some(token)
    }

    /// The origin asks to cancel `key` at `now`.
    fn cancel(&mut self, key: (Arc<str>, u64), now: Instant) {
        match self.running.remove(&key) {
            Some(token) => token.cancel(),
            None => {
                self.early
                    .retain(|_, at| now.saturating_duration_since(*at) < EARLY_CANCEL_KEPT);
                self.early.insert(key, now);
            }
        }
    }
}

impl Taker {
    pub(crate) fn new(
        client: Client,
        names: Names,
        node: String,
        dispatcher: Dispatcher,
        status: ClusterStatus,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            names,
            node,
            dispatcher,
            status,
            cancels: Mutex::new(Cancels::default()),
            busy: Mutex::new(HashSet::new()),
        })
    }

    fn cancels(&self) -> std::sync::MutexGuard<'_, Cancels> {
        self.cancels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that an offer for `pool` was answered "busy" because its slots were all taken.
    fn answered_busy(&self, pool: &str) {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !busy.contains(pool) {
            busy.insert(pool.to_owned());
        }
    }

    /// The pools answered "busy" since the last call.
    fn take_busy(&self) -> HashSet<String> {
        std::mem::take(&mut *self.busy.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Keeps one offer subscription per pool with a free slot (with hysteresis), and announces
/// each pool whose free slots rise from zero, until `stop`.
pub(crate) async fn follow_slots(taker: Arc<Taker>, stop: CancellationToken) {
    let mut subscriptions = Subscriptions::new(SUBSCRIPTION_HOLD);
    let mut serving: HashMap<String, CancellationToken> = HashMap::new();
    let mut announcements = Announcements::new(ANNOUNCE_EVERY);
    let mut scan = tokio::time::interval(SLOT_SCAN);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = scan.tick() => {}
        }
        let now = Instant::now();
        let free = free_slots(&taker.dispatcher.registry().workers());
        let plan = subscriptions.plan(&free, now);
        for pool in plan.unsubscribe {
            if let Some(served) = serving.remove(&pool) {
                served.cancel();
            }
        }
        for pool in plan.subscribe {
            let served = stop.child_token();
            serving.insert(pool.clone(), served.clone());
            tokio::spawn(serve_pool(Arc::clone(&taker), pool, served));
        }
        for pool in taker.take_busy() {
            announcements.answered_busy(pool, now);
        }
        for pool in announcements.due(&free, now) {
            let _ = taker
                .client
                .publish(taker.names.capacity(&pool), bytes::Bytes::new())
                .await;
        }
    }
    for served in serving.into_values() {
        served.cancel();
    }
}

/// Takes offers for one pool until `stop`, then unsubscribes.
async fn serve_pool(taker: Arc<Taker>, pool: String, stop: CancellationToken) {
    let subject = taker.names.offer(&pool);
    let pool: Arc<str> = Arc::from(pool);
    let mut offers = match taker
        .client
        .queue_subscribe(subject.clone(), TAKERS.to_owned())
        .await
    {
        Ok(offers) => offers,
        Err(error) => {
            tracing::debug!(%subject, %error, "cluster: offer subscription failed");
            return;
        }
    };
    // Counted once the server has the subscription (a flush is a round trip after it), so the
    // gauge says offers can reach this node.
    let _ = taker.client.flush().await;
    let offer_pools = metrics::gauge!(OFFER_POOLS);
    offer_pools.increment(1.0);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            offer = offers.next() => match offer {
                Some(offer) => {
                    tokio::spawn(take(Arc::clone(&taker), Arc::clone(&pool), offer));
                }
                None => break,
            },
        }
    }
    offer_pools.decrement(1.0);
    let _ = offers.unsubscribe().await;
}

/// Where one dispatch of an offer batch stands on the taker.
#[derive(Debug)]
enum Stage {
    /// Running, not yet delivered to a worker.
    Starting,
    /// Delivered to a worker, still running.
    Delivered,
    /// Not taken here: answered "busy".
    Busy,
    /// Delivered and ended before the answer went out.
    Ended(RemoteEnd),
}

impl Stage {
    /// Marks dispatch `index` delivered; true when it was starting.
    fn deliver(stages: &mut [Self], index: usize) -> bool {
        match stages.get_mut(index) {
            Some(stage @ Self::Starting) => {
                *stage = Self::Delivered;
                true
            }
            _ => false,
        }
    }

    /// The answer for this dispatch once the linger is over.
    fn answer(self) -> EntryAnswer {
        match self {
            Self::Starting | Self::Busy => EntryAnswer::Busy,
            Self::Delivered => EntryAnswer::Taken,
            Self::Ended(end) => EntryAnswer::Ended(end),
        }
    }
}

/// Answers one offer batch and sends the ends of the dispatches it took to the origin: in
/// the answer for those that end within [`ANSWER_LINGER`] of the last delivery (no message of
/// their own), the others on the origin's outcome subject, batched with the ends ready at the
/// same moment.
async fn take(taker: Arc<Taker>, pool: Arc<str>, offer: Message) {
    let Some(reply) = offer.reply.clone() else {
        return;
    };
    let mut answer = BatchAnswer {
        taker: taker.node.clone(),
        entries: Vec::new(),
    };
    let (header, entries) = match wire::decode_offers(&offer.payload) {
        Ok(parsed) if taker.status.standing() == Standing::Joined => parsed,
        Ok((_, entries)) => {
            answer.entries = entries
                .iter()
                .map(|entry| (entry.forward, EntryAnswer::Busy))
                .collect();
            let _ = taker
                .client
                .publish(reply, wire::encode_answers(&answer))
                .await;
            return;
        }
        Err(error) => {
            // An answer naming no forward turns every one of them away.
            tracing::debug!(%error, "cluster: unreadable offer refused");
            let _ = taker
                .client
                .publish(reply, wire::encode_answers(&answer))
                .await;
            return;
        }
    };
    // Shared by the batch's dispatches: one allocation per batch, not one per dispatch.
    let caller = Arc::new(CallerIdentity::trusted(format!(
        "cluster:{}",
        header.origin
    )));
    let origin: Arc<str> = Arc::from(header.origin.as_str());
    let forwards: Vec<u64> = entries.iter().map(|entry| entry.forward).collect();
    let mut stages: Vec<Stage> = Vec::with_capacity(entries.len());
    let (delivered_tx, mut delivered) = mpsc::unbounded_channel::<usize>();
    let mut running = FuturesUnordered::new();
    let mut starting = 0usize;
    {
        let mut cancels = taker.cancels();
        for (index, entry) in entries.iter().enumerate() {
            let key = (Arc::clone(&origin), entry.forward);
            let Some(cancel) = cancels.start(key) else {
                stages.push(Stage::Busy);
                continue;
            };
            stages.push(Stage::Starting);
            starting += 1;
            let delivered_tx = delivered_tx.clone();
            let hooks = DispatchHooks {
                attempt_offset: entry.attempt_offset,
                on_delivered: Some(Arc::new(move |_, _| {
                    let _ = delivered_tx.send(index);
                })),
                cancel: Some(cancel),
                local_only: true,
                ..DispatchHooks::default()
            };
            let request = wire::offered_request(&header, entry);
            let dispatcher = taker.dispatcher.clone();
            let caller = Arc::clone(&caller);
            // Driven here rather than spawned: one task per batch. A panic in a dispatch is
            // caught so the origin still hears of the loss.
            running.push(async move {
                let ended = AssertUnwindSafe(async move {
                    dispatcher.dispatch_with(&caller, request, hooks).await
                })
                .catch_unwind()
                .await;
                (index, remote_end(ended))
            });
        }
    }
    drop(delivered_tx);
    drop(entries);
    let finished = |taker: &Taker, index: usize| {
        if let Some(forward) = forwards.get(index) {
            taker
                .cancels()
                .running
                .remove(&(Arc::clone(&origin), *forward));
        }
    };
    // Until every dispatch is delivered or turned away.
    let mut missed = false;
    while starting > 0 {
        tokio::select! {
            biased;
            Some(index) = delivered.recv() => {
                starting -= usize::from(Stage::deliver(&mut stages, index));
            }
            Some((index, end)) = running.next() => {
                while let Ok(index) = delivered.try_recv() {
                    starting -= usize::from(Stage::deliver(&mut stages, index));
                }
                finished(&taker, index);
                if let Some(stage) = stages.get_mut(index) {
                    *stage = match stage {
                        // Ended before any delivery: a local miss, or refused outright.
                        Stage::Starting => {
                            missed = true;
                            starting -= 1;
                            Stage::Busy
                        }
                        _ => Stage::Ended(end),
                    };
                }
            }
            else => break,
        }
    }
    if missed {
        taker.answered_busy(&pool);
    }
    // The linger: ends within it ride in the answer.
    let linger = tokio::time::sleep(ANSWER_LINGER);
    tokio::pin!(linger);
    while !running.is_empty() {
        tokio::select! {
            () = &mut linger => break,
            Some((index, end)) = running.next() => {
                finished(&taker, index);
                if let Some(stage) = stages.get_mut(index) {
                    *stage = Stage::Ended(end);
                }
            }
        }
    }
    answer.entries = forwards
        .iter()
        .copied()
        .zip(stages.into_iter().map(Stage::answer))
        .collect();
    let (body, late) = wire::encode_answers_bounded(answer);
    let _ = taker.client.publish(reply, body).await;
    let outcome = taker.names.outcome(&header.origin);
    send_ends(&taker, &outcome, &late).await;
    while let Some((index, end)) = running.next().await {
        let mut ends = Vec::new();
        let mut push = |index: usize, end: RemoteEnd| {
            finished(&taker, index);
            if let Some(forward) = forwards.get(index) {
                ends.push((*forward, end));
            }
        };
        push(index, end);
        while let Some(Some((index, end))) = running.next().now_or_never() {
            push(index, end);
        }
        send_ends(&taker, &outcome, &ends).await;
    }
}

/// Sends the ends of forwarded dispatches to their origin's outcome `subject`.
async fn send_ends(taker: &Taker, subject: &str, ends: &[(u64, RemoteEnd)]) {
    for body in wire::encode_ends_bounded(ends) {
        if let Err(error) = taker.client.publish(subject.to_owned(), body).await {
            tracing::warn!(%subject, ends = ends.len(), %error,
                "cluster: outcomes of forwarded dispatches not sent");
        }
    }
}

/// What the origin hears of a delivered dispatch's end.
fn remote_end<E>(ended: Result<Result<ActivityOutcome, E>, Box<dyn Any + Send>>) -> RemoteEnd {
    match ended {
        // A local-only dispatch that ends unserved after its delivery lost its worker and
        // found no other here: the origin offers it again.
        Ok(Ok(ActivityOutcome::Unserved { .. })) => RemoteEnd::Lost,
        Ok(Ok(outcome)) => RemoteEnd::Outcome(outcome),
        Ok(Err(_)) | Err(_) => RemoteEnd::Lost,
    }
}

/// Cancels forwarded dispatches running here when their origin asks (on this node's cancel
/// subject, or the cluster's for a taker the origin never learned), until `stop`.
pub(crate) async fn follow_cancels(taker: Arc<Taker>, stop: CancellationToken) {
    let mut streams = Vec::new();
    for subject in [
        taker.names.cancel(&taker.node),
        taker.names.cancel_unaddressed(),
    ] {
        match taker.client.subscribe(subject.clone()).await {
            Ok(cancels) => streams.push(cancels),
            Err(error) => {
                tracing::warn!(%subject, %error, "cluster: cancel subscription failed");
                return;
            }
        }
    }
    let mut cancels = futures::stream::select_all(streams);
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return,
            message = cancels.next() => message,
        };
        let Some(message) = message else { return };
        let Ok((meta, _)) = wire::unframe::<CancelMeta>(&message.payload) else {
            continue;
        };
        taker
            .cancels()
            .cancel((Arc::from(meta.origin), meta.forward), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_before_its_offer_stops_the_offer_from_running() {
        let now = Instant::now();
        let mut cancels = Cancels::default();
        cancels.cancel(("a".into(), 1), now);
        assert!(cancels.start(("a".into(), 1)).is_none(), "cancelled first");
        // Control: another forward runs, and its cancel fires its token.
        let token = cancels.start(("a".into(), 2)).expect("not cancelled");
        assert!(!token.is_cancelled());
        cancels.cancel(("a".into(), 2), now);
        assert!(token.is_cancelled());
        // Two forwards of one batch: a cancel of one leaves the other running.
        let first = cancels.start(("a".into(), 4)).expect("runs");
        let second = cancels.start(("a".into(), 5)).expect("runs");
        cancels.cancel(("a".into(), 5), now);
        assert!(second.is_cancelled());
        assert!(!first.is_cancelled(), "only the named forward stops");
        // An early cancel is forgotten after a while.
        cancels.cancel(("a".into(), 3), now);
        cancels.cancel(("b".into(), 9), now + EARLY_CANCEL_KEPT);
        assert!(cancels.start(("a".into(), 3)).is_some());
    }
}
