//! The capacity rule, one for every transport: a worker states at least one slot and no more
//! than the registry's ceiling, whether it states them in its registration or announces them
//! later.
//!
//! The ceiling bounds what one worker costs the gateway (a push queue sized by its capacity on
//! one transport, a stream per slot on another), so it is checked before any transport sizes
//! anything by the stated capacity.

use std::num::NonZeroU32;

use super::AdmissionError;
use crate::address::WorkerId;
use crate::registry::Registry;

/// Default ceiling on the capacity one worker may state
/// ([`crate::RegistryBuilder::max_concurrency_limit`]).
pub const DEFAULT_MAX_CONCURRENCY_LIMIT: u32 = 1024;

/// `stated` as a capacity, or the refusal naming the rule it broke.
pub(crate) fn settle(stated: u32, limit: u32) -> Result<NonZeroU32, AdmissionError> {
    let capacity = NonZeroU32::new(stated).ok_or(AdmissionError::ZeroCapacity)?;
    if stated > limit {
        return Err(AdmissionError::CapacityAboveLimit {
            max_concurrency: stated,
            limit,
        });
    }
    Ok(capacity)
}

impl Registry {
    /// The most slots one worker may state, at registration or in an announcement.
    pub fn max_concurrency_limit(&self) -> u32 {
        self.inner.max_concurrency_limit
    }

    /// Checks a capacity `worker` announces after registration against the gate's capacity
    /// rule (at least one, at most [`Registry::max_concurrency_limit`]) without applying it;
    /// a refusal is audited. A transport that sizes anything by the announcement calls this
    /// first; [`Registry::set_advertised_capacity`] and [`Registry::set_pending_capacity`]
    /// apply the same rule.
    pub fn check_announced_capacity(
        &self,
        worker: WorkerId,
        max_concurrency: u32,
    ) -> Result<NonZeroU32, AdmissionError> {
        settle(max_concurrency, self.inner.max_concurrency_limit).inspect_err(|error| {
            self.inner.audit.refused_announcement(worker, error);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_ceiling_is_a_capacity_and_above_it_is_refused_by_name() {
        assert_eq!(settle(8, 8).map(NonZeroU32::get), Ok(8));
        assert_eq!(settle(1, 8).map(NonZeroU32::get), Ok(1));
        let refusal = settle(9, 8).unwrap_err();
        assert_eq!(
            refusal,
            AdmissionError::CapacityAboveLimit {
                max_concurrency: 9,
                limit: 8
            }
        );
        assert_eq!(
            refusal.to_string(),
            "max_concurrency 9 exceeds this gateway's limit of 8"
        );
        assert_eq!(settle(0, 8), Err(AdmissionError::ZeroCapacity));
    }
}
