//! Machine CPU time and load, from `/proc`, counted as `switchyard bench` counts them.

/// Clock ticks per second of `/proc/stat`.
const TICKS_PER_SECOND: u64 = 100;

/// Busy clock ticks of the whole machine so far (all but idle and iowait).
pub(crate) fn busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some(total.saturating_sub(idle))
}

/// Machine CPU microseconds per task between two [`busy_ticks`] readings.
pub(crate) fn cpu_us_per_dispatch(
    before: Option<u64>,
    after: Option<u64>,
    tasks: u64,
) -> Option<f64> {
    let ticks = after?.checked_sub(before?)?;
    Some(ticks as f64 * 1_000_000.0 / TICKS_PER_SECOND as f64 / tasks.max(1) as f64)
}

/// The one-minute load average.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
