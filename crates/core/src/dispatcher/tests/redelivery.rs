//! A lost worker's tasks go to another worker, within the transport-loss budget.

use std::time::Duration;

use crate::delivery::TransportName;
use crate::dispatcher::*;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn a_lost_workers_task_is_delivered_again_to_another_worker() {
    let s = setup();
    let mut first = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let lost = first.task().await;
    assert_eq!(lost.attempt, 1);
    let mut second = s.worker(1).await;
    first.leave();
    let again = second.task().await;
    assert_eq!(again.attempt, 2);
    assert_ne!(again.task_id, lost.task_id, "each delivery has its own id");
    assert_eq!(again.input, lost.input);
    assert_eq!(
        s.dispatcher
            .complete(first.id, lost.task_id, success("old")),
        Err(CompletionRefused::UnknownTask { task: lost.task_id }),
        "the lost delivery cannot answer any more"
    );
    s.dispatcher
        .complete(second.id, again.task_id, success("x"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn losses_past_the_budget_end_transport_lost_naming_the_transport() {
    let s = setup_with(DispatchConfig {
        loss_budget: 2,
        ..DispatchConfig::default()
    });
    let running = s.spawn(request("x", Duration::from_secs(60)));
    for attempt in 1..=3 {
        let mut worker = s.worker(1).await;
        assert_eq!(worker.task().await.attempt, attempt);
        worker.leave();
    }
    assert_eq!(
        running.await.expect("joined"),
        ActivityOutcome::TransportLost {
            transport: TransportName::from_static("test"),
            attempts: 3
        }
    );
}

#[tokio::test(start_paused = true)]
async fn losses_spread_wider_than_the_window_stay_within_the_budget() {
    let s = setup_with(DispatchConfig {
        loss_budget: 1,
        loss_window: Duration::from_secs(10),
        ..DispatchConfig::default()
    });
    let running = s.spawn(request("x", Duration::from_secs(120)));
    for attempt in 1..=3 {
        let mut worker = s.worker(1).await;
        assert_eq!(worker.task().await.attempt, attempt);
        tokio::time::advance(Duration::from_secs(11)).await;
        worker.leave();
    }
    let mut last = s.worker(1).await;
    let task = last.task().await;
    assert_eq!(task.attempt, 4, "three losses, each alone in its window");
    // Control: a second loss inside the window exceeds a budget of one.
    last.leave();
    assert!(matches!(
        running.await.expect("joined"),
        ActivityOutcome::TransportLost { attempts: 4, .. }
    ));
}
