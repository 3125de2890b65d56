//! `/v1/events`: core's worker events as server-sent events, for the console.
//!
//! One task ([`EventFeed::collect`]) turns each event into its JSON line once, keeps the last
//! [`RECENT`] for a page that opens later, and fans it out to at most [`MAX_WATCHERS`] watchers,
//! each with a buffer of [`WATCHER_BUFFER`] lines: a watcher that falls further behind is told
//! how many it missed (`{"kind":"missed"}`) instead of holding memory for it. Every line
//! carries a sequence number (`seq`, also the SSE `id`), so a page that reconnects with
//! `Last-Event-ID` is not sent again what it has. Numbers start at the microseconds since the
//! Unix epoch when the gateway started ([`EventFeed::default`]), so they keep growing across
//! restarts: a page that saw number 500 of one run and reconnects to the next is sent all the
//! next run keeps, and a client dropping the numbers it has seen drops none of the new run's.
//!
//! In a cluster, [`super::cluster_events`] serves the stream instead: every node's lines, each
//! with its `gateway_node`, from the same ring and receiver ([`EventFeed::subscribe`],
//! [`EventFeed::after`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_core::{DispatchExclusion, Registry, WorkerEvent};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

/// Events kept for a page that opens later.
pub(crate) const RECENT: usize = 200;
/// Event streams served at once; one more is answered 503.
pub(crate) const MAX_WATCHERS: usize = 16;
/// Lines one watcher may be behind before it is told it missed some.
pub(crate) const WATCHER_BUFFER: usize = 256;
/// Longest silence on an event stream: a comment keeps it inside `ops.idle_timeout`.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One event line and its sequence number.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    /// Its sequence number on this node (0 for a "missed" line, which has none).
    pub(crate) seq: u64,
    /// The event as JSON, `seq` included.
    pub(crate) json: Arc<str>,
}

#[derive(Debug)]
struct Feed {
    next_seq: u64,
    recent: VecDeque<Line>,
    sender: broadcast::Sender<Line>,
}

/// The events served on `/v1/events`; see the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct EventFeed {
    /// The number of this run's first event.
    first_seq: u64,
    feed: Arc<Mutex<Feed>>,
    watchers: Arc<Semaphore>,
    started: Arc<AtomicBool>,
}

impl Default for EventFeed {
    /// A feed numbering from the microseconds since the Unix epoch now.
    fn default() -> Self {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
        let micros = now.map_or(0, |since| since.as_micros());
        Self::numbered_from(u64::try_from(micros).unwrap_or(u64::MAX / 2))
    }
}

/// Whether `seen`, the last number a page saw, was given out by a run of the feed numbering
/// from `first_seq` whose next number is `next_seq` (0, nothing seen, always is). A number
/// outside it comes from an earlier run (or a clock set back since): the page has seen
/// nothing of this one. A `first_seq` of 0 (another node that does not say) only catches a
/// number past the last.
pub(crate) fn from_this_run(seen: u64, first_seq: u64, next_seq: u64) -> bool {
    seen == 0 || (seen.saturating_add(1) >= first_seq && seen < next_seq)
}

