//! Durations in configuration, written with a unit (`250ms`, `10s`, `5m`, `1h`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A [`Duration`] read from and written to configuration as a number with a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigDuration(pub Duration);

impl ConfigDuration {
    /// `secs` seconds.
    pub const fn secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// `millis` milliseconds.
    pub const fn millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

/// A duration without a known unit or with a malformed number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration: write a whole number with a unit, e.g. 250ms, 10s, 5m, 1h")]
pub struct DurationSyntax(String);

impl FromStr for ConfigDuration {
    type Err = DurationSyntax;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| DurationSyntax(text.to_owned()))?;
        let (number, unit) = trimmed.split_at(split);
        let number: u64 = number
            .parse()
            .map_err(|_| DurationSyntax(text.to_owned()))?;
        let millis_per_unit: u64 = match unit.trim() {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(DurationSyntax(text.to_owned())),
        };
        number
            .checked_mul(millis_per_unit)
            .map(|millis| Self(Duration::from_millis(millis)))
            .ok_or_else(|| DurationSyntax(text.to_owned()))
    }
}

impl fmt::Display for ConfigDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis == 0 {
            f.write_str("0s")
        } else if millis % 3_600_000 == 0 {
            write!(f, "{}h", millis / 3_600_000)
        } else if millis % 60_000 == 0 {
            write!(f, "{}m", millis / 60_000)
        } else if millis % 1_000 == 0 {
            write!(f, "{}s", millis / 1_000)
        } else {
            write!(f, "{millis}ms")
        }
    }
}

impl Serialize for ConfigDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_prints_back_the_largest_exact_one() {
        for (text, millis, printed) in [
            ("250ms", 250, "250ms"),
            ("10s", 10_000, "10s"),
            ("90s", 90_000, "90s"),
            ("5m", 300_000, "5m"),
            ("1h", 3_600_000, "1h"),
            ("0s", 0, "0s"),
        ] {
            let parsed: ConfigDuration = text.parse().unwrap();
            assert_eq!(parsed.get(), Duration::from_millis(millis), "{text}");
            assert_eq!(parsed.to_string(), printed);
        }
    }

    #[test]
    fn refuses_missing_or_unknown_units_and_overflow() {
        for text in [
            "10",
            "s",
            "ten s",
            "10 days",
            "-1s",
            "99999999999999999999h",
            "",
        ] {
            assert!(text.parse::<ConfigDuration>().is_err(), "{text:?} accepted");
        }
    }
}
