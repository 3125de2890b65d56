//! The impairments of one direction of the emulated link.

use std::time::Duration;

use serde::Serialize;

use crate::blackout::{Blackout, BlackoutError};
use crate::units::{Loss, Rate};

/// Largest IP packet the emulator carries by default: the TUN devices' MTU.
pub const DEFAULT_MTU: u16 = 1500;

/// Default cap on packets held at once by one direction (queue plus those in flight).
pub const DEFAULT_HOLD_LIMIT: usize = 16_384;

/// What one direction of the link does to each packet.
///
/// A packet first survives or not the random `loss`, then waits in a drop-tail bottleneck
/// queue of `queue_limit` packets that a token bucket (`rate`, `burst`) drains, then spends
/// `delay ± jitter` on the wire. Unless `reorder` is set, a jittered packet never overtakes
/// the one sent before it (as on a real path, where jitter comes from queues along the way).
/// `hold_limit` bounds the memory one direction may use, whatever the other settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkConfig {
    /// One-way propagation delay.
    #[serde(rename = "delay_us", serialize_with = "serialize_micros")]
    pub delay: Duration,
    /// Half-width of the uniform jitter added to `delay`.
    #[serde(rename = "jitter_us", serialize_with = "serialize_micros")]
    pub jitter: Duration,
    /// Probability that a packet is lost.
    #[serde(rename = "loss_percent")]
    pub loss: Loss,
    /// Bottleneck rate; `None` for no rate limit.
    #[serde(rename = "rate_bps")]
    pub rate: Option<Rate>,
    /// Token-bucket depth in bytes: the most that can leave back to back at once.
    #[serde(rename = "burst_bytes")]
    pub burst: u32,
    /// Bottleneck queue size in packets; a packet arriving at a full queue is dropped.
    #[serde(rename = "queue_packets")]
    pub queue_limit: usize,
    /// Most packets held at once (queued plus on the wire).
    #[serde(rename = "hold_limit_packets")]
    pub hold_limit: usize,
    /// Whether jitter may deliver packets out of order.
    pub reorder: bool,
    /// Scheduled blackouts, if any.
    pub blackout: Option<Blackout>,
}

impl LinkConfig {
    /// A link that delivers every packet at once: no delay, loss or rate limit.
    pub fn unimpaired() -> Self {
        Self {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: Loss::NONE,
            rate: None,
            burst: u32::from(DEFAULT_MTU),
            queue_limit: 1000,
            hold_limit: DEFAULT_HOLD_LIMIT,
            reorder: false,
            blackout: None,
        }
    }

    /// Checks the rules the scheduler relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.queue_limit == 0 {
            return Err(ConfigError::ZeroQueue);
        }
        if self.hold_limit < self.queue_limit {
            return Err(ConfigError::HoldBelowQueue {
                hold_limit: self.hold_limit,
                queue_limit: self.queue_limit,
            });
        }
        if self.burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        if let Some(blackout) = &self.blackout {
            blackout.validate()?;
        }
        Ok(())
    }

    /// Checks that the token bucket can pass the largest packet the devices carry.
    pub fn validate_for_mtu(&self, mtu: u16) -> Result<(), ConfigError> {
        self.validate()?;
        if self.rate.is_some() && self.burst < u32::from(mtu) {
            return Err(ConfigError::BurstBelowMtu {
                burst: self.burst,
                mtu,
            });
        }
        Ok(())
    }
}

/// Why a [`LinkConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The bottleneck queue must hold at least one packet.
    #[error("queue 0: the bottleneck queue must hold at least one packet")]
    ZeroQueue,
    /// The hold limit must cover the whole queue.
    #[error("hold limit {hold_limit} is below the queue size {queue_limit}")]
    HoldBelowQueue {
        /// The configured hold limit.
        hold_limit: usize,
        /// The configured queue size.
        queue_limit: usize,
    },
    /// A zero-byte bucket could never release a packet.
    #[error("burst 0: the token bucket must hold at least one packet")]
    ZeroBurst,
    /// The blackout schedule is unusable.
    #[error(transparent)]
    Blackout(#[from] BlackoutError),
    /// A packet larger than the bucket could never leave the queue.
    #[error("burst {burst} bytes is below the MTU {mtu}: full-size packets could never leave")]
    BurstBelowMtu {
        /// The configured burst.
        burst: u32,
        /// The devices' MTU.
        mtu: u16,
    },
}

fn serialize_micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimpaired_config_is_valid() {
        assert_eq!(
            LinkConfig::unimpaired().validate_for_mtu(DEFAULT_MTU),
            Ok(())
        );
    }

    #[test]
    fn zero_queue_is_refused() {
        let config = LinkConfig {
            queue_limit: 0,
            ..LinkConfig::unimpaired()
        };
        assert_eq!(config.validate(), Err(ConfigError::ZeroQueue));
    }

    #[test]
    fn hold_limit_below_queue_is_refused() {
        let config = LinkConfig {
            queue_limit: 10,
            hold_limit: 9,
            ..LinkConfig::unimpaired()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::HoldBelowQueue { .. })
        ));
    }

    #[test]
    fn burst_below_mtu_is_refused_only_with_a_rate() {
        let unlimited = LinkConfig {
            burst: 1000,
            ..LinkConfig::unimpaired()
        };
        assert_eq!(unlimited.validate_for_mtu(1500), Ok(()));
        let limited = LinkConfig {
            rate: Some(Rate::from_bits_per_sec(1_000_000).unwrap()),
            ..unlimited
        };
        assert_eq!(
            limited.validate_for_mtu(1500),
            Err(ConfigError::BurstBelowMtu {
                burst: 1000,
                mtu: 1500
            })
        );
    }
}
