//! Operations the unit tests of the writer's batching build.

use std::time::SystemTime;

use bytes::Bytes;
use switchyard_core::{DispatchId, NewDispatch};

use crate::ops::Op;

/// A record of a dispatch `id` in namespace `ns`, due now.
pub(crate) fn record(id: &DispatchId) -> Op {
    let now = SystemTime::now();
    Op::Record(NewDispatch {
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
    })
}
