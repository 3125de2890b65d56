//! New rows: one per `INSERT`, or several per `INSERT` for the finished rows of a batch.
//!
//! Every statement SQLite runs opens cursors on the table and its indexes, allocates, and
//! closes them again. A batch under load inserts tens to hundreds of finished rows (records
//! written with their outcome, see [`fold`](crate::fold)), so the writer gathers them and
//! inserts [`ROWS_PER_INSERT`] per statement: in the durable stream's profile the writer's
//! time per row inserted went from about 7.3 µs to 6.3 µs (docs/benchmarks.md, session 14).
//!
//! An id already in the table (a caller retrying) is skipped by `ON CONFLICT (id) DO NOTHING`
//! in both forms; the several-row form says which rows it inserted with `RETURNING id`.

use std::collections::HashSet;
use std::sync::LazyLock;

use switchyard_core::NewDispatch;

use crate::codec::to_nanos;
use crate::ops::Finished;
use crate::statements::{Sql, Statements};

/// Rows per several-row `INSERT`; a batch's rest goes one per statement.
pub(crate) const ROWS_PER_INSERT: usize = 8;

/// The columns an insert writes, in the order [`bind`] binds them.
const COLUMNS: &str = "id, namespace, task_queue, activity_type, node, input, principal, \
     idempotency_key, submitted_at_ns, deadline_ns, state, attempts, finished_at_ns, \
     outcome_kind, outcome_output, outcome_message, outcome_retryable, outcome_reason, \
     outcome_attempts";

/// How many values one row binds.
const VALUES_PER_ROW: usize = 19;

/// `INSERT` of `rows` rows, skipping ids already recorded, returning the ids it inserted when
/// `returning`.
fn insert_sql(rows: usize, returning: bool) -> String {
    let one = format!(
        "({})",
        (0..VALUES_PER_ROW)
            .map(|_| "?")
            .collect::<Vec<_>>()
            .join(", ")
    );
    let values = (0..rows)
        .map(|_| one.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let returning = if returning { " RETURNING id" } else { "" };
    format!(
        "INSERT INTO dispatches ({COLUMNS}) VALUES {values} ON CONFLICT (id) DO NOTHING{returning}"
    )
}

/// The text of [`Sql::Insert`].
pub(crate) static INSERT_ONE: LazyLock<String> = LazyLock::new(|| insert_sql(1, false));

/// The text of [`Sql::InsertMany`].
pub(crate) static INSERT_MANY: LazyLock<String> =
    LazyLock::new(|| insert_sql(ROWS_PER_INSERT, true));

/// A row to insert: a new dispatch, queued, or finished with its outcome.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewRow<'a> {
    pub(crate) dispatch: &'a NewDispatch,
    pub(crate) finished: Option<Finished<'a>>,
}

/// Binds `row` as row number `slot` (from 0) of `statement`.
fn bind(
    statement: &mut rusqlite::Statement<'_>,
    slot: usize,
    row: NewRow<'_>,
) -> rusqlite::Result<()> {
    let d = row.dispatch;
    // A queued row leaves the outcome columns NULL; one statement serves both.
    let (state, attempts, at, outcome) = match row.finished {
        None => ("queued", 0, None, None),
        Some(Finished {
            outcome,
            at,
            attempts,
        }) => ("finished", attempts, Some(to_nanos(at)), Some(outcome)),
    };
    let base = slot * VALUES_PER_ROW;
    let mut at_column = 0;
    let mut next = || {
        at_column += 1;
        base + at_column
    };
    statement.raw_bind_parameter(next(), d.id.as_str())?;
    statement.raw_bind_parameter(next(), &d.namespace)?;
    statement.raw_bind_parameter(next(), &d.task_queue)?;
    statement.raw_bind_parameter(next(), &d.activity_type)?;
    statement.raw_bind_parameter(next(), &d.node)?;
    statement.raw_bind_parameter(next(), d.input.as_ref())?;
    statement.raw_bind_parameter(next(), &d.principal)?;
    statement.raw_bind_parameter(next(), &d.idempotency_key)?;
    statement.raw_bind_parameter(next(), to_nanos(d.submitted_at))?;
    statement.raw_bind_parameter(next(), to_nanos(d.deadline))?;
    statement.raw_bind_parameter(next(), state)?;
    statement.raw_bind_parameter(next(), attempts)?;
    statement.raw_bind_parameter(next(), at)?;
    statement.raw_bind_parameter(next(), outcome.map(|o| o.kind.as_str()))?;
    statement.raw_bind_parameter(next(), outcome.map(|o| o.output.as_ref()))?;
    statement.raw_bind_parameter(next(), outcome.map(|o| o.message.as_str()))?;
    statement.raw_bind_parameter(next(), outcome.map(|o| o.retryable))?;
    statement.raw_bind_parameter(next(), outcome.map(|o| o.reason.as_str()))?;
    statement.raw_bind_parameter(next(), outcome.map(|o| o.attempts))?;
    Ok(())
}

