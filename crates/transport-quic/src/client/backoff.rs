//! Reconnect delays: exponential with jitter, so a fleet that lost its gateway at the same
//! instant does not come back at the same instant.

use std::time::Duration;

use rand::Rng;

/// How long a worker waits between reconnection attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (default 100 ms).
    pub initial: Duration,
    /// Longest delay (default 10 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

/// Successive delays of one outage: attempt `n` waits a random time in `[d/2, d]` where
/// `d = min(initial * 2^n, max)`.
#[derive(Debug)]
pub(crate) struct Delays {
    backoff: Backoff,
    attempt: u32,
}

impl Delays {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            attempt: 0,
        }
    }

    /// The ceiling of the next delay (before jitter).
    fn ceiling(&self) -> Duration {
        let factor = 1u32 << self.attempt.min(20);
        self.backoff
            .initial
            .saturating_mul(factor)
            .min(self.backoff.max)
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rand::rng().random_range(0..=jitter_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_jittered_within_half_to_full_and_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut delays = Delays::new(backoff);
        let expected_ceilings = [100, 200, 400, 800, 1000, 1000, 1000];
        for ceiling in expected_ceilings {
            let ceiling = Duration::from_millis(ceiling);
            let delay = delays.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let samples: std::collections::HashSet<Duration> = (0..32)
            .map(|_| Delays::new(Backoff::default()).next_delay())
            .collect();
        assert!(samples.len() > 1, "every worker would retry in lockstep");
    }
}
