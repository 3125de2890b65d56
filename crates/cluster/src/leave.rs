//! Leaving a pool's offer group without dropping an offer already on its way.
//!
//! The NATS client's own `drain` forgets a subscription as soon as its unsubscribe is written,
//! while the server may still be delivering messages it routed there before it read the
//! unsubscribe: the client drops those, and an offer dropped so holds its origin for the whole
//! offer timeout (seen as one dispatch in several saturated bench runs waiting 2.0 s, right
//! after a taker left). So a taker leaves by count instead: it asks the server to stop after
//! `margin` more messages than it has read, and the client keeps the subscription up to that
//! same count, so both ends stop at the same message and none is dropped, as long as no more
//! than `margin` were on their way ([`margin`]: every origin keeps at most
//! [`MAX_IN_FLIGHT`] offers out per pool). The offers that still come are answered as any
//! other. A pool that draws fewer than `margin` more offers within [`LEAVE_TAIL`] is then left
//! at once (an offer on its way at that moment is the only one that can be dropped).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::{Client, Message, Statistics, Subscriber};
use futures::StreamExt;
use tokio::time::Instant;

use crate::offers::MAX_IN_FLIGHT;

/// The longest a subscription that is leaving keeps taking offers before it is dropped.
pub(crate) const LEAVE_TAIL: Duration = Duration::from_secs(1);

/// How many offers may be on their way to one node's subscription of a pool while `nodes`
/// nodes offer there: [`MAX_IN_FLIGHT`] from each of them (this one included, as it may offer
/// to the pool while its own workers are busy). At least two nodes are counted, so a node not
/// yet in this node's membership view is covered too.
pub(crate) fn margin(nodes: usize) -> u64 {
    u64::try_from(MAX_IN_FLIGHT.saturating_mul(nodes.max(2))).unwrap_or(u64::MAX)
}

/// A queue subscription that counts what it delivered, so it can leave by count.
pub(crate) struct Counted {
    subscriber: Subscriber,
    client: Client,
    /// The client's statistics, read for its connection count (one atomic load).
    statistics: Arc<Statistics>,
    /// The client's connection count when it subscribed.
    subscribed_at: u64,
    read: u64,
    tail: Duration,
    leaving: Option<Leaving>,
}

/// A leave asked of a [`Counted`] subscription.
struct Leaving {
    since: Instant,
    /// The message the client and the server both stop after.
    last: u64,
    /// The client's connection count when the leave was asked: a reconnect since then
    /// subscribed again without the count ([`Counted::next`]).
    connects: u64,
    /// Unsubscribed at once, after a reconnect.
    cut: bool,
}

impl Counted {
    /// Wraps a subscription of `client` nothing has been read from yet.
    pub(crate) fn new(subscriber: Subscriber, client: Client) -> Self {
        let statistics = client.statistics();
        Self {
            subscriber,
            subscribed_at: statistics.connects.load(Ordering::Relaxed),
            statistics,
            client,
            read: 0,
            tail: LEAVE_TAIL,
            leaving: None,
        }
    }

    /// The same subscription with another tail (a test outlasting a server restart).
    #[cfg(test)]
    fn with_tail(mut self, tail: Duration) -> Self {
        self.tail = tail;
        self
    }

    /// How many times the client has connected (the first time included).
    fn connects(&self) -> u64 {
        self.statistics.connects.load(Ordering::Relaxed)
    }

