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
