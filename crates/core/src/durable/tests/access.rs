//! Who sees, cancels and watches a durable dispatch; cancel; what `get` reports.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::delivery::{CancelReason, WorkerMessage};
use crate::durable::{DispatchFilter, DispatchState, DurableConfig, LookupError, WatchEvent};
use crate::outcome::ActivityOutcome;
use crate::registration::CallerIdentity;
use crate::role::Role;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn another_principal_gets_not_found_and_an_operator_of_the_namespace_sees_it() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "mine").await;
    let not_found = Err(LookupError::NotFound { id: id.clone() });
    let bob = producer("bob");
    assert_eq!(gw.durable.get(&bob, &id).await.map(|_| ()), not_found);
    assert_eq!(
        gw.durable.await_outcome(&bob, &id, Duration::ZERO).await,
        not_found.clone().map(|()| None)
    );
    assert_eq!(gw.durable.cancel(&bob, &id).await, not_found);
    let elsewhere = CallerIdentity::granted("ops", ["other"]).with_roles([Role::Operator]);
    assert_eq!(gw.durable.get(&elsewhere, &id).await.map(|_| ()), not_found);
    let listed = gw
        .durable
        .list(&bob, DispatchFilter::default())
        .await
        .expect("listed");
    assert!(listed.is_empty(), "bob lists none of alice's");

    // Controls: the owner and an operator of the namespace see it.
    let row = gw
        .durable
        .get(&alice, &id)
        .await
        .expect("the owner sees it");
    assert_eq!(row.dispatch.principal, "alice");
    let ops = operator("ops");
    assert!(gw.durable.get(&ops, &id).await.is_ok());
    let listed = gw
        .durable
        .list(&ops, DispatchFilter::default())
        .await
        .expect("listed");
    assert_eq!(listed.len(), 1);
    assert_eq!(gw.durable.cancel(&ops, &id).await, Ok(()));
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await,
        Ok(Some(ActivityOutcome::Cancelled))
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancel_ends_the_dispatch_cancelled_and_tells_its_worker() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let mut worker = gw.setup.worker(2).await;
    let cancelled = gw.submit(&alice, "cancel me").await;
    let kept = gw.submit(&alice, "keep me").await;
    let mut tasks = [worker.task().await, worker.task().await];
    tasks.sort_by_key(|task| task.input.clone());
    let [cancel_me, keep_me] = tasks;
    gw.durable
        .cancel(&alice, &cancelled)
        .await
        .expect("visible");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &cancelled, Duration::from_secs(10))
            .await,
        Ok(Some(ActivityOutcome::Cancelled))
    );
    assert!(
        worker.sent().iter().any(|message| matches!(message,
            WorkerMessage::Cancel { task_id, reason: CancelReason::Requested }
                if *task_id == cancel_me.task_id)),
        "the worker is asked to stop"
    );
    assert!(matches!(
        gw.row(&cancelled).await.state,
        DispatchState::Finished { .. }
    ));
    // Control: the other dispatch is untouched and finishes with its worker's result.
    gw.setup
        .dispatcher
        .complete(worker.id, keep_me.task_id, success("kept"))
        .expect("pending");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &kept, Duration::from_secs(10))
            .await,
        Ok(Some(completed("kept")))
    );
}

#[tokio::test(start_paused = true)]
async fn get_reports_parked_then_running_from_the_dispatcher_ahead_of_the_store() {
    let gw = start_lagging(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "where").await;
    gw.until_state(&alice, &id, "parked").await;
    let parked = gw.durable.get(&alice, &id).await.expect("visible");
    assert_eq!(
        parked.state,
        DispatchState::Parked {
            reason: "no_workers".to_owned()
        }
    );
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    gw.until_state(&alice, &id, "running").await;
    let running = gw.durable.get(&alice, &id).await.expect("visible");
    assert_eq!(
        running.state,
        DispatchState::Running {
            worker: worker.id,
            attempt: 1
        }
    );
    assert_eq!(running.attempts, 1);
    // Control: the store's own row never heard; `get` merged what the dispatcher said.
    assert_eq!(gw.row(&id).await.state.label(), "queued");
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("here"))
        .expect("pending");
    let _ = gw
        .durable
        .await_outcome(&alice, &id, Duration::from_secs(10))
        .await;
    assert_eq!(
        gw.durable
            .get(&alice, &id)
            .await
            .expect("visible")
            .state
            .label(),
        "finished"
    );
}

