//! `/v1/events` across a cluster: every node's worker events, each line carrying the
//! `gateway_node` it happened on.
//!
//! A stream opens with the recent events of every node ([`super::events::RECENT`] per node)
//! merged in time order ([`merge_in_time_order`]; each node's own lines keep their order),
//! then follows live: this node's events as they happen, the other nodes' as [`ClusterEvents`]
//! polls them every [`POLL`] while any stream is open (one poll per node for all its streams,
//! so a remote event reaches a page up to one poll late and live lines are in arrival order).
//! Sequence numbers are per node, so the SSE `id` is a per-node cursor ([`Cursor`],
//! `a:12,b:5`): a page that reconnects with it as `Last-Event-ID` is sent, from each node,
//! only what it has not seen. Nodes that did not answer are named in a
//! `{"kind":"silent_nodes"}` line, at the start and whenever the set changes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::http::HeaderMap;
use axum::response::Response;
use axum::response::sse::Event;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_proto::v1 as pb;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, OwnedSemaphorePermit, broadcast};
use tokio_util::sync::CancellationToken;

use super::events::{self, EventFeed, Line};
use crate::api::ClusterViews;

/// How often the other nodes' events are asked for while a stream is open.
pub(crate) const POLL: Duration = Duration::from_secs(1);
/// The operations view another node answers with its recent events.
pub(crate) const VIEW: &str = "events";
/// Remote lines one stream may be behind before it is told it missed some. A poll sends all
/// at once, before any stream reads: this holds a whole first poll (every node's kept lines,
/// which each stream's opening fetched too) of a cluster of up to five nodes, so a page does
/// not open on a `missed` line for lines it has. A power of two: tokio's broadcast channel
/// rounds its capacity up to one, so this is the bound streams really have.
const REMOTE_BUFFER: usize = (4 * events::RECENT + 16).next_power_of_two();

/// The last sequence number seen from each node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cursor(BTreeMap<String, u64>);