    /// The next message; `None` once the subscription has ended (closed by the client, or
    /// left: its last message delivered, or the tail ([`LEAVE_TAIL`]) passed since
    /// [`leave`](Self::leave)).
    ///
    /// A reconnect while leaving: the client subscribes again without the count, so the server
    /// would go on routing offers here, while the client still forgets the subscription at the
    /// count without telling the server (offers routed to it afterwards are dropped, until the
    /// next reconnect). So the subscription is unsubscribed at once (the messages the client
    /// already holds are still read), and one that reached its count after a reconnect, whose
    /// server side may have outlived it, makes the client reconnect once more.
    pub(crate) async fn next(&mut self) -> Option<Message> {
        let connects = self.connects();
        let Some(leaving) = &mut self.leaving else {
            let message = self.subscriber.next().await;
            if message.is_some() {
                self.read = self.read.saturating_add(1);
            }
            return message;
        };
        let reconnected = connects != leaving.connects;
        if reconnected && !leaving.cut {
            leaving.cut = true;
            tracing::debug!(
                "cluster: reconnected while leaving an offer group; unsubscribing at once"
            );
            let _ = self.subscriber.unsubscribe().await;
        }
        let tail = tokio::time::sleep_until(leaving.since + self.tail);
        let message = tokio::select! {
            // A message already delivered is read before the tail can end.
            biased;
            message = self.subscriber.next() => message,
            () = tail => None,
        };
        if message.is_some() {
            self.read = self.read.saturating_add(1);
        } else if reconnected && self.read >= leaving.last {
            // Ended by the count after a reconnect: the server may still hold it.
            leaving.connects = connects;
            tracing::warn!(
                "cluster: an offer subscription ended by count after a reconnect; reconnecting so the server forgets it"
            );
            let _ = self.client.force_reconnect().await;
        }
        message
    }

