//! Least privilege over real sockets: each principal may only do what its roles allow, reaches
//! only its own dispatches unless it operates the namespace, sees other principals' workers
//! without their identities, and cannot tell a worker it may not drain from one that does not
//! exist. Worker quotas per principal and per connection are refused naming their key.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use bytes::Bytes;
use switchyard_core::CallerIdentity;
use switchyard_gateway::{PrincipalSection, RoleName};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_proto::v1::worker_gateway_client::WorkerGatewayClient;
use switchyard_test_support::within;
use switchyard_tests::{
    ApiClient, ScriptedTransport, ScriptedWorker, TestGateway, raw_registration, registration,
    tls_channel,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

/// The namespace every principal here is granted.
const SHARED: &str = "shared";

fn principal(name: &str, roles: &[RoleName], namespaces: &[&str]) -> PrincipalSection {
    PrincipalSection {
        name: name.to_owned(),
        token: format!("t-{name}"),
        namespaces: namespaces.iter().map(|ns| (*ns).to_owned()).collect(),
        roles: Some(roles.to_vec()),
        ..PrincipalSection::default()
    }
}

/// Principals `w1` (worker), `a` and `b` (producers), `ops` (operator of `shared`) and
/// `root` (admin of everything), over the scripted transport and real gRPC.
async fn gateway() -> (TestGateway, ScriptedTransport) {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.principals = vec![
                principal("w1", &[RoleName::Worker], &[SHARED]),
                principal("a", &[RoleName::Producer], &[SHARED]),
                principal("b", &[RoleName::Producer], &[SHARED]),
                principal("ops", &[RoleName::Operator], &[SHARED]),
                principal("root", &[RoleName::Admin], &["*"]),
            ];
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    (gateway, scripted)
}

async fn client(gateway: &TestGateway, name: &str) -> ApiClient {
    gateway.client(Some(&format!("t-{name}"))).await
}

/// A scripted worker registered as `principal` (its identity is `scripted-worker`).
async fn worker(
    scripted: &ScriptedTransport,
    principal: &str,
    namespaces: &[&str],
    activity: &str,
) -> ScriptedWorker {
    scripted
        .connect(
            &CallerIdentity::granted(principal, namespaces.iter().copied()),
            registration(namespaces, &[activity], Some(4)),
            true,
        )
        .await
        .expect("admitted")
}

fn echo(activity_id: &str, activity: &str) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: SHARED.to_owned(),
        activity_type: activity.to_owned(),
        input: Bytes::from_static(b"hello"),
        timeout_ms: 30_000,
        activity_id: activity_id.to_owned(),
        ..pb::DispatchRequest::default()
    }
}

fn drain_by_id(id: u64) -> pb::DrainWorkersRequest {
    pb::DrainWorkersRequest {
        target: Some(pb::drain_workers_request::Target::WorkerId(id)),
        ..pb::DrainWorkersRequest::default()
    }
}

