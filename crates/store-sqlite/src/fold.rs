//! A batch's plan: the writes of one batch that a later write of the same batch makes
//! unnecessary, so each dispatch's row is written as few times as the batch allows.
//!
//! A state note (`park`, `claim`, `release`) changes only an unfinished row, and a `complete`
//! overwrites everything such a note sets but a claim's attempt count: a note followed in the
//! batch by its dispatch's `complete` is not written, its attempt carried into the complete. A
//! `record` followed in the batch by its dispatch's `complete` is inserted as a finished row,
//! and the complete then writes nothing (when that record inserted; otherwise it runs as
//! usual). The batch commits as one transaction, so nobody can see the states skipped.

use switchyard_core::{DispatchId, IdMap};

use crate::ops::Op;

/// What the writer does with one command of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Write it as it is.
    Apply,
    /// A state note that the dispatch's `complete` later in the batch supersedes.
    Superseded,
    /// A record whose dispatch's `complete` is command `complete` of the batch: inserted
    /// finished.
    RecordFinished { complete: usize },
    /// The `complete` of a dispatch recorded by command `record` of the batch: written by that
    /// record when it inserted, applied as usual when it did not.
    CompleteFolded { record: usize },
}

/// The plan of one batch: a [`Step`] per command, and per `complete` the highest attempt of the
/// claims it superseded.
#[derive(Debug)]
pub(crate) struct Plan {
    steps: Vec<Step>,
    claimed: Vec<u32>,
}

impl Plan {
    /// Plans `ops`, a batch in the order it was sent.
    pub(crate) fn new(ops: &[Op]) -> Self {
        let mut first_complete: IdMap<&DispatchId, usize> = IdMap::default();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Complete { id, .. } = op {
                first_complete.entry(id).or_insert(i);
            }
        }
        let mut steps = vec![Step::Apply; ops.len()];
        let mut claimed = vec![0; ops.len()];
        if first_complete.is_empty() {
            return Self { steps, claimed };
        }
        let later_complete =
            |id: &DispatchId, i: usize| first_complete.get(id).copied().filter(|&j| j > i);
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Record(dispatch) => {
                    if let Some(j) = later_complete(&dispatch.id, i)
                        && steps[j] == Step::Apply
                    {
                        steps[i] = Step::RecordFinished { complete: j };
                        steps[j] = Step::CompleteFolded { record: i };
                    }
                }
                Op::Claim { id, attempt, .. } => {
                    if let Some(j) = later_complete(id, i) {
                        steps[i] = Step::Superseded;
                        claimed[j] = claimed[j].max(*attempt);
                    }
                }
                Op::Park { id, .. } | Op::Release { id, .. } => {
                    if later_complete(id, i).is_some() {
                        steps[i] = Step::Superseded;
                    }
                }
                Op::Complete { .. } | Op::Barrier | Op::Purge { .. } => {}
            }
        }
        Self { steps, claimed }
    }

    /// What to do with command `i`.
    pub(crate) fn step(&self, i: usize) -> Step {
        self.steps.get(i).copied().unwrap_or(Step::Apply)
    }

    /// For a `complete` at `i`: the highest attempt of the claims it superseded (0 for none).
    pub(crate) fn claimed(&self, i: usize) -> u32 {
        self.claimed.get(i).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::test_ops::{claim, complete, record};

    #[test]
    fn a_record_and_its_complete_in_one_batch_fold_and_the_notes_between_are_superseded() {
        let (a, b) = (DispatchId::generate(), DispatchId::generate());
        let ops = [
            record(&a),
            record(&b),
            claim(&a, 1),
            claim(&a, 2),
            Op::Park {
                id: b.clone(),
                reason: "no_workers".into(),
            },
            complete(&a),
            claim(&a, 3),
        ];
        let plan = Plan::new(&ops);
        let steps: Vec<Step> = (0..ops.len()).map(|i| plan.step(i)).collect();
        assert_eq!(
            steps,
            [
                Step::RecordFinished { complete: 5 },
                // Control: `b` has no complete in the batch, so its record and note are written.
                Step::Apply,
                Step::Superseded,
                Step::Superseded,
                Step::Apply,
                Step::CompleteFolded { record: 0 },
                // A note after the outcome is applied (and changes nothing).
                Step::Apply,
            ]
        );
        assert_eq!(
            plan.claimed(5),
            2,
            "the highest superseded claim is carried"
        );
    }

    #[test]
    fn a_complete_without_its_record_in_the_batch_supersedes_notes_only() {
        let a = DispatchId::generate();
        let ops = [claim(&a, 4), complete(&a), complete(&a)];
        let plan = Plan::new(&ops);
        assert_eq!(plan.step(0), Step::Superseded);
        assert_eq!(plan.step(1), Step::Apply);
        assert_eq!(plan.claimed(1), 4);
        assert_eq!(plan.step(2), Step::Apply, "a second complete runs as usual");
        assert_eq!(plan.claimed(2), 0);
    }

    #[test]
    fn a_record_after_the_complete_is_not_folded() {
        let a = DispatchId::generate();
        let ops = [complete(&a), record(&a), claim(&a, 1)];
        let plan = Plan::new(&ops);
        for i in 0..ops.len() {
            assert_eq!(plan.step(i), Step::Apply, "command {i}");
        }
    }
}