#[tokio::test(start_paused = true)]
async fn watch_delivers_the_callers_outcomes_only() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let bob = producer("bob");
    let mut alices = gw.durable.watch(&alice);
    let mut bobs = gw.durable.watch(&bob);
    let mut worker = gw.setup.worker(2).await;
    let bob_id = gw.submit(&bob, "bob").await;
    let bob_task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, bob_task.task_id, success("bob"))
        .expect("pending");
    let alice_id = gw.submit(&alice, "alice").await;
    let alice_task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, alice_task.task_id, success("alice"))
        .expect("pending");
    assert_eq!(
        alices.next().await,
        Some(WatchEvent::Outcome {
            id: alice_id,
            outcome: completed("alice")
        }),
        "alice hears her own outcome first, not bob's"
    );
    // Control: bob's outcome went to bob's watcher.
    assert_eq!(
        bobs.next().await,
        Some(WatchEvent::Outcome {
            id: bob_id,
            outcome: completed("bob")
        })
    );
    gw.durable.shutdown();
    assert_eq!(alices.next().await, None, "a shutdown ends the watch");
}

#[tokio::test(start_paused = true)]
async fn a_watcher_that_falls_behind_is_told_how_many_it_missed() {
    let config = DurableConfig {
        watch_capacity: 2,
        ..DurableConfig::default()
    };
    let gw = start_with(memory(), config).await;
    let alice = producer("alice");
    let mut watch = gw.durable.watch(&alice);
    let mut worker = gw.setup.worker(8).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(gw.submit(&alice, &format!("{i}")).await);
    }
    for _ in 0..5 {
        let task = worker.task().await;
        gw.setup
            .dispatcher
            .complete(worker.id, task.task_id, success("done"))
            .expect("pending");
    }
    for id in &ids {
        let _ = gw
            .durable
            .await_outcome(&alice, id, Duration::from_secs(10))
            .await;
    }
    assert_eq!(watch.next().await, Some(WatchEvent::Lagged { missed: 3 }));
    // Control: after the lag report, the two it still holds come through.
    for _ in 0..2 {
        assert!(matches!(
            watch.next().await,
            Some(WatchEvent::Outcome { .. })
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn a_dispatch_submitted_after_shutdown_is_recorded_and_its_cancel_recorded_directly() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    gw.durable.shutdown();
    let id = gw.submit(&alice, "kept for the next start").await;
    let mut worker = gw.setup.worker(1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(worker.sent().is_empty(), "no driver runs after shutdown");
    // Control: it is recorded and unfinished, waiting for the next start.
    assert_eq!(gw.row(&id).await.state.label(), "queued");
    gw.durable.cancel(&alice, &id).await.expect("visible");
    assert_eq!(
        gw.durable.await_outcome(&alice, &id, Duration::ZERO).await,
        Ok(Some(ActivityOutcome::Cancelled))
    );
}

#[tokio::test(start_paused = true)]
async fn awaiting_a_dispatch_running_here_reads_no_row_and_still_hides_it_from_others() {
    let gw = start_slow(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "parked, no worker").await;
    assert_eq!(
        gw.durable.await_outcome(&alice, &id, Duration::ZERO).await,
        Ok(None)
    );
    assert_eq!(
        gw.durable
            .await_outcome(&producer("bob"), &id, Duration::ZERO)
            .await,
        Err(LookupError::NotFound { id: id.clone() }),
        "another principal is told nothing of a live dispatch"
    );
    assert_eq!(
        gw.gets.load(Ordering::Relaxed),
        0,
        "a live wait read the store"
    );

    // Control: once finished, the dispatch has no live entry and its outcome is read from the
    // store, which the counter sees.
    assert_eq!(gw.durable.cancel(&operator("ops"), &id).await, Ok(()));
    let before = gw.gets.load(Ordering::Relaxed);
    let mut outcome = None;
    for _ in 0..100 {
        outcome = gw
            .durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await
            .expect("alice sees it");
        if outcome.is_some() {
            break;
        }
    }
    assert_eq!(outcome, Some(ActivityOutcome::Cancelled));
    assert_eq!(
        gw.durable.await_outcome(&alice, &id, Duration::ZERO).await,
        Ok(Some(ActivityOutcome::Cancelled))
    );
    assert!(
        gw.gets.load(Ordering::Relaxed) > before,
        "a finished dispatch's outcome was not read from the store"
    );
}
