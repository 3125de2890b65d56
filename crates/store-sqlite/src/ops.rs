//! The writes the writer applies inside its batch transaction, one per command.
//!
//! Each operation decides from what the open transaction shows (earlier commands of the same
//! batch included), so two records with one idempotency key in one batch still give one
//! dispatch, and the first of two completions in one batch wins.

use std::time::SystemTime;

use rusqlite::{Connection, OptionalExtension, params};
use switchyard_core::{
    Completion, DispatchId, DispatchStoreError, MAX_IDEMPOTENCY_KEY_BYTES, NewDispatch,
    OutcomeRecord, Recorded, WorkerId,
};

use crate::backlog::Backlog;
use crate::codec::{RawOutcome, to_nanos, worker_to_sql};

/// The bounds `record` enforces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_queued_per_namespace: u64,
    pub(crate) max_bytes: u64,
}

/// One write.
#[derive(Debug)]
pub(crate) enum Op {
    Record(NewDispatch),
    Park {
        id: DispatchId,
        reason: String,
    },
    Claim {
        id: DispatchId,
        worker: WorkerId,
        attempt: u32,
    },
    Release {
        id: DispatchId,
        not_before: Option<SystemTime>,
    },
    Complete {
        id: DispatchId,
        outcome: OutcomeRecord,
        at: SystemTime,
    },
    /// Deletes at most `limit` rows finished before `finished_before`.
    Purge {
        finished_before: SystemTime,
        limit: u64,
    },
}

/// What a write did.
#[derive(Debug)]
pub(crate) enum Answer {
    Recorded(Recorded),
    Completion(Completion),
    Done,
    Purged(u64),
}

/// Why one write did not happen.
#[derive(Debug)]
pub(crate) enum StepError {
    /// A bound or a rule refused it; nothing was written, the batch goes on.
    Refused(DispatchStoreError),
    /// SQLite failed; the whole batch rolls back.
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for StepError {
    fn from(err: rusqlite::Error) -> Self {
        Self::Sql(err)
    }
}

impl Op {
    /// Applies the write inside the open transaction `conn`.
    pub(crate) fn apply(
        &self,
        conn: &Connection,
        backlog: &mut Backlog,
        limits: Limits,
    ) -> Result<Answer, StepError> {
        match self {
            Self::Record(dispatch) => record(conn, backlog, limits, dispatch).map(Answer::Recorded),
            Self::Park { id, reason } => {
                conn.prepare_cached(
                    "UPDATE dispatches SET state = 'parked', parked_reason = ?2, worker = NULL, \
                     not_before_ns = NULL WHERE id = ?1 AND state <> 'finished'",
                )?
                .execute(params![id.as_str(), reason])?;
                Ok(Answer::Done)
            }
            Self::Claim {
                id,
                worker,
                attempt,
            } => {
                conn.prepare_cached(
                    "UPDATE dispatches SET state = 'running', worker = ?2, \
                     attempts = max(attempts, ?3), parked_reason = NULL, not_before_ns = NULL \
                     WHERE id = ?1 AND state <> 'finished'",
                )?
                .execute(params![id.as_str(), worker_to_sql(*worker), attempt])?;
                Ok(Answer::Done)
            }
            Self::Release { id, not_before } => {
                conn.prepare_cached(
                    "UPDATE dispatches SET state = 'queued', not_before_ns = ?2, worker = NULL, \
                     parked_reason = NULL WHERE id = ?1 AND state <> 'finished'",
                )?
                .execute(params![id.as_str(), not_before.map(to_nanos)])?;
                Ok(Answer::Done)
            }
            Self::Complete { id, outcome, at } => {
                complete(conn, backlog, id, outcome, *at).map(Answer::Completion)
            }
            Self::Purge {
                finished_before,
                limit,
            } => {
                let deleted = conn
                    .prepare_cached(
                        "DELETE FROM dispatches WHERE seq IN (SELECT seq FROM dispatches \
                         WHERE finished_at_ns < ?1 LIMIT ?2)",
                    )?
                    .execute(params![to_nanos(*finished_before), limit])?;
                Ok(Answer::Purged(deleted as u64))
            }
        }
    }
}

fn record(
    conn: &Connection,
    backlog: &mut Backlog,
    limits: Limits,
    dispatch: &NewDispatch,
) -> Result<Recorded, StepError> {
    if let Some(key) = &dispatch.idempotency_key {
        check_key(key).map_err(StepError::Refused)?;
        let first: Option<String> = conn
            .prepare_cached(
                "SELECT id FROM dispatches WHERE namespace = ?1 AND idempotency_key = ?2",
            )?
            .query_row(params![dispatch.namespace, key], |row| row.get(0))
            .optional()?;
        if let Some(first) = first {
            let id = DispatchId::parse(&first).ok_or_else(|| {
                StepError::Refused(DispatchStoreError::Unavailable {
                    detail: format!("dispatch {first:?}: column id cannot be read"),
                })
            })?;
            return Ok(Recorded::Existing(id));
        }
    }
    let queued = backlog.unfinished(&dispatch.namespace);
    if queued >= limits.max_queued_per_namespace {
        return Err(StepError::Refused(DispatchStoreError::QueueFull {
            namespace: dispatch.namespace.clone(),
            limit: limits.max_queued_per_namespace,
        }));
    }
    let size = bytes_in_use(conn)?;
    if size.saturating_add(dispatch.input.len() as u64) > limits.max_bytes {
        return Err(StepError::Refused(DispatchStoreError::StoreFull {
            size,
            limit: limits.max_bytes,
        }));
    }
    let inserted = conn
        .prepare_cached(
            "INSERT INTO dispatches (id, namespace, task_queue, activity_type, node, input, \
             principal, idempotency_key, submitted_at_ns, deadline_ns, state) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'queued') \
             ON CONFLICT (id) DO NOTHING",
        )?
        .execute(params![
            dispatch.id.as_str(),
            dispatch.namespace,
            dispatch.task_queue,
            dispatch.activity_type,
            dispatch.node,
            dispatch.input.as_ref(),
            dispatch.principal,
            dispatch.idempotency_key,
            to_nanos(dispatch.submitted_at),
            to_nanos(dispatch.deadline),
        ])?;
    if inserted == 0 {
        // The same id recorded again (a caller retrying after losing the reply).
        return Ok(Recorded::Existing(dispatch.id.clone()));
    }
    backlog.add(&dispatch.namespace);
    Ok(Recorded::New(dispatch.id.clone()))
}

/// The idempotency-key rule: not empty, at most [`MAX_IDEMPOTENCY_KEY_BYTES`].
fn check_key(key: &str) -> Result<(), DispatchStoreError> {
    let problem = if key.is_empty() {
        "empty".to_owned()
    } else if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        format!(
            "{} bytes, more than the limit of {MAX_IDEMPOTENCY_KEY_BYTES}",
            key.len()
        )
    } else {
        return Ok(());
    };
    Err(DispatchStoreError::InvalidKey { problem })
}

