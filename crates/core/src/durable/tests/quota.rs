//! Durable dispatches wait outside the ephemeral parked quotas: the store bounds them.

use std::time::Duration;

use crate::dispatcher::DispatchConfig;
use crate::dispatcher::tests::fixture::{self, caller};
use crate::outcome::DispatchError;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn at_the_parked_quota_an_ephemeral_dispatch_is_refused_and_a_durable_one_parks() {
    let setup = fixture::setup_with(DispatchConfig {
        max_parked_per_namespace: 1,
        ..DispatchConfig::default()
    });
    let gw = start_on(setup, memory()).await;
    let parked = gw.setup.spawn(work("ephemeral"));
    gw.setup.parked(1).await;
    // Control: the ephemeral one past the quota is refused.
    let refused = gw
        .setup
        .dispatcher
        .dispatch(&caller(), work("refused"))
        .await;
    assert!(
        matches!(&refused, Err(DispatchError::QuotaExceeded { limit, .. })
            if *limit == "dispatch.max_parked_per_namespace"),
        "{refused:?}"
    );
    let alice = producer("alice");
    let durable = gw.submit(&alice, "durable").await;
    gw.setup.parked(2).await;
    let mut worker = gw.setup.worker(2).await;
    for _ in 0..2 {
        let task = worker.task().await;
        gw.setup
            .dispatcher
            .complete(worker.id, task.task_id, success("ran"))
            .expect("pending");
    }
    assert_eq!(parked.await.expect("joined"), completed("ran"));
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &durable, Duration::from_secs(10))
            .await,
        Ok(Some(completed("ran")))
    );
}
