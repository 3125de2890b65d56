//! `dispatch_with`: what the hooks hear, attempts counted on from an offset, the durable
//! exemption.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::dispatcher::*;
use crate::registry::UnservedReason;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn hooks_hear_parking_and_delivery_with_the_attempt_counted_from_the_offset() {
    let s = setup();
    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let (delivered, parked) = (Arc::clone(&heard), Arc::clone(&heard));
    let hooks = DispatchHooks {
        attempt_offset: 2,
        on_delivered: Some(Arc::new(move |worker, attempt| {
            delivered
                .lock()
                .expect("test lock")
                .push(format!("delivered {worker} {attempt}"));
        })),
        on_parked: Some(Arc::new(move |reason: UnservedReason| {
            parked
                .lock()
                .expect("test lock")
                .push(format!("parked {}", reason.as_str()));
        })),
        ..DispatchHooks::default()
    };
    let dispatcher = s.dispatcher.clone();
    let running = tokio::spawn(async move {
        dispatcher
            .dispatch_with(&caller(), request("x", Duration::from_secs(60)), hooks)
            .await
    });
    s.parked(1).await;
    let mut worker = s.worker(1).await;
    let task = worker.task().await;
    assert_eq!(task.attempt, 3, "offset 2: the worker sees attempt 3");
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("pending");
    assert_eq!(running.await.expect("joined"), Ok(completed("x")));
    assert_eq!(
        *heard.lock().expect("test lock"),
        [
            "parked no_workers".to_owned(),
            format!("delivered {} 3", worker.id)
        ]
    );
    // Control: the plain dispatch counts from 1.
    let plain = s.spawn(request("y", Duration::from_secs(60)));
    let task = worker.task().await;
    assert_eq!(task.attempt, 1);
    s.dispatcher
        .complete(worker.id, task.task_id, success("y"))
        .expect("pending");
    assert_eq!(plain.await.expect("joined"), completed("y"));
}

#[tokio::test(start_paused = true)]
async fn a_durable_dispatch_is_exempt_from_the_held_bytes_quota() {
    let s = setup_with(DispatchConfig {
        max_held_input_bytes_per_namespace: 4,
        ..DispatchConfig::default()
    });
    let refused = s
        .dispatcher
        .dispatch(&caller(), request("too many", Duration::from_secs(60)))
        .await;
    assert!(
        matches!(&refused, Err(DispatchError::QuotaExceeded { limit, .. })
            if *limit == "dispatch.max_held_input_bytes_per_namespace"),
        "control: {refused:?}"
    );
    let dispatcher = s.dispatcher.clone();
    let durable = tokio::spawn(async move {
        let hooks = DispatchHooks {
            durable: true,
            ..DispatchHooks::default()
        };
        dispatcher
            .dispatch_with(
                &caller(),
                request("too many", Duration::from_secs(60)),
                hooks,
            )
            .await
    });
    let mut worker = s.worker(1).await;
    let task = worker.task().await;
    s.dispatcher
        .complete(worker.id, task.task_id, success("ok"))
        .expect("pending");
    assert_eq!(durable.await.expect("joined"), Ok(completed("ok")));
}

#[tokio::test(start_paused = true)]
async fn check_refuses_what_dispatch_refuses_and_starts_nothing() {
    let s = setup();
    let mut empty = request("x", Duration::from_secs(60));
    empty.activity_type.clear();
    assert!(matches!(
        s.dispatcher.check(&caller(), &empty),
        Err(DispatchError::Invalid {
            field: "activity_type",
            ..
        })
    ));
    let stranger = CallerIdentity::granted("stranger", ["elsewhere"]);
    assert!(matches!(
        s.dispatcher
            .check(&stranger, &request("x", Duration::from_secs(60))),
        Err(DispatchError::NamespaceNotGranted { .. })
    ));
    // Control: a valid request passes, and nothing parks or is delivered.
    assert_eq!(
        s.dispatcher
            .check(&caller(), &request("x", Duration::from_secs(60))),
        Ok(())
    );
    assert!(s.dispatcher.unserved_queues().is_empty());
    assert_eq!(s.dispatcher.pending_tasks(), 0);
}
