//! One dispatch as a key-value value: a JSON header naming its fields, then the input and
//! output bytes raw (JSON would triple their size).
//!
//! Layout: the header's length (4 bytes, big endian), the header, the input, the output. The
//! header carries a format version; a value this build cannot read is an error naming why,
//! never a panic.

use std::time::{Duration, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use switchyard_core::{
    DispatchId, DispatchState, NewDispatch, OutcomeRecord, StoredDispatch, WorkerId,
};

/// The header format this build writes and reads.
const VERSION: u32 = 1;

/// One dispatch as the cluster keeps it: the row, and the node driving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    /// The dispatch and where it stands.
    pub(crate) stored: StoredDispatch,
    /// The node that drives it (recorded it, or took it over from a lost node).
    pub(crate) owner: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    version: u32,
    id: String,
    namespace: String,
    task_queue: String,
    activity_type: String,
    node: Option<String>,
    principal: String,
    idempotency_key: Option<String>,
    /// Nanoseconds: dispatches recorded within one millisecond keep their order.
    submitted_ns: u64,
    deadline_ms: u64,
    attempts: u32,
    owner: String,
    state: State,
    input_len: usize,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "label", rename_all = "snake_case")]
enum State {
    Queued {
        not_before_ms: Option<u64>,
    },
    Parked {
        reason: String,
    },
    Running {
        worker: u64,
        attempt: u32,
    },
    Finished {
        kind: String,
        message: String,
        retryable: bool,
        reason: String,
        attempts: u32,
        at_ms: u64,
    },
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

fn nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

fn instant(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// The value stored for `row`.
pub(crate) fn encode(row: &Row) -> Bytes {
    let d = &row.stored.dispatch;
    let (state, output) = match &row.stored.state {
        DispatchState::Parked { reason } => (
            State::Parked {
                reason: reason.clone(),
            },
            Bytes::new(),
        ),
        DispatchState::Running { worker, attempt } => (
            State::Running {
                worker: worker.get(),
                attempt: *attempt,
            },
            Bytes::new(),
        ),
        DispatchState::Finished { outcome, at } => (
            State::Finished {
                kind: outcome.kind.clone(),
                message: outcome.message.clone(),
                retryable: outcome.retryable,
                reason: outcome.reason.clone(),
                attempts: outcome.attempts,
                at_ms: millis(*at),
            },
            outcome.output.clone(),
        ),
        // Queued, and any state a later core adds: queued again, which a driver re-derives.
        DispatchState::Queued { not_before } => (
            State::Queued {
                not_before_ms: not_before.map(millis),
            },
            Bytes::new(),
        ),
        _ => (
            State::Queued {
                not_before_ms: None,
            },
            Bytes::new(),
        ),
    };
    let header = Header {
        version: VERSION,
        id: d.id.as_str().to_owned(),
        namespace: d.namespace.clone(),
        task_queue: d.task_queue.clone(),
        activity_type: d.activity_type.clone(),
        node: d.node.clone(),
        principal: d.principal.clone(),
        idempotency_key: d.idempotency_key.clone(),
        submitted_ns: nanos(d.submitted_at),
        deadline_ms: millis(d.deadline),
        attempts: row.stored.attempts,
        owner: row.owner.clone(),
        state,
        input_len: d.input.len(),
    };
    // Serialising a struct of strings and numbers cannot fail.
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let mut out = BytesMut::with_capacity(4 + json.len() + d.input.len() + output.len());
    out.put_u32(u32::try_from(json.len()).unwrap_or(u32::MAX));
    out.put_slice(&json);
    out.put_slice(&d.input);
    out.put_slice(&output);
    out.freeze()
}

/// The row stored as `value`, or why it cannot be read.
pub(crate) fn decode(value: &Bytes) -> Result<Row, String> {
    let len_bytes: [u8; 4] = value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or("shorter than its length prefix")?;
    let json_len = usize::try_from(u32::from_be_bytes(len_bytes)).map_err(|e| e.to_string())?;
    let json_end = 4usize
        .checked_add(json_len)
        .filter(|end| *end <= value.len())
        .ok_or("header longer than the value")?;
    let header: Header =
        serde_json::from_slice(&value[4..json_end]).map_err(|error| format!("header: {error}"))?;
    if header.version != VERSION {
        return Err(format!(
            "format version {} (this build reads {VERSION})",
            header.version
        ));
    }
    let input_end = json_end
        .checked_add(header.input_len)
        .filter(|end| *end <= value.len())
        .ok_or("input longer than the value")?;
    let input = value.slice(json_end..input_end);
    let output = value.slice(input_end..);
    let id = DispatchId::parse(&header.id).ok_or_else(|| format!("id {:?}", header.id))?;
    let state = match header.state {
        State::Queued { not_before_ms } => DispatchState::Queued {
            not_before: not_before_ms.map(instant),
        },
        State::Parked { reason } => DispatchState::Parked { reason },
        State::Running { worker, attempt } => DispatchState::Running {
            worker: WorkerId::from_raw(worker),
            attempt,
        },
        State::Finished {
            kind,
            message,
            retryable,
            reason,
            attempts,
            at_ms,
        } => DispatchState::Finished {
            outcome: OutcomeRecord {
                kind,
                output,
                message,
                retryable,
                reason,
                attempts,
            },
            at: instant(at_ms),
        },
    };
    Ok(Row {
        stored: StoredDispatch {
            dispatch: NewDispatch {
                id,
                namespace: header.namespace,
                task_queue: header.task_queue,
                activity_type: header.activity_type,
                node: header.node,
                input,
                principal: header.principal,
                idempotency_key: header.idempotency_key,
                submitted_at: SystemTime::UNIX_EPOCH + Duration::from_nanos(header.submitted_ns),
                deadline: instant(header.deadline_ms),
            },
            state,
            attempts: header.attempts,
        },
        owner: header.owner,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: DispatchState) -> Row {
        let at = instant(1_764_000_000_123);
        Row {
            stored: StoredDispatch {
                dispatch: NewDispatch {
                    id: DispatchId::generate(),
                    namespace: "payments".to_owned(),
                    task_queue: "default".to_owned(),
                    activity_type: "charge".to_owned(),
                    node: Some("rack-1".to_owned()),
                    input: Bytes::from_static(b"\x00order \xff7"),
                    principal: "shop".to_owned(),
                    idempotency_key: Some("order-7".to_owned()),
                    submitted_at: at,
                    deadline: at + Duration::from_secs(60),
                },
                state,
                attempts: 2,
            },
            owner: "a".to_owned(),
        }
    }

    #[test]
    fn every_state_round_trips_with_raw_input_and_output() {
        let states = [
            DispatchState::Queued { not_before: None },
            DispatchState::Queued {
                not_before: Some(instant(1_764_000_001_000)),
            },
            DispatchState::Parked {
                reason: "no_workers".to_owned(),
            },
            DispatchState::Running {
                worker: WorkerId::from_raw(7),
                attempt: 2,
            },
            DispatchState::Finished {
                outcome: OutcomeRecord {
                    kind: "completed".to_owned(),
                    output: Bytes::from_static(b"\x01done\x00"),
                    message: String::new(),
                    retryable: false,
                    reason: String::new(),
                    attempts: 0,
                },
                at: instant(1_764_000_002_000),
            },
        ];
        for state in states {
            let row = row(state);
            assert_eq!(decode(&encode(&row)), Ok(row));
        }
    }

    #[test]
    fn damaged_values_are_errors_naming_the_part() {
        let good = encode(&row(DispatchState::Queued { not_before: None }));
        assert!(decode(&good).is_ok(), "control: the undamaged value reads");
        assert_eq!(
            decode(&good.slice(..3)),
            Err("shorter than its length prefix".to_owned())
        );
        assert_eq!(
            decode(&good.slice(..20)),
            Err("header longer than the value".to_owned())
        );
        let json_len = usize::try_from(u32::from_be_bytes(good[..4].try_into().unwrap())).unwrap();
        assert_eq!(
            decode(&good.slice(..4 + json_len + 2)),
            Err("input longer than the value".to_owned())
        );
        let newer =
            Bytes::from(String::from_utf8_lossy(&good).replace("\"version\":1", "\"version\":9"));
        assert!(decode(&newer).unwrap_err().contains("format version 9"));
    }
}
