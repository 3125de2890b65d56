//! The taking side: offer subscriptions for the pools with a free slot, and running what
//! another node offers on a local worker.
//!
//! A taker runs an offer batch as one local batch of core ([`Dispatcher::dispatch_local_batch`]):
//! each dispatch of it takes a local worker at once or its answer is "busy" (another offer or a
//! local dispatch got the slot first), with one quota hold, one selection pass and one wait
//! for the whole batch. One answer goes back for the batch after a linger for the delivered
//! ones to end: an end within it rides in the answer, a later one follows on the origin's
//! outcome subject, with the other ends that are ready at the same moment. A cancel from the
//! origin reaches its dispatch by its index in the batch; no dispatch carries a token of its
//! own.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{Client, Message, Request};
use futures::{FutureExt, StreamExt};
use switchyard_core::{ActivityOutcome, BatchCancel, CallerIdentity, Dispatcher, LocalStart};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ClusterConfig;
use crate::leave::{self, Counted};
use crate::members::Members;
use crate::names::{Names, TAKERS};
use crate::slots::{Announcements, Subscriptions, free_slots};
use crate::status::{ClusterStatus, Standing};
use crate::wire::{self, BatchAnswer, CancelMeta, EntryAnswer, RemoteEnd};

/// How often the node looks at its free slots.
const SLOT_SCAN: Duration = Duration::from_millis(50);
/// The least time between two capacity announcements for one pool: a dispatch parked `no
/// capacity in cluster` after an announcement waits up to this long (and a slot scan) for
/// the next one. At 1 s, saturated runs of `bench --cluster 3` had one dispatch in some runs
/// wait 0.46–0.73 s for slots that were free; an announcement is an empty message.
const ANNOUNCE_EVERY: Duration = Duration::from_millis(100);

/// `switchyard_cluster_offer_pools`: pools this node is subscribed to for offers (it has a
/// free slot there, or had one within the hold), not counting one it is leaving.
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
    /// How long a full pool keeps its offer subscription ([`ClusterConfig::offer_hold`]).
    ///
    /// [`ClusterConfig::offer_hold`]: crate::ClusterConfig::offer_hold
    offer_hold: Duration,
    /// The nodes seen in the membership bucket, for how many may be offering to a pool.
    members: Arc<Mutex<Members>>,
    member_ttl: Duration,
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
    /// Each running forward's batch, and its index there.
    running: HashMap<(Arc<str>, u64), (BatchCancel, usize)>,
    early: HashMap<(Arc<str>, u64), Instant>,
}

impl Cancels {
    /// Notes a forwarded dispatch about to run as dispatch `index` of the batch `cancel`
    /// reaches; false when its cancel came first (it must not run).
    fn start(&mut self, key: (Arc<str>, u64), cancel: &BatchCancel, index: usize) -> bool {
        if self.early.remove(&key).is_some() {
            return false;
        }
        self.running.insert(key, (cancel.clone(), index));
        true
    }

    /// The origin asks to cancel `key` at `now`: returns the running dispatch's batch and
    /// index to cancel, or remembers the cancel for an offer still on its way.
    fn cancel(&mut self, key: (Arc<str>, u64), now: Instant) -> Option<(BatchCancel, usize)> {
        let running = self.running.remove(&key);
        if running.is_none() {
            self.early
                .retain(|_, at| now.saturating_duration_since(*at) < EARLY_CANCEL_KEPT);
            self.early.insert(key, now);
        }
        running
    }
}