    /// Asks the server to stop delivering after `margin` more messages than were read; the
    /// messages still to come are read with [`next`](Self::next) until it returns `None`.
    /// Returns once the unsubscribe is queued on the client (ahead of anything published
    /// after it). An error means the client is gone: the subscription has ended.
    pub(crate) async fn leave(&mut self, margin: u64) -> Result<(), async_nats::UnsubscribeError> {
        if self.leaving.is_some() {
            return Ok(());
        }
        let last = self.read.saturating_add(margin.max(1));
        let connects = self.connects();
        // A reconnect since subscribing restarted the server's count at the re-subscription
        // while the client's runs from the start: the two would not stop at the same
        // message, so such a subscription is cut at once.
        let cut = connects != self.subscribed_at;
        self.leaving = Some(Leaving {
            since: Instant::now(),
            last,
            connects,
            cut,
        });
        if cut {
            tracing::debug!(
                "cluster: leaving an offer group after a reconnect; unsubscribing at once"
            );
            self.subscriber.unsubscribe().await
        } else {
            self.subscriber.unsubscribe_after(last).await
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_nats::client::RequestErrorKind;
    use bytes::Bytes;
    use switchyard_test_support::NatsServer;
    use tokio::task::JoinSet;

    use super::*;

    const SUBJECT: &str = "leave.test";
    const GROUP: &str = "takers";

    /// What became of the requests sent while a member left.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Heard {
        answered: usize,
        no_responders: usize,
        timed_out: usize,
    }

    /// `origins` requesters keep `MAX_IN_FLIGHT` requests each out on the group's subject
    /// (as origins keep their offers out) until `stop`; each request waits up to 2 s.
    async fn requests(url: String, origins: usize, stop: Arc<AtomicBool>) -> Heard {
        let mut senders = JoinSet::new();
        for _ in 0..origins * MAX_IN_FLIGHT {
            let url = url.clone();
            let stop = Arc::clone(&stop);
            senders.spawn(async move {
                let client = async_nats::connect(url).await.expect("requester connects");
                let mut heard = Heard::default();
                while !stop.load(Ordering::Relaxed) {
                    let request = async_nats::Request::new()
                        .payload(Bytes::from_static(b"offer"))
                        .timeout(Some(Duration::from_secs(2)));
                    match client.send_request(SUBJECT, request).await {
                        Ok(_) => heard.answered += 1,
                        Err(error) if error.kind() == RequestErrorKind::NoResponders => {
                            heard.no_responders += 1;
                        }
                        Err(_) => heard.timed_out += 1,
                    }
                }
                heard
            });
        }
        let mut all = Heard::default();
        for heard in senders.join_all().await {
            all.answered += heard.answered;
            all.no_responders += heard.no_responders;
            all.timed_out += heard.timed_out;
        }
        all
    }

    /// One member of the group, answering every message, leaving after `before` of them;
    /// returns how many it answered in all.
    async fn member(client: async_nats::Client, before: u64, margin: u64) -> u64 {
        let subscriber = client
            .queue_subscribe(SUBJECT, GROUP.to_owned())
            .await
            .expect("subscribes");
        let mut offers = Counted::new(subscriber, client.clone());
        let mut answered = 0;
        while let Some(message) = offers.next().await {
            if let Some(reply) = message.reply {
                client.publish(reply, Bytes::new()).await.expect("answers");
                answered += 1;
            }
            if answered == before {
                offers.leave(margin).await.expect("leaves");
            }
        }
        answered
    }

    /// Two members take turns leaving and joining again while requests keep flowing: every
    /// request is answered or (with nobody in the group) told "no responders", and none waits
    /// out its timeout. With the client's `drain` in place of the counted leave, the same
    /// run loses offers on their way to the member that left (seen: requests timing out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_that_leaves_by_count_drops_no_request_on_its_way() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flow = tokio::spawn(requests(nats.url(), 2, Arc::clone(&stop)));
        let client = async_nats::connect(nats.url())
            .await
            .expect("member connects");
        let steady = tokio::spawn(member(client.clone(), u64::MAX, margin(2)));
        let mut left = 0;
        for round in 0..20 {
            let answered = tokio::time::timeout(
                Duration::from_secs(10),
                member(client.clone(), 50 + round, margin(2)),
            )
            .await
            .expect("the member's subscription ends after it leaves");
            // Everything it drew before leaving, and at most its margin after.
            assert!(
                (50 + round..=50 + round + margin(2)).contains(&answered),
                "it answered {answered}"
            );
            left += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let heard = tokio::time::timeout(Duration::from_secs(10), flow)
            .await
            .expect("the requesters stop")
            .expect("requesters");
        steady.abort();
        assert_eq!(left, 20);
        assert!(
            heard.answered > 1_000,
            "requests flowed throughout: {heard:?}"
        );
        assert_eq!(heard.timed_out, 0, "{heard:?}");
    }

    /// The last member of a group leaving by count is drawn exactly its margin more times
    /// (the server stops at the same count as the client) and the next request hears "no
    /// responders" at once rather than waiting out its timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_member_leaving_is_drawn_its_margin_more_times_then_nobody_is() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        let member = async_nats::connect(nats.url())
            .await
            .expect("member connects");
        let subscriber = member
            .queue_subscribe(SUBJECT, GROUP.to_owned())
            .await
            .expect("subscribes");
        member.flush().await.expect("flushes");
        // The member's client outlives its subscription, as a node's does.
        let answers = member.clone();
        let answering = tokio::spawn(async move {
            let mut offers = Counted::new(subscriber, answers.clone());
            let mut drawn = 0;
            while let Some(message) = offers.next().await {
                drawn += 1;
                if drawn == 1 {
                    offers.leave(margin(1)).await.expect("leaves");
                }
                let reply = message.reply.expect("a request");
                answers.publish(reply, Bytes::new()).await.expect("answers");
            }
            drawn
        });
        let requester = async_nats::connect(nats.url())
            .await
            .expect("requester connects");
        let mut answered = 0;
        let last = loop {
            let request = async_nats::Request::new()
                .payload(Bytes::from_static(b"offer"))
                .timeout(Some(Duration::from_secs(5)));
            match requester.send_request(SUBJECT, request).await {
                Ok(_) if answered <= margin(1) => answered += 1,
                other => break other,
            }
        };
        assert!(
            matches!(&last, Err(error) if error.kind() == RequestErrorKind::NoResponders),
            "{last:?}"
        );
        assert_eq!(
            answered,
            1 + margin(1),
            "drawn once, then its margin more times"
        );
        let drawn = answering.await.expect("the member's subscription ends");
        assert_eq!(drawn, answered);
    }

    /// A client that counts its connections on `connected` (the first one included).
    async fn counting_client(
        url: String,
    ) -> (async_nats::Client, tokio::sync::watch::Receiver<u32>) {
        let (connected, connections) = tokio::sync::watch::channel(0_u32);
        let client = async_nats::ConnectOptions::new()
            .event_callback(move |event| {
                let connected = connected.clone();
                async move {
                    if matches!(event, async_nats::Event::Connected) {
                        connected.send_modify(|count| *count += 1);
                    }
                }
            })
            .connect(url)
            .await
            .expect("connects");
        (client, connections)
    }

