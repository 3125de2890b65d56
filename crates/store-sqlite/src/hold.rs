//! Writes held back for their dispatch's outcome: the writer keeps a record, or a claim, that
//! may wait out of its batch until the batch that brings the dispatch's `complete` (or until
//! its hold ends), so that they are written with it: a record as one finished row instead of
//! an insert and an update, a claim not at all (its attempt is carried into the complete).
//!
//! What may wait says so with `hold_until`: the record of a dispatch delivered while it
//! records (a keyless durable `Dispatch`; nobody is answered before the record commits) and
//! a `claim` note (nobody waits on a note, and a crash may lose one anyway). Every later write
//! of a held dispatch (its other notes) waits with it, so its writes keep their order. A batch
//! with a `Barrier` or a `Purge` releases everything: a barrier answers once every write sent
//! before it is committed, and a read behind it must see the held writes too.
//!
//! The held writes are kept per dispatch, so a batch costs a look-up per command it brings,
//! not a pass over everything held.

use std::collections::VecDeque;
use std::time::Instant;

use switchyard_core::{DispatchId, IdMap, IdSet};

use crate::ops::Op;
use crate::writer::Command;

/// The writes held back, per dispatch, in the order they were sent.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Per held dispatch, its writes in order (hashed as gateway-numbered ids: a held write's
    /// dispatch was recorded by this gateway, its id generated here).
    groups: IdMap<DispatchId, Vec<Command>>,
    /// When each group's hold ends, in the order the groups began (holds are a fixed span
    /// from their send, so this is also the order they end); an entry whose group was
    /// released early is skipped.
    ends: VecDeque<(Instant, DispatchId)>,
}

