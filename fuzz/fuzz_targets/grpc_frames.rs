//! Fuzzes the gRPC transport's handling of a registered worker stream: fuzz bytes decoded as
//! `WorkerFrame` messages (results, pongs, cancel acknowledgements, a second registration,
//! empty frames) are fed to the per-stream frame handler of a worker holding two real tasks,
//! next to another worker holding one. Task ids in the frames are steered onto the real ones
//! so the completion paths are reached, not only the unknown-task refusals.
//!
//! Properties: no panic; the handler ends the stream exactly when a frame breaks a stream rule
//! (second registration, result without outcome); no worker's in-flight count ever exceeds its
//! capacity; frames on one stream never finish the other worker's task.
#![no_main]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use switchyard_core::{
    ActivityRequest, CallerIdentity, Core, CoreConfig, DeliveryError, Registration, Registry,
    TransportName, WorkerDelivery, WorkerId, WorkerMessage,
};
use switchyard_proto::v1::{WorkerFrame, worker_frame::Frame};
use switchyard_auth::CallerTable;
use switchyard_transport_grpc::{
    GrpcServerConfig, SessionError, WorkerService, fuzz_registered_frames,
};

/// Keeps what the gateway pushed (bounded: the fixture pushes a handful of messages).
#[derive(Default)]
struct Capture(Mutex<Vec<WorkerMessage>>);

impl Capture {
    fn take(&self) -> Vec<WorkerMessage> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl WorkerDelivery for Capture {
    fn transport(&self) -> TransportName {
        TransportName::from_static("grpc")
    }
    fn is_connected(&self) -> bool {
        true
    }
    fn registration_carries_capacity(&self) -> bool {
        true
    }
    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        let mut queue = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if queue.len() >= 64 {
            return Err(DeliveryError::Full);
        }
        queue.push(message);
        Ok(())
    }
}

fn registration(activity: &str, capacity: u32) -> Registration {
    Registration {
        namespaces: ["ns".to_owned()].into_iter().collect(),
        task_queue: String::new(),
        node: None,
        activity_types: [activity.to_owned()].into_iter().collect(),
        identity: "fuzz".to_owned(),
        max_concurrency: Some(capacity),
    }
}

fn request(activity: &str) -> ActivityRequest {
    ActivityRequest {
        namespace: "ns".to_owned(),
        task_queue: String::new(),
        activity_type: activity.to_owned(),
        node: None,
        input: Bytes::new(),
        activity_id: None,
        timeout: Duration::from_secs(3600),
    }
}

/// Answers probation pings and collects task ids until `tasks` tasks arrived.
async fn settle(core: &Core, worker: WorkerId, capture: &Capture, tasks: usize) -> Vec<u64> {
    let mut held = Vec::new();
    for _ in 0..200 {
        for message in capture.take() {
            match message {
                WorkerMessage::Ping { seq } => core.record_pong(worker, seq),
                WorkerMessage::Task(task) => held.push(task.task_id.get()),
                _ => {}
            }
        }
        if held.len() >= tasks {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held
}

fuzz_target!(|data: &[u8]| {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let core = Core::start(Registry::builder(), CoreConfig::default());
        let service = WorkerService::new(
            core.clone(),
            Arc::new(CallerTable::new()),
            GrpcServerConfig::default(),
        );
        let caller = CallerIdentity::trusted("fuzz");
        let (ours, theirs) = (Arc::new(Capture::default()), Arc::new(Capture::default()));
        let Ok(our_token) = core
            .registry()
            .admit(&caller, registration("a", 2), ours.clone())
            .await
        else {
            panic!("a valid registration was refused");
        };
        let Ok(their_token) = core
            .registry()
            .admit(&caller, registration("b", 1), theirs.clone())
            .await
        else {
            panic!("a valid registration was refused");
        };
        let (our_id, their_id) = (our_token.worker_id(), their_token.worker_id());
        let mut dispatches = Vec::new();
        for activity in ["a", "a", "b"] {
            let core = core.clone();
            let caller = caller.clone();
            dispatches.push(tokio::spawn(async move {
                core.dispatcher().dispatch(&caller, request(activity)).await
            }));
        }
        // Pings first (probation), then the tasks; both captures are served in turn.
        let mut known = Vec::new();
        for _ in 0..3 {
            known.extend(settle(&core, our_id, &ours, 0).await);
            known.extend(settle(&core, their_id, &theirs, 0).await);
        }
        known.extend(settle(&core, our_id, &ours, 2usize.saturating_sub(known.len())).await);
        known.extend(settle(&core, their_id, &theirs, 1).await);
        let their_before = core.registry().worker(their_id).map(|w| w.in_flight);

        let mut frames = Vec::new();
        let mut rest = data;
        while let Some((&len, tail)) = rest.split_first() {
            let take = usize::from(len % 64).min(tail.len());
            let (body, tail) = tail.split_at(take);
            rest = tail;
            let Ok(mut frame) = WorkerFrame::decode(body) else {
                continue;
            };
            // Small ids are steered onto real tasks (ours and the other worker's).
            if !known.is_empty() {
                match frame.frame.as_mut() {
                    Some(Frame::Result(result)) if result.task_id < 16 => {
                        result.task_id = known[result.task_id as usize % known.len()];
                    }
                    Some(Frame::CancelAck(ack)) if ack.task_id < 16 => {
                        ack.task_id = known[ack.task_id as usize % known.len()];
                    }
                    _ => {}
                }
            }
            frames.push(frame);
        }
        let breaks_a_rule = frames.iter().any(|frame| match &frame.frame {
            Some(Frame::Register(_)) => true,
            Some(Frame::Result(result)) => result.outcome.is_none(),
            _ => false,
        });
        let ended = fuzz_registered_frames(&service, our_id, frames);
        match &ended {
            Some(SessionError::DoubleRegistration { .. })
            | Some(SessionError::ResultWithoutOutcome { .. }) => assert!(breaks_a_rule),
            Some(other) => panic!("unexpected stream end: {other}"),
            None => assert!(!breaks_a_rule, "a rule-breaking frame left the stream open"),
        }
        tokio::task::yield_now().await;
        for worker in core.registry().workers() {
            assert!(worker.in_flight <= worker.capacity.unwrap_or(0));
        }
        assert_eq!(
            core.registry().worker(their_id).map(|w| w.in_flight),
            their_before,
            "frames on one stream changed another worker's tasks"
        );
        for dispatch in dispatches {
            dispatch.abort();
        }
        drop((our_token, their_token));
    });
});
