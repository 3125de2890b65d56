//! `DispatchStream`: many dispatches over one bidirectional stream, correlated by id, with a
//! bound on how many run at once and on how much the gateway holds for a producer that does
//! not read.
//!
//! One driver task per stream reads requests only while fewer than `max_in_flight` run and
//! fewer than `max_outstanding` are outstanding (running, plus replies the producer has not
//! taken), so a producer that outruns its workers, or stops reading its replies, is pushed
//! back by HTTP/2 flow control rather than buffered. Replies go out in completion order. A
//! stream that stays at `max_outstanding` with the producer taking no reply for
//! `slow_consumer_timeout` is ended as a slow consumer, as NATS does: its dispatches are
//! dropped (core cancels them as `CallerGone`), its queued replies freed, and the producer
//! reads `RESOURCE_EXHAUSTED` naming the limit after whatever HTTP/2 had already buffered.
//! When the producer goes away the driver ends and drops its dispatches the same way. When the
//! server closes, the driver stops reading and sends the replies of the dispatches still
//! running before it ends, so every accepted request gets exactly one reply.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use switchyard_core::CallerIdentity;
use switchyard_proto::v1 as pb;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};
use tracing::Instrument;

use super::outcome;
use super::run::Runner;
use crate::ops::PoolHandles;

type Reply = Result<pb::DispatchStreamReply, Status>;

/// At most one slow-consumer WARN per this span, whatever the number of streams ended.
const SLOW_CONSUMER_LOG_EVERY: Duration = Duration::from_secs(10);

/// The slow-consumer WARN's throttle, shared by every stream.
static SLOW_CONSUMER_LOG: std::sync::Mutex<switchyard_core::Throttle> =
    std::sync::Mutex::new(switchyard_core::Throttle::new(SLOW_CONSUMER_LOG_EVERY));

/// Replies of one `DispatchStream`, as tonic sends them.
pub(crate) type ReplyStream = Pin<Box<dyn Stream<Item = Reply> + Send + 'static>>;

/// The reply stream over the driver's queue.
#[derive(Debug)]
struct Replies {
    outlet: Arc<Mutex<Outlet>>,
    taken: Arc<Notify>,
}

/// What the driver and the reply stream share: the queued replies until the stream is ended
/// as a slow consumer, then the status the producer reads last.
#[derive(Debug)]
struct Outlet {
    replies: Option<mpsc::Receiver<Reply>>,
    ended_with: Option<Status>,
    waker: Option<Waker>,
}

