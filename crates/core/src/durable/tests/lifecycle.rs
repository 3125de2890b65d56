//! Submit → driver → recorded outcome → await: one outcome per id, one execution per key.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::delivery::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};
use crate::dispatcher::tests::fixture::{caller, registration};
use crate::durable::{Completion, DispatchState, DispatchStore, OutcomeRecord};
use crate::outcome::ActivityOutcome;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn a_submitted_dispatch_runs_and_its_recorded_outcome_is_awaited() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "hello").await;
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    assert_eq!(task.attempt, 1);
    // Control: before the worker answers there is no outcome to await.
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(1))
            .await,
        Ok(None)
    );
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("hello"))
        .expect("the task is pending");
    let outcome = gw
        .durable
        .await_outcome(&alice, &id, Duration::from_secs(10))
        .await;
    assert_eq!(outcome, Ok(Some(completed("hello"))));
    assert!(
        matches!(&gw.row(&id).await.state, DispatchState::Finished { outcome, .. }
            if outcome.to_outcome() == Some(completed("hello"))),
        "the outcome is recorded before it is announced"
    );
    // Awaited again later, it is read from the store.
    assert_eq!(
        gw.durable.await_outcome(&alice, &id, Duration::ZERO).await,
        Ok(Some(completed("hello")))
    );
}

#[tokio::test(start_paused = true)]
async fn one_outcome_is_recorded_per_id_and_a_second_complete_is_refused() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "once").await;
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("first"))
        .expect("the task is pending");
    let first = gw
        .durable
        .await_outcome(&alice, &id, Duration::from_secs(10))
        .await;
    assert_eq!(first, Ok(Some(completed("first"))));
    // Control: a second outcome for the same id is dropped, and the first one stands.
    let second = gw
        .store
        .complete(
            &id,
            &OutcomeRecord::from(&ActivityOutcome::TimedOut),
            std::time::SystemTime::now(),
        )
        .await;
    assert_eq!(
        second,
        Ok(Completion::AlreadyFinished(OutcomeRecord::from(
            &completed("first")
        )))
    );
    assert_eq!(
        gw.durable.await_outcome(&alice, &id, Duration::ZERO).await,
        Ok(Some(completed("first")))
    );
}

#[tokio::test(start_paused = true)]
async fn a_repeated_idempotency_key_returns_the_same_id_and_runs_once() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let key = Some("order-7".to_owned());
    let first = gw
        .durable
        .submit(&alice, work("charge"), key.clone())
        .await
        .expect("recorded");
    let again = gw
        .durable
        .submit(&alice, work("charge"), key)
        .await
        .expect("recorded");
    assert!(!first.existing);
    assert!(again.existing);
    assert_eq!(again.id, first.id);
    // Control: without a key the same request is a second dispatch.
    let other = gw
        .durable
        .submit(&alice, work("charge"), None)
        .await
        .expect("recorded");
    assert_ne!(other.id, first.id);

    let mut worker = gw.setup.worker(4).await;
    let mut deliveries = 0;
    for _ in 0..2 {
        let task = worker.task().await;
        deliveries += 1;
        gw.setup
            .dispatcher
            .complete(worker.id, task.task_id, success("charged"))
            .expect("pending");
    }
    for id in [&first.id, &other.id] {
        assert_eq!(
            gw.durable
                .await_outcome(&alice, id, Duration::from_secs(10))
                .await,
            Ok(Some(completed("charged")))
        );
    }
    // Two dispatches, two executions: the keyed one ran once.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(worker.sent().is_empty(), "no third delivery");
    assert_eq!(deliveries, 2);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_after_acceptance_is_recorded_as_a_final_failure() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let mut worker = gw.setup.worker(1).await;
    worker
        .leg
        .frame_limit
        .store(8, std::sync::atomic::Ordering::Release);
    let id = gw.submit(&alice, "far too large for the leg").await;
    let outcome = gw
        .durable
        .await_outcome(&alice, &id, Duration::from_secs(10))
        .await
        .expect("visible")
        .expect("finished");
    assert!(
        matches!(&outcome, ActivityOutcome::Failed { message, retryable: false }
            if message.contains("more than the limit")),
        "{outcome:?}"
    );
    assert!(worker.sent().is_empty(), "nothing reached the worker");
}

