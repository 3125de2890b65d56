//! Jittered exponential backoff between a worker's reconnection attempts.

use std::time::Duration;

use rand::Rng;

/// How long a worker waits before each reconnection attempt after losing its connection or
/// stream; the SDKs of every transport use it.
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
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_maximum() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
        assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
        assert_eq!(backoff.ceiling(4), Duration::from_secs(1));
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn delays_are_jittered_within_half_to_full_ceiling() {
        let backoff = Backoff::default();
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<Duration> = (0..64).map(|_| backoff.delay(3, &mut rng)).collect();
        let ceiling = backoff.ceiling(3);
        assert!(delays.iter().all(|d| *d >= ceiling / 2 && *d <= ceiling));
        let first = delays[0];
        assert!(delays.iter().any(|d| *d != first), "delays must vary");
    }
}
