//! Machine CPU time and process memory, read from `/proc`.

/// Clock ticks per second of `/proc/stat` (`USER_HZ`, 100 on every Linux architecture the
/// gateway targets).
const TICKS_PER_SECOND: u64 = 100;

/// Busy clock ticks of the whole machine (all CPUs) so far; `None` without `/proc/stat`.
pub(crate) fn busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_busy_ticks(&stat)
}

/// Busy ticks from the aggregate `cpu` line: everything but `idle` and `iowait`.
fn parse_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is
    // already counted in user, so only the first eight fields are summed.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some(total.saturating_sub(idle))
}

/// CPU clock ticks (user + system) this process has used so far; `None` without `/proc`.
pub(crate) fn process_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis
    // start at field 3, so utime and stime (14 and 15) are the 12th and 13th of them.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Machine CPU microseconds per dispatch between two `busy_ticks` readings.
pub(crate) fn cpu_us_per_dispatch(
    before: Option<u64>,
    after: Option<u64>,
    tasks: u64,
) -> Option<f64> {
    let ticks = after?.checked_sub(before?)?;
    let micros = ticks as f64 * 1_000_000.0 / TICKS_PER_SECOND as f64;
    Some(micros / tasks.max(1) as f64)
}

/// Resident memory of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Memory {
    /// `VmRSS`, in bytes.
    pub(crate) rss_bytes: u64,
    /// `VmHWM` (peak resident), in bytes.
    pub(crate) peak_rss_bytes: u64,
}

/// Memory of `pid`, or of this process when `None`.
pub(crate) fn memory(pid: Option<u32>) -> Option<Memory> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    parse_memory(&std::fs::read_to_string(path).ok()?)
}

fn parse_memory(status: &str) -> Option<Memory> {
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    };
    Some(Memory {
        rss_bytes: kib("VmRSS:")?,
        peak_rss_bytes: kib("VmHWM:")?,
    })
}

/// The one-minute load average, from `/proc/loadavg`.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_exclude_idle_and_iowait_and_guest() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 40 0\ncpu0 50 2 25 500 10 1 1 0 20 0\n";
        assert_eq!(parse_busy_ticks(stat), Some(100 + 5 + 50 + 3 + 2 + 1));
        assert_eq!(parse_busy_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn cpu_per_dispatch_converts_ticks_to_microseconds() {
        // 50 ticks = 0.5 s = 500,000 µs over 1,000 dispatches.
        assert_eq!(cpu_us_per_dispatch(Some(10), Some(60), 1000), Some(500.0));
        assert_eq!(cpu_us_per_dispatch(None, Some(60), 1000), None);
    }

    #[test]
    fn memory_reads_rss_and_high_water_mark_in_bytes() {
        let status = "Name:\tswitchyard\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(
            parse_memory(status),
            Some(Memory {
                rss_bytes: 1024 * 1024,
                peak_rss_bytes: 2048 * 1024
            })
        );
        assert_eq!(parse_memory("Name:\tx\n"), None);
    }
}
