//! CPU time of each process of a cluster run, so a phase's cost can be split between the
//! bench, the nodes and nats-server.

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`).
const TICKS_PER_SECOND: u64 = 100;

/// User + system clock ticks `pid` has used so far; `None` once it is gone.
fn ticks(pid: u32) -> Option<u64> {
    parse_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn parse_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces; fields after its closing parenthesis start
    // at field 3, so utime and stime are the 12th and 13th of them.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// A reading of every named process's CPU ticks.
pub(crate) struct Reading(BTreeMap<String, u64>);

impl Reading {
    /// Reads each `(name, pid)`; a process that cannot be read is left out.
    pub(crate) fn take(processes: &[(String, u32)]) -> Self {
        Self(
            processes
                .iter()
                .filter_map(|(name, pid)| Some((name.clone(), ticks(*pid)?)))
                .collect(),
        )
    }

    /// Microseconds of CPU each process used between `self` and `after`, per dispatch.
    pub(crate) fn per_dispatch(&self, after: &Self, dispatches: u64) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter_map(|(name, before)| {
                let used = after.0.get(name)?.checked_sub(*before)?;
                let micros = used as f64 * 1_000_000.0 / TICKS_PER_SECOND as f64;
                Some((name.clone(), micros / dispatches.max(1) as f64))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_utime_plus_stime_even_with_spaces_in_the_name() {
        let stat = "42 (switch yard) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(parse_ticks(stat), Some(300));
        // Control: a truncated line is no reading, not zero.
        assert_eq!(parse_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn per_dispatch_splits_each_process_and_skips_one_gone() {
        let before = Reading([("n1".to_owned(), 100), ("nats".to_owned(), 10)].into());
        let after = Reading([("n1".to_owned(), 300)].into());
        let split = before.per_dispatch(&after, 1000);
        // 200 ticks = 2 s = 2,000,000 µs over 1,000 dispatches.
        assert_eq!(split.get("n1"), Some(&2000.0));
        assert_eq!(split.get("nats"), None);
    }
}
