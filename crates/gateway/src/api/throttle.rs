//! A log throttle for warnings a producer can repeat at its own pace.
//!
//! Same shape as core's `Throttle` on the listener-limits branch (`allow(now)` answering
//! `Some(suppressed)` when a line is due); kept here, tiny, until the two branches meet.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// One line per interval; the rest are counted and reported on the next line.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogThrottle {
    /// A throttle letting one line through per `interval`.
    pub(crate) const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(suppressed since the last line)` when a line is due at `now`, else `None`.
    pub(crate) fn allow(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, suppressed) = &mut *state;
        if last.is_some_and(|at| now.saturating_duration_since(at) < self.interval) {
            *suppressed = suppressed.saturating_add(1);
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_then_the_count_held_back() {
        let throttle = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(throttle.allow(Instant::now()), Some(0));
        assert_eq!(throttle.allow(Instant::now()), None);
        assert_eq!(throttle.allow(Instant::now()), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(throttle.allow(Instant::now()), Some(2));
    }
}
