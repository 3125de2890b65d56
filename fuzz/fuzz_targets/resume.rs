//! Fuzzes session resume (`Core::resume`): an arbitrary resume request (the right or a wrong
//! session id, the right secret, a near miss or arbitrary bytes, the right or another
//! principal, task lists of any length and content) against a core holding one suspended
//! session worker with two held tasks and one plain worker. Resume must never panic; it must
//! succeed exactly when the id, the secret and the principal all match; a refusal must leave
//! the session suspended with its tasks; a success must keep the worker id, list as held
//! exactly the reported tasks core holds, and bring the worker back (announced, eligible).
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use switchyard_core::{
    ActivityRequest, CallerIdentity, Core, CoreConfig, DeliveryError, Eligibility, Registration,
    Registry, ResumeRefused, ResumeRequest, TaskId, TransportName, WorkerDelivery, WorkerId,
    WorkerMessage,
};
use tokio::sync::mpsc;

/// A leg over an unbounded channel (the fuzz run reads what was delivered).
struct Leg(mpsc::UnboundedSender<WorkerMessage>);

impl WorkerDelivery for Leg {
    fn transport(&self) -> TransportName {
        TransportName::from_static("fuzz")
    }
    fn is_connected(&self) -> bool {
        !self.0.is_closed()
    }
    fn registration_carries_capacity(&self) -> bool {
        true
    }
    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        self.0.send(message).map_err(|_| DeliveryError::Closed)
    }
}

fn leg() -> (Arc<Leg>, mpsc::UnboundedReceiver<WorkerMessage>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Arc::new(Leg(tx)), rx)
}

/// Reads fuzz bytes as a stream of small decisions.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        first
    }

    fn ids(&mut self, held: &[TaskId]) -> Vec<TaskId> {
        let count = match self.byte() % 8 {
            7 => usize::from(self.byte()) * 300,
            n => usize::from(n),
        };
        (0..count)
            .map(|i| match self.byte() % 4 {
                0 | 1 => held[i % held.len()],
                2 => TaskId::from_raw(u64::from(self.byte())),
                _ => TaskId::from_raw(u64::MAX - i as u64),
            })
            .collect()
    }
}

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(run(Input(data)));
});

async fn run(mut input: Input<'_>) {
    let core = Core::start(Registry::builder(), CoreConfig::default());
    let owner = CallerIdentity::trusted("owner");
    let registration = Registration {
        namespaces: BTreeSet::from(["ns".to_owned()]),
        activity_types: BTreeSet::from(["run".to_owned()]),
        max_concurrency: Some(2),
        reconnect_grace: Duration::from_secs(30),
        ..Registration::default()
    };
    let (first, mut first_rx) = leg();
    let token = core
        .registry()
        .admit(&owner, registration, first)
        .await
        .expect("admitted");
    let worker = token.worker_id();
    let grant = token.session().cloned().expect("a session");
    // Let probation pass: answer the prober's pings until the worker is eligible.
    for _ in 0..50 {
        while let Ok(message) = first_rx.try_recv() {
            if let WorkerMessage::Ping { seq } = message {
                core.record_pong(worker, seq);
            }
        }
        if core.registry().worker(worker).map(|w| w.eligibility) == Some(Eligibility::Eligible) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two dispatches the worker holds.
    let mut dispatches = Vec::new();
    for i in 0..2 {
        let core = core.clone();
        dispatches.push(tokio::spawn(async move {
            let request = ActivityRequest {
                namespace: "ns".into(),
                task_queue: String::new(),
                activity_type: "run".into(),
                node: None,
                input: bytes_of(i),
                activity_id: None,
                timeout: Duration::from_secs(600),
            };
            core.dispatcher()
                .dispatch(&CallerIdentity::trusted("producer"), request)
                .await
        }));
    }
    let mut held = Vec::new();
    while held.len() < 2 {
        match first_rx.recv().await {
            Some(WorkerMessage::Task(task)) => held.push(task.task_id),
            Some(_) => {}
            None => return,
        }
    }
    drop(first_rx);
    token.deregister(switchyard_core::DisconnectReason::Disconnect);
    assert_eq!(
        core.registry().worker(worker).map(|w| w.eligibility),
        Some(Eligibility::Suspended)
    );

    let session_id = match input.byte() % 4 {
        0 => WorkerId::from_raw(worker.get() + 1),
        _ => worker,
    };
    let secret = match input.byte() % 4 {
        0 => {
            let mut near = grant.secret.as_bytes().to_vec();
            let at = usize::from(input.byte()) % near.len();
            near[at] ^= 1 | input.byte();
            near
        }
        1 => {
            let len = usize::from(input.byte() % 40);
            (0..len).map(|_| input.byte()).collect()
        }
        _ => grant.secret.as_bytes().to_vec(),
    };
    let principal_matches = input.byte() % 4 != 0;
    let caller = if principal_matches {
        owner.clone()
    } else {
        CallerIdentity::trusted("intruder")
    };
    let running = input.ids(&held);
    let unacked = input.ids(&held);
    let request = ResumeRequest {
        session_id,
        secret: secret.clone(),
        running: running.clone(),
        unacked: unacked.clone(),
    };
    let (second, _second_rx) = leg();
    let resumed = core.resume(&caller, request, second).await;
    let too_many = running.len() > switchyard_core::MAX_RESUME_TASKS
        || unacked.len() > switchyard_core::MAX_RESUME_TASKS;
    let should = session_id == worker
        && secret == grant.secret.as_bytes().to_vec()
        && principal_matches
        && !too_many;
    match resumed {
        Ok(resumed) => {
            assert!(should, "resumed without every proof");
            assert_eq!(resumed.token.worker_id(), worker);
            let reported: BTreeSet<TaskId> = running.iter().chain(&unacked).copied().collect();
            let expected: Vec<TaskId> = held
                .iter()
                .copied()
                .filter(|task| reported.contains(task))
                .collect();
            let mut listed = resumed.held.clone();
            listed.sort_unstable();
            let mut expected_sorted = expected.clone();
            expected_sorted.sort_unstable();
            assert_eq!(listed, expected_sorted, "held = reported ∩ held by core");
            assert!(resumed.token.announce());
            let standing = core.registry().worker(worker).map(|w| w.eligibility);
            assert!(
                matches!(standing, Some(Eligibility::OnProbation | Eligibility::Eligible | Eligibility::AtCapacity { .. })),
                "{standing:?}"
            );
        }
        Err(refusal) => {
            assert!(!should || too_many, "refused with every proof: {refusal}");
            if too_many {
                assert!(matches!(refusal, ResumeRefused::TooManyTasks { .. }));
            }
            let standing = core.registry().worker(worker).map(|w| w.eligibility);
            assert_eq!(standing, Some(Eligibility::Suspended), "a refusal changes nothing");
            assert_eq!(core.dispatcher().pending_tasks(), 2, "its tasks are still held");
        }
    }
    for dispatch in dispatches {
        dispatch.abort();
    }
}

fn bytes_of(i: u8) -> bytes::Bytes {
    bytes::Bytes::from(vec![i])
}
