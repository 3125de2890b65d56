//! [`Throttle`]: at most one log line per interval for a warning that can repeat at a peer's
//! pace, with the count of the lines it held back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Lets one occurrence of a repeated event through per `interval` and counts the rest.
///
/// Plain data driven by `now`: the caller asks [`Throttle::allow`] at each occurrence and logs
/// only when it answers `Some`, adding the number of occurrences suppressed since the last
/// line it let through, so a flood costs one line per interval and the log still says how big
/// it was.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use switchyard_core::Throttle;
///
/// let mut throttle = Throttle::new(Duration::from_secs(10));
/// let start = Instant::now();
/// assert_eq!(throttle.allow(start), Some(0));
/// assert_eq!(throttle.allow(start + Duration::from_secs(1)), None);
/// assert_eq!(throttle.allow(start + Duration::from_secs(2)), None);
/// // The next line reports the two held back.
/// assert_eq!(throttle.allow(start + Duration::from_secs(10)), Some(2));
/// ```
#[derive(Clone, Debug)]
pub struct Throttle {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

/// The interval a [`Throttle`] uses unless told otherwise: one line per 10 s per warning.
pub const DEFAULT_THROTTLE_INTERVAL: Duration = Duration::from_secs(10);

impl Default for Throttle {
    fn default() -> Self {
        Self::new(DEFAULT_THROTTLE_INTERVAL)
    }
}

impl Throttle {
    /// A throttle letting one occurrence through per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// Records one occurrence at `now`: `Some(suppressed)` when it should be logged, with the
    /// number of occurrences held back since the last one let through; `None` when it is held
    /// back.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        let due = match self.last {
            None => true,
            Some(last) => now.saturating_duration_since(last) >= self.interval,
        };
        if due {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            None
        }
    }

    /// Occurrences held back since the last one let through.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

/// One [`Throttle`] per key (a limit's configuration key, say), so one limit's flood does not
/// hold back another's line.
#[derive(Clone, Debug, Default)]
pub struct KeyedThrottle {
    interval: Option<Duration>,
    throttles: HashMap<&'static str, Throttle>,
}

impl KeyedThrottle {
    /// Throttles letting one occurrence per key through per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval: Some(interval),
            throttles: HashMap::new(),
        }
    }

    /// [`Throttle::allow`] for `key`'s throttle (created at its first occurrence).
    pub fn allow(&mut self, key: &'static str, now: Instant) -> Option<u64> {
        let interval = self.interval.unwrap_or(DEFAULT_THROTTLE_INTERVAL);
        self.throttles
            .entry(key)
            .or_insert_with(|| Throttle::new(interval))
            .allow(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_has_its_own_line() {
        let mut log = KeyedThrottle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(log.allow("a", t0), Some(0));
        assert_eq!(log.allow("a", t0 + Duration::from_secs(1)), None);
        // Control: another key is not held back by the first.
        assert_eq!(log.allow("b", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(log.allow("a", t0 + Duration::from_secs(10)), Some(1));
    }

    #[test]
    fn one_occurrence_per_interval_passes_and_reports_what_was_held_back() {
        let mut throttle = Throttle::new(Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(throttle.allow(start), Some(0), "the first always passes");
        let held: Vec<_> = (1..=100)
            .map(|ms| throttle.allow(start + Duration::from_millis(ms * 10)))
            .collect();
        assert!(held.iter().all(Option::is_none), "{held:?}");
        assert_eq!(throttle.suppressed(), 100);
        assert_eq!(throttle.allow(start + Duration::from_secs(5)), Some(100));
        assert_eq!(throttle.suppressed(), 0, "the count restarts after a line");
        // Control: once the interval has passed again, the next passes with nothing held back.
        assert_eq!(throttle.allow(start + Duration::from_secs(10)), Some(0));
    }

    #[test]
    fn a_clock_that_goes_backwards_holds_back_rather_than_floods() {
        let mut throttle = Throttle::new(Duration::from_secs(5));
        let start = Instant::now() + Duration::from_secs(60);
        assert_eq!(throttle.allow(start), Some(0));
        assert_eq!(throttle.allow(start - Duration::from_secs(30)), None);
        assert_eq!(throttle.allow(start + Duration::from_secs(5)), Some(1));
    }
}
