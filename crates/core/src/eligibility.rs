//! The one derivation of whether a worker may take a dispatch, and liveness exclusions.

use std::fmt;
use std::num::NonZeroU32;

use crate::address::Node;

/// Why the liveness prober keeps a registered worker out of selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DispatchExclusion {
    /// Newly connected (or recovering) and not yet proven reachable; clears within seconds.
    OpeningProbation,
    /// Pings on the task path went unanswered; an incident that does not clear by itself.
    ReachabilityLost,
}

/// The one answer to "may this worker take this dispatch right now", with the reason if not.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Eligibility {
    /// It may.
    Eligible,
    /// It does not serve the activity type (it is in the pool for other activities).
    ServesOtherActivity,
    /// It serves the activity on another node than the dispatch is pinned to.
    OtherNode {
        /// The worker's node, if any.
        node: Option<Node>,
    },
    /// Every slot it advertised is taken.
    AtCapacity {
        /// Tasks held.
        in_flight: u32,
        /// Slots advertised.
        capacity: u32,
    },
    /// It has not yet said how many tasks it runs at once.
    CapacityUnannounced,
    /// It announced its capacity, but its connection cannot carry tasks yet (the transport
    /// is waiting for the worker to let it open the streams tasks travel on).
    AwaitingStreams {
        /// Slots announced.
        announced: u32,
    },
    /// The liveness probe has not yet proven it reachable.
    OnProbation,
    /// The liveness probe lost it.
    Unreachable,
    /// It is being drained and takes no new work.
    Draining,
    /// Its connection is gone and deregistration is under way.
    Disconnected,
    /// Its connection is gone and its session waits for it to resume (it keeps its slots
    /// and tasks until the reconnect grace ends).
    Suspended,
}

impl Eligibility {
    /// True for [`Eligibility::Eligible`].
    pub fn is_eligible(&self) -> bool {
        matches!(self, Self::Eligible)
    }

    /// Derives a worker's standing from its facts, in a fixed precedence (the first that
    /// applies wins), so census counts partition the workers and explanations agree with them.
    pub(crate) fn derive(
        suspended: bool,
        connected: bool,
        draining: bool,
        exclusion: Option<DispatchExclusion>,
        capacity: Option<NonZeroU32>,
        pending: Option<NonZeroU32>,
        in_flight: u32,
    ) -> Self {
        if suspended {
            return Self::Suspended;
        }
        if !connected {
            return Self::Disconnected;
        }
        if draining {
            return Self::Draining;
        }
        match exclusion {
            Some(DispatchExclusion::ReachabilityLost) => return Self::Unreachable,
            Some(DispatchExclusion::OpeningProbation) => return Self::OnProbation,
            None => {}
        }
        match capacity {
            None => match pending {
                Some(announced) => Self::AwaitingStreams {
                    announced: announced.get(),
                },
                None => Self::CapacityUnannounced,
            },
            Some(capacity) if in_flight >= capacity.get() => Self::AtCapacity {
                in_flight,
                capacity: capacity.get(),
            },
            Some(_) => Self::Eligible,
        }
    }
}

impl fmt::Display for Eligibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Eligible => f.write_str("eligible"),
            Self::ServesOtherActivity => f.write_str("serves other activity types"),
            Self::OtherNode { node: Some(node) } => write!(f, "on other node {node}"),
            Self::OtherNode { node: None } => f.write_str("advertises no node"),
            Self::AtCapacity {
                in_flight,
                capacity,
            } => {
                write!(f, "at capacity {in_flight}/{capacity}")
            }
            Self::CapacityUnannounced => f.write_str("capacity unannounced"),
            Self::AwaitingStreams { announced } => write!(
                f,
                "announced {announced} slots but its connection cannot carry tasks yet (no \
                 stream credit granted)"
            ),
            Self::OnProbation => f.write_str("on probation"),
            Self::Unreachable => f.write_str("unreachable"),
            Self::Draining => f.write_str("draining"),
            Self::Disconnected => f.write_str("disconnected"),
            Self::Suspended => f.write_str("suspended"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(n: u32) -> Option<NonZeroU32> {
        NonZeroU32::new(n)
    }

    #[test]
    fn an_announced_capacity_the_connection_cannot_carry_has_its_own_standing() {
        let awaiting = Eligibility::derive(false, true, false, None, None, cap(3), 0);
        assert_eq!(awaiting, Eligibility::AwaitingStreams { announced: 3 });
        assert_eq!(
            awaiting.to_string(),
            "announced 3 slots but its connection cannot carry tasks yet (no stream credit \
             granted)"
        );
        // Control: without the announcement it is still unannounced, and once the capacity
        // is in force the announcement no longer matters.
        assert_eq!(
            Eligibility::derive(false, true, false, None, None, None, 0),
            Eligibility::CapacityUnannounced
        );
        assert_eq!(
            Eligibility::derive(false, true, false, None, cap(3), cap(3), 0),
            Eligibility::Eligible
        );
    }

    #[test]
    fn precedence_is_fixed() {
        let probation = Some(DispatchExclusion::OpeningProbation);
        let lost = Some(DispatchExclusion::ReachabilityLost);
        assert_eq!(
            Eligibility::derive(false, true, false, None, cap(2), None, 1),
            Eligibility::Eligible
        );
        assert_eq!(
            Eligibility::derive(false, true, false, None, cap(2), None, 2),
            Eligibility::AtCapacity {
                in_flight: 2,
                capacity: 2
            }
        );
        assert_eq!(
            Eligibility::derive(false, true, false, None, None, None, 0),
            Eligibility::CapacityUnannounced
        );
        assert_eq!(
            Eligibility::derive(false, true, false, probation, None, None, 0),
            Eligibility::OnProbation
        );
        assert_eq!(
            Eligibility::derive(false, true, false, lost, cap(2), None, 2),
            Eligibility::Unreachable
        );
        assert_eq!(
            Eligibility::derive(false, true, true, lost, cap(2), None, 0),
            Eligibility::Draining
        );
        assert_eq!(
            Eligibility::derive(false, false, true, lost, cap(2), None, 0),
            Eligibility::Disconnected
        );
        assert_eq!(
            Eligibility::derive(true, false, true, lost, cap(2), None, 0),
            Eligibility::Suspended
        );
    }
}
