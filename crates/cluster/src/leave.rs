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

use std::time::Duration;

use async_nats::{Message, Subscriber};
use futures::StreamExt;
use tokio::time::Instant;

use crate::offers::MAX_IN_FLIGHT;

/// The longest a subscription that is leaving keeps taking offers before it is dropped.
pub(crate) const LEAVE_TAIL: Duration = Duration::from_secs(1);

/// How many offers may be on their way to one node's subscription of a pool while `nodes`
/// nodes offer there: [`MAX_IN_FLIGHT`] from each of them (this one included, as it may offer
/// to the pool while its own workers are busy).
pub(crate) fn margin(nodes: usize) -> u64 {
    u64::try_from(MAX_IN_FLIGHT.saturating_mul(nodes.max(1))).unwrap_or(u64::MAX)
}

/// A queue subscription that counts what it delivered, so it can leave by count.
pub(crate) struct Counted {
    subscriber: Subscriber,
    read: u64,
    leaving_since: Option<Instant>,
}

impl Counted {
    /// Wraps a subscription nothing has been read from yet.
    pub(crate) fn new(subscriber: Subscriber) -> Self {
        Self {
            subscriber,
            read: 0,
            leaving_since: None,
        }
    }

    /// The next message; `None` once the subscription has ended (closed by the client, or
    /// left: its last message delivered, or [`LEAVE_TAIL`] passed since [`leave`](Self::leave)).
    pub(crate) async fn next(&mut self) -> Option<Message> {
        let message = match self.leaving_since {
            None => self.subscriber.next().await,
            Some(since) => {
                let tail = tokio::time::sleep_until(since + LEAVE_TAIL);
                tokio::select! {
                    // A message already delivered is read before the tail can end.
                    biased;
                    message = self.subscriber.next() => message,
                    () = tail => None,
                }
            }
        };
        if message.is_some() {
            self.read = self.read.saturating_add(1);
        }
        message
    }

    /// Asks the server to stop delivering after `margin` more messages than were read; the
    /// messages still to come are read with [`next`](Self::next) until it returns `None`.
    /// Returns once the unsubscribe is queued on the client (ahead of anything published
    /// after it). An error means the client is gone: the subscription has ended.
    pub(crate) async fn leave(&mut self, margin: u64) -> Result<(), async_nats::UnsubscribeError> {
        if self.leaving_since.is_some() {
            return Ok(());
        }
        self.leaving_since = Some(Instant::now());
        let last = self.read.saturating_add(margin.max(1));
        self.subscriber.unsubscribe_after(last).await
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
        let mut offers = Counted::new(subscriber);
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
            let mut offers = Counted::new(subscriber);
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

    #[test]
    fn the_margin_covers_every_node_s_offers_in_flight() {
        assert_eq!(margin(0), MAX_IN_FLIGHT as u64);
        assert_eq!(margin(3), 3 * MAX_IN_FLIGHT as u64);
    }
}
