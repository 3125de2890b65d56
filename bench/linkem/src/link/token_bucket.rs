//! The token bucket that drains the bottleneck queue at the link rate.

use std::time::{Duration, Instant};

use crate::units::Rate;

/// Token units per byte: one byte costs 8 bits for 10^9 ns, so that one nanosecond at
/// `r` bit/s adds exactly `r` units and the arithmetic stays in integers.
const UNITS_PER_BYTE: u128 = 8 * 1_000_000_000;

/// A token bucket of `burst` bytes refilled at `rate`, kept in exact integer units.
///
/// The bucket only ever moves forward in time: every departure it grants is at or after the
/// previous one, so the bytes it lets out in any interval of length `T` never exceed
/// `rate * T + burst`.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: u128,
    capacity: u128,
    tokens: u128,
    /// When `tokens` was last brought up to date; `None` until the first departure, while
    /// the bucket is full.
    updated: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` bytes refilled at `rate`.
    pub(crate) fn new(rate: Rate, burst: u32) -> Self {
        let capacity = u128::from(burst) * UNITS_PER_BYTE;
        Self {
            rate: u128::from(rate.bits_per_sec()),
            capacity,
            tokens: capacity,
            updated: None,
        }
    }

    /// Whether a packet of `bytes` can ever leave (it fits in a full bucket).
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        cost(bytes) <= self.capacity
    }

    /// The earliest instant, not before `not_before`, at which `bytes` can leave.
    pub(crate) fn departure(&self, bytes: usize, not_before: Instant) -> Instant {
        let start = match self.updated {
            Some(updated) if updated > not_before => updated,
            _ => not_before,
        };
        let available = self.tokens_at(start);
        let cost = cost(bytes).min(self.capacity);
        if available >= cost {
            return start;
        }
        let wait_ns = (cost - available).div_ceil(self.rate);
        let wait = Duration::from_nanos(u64::try_from(wait_ns).unwrap_or(u64::MAX));
        // Only a burst of exabytes at a rate of bits per second could overflow; release at
        // `start` rather than hold the packet forever.
        start.checked_add(wait).unwrap_or(start)
    }

    /// Spends the tokens for `bytes` leaving at `at`, a time granted by [`Self::departure`].
    pub(crate) fn take(&mut self, bytes: usize, at: Instant) {
        let at = match self.updated {
            Some(updated) if updated > at => updated,
            _ => at,
        };
        self.tokens = self.tokens_at(at).saturating_sub(cost(bytes));
        self.updated = Some(at);
    }

    fn tokens_at(&self, at: Instant) -> u128 {
        let Some(updated) = self.updated else {
            return self.capacity;
        };
        let elapsed = at.saturating_duration_since(updated).as_nanos();
        self.tokens
            .saturating_add(elapsed.saturating_mul(self.rate))
            .min(self.capacity)
    }
}

fn cost(bytes: usize) -> u128 {
    (bytes as u128).saturating_mul(UNITS_PER_BYTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(bits_per_sec: u64, burst: u32) -> TokenBucket {
        TokenBucket::new(Rate::from_bits_per_sec(bits_per_sec).unwrap(), burst)
    }

    #[test]
    fn a_full_bucket_releases_a_burst_at_once() {
        let t0 = Instant::now();
        let mut b = bucket(8_000, 3000);
        for _ in 0..3 {
            assert_eq!(b.departure(1000, t0), t0);
            b.take(1000, t0);
        }
        // 8,000 bit/s is 1,000 bytes per second: the fourth kilobyte waits a second.
        assert_eq!(b.departure(1000, t0), t0 + Duration::from_secs(1));
    }

    #[test]
    fn tokens_never_exceed_the_burst_after_idling() {
        let t0 = Instant::now();
        let mut b = bucket(8_000, 1000);
        b.take(1000, t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.departure(1000, later), later);
        b.take(1000, later);
        assert_eq!(b.departure(1000, later), later + Duration::from_secs(1));
    }

    #[test]
    fn departures_never_go_back_in_time() {
        let t0 = Instant::now();
        let mut b = bucket(8_000, 1000);
        b.take(1000, t0 + Duration::from_secs(5));
        assert!(b.departure(10, t0) > t0 + Duration::from_secs(5));
    }

    #[test]
    fn fits_compares_against_the_burst() {
        let b = bucket(8_000, 1500);
        assert!(b.fits(1500));
        assert!(!b.fits(1501));
    }
}
