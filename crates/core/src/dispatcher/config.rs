//! Dispatcher settings.

use std::time::Duration;

/// How the dispatcher treats lost workers and long timeouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchConfig {
    /// How many times one dispatch may lose the worker holding it inside `loss_window` and
    /// still be delivered again (default 3): enough to ride out a rolling restart of a pool,
    /// few enough that a task which crashes every worker it lands on stops after four.
    pub loss_budget: u32,
    /// The sliding window losses are counted in (default 60 s): longer than a rolling restart
    /// takes to pass one task around, short enough that a long-running task that loses a
    /// worker now and then over hours is never failed for it.
    pub loss_window: Duration,
    /// Longest timeout a dispatch may ask for (default 1 hour); longer ones are clamped, so a
    /// forgotten caller cannot hold a slot for ever.
    pub max_timeout: Duration,
    /// Largest task input accepted, in bytes (default 4 MiB less 64 KiB of framing room). The
    /// embedding gateway sets it to what every worker leg can carry, so an input no worker
    /// could receive is refused up front instead of being offered to one.
    pub max_input_bytes: usize,
}

/// Default [`DispatchConfig::max_input_bytes`]: 4 MiB less 64 KiB for the task frame around it.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            loss_budget: 3,
            loss_window: Duration::from_secs(60),
            max_timeout: Duration::from_secs(3600),
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
        }
    }
}
