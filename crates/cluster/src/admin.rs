//! Admin calls between nodes: one node asks every other live member a question (list your
//! workers, describe this pool, drain these workers) and gathers the answers, naming the nodes
//! that gave none.
//!
//! Each node answers on `switchyard.<cluster>.node.<node>.admin` (request/reply). The cluster
//! only carries the calls: what a call means is the [`AdminHandler`] the gateway installs with
//! [`Admin::serve`]. Bounds: an answer larger than the server's `max_payload` (1 MiB by
//! default) is refused by the answering node with a reason, so the asker reports that node
//! as silent rather than a truncated view; at most [`MAX_SERVING`] calls run at once on a
//! node (more are answered "busy"), at most [`MAX_ASKING`] gathers run at once from a node
//! (more wait for a turn within their timeout), and every gather ends within its timeout.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::{Client, Message};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::members::Members;
use crate::names::Names;
use crate::status::{ClusterStatus, Standing};
use crate::wire;

/// Admin calls one node runs at once; more are answered "busy".
pub const MAX_SERVING: usize = 16;
/// Gathers one node runs at once; more wait for a turn (within their timeout).
pub const MAX_ASKING: usize = 8;
/// How long a gather waits for the other nodes, unless the caller says otherwise.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One admin call as a node receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminCall {
    /// The node that asks.
    pub from: String,
    /// What is asked (the gateway's name for the call, such as `ListWorkers`).
    pub call: String,
    /// Who asks, as the asking node authenticated them (opaque to the cluster).
    pub context: String,
    /// The call's arguments (opaque to the cluster).
    pub body: Bytes,
}

/// Answers the admin calls of the other nodes; the gateway implements it over its API.
pub trait AdminHandler: Send + Sync + 'static {
    /// The answer's bytes, or why there is none (sent back to the asker as its reason).
    fn handle(&self, call: AdminCall) -> BoxFuture<'static, Result<Bytes, String>>;
}

/// A node's answer to a gather.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAnswer {
    /// The node that answered.
    pub node: String,
    /// Its answer.
    pub body: Bytes,
}

/// A node that gave no answer to a gather, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SilentNode {
    /// The node.
    pub node: String,
    /// Why: timed out, no responders, or the error it sent back.
    pub reason: String,
}

/// What a gather collected: an answer or a reason for every live node but this one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gathered {
    /// The answers, ordered by node name.
    pub answers: Vec<NodeAnswer>,
    /// The nodes that did not answer, ordered by node name.
    pub silent: Vec<SilentNode>,
}

/// An admin call's metadata on the wire; the payload is the call's body.
#[derive(Debug, Serialize, Deserialize)]
struct CallMeta {
    from: String,
    call: String,
    context: String,
}

/// An answer's metadata on the wire; the payload is the answer's body.
#[derive(Debug, Serialize, Deserialize)]
struct AnswerMeta {
    node: String,
    #[serde(default)]
    error: Option<String>,
}

/// This node's side of the admin calls: asking the others, answering them. Cheap to clone.
#[derive(Clone)]
pub struct Admin {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    names: Names,
    node: String,
    members: Arc<Mutex<Members>>,
    member_ttl: Duration,
    status: ClusterStatus,
    handler: Mutex<Option<Arc<dyn AdminHandler>>>,
    serving: Arc<Semaphore>,
    asking: Semaphore,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("node", &self.inner.node)
            .finish_non_exhaustive()
    }
}

