//! The three load generators: `DispatchStream`s, concurrent unary `Dispatch` calls (both over
//! `--connections` connections), and direct calls into core's dispatcher. Each keeps at most `--outstanding` dispatches in flight
//! and records each one's latency from send to outcome.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use hdrhistogram::Histogram;
use switchyard_core::{ActivityRequest, CallerIdentity};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;

use super::args::BenchArgs;
use super::target::{Api, Target};
use super::{ACTIVITY, NAMESPACE};
use crate::cmd::Failure;

/// How long the bench waits for a reply past the dispatch's own deadline before the run is
/// abandoned.
const REPLY_GRACE: Duration = Duration::from_secs(30);

/// The producer's deadline of each dispatch (`--dispatch-timeout-secs`).
pub(crate) fn dispatch_timeout(args: &BenchArgs) -> Duration {
    Duration::from_secs(args.dispatch_timeout_secs)
}

/// How long the bench waits for one reply before it gives up on the run.
pub(crate) fn reply_deadline(args: &BenchArgs) -> Duration {
    dispatch_timeout(args) + REPLY_GRACE
}

/// Largest latency the histogram records, in microseconds (10 minutes).
const MAX_LATENCY_US: u64 = 600_000_000;

/// The latencies and outcomes of one run.
pub(crate) struct Run {
    /// Send-to-outcome latency, in microseconds.
    pub(crate) latency: Histogram<u64>,
    /// How many dispatches ended each way, by outcome label.
    pub(crate) outcomes: BTreeMap<&'static str, u64>,
}

impl Run {
    pub(crate) fn new() -> Result<Self, Failure> {
        Ok(Self {
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .map_err(|error| Failure::runtime(format!("histogram: {error}")))?,
            outcomes: BTreeMap::new(),
        })
    }

    pub(crate) fn record(&mut self, latency: Duration, label: &'static str) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let _ = self.latency.record(micros.clamp(1, MAX_LATENCY_US));
        *self.outcomes.entry(label).or_default() += 1;
    }

    fn merge(&mut self, other: &Self) -> Result<(), Failure> {
        self.latency
            .add(&other.latency)
            .map_err(|error| Failure::runtime(format!("histogram: {error}")))?;
        for (label, count) in &other.outcomes {
            *self.outcomes.entry(label).or_default() += count;
        }
        Ok(())
    }
}

/// The label of a wire outcome, matching core's `ActivityOutcome::label`.
pub(crate) fn wire_label(outcome: Option<&pb::DispatchOutcome>) -> &'static str {
    match outcome.and_then(|outcome| outcome.outcome.as_ref()) {
        Some(Outcome::Completed(_)) => "completed",
        Some(Outcome::Failed(_)) => "failed",
        Some(Outcome::TimedOut(_)) => "timed_out",
        Some(Outcome::Cancelled(_)) => "cancelled",
        Some(Outcome::Unserved(_)) => "unserved",
        Some(Outcome::TransportLost(_)) => "transport_lost",
        Some(Outcome::ShuttingDown(_)) => "shutting_down",
        Some(Outcome::Other(_)) | None => "other",
    }
}

pub(crate) fn payload(args: &BenchArgs) -> Bytes {
    Bytes::from(vec![0x5a; args.payload])
}

/// The request of one dispatch; `durable` asks the gateway to record it before it runs.
pub(crate) fn wire_request(input: &Bytes, timeout: Duration, durable: bool) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NAMESPACE.to_owned(),
        activity_type: ACTIVITY.to_owned(),
        input: input.clone(),
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        // Unset follows the namespace's default, which is ephemeral unless configured.
        durable: durable.then_some(true),
        ..pb::DispatchRequest::default()
    }
}

/// The input of dispatch number `id`: tagged with the number when the workers count runs by
/// it (workers in another process, or durable dispatches, which a restart may run again), else
/// the untouched payload (the in-process ephemeral runs keep their figures).
pub(crate) fn input_of(args: &BenchArgs, input: &Bytes, id: u64) -> Bytes {
    if args.external_workers || args.durable {
        super::executions::tag(input, id)
    } else {
        input.clone()
    }
}

