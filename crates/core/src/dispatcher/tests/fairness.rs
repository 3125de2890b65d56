//! Parked work in one tenant's pool costs another tenant nothing.

use std::time::Duration;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn slots_freed_in_one_pool_make_no_parked_dispatch_of_another_pool_select() {
    let s = setup();
    let mut parked: Vec<_> = Vec::new();
    for i in 0..50 {
        let mut request = request(&format!("a{i}"), Duration::from_secs(600));
        request.namespace = "tenant-a".to_owned();
        parked.push(s.spawn(request));
    }
    s.parked(50).await;
    let mut worker = s.worker(1).await;
    let before = s.dispatcher.selections();
    for i in 0..10 {
        let running = s.spawn(request(&format!("b{i}"), Duration::from_secs(60)));
        let task = worker.task().await;
        s.dispatcher
            .complete(worker.id, task.task_id, success("ok"))
            .expect("accepted");
        assert_eq!(running.await.expect("joined"), completed("ok"));
    }
    assert_eq!(
        s.dispatcher.selections() - before,
        10,
        "one selection per dispatch of b; none by a's parked dispatches"
    );

    // Control: a worker arriving in a's pool does wake a's parked dispatches.
    let before = s.dispatcher.selections();
    let (tx, _rx) = tokio::sync::mpsc::channel(64);
    let leg = std::sync::Arc::new(Leg {
        tx,
        connected: std::sync::atomic::AtomicBool::new(true),
        refuse_tasks: std::sync::atomic::AtomicU32::new(0),
        frame_limit: std::sync::atomic::AtomicUsize::new(usize::MAX),
    });
    let mut a = registration(50);
    a.namespaces = ["tenant-a".to_owned()].into();
    let _token = s.registry.admit(&caller(), a, leg).await.expect("admitted");
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(s.dispatcher.selections() - before >= 50);
    for running in parked {
        running.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn parked_dispatches_of_a_pool_are_served_in_arrival_order() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let holding = s.spawn(request("hold", Duration::from_secs(60)));
    let held = worker.task().await;
    let waiting: Vec<_> = (0..4)
        .map(|i| s.spawn(request(&format!("w{i}"), Duration::from_secs(60))))
        .collect();
    s.parked(4).await;
    s.dispatcher
        .complete(worker.id, held.task_id, success("hold"))
        .expect("accepted");
    assert_eq!(holding.await.expect("joined"), completed("hold"));
    let mut order = Vec::new();
    for _ in 0..4 {
        let task = worker.task().await;
        let input = String::from_utf8_lossy(&task.input).into_owned();
        order.push(input.clone());
        s.dispatcher
            .complete(worker.id, task.task_id, success(&input))
            .expect("accepted");
    }
    assert_eq!(order, ["w0", "w1", "w2", "w3"]);
    for running in waiting {
        running.await.expect("joined");
    }
}