    /// Waits (up to 30 s) until the client `connections` counts has connected `times` times.
    async fn connected(connections: &mut tokio::sync::watch::Receiver<u32>, times: u32) {
        tokio::time::timeout(
            Duration::from_secs(30),
            connections.wait_for(|count| *count >= times),
        )
        .await
        .expect("connected as often as expected")
        .expect("counting");
    }

    /// One request to the group, waiting 300 ms for its answer.
    async fn request(requester: &async_nats::Client) -> Result<Message, async_nats::RequestError> {
        let request = async_nats::Request::new()
            .payload(Bytes::from_static(b"offer"))
            .timeout(Some(Duration::from_millis(300)));
        requester.send_request(SUBJECT, request).await
    }

    /// Restarts `nats` and waits until each client counted by `clients` has connected again.
    async fn restart(nats: &mut NatsServer, clients: [&mut tokio::sync::watch::Receiver<u32>; 3]) {
        nats.restart();
        for connections in clients {
            connected(connections, 2).await;
        }
    }

    /// How many of 40 requests to the group, one at a time, time out; none may find the group
    /// empty (a steady member is in it).
    async fn timed_out_of_40(requester: &async_nats::Client) -> usize {
        let mut timed_out = 0;
        for _ in 0..40 {
            if let Err(error) = request(requester).await {
                assert_ne!(
                    error.kind(),
                    RequestErrorKind::NoResponders,
                    "the steady member is there"
                );
                timed_out += 1;
            }
        }
        timed_out
    }

    /// Sends requests, one at a time, until the leaving member's task `left` ends (bounded),
    /// as offers keep coming to a node; returns what the member drew.
    async fn requests_until_ended(
        requester: &async_nats::Client,
        left: &mut tokio::task::JoinHandle<u64>,
    ) -> u64 {
        for _ in 0..2_000 {
            let _ = request(requester).await;
            if let Ok(drawn) = tokio::time::timeout(Duration::from_millis(1), &mut *left).await {
                return drawn.expect("the leaving member");
            }
        }
        panic!("the leaving subscription never ended");
    }

    /// A member leaves its group with `margin` more messages to come, the server restarts
    /// before they come (the client subscribes again without the count), and the member's
    /// subscription ends: afterwards no request is routed to a subscription nobody reads.
    /// The steady member answers the rest. With a margin of 1 the count is reached after
    /// the reconnect (the client forgets the subscription without telling the server, and
    /// the leave makes it reconnect once more); with 8 the subscription is cut at the first
    /// message after the reconnect. Without either, about half the requests after the end
    /// went to the forgotten subscription and timed out.
    /// Returns how many of 40 requests after the end timed out, and how many times the
    /// leaving member's client connected.
    /// The requests start once the leaving client has connected `connections` times (a
    /// forced reconnect is asked, not awaited: offers routed to the forgotten subscription
    /// before it happens are lost, as across any reconnect).
    async fn leave_across_a_restart(margin: u64, connections: u32) -> Option<(usize, u32)> {
        let mut nats = NatsServer::start()?;
        let (leaving, mut leaving_connections) = counting_client(nats.url()).await;
        let (steady, mut steady_connections) = counting_client(nats.url()).await;
        let (requester, mut requester_connections) = counting_client(nats.url()).await;
        tokio::spawn(member(steady.clone(), u64::MAX, 1));
        let subscriber = leaving
            .queue_subscribe(SUBJECT, GROUP.to_owned())
            .await
            .expect("subscribes");
        let mut offers =
            Counted::new(subscriber, leaving.clone()).with_tail(Duration::from_secs(60));
        offers.leave(margin).await.expect("leaves");
        leaving.flush().await.expect("flushes");
        // Reading (and waiting for the next message) before the restart, as a node does.
        let answers = leaving.clone();
        let mut left = tokio::spawn(async move {
            let mut drawn = 0_u64;
            while let Some(message) = offers.next().await {
                drawn += 1;
                if let Some(reply) = message.reply {
                    answers.publish(reply, Bytes::new()).await.expect("answers");
                }
            }
            drawn
        });
        restart(
            &mut nats,
            [
                &mut leaving_connections,
                &mut steady_connections,
                &mut requester_connections,
            ],
        )
        .await;
        // Requests flow until the leaving subscription has ended (bounded).
        let drawn = requests_until_ended(&requester, &mut left).await;
        assert!(drawn <= margin, "drew {drawn} of its margin {margin}");
        connected(&mut leaving_connections, connections).await;
        let timed_out = timed_out_of_40(&requester).await;
        let connections = *leaving_connections.borrow();
        Some((timed_out, connections))
    }

