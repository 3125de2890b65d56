//! The retention's purge: finished rows past their retention deleted, found without an index.
//!
//! Schema 3 keeps no index of finishing times (every finished row paid for one and only the
//! purge read it). The purge walks the table in `seq` order instead, a window of rows per
//! transaction, and stops at the first row submitted at or after the cutoff: a dispatch cannot
//! finish before it was submitted, and rows are recorded in about submission order, so a row
//! after it is due only if it was recorded out of that order. What one walk reads is therefore
//! the rows it deletes plus the old rows that are not due yet (unfinished, or finished within
//! the retention), not the whole table.
//!
//! Two things put rows out of submission order, and a row behind the stop waits for a later
//! walk: submissions racing to the writer, and a record held a few milliseconds for its
//! outcome ([`crate::hold`]), which only matter for rows submitted right at the cutoff (the
//! next walk, a purge interval later, deletes them); and the wall clock set back, which makes
//! rows recorded after that look older than the ones before, so they are deleted up to that
//! much later.

use std::time::SystemTime;

use rusqlite::params;

use crate::codec::to_nanos;
use crate::statements::{Sql, Statements};

/// One row as the purge sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scanned {
    pub(crate) seq: i64,
    pub(crate) submitted_at_ns: i64,
    /// `None` while unfinished.
    pub(crate) finished_at_ns: Option<i64>,
}

/// What one window of the walk decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The rows to delete, by `seq`.
    pub(crate) due: Vec<i64>,
    /// Where the next window starts (after this `seq`); `None` once the walk is over.
    pub(crate) resume_after: Option<i64>,
}

/// Judges a window of rows read in `seq` order, `full` if the window held as many rows as it
/// asked for (so more may follow): due are the rows finished before `cutoff_ns`, up to the
/// first row submitted at or after it, where the walk ends; it also ends with a window that
/// was not full.
pub(crate) fn judge(rows: &[Scanned], cutoff_ns: i64, full: bool) -> Verdict {
    let mut verdict = Verdict::default();
    for row in rows {
        if row.submitted_at_ns >= cutoff_ns {
            return verdict;
        }
        if row.finished_at_ns.is_some_and(|at| at < cutoff_ns) {
            verdict.due.push(row.seq);
        }
    }
    verdict.resume_after = rows.last().filter(|_| full).map(|row| row.seq);
    verdict
}

/// What one purge step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Purged {
    pub(crate) deleted: u64,
    /// Where the next step starts; `None`: the purge is done.
    pub(crate) resume_after: Option<i64>,
}

/// One step of the walk, inside the batch's transaction: reads up to `window` rows after
/// `after_seq` and deletes the due ones.
pub(crate) fn step(
    statements: &mut Statements<'_>,
    finished_before: SystemTime,
    after_seq: i64,
    window: u64,
) -> rusqlite::Result<Purged> {
    let cutoff_ns = to_nanos(finished_before);
    let rows: Vec<Scanned> = statements
        .get(Sql::PurgeScan)?
        .query_map(params![after_seq, window], |row| {
            Ok(Scanned {
                seq: row.get(0)?,
                submitted_at_ns: row.get(1)?,
                finished_at_ns: row.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let full = u64::try_from(rows.len()).is_ok_and(|read| read >= window);
    let verdict = judge(&rows, cutoff_ns, full);
    let delete = statements.get(Sql::PurgeRow)?;
    for seq in &verdict.due {
        delete.execute(params![seq])?;
    }
    Ok(Purged {
        deleted: verdict.due.len() as u64,
        resume_after: verdict.resume_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, submitted_at_ns: i64, finished_at_ns: Option<i64>) -> Scanned {
        Scanned {
            seq,
            submitted_at_ns,
            finished_at_ns,
        }
    }

    #[test]
    fn rows_finished_before_the_cutoff_are_due_and_others_are_kept() {
        let rows = [
            row(1, 10, Some(20)),
            row(2, 11, None),
            row(3, 12, Some(100)),
            row(4, 13, Some(99)),
        ];
        let verdict = judge(&rows, 100, true);
        assert_eq!(verdict.due, [1, 4], "finished before 100; 3 finished at it");
        assert_eq!(
            verdict.resume_after,
            Some(4),
            "a full window: more may follow"
        );
        // Control: a window that was not full ends the walk.
        assert_eq!(judge(&rows, 100, false).resume_after, None);
    }

    #[test]
    fn the_walk_ends_at_the_first_row_submitted_at_or_after_the_cutoff() {
        // Row 3 was submitted at the cutoff; row 4 after it is stamped earlier (a clock set
        // back) and finished before the cutoff, and still waits for a later walk.
        let rows = [
            row(1, 10, Some(20)),
            row(2, 100, Some(150)),
            row(3, 30, Some(40)),
        ];
        let verdict = judge(&rows, 100, true);
        assert_eq!(verdict.due, [1]);
        assert_eq!(verdict.resume_after, None, "nothing after row 2 is read");
        // Control: once the cutoff has passed row 2's submission, all of them are judged.
        let later = judge(&rows, 200, true);
        assert_eq!(later.due, [1, 2, 3]);
        assert_eq!(later.resume_after, Some(3));
    }

    #[test]
    fn an_empty_window_ends_the_walk() {
        assert_eq!(judge(&[], 100, false), Verdict::default());
    }
}
