//! The per-principal worker quota: a principal holds at most `max_workers` registrations at
//! once, whatever transport or connection they arrive on.
//!
//! Counted under the registry lock at insertion, so concurrent registrations of one principal
//! cannot both take the last place. The count is a scan of the registered workers: admission
//! is rare next to dispatch, and a scan keeps no second copy of the worker table to drift.

use super::AdmissionError;

/// Default of the per-principal worker quota the gateway configures
/// (`principals[].max_workers`).
pub const DEFAULT_MAX_WORKERS_PER_PRINCIPAL: u32 = 1000;
use crate::registration::CallerIdentity;
use crate::registry::state::State;

/// Refuses the registration when `caller` already holds its `max_workers`.
pub(crate) fn check_worker_quota(
    state: &State,
    caller: &CallerIdentity,
) -> Result<(), AdmissionError> {
    let Some(limit) = caller.max_workers else {
        return Ok(());
    };
    let held = state
        .workers
        .entries()
        .filter(|entry| entry.worker.principal() == caller.principal)
        .count();
    if held >= limit as usize {
        return Err(AdmissionError::PrincipalWorkerLimit {
            principal: caller.principal.clone(),
            limit,
        });
    }
    Ok(())
}