    /// A member whose subscription lived through a reconnect before it leaves (the server
    /// counts from the re-subscription, the client from the start) is cut at once: no request
    /// after the leave waits on a subscription the client dropped. Without the cut, 19 of
    /// the 40 requests after the end timed out (its server side outlived the client's).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leave_after_a_reconnect_is_cut_and_leaves_nothing_behind() {
        let Some(mut nats) = NatsServer::start() else {
            return;
        };
        let (leaving, mut leaving_connections) = counting_client(nats.url()).await;
        let (steady, mut steady_connections) = counting_client(nats.url()).await;
        let (requester, mut requester_connections) = counting_client(nats.url()).await;
        let subscriber = leaving
            .queue_subscribe(SUBJECT, GROUP.to_owned())
            .await
            .expect("subscribes");
        let mut offers = Counted::new(subscriber, leaving.clone());
        let answers = leaving.clone();
        let (go, mut leave_now) = tokio::sync::oneshot::channel::<()>();
        let mut asked = false;
        let mut left = tokio::spawn(async move {
            let mut drawn = 0_u64;
            loop {
                tokio::select! {
                    message = offers.next() => {
                        let Some(message) = message else { break };
                        drawn += 1;
                        if let Some(reply) = message.reply {
                            answers.publish(reply, Bytes::new()).await.expect("answers");
                        }
                    }
                    _ = &mut leave_now, if !asked => {
                        asked = true;
                        offers.leave(8).await.expect("leaves");
                    }
                }
            }
            drawn
        });
        tokio::spawn(member(steady.clone(), u64::MAX, 1));
        // The leaving member draws its share before the restart and after it.
        for _ in 0..40 {
            let _ = request(&requester).await;
        }
        restart(
            &mut nats,
            [
                &mut leaving_connections,
                &mut steady_connections,
                &mut requester_connections,
            ],
        )
        .await;
        for _ in 0..10 {
            let _ = request(&requester).await;
        }
        go.send(()).expect("the member is reading");
        // Requests flow until the leaving subscription has ended (bounded), as offers do.
        let drawn = requests_until_ended(&requester, &mut left).await;
        assert!(drawn > 0, "the member drew requests before it left");
        // The cut has reached the server once a round trip on its connection is back.
        leaving.flush().await.expect("flushes");
        let inbox = leaving.new_inbox();
        let mut echo = leaving.subscribe(inbox.clone()).await.expect("subscribes");
        leaving
            .publish(inbox, Bytes::new())
            .await
            .expect("publishes");
        tokio::time::timeout(Duration::from_secs(5), echo.next())
            .await
            .expect("round trip")
            .expect("inbox open");
        let timed_out = timed_out_of_40(&requester).await;
        assert_eq!(timed_out, 0, "requests timed out");
        assert_eq!(
            *leaving_connections.borrow(),
            2,
            "cut, not reconnected once more"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leave_that_reaches_its_count_after_a_reconnect_leaves_nothing_behind() {
        let Some((timed_out, connections)) = leave_across_a_restart(1, 3).await else {
            return;
        };
        assert_eq!(timed_out, 0, "requests timed out");
        assert_eq!(
            connections, 3,
            "reconnected once more, for the server to forget it"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leave_interrupted_by_a_reconnect_is_cut_and_leaves_nothing_behind() {
        let Some((timed_out, connections)) = leave_across_a_restart(8, 2).await else {
            return;
        };
        assert_eq!(timed_out, 0, "requests timed out");
        assert_eq!(connections, 2, "cut, not reconnected once more");
    }

    #[test]
    fn the_margin_covers_every_node_s_offers_in_flight() {
        assert_eq!(margin(3), 3 * MAX_IN_FLIGHT as u64);
        // A node alone in its view still counts one other it may not have seen yet.
        assert_eq!(margin(0), 2 * MAX_IN_FLIGHT as u64);
        assert_eq!(margin(1), 2 * MAX_IN_FLIGHT as u64);
    }
}