fn cancel(activity_id: &str) -> pb::CancelDispatchRequest {
    pb::CancelDispatchRequest {
        namespace: SHARED.to_owned(),
        activity_id: activity_id.to_owned(),
        ..pb::CancelDispatchRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_only_credential_cannot_dispatch_list_or_drain() {
    let (gateway, scripted) = gateway().await;
    let echo_worker = worker(&scripted, "w1", &[SHARED], "echo").await;
    let id = echo_worker.id().get();
    let _serving = echo_worker.serve_echo();
    let mut w1 = client(&gateway, "w1").await;

    let refused = w1.dispatch(echo("", "echo")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(
        refused.message(),
        "principal `w1` lacks role `producer` for Dispatch"
    );
    let refused = w1
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(
        refused.message(),
        "principal `w1` lacks role `producer` or `operator` for ListWorkers"
    );
    let refused = w1.drain(drain_by_id(id)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(
        refused.message(),
        "principal `w1` lacks role `operator` for Drain"
    );

    // Controls: a producer dispatches and lists, and may not drain; an operator drains.
    let mut a = client(&gateway, "a").await;
    let done = a.dispatch(echo("", "echo")).await.expect("a producer");
    let outcome = done.into_inner().outcome.and_then(|o| o.outcome);
    assert!(
        matches!(outcome, Some(Outcome::Completed(_))),
        "{outcome:?}"
    );
    let listed = a
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("a producer lists");
    assert_eq!(listed.into_inner().workers.len(), 1);
    let refused = a.drain(drain_by_id(id)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    let mut ops = client(&gateway, "ops").await;
    let mut progress = ops
        .drain(drain_by_id(id))
        .await
        .expect("an operator")
        .into_inner();
    let first = within("drain progress", progress.message()).await;
    assert!(matches!(first, Ok(Some(_))), "{first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_cannot_cancel_or_see_a_dispatch_of_a_in_a_shared_namespace() {
    let (gateway, _scripted) = gateway().await;
    let mut a = client(&gateway, "a").await;
    let mut b = client(&gateway, "b").await;
    let mut ops = client(&gateway, "ops").await;
    // No worker runs `parked`: the dispatches wait until cancelled.
    let a_dispatch = tokio::spawn({
        let mut a = a.clone();
        async move { a.dispatch(echo("job-1", "parked")).await }
    });
    within("a's dispatch parks", async {
        loop {
            let unserved = ops
                .unserved_queues(pb::UnservedQueuesRequest::default())
                .await
                .expect("an operator lists");
            if unserved.into_inner().queues.iter().any(|q| q.waiting == 1) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;

    let theirs = b.cancel(cancel("job-1")).await.unwrap_err();
    let nobodys = b.cancel(cancel("job-9")).await.unwrap_err();
    assert_eq!(theirs.code(), Code::NotFound);
    assert_eq!(
        theirs.message().replace("job-1", "ID"),
        nobodys.message().replace("job-9", "ID"),
        "the same answer as an id nobody uses"
    );
    // B's dispatch with A's id is not told the id exists: it runs (parks) too.
    let b_dispatch = tokio::spawn({
        let mut b = b.clone();
        async move { b.dispatch(echo("job-1", "parked")).await }
    });

    // Control: A cancels its own; its dispatch ends cancelled, B's does not.
    a.cancel(cancel("job-1")).await.expect("a cancels its own");
    let ended = within("a's dispatch ends", a_dispatch).await.unwrap();
    let outcome = ended
        .expect("answered")
        .into_inner()
        .outcome
        .and_then(|o| o.outcome);
    assert!(
        matches!(outcome, Some(Outcome::Cancelled(_))),
        "{outcome:?}"
    );
    assert!(
        !b_dispatch.is_finished(),
        "a's cancel did not reach b's dispatch"
    );

    // An operator of the namespace cancels b's dispatch by its id.
    within("the operator cancels", async {
        loop {
            if ops.cancel(cancel("job-1")).await.is_ok() {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let ended = within("b's dispatch ends", b_dispatch).await.unwrap();
    let outcome = ended
        .expect("b's dispatch was accepted")
        .into_inner()
        .outcome;
    assert!(
        matches!(outcome.and_then(|o| o.outcome), Some(Outcome::Cancelled(_))),
        "b's dispatch with a's id ran until the operator cancelled it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_as_a_non_operator_hides_other_principals_identities() {
    let (gateway, scripted) = gateway().await;
    let _w1s = worker(&scripted, "w1", &[SHARED, "secret"], "echo").await;
    let listed = |name: &'static str| {
        let gateway = &gateway;
        async move {
            let mut caller = client(gateway, name).await;
            let reply = caller
                .list_workers(pb::ListWorkersRequest::default())
                .await
                .expect("listed");
            let mut workers = reply.into_inner().workers;
            assert_eq!(workers.len(), 1, "{name} sees the worker");
            workers.remove(0)
        }
    };
    let seen_by_a = listed("a").await;
    assert_eq!(
        (seen_by_a.identity.as_str(), seen_by_a.principal.as_str()),
        ("", "")
    );
    assert_eq!(
        seen_by_a.namespaces,
        vec![SHARED.to_owned()],
        "no ungranted namespace"
    );
    let explained = client(&gateway, "a")
        .await
        .explain_pool(pb::ExplainPoolRequest {
            namespace: SHARED.to_owned(),
            activity_type: "echo".to_owned(),
            ..pb::ExplainPoolRequest::default()
        })
        .await
        .expect("explained")
        .into_inner();
    let explained = explained.workers[0].worker.clone().expect("a worker");
    assert_eq!(
        (explained.identity.as_str(), explained.principal.as_str()),
        ("", "")
    );

    // Control: the operator of the shared namespace sees who runs the worker.
    let seen_by_ops = listed("ops").await;
    assert_eq!(
        (
            seen_by_ops.identity.as_str(),
            seen_by_ops.principal.as_str()
        ),
        ("scripted-worker", "w1")
    );
    assert_eq!(seen_by_ops.namespaces, vec![SHARED.to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_by_an_unknown_id_and_by_an_invisible_id_get_the_same_answer() {
    let (gateway, scripted) = gateway().await;
    let hidden = worker(&scripted, "root", &["secret"], "echo").await;
    let mut ops = client(&gateway, "ops").await;
    let invisible = ops.drain(drain_by_id(hidden.id().get())).await.unwrap_err();
    let unknown = ops.drain(drain_by_id(u64::MAX - 1)).await.unwrap_err();
    assert_eq!(invisible.code(), Code::NotFound);
    assert_eq!(
        (invisible.code(), invisible.message()),
        (unknown.code(), unknown.message())
    );
    // Control: an operator granted the worker's namespace drains it.
    let mut root = client(&gateway, "root").await;
    root.drain(drain_by_id(hidden.id().get()))
        .await
        .expect("root drains it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_shows_only_the_workers_of_granted_namespaces() {
    use pb::gateway_event::Event;
    let (gateway, scripted) = gateway().await;
    // Watching is an operator's: a producer and a worker credential are refused, naming it.
    for name in ["a", "w1"] {
        let refused = client(&gateway, name)
            .await
            .watch_events(pb::WatchEventsRequest {})
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            (refused.code(), refused.message()),
            (
                Code::PermissionDenied,
                format!("principal `{name}` lacks role `operator` for WatchEvents").as_str()
            )
        );
    }
    let mut events = client(&gateway, "ops")
        .await
        .watch_events(pb::WatchEventsRequest {})
        .await
        .expect("an operator watches")
        .into_inner();
    // Connected one after the other: the watcher's first event tells which it was shown.
    let _hidden = worker(&scripted, "root", &["secret"], "echo").await;
    let shown = worker(&scripted, "w1", &[SHARED, "secret"], "echo").await;
    let first = within("an event", events.message())
        .await
        .expect("stream open")
        .expect("an event");
    assert_eq!(
        first.worker_id,
        shown.id().get(),
        "the secret worker's event is not shown"
    );
    match first.event {
        Some(Event::Connected(connected)) => {
            assert_eq!(connected.namespaces, vec![SHARED.to_owned()]);
        }
        other => panic!("expected a connection, got {other:?}"),
    }
    // Control: root, granted every namespace, is shown the secret worker too.
    let mut everything = client(&gateway, "root")
        .await
        .watch_events(pb::WatchEventsRequest {})
        .await
        .expect("root watches")
        .into_inner();
    let secret = worker(&scripted, "root", &["secret"], "other").await;
    let first = within("an event", everything.message())
        .await
        .expect("stream open")
        .expect("an event");
    assert_eq!(first.worker_id, secret.id().get());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_drained_only_by_an_operator_of_every_namespace_it_serves() {
    let (gateway, scripted) = gateway().await;
    // Serves `shared`, which `ops` operates, and `secret`, which it does not.
    let both = worker(&scripted, "root", &[SHARED, "secret"], "echo").await;
    let mut ops = client(&gateway, "ops").await;
    let listed = ops
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("listed")
        .into_inner();
    assert!(
        listed
            .workers
            .iter()
            .any(|w| w.worker_id == both.id().get()),
        "ops sees the worker through the namespace it is granted"
    );
    let refused = ops.drain(drain_by_id(both.id().get())).await.unwrap_err();
    let unknown = ops.drain(drain_by_id(u64::MAX - 1)).await.unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (unknown.code(), unknown.message()),
        "the same answer as a worker that does not exist"
    );
    assert_eq!(refused.code(), Code::NotFound);
    // Control: the same operator drains a worker serving only `shared`.
    let one = worker(&scripted, "root", &[SHARED], "echo").await;
    ops.drain(drain_by_id(one.id().get()))
        .await
        .expect("ops drains a worker all of whose namespaces it operates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_by_node_reaches_only_the_workers_the_caller_may_drain() {
    let (gateway, scripted) = gateway().await;
    let on_node = |principal: &'static str, namespace: &'static str| {
        let scripted = &scripted;
        async move {
            let mut registration = registration(&[namespace], &["echo"], Some(4));
            registration.node = switchyard_core::Node::new("n1");
            scripted
                .connect(
                    &CallerIdentity::granted(principal, [namespace]),
                    registration,
                    true,
                )
                .await
                .expect("admitted")
        }
    };
    let shared = on_node("w1", SHARED).await;
    let secret = on_node("root", "secret").await;
    let mut ops = client(&gateway, "ops").await;
    let mut progress = ops
        .drain(pb::DrainWorkersRequest {
            target: Some(pb::drain_workers_request::Target::Node("n1".to_owned())),
            ..pb::DrainWorkersRequest::default()
        })
        .await
        .expect("the operator drains what it may")
        .into_inner();
    let first = within("drain progress", progress.message())
        .await
        .expect("stream open")
        .expect("progress");
    let drained: Vec<u64> = first.workers.iter().map(|w| w.worker_id).collect();
    assert_eq!(
        drained,
        vec![shared.id().get()],
        "the secret worker is not drained"
    );
    // Control: root sees the shared worker draining and the secret one still eligible.
    let listed = client(&gateway, "root")
        .await
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("listed")
        .into_inner();
    let eligibility = |id: u64| {
        listed
            .workers
            .iter()
            .find(|w| w.worker_id == id)
            .map(|w| w.eligibility())
    };
    assert_eq!(
        eligibility(shared.id().get()),
        Some(pb::Eligibility::Draining)
    );
    assert_ne!(
        eligibility(secret.id().get()),
        Some(pb::Eligibility::Draining)
    );
}

/// A TLS channel (one HTTP/2 connection) to the gRPC port.
async fn channel(gateway: &TestGateway) -> Channel {
    let addr = gateway.gateway().addr("grpc").unwrap();
    tls_channel(addr, &gateway.ca_pem()).await.unwrap()
}

/// A worker stream on `channel` with `token`, registered or refused; the sender keeps the
/// stream open.
async fn register(
    channel: &Channel,
    token: &str,
) -> Result<
    (
        mpsc::Sender<pb::WorkerFrame>,
        tonic::Streaming<pb::GatewayFrame>,
    ),
    Status,
> {
    let (send, frames) = mpsc::channel(4);
    send.send(raw_registration(SHARED, "echo", 1))
        .await
        .unwrap();
    let mut request = Request::new(ReceiverStream::new(frames));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let mut replies = WorkerGatewayClient::new(channel.clone())
        .connect_worker(request)
        .await?
        .into_inner();
    within("a registration answer", async {
        loop {
            match replies.message().await? {
                Some(pb::GatewayFrame {
                    frame: Some(pb::gateway_frame::Frame::RegisterAck(_)),
                }) => return Ok(()),
                Some(_) => {}
                None => return Err(Status::internal("ended without an answer")),
            }
        }
    })
    .await?;
    Ok((send, replies))
}

/// `switchyard_admission_refusals_total{reason="principal_max_workers"}` on `/metrics`.
async fn principal_max_workers_refusals(gateway: &TestGateway) -> u64 {
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    let reason = "reason=\"principal_max_workers\"";
    switchyard_tests::counter(ops, "switchyard_admission_refusals_total", reason)
        .await
        .expect("/metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_quotas_per_principal_and_per_connection_are_refused_naming_the_key() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.grpc.max_workers_per_connection = 3;
        let mut capped = principal("capped", &[RoleName::Worker], &[SHARED]);
        capped.max_workers = 2;
        config.principals = vec![capped, principal("fleet", &[RoleName::Worker], &[SHARED])];
    })
    .await;

    // Per principal: two registrations, over two connections, and the third is refused.
    let (one, two) = (channel(&gateway).await, channel(&gateway).await);
    let _first = register(&one, "t-capped").await.expect("first");
    let _second = register(&two, "t-capped").await.expect("second");
    let before = principal_max_workers_refusals(&gateway).await;
    let refused = register(&channel(&gateway).await, "t-capped")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("`principals[].max_workers` (2)"),
        "{}",
        refused.message()
    );
    // Counted on `/metrics` (only this test of the file reaches the limit).
    assert_eq!(principal_max_workers_refusals(&gateway).await, before + 1);
    // Control: another principal is not counted against it.
    let fleet = channel(&gateway).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(register(&fleet, "t-fleet").await.expect("within both caps"));
    }

    // Per connection: the fourth stream on one connection is refused ...
    let refused = register(&fleet, "t-fleet").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("`grpc.max_workers_per_connection` (3)"),
        "{}",
        refused.message()
    );
    // ... and the same principal on a fresh connection is not.
    held.push(
        register(&channel(&gateway).await, "t-fleet")
            .await
            .expect("new connection"),
    );
}