/// Bytes of the store's pages in use: pages freed by deletes are reused, so they count as free.
fn bytes_in_use(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached(
        "SELECT (c.page_count - f.freelist_count) * s.page_size \
         FROM pragma_page_count() c, pragma_freelist_count() f, pragma_page_size() s",
    )?
    .query_row([], |row| row.get(0))
}

fn complete(
    conn: &Connection,
    backlog: &mut Backlog,
    id: &DispatchId,
    outcome: &OutcomeRecord,
    at: SystemTime,
) -> Result<Completion, StepError> {
    let row = conn
        .prepare_cached(
            "SELECT namespace, state, outcome_kind, outcome_output, outcome_message, \
             outcome_retryable, outcome_reason, outcome_attempts FROM dispatches WHERE id = ?1",
        )?
        .query_row(params![id.as_str()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                RawOutcome {
                    kind: row.get(2)?,
                    output: row.get(3)?,
                    message: row.get(4)?,
                    retryable: row.get(5)?,
                    reason: row.get(6)?,
                    attempts: row.get(7)?,
                },
            ))
        })
        .optional()?;
    let Some((namespace, state, first)) = row else {
        return Ok(Completion::Unknown);
    };
    if state == "finished" {
        return first
            .into_record()
            .map(Completion::AlreadyFinished)
            .map_err(|column| {
                StepError::Refused(DispatchStoreError::Unavailable {
                    detail: format!("dispatch {:?}: column {column} cannot be read", id.as_str()),
                })
            });
    }
    conn.prepare_cached(
        "UPDATE dispatches SET state = 'finished', finished_at_ns = ?2, worker = NULL, \
         parked_reason = NULL, not_before_ns = NULL, outcome_kind = ?3, outcome_output = ?4, \
         outcome_message = ?5, outcome_retryable = ?6, outcome_reason = ?7, \
         outcome_attempts = ?8 WHERE id = ?1",
    )?
    .execute(params![
        id.as_str(),
        to_nanos(at),
        outcome.kind,
        outcome.output.as_ref(),
        outcome.message,
        outcome.retryable,
        outcome.reason,
        outcome.attempts,
    ])?;
    backlog.remove(&namespace);
    Ok(Completion::Recorded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_must_be_non_empty_and_at_most_the_limit() {
        assert!(check_key("k").is_ok());
        assert!(check_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_BYTES)).is_ok());
        assert_eq!(
            check_key(""),
            Err(DispatchStoreError::InvalidKey {
                problem: "empty".into()
            })
        );
        let long = check_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1));
        assert_eq!(
            long.map_err(|e| e.to_string()),
            Err("idempotency_key: 257 bytes, more than the limit of 256".into())
        );
    }
}
