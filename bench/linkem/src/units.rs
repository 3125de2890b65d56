//! Parsed quantities: durations (`20ms`), rates (`10mbit`) and loss (`2%`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

/// A bottleneck rate in bits per second; never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(u64);

impl Rate {
    /// The rate of `bits` per second; `None` for zero, which would carry nothing.
    pub const fn from_bits_per_sec(bits: u64) -> Option<Self> {
        if bits == 0 { None } else { Some(Self(bits)) }
    }

    /// `n` megabits (10^6 bits) per second.
    pub const fn mbit(n: u64) -> Option<Self> {
        Self::from_bits_per_sec(n.saturating_mul(1_000_000))
    }

    /// Bits per second.
    pub const fn bits_per_sec(self) -> u64 {
        self.0
    }
}

impl FromStr for Rate {
    type Err = UnitError;

    /// Parses `<number><unit>[/s]` with unit `bit`, `kbit`, `mbit` or `gbit` (powers of 1000,
    /// case-insensitive), e.g. `50mbit`, `1.5Mbit/s`, `800kbit`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || UnitError::InvalidRate {
            input: input.to_owned(),
        };
        let lower = input.trim().to_ascii_lowercase();
        let body = lower.strip_suffix("/s").unwrap_or(&lower);
        let (number, unit) = split_number(body).ok_or_else(invalid)?;
        let scale = match unit {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            _ => return Err(invalid()),
        };
        let bits = number * scale;
        if !(1.0..=u64::MAX as f64).contains(&bits) {
            return Err(UnitError::RateOutOfRange {
                input: input.to_owned(),
            });
        }
        // Sub-bit precision in a rate carries no meaning.
        Self::from_bits_per_sec(bits.round() as u64).ok_or_else(invalid)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}bit/s", self.0)
    }
}

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// A loss probability in `[0, 1]`, written and read as a percentage.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Loss(f64);

impl Loss {
    /// No loss.
    pub const NONE: Self = Self(0.0);

    /// `percent` per cent of packets lost; refused outside `[0, 100]`.
    pub fn from_percent(percent: f64) -> Result<Self, UnitError> {
        if (0.0..=100.0).contains(&percent) {
            Ok(Self(percent / 100.0))
        } else {
            Err(UnitError::LossOutOfRange { percent })
        }
    }

    /// `percent` per cent, clamped into `[0, 100]`: for figures fixed in the code.
    pub(crate) fn clamped_percent(percent: f64) -> Self {
        Self(percent.clamp(0.0, 100.0) / 100.0)
    }

    /// The probability that one packet is lost, in `[0, 1]`.
    pub const fn probability(self) -> f64 {
        self.0
    }

    /// The loss as a percentage.
    pub fn percent(self) -> f64 {
        self.0 * 100.0
    }
}

impl FromStr for Loss {
    type Err = UnitError;

    /// Parses a percentage with an optional `%`: `2`, `2%`, `0.1%`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let trimmed = input.trim();
        let number = trimmed.strip_suffix('%').unwrap_or(trimmed).trim();
        let percent: f64 = number.parse().map_err(|_| UnitError::InvalidLoss {
            input: input.to_owned(),
        })?;
        Self::from_percent(percent)
    }
}

impl Serialize for Loss {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.percent())
    }
}

/// Parses `<number><unit>` with unit `ns`, `us`, `ms` or `s` (e.g. `20ms`, `1.5s`); a bare
/// `0` is zero.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let invalid = || UnitError::InvalidDuration {
        input: input.to_owned(),
    };
    let trimmed = input.trim();
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    let (number, unit) = split_number(trimmed).ok_or_else(invalid)?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(invalid()),
    };
    Duration::try_from_secs_f64(number * scale).map_err(|_| invalid())
}

/// Splits `12.5mbit` into `(12.5, "mbit")`; `None` without a finite, non-negative number.
fn split_number(input: &str) -> Option<(f64, &str)> {
    let end = input
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(input.len());
    let number: f64 = input[..end].parse().ok()?;
    (number.is_finite() && number >= 0.0).then_some((number, input[end..].trim()))
}

/// Why a quantity could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    /// Not a duration such as `20ms`.
    #[error("duration {input:?}: expected <number><ns|us|ms|s>, e.g. 20ms")]
    InvalidDuration {
        /// The text given.
        input: String,
    },
    /// Not a rate such as `10mbit`.
    #[error("rate {input:?}: expected <number><bit|kbit|mbit|gbit>, e.g. 10mbit")]
    InvalidRate {
        /// The text given.
        input: String,
    },
    /// A rate below one bit per second or beyond `u64`.
    #[error("rate {input:?}: must be between 1 bit/s and 2^64 bit/s")]
    RateOutOfRange {
        /// The text given.
        input: String,
    },
    /// Not a percentage.
    #[error("loss {input:?}: expected a percentage, e.g. 2 or 2%")]
    InvalidLoss {
        /// The text given.
        input: String,
    },
    /// A percentage outside `[0, 100]`.
    #[error("loss {percent}%: must be between 0% and 100%")]
    LossOutOfRange {
        /// The percentage given.
        percent: f64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-5ms").is_err());
        assert!(parse_duration("1e400s").is_err());
    }

    #[test]
    fn rates_parse_in_powers_of_1000() {
        assert_eq!("50mbit".parse(), Ok(Rate(50_000_000)));
        assert_eq!("1.5Mbit/s".parse(), Ok(Rate(1_500_000)));
        assert_eq!("800kbit".parse(), Ok(Rate(800_000)));
        assert_eq!("1gbit".parse(), Ok(Rate(1_000_000_000)));
        assert!("0mbit".parse::<Rate>().is_err());
        assert!("10mb".parse::<Rate>().is_err());
        assert!("fast".parse::<Rate>().is_err());
    }

    #[test]
    fn loss_parses_as_a_percentage() {
        assert_eq!("2".parse::<Loss>().map(Loss::probability), Ok(0.02));
        assert_eq!("5%".parse::<Loss>().map(Loss::probability), Ok(0.05));
        assert_eq!("100".parse::<Loss>().map(Loss::probability), Ok(1.0));
        assert!("101".parse::<Loss>().is_err());
        assert!("-1".parse::<Loss>().is_err());
        assert!("some".parse::<Loss>().is_err());
    }
}
