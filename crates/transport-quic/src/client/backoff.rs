//! Jittered exponential backoff between reconnection attempts.

use std::time::Duration;

use rand::Rng;

/// How long a worker waits before each reconnection attempt after losing its connection.
///
/// Attempt `n` (from 0) waits a random time in `[d / 2, d]` with `d = min(max, initial * 2^n)`,
/// so a fleet of workers cut off together does not come back in one wave. A registration that
/// is acknowledged resets the count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first wait (default 100 ms).
    pub initial: Duration,
    /// Upper bound of every wait (default 30 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The upper bound of the wait before attempt `attempt` (from 0).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// A jittered wait before attempt `attempt`, drawn from `rng`.
    pub fn delay(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(attempt);
        let floor = ceiling / 2;
        let spread = u64::try_from((ceiling - floor).as_nanos()).unwrap_or(u64::MAX);
        floor + Duration::from_nanos(rng.random_range(0..=spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_within_half_to_full_and_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut rng = rand::rng();
        for (attempt, ceiling) in [100, 200, 400, 800, 1000, 1000, 1000]
            .into_iter()
            .enumerate()
        {
            let ceiling = Duration::from_millis(ceiling);
            assert_eq!(backoff.ceiling(attempt as u32), ceiling);
            let delay = backoff.delay(attempt as u32, &mut rng);
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        assert_eq!(backoff.ceiling(u32::MAX), backoff.max, "no overflow");
    }

    #[test]
    fn jitter_spreads_delays() {
        let backoff = Backoff::default();
        let mut rng = rand::rng();
        let samples: std::collections::HashSet<Duration> =
            (0..32).map(|_| backoff.delay(3, &mut rng)).collect();
        assert!(samples.len() > 1, "every worker would retry in lockstep");
    }
}