impl EventFeed {
    /// A feed whose first event carries `first_seq` (at least 1).
    pub(crate) fn numbered_from(first_seq: u64) -> Self {
        let first_seq = first_seq.max(1);
        Self {
            first_seq,
            feed: Arc::new(Mutex::new(Feed {
                next_seq: first_seq,
                recent: VecDeque::with_capacity(RECENT),
                sender: broadcast::channel(WATCHER_BUFFER).0,
            })),
            watchers: Arc::new(Semaphore::new(MAX_WATCHERS)),
            started: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The number of this run's first event.
    pub(crate) fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Publishes one event to the recent ring and every watcher.
    pub(crate) fn publish(&self, mut event: Value) {
        let mut feed = self.feed.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = feed.next_seq;
        feed.next_seq += 1;
        event["seq"] = json!(seq);
        let line = Line {
            seq,
            json: Arc::from(event.to_string()),
        };
        if feed.recent.len() == RECENT {
            feed.recent.pop_front();
        }
        feed.recent.push_back(line.clone());
        // No watcher is not an error: the ring still keeps it.
        let _ = feed.sender.send(line);
    }

    /// The recent lines after `after`, and a receiver of every later one: taken under one
    /// lock, so nothing falls between them and nothing is sent twice. A number another run
    /// gave out ([`from_this_run`]) gets every recent line.
    pub(crate) fn subscribe(&self, after: u64) -> (Vec<Line>, broadcast::Receiver<Line>) {
        let (_, recent, receiver) = self.resume(after);
        (recent, receiver)
    }

    /// The recent lines after `after` and the next sequence number, for another node.
    pub(crate) fn after(&self, after: u64) -> (u64, Vec<Line>) {
        let (next_seq, lines, _) = self.resume(after);
        (next_seq, lines)
    }

    /// [`EventFeed::subscribe`] with the next sequence number.
    pub(crate) fn resume(&self, after: u64) -> (u64, Vec<Line>, broadcast::Receiver<Line>) {
        let feed = self.feed.lock().unwrap_or_else(PoisonError::into_inner);
        let next_seq = feed.next_seq;
        let after = if from_this_run(after, self.first_seq, next_seq) {
            after
        } else {
            0
        };
        let recent = feed
            .recent
            .iter()
            .filter(|line| line.seq > after)
            .cloned()
            .collect();
        (next_seq, recent, feed.sender.subscribe())
    }

    /// A place on the event streams served at once, if one is free.
    pub(crate) fn watcher(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.watchers).try_acquire_owned().ok()
    }

    /// Starts publishing `registry`'s events until `stop` fires, unless already started.
    pub(crate) fn start(&self, registry: &Registry, stop: CancellationToken) {
        if !self.started.swap(true, Ordering::SeqCst) {
            tokio::spawn(self.clone().collect(registry.clone(), stop));
        }
    }

    /// Publishes `registry`'s events until `stop` fires.
    async fn collect(self, registry: Registry, stop: CancellationToken) {
        let mut receiver = registry.subscribe_events();
        loop {
            let event = tokio::select! {
                received = receiver.recv() => received,
                () = stop.cancelled() => return,
            };
            match event {
                Ok(event) => {
                    if let Some(json) = event_json(&event, &registry, SystemTime::now()) {
                        self.publish(json);
                    }
                }
                Err(RecvError::Lagged(count)) => self.publish(missed(count, SystemTime::now())),
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// The `/v1/events` response: the recent events the page has not seen, then live ones,
    /// until `stop` fires; 503 when [`MAX_WATCHERS`] streams are already served.
    pub(crate) fn serve(
        &self,
        headers: &HeaderMap,
        idle_timeout: Duration,
        stop: CancellationToken,
    ) -> Response {
        let Some(permit) = self.watcher() else {
            return too_many_watchers();
        };
        let after = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (recent, receiver) = self.subscribe(after);
        let live = futures::stream::unfold((receiver, permit), |(mut receiver, permit)| async {
            let line = match receiver.recv().await {
                Ok(line) => line,
                Err(RecvError::Lagged(count)) => Line {
                    seq: 0,
                    json: Arc::from(missed(count, SystemTime::now()).to_string()),
                },
                Err(RecvError::Closed) => return None,
            };
            Some((line, (receiver, permit)))
        });
        let lines = futures::stream::iter(recent).chain(live).map(|line| {
            let event = Event::default().data(&*line.json);
            if line.seq == 0 {
                event
            } else {
                event.id(line.seq.to_string())
            }
        });
        sse(lines, idle_timeout, stop)
    }
}

/// The answer when [`MAX_WATCHERS`] streams are already served.
pub(crate) fn too_many_watchers() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("too many event streams open (the limit is {MAX_WATCHERS})\n"),
    )
        .into_response()
}

/// `events` as a server-sent event stream that ends when `stop` fires, kept alive within
/// `idle_timeout`.
pub(crate) fn sse(
    events: impl futures::Stream<Item = Event> + Send + 'static,
    idle_timeout: Duration,
    stop: CancellationToken,
) -> Response {
    let lines = events
        .map(Ok::<_, Infallible>)
        .take_until(stop.cancelled_owned());
    Sse::new(lines)
        .keep_alive(KeepAlive::new().interval(keep_alive_every(idle_timeout)))
        .into_response()
}

/// How often a silent event stream gets a comment: every [`KEEP_ALIVE`], or half
/// `ops.idle_timeout` when that is shorter (so the listener never finds the stream idle), and
/// no more often than every 100 ms.
fn keep_alive_every(idle_timeout: Duration) -> Duration {
    KEEP_ALIVE
        .min(idle_timeout / 2)
        .max(Duration::from_millis(100))
}

/// The line telling a page it missed `count` events.
pub(crate) fn missed(count: u64, at: SystemTime) -> Value {
    json!({
        "kind": "missed",
        "at_unix_ms": crate::api::unix_ms(at),
        "count": count,
        "detail": format!("{count} events missed: this page fell behind"),
    })
}

/// An event as the console shows it, `None` for events it does not show.
pub(crate) fn event_json(
    event: &WorkerEvent,
    registry: &Registry,
    at: SystemTime,
) -> Option<Value> {
    let (worker, kind, detail) = match event {
        WorkerEvent::Connected {
            worker,
            transport,
            namespaces,
            task_queue,
            node,
        } => {
            let node = node.as_ref().map_or("no node", |n| n.as_str());
            let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
            let detail = format!(
                "over {transport}, node {node}, namespaces {}, task queue {task_queue}",
                namespaces.join(",")
            );
            (*worker, "connected", detail)
        }
        WorkerEvent::Disconnected { worker, reason } => {
            (*worker, "disconnected", reason.as_str().to_owned())
        }
        WorkerEvent::Excluded { worker, exclusion } => {
            let why = match exclusion {
                DispatchExclusion::OpeningProbation => "opening probation",
                DispatchExclusion::ReachabilityLost => "reachability lost",
            };
            (*worker, "excluded", why.to_owned())
        }
        WorkerEvent::ProbationPassed { worker } => (
            *worker,
            "eligible",
            "passed its opening probation".to_owned(),
        ),
        WorkerEvent::Recovered { worker } => (*worker, "recovered", "eligible again".to_owned()),
        WorkerEvent::Suspended { worker, grace } => (
            *worker,
            "suspended",
            format!("may resume within {} ms", grace.as_millis()),
        ),
        WorkerEvent::Resumed { worker } => (*worker, "resumed", "on a new connection".to_owned()),
        WorkerEvent::CapacityAnnounced { worker, capacity } => {
            (*worker, "capacity", format!("announced {capacity} slots"))
        }
        _ => return None,
    };
    let identity = registry
        .worker(worker)
        .map(|s| s.worker.identity().to_owned());
    Some(json!({
        "at_unix_ms": crate::api::unix_ms(at),
        "worker_id": worker.get(),
        "identity": identity,
        "kind": kind,
        "detail": detail,
    }))
}

#[cfg(test)]
mod tests {
    use switchyard_core::{DisconnectReason, WorkerId};

    use super::*;

    /// `docs/operations.md`, "Events": the kinds a stream carries, and the details of a
    /// `disconnected` event, are the documented ones, for every event and reason core emits.
    #[test]
    fn every_event_has_its_documented_kind_and_every_departure_its_detail() {
        let worker = WorkerId::from_raw(7);
        let registry = Registry::default();
        let kind = |event: WorkerEvent| {
            let line = event_json(&event, &registry, SystemTime::now()).expect("shown");
            assert_eq!(line["worker_id"], 7);
            (
                line["kind"].as_str().unwrap_or_default().to_owned(),
                line["detail"].clone(),
            )
        };
        let events = [
            WorkerEvent::Connected {
                worker,
                transport: switchyard_core::TransportName::from_static("grpc"),
                namespaces: ["ns".to_owned()].into(),
                task_queue: "default".to_owned(),
                node: None,
            },
            WorkerEvent::ProbationPassed { worker },
            WorkerEvent::Excluded {
                worker,
                exclusion: DispatchExclusion::ReachabilityLost,
            },
            WorkerEvent::Recovered { worker },
            WorkerEvent::Suspended {
                worker,
                grace: Duration::from_secs(5),
            },
            WorkerEvent::Resumed { worker },
            WorkerEvent::CapacityAnnounced {
                worker,
                capacity: 4,
            },
            WorkerEvent::Disconnected {
                worker,
                reason: DisconnectReason::Drained,
            },
        ];
        let kinds: Vec<String> = events.into_iter().map(|e| kind(e).0).collect();
        assert_eq!(
            kinds,
            [
                "connected",
                "eligible",
                "excluded",
                "recovered",
                "suspended",
                "resumed",
                "capacity",
                "disconnected"
            ]
        );
        // Every reason a worker leaves for; `superseded` names a replaced connection, never
        // a departure, and no event carries it.
        let reasons = [
            DisconnectReason::Disconnect,
            DisconnectReason::Timeout,
            DisconnectReason::Drained,
            DisconnectReason::Unresponsive,
            DisconnectReason::ReconnectGraceExpired,
            DisconnectReason::Closed,
        ];
        let details: Vec<serde_json::Value> = reasons
            .into_iter()
            .map(|reason| kind(WorkerEvent::Disconnected { worker, reason }).1)
            .collect();
        assert_eq!(
            details,
            [
                "disconnect",
                "timeout",
                "drained",
                "unresponsive",
                "reconnect_grace_expired",
                "closed"
            ]
        );
    }

    /// `docs/operations.md`, "Events": the last 200 replayed, at most 16 streams, a stream
    /// more than 256 events behind told what it missed.
    #[test]
    fn the_event_bounds_are_the_documented_ones() {
        assert_eq!(RECENT, 200);
        assert_eq!(MAX_WATCHERS, 16);
        assert_eq!(WATCHER_BUFFER, 256);
    }

    #[test]
    fn a_silent_stream_gets_a_comment_every_15_s_or_half_the_idle_timeout() {
        assert_eq!(keep_alive_every(Duration::from_secs(60)), KEEP_ALIVE);
        assert_eq!(KEEP_ALIVE, Duration::from_secs(15));
        assert_eq!(
            keep_alive_every(Duration::from_secs(10)),
            Duration::from_secs(5),
            "inside a shorter idle timeout"
        );
        assert_eq!(
            keep_alive_every(Duration::from_millis(50)),
            Duration::from_millis(100),
            "never more often than every 100 ms"
        );
    }

    fn published(feed: &EventFeed, n: u64) {
        for i in 0..n {
            feed.publish(json!({ "kind": "test", "worker_id": i }));
        }
    }

    #[test]
    fn the_recent_ring_is_bounded_and_resumes_after_the_last_seen() {
        let feed = EventFeed::numbered_from(1);
        published(&feed, RECENT as u64 + 50);
        let (all, _) = feed.subscribe(0);
        assert_eq!(all.len(), RECENT);
        assert_eq!(all[0].seq, 51, "the oldest 50 left the ring");
        let (after, _) = feed.subscribe(RECENT as u64 + 45);
        let seqs: Vec<u64> = after.iter().map(|l| l.seq).collect();
        assert_eq!(
            seqs,
            (RECENT as u64 + 46..=RECENT as u64 + 50).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn a_subscriber_sees_every_later_event_once_and_a_slow_one_is_told_it_missed() {
        let feed = EventFeed::numbered_from(1);
        published(&feed, 3);
        let (recent, mut receiver) = feed.subscribe(0);
        assert_eq!(recent.len(), 3);
        published(&feed, 1);
        assert_eq!(
            receiver.recv().await.unwrap().seq,
            4,
            "nothing between ring and live"
        );
        // A watcher that stops reading is bounded: past the buffer it lags.
        published(&feed, WATCHER_BUFFER as u64 + 10);
        assert!(matches!(receiver.recv().await, Err(RecvError::Lagged(10))));
        // Control: one that keeps up lags nothing.
        let (_, mut fresh) = feed.subscribe(u64::MAX);
        published(&feed, 1);
        assert!(fresh.recv().await.is_ok());
    }

    /// `docs/operations.md`: a stream more than 256 events behind gets one line saying how
    /// many it missed (no id, so a reconnecting page is not misled), then goes on.
    #[tokio::test(start_paused = true)]
    async fn a_stream_that_falls_behind_is_sent_the_count_it_missed() {
        let feed = EventFeed::numbered_from(1);
        let stop = CancellationToken::new();
        let mut stream = feed
            .serve(&HeaderMap::new(), Duration::from_secs(60), stop.clone())
            .into_body()
            .into_data_stream();
        // Nothing is read while the buffer and ten more are published.
        published(&feed, WATCHER_BUFFER as u64 + 10);
        let chunk = stream.next().await.unwrap().unwrap();
        let text = std::str::from_utf8(&chunk).unwrap();
        assert!(
            text.contains("\"kind\":\"missed\"") && text.contains("\"count\":10"),
            "{text}"
        );
        assert!(!text.contains("id:"), "{text}");
        // Then the oldest event still buffered, with its id.
        let chunk = stream.next().await.unwrap().unwrap();
        let text = std::str::from_utf8(&chunk).unwrap();
        assert!(text.contains("id: 11\n"), "{text}");
        stop.cancel();
    }

    #[tokio::test]
    async fn no_more_than_max_watchers_streams_are_served() {
        let feed = EventFeed::numbered_from(1);
        let stop = CancellationToken::new();
        let idle = Duration::from_secs(60);
        let open: Vec<Response> = (0..MAX_WATCHERS)
            .map(|_| feed.serve(&HeaderMap::new(), idle, stop.clone()))
            .collect();
        assert!(open.iter().all(|r| r.status() == StatusCode::OK));
        let refused = feed.serve(&HeaderMap::new(), idle, stop.clone());
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Control: closing one stream gives its place back.
        drop(open);
        let again = feed.serve(&HeaderMap::new(), idle, stop);
        assert_eq!(again.status(), StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_replays_what_the_page_missed_and_ends_when_the_listener_stops() {
        let feed = EventFeed::numbered_from(1);
        published(&feed, 2);
        let stop = CancellationToken::new();
        let idle = Duration::from_secs(60);
        let mut headers = HeaderMap::new();
        headers.insert("last-event-id", "1".parse().unwrap());

        let mut stream = feed
            .serve(&headers, idle, stop.clone())
            .into_body()
            .into_data_stream();
        let first = stream.next().await.unwrap().unwrap();
        let text = String::from_utf8(first.to_vec()).unwrap();
        assert!(
            text.contains("\"seq\":2") && text.contains("id: 2"),
            "{text}"
        );
        assert!(
            !text.contains("\"seq\":1"),
            "seen before Last-Event-ID: {text}"
        );
        assert!(!text.contains("gateway_node"), "outside a cluster: {text}");

        // Control: while the listener runs, the stream stays open.
        let wait = Duration::from_secs(1);
        assert!(tokio::time::timeout(wait, stream.next()).await.is_err());
        stop.cancel();
        let end = tokio::time::timeout(wait, stream.next()).await;
        assert!(
            matches!(end, Ok(None)),
            "the stream ends when the listener stops"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_reconnecting_after_a_restart_is_sent_what_the_new_run_keeps() {
        let before = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let feed = EventFeed::default();
        assert!(
            u128::from(feed.first_seq()) >= before.as_micros(),
            "numbered from the clock"
        );
        published(&feed, 3);
        // A page that saw the previous run's events reconnects with a number below this
        // run's first.
        let mut headers = HeaderMap::new();
        let seen_last_run = feed.first_seq() - 1;
        headers.insert("last-event-id", seen_last_run.to_string().parse().unwrap());
        let (recent, _) = feed.subscribe(seen_last_run);
        assert_eq!(
            recent.len(),
            3,
            "a number before this run's first: all of it"
        );
        // Control: a number of this run gets what follows it.
        let (recent, _) = feed.subscribe(feed.first_seq());
        assert_eq!(recent.len(), 2);
        // A number from a run whose clock was ahead (past this run's last) gets all of it too.
        let (recent, _) = feed.subscribe(feed.first_seq() + 1_000);
        assert_eq!(recent.len(), 3);
        // Served: the stream sends the three, with ids from this run.
        let stop = CancellationToken::new();
        let mut stream = feed
            .serve(&headers, Duration::from_secs(60), stop.clone())
            .into_body()
            .into_data_stream();
        let mut text = String::new();
        for _ in 0..3 {
            let chunk = stream.next().await.unwrap().unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        for seq in feed.first_seq()..feed.first_seq() + 3 {
            assert!(text.contains(&format!("id: {seq}\n")), "{seq}: {text}");
        }
        stop.cancel();
    }

    #[test]
    fn a_drain_reads_as_a_disconnection_drained() {
        let registry = Registry::builder().build();
        let event = WorkerEvent::Disconnected {
            worker: WorkerId::from_raw(9),
            reason: DisconnectReason::Drained,
        };
        let json = event_json(&event, &registry, SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(json["kind"], "disconnected");
        assert_eq!(json["detail"], "drained");
        assert_eq!(json["worker_id"], 9);
    }
}
