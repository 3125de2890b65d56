//! Durable dispatch over real sockets: `Submit`, `AwaitOutcome` (from another connection too),
//! `GetDispatch` while parked and once finished, idempotency keys, who sees which dispatch, the
//! store's queue bound, a durable `Dispatch` and `DispatchStream` item, `WatchOutcomes`, `Cancel`
//! by id, `ListDispatches`, the backlog in `DescribePool` and `/metrics`, the memory backend, the
//! ephemeral parked and held-input quotas not bounding durable dispatches, a lost worker's durable
//! task delivered again within `dispatch.loss_budget`, a timeout past `dispatch.max_timeout`
//! clamped to it, and a gateway restarted in-process on the same store file finishing what the
//! first one queued. Every gateway here uses the default SQLite store in its own temporary
//! directory unless the test says otherwise.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::CallerIdentity;
use switchyard_gateway::{
    ConfigDuration, DurabilityName, Gateway, GatewayConfig, NamespaceSection, PrincipalSection,
    RoleName, StoreBackendName,
};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::await_outcome_reply::Result as Awaited;
use switchyard_proto::v1::dispatch_info::State;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_test_support::within;
use switchyard_tests::{
    ApiClient, ScriptedTransport, TestGateway, api_client_at, http_get, registration, test_config,
};
use tonic::Code;

const NS: &str = "orders";
const ACTIVITY: &str = "charge";

fn principal(name: &str, roles: &[RoleName]) -> PrincipalSection {
    PrincipalSection {
        name: name.to_owned(),
        token: format!("token-of-principal-{name}"),
        namespaces: vec![NS.to_owned()],
        roles: Some(roles.to_vec()),
        ..PrincipalSection::default()
    }
}

/// Producers `a` and `b`, operator `ops`, worker `w`.
fn principals(config: &mut GatewayConfig) {
    config.quic.enabled = false;
    config.principals = vec![
        principal("a", &[RoleName::Producer]),
        principal("b", &[RoleName::Producer]),
        principal("ops", &[RoleName::Operator]),
        principal("w", &[RoleName::Worker]),
    ];
}

async fn gateway(configure: impl FnOnce(&mut GatewayConfig)) -> (TestGateway, ScriptedTransport) {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| {
            principals(config);
            configure(config);
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    (gateway, scripted)
}

async fn client(gateway: &TestGateway, name: &str) -> ApiClient {
    gateway
        .client(Some(&format!("token-of-principal-{name}")))
        .await
}

fn request(input: &str) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NS.to_owned(),
        activity_type: ACTIVITY.to_owned(),
        input: Bytes::from(input.to_owned()),
        timeout_ms: 60_000,
        ..pb::DispatchRequest::default()
    }
}

/// A worker that answers pings and completes every task with its input, counting the tasks
/// (every delivery, so a second execution of one dispatch counts twice).
async fn counting_worker(scripted: &ScriptedTransport) -> Arc<AtomicU32> {
    let worker = scripted
        .connect(
            &CallerIdentity::granted("w", [NS]),
            registration(&[NS], &[ACTIVITY], Some(8)),
            true,
        )
        .await
        .expect("admitted");
    let (control, mut tasks, _handle) = worker.answer_pings_in_background();
    let executions = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&executions);
    tokio::spawn(async move {
        while let Some(task) = tasks.recv().await {
            counted.fetch_add(1, Ordering::SeqCst);
            control.complete(task.task_id, task.input);
        }
    });
    executions
}

async fn submit(client: &mut ApiClient, request: pb::DispatchRequest) -> pb::SubmitReply {
    client
        .submit(request)
        .await
        .expect("submitted")
        .into_inner()
}

async fn await_outcome(client: &mut ApiClient, id: &str, wait_ms: u64) -> Awaited {
    client
        .await_outcome(pb::AwaitOutcomeRequest {
            dispatch_id: id.to_owned(),
            wait_ms,
        })
        .await
        .expect("awaited")
        .into_inner()
        .result
        .expect("a result")
}

fn completed(result: &Awaited) -> Option<&[u8]> {
    match result {
        Awaited::Outcome(pb::DispatchOutcome {
            outcome: Some(Outcome::Completed(done)),
        }) => Some(&done.output),
        _ => None,
    }
}

