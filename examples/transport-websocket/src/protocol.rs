//! The wire protocol: one JSON object per WebSocket text message.
//!
//! JSON text was chosen over binary protobuf because the transport exists for workers that
//! only have a browser or an HTTPS-only network: a browser speaks it with `JSON.parse` and
//! `atob`, with no code generator and no protobuf runtime. The cost is base64 for the opaque
//! task input and output (a third larger) and a parse per frame, both small beside a network
//! round trip. Binary WebSocket messages are a protocol error.
//!
//! Every object has a `"type"`. Task ids, ping sequence numbers and worker ids are unsigned
//! 64-bit integers, written as decimal strings because JavaScript numbers lose precision past
//! 2^53 (a number is accepted on input). `input` and `output` are standard base64 with
//! padding. Unknown fields are ignored and unknown `type`s are skipped, so either side may add
//! frames without breaking the other.
//!
//! | direction | `type` | fields |
//! |---|---|---|
//! | worker → gateway | `register` | `namespaces`, `task_queue`, `node`, `activity_types`, `identity`, `max_concurrency`, `token` (optional: the bearer token, for clients that cannot set an `Authorization` header) |
//! | gateway → worker | `registered` | `worker_id`, `task_queue` (normalised), `ping_interval_ms` |
//! | gateway → worker | `refused` | `code` (the close code that follows), `message` (the whole refusal) |
//! | gateway → worker | `task` | `task_id`, `namespace`, `task_queue`, `activity_type`, `input`, `attempt`, `deadline_unix_ms` |
//! | gateway → worker | `ping` | `seq` |
//! | worker → gateway | `pong` | `seq` (echoed) |
//! | worker → gateway | `result` | `task_id` and either `output` or `failure: {message, retryable}` |
//! | gateway → worker | `cancel` | `task_id`, `reason` (`requested`, `deadline_exceeded`, `shutting_down`, `caller_gone`, `drain_deadline`: a drain passed its deadline with the task held) |
//! | worker → gateway | `cancel_ack` | `task_id`: the cancelled task stopped without a result |
//! | gateway → worker | `drain` | `reason`: `requested` (an operator's or the worker's own drain: final) or `shutting_down` (the gateway is stopping: come back later; the close that follows is 1001). Finish what you hold, take nothing new, then close with 1000 |
//!
//! The first worker frame must be `register`; the gateway answers `registered`, or `refused`
//! followed by a close whose [`CloseCode`] names the rule broken. The worker's runtime answers
//! every `ping` itself, promptly, or it is excluded and then deregistered: WebSocket-level
//! ping frames do not count, since a proxy or a socket library answers those for a stuck
//! worker.

mod close;
mod codec;
mod frames;

pub use close::CloseCode;
pub(crate) use close::fit_reason;
pub(crate) use frames::{GatewayFrame, RegisterFrame, ResultFrame, WorkerFrame, millis};

/// The WebSocket subprotocol name of this protocol; the gateway echoes it when a client offers
/// it (browsers that offer subprotocols require one back).
pub const SUBPROTOCOL: &str = "switchyard.v1.json";

/// Why a text frame could not be read as a protocol frame.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// The text is not JSON, lacks a field, or has a field of the wrong type or encoding.
    #[error("frame is not valid protocol JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A `result` frame carried both `output` and `failure`, or neither.
    #[error("result for task {task_id} must carry exactly one of output and failure")]
    ResultShape {
        /// The task the result quoted.
        task_id: u64,
    },
    /// A `task` frame's deadline is beyond what the system clock can represent.
    #[error("task {task_id} deadline_unix_ms {deadline_unix_ms} is out of range")]
    DeadlineOutOfRange {
        /// The task.
        task_id: u64,
        /// The deadline as sent.
        deadline_unix_ms: u64,
    },
}

/// Encodes one frame as the text of a WebSocket message.
pub(crate) fn encode<T: serde::Serialize>(frame: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string(frame)
}

/// Decodes a worker's frame.
pub(crate) fn decode_worker(text: &str) -> Result<WorkerFrame, DecodeError> {
    Ok(serde_json::from_str(text)?)
}

/// Decodes a gateway's frame.
pub(crate) fn decode_gateway(text: &str) -> Result<GatewayFrame, DecodeError> {
    Ok(serde_json::from_str(text)?)
}
