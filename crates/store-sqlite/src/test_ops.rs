//! Operations the unit tests of the writer's batching build.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use switchyard_core::{DispatchId, NewDispatch, OutcomeRecord, WorkerId};

use crate::ops::Op;

/// A record of a dispatch `id` in namespace `ns`, due now.
pub(crate) fn record(id: &DispatchId) -> Op {
    let now = SystemTime::now();
    Op::Record(Arc::new(NewDispatch {
        id: id.clone(),
        namespace: "ns".into(),
        task_queue: "q".into(),
        activity_type: "a".into(),
        node: None,
        input: Bytes::from_static(b"in"),
        principal: "p".into(),
        idempotency_key: None,
        submitted_at: now,
        deadline: now,
    }))
}

/// A claim of `id` by worker 1 as delivery number `attempt`.
pub(crate) fn claim(id: &DispatchId, attempt: u32) -> Op {
    Op::Claim {
        id: id.clone(),
        worker: WorkerId::from_raw(1),
        attempt,
    }
}

/// A `completed` outcome of `id`, recorded now.
pub(crate) fn complete(id: &DispatchId) -> Op {
    Op::Complete {
        id: id.clone(),
        outcome: OutcomeRecord {
            kind: "completed".into(),
            output: Bytes::new(),
            message: String::new(),
            retryable: false,
            reason: String::new(),
            attempts: 1,
        },
        at: SystemTime::now(),
    }
}
