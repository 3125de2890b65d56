//! Between the store's columns and core's plain data: times as nanoseconds, one row to one
//! [`StoredDispatch`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rusqlite::Row;
use switchyard_core::{
    DispatchId, DispatchState, DispatchStoreError, NewDispatch, OutcomeRecord, StoredDispatch,
    WorkerId,
};

/// The columns [`RawRow::read`] reads, in its order.
pub(crate) const COLUMNS: &str = "id, namespace, task_queue, activity_type, node, input, \
    principal, idempotency_key, submitted_at_ns, deadline_ns, state, not_before_ns, \
    parked_reason, worker, attempts, finished_at_ns, outcome_kind, outcome_output, \
    outcome_message, outcome_retryable, outcome_reason, outcome_attempts";

/// `t` as nanoseconds since the Unix epoch (negative before it), saturating at the ends of
/// `i64` (years 1677 and 2262).
pub(crate) fn to_nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The instant [`to_nanos`] gave `nanos` for.
pub(crate) fn from_nanos(nanos: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// A worker id as SQLite's signed integer: the same 64 bits.
pub(crate) fn worker_to_sql(worker: WorkerId) -> i64 {
    i64::from_ne_bytes(worker.get().to_ne_bytes())
}

fn worker_from_sql(raw: i64) -> WorkerId {
    WorkerId::from_raw(u64::from_ne_bytes(raw.to_ne_bytes()))
}

/// An outcome's columns as read back; all present once a row is finished.
#[derive(Debug, Default)]
pub(crate) struct RawOutcome {
    pub(crate) kind: Option<String>,
    pub(crate) output: Option<Vec<u8>>,
    pub(crate) message: Option<String>,
    pub(crate) retryable: Option<bool>,
    pub(crate) reason: Option<String>,
    pub(crate) attempts: Option<i64>,
}

impl RawOutcome {
    /// The stored outcome, or the name of the column that is missing.
    pub(crate) fn into_record(self) -> Result<OutcomeRecord, &'static str> {
        Ok(OutcomeRecord {
            kind: self.kind.ok_or("outcome_kind")?,
            output: Bytes::from(self.output.unwrap_or_default()),
            message: self.message.ok_or("outcome_message")?,
            retryable: self.retryable.ok_or("outcome_retryable")?,
            reason: self.reason.ok_or("outcome_reason")?,
            attempts: self
                .attempts
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("outcome_attempts")?,
        })
    }
}

/// One row's columns as SQLite typed them, before they are checked.
#[derive(Debug)]
pub(crate) struct RawRow {
    id: String,
    namespace: String,
    task_queue: String,
    activity_type: String,
    node: Option<String>,
    input: Vec<u8>,
    principal: String,
    idempotency_key: Option<String>,
    submitted_at_ns: i64,
    deadline_ns: i64,
    state: String,
    not_before_ns: Option<i64>,
    parked_reason: Option<String>,
    worker: Option<i64>,
    attempts: i64,
    finished_at_ns: Option<i64>,
    outcome: RawOutcome,
}

impl RawRow {
    /// Reads a row selected with [`COLUMNS`].
    pub(crate) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            namespace: row.get(1)?,
            task_queue: row.get(2)?,
            activity_type: row.get(3)?,
            node: row.get(4)?,
            input: row.get(5)?,
            principal: row.get(6)?,
            idempotency_key: row.get(7)?,
            submitted_at_ns: row.get(8)?,
            deadline_ns: row.get(9)?,
            state: row.get(10)?,
            not_before_ns: row.get(11)?,
            parked_reason: row.get(12)?,
            worker: row.get(13)?,
            attempts: row.get(14)?,
            finished_at_ns: row.get(15)?,
            outcome: RawOutcome {
                kind: row.get(16)?,
                output: row.get(17)?,
                message: row.get(18)?,
                retryable: row.get(19)?,
                reason: row.get(20)?,
                attempts: row.get(21)?,
            },
        })
    }

    /// The dispatch the row holds; a row this build cannot read is an `Unavailable` store
    /// naming the row and the column.
    pub(crate) fn into_stored(self) -> Result<StoredDispatch, DispatchStoreError> {
        let bad = |column: &str| DispatchStoreError::Unavailable {
            detail: format!("dispatch {:?}: column {column} cannot be read", self.id),
        };
        let id = DispatchId::parse(&self.id).ok_or_else(|| bad("id"))?;
        let attempts = u32::try_from(self.attempts).map_err(|_| bad("attempts"))?;
        let state = match self.state.as_str() {
            "queued" => DispatchState::Queued {
                not_before: self.not_before_ns.map(from_nanos),
            },
            "parked" => DispatchState::Parked {
                reason: self.parked_reason.unwrap_or_default(),
            },
            "running" => DispatchState::Running {
                worker: worker_from_sql(self.worker.ok_or_else(|| bad("worker"))?),
                attempt: attempts,
            },
            "finished" => DispatchState::Finished {
                at: from_nanos(self.finished_at_ns.ok_or_else(|| bad("finished_at_ns"))?),
                outcome: self.outcome.into_record().map_err(bad)?,
            },
            _ => return Err(bad("state")),
        };
        Ok(StoredDispatch {
            dispatch: NewDispatch {
                id,
                namespace: self.namespace,
                task_queue: self.task_queue,
                activity_type: self.activity_type,
                node: self.node,
                input: Bytes::from(self.input),
                principal: self.principal,
                idempotency_key: self.idempotency_key,
                submitted_at: from_nanos(self.submitted_at_ns),
                deadline: from_nanos(self.deadline_ns),
            },
            state,
            attempts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_to_the_nanosecond_on_both_sides_of_the_epoch() {
        let now = SystemTime::now();
        for t in [
            now,
            UNIX_EPOCH,
            UNIX_EPOCH + Duration::from_nanos(1),
            UNIX_EPOCH - Duration::from_nanos(1_500),
        ] {
            assert_eq!(from_nanos(to_nanos(t)), t);
        }
        assert!(to_nanos(UNIX_EPOCH - Duration::from_nanos(1)) < 0);
    }

    #[test]
    fn worker_ids_keep_all_64_bits() {
        for raw in [0, 7, u64::MAX, 1 << 63] {
            let worker = WorkerId::from_raw(raw);
            assert_eq!(worker_from_sql(worker_to_sql(worker)), worker);
        }
    }

    #[test]
    fn a_finished_row_without_its_outcome_names_the_missing_column() {
        let outcome = RawOutcome {
            kind: Some("completed".into()),
            ..RawOutcome::default()
        };
        assert_eq!(outcome.into_record(), Err("outcome_message"));
    }
}