impl Cursor {
    /// Reads `a:12,b:5`; a bare number (an id given out outside a cluster) is `own`'s.
    /// Unreadable entries are left out: their nodes replay all they keep.
    pub(crate) fn parse(text: &str, own: &str) -> Self {
        if let Ok(seq) = text.trim().parse::<u64>() {
            return Self(BTreeMap::from([(own.to_owned(), seq)]));
        }
        let entries = text.split(',').take(MAX_NODES);
        Self(
            entries
                .filter_map(|entry| {
                    let (node, seq) = entry.rsplit_once(':')?;
                    Some((node.trim().to_owned(), seq.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// The cursor as [`Cursor::parse`] reads it back.
    pub(crate) fn encode(&self) -> String {
        let entries: Vec<String> = self.0.iter().map(|(n, s)| format!("{n}:{s}")).collect();
        entries.join(",")
    }

    /// The last number seen from `node` (0 for none).
    pub(crate) fn get(&self, node: &str) -> u64 {
        self.0.get(node).copied().unwrap_or(0)
    }

    fn set(&mut self, node: &str, seq: u64) {
        self.0.insert(node.to_owned(), seq);
    }

    /// Whether `node`, whose run numbers from `first_seq` and whose next event will carry
    /// `next_seq`, restarted since the cursor was given out (the cursor's number is not one
    /// of this run's: [`events::from_this_run`]); if so its entry moves to just before the
    /// run's first number, so that what the run no longer keeps counts as missed.
    pub(crate) fn restarted(&mut self, node: &str, first_seq: u64, next_seq: u64) -> bool {
        if events::from_this_run(self.get(node), first_seq, next_seq) {
            return false;
        }
        self.set(node, first_seq.saturating_sub(1));
        true
    }

    /// How many lines of `node` before `oldest` the cursor has not seen, when the node
    /// keeps no line before `oldest` any more; 0 for a node the cursor does not name (a page
    /// that opened after them was never owed them).
    pub(crate) fn missed_before(&self, node: &str, oldest: u64) -> u64 {
        self.0
            .get(node)
            .map_or(0, |&seen| oldest.saturating_sub(seen.saturating_add(1)))
    }

    /// Whether line `seq` of `node` is past the cursor (the page has not seen it); if so the
    /// cursor moves to it.
    pub(crate) fn advance(&mut self, node: &str, seq: u64) -> bool {
        if seq <= self.get(node) {
            return false;
        }
        self.set(node, seq);
        true
    }
}

/// Nodes a cursor names at most; a longer `Last-Event-ID` is cut.
const MAX_NODES: usize = 64;

/// One node's answer to [`VIEW`]: its recent lines after the asker's cursor.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct NodeEvents {
    /// The number of its run's first event (0 from a node that does not say).
    #[serde(default)]
    pub(crate) first_seq: u64,
    /// The number its next event will carry.
    pub(crate) next_seq: u64,
    /// Its recent lines after the cursor, oldest first.
    pub(crate) events: Vec<Value>,
}

/// This node's answer to another node's [`VIEW`] call; `body` is the asker's cursor.
pub(crate) fn answer(feed: &EventFeed, node: &str, body: &str) -> Value {
    let (next_seq, lines) = feed.after(Cursor::parse(body, "").get(node));
    let events = lines
        .iter()
        .filter_map(|line| serde_json::from_str(&line.json).ok())
        .collect();
    let first_seq = feed.first_seq();
    serde_json::to_value(NodeEvents {
        first_seq,
        next_seq,
        events,
    })
    .unwrap_or(Value::Null)
}

/// An event line from one node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NodeLine {
    /// The node it happened on.
    pub(crate) node: String,
    /// Its number on that node.
    pub(crate) seq: u64,
    /// The line, `gateway_node` included.
    pub(crate) json: Value,
}

impl NodeLine {
    fn of(node: &str, mut json: Value) -> Option<Self> {
        let seq = json.get("seq").and_then(Value::as_u64)?;
        json.as_object_mut()?
            .insert("gateway_node".to_owned(), Value::String(node.to_owned()));
        Some(Self {
            node: node.to_owned(),
            seq,
            json,
        })
    }

    fn at(&self) -> u64 {
        self.json
            .get("at_unix_ms")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

/// Every node's lines (each node's in its own order) as one list in time order: at each step
/// the earliest head of any node goes next (ties by node name), so a node's lines are never
/// reordered among themselves even when its clock stepped back.
pub(crate) fn merge_in_time_order(nodes: Vec<Vec<NodeLine>>) -> Vec<NodeLine> {
    let mut queues: Vec<VecDeque<NodeLine>> = nodes.into_iter().map(VecDeque::from).collect();
    let mut merged = Vec::with_capacity(queues.iter().map(VecDeque::len).sum());
    loop {
        let next = queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.front().map(|line| ((line.at(), line.node.clone()), i)))
            .min();
        let Some((_, i)) = next else {
            return merged;
        };
        if let Some(line) = queues.get_mut(i).and_then(VecDeque::pop_front) {
            merged.push(line);
        }
    }
}

/// The line naming the nodes that did not answer (an empty list: every node answers again).
pub(crate) fn silent_line(silent: &[pb::SilentNode], at: SystemTime) -> Value {
    let named: Vec<String> = silent
        .iter()
        .map(|s| format!("{}: {}", s.node, s.reason))
        .collect();
    let detail = if named.is_empty() {
        "every node answers".to_owned()
    } else {
        format!("no events from {}", named.join("; "))
    };
    json!({
        "kind": "silent_nodes",
        "at_unix_ms": crate::api::unix_ms(at),
        "silent_nodes": silent
            .iter()
            .map(|s| json!({ "node": s.node, "reason": s.reason }))
            .collect::<Vec<_>>(),
        "detail": detail,
    })
}

/// What the poller hands every open stream.
#[derive(Clone, Debug)]
enum Remote {
    /// A line from another node.
    Line(NodeLine),
    /// The node restarted: its new run numbers from `first_seq`.
    Restarted { node: String, first_seq: u64 },
    /// The nodes that did not answer changed to these.
    Silent(Vec<pb::SilentNode>),
    /// A node had more events between two polls than it keeps: its lines before `oldest`
    /// (past the poller's cursor) were never seen. A stream counts those past its own cursor.
    Missed { node: String, oldest: u64 },
}

/// What one poll's `answers` tell the streams, in order, moving `cursor` past them. A node
/// the cursor names whose oldest line is past the cursor's next number lost lines between the
/// polls ([`Remote::Missed`]); one it does not name yet is polled for the first time.
fn heard(cursor: &mut Cursor, answers: Vec<(String, NodeEvents)>) -> Vec<Remote> {
    let mut told = Vec::new();
    for (node, answer) in answers {
        if cursor.restarted(&node, answer.first_seq, answer.next_seq) {
            told.push(Remote::Restarted {
                node: node.clone(),
                first_seq: answer.first_seq,
            });
        }
        let last = answer.next_seq.saturating_sub(1);
        let oldest = answer
            .events
            .first()
            .and_then(|json| json.get("seq"))
            .and_then(Value::as_u64)
            .map_or(answer.next_seq, |seq| seq.min(answer.next_seq));
        if cursor.missed_before(&node, oldest) > 0 {
            told.push(Remote::Missed {
                node: node.clone(),
                oldest,
            });
        }
        for json in answer.events {
            if let Some(line) = NodeLine::of(&node, json) {
                told.push(Remote::Line(line));
            }
        }
        cursor.set(&node, last);
    }
    told
}

/// Whether a poll's `silent` nodes are a change the open streams must be told of, remembering
/// them in `before`: a different set of names than the last poll's (an empty one included:
/// every node answers again). The first poll's silence is not, each stream's own opening has
/// told it.
fn silence_changed(before: &mut Option<Vec<String>>, silent: &[pb::SilentNode]) -> bool {
    let names: Vec<String> = silent.iter().map(|s| s.node.clone()).collect();
    if before.as_ref() == Some(&names) {
        return false;
    }
    let first = before.is_none();
    *before = Some(names);
    !first
}

/// The other nodes' events, polled while any stream is open; see the module documentation.
#[derive(Debug)]
pub(crate) struct ClusterEvents {
    views: Arc<ClusterViews>,
    sender: broadcast::Sender<Remote>,
    watching: AtomicUsize,
    opened: Notify,
}

/// Counts one open stream while it lives.
#[derive(Debug)]
struct Watching(Arc<ClusterEvents>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.watching.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ClusterEvents {
    /// Starts polling the other nodes of `views` while streams are open, until `stop`.
    pub(crate) fn start(views: Arc<ClusterViews>, stop: CancellationToken) -> Arc<Self> {
        let events = Arc::new(Self {
            views,
            sender: broadcast::channel(REMOTE_BUFFER).0,
            watching: AtomicUsize::new(0),
            opened: Notify::new(),
        });
        tokio::spawn(Arc::clone(&events).follow(stop));
        events
    }

    fn watch(self: &Arc<Self>) -> (Watching, broadcast::Receiver<Remote>) {
        let receiver = self.sender.subscribe();
        self.watching.fetch_add(1, Ordering::SeqCst);
        self.opened.notify_one();
        (Watching(Arc::clone(self)), receiver)
    }

    /// Every other node's lines after `cursor`, by node, and the nodes that gave none.
    async fn gather(&self, cursor: &Cursor) -> (Vec<(String, NodeEvents)>, Vec<pb::SilentNode>) {
        let (answers, mut silent) = self.views.ops(VIEW, &cursor.encode()).await;
        let mut read = Vec::new();
        for (node, answer) in answers {
            match serde_json::from_value::<NodeEvents>(answer) {
                Ok(events) => read.push((node, events)),
                Err(error) => silent.push(pb::SilentNode {
                    node,
                    reason: format!("unreadable answer: {error}"),
                }),
            }
        }
        (read, silent)
    }

    async fn follow(self: Arc<Self>, stop: CancellationToken) {
        let mut cursor = Cursor::default();
        let mut silent_before: Option<Vec<String>> = None;
        loop {
            while self.watching.load(Ordering::SeqCst) == 0 {
                let opened = self.opened.notified();
                if self.watching.load(Ordering::SeqCst) > 0 {
                    break;
                }
                tokio::select! {
                    () = opened => {}
                    () = stop.cancelled() => return,
                }
            }
            let (answers, silent) = tokio::select! {
                gathered = self.gather(&cursor) => gathered,
                () = stop.cancelled() => return,
            };
            for remote in heard(&mut cursor, answers) {
                let _ = self.sender.send(remote);
            }
            if silence_changed(&mut silent_before, &silent) {
                let _ = self.sender.send(Remote::Silent(silent));
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// The `/v1/events` response in a cluster: every node's recent events the page has not
    /// seen, then live ones, until `stop`; 503 when the stream limit is reached.
    pub(crate) fn serve(
        self: &Arc<Self>,
        feed: &EventFeed,
        headers: &HeaderMap,
        idle_timeout: Duration,
        stop: CancellationToken,
    ) -> Response {
        let Some(permit) = feed.watcher() else {
            return events::too_many_watchers();
        };
        let node = self.views.node().to_owned();
        let mut cursor = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(|v| Cursor::parse(v, &node))
            .unwrap_or_default();
        // Receivers first, the replay after: nothing falls between them; what both carry is
        // sent once, by the cursor.
        let (watching, remote) = self.watch();
        let (next_seq, recent, local) = feed.resume(cursor.get(&node));
        cursor.restarted(&node, feed.first_seq(), next_seq);
        let stream = Stream {
            events: Arc::clone(self),
            page: Page {
                node,
                cursor,
                pending: VecDeque::new(),
            },
            replay: Some(recent),
            local,
            remote,
            _held: (permit, watching),
        };
        let events = futures::stream::unfold(stream, |mut stream| async move {
            let event = stream.next().await?;
            Some((event, stream))
        });
        events::sse(events, idle_timeout, stop)
    }
}

/// What a stream heard next.
enum Got {
    Local(Result<Line, RecvError>),
    Remote(Result<Remote, RecvError>),
}

/// One open stream's state.
struct Stream {
    events: Arc<ClusterEvents>,
    page: Page,
    /// This node's recent lines, until the opening replay ran.
    replay: Option<Vec<Line>>,
    local: broadcast::Receiver<Line>,
    remote: broadcast::Receiver<Remote>,
    _held: (OwnedSemaphorePermit, Watching),
}

impl Stream {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(sent) = self.page.pending.pop_front() {
                return Some(sent.event());
            }
            if let Some(recent) = self.replay.take() {
                self.open(recent).await;
                continue;
            }
            let got = tokio::select! {
                line = self.local.recv() => Got::Local(line),
                remote = self.remote.recv() => Got::Remote(remote),
            };
            let open = match got {
                Got::Local(line) => self.page.hear_local(line),
                Got::Remote(remote) => self.page.hear_remote(remote),
            };
            if !open {
                return None;
            }
        }
    }

    /// The opening: the nodes that did not answer, then every node's recent lines after the
    /// cursor in time order.
    async fn open(&mut self, recent: Vec<Line>) {
        let page = &mut self.page;
        let own: Vec<NodeLine> = recent
            .iter()
            .filter_map(|line| serde_json::from_str(&line.json).ok())
            .filter_map(|json| NodeLine::of(&page.node, json))
            .collect();
        let (answers, silent) = self.events.gather(&page.cursor).await;
        if !silent.is_empty() {
            page.silent(&silent);
        }
        let mut nodes = vec![own];
        for (node, answer) in answers {
            page.cursor
                .restarted(&node, answer.first_seq, answer.next_seq);
            let lines = answer.events.into_iter();
            nodes.push(lines.filter_map(|json| NodeLine::of(&node, json)).collect());
        }
        for line in merge_in_time_order(nodes) {
            page.push(line);
        }
    }
}

/// One SSE event a page is owed: its data, and its `id` (the cursor) for an event line.
#[derive(Debug)]
struct Sent {
    data: String,
    id: Option<String>,
}

impl Sent {
    fn event(self) -> Event {
        let event = Event::default().data(self.data);
        match self.id {
            Some(id) => event.id(id),
            None => event,
        }
    }
}

/// What one stream's page has seen (`cursor`) and is owed (`pending`): the lines it hears are
/// queued once each, and a receiver that fell behind its channel is told what it missed.
struct Page {
    /// The node serving the stream.
    node: String,
    cursor: Cursor,
    pending: VecDeque<Sent>,
}

impl Page {
    /// Takes what this node's own feed gave; false once the feed has closed.
    fn hear_local(&mut self, line: Result<Line, RecvError>) -> bool {
        match line {
            Ok(line) => {
                let json = serde_json::from_str(&line.json).ok();
                if let Some(line) = json.and_then(|json| NodeLine::of(&self.node, json)) {
                    self.push(line);
                }
            }
            Err(RecvError::Lagged(count)) => self.missed(count),
            Err(RecvError::Closed) => return false,
        }
        true
    }

    /// Takes what the poller gave; false once it has stopped.
    fn hear_remote(&mut self, remote: Result<Remote, RecvError>) -> bool {
        match remote {
            Ok(Remote::Line(line)) => self.push(line),
            Ok(Remote::Restarted { node, first_seq }) => {
                self.cursor.set(&node, first_seq.saturating_sub(1));
            }
            Ok(Remote::Missed { node, oldest }) => {
                let count = self.cursor.missed_before(&node, oldest);
                if count > 0 {
                    self.missed(count);
                }
            }
            Ok(Remote::Silent(silent)) => self.silent(&silent),
            Err(RecvError::Lagged(count)) => self.missed(count),
            Err(RecvError::Closed) => return false,
        }
        true
    }

    /// Queues `line` unless the page has it, moving the cursor past it.
    fn push(&mut self, line: NodeLine) {
        if !self.cursor.advance(&line.node, line.seq) {
            return;
        }
        self.pending.push_back(Sent {
            data: line.json.to_string(),
            id: Some(self.cursor.encode()),
        });
    }

    fn missed(&mut self, count: u64) {
        self.pending.push_back(Sent {
            data: events::missed(count, SystemTime::now()).to_string(),
            id: None,
        });
    }

    fn silent(&mut self, silent: &[pb::SilentNode]) {
        self.pending.push_back(Sent {
            data: silent_line(silent, SystemTime::now()).to_string(),
            id: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(node: &str, seq: u64, at: u64) -> NodeLine {
        NodeLine::of(
            node,
            json!({ "seq": seq, "at_unix_ms": at, "kind": "connected" }),
        )
        .unwrap()
    }

    fn order(lines: &[NodeLine]) -> Vec<(&str, u64)> {
        lines.iter().map(|l| (l.node.as_str(), l.seq)).collect()
    }

    #[test]
    fn every_nodes_events_are_merged_in_time_order_and_tagged_with_their_node() {
        let merged = merge_in_time_order(vec![
            vec![line("a", 1, 100), line("a", 2, 300)],
            vec![line("c", 7, 200), line("c", 8, 400)],
            vec![],
        ]);
        assert_eq!(order(&merged), [("a", 1), ("c", 7), ("a", 2), ("c", 8)]);
        assert!(
            merged
                .iter()
                .all(|l| l.json["gateway_node"] == l.node.as_str())
        );
        // Control: a node whose clock stepped back keeps its own order; the merge does not
        // put its later line before its earlier one.
        let merged = merge_in_time_order(vec![
            vec![line("a", 1, 500), line("a", 2, 100)],
            vec![line("b", 1, 300)],
        ]);
        assert_eq!(order(&merged), [("b", 1), ("a", 1), ("a", 2)]);
    }

    #[test]
    fn the_cursor_is_per_node_and_reads_back_a_single_nodes_id() {
        let mut cursor = Cursor::default();
        cursor.set("a", 12);
        cursor.set("b", 5);
        assert_eq!(cursor.encode(), "a:12,b:5");
        assert_eq!(Cursor::parse(&cursor.encode(), "a"), cursor);
        // An id given out before the node joined a cluster is its own number.
        assert_eq!(Cursor::parse("40", "c").get("c"), 40);
        // Control: unreadable entries are left out, not read as zero for everyone.
        let read = Cursor::parse("a:x,b:3,garbage", "a");
        assert_eq!((read.get("a"), read.get("b")), (0, 3));
    }

    #[test]
    fn a_node_answers_after_the_askers_cursor_and_from_the_start_after_a_restart() {
        let feed = EventFeed::numbered_from(1);
        for i in 0..3 {
            feed.publish(json!({ "kind": "test", "worker_id": i }));
        }
        let after: NodeEvents = serde_json::from_value(answer(&feed, "c", "a:9,c:2")).unwrap();
        assert_eq!(after.next_seq, 4);
        let seqs: Vec<u64> = after
            .events
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [3], "only what the asker has not seen from c");
        // Control: a cursor past c's numbers was given out before c restarted: all of it.
        let restarted: NodeEvents = serde_json::from_value(answer(&feed, "c", "c:50")).unwrap();
        assert_eq!(restarted.events.len(), 3);
    }

    #[test]
    fn a_node_that_restarted_sends_all_its_new_run_keeps_whatever_the_pages_number() {
        let published = |feed: &EventFeed, n: u64| {
            for i in 0..n {
                feed.publish(json!({ "kind": "test", "worker_id": i }));
            }
        };
        let ask = |feed: &EventFeed, cursor: &str| -> NodeEvents {
            serde_json::from_value(answer(feed, "c", cursor)).unwrap()
        };
        // c's first run numbers from 100; the page saw all ten of its events.
        let first = EventFeed::numbered_from(100);
        published(&first, 10);
        let mut page = Cursor::parse("c:109", "a");
        // c restarts numbering from where its clock is, and has twenty events before the
        // page asks again: more than the page had seen.
        let second = EventFeed::numbered_from(5_000);
        published(&second, 20);
        let answered = ask(&second, &page.encode());
        assert_eq!(answered.first_seq, 5_000);
        assert_eq!(answered.events.len(), 20, "all the new run keeps");
        assert!(page.restarted("c", answered.first_seq, answered.next_seq));
        assert_eq!(page.get("c"), 4_999, "just before the new run");
        assert!(page.advance("c", 5_000));
        // Control: a number of the new run is from this run, and gets only what follows it.
        assert!(!page.restarted("c", 5_000, 5_020));
        assert_eq!(ask(&second, "c:5010").events.len(), 9);
        // Control: had the new run numbered from 1 again (as before numbers followed the
        // clock), the page's 10 would read as this run's and hide its first ten events.
        let first = EventFeed::numbered_from(1);
        published(&first, 10);
        let again_from_one = EventFeed::numbered_from(1);
        published(&again_from_one, 20);
        assert_eq!(ask(&again_from_one, "c:10").events.len(), 10);
    }

    /// A node of an earlier version says nothing of where its run starts: its answer reads
    /// as numbering from 0, and a restart of it is caught only when its numbers fall below
    /// the page's.
    #[test]
    fn an_earlier_version_node_is_caught_restarting_only_below_the_pages_number() {
        let earlier: NodeEvents =
            serde_json::from_value(json!({ "next_seq": 21, "events": [] })).unwrap();
        assert_eq!(earlier.first_seq, 0, "no first_seq reads as 0");
        // Its new run (numbered from 1) is at 20 and the page had seen up to 50: caught, and
        // the page's entry moves before the run's first number.
        let mut page = Cursor::parse("b:50", "a");
        assert!(page.restarted("b", earlier.first_seq, earlier.next_seq));
        assert_eq!(page.get("b"), 0);
        // Not caught: the page had seen up to 10 of the old run, and the new run is past it,
        // so its first ten lines read as seen.
        let mut page = Cursor::parse("b:10", "a");
        assert!(!page.restarted("b", earlier.first_seq, earlier.next_seq));
        assert_eq!(page.get("b"), 10);
        // Control: a node of this version saying its run starts at 15 is caught at 10 too.
        assert!(page.restarted("b", 15, 21));
    }

    #[test]
    fn a_silent_node_is_named_with_its_reason() {
        let silent = [pb::SilentNode {
            node: "b".to_owned(),
            reason: "no answer within 2000 ms".to_owned(),
        }];
        let line = silent_line(&silent, SystemTime::UNIX_EPOCH);
        assert_eq!(line["kind"], "silent_nodes");
        assert_eq!(line["silent_nodes"][0]["node"], "b");
        assert!(line["detail"].as_str().unwrap().contains("b: no answer"));
        // Control: with every node answering, none is named.
        let line = silent_line(&[], SystemTime::UNIX_EPOCH);
        assert_eq!(line["silent_nodes"], json!([]));
    }

    #[test]
    fn streams_are_told_each_change_of_the_silent_set_after_the_first_poll() {
        let silent = |nodes: &[&str]| -> Vec<pb::SilentNode> {
            nodes
                .iter()
                .map(|node| pb::SilentNode {
                    node: (*node).to_owned(),
                    reason: "no responders".to_owned(),
                })
                .collect()
        };
        let mut before = None;
        assert!(
            !silence_changed(&mut before, &silent(&["c"])),
            "the opening told it"
        );
        assert!(!silence_changed(&mut before, &silent(&["c"])), "no change");
        assert!(
            silence_changed(&mut before, &silent(&["b", "c"])),
            "b fell silent"
        );
        assert!(
            silence_changed(&mut before, &silent(&[])),
            "every node answers again"
        );
        assert!(!silence_changed(&mut before, &silent(&[])));
        // Control: a first poll with every node answering is no change either.
        let mut fresh = None;
        assert!(!silence_changed(&mut fresh, &[]));
        assert!(silence_changed(&mut fresh, &silent(&["c"])));
    }

    #[test]
    fn a_stream_sends_each_line_once_with_the_cursor_as_its_id() {
        let mut cursor = Cursor::parse("c:3", "a");
        let mut sent = Vec::new();
        for l in [
            line("a", 1, 10),
            line("c", 3, 20),
            line("c", 4, 30),
            line("a", 1, 10),
        ] {
            if cursor.advance(&l.node, l.seq) {
                sent.push((l.node.clone(), l.seq, cursor.encode()));
            }
        }
        // c:3 was seen before the reconnection, a:1 arrives twice (replay and poll).
        assert_eq!(
            sent,
            [
                ("a".to_owned(), 1, "a:1,c:3".to_owned()),
                ("c".to_owned(), 4, "a:1,c:4".to_owned()),
            ]
        );
        // Control: once c restarted (its next number is below the cursor), its low numbers
        // are new again.
        assert!(!cursor.advance("c", 1));
        assert!(
            !cursor.restarted("c", 1, 5),
            "c's next is 5, past the cursor's 4"
        );
        assert!(cursor.restarted("c", 1, 2));
        assert!(cursor.advance("c", 1));
    }

    fn node_events(seqs: std::ops::RangeInclusive<u64>) -> NodeEvents {
        NodeEvents {
            first_seq: 1,
            next_seq: seqs.end() + 1,
            events: seqs
                .map(|seq| json!({ "seq": seq, "kind": "test" }))
                .collect(),
        }
    }

    fn oldest_kept(told: &[Remote]) -> Vec<u64> {
        told.iter()
            .filter_map(|remote| match remote {
                Remote::Missed { oldest, .. } => Some(*oldest),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_poll_finding_lines_a_node_no_longer_keeps_tells_the_streams_how_many() {
        let mut cursor = Cursor::default();
        // A first poll: the node keeps 11..=20 of its 20; nothing seen before, nothing missed.
        let told = heard(&mut cursor, vec![("b".to_owned(), node_events(11..=20))]);
        assert!(oldest_kept(&told).is_empty());
        assert_eq!(cursor.get("b"), 20);
        // Control: the next poll gets 21..=25, right after the cursor: nothing missed.
        let told = heard(&mut cursor, vec![("b".to_owned(), node_events(21..=25))]);
        assert!(oldest_kept(&told).is_empty());
        assert_eq!(told.len(), 5);
        // 26..=300 happened between two polls; b keeps only 101..=300.
        let told = heard(&mut cursor, vec![("b".to_owned(), node_events(101..=300))]);
        assert_eq!(oldest_kept(&told), [101], "26..=100 were never sent");
        assert_eq!(cursor.get("b"), 300);
        // A stream that saw b up to 25 is told of 75; one opened since, at 300, of none; one
        // that never heard from b is owed nothing.
        let page = Cursor::parse("b:25", "a");
        assert_eq!(page.missed_before("b", 101), 75);
        assert_eq!(Cursor::parse("b:300", "a").missed_before("b", 101), 0);
        assert_eq!(Cursor::parse("c:3", "a").missed_before("b", 101), 0);
        // A restart is not a gap: b numbers from 1 again.
        let told = heard(&mut cursor, vec![("b".to_owned(), node_events(1..=3))]);
        assert!(
            matches!(told.first(), Some(Remote::Restarted { node, first_seq: 1 }) if node == "b")
        );
        assert!(oldest_kept(&told).is_empty());
        // But a new run that lost lines before the poll reached it is: b restarted numbering
        // from 1,000 and keeps 1,101..=1,300 of them; 101 were never sent.
        let restarted = NodeEvents {
            first_seq: 1_000,
            ..node_events(1_101..=1_300)
        };
        let told = heard(&mut cursor, vec![("b".to_owned(), restarted)]);
        assert!(matches!(
            told.first(),
            Some(Remote::Restarted {
                first_seq: 1_000,
                ..
            })
        ));
        assert_eq!(oldest_kept(&told), [1_101]);
        let mut page = Cursor::parse("b:3", "a");
        assert!(page.restarted("b", 1_000, 1_301));
        assert_eq!(page.missed_before("b", 1_101), 101);
    }

    /// What a page that read nothing while `sent` remote lines (b's 1..=sent) were handed to
    /// a channel of the stream's size is owed once it reads.
    fn owed_after(sent: u64) -> Vec<Sent> {
        let (sender, mut receiver) = broadcast::channel(REMOTE_BUFFER);
        for seq in 1..=sent {
            sender.send(Remote::Line(line("b", seq, seq))).unwrap();
        }
        let mut page = Page {
            node: "a".to_owned(),
            cursor: Cursor::default(),
            pending: VecDeque::new(),
        };
        loop {
            let heard = match receiver.try_recv() {
                Ok(remote) => Ok(remote),
                Err(broadcast::error::TryRecvError::Lagged(count)) => Err(RecvError::Lagged(count)),
                Err(_) => return page.pending.into(),
            };
            assert!(page.hear_remote(heard));
        }
    }

    #[test]
    fn a_stream_more_remote_lines_behind_than_its_buffer_is_told_how_many_it_missed() {
        assert_eq!(REMOTE_BUFFER, 1_024, "the figure docs/cluster.md gives");
        let behind = owed_after(1_025);
        let first: Value = serde_json::from_str(&behind[0].data).unwrap();
        assert_eq!(
            (&first["kind"], &first["count"]),
            (&json!("missed"), &json!(1))
        );
        assert_eq!(behind[0].id, None, "a missed line moves no cursor");
        // Then the 1,024 lines the channel kept, from b's second on.
        assert_eq!(behind.len(), 1 + 1_024);
        assert_eq!(behind[1].id.as_deref(), Some("b:2"));
        assert_eq!(behind[1_024].id.as_deref(), Some("b:1025"));
        // Control: 1,024 behind, every line comes and nothing is said missed.
        let within = owed_after(1_024);
        assert_eq!(within.len(), 1_024);
        assert!(within.iter().all(|sent| sent.id.is_some()));
    }

    #[test]
    fn a_first_poll_of_four_other_nodes_keeping_all_they_can_fits_the_buffer() {
        let lines_heard = |buffer: usize| {
            let full = || node_events(1..=events::RECENT as u64);
            let answers = ["b", "c", "d", "e"].map(|node| (node.to_owned(), full()));
            let (sender, mut stream) = broadcast::channel(buffer);
            for remote in heard(&mut Cursor::default(), answers.into()) {
                let _ = sender.send(remote);
            }
            let mut lines = 0;
            loop {
                match stream.try_recv() {
                    Ok(Remote::Line(_)) => lines += 1,
                    Ok(_) => {}
                    Err(broadcast::error::TryRecvError::Empty) => return Ok(lines),
                    Err(error) => return Err(error),
                }
            }
        };
        assert_eq!(lines_heard(REMOTE_BUFFER), Ok(4 * events::RECENT));
        // Control: a buffer of a node's worth of lines falls behind the same poll.
        assert!(lines_heard(events::RECENT).is_err());
    }

    /// `docs/cluster.md`: one poll of the other nodes' events per second.
    #[test]
    fn events_are_polled_once_a_second() {
        assert_eq!(POLL, Duration::from_secs(1));
    }
}