impl Admin {
    pub(crate) fn new(
        client: Client,
        names: Names,
        node: String,
        members: Arc<Mutex<Members>>,
        member_ttl: Duration,
        status: ClusterStatus,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                names,
                node,
                members,
                member_ttl,
                status,
                handler: Mutex::new(None),
                serving: Arc::new(Semaphore::new(MAX_SERVING)),
                asking: Semaphore::new(MAX_ASKING),
            }),
        }
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// Answers the other nodes' calls with `handler` from now on (until then they hear
    /// "not ready").
    pub fn serve(&self, handler: Arc<dyn AdminHandler>) {
        *self
            .inner
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(handler);
    }

    fn handler(&self) -> Option<Arc<dyn AdminHandler>> {
        self.inner
            .handler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The live members other than this node, by name.
    pub fn others(&self) -> Vec<String> {
        let members = self
            .inner
            .members
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut nodes = members.live(self.inner.member_ttl, Instant::now());
        nodes.retain(|node| *node != self.inner.node);
        nodes
    }

    /// Why this node cannot ask the others now (it is degraded: NATS is unreachable or its
    /// name is not held), if it cannot.
    fn cannot_ask(&self) -> Option<String> {
        match self.inner.status.standing() {
            Standing::Joined => None,
            Standing::Degraded(reason) => Some(format!(
                "not asked: {} is degraded ({reason})",
                self.inner.node
            )),
        }
    }

    /// Asks every other live member `call` and gathers their answers within `timeout`; while
    /// this node is degraded, none is asked and each is named silent with the reason at once.
    pub async fn ask_others(
        &self,
        call: &str,
        context: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Gathered {
        let nodes = self.others();
        if let Some(reason) = self.cannot_ask() {
            return Gathered::all_silent(nodes, &reason);
        }
        let deadline = Instant::now() + timeout;
        let Ok(Ok(_turn)) = tokio::time::timeout_at(deadline, self.inner.asking.acquire()).await
        else {
            return Gathered::all_silent(
                nodes,
                &format!("{MAX_ASKING} cluster-wide views already running on this node"),
            );
        };
        let request = self.request(call, context, &body);
        let asks = nodes.into_iter().map(|node| {
            let request = request.clone();
            async move {
                let answer = self.send(&node, request, deadline, timeout).await;
                (node, answer)
            }
        });
        Gathered::collect(futures::future::join_all(asks).await)
    }

    /// Asks one node `call` and waits for its answer within `timeout`.
    pub async fn ask(
        &self,
        node: &str,
        call: &str,
        context: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, String> {
        if let Some(reason) = self.cannot_ask() {
            return Err(reason);
        }
        let request = self.request(call, context, &body);
        self.send(node, request, Instant::now() + timeout, timeout)
            .await
    }

    fn request(&self, call: &str, context: &str, body: &[u8]) -> Bytes {
        let meta = CallMeta {
            from: self.inner.node.clone(),
            call: call.to_owned(),
            context: context.to_owned(),
        };
        wire::frame(&meta, body)
    }

    async fn send(
        &self,
        node: &str,
        request: Bytes,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Bytes, String> {
        let subject = self.inner.names.admin(node);
        let answer =
            tokio::time::timeout_at(deadline, self.inner.client.request(subject, request)).await;
        match answer {
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
            Ok(Err(error)) => Err(error.to_string()),
            Ok(Ok(message)) => read_answer(&message),
        }
    }

    /// Answers this node's admin subject until `stop`.
    pub(crate) async fn follow(self, stop: CancellationToken) {
        loop {
            let subject = self.inner.names.admin(&self.inner.node);
            match self.inner.client.subscribe(subject.clone()).await {
                Ok(mut calls) => loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        call = calls.next() => match call {
                            Some(call) => self.answer(call),
                            None => break,
                        },
                    }
                },
                Err(error) => tracing::debug!(%subject, %error, "cluster: admin subscription"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    fn answer(&self, message: Message) {
        let Some(reply) = message.reply.clone() else {
            return;
        };
        let admin = self.clone();
        let turn = Arc::clone(&self.inner.serving).try_acquire_owned();
        tokio::spawn(async move {
            let result = match turn {
                Err(_) => Err(format!(
                    "busy: {MAX_SERVING} admin calls already running on {}",
                    admin.inner.node
                )),
                Ok(_turn) => admin.run(&message.payload).await,
            };
            let max = admin.inner.client.server_info().max_payload;
            let body = encode_answer(&admin.inner.node, result, max);
            let _ = admin.inner.client.publish(reply, body).await;
        });
    }

    async fn run(&self, payload: &Bytes) -> Result<Bytes, String> {
        let (meta, body) = wire::unframe::<CallMeta>(payload).map_err(|e| e.to_string())?;
        let handler = self
            .handler()
            .ok_or_else(|| format!("{} is not ready for admin calls", self.inner.node))?;
        let call = AdminCall {
            from: meta.from,
            call: meta.call,
            context: meta.context,
            body,
        };
        match tokio::time::timeout(ASK_TIMEOUT, handler.handle(call)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "its answer took longer than {} ms",
                ASK_TIMEOUT.as_millis()
            )),
        }
    }
}

/// The wire answer: the body, or the error; an answer over `max_payload` becomes an error
/// naming both sizes (NATS would refuse it).
fn encode_answer(node: &str, result: Result<Bytes, String>, max_payload: usize) -> Bytes {
    let (error, body) = match result {
        Ok(body) => (None, body),
        Err(reason) => (Some(reason), Bytes::new()),
    };
    let framed = wire::frame(
        &AnswerMeta {
            node: node.to_owned(),
            error,
        },
        &body,
    );
    // Room for the headers NATS adds to a reply is not counted against max_payload; the
    // frame is the whole payload.
    if max_payload > 0 && framed.len() > max_payload {
        return wire::frame(
            &AnswerMeta {
                node: node.to_owned(),
                error: Some(format!(
                    "answer of {} bytes is over the NATS max_payload of {max_payload} bytes",
                    framed.len()
                )),
            },
            &[],
        );
    }
    framed
}

fn read_answer(message: &Message) -> Result<Bytes, String> {
    let (meta, body) =
        wire::unframe::<AnswerMeta>(&message.payload).map_err(|e| format!("unreadable: {e}"))?;
    match meta.error {
        Some(reason) => Err(reason),
        None => Ok(body),
    }
}

impl Gathered {
    /// Sorts `answers` into answers and silent nodes, by node name.
    fn collect(answers: Vec<(String, Result<Bytes, String>)>) -> Self {
        let mut gathered = Self::default();
        for (node, answer) in answers {
            match answer {
                Ok(body) => gathered.answers.push(NodeAnswer { node, body }),
                Err(reason) => gathered.silent.push(SilentNode { node, reason }),
            }
        }
        gathered.answers.sort_by(|a, b| a.node.cmp(&b.node));
        gathered.silent.sort_by(|a, b| a.node.cmp(&b.node));
        gathered
    }

    fn all_silent(nodes: Vec<String>, reason: &str) -> Self {
        Self::collect(
            nodes
                .into_iter()
                .map(|node| (node, Err(reason.to_owned())))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use switchyard_test_support::NatsServer;
    use tokio::sync::Notify;

    use super::*;

    /// Holds every `hold` call until `release` has permits; answers `ping` at once.
    struct Held {
        release: Arc<Semaphore>,
        entered: Arc<AtomicUsize>,
        changed: Arc<Notify>,
    }

    impl AdminHandler for Held {
        fn handle(&self, call: AdminCall) -> BoxFuture<'static, Result<Bytes, String>> {
            let release = Arc::clone(&self.release);
            let entered = Arc::clone(&self.entered);
            let changed = Arc::clone(&self.changed);
            Box::pin(async move {
                if call.call == "hold" {
                    entered.fetch_add(1, Ordering::SeqCst);
                    changed.notify_waiters();
                    let _permit = release.acquire().await.map_err(|e| e.to_string())?;
                }
                Ok(Bytes::from(call.call))
            })
        }
    }

    impl Held {
        /// A handler holding every `hold` call until released, serving `node`'s calls until
        /// `stop`.
        fn serve(node: &Admin, stop: &CancellationToken) -> Arc<Self> {
            let held = Arc::new(Self {
                release: Arc::new(Semaphore::new(0)),
                entered: Arc::new(AtomicUsize::new(0)),
                changed: Arc::new(Notify::new()),
            });
            node.serve(Arc::clone(&held) as Arc<dyn AdminHandler>);
            tokio::spawn(node.clone().follow(stop.clone()));
            held
        }

        /// Waits (up to `patience`) until `count` held calls have entered.
        async fn until_entered(&self, count: usize, patience: Duration) {
            tokio::time::timeout(patience, async {
                loop {
                    let notified = self.changed.notified();
                    if self.entered.load(Ordering::SeqCst) == count {
                        break;
                    }
                    notified.await;
                }
            })
            .await
            .unwrap();
        }
    }

    fn admin(client: &Client, node: &str, members: &Arc<Mutex<Members>>) -> Admin {
        let status = ClusterStatus::new(node);
        status.set(Standing::Joined);
        Admin::new(
            client.clone(),
            Names::new("bounds"),
            node.to_owned(),
            Arc::clone(members),
            Duration::from_secs(60),
            status,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_beyond_the_serving_bound_are_answered_busy() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        let client = async_nats::connect(nats.url()).await.unwrap();
        let members = Arc::new(Mutex::new(Members::default()));
        let (a, b) = (admin(&client, "a", &members), admin(&client, "b", &members));
        let stop = CancellationToken::new();
        let held = Held::serve(&b, &stop);
        let patience = Duration::from_secs(10);
        // B answers once its subscription is up.
        tokio::time::timeout(patience, async {
            while a
                .ask("b", "ping", "", Bytes::new(), patience)
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        let mut holding = tokio::task::JoinSet::new();
        for _ in 0..MAX_SERVING {
            let a = a.clone();
            holding.spawn(async move { a.ask("b", "hold", "", Bytes::new(), patience).await });
        }
        held.until_entered(MAX_SERVING, patience).await;
        let refused = a.ask("b", "ping", "", Bytes::new(), patience).await;
        let reason = refused.unwrap_err();
        assert!(reason.contains("busy: 16 admin calls"), "{reason}");
        // Control: once the held calls end, B answers again, and every held call was answered.
        held.release.add_permits(MAX_SERVING);
        for answer in holding.join_all().await {
            assert_eq!(answer.unwrap(), Bytes::from_static(b"hold"));
        }
        let answered = a.ask("b", "ping", "", Bytes::new(), patience).await;
        assert_eq!(answered.unwrap(), Bytes::from_static(b"ping"));
        stop.cancel();
    }

    /// `docs/cluster.md`: a node runs at most 8 gathers at once; more wait for a turn within
    /// their own timeout, and one whose timeout passes first names every node silent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gathers_beyond_the_asking_bound_wait_for_a_turn_within_their_timeout() {
        let Some(nats) = NatsServer::start() else {
            return;
        };
        assert_eq!(MAX_ASKING, 8);
        let client = async_nats::connect(nats.url()).await.unwrap();
        let members = Arc::new(Mutex::new(Members::default()));
        members
            .lock()
            .unwrap()
            .seen("b", 1, tokio::time::Instant::now());
        let (a, b) = (admin(&client, "a", &members), admin(&client, "b", &members));
        let stop = CancellationToken::new();
        let held = Held::serve(&b, &stop);
        let patience = Duration::from_secs(10);
        tokio::time::timeout(patience, async {
            while a
                .ask_others("ping", "", Bytes::new(), patience)
                .await
                .answers
                .is_empty()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        let mut holding = tokio::task::JoinSet::new();
        for _ in 0..MAX_ASKING {
            let a = a.clone();
            holding.spawn(async move { a.ask_others("hold", "", Bytes::new(), patience).await });
        }
        held.until_entered(MAX_ASKING, patience).await;
        // A ninth gather finds no turn within its 300 ms: every node named silent, why said.
        let late = a
            .ask_others("ping", "", Bytes::new(), Duration::from_millis(300))
            .await;
        assert!(late.answers.is_empty(), "{late:?}");
        assert_eq!(late.silent.len(), 1);
        assert_eq!(late.silent[0].node, "b");
        assert!(
            late.silent[0]
                .reason
                .contains("8 cluster-wide views already running"),
            "{late:?}"
        );
        // Control: one with time to wait gets the turn a finished gather leaves.
        let waiting = {
            let a = a.clone();
            tokio::spawn(async move { a.ask_others("ping", "", Bytes::new(), patience).await })
        };
        held.release.add_permits(MAX_ASKING);
        let answered = waiting.await.unwrap();
        assert!(answered.silent.is_empty(), "{answered:?}");
        assert_eq!(answered.answers.len(), 1);
        for gathered in holding.join_all().await {
            assert_eq!(gathered.answers.len(), 1, "{gathered:?}");
        }
        stop.cancel();
    }

    #[test]
    fn an_answer_over_max_payload_becomes_a_reason_naming_the_sizes() {
        let small = encode_answer("b", Ok(Bytes::from_static(b"12345")), 1024);
        let (meta, body) = wire::unframe::<AnswerMeta>(&small).unwrap();
        assert_eq!((meta.error, &body[..]), (None, &b"12345"[..]));
        // Control: the same answer over the limit is refused with both sizes, not cut.
        let big = encode_answer("b", Ok(Bytes::from(vec![7u8; 2000])), 1024);
        assert!(big.len() < 1024);
        let (meta, body) = wire::unframe::<AnswerMeta>(&big).unwrap();
        let reason = meta.error.unwrap();
        assert!(reason.contains("max_payload of 1024 bytes"), "{reason}");
        assert!(body.is_empty());
    }

    #[test]
    fn a_gather_names_every_node_that_did_not_answer() {
        let gathered = Gathered::collect(vec![
            ("c".to_owned(), Err("no answer within 2000 ms".to_owned())),
            ("b".to_owned(), Ok(Bytes::from_static(b"x"))),
            ("a".to_owned(), Err("no responders".to_owned())),
        ]);
        assert_eq!(gathered.answers.len(), 1);
        assert_eq!(gathered.answers[0].node, "b");
        let silent: Vec<&str> = gathered.silent.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(silent, ["a", "c"], "ordered by name, none dropped");
    }

    /// `docs/cluster.md`, "Cluster-wide views": a node that does not answer within 2 s is
    /// reported as such.
    #[test]
    fn the_ask_timeout_is_the_documented_one() {
        assert_eq!(ASK_TIMEOUT, Duration::from_secs(2));
    }
}