fn lock(outlet: &Mutex<Outlet>) -> MutexGuard<'_, Outlet> {
    outlet.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Stream for Replies {
    type Item = Reply;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        let mut outlet = lock(&self.outlet);
        if let Some(replies) = outlet.replies.as_mut() {
            match replies.poll_recv(cx) {
                Poll::Ready(Some(reply)) => {
                    self.taken.notify_one();
                    return Poll::Ready(Some(reply));
                }
                Poll::Ready(None) => outlet.replies = None,
                Poll::Pending => {
                    // Cloning a waker costs two atomic operations; tonic polls with the same one.
                    if !outlet
                        .waker
                        .as_ref()
                        .is_some_and(|waker| waker.will_wake(cx.waker()))
                    {
                        outlet.waker = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(outlet.ended_with.take().map(Err))
    }
}

/// Ends the stream as a slow consumer: frees the queued replies and leaves `status` for the
/// producer to read next.
fn evict(outlet: &Mutex<Outlet>, status: Status) {
    let (queued, waker) = {
        let mut outlet = lock(outlet);
        outlet.ended_with = Some(status);
        (outlet.replies.take(), outlet.waker.take())
    };
    drop(queued);
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// Logs a stream of `principal` ended as a slow consumer at `now`, unless `log` held back
/// one less than its interval ago; the line counts the ones held back since the last.
fn warn_slow_consumer(
    log: &std::sync::Mutex<switchyard_core::Throttle>,
    now: std::time::Instant,
    principal: &str,
    limits: &StreamLimits,
) {
    let allowed = log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .allow(now);
    if let Some(suppressed) = allowed {
        tracing::warn!(
            principal = %principal,
            suppressed,
            "DispatchStream ended as a slow consumer: no reply taken for \
             dispatch.slow_consumer_timeout ({:?}) with dispatch.max_stream_outstanding \
             ({}) outstanding",
            limits.slow_consumer_timeout,
            limits.max_outstanding
        );
    }
}

/// Limits of one stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamLimits {
    /// Dispatches run at once.
    pub(crate) max_in_flight: usize,
    /// Dispatches running plus replies not yet taken; at the bound the stream is not read.
    pub(crate) max_outstanding: usize,
    /// How long the stream may sit at `max_outstanding` with no reply taken.
    pub(crate) slow_consumer_timeout: Duration,
}

/// Starts the driver of one stream and returns its replies; each request runs through
/// `runner`, ephemeral or durable as it says.
pub(crate) fn start(
    runner: Arc<Runner>,
    caller: CallerIdentity,
    inbound: Streaming<pb::DispatchStreamRequest>,
    limits: StreamLimits,
    closing: CancellationToken,
) -> ReplyStream {
    let (replies, receiver) = mpsc::channel(limits.max_outstanding.max(1));
    let outlet = Arc::new(Mutex::new(Outlet {
        replies: Some(receiver),
        ended_with: None,
        waker: None,
    }));
    let taken = Arc::new(Notify::new());
    let span = tracing::debug_span!("dispatch_stream", principal = %caller.principal);
    let driver = Driver {
        runner,
        caller: Arc::new(caller),
        limits,
        replies,
        outlet: Arc::clone(&outlet),
        taken: Arc::clone(&taken),
    };
    tokio::spawn(driver.drive(inbound, closing).instrument(span));
    Box::pin(Replies { outlet, taken })
}

struct Driver {
    runner: Arc<Runner>,
    caller: Arc<CallerIdentity>,
    limits: StreamLimits,
    replies: mpsc::Sender<Reply>,
    outlet: Arc<Mutex<Outlet>>,
    taken: Arc<Notify>,
}

impl Driver {
    /// Replies queued and not yet taken by the producer.
    fn queued(&self) -> usize {
        self.replies.max_capacity() - self.replies.capacity()
    }

    fn slow_consumer(&self) -> Status {
        let limits = &self.limits;
        metrics::counter!("switchyard_limit_refusals_total",
            "limit" => "dispatch.slow_consumer_timeout")
        .increment(1);
        warn_slow_consumer(
            &SLOW_CONSUMER_LOG,
            Instant::now().into_std(),
            &self.caller.principal,
            limits,
        );
        Status::resource_exhausted(format!(
            "slow consumer: no reply taken for `dispatch.slow_consumer_timeout` ({:?}) with \
             `dispatch.max_stream_outstanding` ({}) outstanding; the stream is ended and its \
             dispatches cancelled",
            limits.slow_consumer_timeout, limits.max_outstanding
        ))
    }

    /// Runs the stream until the producer and every dispatch are done, or it is ended.
    async fn drive(
        self,
        mut inbound: Streaming<pb::DispatchStreamRequest>,
        closing: CancellationToken,
    ) {
        let Self {
            runner,
            caller,
            limits,
            replies,
            ..
        } = &self;
        let bound = replies.max_capacity();
        let mut running = FuturesUnordered::new();
        let mut correlation_ids = HashSet::new();
        let mut pools = PoolHandles::default();
        let mut reading = true;
        // Waits made once: a fresh one each turn (twice per dispatch) would register anew on
        // the server's token, shared by every stream, and on the reply channel.
        let closed = closing.cancelled();
        tokio::pin!(closed);
        let gone = replies.closed();
        tokio::pin!(gone);
        // Since when the stream has sat at its bound with replies the producer has not taken.
        let mut stalled_since: Option<Instant> = None;
        while reading || !running.is_empty() {
            let queued = self.queued();
            let full = running.len() + queued >= bound;
            if full && queued > 0 {
                stalled_since.get_or_insert_with(Instant::now);
            } else {
                stalled_since = None;
            }
            let evict_at = stalled_since.map(|since| since + limits.slow_consumer_timeout);
            let reply = tokio::select! {
                next = inbound.message(),
                    if reading && !full && running.len() < limits.max_in_flight => {
                    match next {
                        Ok(Some(item)) => {
                            let pb::DispatchStreamRequest { correlation_id, request } = item;
                            let refusal = match request {
                                None => Some(Status::invalid_argument("request is required")),
                                Some(_) if correlation_ids.contains(&correlation_id) => Some(
                                    Status::already_exists(format!(
                                        "correlation_id {correlation_id} is already in flight on \
                                         this stream"
                                    )),
                                ),
                                Some(request) => {
                                    correlation_ids.insert(correlation_id);
                                    let pool = Runner::pool_of(&mut pools, &request);
                                    // Borrowed from the driver, which outlives `running`: no
                                    // count to raise and drop on the runner every stream and
                                    // thread shares.
                                    let (runner, caller) = (&**runner, &**caller);
                                    // Mapped, not awaited in an `async` block, which would
                                    // hold the future twice.
                                    running.push(
                                        runner
                                            .run(caller, request, pool)
                                            .map(move |ended| (correlation_id, ended)),
                                    );
                                    None
                                }
                            };
                            match refusal {
                                Some(status) => refused(correlation_id, &status),
                                None => continue,
                            }
                        }
                        Ok(None) => {
                            reading = false;
                            continue;
                        }
                        Err(status) => {
                            match outcome::oversized_request(
                                &status,
                                runner.dispatcher().max_input_bytes(),
                            ) {
                                Some(refusal) => {
                                    let _ = replies.send(Err(refusal)).await;
                                }
                                None => tracing::debug!(%status, "dispatch stream ended by the producer"),
                            }
                            return;
                        }
                    }
                }
                Some((correlation_id, result)) = running.next(), if !running.is_empty() => {
                    correlation_ids.remove(&correlation_id);
                    match result {
                        Ok(ended) => pb::DispatchStreamReply {
                            correlation_id,
                            result: Some(pb::dispatch_stream_reply::Result::Outcome(
                                outcome::outcome(ended),
                            )),
                        },
                        Err(status) => refused(correlation_id, &status),
                    }
                }
                // The producer took a reply: there may be room to read again.
                () = self.taken.notified(), if full => continue,
                () = sleep_until(evict_at) => {
                    evict(&self.outlet, self.slow_consumer());
                    return;
                }
                () = &mut gone => return,
                // The server is closing: read no more, but every dispatch already running still
                // sends its one reply (core has ended them all by now).
                () = &mut closed, if reading => {
                    reading = false;
                    continue;
                }
            };
            // Never waits: every running dispatch and every refusal was counted in the bound.
            if replies.send(Ok(reply)).await.is_err() {
                return;
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn refused(correlation_id: u64, status: &Status) -> pb::DispatchStreamReply {
    let code: Code = status.code();
    pb::DispatchStreamReply {
        correlation_id,
        result: Some(pb::dispatch_stream_reply::Result::Refused(
            pb::DispatchRefusal {
                code: code as i32,
                message: status.message().to_owned(),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn reply(correlation_id: u64) -> Reply {
        Ok(pb::DispatchStreamReply {
            correlation_id,
            result: None,
        })
    }

    #[test]
    fn slow_consumer_warnings_are_one_per_10_s_and_count_those_held_back() {
        assert_eq!(SLOW_CONSUMER_LOG_EVERY, Duration::from_secs(10));
        let log = std::sync::Mutex::new(switchyard_core::Throttle::new(SLOW_CONSUMER_LOG_EVERY));
        let limits = StreamLimits {
            max_in_flight: 4,
            max_outstanding: 4,
            slow_consumer_timeout: Duration::from_secs(30),
        };
        let start = std::time::Instant::now();
        let logged = crate::test_log::logged(|| {
            for after_ms in [0, 1_000, 9_900, 10_000, 10_500] {
                let at = start + Duration::from_millis(after_ms);
                warn_slow_consumer(&log, at, "shop", &limits);
            }
        });
        let lines: Vec<&str> = logged
            .lines()
            .filter(|line| line.contains("ended as a slow consumer"))
            .collect();
        assert_eq!(lines.len(), 2, "{logged}");
        // The first stream ended is logged at once (the control: a throttle that held back
        // everything would log nothing); the next line, 10 s later, counts the two between.
        assert!(
            lines[0].contains("WARN") && lines[0].contains("suppressed=0"),
            "{logged}"
        );
        assert!(lines[1].contains("suppressed=2"), "{logged}");
        assert!(lines[0].contains("principal=shop "), "{logged}");
    }

    #[tokio::test]
    async fn an_evicted_stream_frees_its_queued_replies_and_ends_with_the_status() {
        let (send, receiver) = mpsc::channel(4);
        let outlet = Arc::new(Mutex::new(Outlet {
            replies: Some(receiver),
            ended_with: None,
            waker: None,
        }));
        let mut replies = Replies {
            outlet: Arc::clone(&outlet),
            taken: Arc::new(Notify::new()),
        };
        for id in 0..3 {
            send.send(reply(id)).await.expect("room");
        }
        // Control: before the eviction the producer reads what is queued.
        let first = replies
            .next()
            .await
            .expect("a reply")
            .expect("not a status");
        assert_eq!(first.correlation_id, 0);
        assert!(!send.is_closed());

        evict(&outlet, Status::resource_exhausted("slow consumer"));
        assert!(
            send.is_closed(),
            "the queued replies' receiver is dropped, and them with it"
        );
        let status = replies
            .next()
            .await
            .expect("the status")
            .expect_err("not a queued reply");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            replies.next().await.is_none(),
            "the status is the last item"
        );
    }
}