impl Taker {
    /// The taking side of the node `config` names, over `client`.
    pub(crate) fn new(
        client: Client,
        names: Names,
        config: &ClusterConfig,
        dispatcher: Dispatcher,
        status: ClusterStatus,
        members: Arc<Mutex<Members>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            names,
            node: config.node.clone(),
            dispatcher,
            status,
            offer_hold: config.offer_hold,
            members,
            member_ttl: config.member_ttl,
            cancels: Mutex::new(Cancels::default()),
            busy: Mutex::new(HashSet::new()),
        })
    }

    /// How many nodes are live in the membership view now (this one included once it is seen).
    fn live_nodes(&self) -> usize {
        let members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        members.live(self.member_ttl, Instant::now()).len()
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
    let mut subscriptions = Subscriptions::new(taker.offer_hold);
    // Each pool's offer task, the token that stops it and what its batches see of the pool.
    let mut serving: HashMap<String, (CancellationToken, PoolGroup, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    let mut announcements = Announcements::new(ANNOUNCE_EVERY);
    let mut scan = tokio::time::interval(SLOT_SCAN);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = scan.tick() => {}
        }
        let now = Instant::now();
        // An offer task that ended without being stopped (its subscription refused or
        // closed) is taken again below while its pool has a free slot.
        serving.retain(|pool, (_, _, task)| {
            let ended = task.is_finished();
            if ended {
                subscriptions.ended(pool);
            }
            !ended
        });
        let free = free_slots(&taker.dispatcher.registry().workers());
        let plan = subscriptions.plan(&free, now);
        for pool in plan.unsubscribe {
            if let Some((served, _, _)) = serving.remove(&pool) {
                served.cancel();
            }
        }
        for pool in plan.subscribe {
            let served = stop.child_token();
            let group = PoolGroup::default();
            let serve = serve_pool(
                Arc::clone(&taker),
                pool.clone(),
                served.clone(),
                group.clone(),
            );
            serving.insert(pool, (served, group, tokio::spawn(serve)));
        }
        for (pool, (_, group, _)) in &serving {
            let full = free.get(pool).copied().unwrap_or(0) == 0;
            group.full.store(full, Ordering::Relaxed);
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
    for (served, _, _) in serving.into_values() {
        served.cancel();
    }
}

/// How long a batch that found its pool full waits for the pool's subscription to leave the
/// queue group before it answers "busy" anyway.
const LEAVE_WAIT: Duration = Duration::from_millis(100);

/// One pool's offer subscription as the batches it took see it. A batch that found every
/// slot taken while the last slot scan found the pool full too asks it to leave the queue
/// group, and answers "busy" only once the unsubscribe is queued on the client ahead of that
/// answer: the server then stops routing the pool's offers here after the few already on
/// their way ([`crate::leave`]), so the origin's retries reach the nodes with a free slot
/// (NATS picks a queue group's member at random, and a full member kept for the whole hold
/// would draw each of the origin's retries with odds of one in the group's size). A pool
/// whose slots free and fill between two scans keeps its subscription: leaving and joining
/// again would cost more than the busy answers it saves.
#[derive(Clone, Debug, Default)]
struct PoolGroup {
    asked: CancellationToken,
    left: CancellationToken,
    /// The last slot scan found no free slot in the pool.
    full: Arc<AtomicBool>,
}

impl PoolGroup {
    /// Asks the subscription to leave, when the pool has stayed full since the last scan;
    /// returns once it has left (or after [`LEAVE_WAIT`]), true when the subscription is
    /// leaving (asked now or before).
    async fn leave_when_full(&self) -> bool {
        if self.full.load(Ordering::Relaxed) {
            self.asked.cancel();
            let _ = tokio::time::timeout(LEAVE_WAIT, self.left.cancelled()).await;
        }
        self.asked.is_cancelled()
    }
}

/// Takes offers for one pool until `stop`, until a batch finds the pool full ([`PoolGroup`]),
/// or until the client refuses or closes the subscription ([`follow_slots`] subscribes again
/// while the pool has a free slot). Leaving, it asks the server to stop after the offers that
/// may be on their way and answers those as any other ([`crate::leave`]), instead of
/// dropping them (a dropped offer holds its origin for the offer timeout).
async fn serve_pool(taker: Arc<Taker>, pool: String, stop: CancellationToken, group: PoolGroup) {
    let subject = taker.names.offer(&pool);
    let pool: Arc<str> = Arc::from(pool);
    let mut offers = match taker
        .client
        .queue_subscribe(subject.clone(), TAKERS.to_owned())
        .await
    {
        Ok(offers) => Counted::new(offers, taker.client.clone()),
        Err(error) => {
            tracing::debug!(%subject, %error, "cluster: offer subscription failed");
            return;
        }
    };
    // Counted once the subscription is written to the server, so the gauge says offers can
    // reach this node.
    let _ = taker.client.flush().await;
    let offer_pools = metrics::gauge!(OFFER_POOLS);
    offer_pools.increment(1.0);
    let leave = loop {
        tokio::select! {
            () = stop.cancelled() => break true,
            () = group.asked.cancelled() => break true,
            offer = offers.next() => match offer {
                Some(offer) => {
                    let take = take(Arc::clone(&taker), Arc::clone(&pool), offer, group.clone());
                    tokio::spawn(take);
                }
                None => {
                    tracing::debug!(%subject, "cluster: offer subscription closed");
                    break false;
                }
            },
        }
    };
    offer_pools.decrement(1.0);
    // Leaving, for whichever reason: the offers that still come are passed on when full.
    group.asked.cancel();
    let margin = leave::margin(taker.live_nodes());
    if leave && offers.leave(margin).await.is_ok() {
        group.left.cancel();
        // The offers still on their way here are answered as any other; the subscription
        // ends after the last of them (or the tail), and a free slot subscribes again
        // meanwhile.
        tokio::spawn(async move {
            while let Some(offer) = offers.next().await {
                tokio::spawn(take(
                    Arc::clone(&taker),
                    Arc::clone(&pool),
                    offer,
                    group.clone(),
                ));
            }
        });
    } else {
        group.left.cancel();
    }
}

/// Answers one offer batch and sends the ends of the dispatches it took to the origin: in
/// the answer for those that end within [`ANSWER_LINGER`] of the delivery (no message of
/// their own), the others on the origin's outcome subject, batched with the ends ready at the
/// same moment.
///
/// The batch runs as one [`LocalBatch`]: every dispatch of it is delivered to a local worker
/// or turned away before this task first waits, so the answer waits only for the linger.
async fn take(taker: Arc<Taker>, pool: Arc<str>, offer: Message, group: PoolGroup) {
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
    // An offer another node passed on is not passed on again: a batch makes at most one
    // extra hop, however many nodes are leaving.
    let passed_on = offer
        .headers
        .as_ref()
        .is_some_and(|headers| headers.get(PASSED_ON).is_some());
    let origin: Arc<str> = Arc::from(header.origin.as_str());
    let forwards: Vec<u64> = entries.iter().map(|entry| entry.forward).collect();
    let mut answers = vec![EntryAnswer::Busy; forwards.len()];
    // The offer's index of each dispatch of the local batch (those not cancelled first).
    let mut offered: Vec<usize> = Vec::with_capacity(forwards.len());
    let mut local = Vec::with_capacity(forwards.len());
    let cancel = BatchCancel::default();
    {
        let mut cancels = taker.cancels();
        for (index, entry) in entries.into_iter().enumerate() {
            let key = (Arc::clone(&origin), entry.forward);
            if cancels.start(key, &cancel, offered.len()) {
                offered.push(index);
                local.push(wire::offered_entry(entry));
            }
        }
    }
    let finished = |taker: &Taker, index: usize| {
        if let Some(forward) = offered.get(index).and_then(|index| forwards.get(*index)) {
            taker
                .cancels()
                .running
                .remove(&(Arc::clone(&origin), *forward));
        }
    };
    let mut batch = if local.is_empty() {
        None
    } else {
        let caller = CallerIdentity::trusted(format!("cluster:{}", header.origin));
        let pool = wire::offered_pool(&header);
        match (taker.dispatcher).dispatch_local_batch(&caller, pool, local, cancel) {
            Ok(batch) => Some(batch),
            Err(error) => {
                tracing::debug!(%error, "cluster: offered batch refused here");
                None
            }
        }
    };
    let mut missed = batch.is_none() && !offered.is_empty();
    let mut took_any = false;
    for (index, offer_index) in offered.iter().enumerate() {
        let taken = batch.as_ref().and_then(|batch| batch.starts().get(index))
            == Some(&LocalStart::Delivered);
        took_any |= taken;
        if taken {
            if let Some(answer) = answers.get_mut(*offer_index) {
                *answer = EntryAnswer::Taken;
            }
        } else {
            missed = true;
            finished(&taker, index);
        }
    }
    if missed {
        // Full here and leaving the queue group: the offer goes back to the group and the
        // origin hears from the node that takes it ([`pass_on`]). Not when a cancel came
        // first for one of its dispatches (that one is answered "busy"), nor when another
        // node passed it on already.
        if !took_any
            && !passed_on
            && group.leave_when_full().await
            && offered.len() == forwards.len()
        {
            pass_on(&taker, &pool, reply, offer.payload, &forwards).await;
            return;
        }
        taker.answered_busy(&pool);
    }
    // The linger: ends within it ride in the answer.
    if let Some(batch) = batch.as_mut().filter(|batch| batch.running() > 0) {
        let linger = tokio::time::sleep(ANSWER_LINGER);
        tokio::pin!(linger);
        loop {
            tokio::select! {
                () = &mut linger => break,
                ended = batch.next() => {
                    let Some((index, outcome)) = ended else { break };
                    finished(&taker, index);
                    if let Some(answer) = offered.get(index).and_then(|i| answers.get_mut(*i)) {
                        *answer = EntryAnswer::Ended(remote_end(outcome));
                    }
                }
            }
        }
    }
    answer.entries = forwards.iter().copied().zip(answers).collect();
    let (body, late) = wire::encode_answers_bounded(answer);
    let _ = taker.client.publish(reply, body).await;
    let outcome = taker.names.outcome(&header.origin);
    send_ends(&taker, &outcome, &late).await;
    let Some(mut batch) = batch else { return };
    while let Some((index, end)) = batch.next().await {
        let mut ends = Vec::new();
        let mut push = |index: usize, end: ActivityOutcome| {
            finished(&taker, index);
            if let Some(forward) = offered.get(index).and_then(|i| forwards.get(*i)) {
                ends.push((*forward, remote_end(end)));
            }
        };
        push(index, end);
        while let Some(Some((index, end))) = batch.next().now_or_never() {
            push(index, end);
        }
        send_ends(&taker, &outcome, &ends).await;
    }
}

/// The header a node passing an offer on sets (to its own name): the node that draws it
/// answers it and never passes it on again ([`pass_on`]).
const PASSED_ON: &str = "Switchyard-Passed-On";

/// How long a node that is leaving waits for the answer to an offer it passed on: less than
/// the origin's own offer timeout, so a "busy" still reaches the origin in time.
const PASS_ON_TIMEOUT: Duration = Duration::from_secs(1);

/// Offers a batch drawn by a node that is leaving to the pool's queue group again, and relays
/// the answer (naming the node that took it) to the origin: the origin hears from a node with
/// a free slot instead of spending one of its "busy" tries here. A leaving subscription is
/// drawn at most its leave margin more times ([`crate::leave`]), and the offer goes out marked
/// [`PASSED_ON`]: whoever draws it (this node included, while it is still in the group)
/// answers it, "busy" if full, so a batch makes one extra hop at most. Nobody left to take it: "busy" for every forward, as this node
/// would have answered. No answer within [`PASS_ON_TIMEOUT`]: none is relayed, so the origin
/// treats the offer as unanswered (someone may have taken it), as for a lost answer.
async fn pass_on(
    taker: &Taker,
    pool: &str,
    reply: async_nats::Subject,
    offer: bytes::Bytes,
    forwards: &[u64],
) {
    let subject = taker.names.offer(pool);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(PASSED_ON, taker.node.as_str());
    let request = Request::new()
        .headers(headers)
        .payload(offer)
        .timeout(Some(PASS_ON_TIMEOUT));
    let answer = match taker.client.send_request(subject, request).await {
        Ok(answer) => answer.payload,
        Err(error) if error.kind() == RequestErrorKind::NoResponders => {
            taker.answered_busy(pool);
            wire::encode_answers(&BatchAnswer {
                taker: taker.node.clone(),
                entries: forwards.iter().map(|f| (*f, EntryAnswer::Busy)).collect(),
            })
        }
        Err(error) => {
            tracing::debug!(%error, "cluster: an offer passed on was not answered");
            return;
        }
    };
    let _ = taker.client.publish(reply, answer).await;
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
fn remote_end(outcome: ActivityOutcome) -> RemoteEnd {
    match outcome {
        // A local-only dispatch that ends unserved after its delivery lost its worker and
        // found no other here: the origin offers it again.
        ActivityOutcome::Unserved { .. } => RemoteEnd::Lost,
        outcome => RemoteEnd::Outcome(outcome),
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
        let running = taker
            .cancels()
            .cancel((Arc::from(meta.origin), meta.forward), Instant::now());
        if let Some((batch, index)) = running {
            batch.cancel(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The taker's timings as `docs/cluster.md` states them: slots looked at every 50 ms, an
    /// offer subscription kept 0.5 s after the pool fills, at most one capacity announcement
    /// per 100 ms per pool, a 5 ms linger before an answer, an early cancel kept 30 s.
    #[test]
    fn the_timings_are_the_documented_ones() {
        assert_eq!(SLOT_SCAN, Duration::from_millis(50));
        assert_eq!(crate::DEFAULT_OFFER_HOLD, Duration::from_millis(500));
        assert_eq!(ANNOUNCE_EVERY, Duration::from_millis(100));
        assert_eq!(ANSWER_LINGER, Duration::from_millis(5));
        assert_eq!(EARLY_CANCEL_KEPT, Duration::from_secs(30));
    }

    async fn next_answer(answers: &mut async_nats::Subscriber) -> BatchAnswer {
        let message = tokio::time::timeout(Duration::from_secs(5), answers.next())
            .await
            .expect("answered")
            .expect("inbox open");
        wire::decode_answers(&message.payload).expect("an answer")
    }

    /// A taker node `n1` on a real NATS server whose pool `p` is full and has left its offer
    /// group, and an origin's inbox its answers reach.
    struct FullAndLeaving {
        taker: Arc<Taker>,
        names: Names,
        client: async_nats::Client,
        inbox: String,
        answers: async_nats::Subscriber,
        /// One offer of forward 7 from origin `n9`.
        body: bytes::Bytes,
        group: PoolGroup,
    }

    impl FullAndLeaving {
        const POOL: &str = "p";

        async fn start(nats: &switchyard_test_support::NatsServer) -> Self {
            use switchyard_core::{DispatchConfig, Registry};

            use crate::wire::{OfferEntry, OfferHeader};

            let names = Names::new("c");
            let client = async_nats::connect(nats.url()).await.expect("connects");
            let status = ClusterStatus::new("n1");
            status.set(Standing::Joined);
            let taker = Taker::new(
                client.clone(),
                names.clone(),
                &ClusterConfig::new(nats.url(), "c", "n1"),
                Dispatcher::new(Registry::default(), DispatchConfig::default()),
                status,
                Arc::new(Mutex::new(Members::default())),
            );
            let inbox = client.new_inbox();
            let answers = client.subscribe(inbox.clone()).await.expect("subscribes");
            client.flush().await.expect("flushes");
            let body = wire::encode_offers(
                &OfferHeader {
                    origin: "n9".to_owned(),
                    namespace: "ns".to_owned(),
                    task_queue: "q".to_owned(),
                    activity_type: "a".to_owned(),
                    node: None,
                },
                &[OfferEntry {
                    forward: 7,
                    timeout_ms: 10_000,
                    attempt_offset: 0,
                    input: bytes::Bytes::new(),
                }],
            );
            // Full since the last scan (no worker here at all), and already left.
            let group = PoolGroup::default();
            group.full.store(true, Ordering::Relaxed);
            group.left.cancel();
            Self {
                taker,
                names,
                client,
                inbox,
                answers,
                body,
                group,
            }
        }

        /// The node draws the offer, with `headers`, and deals with it.
        async fn take(&self, headers: Option<async_nats::HeaderMap>) {
            let offer = Message {
                subject: self.names.offer(Self::POOL).into(),
                reply: Some(self.inbox.clone().into()),
                payload: self.body.clone(),
                headers,
                status: None,
                description: None,
                length: 0,
            };
            take(
                Arc::clone(&self.taker),
                Arc::from(Self::POOL),
                offer,
                self.group.clone(),
            )
            .await;
        }
    }

    /// A node whose pool is full and leaving the group passes an offer it draws on to the
    /// group, marked, and relays the answer of the member that took it; an offer already
    /// passed on it answers "busy" itself (a batch makes one extra hop at most). The first
    /// offer is the control: the same offer without the mark goes to the other member.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_leaving_node_passes_an_offer_on_once_and_relays_the_answer() {
        let Some(nats) = switchyard_test_support::NatsServer::start() else {
            return;
        };
        let mut node = FullAndLeaving::start(&nats).await;
        let pool = FullAndLeaving::POOL;
        // Another member of the pool's group, with room: it takes every forward, and notes
        // who passed each offer on.
        let other = async_nats::connect(nats.url()).await.expect("connects");
        let mut drawn = other
            .queue_subscribe(node.names.offer(pool), TAKERS.to_owned())
            .await
            .expect("subscribes");
        other.flush().await.expect("flushes");
        let (seen, mut passed_by) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            while let Some(offer) = drawn.next().await {
                let by = offer
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get(PASSED_ON))
                    .map(ToString::to_string);
                let (_, entries) = wire::decode_offers(&offer.payload).expect("an offer");
                let answer = BatchAnswer {
                    taker: "n2".to_owned(),
                    entries: entries
                        .iter()
                        .map(|e| (e.forward, EntryAnswer::Taken))
                        .collect(),
                };
                let reply = offer.reply.expect("a request");
                let _ = seen.send(by).await;
                other
                    .publish(reply, wire::encode_answers(&answer))
                    .await
                    .expect("answers");
            }
        });
        // The other member's subscription has reached the server once it answers a probe
        // (a flush only writes it out).
        let mut probes = 0;
        while node
            .client
            .request(node.names.offer(pool), node.body.clone())
            .await
            .is_err()
        {
            probes += 1;
            assert!(probes < 1_000, "the other member never subscribed");
        }
        assert_eq!(passed_by.recv().await, Some(None), "a probe is not marked");
        node.take(None).await;
        let relayed = next_answer(&mut node.answers).await;
        assert_eq!(
            relayed.taker, "n2",
            "passed on, and the taker's answer relayed"
        );
        assert_eq!(relayed.entries, vec![(7, EntryAnswer::Taken)]);
        assert_eq!(
            passed_by.recv().await.flatten().as_deref(),
            Some("n1"),
            "marked"
        );

        let mut marked = async_nats::HeaderMap::new();
        marked.insert(PASSED_ON, "n3");
        node.take(Some(marked)).await;
        let own = next_answer(&mut node.answers).await;
        assert_eq!(own.taker, "n1", "answered here, not passed on again");
        assert_eq!(own.entries, vec![(7, EntryAnswer::Busy)]);
        assert!(
            passed_by.try_recv().is_err(),
            "the other member was not asked"
        );
    }

    /// A node whose pool is full and leaving, alone in the group, finds nobody to pass an offer
    /// on to (NATS's no-responders) and answers "busy" for it itself, as it would have
    /// without passing on: the origin is not left to its offer timeout. Without that answer
    /// the origin's inbox hears nothing and `next_answer` fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_leaving_node_alone_in_the_group_answers_busy_itself() {
        let Some(nats) = switchyard_test_support::NatsServer::start() else {
            return;
        };
        let mut node = FullAndLeaving::start(&nats).await;
        node.take(None).await;
        let answer = next_answer(&mut node.answers).await;
        assert_eq!(answer.taker, "n1");
        assert_eq!(answer.entries, vec![(7, EntryAnswer::Busy)]);
        assert!(
            node.taker.take_busy().contains(FullAndLeaving::POOL),
            "the busy answer is noted for the pool"
        );
    }

    #[test]
    fn a_cancel_before_its_offer_stops_the_offer_from_running() {
        let now = Instant::now();
        let batch = BatchCancel::default();
        let mut cancels = Cancels::default();
        assert!(
            cancels.cancel(("a".into(), 1), now).is_none(),
            "nothing runs yet"
        );
        assert!(
            !cancels.start(("a".into(), 1), &batch, 0),
            "cancelled first"
        );
        // Control: another forward runs, and its cancel names its place in its batch.
        assert!(cancels.start(("a".into(), 2), &batch, 0));
        let (_, index) = cancels.cancel(("a".into(), 2), now).expect("running");
        assert_eq!(index, 0);
        // Two forwards of one batch: a cancel of one names that one only.
        assert!(cancels.start(("a".into(), 4), &batch, 1));
        assert!(cancels.start(("a".into(), 5), &batch, 2));
        let (_, index) = cancels.cancel(("a".into(), 5), now).expect("running");
        assert_eq!(index, 2, "only the named forward stops");
        assert!(cancels.running.contains_key(&("a".into(), 4)));
        // An early cancel is forgotten after a while.
        cancels.cancel(("a".into(), 3), now);
        cancels.cancel(("b".into(), 9), now + EARLY_CANCEL_KEPT);
        assert!(cancels.start(("a".into(), 3), &batch, 3));
    }
}
