//! `WatchEvents` over real sockets: a new worker of either transport is announced as
//! `connected` then `capacity`, never as `excluded` / `recovered` for its opening probation, so
//! an alert on `excluded` does not fire once per registration.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Duration;

use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_event::Event;
use switchyard_tests::{TestGateway, WorkerSpec, grpc_worker, quic_worker, wait_eligible};

const PATIENCE: Duration = Duration::from_secs(15);

fn kind(event: &Event) -> String {
    match event {
        Event::Connected(_) => "connected".to_owned(),
        Event::Disconnected(_) => "disconnected".to_owned(),
        Event::Excluded(e) => format!("excluded {}", e.exclusion),
        Event::Recovered(_) => "recovered".to_owned(),
        Event::Capacity(c) => format!("capacity {}", c.capacity),
        Event::Missed(_) => "missed".to_owned(),
        Event::Suspended(_) => "suspended".to_owned(),
        Event::Resumed(_) => "resumed".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_workers_are_announced_with_their_capacity_and_without_an_exclusion() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut client = gateway.client(None).await;
    let mut events = client
        .watch_events(pb::WatchEventsRequest {})
        .await
        .expect("watch opens")
        .into_inner();
    let grpc_spec = WorkerSpec {
        capacity: 3,
        ..WorkerSpec::new("watched", "work")
    };
    let quic_spec = WorkerSpec {
        capacity: 5,
        ..WorkerSpec::new("watched", "work")
    };
    let grpc = grpc_worker(&gateway, &grpc_spec)
        .await
        .expect("gRPC worker");
    let quic = quic_worker(&gateway, &quic_spec)
        .await
        .expect("QUIC worker");
    // Both passed their opening probation: whatever it emits has been emitted.
    wait_eligible(&gateway, "watched", "work", 2).await;
    // The gRPC worker's departure (after its 5 s grace) is the last event to wait for.
    grpc.stop();

    let mut seen: HashMap<u64, Vec<String>> = HashMap::new();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let event = events
                .message()
                .await
                .expect("stream up")
                .expect("stream open");
            let Some(body) = event.event.as_ref() else {
                continue;
            };
            let kinds = seen.entry(event.worker_id).or_default();
            kinds.push(kind(body));
            if event.worker_id == grpc.id.get() && matches!(body, Event::Disconnected(_)) {
                return;
            }
        }
    })
    .await
    .expect("the gRPC worker's departure is announced");

    assert_eq!(
        seen.get(&grpc.id.get()).map(Vec::as_slice),
        Some(
            [
                "connected".to_owned(),
                "capacity 3".to_owned(),
                // Stopped without a drain: its session is suspended for `grpc.reconnect_grace`
                // (a gRPC half-close cannot be told from a lost link), then it leaves.
                "suspended".to_owned(),
                "disconnected".to_owned()
            ]
            .as_slice()
        ),
        "a gRPC worker's registration carries its capacity and is announced like QUIC's; a \
         stop without a drain is watched as a suspension, then the departure"
    );
    assert_eq!(
        seen.get(&quic.id.get()).map(Vec::as_slice),
        Some(["connected".to_owned(), "capacity 5".to_owned()].as_slice()),
        "no excluded/recovered for the opening probation"
    );
}
