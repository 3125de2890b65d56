//! Scheduled link blackouts: the link drops everything, both ways, for a while.

use std::time::Duration;

use serde::Serialize;

/// A blackout schedule: dark for `duration` starting `at` after the link starts, and again
/// every `every` after that (once when `every` is `None`).
///
/// While dark, a link drops every packet that arrives and every packet that would be delivered,
/// as a radio link gone dark does; queued packets wait in the bottleneck queue as before.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use switchyard_linkem::Blackout;
///
/// let s = Duration::from_secs(1);
/// let blip = Blackout { at: 20 * s, duration: 3 * s, every: Some(20 * s) };
/// assert!(!blip.is_dark(19 * s));
/// assert!(blip.is_dark(20 * s) && blip.is_dark(22 * s));
/// assert!(!blip.is_dark(23 * s));
/// assert!(blip.is_dark(41 * s), "again 20 s later");
/// # assert_eq!(blip.validate(), Ok(()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Blackout {
    /// When the first blackout starts, after the link starts.
    #[serde(rename = "at_us", serialize_with = "micros")]
    pub at: Duration,
    /// How long each blackout lasts.
    #[serde(rename = "duration_us", serialize_with = "micros")]
    pub duration: Duration,
    /// Time from the start of one blackout to the start of the next; `None` for one only.
    #[serde(rename = "every_us", serialize_with = "optional_micros")]
    pub every: Option<Duration>,
}

/// Why a [`Blackout`] schedule was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlackoutError {
    /// A blackout of no time drops nothing.
    #[error("blackout duration 0: a blackout must last some time")]
    ZeroDuration,
    /// Blackouts that repeat before they end leave the link dark for good.
    #[error(
        "blackout every {every:?} is not longer than its duration {duration:?}: the link would never come back"
    )]
    NeverLight {
        /// The period.
        every: Duration,
        /// The duration.
        duration: Duration,
    },
}

impl Blackout {
    /// Checks that the schedule ever drops something and ever lets the link back.
    pub fn validate(&self) -> Result<(), BlackoutError> {
        if self.duration.is_zero() {
            return Err(BlackoutError::ZeroDuration);
        }
        match self.every {
            Some(every) if every <= self.duration => Err(BlackoutError::NeverLight {
                every,
                duration: self.duration,
            }),
            _ => Ok(()),
        }
    }

    /// True when the link is dark `elapsed` after it started.
    pub fn is_dark(&self, elapsed: Duration) -> bool {
        let Some(into) = elapsed.checked_sub(self.at) else {
            return false;
        };
        let into = match self.every {
            Some(every) if !every.is_zero() => {
                Duration::from_nanos((into.as_nanos() % every.as_nanos()) as u64)
            }
            _ => into,
        };
        into < self.duration
    }
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_micros())
}

fn optional_micros<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u128(d.as_micros()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_single_blackout_is_dark_from_its_start_until_its_end_only() {
        let once = Blackout {
            at: 5 * S,
            duration: 2 * S,
            every: None,
        };
        assert!(!once.is_dark(Duration::ZERO));
        assert!(!once.is_dark(5 * S - MS));
        assert!(once.is_dark(5 * S));
        assert!(once.is_dark(7 * S - MS));
        assert!(!once.is_dark(7 * S), "the end is light again");
        assert!(!once.is_dark(25 * S), "never again");
    }

    #[test]
    fn a_repeating_blackout_comes_back_every_period() {
        let blip = Blackout {
            at: 20 * S,
            duration: 3 * S,
            every: Some(20 * S),
        };
        for n in 0..5 {
            let start = 20 * S + n * 20 * S;
            assert!(!blip.is_dark(start - MS), "light before blackout {n}");
            assert!(blip.is_dark(start), "dark at blackout {n}");
            assert!(blip.is_dark(start + 3 * S - MS));
            assert!(!blip.is_dark(start + 3 * S), "light after blackout {n}");
        }
    }

    #[test]
    fn schedules_that_never_drop_or_never_end_are_refused() {
        let never = Blackout {
            at: S,
            duration: Duration::ZERO,
            every: None,
        };
        assert_eq!(never.validate(), Err(BlackoutError::ZeroDuration));
        let forever = Blackout {
            at: S,
            duration: 3 * S,
            every: Some(3 * S),
        };
        assert!(matches!(
            forever.validate(),
            Err(BlackoutError::NeverLight { .. })
        ));
        let blip = Blackout {
            every: Some(20 * S),
            ..forever
        };
        assert_eq!(blip.validate(), Ok(()));
    }
}
