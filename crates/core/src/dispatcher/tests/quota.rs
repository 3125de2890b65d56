//! Quotas on parked dispatches and held input, per namespace and per principal.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::dispatcher::*;

use super::fixture::*;

fn quota(max_parked_per_namespace: usize, max_parked_per_principal: usize) -> Setup {
    setup_with(DispatchConfig {
        max_parked_per_namespace,
        max_parked_per_principal,
        ..DispatchConfig::default()
    })
}

fn other_namespace(input: &str) -> ActivityRequest {
    let mut request = request(input, Duration::from_secs(60));
    request.namespace = "other".to_owned();
    request
}

#[tokio::test(start_paused = true)]
async fn the_dispatch_past_the_namespace_parked_quota_is_refused_naming_the_key() {
    let s = quota(3, 100);
    let parked: Vec<_> = (0..3)
        .map(|i| {
            s.spawn(with_id(
                request("p", Duration::from_secs(60)),
                &format!("p{i}"),
            ))
        })
        .collect();
    s.parked(3).await;
    let refused = s
        .dispatcher
        .dispatch(&caller(), request("one more", Duration::from_secs(60)))
        .await
        .expect_err("the fourth would park past the quota");
    assert!(
        matches!(&refused, DispatchError::QuotaExceeded { limit, value: 3, .. }
            if *limit == "dispatch.max_parked_per_namespace"),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("`dispatch.max_parked_per_namespace` (3)")
    );
    // Another namespace has its own quota.
    let elsewhere = s.spawn(other_namespace("elsewhere"));
    s.parked(4).await;

    // Control: once the parked ones are cancelled, a new dispatch is accepted and parks.
    for i in 0..3 {
        s.dispatcher
            .cancel(&caller(), NS, &format!("p{i}"))
            .expect("in flight");
    }
    for running in parked {
        assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
    }
    let accepted = s.spawn(request("accepted", Duration::from_secs(60)));
    s.parked(2).await;
    let mut worker = s.worker(2).await;
    for _ in 0..1 {
        let task = worker.task().await;
        s.dispatcher
            .complete(worker.id, task.task_id, success("accepted"))
            .expect("accepted");
    }
    assert_eq!(accepted.await.expect("joined"), completed("accepted"));
    elsewhere.abort();
}

#[tokio::test(start_paused = true)]
async fn the_principal_parked_quota_spans_namespaces() {
    let s = quota(100, 2);
    let _a = s.spawn(request("a", Duration::from_secs(60)));
    let _b = s.spawn(other_namespace("b"));
    s.parked(2).await;
    let refused = s
        .dispatcher
        .dispatch(&caller(), other_namespace("c"))
        .await
        .expect_err("a third parked dispatch of one principal");
    assert!(
        refused
            .to_string()
            .contains("dispatch.max_parked_per_principal"),
        "{refused}"
    );
    // Control: another principal is not held to the first one's quota.
    let dispatcher = s.dispatcher.clone();
    let other = tokio::spawn(async move {
        dispatcher
            .dispatch(
                &CallerIdentity::trusted("someone-else"),
                other_namespace("d"),
            )
            .await
    });
    s.parked(3).await;
    other.abort();
}

#[tokio::test(start_paused = true)]
async fn a_served_dispatch_never_counts_as_parked() {
    let s = quota(1, 1);
    let mut worker = s.worker(5).await;
    let running: Vec<_> = (0..5)
        .map(|i| s.spawn(request(&format!("r{i}"), Duration::from_secs(60))))
        .collect();
    for _ in 0..5 {
        let task = worker.task().await;
        let input = String::from_utf8_lossy(&task.input).into_owned();
        s.dispatcher
            .complete(worker.id, task.task_id, success(&input))
            .expect("accepted");
    }
    for (i, running) in running.into_iter().enumerate() {
        assert_eq!(running.await.expect("joined"), completed(&format!("r{i}")));
    }
}

/// Parks a dispatch of `input` for a caller that then goes away: while it is parked, one more
/// (`next`) is refused naming `limit`; then the caller drops its dispatch's future.
async fn park_refuse_then_drop(s: &Setup, input: &'static str, next: &str, limit: &str) {
    let dispatcher = s.dispatcher.clone();
    let stop = CancellationToken::new();
    let dropped = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let caller = caller();
            tokio::select! {
                _ = dispatcher.dispatch(&caller, request(input, Duration::from_secs(60))) => {}
                () = stop.cancelled() => {}
            }
        })
    };
    s.parked(1).await;
    let refused = s
        .dispatcher
        .dispatch(&caller(), request(next, Duration::from_secs(60)))
        .await
        .expect_err("the parked dispatch holds the quota");
    assert!(refused.to_string().contains(limit), "{refused}");
    stop.cancel();
    dropped.await.expect("joined");
}

#[tokio::test(start_paused = true)]
async fn held_bytes_are_given_back_when_the_caller_drops_the_dispatch() {
    let s = setup_with(DispatchConfig {
        max_held_input_bytes_per_namespace: 10,
        ..DispatchConfig::default()
    });
    park_refuse_then_drop(
        &s,
        "0123456789",
        "x",
        "`dispatch.max_held_input_bytes_per_namespace` (10)",
    )
    .await;
    // Control: the dropped dispatch's bytes were given back.
    let _fits = s.spawn(request("0123456789", Duration::from_secs(60)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.inner.quotas.entries(),
        2,
        "one namespace, one principal"
    );
}

/// `docs/security.md`: a parked place is given back on every exit, the caller going away
/// included.
#[tokio::test(start_paused = true)]
async fn a_parked_place_is_given_back_when_the_caller_drops_the_dispatch() {
    let s = quota(1, 100);
    park_refuse_then_drop(
        &s,
        "p",
        "one more",
        "`dispatch.max_parked_per_namespace` (1)",
    )
    .await;
    // The caller is gone: its place is free, and the next dispatch parks.
    let _parks = s.spawn(request("after", Duration::from_secs(60)));
    s.parked(1).await;
}
