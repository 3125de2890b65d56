//! Durable dispatches and the store's backlog on the wire: `DispatchInfo`, `DurableBacklog`.

use switchyard_core::{
    BacklogCensus, DispatchState, OutcomeRecord, StoredDispatch, UnservedReason,
};
use switchyard_proto::v1 as pb;

use super::convert::{millis, unix_ms, unserved_reason};
use super::outcome;

/// `stored` as `GetDispatch` and `ListDispatches` show it.
pub(crate) fn dispatch_info(stored: StoredDispatch) -> pb::DispatchInfo {
    use pb::dispatch_info::State;
    let dispatch = stored.dispatch;
    let state = match stored.state {
        DispatchState::Queued { not_before } => State::Queued(pb::DispatchQueued {
            not_before_unix_ms: not_before.map(unix_ms),
        }),
        DispatchState::Parked { reason } => State::Parked(pb::DispatchParked {
            reason: UnservedReason::from_label(&reason)
                .map_or(pb::UnservedReason::Unspecified, unserved_reason)
                .into(),
        }),
        DispatchState::Running { worker, attempt } => State::Running(pb::DispatchRunning {
            worker_id: worker.get(),
            attempt,
        }),
        DispatchState::Finished { outcome, at } => State::Finished(pb::DispatchFinished {
            outcome: Some(recorded_outcome(&outcome)),
            finished_at_unix_ms: unix_ms(at),
        }),
        // A state this build has no field for reads as queued: not finished, not placed.
        _ => State::Queued(pb::DispatchQueued::default()),
    };
    pb::DispatchInfo {
        dispatch_id: dispatch.id.to_string(),
        namespace: dispatch.namespace,
        task_queue: dispatch.task_queue,
        activity_type: dispatch.activity_type,
        node: dispatch.node.unwrap_or_default(),
        principal: dispatch.principal,
        idempotency_key: dispatch.idempotency_key.unwrap_or_default(),
        input_bytes: dispatch.input.len() as u64,
        submitted_at_unix_ms: unix_ms(dispatch.submitted_at),
        deadline_unix_ms: unix_ms(dispatch.deadline),
        attempts: stored.attempts,
        state: Some(state),
    }
}

/// A recorded outcome on the wire; one of a kind this build does not know (written by a newer
/// version) is `other` with its label.
pub(crate) fn recorded_outcome(record: &OutcomeRecord) -> pb::DispatchOutcome {
    match record.to_outcome() {
        Some(outcome) => outcome::outcome(outcome),
        None => pb::DispatchOutcome {
            outcome: Some(pb::dispatch_outcome::Outcome::Other(
                pb::DispatchOtherOutcome {
                    label: record.kind.clone(),
                },
            )),
        },
    }
}

/// One pool address's durable backlog.
pub(crate) fn backlog(census: &BacklogCensus) -> pb::DurableBacklog {
    pb::DurableBacklog {
        namespace: census.namespace.clone(),
        task_queue: census.task_queue.clone(),
        activity_type: census.activity_type.clone(),
        waiting: census.waiting,
        running: census.running,
        oldest_waiting_ms: census.oldest_waiting.map_or(0, millis),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use switchyard_core::{ActivityOutcome, DispatchId, NewDispatch, WorkerId};

    use super::*;

    fn stored(state: DispatchState) -> StoredDispatch {
        let submitted_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        StoredDispatch {
            dispatch: NewDispatch {
                id: DispatchId::generate(),
                namespace: "billing".to_owned(),
                task_queue: "default".to_owned(),
                activity_type: "charge".to_owned(),
                node: None,
                input: Bytes::from_static(b"12345"),
                principal: "app".to_owned(),
                idempotency_key: Some("order-7".to_owned()),
                submitted_at,
                deadline: submitted_at + Duration::from_secs(60),
            },
            state,
            attempts: 2,
        }
    }

    #[test]
    fn each_state_maps_to_its_field_with_its_detail() {
        use pb::dispatch_info::State;
        let parked = dispatch_info(stored(DispatchState::Parked {
            reason: "no_workers".to_owned(),
        }));
        assert_eq!(parked.submitted_at_unix_ms, 1_000_000);
        assert_eq!(parked.deadline_unix_ms, 1_060_000);
        assert_eq!(
            (
                parked.input_bytes,
                parked.attempts,
                parked.idempotency_key.as_str()
            ),
            (5, 2, "order-7")
        );
        assert!(matches!(parked.state, Some(State::Parked(p))
            if p.reason == i32::from(pb::UnservedReason::NoWorkers)));
        let running = dispatch_info(stored(DispatchState::Running {
            worker: WorkerId::from_raw(7),
            attempt: 3,
        }));
        assert!(matches!(running.state, Some(State::Running(r))
            if r.worker_id == 7 && r.attempt == 3));
        let done = dispatch_info(stored(DispatchState::Finished {
            outcome: OutcomeRecord::from(&ActivityOutcome::Completed(Bytes::from_static(b"ok"))),
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_001),
        }));
        let Some(State::Finished(finished)) = done.state else {
            panic!("finished: {:?}", done.state)
        };
        assert_eq!(finished.finished_at_unix_ms, 1_001_000);
        assert!(matches!(finished.outcome.and_then(|o| o.outcome),
            Some(pb::dispatch_outcome::Outcome::Completed(c)) if c.output == "ok"));
        // Control: an unknown parked reason is unspecified, not mistaken for another reason.
        let odd = dispatch_info(stored(DispatchState::Parked {
            reason: "teleporting".to_owned(),
        }));
        assert!(matches!(odd.state, Some(State::Parked(p))
            if p.reason == i32::from(pb::UnservedReason::Unspecified)));
    }

    #[test]
    fn an_outcome_kind_from_a_newer_version_is_other_with_its_label() {
        let record = OutcomeRecord {
            kind: "teleported".to_owned(),
            ..OutcomeRecord::from(&ActivityOutcome::TimedOut)
        };
        assert!(matches!(recorded_outcome(&record).outcome,
            Some(pb::dispatch_outcome::Outcome::Other(o)) if o.label == "teleported"));
        // Control: a known kind maps to its own field.
        assert!(matches!(
            recorded_outcome(&OutcomeRecord::from(&ActivityOutcome::TimedOut)).outcome,
            Some(pb::dispatch_outcome::Outcome::TimedOut(_))
        ));
    }
}