/// Send instants of the dispatches in flight, as nanoseconds since `origin`, indexed by
/// correlation id; shared by the sending and the receiving half of the stream.
struct SendTimes {
    origin: Instant,
    at: Vec<AtomicU64>,
}

impl SendTimes {
    fn new(tasks: u32) -> Self {
        Self {
            origin: Instant::now(),
            at: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn mark(&self, id: u64) {
        if let Some(slot) = usize::try_from(id).ok().and_then(|id| self.at.get(id)) {
            let nanos = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
            slot.store(nanos, Ordering::Relaxed);
        }
    }

    fn since(&self, id: u64) -> Option<Duration> {
        let slot = usize::try_from(id).ok().and_then(|id| self.at.get(id))?;
        let sent = Duration::from_nanos(slot.load(Ordering::Relaxed));
        Some(self.origin.elapsed().saturating_sub(sent))
    }
}

/// The producer's connections (`--connections`), each its own HTTP/2 connection.
async fn connections(args: &BenchArgs, target: &Target) -> Result<Vec<Api>, Failure> {
    let mut apis = Vec::new();
    for _ in 0..args.connections {
        apis.push(target.api().await?);
    }
    Ok(apis)
}

/// The share of `total` that part `index` of `parts` takes (the first `total % parts` parts
/// take one more).
fn share(total: u64, parts: u64, index: u64) -> u64 {
    let parts = parts.max(1);
    total / parts + u64::from(index < total % parts)
}

/// One `DispatchStream` on each of `--connections` connections, `--outstanding` and
/// `--tasks` split evenly between them; correlation ids are global, so one table of send
/// instants serves every stream.
pub(crate) async fn stream(args: &BenchArgs, target: &Target) -> Result<Run, Failure> {
    let apis = connections(args, target).await?;
    let times = Arc::new(SendTimes::new(args.tasks));
    let parts = u64::from(args.connections);
    let streams = apis.into_iter().zip(0..).map(|(api, index)| {
        let (args, times) = (args.clone(), Arc::clone(&times));
        let ids = Ids {
            first: index,
            step: parts,
            count: share(u64::from(args.tasks), parts, index),
        };
        let outstanding = share(u64::from(args.outstanding), parts, index);
        tokio::spawn(async move { one_stream(&args, api, ids, outstanding, times).await })
    });
    collect(streams.collect()).await
}

/// The correlation ids one stream sends: `first`, `first + step`, ..., `count` of them.
#[derive(Clone, Copy, Debug)]
struct Ids {
    first: u64,
    step: u64,
    count: u64,
}

/// How many more requests one stream may send: `--outstanding` at first, one more for each
/// reply. The reply reader gives room back and the request stream takes it, so a request is
/// made by the connection's own poll of the stream: no task and no channel of the bench's
/// own stand between a reply and the request it lets go.
struct Window {
    room: AtomicU64,
    closed: AtomicBool,
    /// The request stream's waker while it waits for room (or for the end).
    waker: AtomicWaker,
}

impl Window {
    fn new(room: u64) -> Self {
        Self {
            room: AtomicU64::new(room),
            closed: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        }
    }

    /// A reply came in: one more request may go.
    fn release(&self) {
        self.room.fetch_add(1, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Every reply is in (or the run is abandoned): the request stream ends.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn try_take(&self) -> bool {
        self.room
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |room| {
                room.checked_sub(1)
            })
            .is_ok()
    }

    /// Room for one more request (`true`), or the end (`false`); `take: false` waits for the
    /// end only.
    fn poll_next(&self, cx: &mut Context<'_>, take: bool) -> Poll<bool> {
        for attempt in 0..2 {
            if self.closed.load(Ordering::Acquire) {
                return Poll::Ready(false);
            }
            if take && self.try_take() {
                return Poll::Ready(true);
            }
            if attempt == 0 {
                // Registered before the second look, so a release in between is not missed.
                self.waker.register(cx.waker());
            }
        }
        Poll::Pending
    }
}

/// The requests of one stream, each made (and its send instant marked) when the [`Window`]
/// has room; after the last one the stream stays open until the window closes.
struct Requests {
    window: Arc<Window>,
    ids: Ids,
    sent: u64,
    times: Arc<SendTimes>,
    input: Bytes,
    timeout: Duration,
    args: BenchArgs,
}

impl Stream for Requests {
    type Item = pb::DispatchStreamRequest;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let more = self.sent < self.ids.count;
        if !std::task::ready!(self.window.poll_next(cx, more)) {
            return Poll::Ready(None);
        }
        let id = self.ids.first + self.sent * self.ids.step;
        self.sent += 1;
        self.times.mark(id);
        let request = wire_request(
            &input_of(&self.args, &self.input, id),
            self.timeout,
            self.args.durable,
        );
        Poll::Ready(Some(pb::DispatchStreamRequest {
            correlation_id: id,
            request: Some(request),
        }))
    }
}

/// One `DispatchStream` keeping `outstanding` requests in flight: the request stream sends
/// while its [`Window`] has room, and this task reads replies, each giving room back.
async fn one_stream(
    args: &BenchArgs,
    mut api: Api,
    ids: Ids,
    outstanding: u64,
    times: Arc<SendTimes>,
) -> Result<Run, Failure> {
    let window = Arc::new(Window::new(outstanding.max(1)));
    let requests = Requests {
        window: Arc::clone(&window),
        ids,
        sent: 0,
        times: Arc::clone(&times),
        input: payload(args),
        timeout: dispatch_timeout(args),
        args: args.clone(),
    };
    let mut replies = api
        .dispatch_stream(requests)
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let mut run = Run::new()?;
    let deadline = reply_deadline(args);
    let result = async {
        for _ in 0..ids.count {
            let reply = tokio::time::timeout(deadline, replies.next())
                .await
                .map_err(|_| Failure::runtime(format!("no dispatch reply for {deadline:?}")))?
                .ok_or_else(|| Failure::runtime("the dispatch stream ended early"))?
                .map_err(|status| Failure::status(&status))?;
            let latency = times.since(reply.correlation_id).unwrap_or_default();
            let label = match &reply.result {
                Some(StreamResult::Outcome(outcome)) => wire_label(Some(outcome)),
                Some(StreamResult::Refused(_)) => "refused",
                None => "other",
            };
            run.record(latency, label);
            window.release();
        }
        Ok::<_, Failure>(())
    }
    .await;
    drop(replies);
    window.close();
    result.map(|()| run)
}

/// `--outstanding` tasks, each making unary `Dispatch` calls one after another; task `i` uses
/// connection `i mod --connections`.
pub(crate) async fn unary(args: &BenchArgs, target: &Target) -> Result<Run, Failure> {
    let apis = connections(args, target).await?;
    let next = Arc::new(AtomicU64::new(0));
    let tasks = u64::from(args.tasks);
    let input = payload(args);
    let (timeout, deadline) = (dispatch_timeout(args), reply_deadline(args));
    let callers = apis
        .iter()
        .cycle()
        .take(usize::try_from(args.outstanding).unwrap_or(0))
        .map(|api| {
            let (mut api, next, input, args) =
                (api.clone(), Arc::clone(&next), input.clone(), args.clone());
            tokio::spawn(async move {
                let mut run = Run::new()?;
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= tasks {
                        break;
                    }
                    let request = wire_request(&input_of(&args, &input, id), timeout, args.durable);
                    let sent = Instant::now();
                    let reply = tokio::time::timeout(deadline, api.dispatch(request))
                        .await
                        .map_err(|_| {
                            Failure::runtime(format!("no dispatch reply for {deadline:?}"))
                        })?;
                    let label = match &reply {
                        Ok(reply) => wire_label(reply.get_ref().outcome.as_ref()),
                        Err(_) => "refused",
                    };
                    run.record(sent.elapsed(), label);
                }
                Ok::<_, Failure>(run)
            })
        });
    collect(callers.collect()).await
}

/// `--outstanding` tasks, each calling core's dispatcher one dispatch after another.
pub(crate) async fn core(args: &BenchArgs, target: &Target) -> Result<Run, Failure> {
    let core = target
        .core()
        .ok_or_else(|| Failure::usage("--via core needs the in-process gateway"))?;
    let caller = Arc::new(CallerIdentity::trusted("bench"));
    let next = Arc::new(AtomicU64::new(0));
    let tasks = u64::from(args.tasks);
    let input = payload(args);
    let (timeout, deadline) = (dispatch_timeout(args), reply_deadline(args));
    let callers = (0..args.outstanding).map(|_| {
        let dispatcher = core.dispatcher().clone();
        let (caller, next, input) = (Arc::clone(&caller), Arc::clone(&next), input.clone());
        tokio::spawn(async move {
            let mut run = Run::new()?;
            while next.fetch_add(1, Ordering::Relaxed) < tasks {
                let request = ActivityRequest {
                    namespace: NAMESPACE.to_owned(),
                    task_queue: String::new(),
                    activity_type: ACTIVITY.to_owned(),
                    node: None,
                    input: input.clone(),
                    activity_id: None,
                    timeout,
                };
                let sent = Instant::now();
                let outcome = tokio::time::timeout(deadline, dispatcher.dispatch(&caller, request))
                    .await
                    .map_err(|_| {
                        Failure::runtime(format!("no dispatch outcome for {deadline:?}"))
                    })?;
                let label = match &outcome {
                    Ok(outcome) => outcome.label(),
                    Err(_) => "refused",
                };
                run.record(sent.elapsed(), label);
            }
            Ok::<_, Failure>(run)
        })
    });
    collect(callers.collect()).await
}

pub(crate) async fn collect(
    callers: Vec<tokio::task::JoinHandle<Result<Run, Failure>>>,
) -> Result<Run, Failure> {
    let mut total = Run::new()?;
    for caller in callers {
        let run = caller
            .await
            .map_err(|error| Failure::runtime(format!("load task: {error}")))??;
        total.merge(&run)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures::task::{ArcWake, waker};

    use super::*;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl ArcWake for Wakes {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_window_lets_one_request_go_per_reply_and_ends_when_closed() {
        let wakes = Arc::new(Wakes::default());
        let waker = waker(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let window = Window::new(2);
        assert_eq!(window.poll_next(&mut cx, true), Poll::Ready(true));
        assert_eq!(window.poll_next(&mut cx, true), Poll::Ready(true));
        assert!(
            window.poll_next(&mut cx, true).is_pending(),
            "two outstanding: no third request"
        );
        window.release();
        assert_eq!(
            wakes.0.load(Ordering::Relaxed),
            1,
            "a reply wakes the waiting stream"
        );
        // Control: the reply's room lets exactly one more go.
        assert_eq!(window.poll_next(&mut cx, true), Poll::Ready(true));
        assert!(window.poll_next(&mut cx, true).is_pending());
        // After its last request the stream waits for the end, taking no room.
        window.release();
        assert!(window.poll_next(&mut cx, false).is_pending());
        window.close();
        assert_eq!(window.poll_next(&mut cx, false), Poll::Ready(false));
        assert_eq!(
            window.poll_next(&mut cx, true),
            Poll::Ready(false),
            "closed ends it"
        );
    }

    #[test]
    fn shares_add_up_to_the_total_and_differ_by_at_most_one() {
        let shares: Vec<u64> = (0..4).map(|index| share(10, 4, index)).collect();
        assert_eq!(shares, [3, 3, 2, 2]);
        assert_eq!(shares.iter().sum::<u64>(), 10);
        // Control: one part takes everything.
        assert_eq!(share(10, 1, 0), 10);
    }
}