#[tokio::test(start_paused = true)]
async fn a_submission_whose_caller_goes_away_while_it_is_recorded_still_runs() {
    let gw = start_slow(memory()).await;
    let alice = producer("alice");
    {
        let submit = gw.durable.submit(&alice, work("orphan"), None);
        tokio::pin!(submit);
        // One poll: the store has not committed yet; then the caller is gone.
        assert!(futures::poll!(submit.as_mut()).is_pending());
    }
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    assert_eq!(
        &task.input[..],
        b"orphan",
        "the recorded dispatch has its driver"
    );
    let listed = gw
        .durable
        .list(&alice, crate::durable::DispatchFilter::default())
        .await
        .expect("listed");
    assert_eq!(listed.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_running_dispatchs_claim_is_extended_while_its_worker_holds_it() {
    let gw = start_slow(memory()).await;
    let alice = producer("alice");
    let id = gw
        .durable
        .submit(&alice, request("long", Duration::from_secs(600)), None)
        .await
        .expect("recorded")
        .id;
    tokio::time::sleep(Duration::from_secs(90)).await;
    // Control: parked, nobody holds it, nothing to extend.
    assert_eq!(gw.extends.load(std::sync::atomic::Ordering::Relaxed), 0);
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    tokio::time::sleep(Duration::from_secs(65)).await;
    assert_eq!(gw.extends.load(std::sync::atomic::Ordering::Relaxed), 2);
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("long"))
        .expect("pending");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await,
        Ok(Some(completed("long")))
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_that_does_not_lease_claims_is_never_asked_to_extend_one() {
    // The control is the test above: the same run on a store that leases claims extends twice.
    let gw = start_slow_unleased(memory()).await;
    let alice = producer("alice");
    let id = gw
        .durable
        .submit(&alice, request("long", Duration::from_secs(600)), None)
        .await
        .expect("recorded")
        .id;
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    tokio::time::sleep(Duration::from_secs(65)).await;
    assert_eq!(gw.extends.load(std::sync::atomic::Ordering::Relaxed), 0);
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("long"))
        .expect("pending");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await,
        Ok(Some(completed("long")))
    );
}

#[tokio::test(start_paused = true)]
async fn the_outcome_does_not_wait_for_a_state_note_the_store_is_slow_to_take() {
    let gw = start_stalling(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "quick").await;
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("quick"))
        .expect("pending");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await,
        Ok(Some(completed("quick"))),
        "the claim never finishes; the outcome is recorded anyway"
    );
}

/// A leg whose worker answers inside the delivery itself: the outcome is there before the
/// driver's loop has taken (or started) the delivery's claim.
struct AnswersAtOnce {
    dispatcher: crate::Dispatcher,
    worker: OnceLock<crate::WorkerId>,
}

impl WorkerDelivery for AnswersAtOnce {
    fn transport(&self) -> TransportName {
        TransportName::from_static("test")
    }
    fn is_connected(&self) -> bool {
        true
    }
    fn registration_carries_capacity(&self) -> bool {
        true
    }
    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if let (WorkerMessage::Task(task), Some(worker)) = (message, self.worker.get()) {
            let _ = self.dispatcher.complete(
                *worker,
                task.task_id,
                crate::TaskResult::Success(task.input.clone()),
            );
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_delivery_answered_before_its_claim_was_taken_still_counts() {
    let gw = start(memory()).await;
    let leg = Arc::new(AnswersAtOnce {
        dispatcher: gw.setup.dispatcher.clone(),
        worker: OnceLock::new(),
    });
    let token = gw
        .setup
        .registry
        .admit(&caller(), registration(1), Arc::clone(&leg) as _)
        .await
        .expect("admitted");
    let _ = leg.worker.set(token.worker_id());
    let alice = producer("alice");
    let id = gw.submit(&alice, "at once").await;
    let outcome = gw
        .durable
        .await_outcome(&alice, &id, Duration::from_secs(10))
        .await;
    assert_eq!(outcome, Ok(Some(completed("at once"))));
    assert_eq!(gw.row(&id).await.attempts, 1, "the one delivery is counted");
    drop(token);
}
