//! `DescribePool` (over the real gRPC API) names why a queue is unserved, for every reason,
//! and says served once a worker can take the dispatch.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use switchyard_core::{CallerIdentity, DispatchExclusion, WorkerEvent, WorkerId};
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_tests::{ApiClient, ScriptedTransport, TestGateway, registration};
use tokio::sync::broadcast;
use tokio::time::{Duration, timeout};

const WAIT: Duration = Duration::from_secs(10);

async fn describe(client: &mut ApiClient, namespace: &str) -> pb::DescribePoolReply {
    client
        .describe_pool(pb::DescribePoolRequest {
            namespace: namespace.to_owned(),
            task_queue: String::new(),
            activity_type: "echo".to_owned(),
            node: String::new(),
        })
        .await
        .expect("described")
        .into_inner()
}

fn reason(reply: &pb::DescribePoolReply) -> pb::UnservedReason {
    pb::UnservedReason::try_from(reply.reason).expect("known reason")
}

async fn wait_for(
    events: &mut broadcast::Receiver<WorkerEvent>,
    mut wanted: impl FnMut(&WorkerEvent) -> bool,
) {
    timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(event) if wanted(&event) => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    })
    .await
    .expect("event arrives in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_unserved_reason_is_named_and_served_is_reported() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            // Probation is lifted by the first answered ping, and a worker that stops
            // answering is lost after one missed ping.
            config.liveness.probation_pings = 1;
            config.liveness.miss_threshold = 1;
            config.liveness.ping_timeout = ConfigDuration::secs(1);
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let core = gateway.gateway().core().clone();
    let mut events = core.registry().subscribe_events();
    let mut client = gateway.client(None).await;
    let caller = CallerIdentity::trusted("test");

    // No worker at all.
    let reply = describe(&mut client, "empty").await;
    assert!(!reply.served);
    assert_eq!(reason(&reply), pb::UnservedReason::NoWorkers);
    assert!(reply.detail.starts_with("no_workers"), "{}", reply.detail);

    // Workers in the pool, none running the activity.
    let _other = scripted
        .connect(
            &caller,
            registration(&["incompatible"], &["resize"], Some(1)),
            true,
        )
        .await
        .unwrap();
    let reply = describe(&mut client, "incompatible").await;
    assert_eq!(reason(&reply), pb::UnservedReason::WorkersIncompatible);
    assert_eq!(reply.census.as_ref().unwrap().pool_workers, 1);

    // A new worker that has not answered its probation ping yet.
    let silent = scripted
        .connect(
            &caller,
            registration(&["probation"], &["echo"], Some(1)),
            true,
        )
        .await
        .unwrap();
    let reply = describe(&mut client, "probation").await;
    assert_eq!(reason(&reply), pb::UnservedReason::OnProbation);

    // The same worker, its pings unanswered past the threshold, is unreachable.
    let silent_id = silent.id();
    wait_for(&mut events, |e| {
        matches!(e, WorkerEvent::Excluded { worker, exclusion: DispatchExclusion::ReachabilityLost }
            if *worker == silent_id)
    })
    .await;
    let reply = describe(&mut client, "probation").await;
    assert_eq!(reason(&reply), pb::UnservedReason::WorkersUnreachable);
    assert!(reply.detail.contains("unreachable"), "{}", reply.detail);

    // Admitted without capacity (a transport announcing it later), proven reachable.
    let (unannounced, _, _keep) = scripted
        .connect(
            &caller,
            registration(&["unannounced"], &["echo"], None),
            false,
        )
        .await
        .unwrap()
        .answer_pings_in_background();
    wait_probation_passed(&mut events, unannounced.id()).await;
    let reply = describe(&mut client, "unannounced").await;
    assert_eq!(reason(&reply), pb::UnservedReason::CapacityUnannounced);
    // Control: announcing capacity serves the queue.
    unannounced.announce(1).unwrap();
    assert!(describe(&mut client, "unannounced").await.served);

    // Capacity one, holding one task.
    let (busy, mut busy_tasks, _keep) = scripted
        .connect(&caller, registration(&["busy"], &["echo"], Some(1)), true)
        .await
        .unwrap()
        .answer_pings_in_background();
    wait_probation_passed(&mut events, busy.id()).await;
    assert!(
        describe(&mut client, "busy").await.served,
        "eligible before it takes the task"
    );
    let mut producer = client.clone();
    let held = tokio::spawn(async move {
        producer
            .dispatch(pb::DispatchRequest {
                namespace: "busy".to_owned(),
                activity_type: "echo".to_owned(),
                timeout_ms: 30_000,
                ..pb::DispatchRequest::default()
            })
            .await
    });
    timeout(WAIT, busy_tasks.recv())
        .await
        .expect("the task arrives")
        .expect("task");
    let reply = describe(&mut client, "busy").await;
    assert_eq!(reason(&reply), pb::UnservedReason::AllAtCapacity);
    held.abort();

    // A worker being drained through the API.
    let (draining, _, _keep) = scripted
        .connect(
            &caller,
            registration(&["draining"], &["echo"], Some(1)),
            true,
        )
        .await
        .unwrap()
        .answer_pings_in_background();
    wait_probation_passed(&mut events, draining.id()).await;
    assert!(describe(&mut client, "draining").await.served);
    let progress = client
        .drain(pb::DrainWorkersRequest {
            target: Some(pb::drain_workers_request::Target::WorkerId(
                draining.id().get(),
            )),
            deadline_ms: 0,
        })
        .await
        .expect("drain accepted");
    let first = progress.into_inner().message().await.unwrap().unwrap();
    assert_eq!(first.workers.len(), 1);
    let reply = describe(&mut client, "draining").await;
    assert_eq!(reason(&reply), pb::UnservedReason::Draining);
    assert!(reply.detail.contains("draining"), "{}", reply.detail);
}

async fn wait_probation_passed(events: &mut broadcast::Receiver<WorkerEvent>, id: WorkerId) {
    wait_for(
        events,
        |e| matches!(e, WorkerEvent::ProbationPassed { worker } if *worker == id),
    )
    .await;
}
