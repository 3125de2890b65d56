//! What a dispatch request must satisfy up front: a unique activity id while in flight, filled
//! fields, a granted namespace.

use std::time::Duration;

use crate::dispatcher::*;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn an_activity_id_is_unique_while_in_flight_and_free_again_after() {
    let s = setup();
    let running = s.spawn(with_id(request("x", Duration::from_secs(2)), "job-3"));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher
            .dispatch(
                &caller(),
                with_id(request("y", Duration::from_secs(2)), "job-3")
            )
            .await,
        Err(DispatchError::DuplicateActivityId {
            namespace: NS.to_owned(),
            activity_id: "job-3".to_owned()
        })
    );
    let mut elsewhere = with_id(request("z", Duration::from_secs(1)), "job-3");
    elsewhere.namespace = "other".to_owned();
    assert!(
        s.dispatcher.dispatch(&caller(), elsewhere).await.is_ok(),
        "ids are per namespace"
    );
    assert!(matches!(
        running.await.expect("joined"),
        ActivityOutcome::Unserved { .. }
    ));
    assert!(
        s.dispatcher
            .dispatch(
                &caller(),
                with_id(request("y", Duration::from_secs(1)), "job-3")
            )
            .await
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn dispatches_are_refused_up_front_for_empty_fields_and_ungranted_namespaces() {
    let s = setup();
    let mut empty = request("x", Duration::from_secs(1));
    empty.activity_type.clear();
    assert!(matches!(
        s.dispatcher.dispatch(&caller(), empty).await,
        Err(DispatchError::Invalid {
            field: "activity_type",
            ..
        })
    ));
    let long = with_id(request("x", Duration::from_secs(1)), &"i".repeat(256));
    assert!(matches!(
        s.dispatcher.dispatch(&caller(), long).await,
        Err(DispatchError::Invalid {
            field: "activity_id",
            ..
        })
    ));
    let outsider = CallerIdentity::granted("outsider", ["elsewhere"]);
    assert!(matches!(
        s.dispatcher
            .dispatch(&outsider, request("x", Duration::from_secs(1)))
            .await,
        Err(DispatchError::NamespaceNotGranted { .. })
    ));
    // Control: the longest allowed id is accepted.
    let longest = with_id(request("x", Duration::from_millis(1)), &"i".repeat(255));
    assert!(s.dispatcher.dispatch(&caller(), longest).await.is_ok());
}

/// `docs/configuration.md`, `dispatch.max_timeout`: a longer timeout is clamped to it.
#[tokio::test(start_paused = true)]
async fn a_timeout_above_the_maximum_is_clamped_to_it() {
    let s = setup_with(DispatchConfig {
        max_timeout: Duration::from_secs(10),
        ..DispatchConfig::default()
    });
    let mut worker = s.worker(1).await;
    let timed_out_after = |asked: Duration| {
        let started = tokio::time::Instant::now();
        let running = s.spawn(request("x", asked));
        async move {
            assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
            started.elapsed()
        }
    };
    // Control: a timeout under the maximum is kept.
    let kept = timed_out_after(Duration::from_secs(4));
    let _task = worker.task().await;
    let kept = kept.await;
    assert!(
        (Duration::from_secs(4)..Duration::from_secs(5)).contains(&kept),
        "{kept:?}"
    );
    worker.leave();
    let mut worker = s.worker(1).await;
    let clamped = timed_out_after(Duration::from_secs(3600));
    let _task = worker.task().await;
    let clamped = clamped.await;
    assert!(
        (Duration::from_secs(10)..Duration::from_secs(11)).contains(&clamped),
        "the maximum, not the hour asked: {clamped:?}"
    );
}
