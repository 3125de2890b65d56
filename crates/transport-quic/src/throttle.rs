//! A rate limit for repeated warnings: at most one line per interval, and the next line says how
//! many were held back, so a flood of refusals costs one line, not one per packet.

use std::time::Duration;

use tokio::time::Instant;

/// Lets one event through per `interval` and counts the ones it holds back.
///
/// Plain data driven by the caller's `now`, so it is tested without a clock.
#[derive(Clone, Debug)]
pub(crate) struct Throttle {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// A throttle letting one event through per `interval`.
    pub(crate) const fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(held back since the last one let through)` when the event at `now` may be logged,
    /// `None` when it is held back (and counted).
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if due {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_interval_and_the_next_one_counts_the_rest() {
        let start = Instant::now();
        let mut throttle = Throttle::new(Duration::from_secs(10));
        assert_eq!(throttle.allow(start), Some(0), "the first one passes");
        for i in 1..=99 {
            assert_eq!(throttle.allow(start + Duration::from_millis(i * 10)), None);
        }
        assert_eq!(
            throttle.allow(start + Duration::from_secs(10)),
            Some(99),
            "after the interval one passes, carrying the count held back"
        );
        assert_eq!(throttle.allow(start + Duration::from_secs(11)), None);
        assert_eq!(
            throttle.allow(start + Duration::from_secs(25)),
            Some(1),
            "the count restarts after each line"
        );
    }

    #[test]
    fn a_zero_interval_lets_everything_through() {
        // Control for the test above: without an interval nothing is held back.
        let start = Instant::now();
        let mut throttle = Throttle::new(Duration::ZERO);
        for _ in 0..5 {
            assert_eq!(throttle.allow(start), Some(0));
        }
    }
}