/// Inserts `row`; false when its id was already recorded.
pub(crate) fn insert_one(
    statements: &mut Statements<'_>,
    row: NewRow<'_>,
) -> rusqlite::Result<bool> {
    let statement = statements.get(Sql::Insert)?;
    bind(statement, 0, row)?;
    Ok(statement.raw_execute()? == 1)
}

/// Inserts `rows` in order, [`ROWS_PER_INSERT`] per statement; per row, whether it was inserted
/// (false for an id already recorded, also by an earlier row of `rows`).
pub(crate) fn insert_many(
    statements: &mut Statements<'_>,
    rows: &[NewRow<'_>],
) -> rusqlite::Result<Vec<bool>> {
    let mut inserted = Vec::with_capacity(rows.len());
    let mut chunks = rows.chunks_exact(ROWS_PER_INSERT);
    for chunk in &mut chunks {
        let statement = statements.get(Sql::InsertMany)?;
        for (slot, row) in chunk.iter().enumerate() {
            bind(statement, slot, *row)?;
        }
        let mut returned: HashSet<String> = HashSet::with_capacity(ROWS_PER_INSERT);
        let mut answers = statement.raw_query();
        while let Some(answer) = answers.next()? {
            returned.insert(answer.get(0)?);
        }
        // The rows of one statement are inserted in order: of two with one id, the first is.
        inserted.extend(
            chunk
                .iter()
                .map(|row| returned.remove(row.dispatch.id.as_str())),
        );
    }
    for row in chunks.remainder() {
        inserted.push(insert_one(statements, *row)?);
    }
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use bytes::Bytes;
    use switchyard_core::{DispatchId, OutcomeRecord};

    use super::*;
    use crate::options::Synchronous;

    fn dispatch(id: &DispatchId) -> NewDispatch {
        let now = SystemTime::now();
        NewDispatch {
            id: id.clone(),
            namespace: "ns".into(),
            task_queue: "q".into(),
            activity_type: "a".into(),
            node: Some("n1".into()),
            input: Bytes::from_static(b"in"),
            principal: "p".into(),
            idempotency_key: None,
            submitted_at: now,
            deadline: now,
        }
    }

    fn outcome() -> OutcomeRecord {
        OutcomeRecord {
            kind: "completed".into(),
            output: Bytes::from_static(b"out"),
            message: String::new(),
            retryable: false,
            reason: String::new(),
            attempts: 2,
        }
    }

    /// Every column of every row, in seq order.
    fn table(conn: &rusqlite::Connection) -> Vec<Vec<rusqlite::types::Value>> {
        let mut statement = conn
            .prepare(&format!("SELECT {COLUMNS} FROM dispatches ORDER BY seq"))
            .expect("prepare");
        statement
            .query_map([], |row| {
                (0..VALUES_PER_ROW)
                    .map(|i| row.get(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    #[test]
    fn many_rows_per_statement_write_what_one_per_statement_writes_and_skip_known_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = |name: &str| {
            crate::schema::open_writer(&dir.path().join(name), Synchronous::Normal).expect("open")
        };
        let (one, many) = (open("one.sqlite3"), open("many.sqlite3"));
        let outcome = outcome();
        let at = SystemTime::now();
        // Two full statements and a rest, with one id twice in the first statement and one
        // id recorded before: both the repeat and the known id are skipped.
        let ids: Vec<DispatchId> = (0..2 * ROWS_PER_INSERT + 3)
            .map(|_| DispatchId::generate())
            .collect();
        let mut dispatches: Vec<NewDispatch> = ids.iter().map(dispatch).collect();
        dispatches[3] = dispatch(&ids[1]);
        let known = 2 * ROWS_PER_INSERT;
        let rows: Vec<NewRow<'_>> = dispatches
            .iter()
            .enumerate()
            .map(|(i, dispatch)| NewRow {
                dispatch,
                // Every other row finished, so both shapes of row go through both forms.
                finished: (i % 2 == 0).then_some(Finished {
                    outcome: &outcome,
                    at,
                    attempts: 3,
                }),
            })
            .collect();
        let mut expected = vec![true; rows.len()];
        expected[3] = false;
        expected[known] = false;
        for (conn, several) in [(&one, false), (&many, true)] {
            let mut statements = Statements::new(conn);
            assert!(insert_one(&mut statements, rows[known]).expect("insert"));
            let inserted = if several {
                insert_many(&mut statements, &rows).expect("insert")
            } else {
                rows.iter()
                    .map(|row| insert_one(&mut statements, *row).expect("insert"))
                    .collect()
            };
            assert_eq!(inserted, expected, "several per statement: {several}");
        }
        let written = table(&many);
        assert_eq!(written.len(), rows.len() - 1, "the repeated id once");
        assert_eq!(written, table(&one), "the same rows, column for column");
        // Control: the table holds what was bound (a finished row's outcome, a queued row's NULLs).
        assert_eq!(
            written[1][10],
            rusqlite::types::Value::Text("finished".into())
        );
        assert_eq!(
            written[1][13],
            rusqlite::types::Value::Text("completed".into())
        );
        assert_eq!(
            written[2][10],
            rusqlite::types::Value::Text("queued".into())
        );
        assert_eq!(written[2][13], rusqlite::types::Value::Null);
    }
}
