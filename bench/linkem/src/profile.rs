//! Named link profiles used by the constrained-link benchmarks.

use std::time::Duration;

use crate::config::LinkConfig;
use crate::units::{Loss, Rate};

/// A named set of impairments, applied the same way in each direction.
///
/// The round-trip times are split evenly into one-way delays; loss applies independently in
/// each direction. Queues hold about one bandwidth-delay product (at least 50 packets), so a
/// sender that overruns the rate sees drop-tail loss and queueing delay as on a real
/// bottleneck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// No impairment: packets pass at once.
    Lan,
    /// 40 ms RTT (20 ms each way), 0.1% loss, 50 Mbit/s, 200-packet queue.
    Wan,
    /// 100 ms RTT (50 ms each way), 2% loss, 10 Mbit/s, 100-packet queue.
    Lossy,
    /// 300 ms RTT (150 ms each way), 5% loss, 1 Mbit/s, 50-packet queue.
    CellularBad,
}

impl Profile {
    /// Every profile, in order of increasing impairment.
    pub const ALL: [Self; 4] = [Self::Lan, Self::Wan, Self::Lossy, Self::CellularBad];

    /// The profile's name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lan => "lan",
            Self::Wan => "wan",
            Self::Lossy => "lossy",
            Self::CellularBad => "cellular-bad",
        }
    }

    /// The impairments of one direction.
    pub fn config(self) -> LinkConfig {
        let (one_way_ms, loss_percent, rate, queue_limit) = match self {
            Self::Lan => return LinkConfig::unimpaired(),
            Self::Wan => (20, 0.1, Rate::mbit(50), 200),
            Self::Lossy => (50, 2.0, Rate::mbit(10), 100),
            Self::CellularBad => (150, 5.0, Rate::mbit(1), 50),
        };
        LinkConfig {
            delay: Duration::from_millis(one_way_ms),
            loss: Loss::clamped_percent(loss_percent),
            rate,
            queue_limit,
            ..LinkConfig::unimpaired()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_MTU;

    #[test]
    fn profiles_carry_the_published_figures() {
        let wan = Profile::Wan.config();
        assert_eq!(wan.delay * 2, Duration::from_millis(40));
        assert_eq!(wan.loss.probability(), 0.001);
        assert_eq!(wan.rate, Rate::mbit(50));

        let lossy = Profile::Lossy.config();
        assert_eq!(lossy.delay * 2, Duration::from_millis(100));
        assert_eq!(lossy.loss.probability(), 0.02);
        assert_eq!(lossy.rate, Rate::mbit(10));

        let cellular = Profile::CellularBad.config();
        assert_eq!(cellular.delay * 2, Duration::from_millis(300));
        assert_eq!(cellular.loss.probability(), 0.05);
        assert_eq!(cellular.rate, Rate::mbit(1));

        assert_eq!(Profile::Lan.config(), LinkConfig::unimpaired());
    }

    #[test]
    fn every_profile_is_valid_at_the_default_mtu() {
        for profile in Profile::ALL {
            assert_eq!(
                profile.config().validate_for_mtu(DEFAULT_MTU),
                Ok(()),
                "{}",
                profile.name()
            );
        }
    }

    #[test]
    fn names_match_the_command_line() {
        use clap::ValueEnum;
        for profile in Profile::ALL {
            let parsed = Profile::from_str(profile.name(), false);
            assert_eq!(parsed, Ok(profile));
        }
    }
}