impl Held {
    /// Takes the batch `taken` in at `now`: returns what to write now (released groups first,
    /// in the order they were sent, then the rest of `taken`) and keeps what may wait.
    pub(crate) fn admit(&mut self, taken: Vec<Command>, now: Instant) -> Vec<Command> {
        if taken
            .iter()
            .any(|c| matches!(c.op, Op::Barrier | Op::Purge { .. }))
        {
            let mut write = self.release_all();
            write.extend(taken);
            return write;
        }
        let may_wait = |c: &Command| {
            c.hold_until.is_some_and(|until| until > now)
                && matches!(c.op, Op::Record(_) | Op::Claim { .. })
        };
        if self.groups.is_empty() && !taken.iter().any(may_wait) {
            return taken;
        }
        let completed: IdSet<&DispatchId> = taken
            .iter()
            .filter_map(|c| match &c.op {
                Op::Complete { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        let mut write = Vec::with_capacity(taken.len());
        for id in &completed {
            if let Some(group) = self.groups.remove(*id) {
                write.extend(group);
            }
        }
        self.release_ended(now, &mut write);
        let mut rest = Vec::with_capacity(taken.len());
        // Owned keys for the groups this batch begins, found before `taken` is consumed.
        let begins: Vec<Option<DispatchId>> = taken
            .iter()
            .map(|c| match c.op.id() {
                Some(id) if may_wait(c) && !completed.contains(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        drop(completed);
        for (command, begins) in taken.into_iter().zip(begins) {
            if let Some(group) = command.op.id().and_then(|id| self.groups.get_mut(id)) {
                group.push(command);
                continue;
            }
            match (begins, command.hold_until) {
                (Some(id), Some(until)) => {
                    self.ends.push_back((until, id.clone()));
                    self.groups.insert(id, vec![command]);
                }
                _ => rest.push(command),
            }
        }
        write.extend(rest);
        write
    }

    /// Moves the groups whose hold has ended at `now` to `write`, oldest first.
    fn release_ended(&mut self, now: Instant, write: &mut Vec<Command>) {
        while let Some((until, _)) = self.ends.front() {
            if *until > now {
                break;
            }
            if let Some((_, id)) = self.ends.pop_front()
                && let Some(group) = self.groups.remove(&id)
            {
                write.extend(group);
            }
        }
    }

    /// Every held write, oldest group first: for a barrier, a purge or the store's close.
    pub(crate) fn release_all(&mut self) -> Vec<Command> {
        let mut write = Vec::new();
        for (_, id) in std::mem::take(&mut self.ends) {
            if let Some(group) = self.groups.remove(&id) {
                write.extend(group);
            }
        }
        write
    }

    /// When the writer must next look at the held writes though nothing new arrives: the
    /// earliest end of a hold still running.
    pub(crate) fn next_release(&mut self) -> Option<Instant> {
        while let Some((until, id)) = self.ends.front() {
            if self.groups.contains_key(id) {
                return Some(*until);
            }
            self.ends.pop_front();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::test_ops::{claim, complete, record};

    fn command(op: Op, hold_until: Option<Instant>) -> Command {
        Command {
            op,
            reply: None,
            sent: Instant::now(),
            hold_until,
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
            command(claim(&held, 1), None),
            command(claim(&folded, 1), None),
            command(complete(&folded), None),
        ];
        let mut hold = Held::default();
        let write = hold.admit(batch, now);
        assert_eq!(
            ids(&write),
            [
                ("record", folded.clone()),
                ("record", plain),
                ("claim", folded.clone()),
                ("complete", folded),
            ]
        );
        assert_eq!(hold.next_release(), later);
        assert_eq!(
            ids(&hold.release_all()),
            [("record", held.clone()), ("claim", held)]
        );
        assert_eq!(hold.next_release(), None, "nothing left held");
    }

    #[test]
    fn a_held_dispatch_gathers_its_later_notes_and_its_complete_brings_them_back_first() {
        let now = Instant::now();
        let later = Some(now + Duration::from_millis(5));
        let (id, other) = (DispatchId::generate(), DispatchId::generate());
        let mut hold = Held::default();
        assert!(
            hold.admit(vec![command(record(&id), later)], now)
                .is_empty()
        );
        // A note that may not wait still waits behind its held record.
        let write = hold.admit(
            vec![command(claim(&id, 1), None), command(record(&other), None)],
            now,
        );
        assert_eq!(ids(&write), [("record", other.clone())]);
        let write = hold.admit(
            vec![command(record(&other), None), command(complete(&id), None)],
            now,
        );
        assert_eq!(
            ids(&write),
            [
                ("record", id.clone()),
                ("claim", id.clone()),
                ("record", other),
                ("complete", id),
            ],
            "the held writes first, in the order they were sent"
        );
        assert_eq!(hold.next_release(), None);
    }

    #[test]
    fn a_claim_may_wait_for_its_complete_and_one_that_may_not_is_written_at_once() {
        let now = Instant::now();
        let later = Some(now + Duration::from_millis(5));
        let (waits, plain) = (DispatchId::generate(), DispatchId::generate());
        let mut hold = Held::default();
        let write = hold.admit(
            vec![
                command(claim(&waits, 1), later),
                command(claim(&plain, 1), None),
            ],
            now,
        );
        assert_eq!(ids(&write), [("claim", plain)], "control: written at once");
        let write = hold.admit(vec![command(complete(&waits), None)], now);
        assert_eq!(
            ids(&write),
            [("claim", waits.clone()), ("complete", waits)],
            "the claim joins its complete's batch, where the complete supersedes it"
        );
    }

    #[test]
    fn a_hold_ends_at_its_instant_and_a_barrier_or_purge_holds_nothing() {
        let now = Instant::now();
        let id = DispatchId::generate();
        let mut hold = Held::default();
        let write = hold.admit(vec![command(record(&id), Some(now))], now);
        assert_eq!(write.len(), 1, "its hold has ended");

        let later = now + Duration::from_millis(5);
        let write = hold.admit(vec![command(record(&id), Some(later))], now);
        assert!(write.is_empty(), "control: still held");
        assert_eq!(hold.next_release(), Some(later));
        let write = hold.admit(Vec::new(), later);
        assert_eq!(write.len(), 1, "written when its hold ends");

        for other in [
            Op::Barrier,
            Op::Purge {
                finished_before: SystemTime::now(),
                after_seq: 0,
                window: 1,
            },
        ] {
            let batch = vec![command(record(&id), Some(later)), command(other, None)];
            assert_eq!(hold.admit(batch, now).len(), 2);
            assert_eq!(hold.next_release(), None);
        }
    }
}
