//! Records held back for their outcome: the writer keeps a record that may wait out of its
//! batch until the batch that brings the dispatch's `complete` (or until its hold ends), so
//! the two are written as one finished row instead of an insert and an update.
//!
//! Only a record sent for a dispatch delivered while it records may wait (a keyless durable
//! `Dispatch` or `Submit`: nobody is answered before the record commits), and only until
//! `hold_until`. The notes of
//! a held dispatch (`claim`, `park`, `release`) wait with it, so its writes keep their order.
//! A batch with a `Barrier` or a `Purge` holds nothing back: a barrier answers once every
//! write sent before it is committed, and a read behind it must see the held records too.

use std::collections::HashSet;
use std::time::Instant;

use switchyard_core::DispatchId;

use crate::ops::Op;
use crate::writer::Command;

/// Splits `batch` into the commands to write now and those held back to the next batch, at
/// `now`.
pub(crate) fn hold_back(batch: Vec<Command>, now: Instant) -> (Vec<Command>, Vec<Command>) {
    let holdable = |command: &Command| command.hold_until.is_some_and(|until| until > now);
    if !batch.iter().any(holdable)
        || batch
            .iter()
            .any(|c| matches!(c.op, Op::Barrier | Op::Purge { .. }))
    {
        return (batch, Vec::new());
    }
    let completed: HashSet<&DispatchId> = batch
        .iter()
        .filter_map(|c| match &c.op {
            Op::Complete { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    let held: HashSet<DispatchId> = batch
        .iter()
        .filter(|c| holdable(c))
        .filter_map(|c| match &c.op {
            Op::Record(dispatch) if !completed.contains(&dispatch.id) => Some(dispatch.id.clone()),
            _ => None,
        })
        .collect();
    if held.is_empty() {
        return (batch, Vec::new());
    }
    batch
        .into_iter()
        .partition(|c| c.op.id().is_none_or(|id| !held.contains(id)))
}

/// When the writer must next look at `held` though nothing new arrives: the earliest end of a
/// hold.
pub(crate) fn next_release(held: &[Command]) -> Option<Instant> {
    held.iter().filter_map(|c| c.hold_until).min()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use switchyard_core::{OutcomeRecord, WorkerId};

    use super::*;
    use crate::test_ops::record;

    fn command(op: Op, hold_until: Option<Instant>) -> Command {
        Command {
            op,
            reply: None,
            sent: Instant::now(),
            hold_until,
        }
    }

    fn claim(id: &DispatchId) -> Op {
        Op::Claim {
            id: id.clone(),
            worker: WorkerId::from_raw(1),
            attempt: 1,
        }
    }

    fn complete(id: &DispatchId) -> Op {
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

    fn ids(commands: &[Command]) -> Vec<(&'static str, DispatchId)> {
        commands
            .iter()
            .filter_map(|c| {
                let kind = match &c.op {
                    Op::Record(_) => "record",
                    Op::Claim { .. } => "claim",
                    Op::Complete { .. } => "complete",
                    _ => "other",
                };
                c.op.id().map(|id| (kind, id.clone()))
            })
            .collect()
    }

    #[test]
    fn a_holdable_record_without_its_outcome_waits_with_its_notes_and_the_rest_is_written() {
        let now = Instant::now();
        let later = Some(now + Duration::from_millis(5));
        let (held, folded, plain) = (
            DispatchId::generate(),
            DispatchId::generate(),
            DispatchId::generate(),
        );
        let batch = vec![
            command(record(&held), later),
            command(record(&folded), later),
            // Control: a record that may not wait is written though its outcome is missing.
            command(record(&plain), None),
            command(claim(&held), None),
            command(claim(&folded), None),
            command(complete(&folded), None),
        ];
        let (write, hold) = hold_back(batch, now);
        assert_eq!(
            ids(&hold),
            [("record", held.clone()), ("claim", held.clone())]
        );
        assert_eq!(
            ids(&write),
            [
                ("record", folded.clone()),
                ("record", plain),
                ("claim", folded.clone()),
                ("complete", folded),
            ]
        );
        assert_eq!(next_release(&hold), later);
    }

    #[test]
    fn a_hold_ends_at_its_instant_and_a_barrier_or_purge_holds_nothing() {
        let now = Instant::now();
        let id = DispatchId::generate();
        let (write, hold) = hold_back(vec![command(record(&id), Some(now))], now);
        assert_eq!((write.len(), hold.len()), (1, 0), "its hold has ended");

        let later = Some(now + Duration::from_millis(5));
        let (write, hold) = hold_back(vec![command(record(&id), later)], now);
        assert_eq!((write.len(), hold.len()), (0, 1), "control: still held");

        for other in [
            Op::Barrier,
            Op::Purge {
                finished_before: SystemTime::now(),
                limit: 1,
            },
        ] {
            let batch = vec![command(record(&id), later), command(other, None)];
            let (write, hold) = hold_back(batch, now);
            assert_eq!((write.len(), hold.len()), (2, 0));
        }
    }
}
