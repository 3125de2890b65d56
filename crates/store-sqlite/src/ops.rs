//! The writes the writer applies inside its batch transaction, one per command.
//!
//! Each operation decides from what the open transaction shows (earlier commands of the same
//! batch included), so two records with one idempotency key in one batch still give one
//! dispatch, and the first of two completions in one batch wins.

use std::sync::Arc;
use std::time::SystemTime;

use rusqlite::{OptionalExtension, params};
use switchyard_core::{
    Completion, DispatchId, DispatchStoreError, NewDispatch, OutcomeRecord, Recorded, WorkerId,
    check_idempotency_key,
};

use crate::backlog::Backlog;
use crate::codec::{RawOutcome, to_nanos, worker_to_sql};
use crate::insert::{NewRow, insert_one};
use crate::purge::Purged;
use crate::statements::{Sql, Statements};

/// The bounds `record` enforces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_queued_per_namespace: u64,
    pub(crate) max_bytes: u64,
}

/// One write.
#[derive(Debug)]
pub(crate) enum Op {
    /// Shared with the dispatch's driver when it runs while recording: held by the writer
    /// without a copy.
    Record(Arc<NewDispatch>),
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
    /// Writes nothing: answered once every command sent before it is committed.
    Barrier,
    /// One step of the purge ([`crate::purge`]): of the `window` rows after `after_seq`,
    /// deletes those finished before `finished_before`.
    Purge {
        finished_before: SystemTime,
        after_seq: i64,
        window: u64,
    },
}

/// What a write did.
#[derive(Debug)]
pub(crate) enum Answer {
    Recorded(Recorded),
    Completion(Completion),
    Done,
    Purged(Purged),
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
    /// The dispatch the write is about; `None` for a barrier or a purge.
    pub(crate) fn id(&self) -> Option<&DispatchId> {
        match self {
            Self::Record(dispatch) => Some(&dispatch.id),
            Self::Park { id, .. }
            | Self::Claim { id, .. }
            | Self::Release { id, .. }
            | Self::Complete { id, .. } => Some(id),
            Self::Barrier | Self::Purge { .. } => None,
        }
    }

    /// Applies the write inside the open transaction of `statements`; a `complete` also raises
    /// the row's attempt count to `claimed` (the claims of its batch it superseded).
    pub(crate) fn apply(
        &self,
        statements: &mut Statements<'_>,
        backlog: &mut Backlog,
        size: &mut StoreSize,
        limits: Limits,
        claimed: u32,
    ) -> Result<Answer, StepError> {
        match self {
            Self::Record(dispatch) => {
                record(statements, backlog, size, limits, dispatch, None).map(Answer::Recorded)
            }
            Self::Barrier => Ok(Answer::Done),
            Self::Park { id, reason } => {
                statements
                    .get(Sql::Park)?
                    .execute(params![id.as_str(), reason])?;
                Ok(Answer::Done)
            }
            Self::Claim {
                id,
                worker,
                attempt,
            } => {
                statements.get(Sql::Claim)?.execute(params![
                    id.as_str(),
                    worker_to_sql(*worker),
                    attempt
                ])?;
                Ok(Answer::Done)
            }
            Self::Release { id, not_before } => {
                statements
                    .get(Sql::Release)?
                    .execute(params![id.as_str(), not_before.map(to_nanos)])?;
                Ok(Answer::Done)
            }
            Self::Complete { id, outcome, at } => {
                complete(statements, backlog, id, outcome, *at, claimed).map(Answer::Completion)
            }
            Self::Purge {
                finished_before,
                after_seq,
                window,
            } => Ok(Answer::Purged(crate::purge::step(
                statements,
                *finished_before,
                *after_seq,
                *window,
            )?)),
        }
    }
}

/// A record's outcome, when its `complete` is in the same batch: the row is inserted finished.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finished<'a> {
    pub(crate) outcome: &'a OutcomeRecord,
    pub(crate) at: SystemTime,
    /// The highest attempt its batch's claims gave.
    pub(crate) attempts: u32,
}

impl<'a> Finished<'a> {
    /// The outcome of `op`, a `complete`, with `attempts` claimed; `None` for another write.
    pub(crate) fn of(op: &'a Op, attempts: u32) -> Option<Self> {
        match op {
            Op::Complete { outcome, at, .. } => Some(Self {
                outcome,
                at: *at,
                attempts,
            }),
            _ => None,
        }
    }
}