async fn get(client: &mut ApiClient, id: &str) -> Result<pb::DispatchInfo, tonic::Status> {
    client
        .get_dispatch(pb::GetDispatchRequest {
            dispatch_id: id.to_owned(),
        })
        .await
        .map(|reply| reply.into_inner().dispatch.expect("a dispatch"))
}

/// The gateway started again on `config`'s store, with a scripted transport for its workers
/// and a client of `token`'s principal.
async fn restart(
    config: GatewayConfig,
    ca: &str,
    token: Option<&str>,
) -> (Gateway, ScriptedTransport, ApiClient) {
    let scripted = ScriptedTransport::default();
    let gateway = Gateway::builder(config)
        .transport(scripted.clone())
        .start()
        .await
        .expect("restarts on the same store");
    let client = api_client_at(gateway.addr("grpc").unwrap(), ca, token)
        .await
        .unwrap();
    (gateway, scripted, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_runs_and_its_outcome_is_read_from_another_connection() {
    let (gateway, scripted) = gateway(|_| {}).await;
    let executions = counting_worker(&scripted).await;
    let mut a = client(&gateway, "a").await;
    let submitted = submit(&mut a, request("first")).await;
    assert_eq!(submitted.dispatch_id.len(), 32, "{submitted:?}");
    assert!(!submitted.existing);
    let heard = await_outcome(&mut a, &submitted.dispatch_id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"first"[..]), "{heard:?}");
    // A second connection of the same principal reads the same one outcome, at once.
    let mut again = client(&gateway, "a").await;
    let heard = await_outcome(&mut again, &submitted.dispatch_id, 0).await;
    assert_eq!(completed(&heard), Some(&b"first"[..]), "{heard:?}");
    let info = get(&mut again, &submitted.dispatch_id).await.unwrap();
    assert!(matches!(info.state, Some(State::Finished(_))), "{info:?}");
    assert_eq!(info.attempts, 1);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    // The store is the SQLite file in the data directory.
    assert!(gateway.data_dir().join("dispatches.sqlite3").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_without_a_worker_shows_parked_then_finishes_when_one_arrives() {
    let (gateway, scripted) = gateway(|_| {}).await;
    let mut a = client(&gateway, "a").await;
    let id = submit(&mut a, request("late")).await.dispatch_id;
    // Not finished within a short wait: pending, with where it stands.
    let pending = await_outcome(&mut a, &id, 50).await;
    assert!(matches!(&pending, Awaited::Pending(_)), "{pending:?}");
    let parked = within("the dispatch to park", async {
        loop {
            let info = get(&mut a, &id).await.unwrap();
            if let Some(State::Parked(parked)) = info.state {
                return parked;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(parked.reason, i32::from(pb::UnservedReason::NoWorkers));
    // The backlog counts it, in DescribePool.
    let described = a
        .describe_pool(pb::DescribePoolRequest {
            namespace: NS.to_owned(),
            activity_type: ACTIVITY.to_owned(),
            ..pb::DescribePoolRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (described.backlog_waiting, described.backlog_running),
        (1, 0)
    );
    let executions = counting_worker(&scripted).await;
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"late"[..]), "{heard:?}");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    // Control: finished, it is no longer in the backlog.
    let described = a
        .describe_pool(pb::DescribePoolRequest {
            namespace: NS.to_owned(),
            activity_type: ACTIVITY.to_owned(),
            ..pb::DescribePoolRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.backlog_waiting, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_idempotency_key_returns_the_first_id_and_runs_once() {
    let (gateway, scripted) = gateway(|_| {}).await;
    let executions = counting_worker(&scripted).await;
    let mut a = client(&gateway, "a").await;
    let keyed = || pb::DispatchRequest {
        idempotency_key: "order-7".to_owned(),
        ..request("pay")
    };
    let first = submit(&mut a, keyed()).await;
    let heard = await_outcome(&mut a, &first.dispatch_id, 10_000).await;
    assert!(completed(&heard).is_some(), "{heard:?}");
    let second = submit(&mut a, keyed()).await;
    assert_eq!(second.dispatch_id, first.dispatch_id);
    assert!(second.existing);
    // A durable Dispatch with the key gets the first outcome without running it again.
    let replayed = a
        .dispatch(pb::DispatchRequest {
            durable: Some(true),
            ..keyed()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(replayed.outcome.and_then(|o| o.outcome),
        Some(Outcome::Completed(c)) if c.output == "pay"));
    assert_eq!(executions.load(Ordering::SeqCst), 1, "ran once");
    // Control: another key is another dispatch, and runs.
    let other = submit(
        &mut a,
        pb::DispatchRequest {
            idempotency_key: "order-8".to_owned(),
            ..request("pay")
        },
    )
    .await;
    assert_ne!(other.dispatch_id, first.dispatch_id);
    assert!(!other.existing);
    await_outcome(&mut a, &other.dispatch_id, 10_000).await;
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    // An ephemeral dispatch cannot carry a key.
    let refused = a
        .dispatch(pb::DispatchRequest {
            durable: Some(false),
            ..keyed()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("idempotency_key"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_cannot_tell_a_dispatch_exists_but_an_operator_sees_it() {
    let (gateway, _scripted) = gateway(|_| {}).await;
    let mut a = client(&gateway, "a").await;
    let id = submit(&mut a, request("mine")).await.dispatch_id;
    let mut b = client(&gateway, "b").await;
    let hidden = get(&mut b, &id).await.unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    let unknown = get(&mut b, &"0".repeat(32)).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert_eq!(
        hidden.message().replace(&id, "ID"),
        unknown.message().replace(&"0".repeat(32), "ID"),
        "the two refusals read the same"
    );
    let refused = b
        .await_outcome(pb::AwaitOutcomeRequest {
            dispatch_id: id.clone(),
            wait_ms: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    let refused = b
        .cancel(pb::CancelDispatchRequest {
            dispatch_id: id.clone(),
            ..pb::CancelDispatchRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    let listed = b
        .list_dispatches(pb::ListDispatchesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.dispatches.is_empty(), "{listed:?}");
    // Controls: the owner and an operator of the namespace see it.
    assert_eq!(get(&mut a, &id).await.unwrap().principal, "a");
    let mut ops = client(&gateway, "ops").await;
    assert_eq!(get(&mut ops, &id).await.unwrap().dispatch_id, id);
    let listed = ops
        .list_dispatches(pb::ListDispatchesRequest {
            namespace: NS.to_owned(),
            ..pb::ListDispatchesRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.dispatches.len(), 1);
    // A malformed id is a bad argument, not a missing dispatch.
    let malformed = get(&mut a, "not-an-id").await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_bound_refuses_naming_its_key_and_nothing_is_recorded() {
    let (gateway, _scripted) = gateway(|config| {
        config.store.max_queued_per_namespace = 2;
    })
    .await;
    let mut a = client(&gateway, "a").await;
    submit(&mut a, request("1")).await;
    submit(&mut a, request("2")).await;
    let refused = a.submit(request("3")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "`store.max_queued_per_namespace` (2) reached for namespace \"orders\""
    );
    let refused = a
        .dispatch(pb::DispatchRequest {
            durable: Some(true),
            ..request("4")
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let mut ops = client(&gateway, "ops").await;
    let listed = ops
        .list_dispatches(pb::ListDispatchesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.dispatches.len(),
        2,
        "the refused ones are not recorded"
    );
    // Control: an ephemeral dispatch is not bound by the store.
    let ephemeral = a
        .dispatch(pb::DispatchRequest {
            timeout_ms: 100,
            ..request("5")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(
            ephemeral.outcome.and_then(|o| o.outcome),
            Some(Outcome::Unserved(_))
        ),
        "ran (and found no worker) instead of being refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_default_makes_dispatch_and_stream_items_durable() {
    let (gateway, scripted) = gateway(|config| {
        config.namespaces.known = vec![NamespaceSection {
            name: NS.to_owned(),
            durability: Some(DurabilityName::Durable),
            ..NamespaceSection::default()
        }];
    })
    .await;
    let executions = counting_worker(&scripted).await;
    let mut a = client(&gateway, "a").await;
    let reply = a.dispatch(request("unary")).await.unwrap().into_inner();
    assert!(matches!(reply.outcome.and_then(|o| o.outcome),
        Some(Outcome::Completed(c)) if c.output == "unary"));
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    sender
        .send(pb::DispatchStreamRequest {
            correlation_id: 1,
            request: Some(request("streamed")),
        })
        .await
        .unwrap();
    sender
        .send(pb::DispatchStreamRequest {
            correlation_id: 2,
            request: Some(pb::DispatchRequest {
                durable: Some(false),
                ..request("ephemeral")
            }),
        })
        .await
        .unwrap();
    drop(sender);
    let mut replies = a
        .dispatch_stream(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    let mut outputs = Vec::new();
    while let Some(reply) = within("a stream reply", replies.message()).await.unwrap() {
        match reply.result {
            Some(pb::dispatch_stream_reply::Result::Outcome(pb::DispatchOutcome {
                outcome: Some(Outcome::Completed(done)),
            })) => outputs.push((reply.correlation_id, done.output)),
            other => panic!("{other:?}"),
        }
    }
    outputs.sort();
    assert_eq!(
        outputs,
        vec![
            (1, Bytes::from_static(b"streamed")),
            (2, Bytes::from_static(b"ephemeral"))
        ]
    );
    assert_eq!(executions.load(Ordering::SeqCst), 3);
    // The durable ones are in the store; the one that said `durable: false` is not.
    let mut ops = client(&gateway, "ops").await;
    let listed = ops
        .list_dispatches(pb::ListDispatchesRequest {
            state: "finished".to_owned(),
            ..pb::ListDispatchesRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.dispatches.len(), 2, "{listed:?}");
    let refused = ops
        .list_dispatches(pb::ListDispatchesRequest {
            state: "sleeping".to_owned(),
            ..pb::ListDispatchesRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_hears_its_own_outcomes_only() {
    let (gateway, scripted) = gateway(|_| {}).await;
    counting_worker(&scripted).await;
    let mut a = client(&gateway, "a").await;
    let mut b = client(&gateway, "b").await;
    let mut watching = a
        .watch_outcomes(pb::WatchOutcomesRequest {})
        .await
        .unwrap()
        .into_inner();
    let theirs = submit(&mut b, request("theirs")).await.dispatch_id;
    await_outcome(&mut b, &theirs, 10_000).await;
    let mine = submit(&mut a, request("mine")).await.dispatch_id;
    let heard = within("the watcher's outcome", watching.message())
        .await
        .unwrap()
        .expect("an outcome");
    assert_eq!(
        heard.dispatch_id, mine,
        "b's outcome came first but is not a's"
    );
    assert!(matches!(heard.event,
        Some(pb::watch_outcomes_reply::Event::Outcome(pb::DispatchOutcome {
            outcome: Some(Outcome::Completed(c)) })) if c.output == "mine"));

    // An operator of the namespace reads and awaits a's dispatch (control), but watching
    // outcomes is a producer's call: it is refused, not a stream of every principal's outcomes.
    let mut ops = client(&gateway, "ops").await;
    await_outcome(&mut ops, &mine, 10_000).await;
    let refused = ops
        .watch_outcomes(pb::WatchOutcomesRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("lacks role") && refused.message().contains("for WatchOutcomes"),
        "{}",
        refused.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_dispatch_id_records_cancelled() {
    let (gateway, _scripted) = gateway(|_| {}).await;
    let mut a = client(&gateway, "a").await;
    let id = submit(&mut a, request("never")).await.dispatch_id;
    a.cancel(pb::CancelDispatchRequest {
        dispatch_id: id.clone(),
        ..pb::CancelDispatchRequest::default()
    })
    .await
    .unwrap();
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert!(
        matches!(
            &heard,
            Awaited::Outcome(pb::DispatchOutcome {
                outcome: Some(Outcome::Cancelled(_))
            })
        ),
        "{heard:?}"
    );
    // Mixing the two ways to name a dispatch is refused.
    let refused = a
        .cancel(pb::CancelDispatchRequest {
            dispatch_id: id,
            namespace: NS.to_owned(),
            ..pb::CancelDispatchRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_is_on_metrics() {
    let (gateway, _scripted) = gateway(|_| {}).await;
    let mut a = client(&gateway, "a").await;
    submit(&mut a, request("waits")).await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");
    let line = "switchyard_backlog_dispatches{namespace=\"orders\",task_queue=\"default\",\
                activity_type=\"charge\",state=\"waiting\"} 1";
    // The census is read every few seconds; wait for the read after the submission.
    let body = within("the backlog on /metrics", async {
        loop {
            let (_, body) = http_get(ops, "/metrics").await.unwrap();
            if body.contains(line) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(body.contains("switchyard_backlog_oldest_seconds{namespace=\"orders\""));
    let unserved = a
        .unserved_queues(pb::UnservedQueuesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unserved.backlog.len(), 1, "{unserved:?}");
    assert_eq!(unserved.backlog[0].waiting, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_backend_serves_durable_dispatches_without_a_file() {
    let (gateway, scripted) = gateway(|config| {
        config.store.backend = StoreBackendName::Memory;
    })
    .await;
    counting_worker(&scripted).await;
    let mut a = client(&gateway, "a").await;
    let id = submit(&mut a, request("in memory")).await.dispatch_id;
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"in memory"[..]));
    assert!(!gateway.data_dir().join("dispatches.sqlite3").exists());
    assert!(gateway.gateway().store_path().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_restarted_on_the_same_store_finishes_what_the_first_queued() {
    let data_dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut config = test_config(data_dir.path());
        principals(&mut config);
        config.shutdown.drain_timeout = ConfigDuration::millis(200);
        config
    };
    let first = Gateway::builder(config()).start().await.expect("starts");
    let ca = std::fs::read_to_string(first.tls().dev_ca_path().unwrap()).unwrap();
    let token = Some("token-of-principal-a");
    let mut a = api_client_at(first.addr("grpc").unwrap(), &ca, token)
        .await
        .unwrap();
    let id = submit(&mut a, request("survives")).await.dispatch_id;
    drop(a);
    first.shutdown().await;

    let (second, scripted, mut a) = restart(config(), &ca, token).await;
    // Control: before a worker arrives it is still waiting, not lost and not finished.
    let info = get(&mut a, &id).await.unwrap();
    assert!(!matches!(info.state, Some(State::Finished(_))), "{info:?}");
    let executions = counting_worker(&scripted).await;
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"survives"[..]), "{heard:?}");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_running_at_shutdown_is_not_ended_and_runs_again_after_the_restart() {
    let data_dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut config = test_config(data_dir.path());
        principals(&mut config);
        config.shutdown.drain_timeout = ConfigDuration::millis(200);
        config
    };
    let scripted = ScriptedTransport::default();
    let first = Gateway::builder(config())
        .transport(scripted.clone())
        .start()
        .await
        .expect("starts");
    // A worker that takes the tasks and never answers them.
    let holder = scripted
        .connect(
            &CallerIdentity::granted("w", [NS]),
            registration(&[NS], &[ACTIVITY], Some(2)),
            true,
        )
        .await
        .expect("admitted");
    let (_control, mut tasks, _handle) = holder.answer_pings_in_background();
    let ca = std::fs::read_to_string(first.tls().dev_ca_path().unwrap()).unwrap();
    let token = Some("token-of-principal-a");
    let mut a = api_client_at(first.addr("grpc").unwrap(), &ca, token)
        .await
        .unwrap();
    let id = submit(&mut a, request("held")).await.dispatch_id;
    let held = within("the first delivery", tasks.recv()).await.unwrap();
    assert_eq!(held.attempt, 1);
    // A durable `Dispatch` whose caller waits for the outcome, its task held too.
    let mut caller = a.clone();
    let call = tokio::spawn(async move {
        caller
            .dispatch(pb::DispatchRequest {
                durable: Some(true),
                ..request("called")
            })
            .await
    });
    let called = within("the called dispatch's delivery", tasks.recv())
        .await
        .unwrap();
    assert_eq!(called.input.as_ref(), b"called");
    let mut ops = api_client_at(
        first.addr("grpc").unwrap(),
        &ca,
        Some("token-of-principal-ops"),
    )
    .await
    .unwrap();
    let listed = ops
        .list_dispatches(pb::ListDispatchesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let called_id = listed
        .dispatches
        .iter()
        .map(|d| d.dispatch_id.clone())
        .find(|other| *other != id)
        .expect("the called dispatch is recorded");
    drop((a, ops));
    // The drain timeout passes with both tasks still held: core ends them `shutting_down`.
    first.shutdown().await;
    // The waiting caller is told the dispatch has no outcome yet, naming it.
    let told = within("the call to end", call)
        .await
        .unwrap()
        .expect_err("no outcome to return");
    assert_eq!(told.code(), Code::Unavailable, "{told:?}");
    assert!(
        told.message().starts_with(&format!(
            "durable dispatch {called_id} is recorded but has no outcome yet"
        )),
        "{}",
        told.message()
    );

    let (second, scripted, mut a) = restart(config(), &ca, token).await;
    for id in [&id, &called_id] {
        let info = get(&mut a, id).await.unwrap();
        assert!(
            !matches!(info.state, Some(State::Finished(_))),
            "the shutdown's ending was recorded: {info:?}"
        );
    }
    let worker = scripted
        .connect(
            &CallerIdentity::granted("w", [NS]),
            registration(&[NS], &[ACTIVITY], Some(2)),
            true,
        )
        .await
        .expect("admitted");
    let (control, mut tasks, _handle) = worker.answer_pings_in_background();
    for _ in 0..2 {
        let again = within("a delivery after the restart", tasks.recv())
            .await
            .unwrap();
        assert_eq!(
            again.attempt, 2,
            "the attempt number is counted across the restart"
        );
        control.complete(again.task_id, again.input);
    }
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"held"[..]), "{heard:?}");
    let heard = await_outcome(&mut a, &called_id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"called"[..]), "{heard:?}");
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_dispatch_goes_on_when_its_caller_goes_away() {
    let (gateway, scripted) = gateway(|_| {}).await;
    let mut a = client(&gateway, "a").await;
    let call = a.dispatch(pb::DispatchRequest {
        durable: Some(true),
        ..request("orphan")
    });
    // The producer gives up before any worker exists.
    let gone = tokio::time::timeout(Duration::from_millis(300), call).await;
    assert!(gone.is_err(), "the call was still waiting: {gone:?}");
    let mut ops = client(&gateway, "ops").await;
    // The submission commits on its own task even when the call is gone mid-commit.
    let id = within("the orphaned dispatch to be listed", async {
        loop {
            let listed = ops
                .list_dispatches(pb::ListDispatchesRequest::default())
                .await
                .unwrap()
                .into_inner();
            if let [only] = listed.dispatches.as_slice() {
                return only.dispatch_id.clone();
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let executions = counting_worker(&scripted).await;
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"orphan"[..]), "{heard:?}");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_dispatches_are_bounded_by_the_store_not_the_parked_or_held_input_quotas() {
    let (gateway, scripted) = gateway(|config| {
        config.dispatch.max_parked_per_namespace = 1;
        config.dispatch.max_parked_per_principal = 1;
        config.dispatch.max_held_input_bytes_per_namespace = 8;
        config.dispatch.max_held_input_bytes_per_principal = 8;
    })
    .await;
    let mut a = client(&gateway, "a").await;
    // Three parked durable dispatches of nine bytes each: past every ephemeral quota.
    let mut ids = Vec::new();
    for input in ["durable-1", "durable-2", "durable-3"] {
        ids.push(submit(&mut a, request(input)).await.dispatch_id);
    }
    for id in &ids {
        let info = within("the dispatch to park", async {
            loop {
                let info = get(&mut a, id).await.unwrap();
                if matches!(info.state, Some(State::Parked(_))) {
                    return info;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(matches!(info.state, Some(State::Parked(_))), "{info:?}");
    }
    // Control: the same input dispatched ephemerally is refused by the held-input quota.
    let refused = a.dispatch(request("ephemeral")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("`dispatch.max_held_input_bytes_per_"),
        "{}",
        refused.message()
    );
    // Control: the parked quota (1) holds for ephemeral dispatches, and the three parked durable
    // ones do not count against it: of two small ephemeral dispatches one parks (and ends
    // unserved) and the other is refused naming the quota.
    let small = |input: &str| pb::DispatchRequest {
        timeout_ms: 1_000,
        ..request(input)
    };
    let (mut one, mut other) = (a.clone(), a.clone());
    let (first, second) = tokio::join!(one.dispatch(small("e1")), other.dispatch(small("e2")));
    let (parked, refused): (Vec<_>, Vec<_>) = [first, second].into_iter().partition(Result::is_ok);
    assert_eq!(
        (parked.len(), refused.len()),
        (1, 1),
        "{parked:?} {refused:?}"
    );
    let refused = refused.into_iter().next().unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("`dispatch.max_parked_per_"),
        "{}",
        refused.message()
    );
    let executions = counting_worker(&scripted).await;
    for (id, input) in ids.iter().zip(["durable-1", "durable-2", "durable-3"]) {
        let heard = await_outcome(&mut a, id, 10_000).await;
        assert_eq!(completed(&heard), Some(input.as_bytes()), "{heard:?}");
    }
    assert_eq!(executions.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_dispatch_whose_worker_is_lost_runs_again_within_the_loss_budget() {
    let (gateway, scripted) = gateway(|config| config.dispatch.loss_budget = 1).await;
    let mut a = client(&gateway, "a").await;
    // A worker that takes what it is given and never answers; aborting its handle drops it.
    let holder = || async {
        let worker = scripted
            .connect(
                &CallerIdentity::granted("w", [NS]),
                registration(&[NS], &[ACTIVITY], Some(1)),
                true,
            )
            .await
            .expect("admitted");
        worker.answer_pings_in_background()
    };

    // One loss is within the budget: delivered again, attempt 2, and its outcome recorded.
    let id = submit(&mut a, request("once")).await.dispatch_id;
    let (_, mut tasks, first) = holder().await;
    let delivered = within("the first delivery", tasks.recv()).await.unwrap();
    assert_eq!(delivered.attempt, 1);
    first.abort();
    let (control, mut tasks, second) = holder().await;
    let again = within("the delivery after the loss", tasks.recv())
        .await
        .unwrap();
    assert_eq!(again.attempt, 2);
    control.complete(again.task_id, again.input);
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert_eq!(completed(&heard), Some(&b"once"[..]), "{heard:?}");
    assert_eq!(get(&mut a, &id).await.unwrap().attempts, 2);

    // Control: a second loss is past the budget, and the outcome recorded is the loss.
    second.abort();
    let registry = gateway.gateway().core().registry().clone();
    within("the second worker to be gone", async {
        while registry.worker(control.id()).is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let id = submit(&mut a, request("twice")).await.dispatch_id;
    for attempt in 1..=2 {
        let (_, mut tasks, handle) = holder().await;
        let delivered = within("a delivery", tasks.recv()).await.unwrap();
        assert_eq!(delivered.attempt, attempt);
        handle.abort();
    }
    let heard = await_outcome(&mut a, &id, 10_000).await;
    assert!(
        matches!(
            heard,
            Awaited::Outcome(pb::DispatchOutcome {
                outcome: Some(Outcome::TransportLost(_))
            })
        ),
        "{heard:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_timeout_past_dispatch_max_timeout_is_clamped_to_it() {
    let (gateway, _scripted) = gateway(|config| {
        config.dispatch.max_timeout = ConfigDuration::secs(2);
    })
    .await;
    let mut a = client(&gateway, "a").await;
    let deadline_after_submission = |info: &pb::DispatchInfo| {
        info.deadline_unix_ms
            .saturating_sub(info.submitted_at_unix_ms)
    };
    let long = submit(&mut a, request("long")).await.dispatch_id;
    let info = get(&mut a, &long).await.unwrap();
    assert_eq!(deadline_after_submission(&info), 2_000, "{info:?}");
    // Control: a timeout under the cap is kept.
    let short = submit(
        &mut a,
        pb::DispatchRequest {
            timeout_ms: 1_500,
            ..request("short")
        },
    )
    .await
    .dispatch_id;
    let info = get(&mut a, &short).await.unwrap();
    assert_eq!(deadline_after_submission(&info), 1_500, "{info:?}");
    // A durable `Dispatch` asking 60 s (no worker exists) ends at the clamped deadline.
    let reply = within(
        "the durable call to end",
        a.dispatch(pb::DispatchRequest {
            durable: Some(true),
            ..request("called")
        }),
    )
    .await
    .unwrap()
    .into_inner();
    assert!(
        matches!(
            reply.outcome.and_then(|o| o.outcome),
            Some(Outcome::Unserved(_))
        ),
        "ended at the clamped deadline, unserved"
    );
}