/// Records `dispatch`, inserted finished with `finished` (its backlog then unchanged), checking
/// the idempotency key and the bounds as any record.
pub(crate) fn record(
    statements: &mut Statements<'_>,
    backlog: &mut Backlog,
    size: &mut StoreSize,
    limits: Limits,
    dispatch: &NewDispatch,
    finished: Option<Finished<'_>>,
) -> Result<Recorded, StepError> {
    if let Some(key) = &dispatch.idempotency_key {
        check_idempotency_key(key).map_err(StepError::Refused)?;
        let first: Option<String> = statements
            .get(Sql::FindKey)?
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
    admit(statements, backlog, size, limits, dispatch)?;
    let inserted = insert_one(statements, NewRow { dispatch, finished })?;
    Ok(recorded(
        backlog,
        size,
        NewRow { dispatch, finished },
        inserted,
    ))
}

/// Checks that `dispatch` may be recorded (its namespace's queue and the store's size are
/// within their bounds), counting its input into the batch's size.
pub(crate) fn admit(
    statements: &mut Statements<'_>,
    backlog: &Backlog,
    size: &mut StoreSize,
    limits: Limits,
    dispatch: &NewDispatch,
) -> Result<(), StepError> {
    let queued = backlog.unfinished(&dispatch.namespace);
    if queued >= limits.max_queued_per_namespace {
        return Err(StepError::Refused(DispatchStoreError::QueueFull {
            namespace: dispatch.namespace.clone(),
            limit: limits.max_queued_per_namespace,
        }));
    }
    let in_use = size.bytes(statements)?;
    let input = dispatch.input.len() as u64;
    if in_use.saturating_add(input) > limits.max_bytes {
        return Err(StepError::Refused(DispatchStoreError::StoreFull {
            size: in_use,
            limit: limits.max_bytes,
        }));
    }
    size.add(input);
    Ok(())
}

/// What the insert of an [`admit`]ted `row` recorded: `inserted`, a new dispatch (a queued
/// one joins its namespace's backlog); not, the same id recorded before (a caller retrying
/// after losing the reply), whose input no longer counts.
pub(crate) fn recorded(
    backlog: &mut Backlog,
    size: &mut StoreSize,
    row: NewRow<'_>,
    inserted: bool,
) -> Recorded {
    let dispatch = row.dispatch;
    if !inserted {
        size.sub(dispatch.input.len() as u64);
        return Recorded::Existing(dispatch.id.clone());
    }
    if row.finished.is_none() {
        backlog.add(&dispatch.namespace);
    }
    Recorded::New(dispatch.id.clone())
}

/// The store's size as one batch sees it: read from SQLite at the batch's first record, then
/// counted on by the inputs the batch records, so a batch asks SQLite once and not per record.
#[derive(Debug, Default)]
pub(crate) struct StoreSize {
    in_use: Option<u64>,
}

impl StoreSize {
    /// Bytes in use, the batch's records so far included.
    fn bytes(&mut self, statements: &mut Statements<'_>) -> rusqlite::Result<u64> {
        match self.in_use {
            Some(in_use) => Ok(in_use),
            None => {
                let in_use = statements
                    .get(Sql::BytesInUse)?
                    .query_row([], |row| row.get(0))?;
                self.in_use = Some(in_use);
                Ok(in_use)
            }
        }
    }

    /// A record of `input` bytes joined the batch.
    fn add(&mut self, input: u64) {
        if let Some(in_use) = &mut self.in_use {
            *in_use = in_use.saturating_add(input);
        }
    }

    /// A record of `input` bytes counted by [`add`](Self::add) was not inserted after all.
    fn sub(&mut self, input: u64) {
        if let Some(in_use) = &mut self.in_use {
            *in_use = in_use.saturating_sub(input);
        }
    }
}

fn complete(
    statements: &mut Statements<'_>,
    backlog: &mut Backlog,
    id: &DispatchId,
    outcome: &OutcomeRecord,
    at: SystemTime,
    claimed: u32,
) -> Result<Completion, StepError> {
    // The common case, an unfinished row, in one statement; the row is read only when the
    // update finds none to finish.
    let finished: Option<String> = statements
        .get(Sql::Complete)?
        .query_row(
            params![
                id.as_str(),
                to_nanos(at),
                outcome.kind,
                outcome.output.as_ref(),
                outcome.message,
                outcome.retryable,
                outcome.reason,
                outcome.attempts,
                claimed,
            ],
            |row| row.get(0),
        )
        .optional()?;
    if let Some(namespace) = finished {
        backlog.remove(&namespace);
        return Ok(Completion::Recorded);
    }
    let first = statements
        .get(Sql::ReadOutcome)?
        .query_row(params![id.as_str()], |row| {
            Ok(RawOutcome {
                kind: row.get(0)?,
                output: row.get(1)?,
                message: row.get(2)?,
                retryable: row.get(3)?,
                reason: row.get(4)?,
                attempts: row.get(5)?,
            })
        })
        .optional()?;
    let Some(first) = first else {
        return Ok(Completion::Unknown);
    };
    first
        .into_record()
        .map(Completion::AlreadyFinished)
        .map_err(|column| {
            StepError::Refused(DispatchStoreError::Unavailable {
                detail: format!("dispatch {:?}: column {column} cannot be read", id.as_str()),
            })
        })
}
