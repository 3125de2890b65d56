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
    /// Dispatches of one namespace that may wait for a worker at once (default 10 000); one
    /// more is refused (`RESOURCE_EXHAUSTED` on the wire) when it would park.
    pub max_parked_per_namespace: usize,
    /// Dispatches of one principal that may wait for a worker at once (default 10 000).
    pub max_parked_per_principal: usize,
    /// Bytes of input one namespace's parked and in-flight dispatches may hold (default
    /// 256 MiB); a dispatch whose input would pass it is refused at entry.
    pub max_held_input_bytes_per_namespace: usize,
    /// Bytes of input one principal's parked and in-flight dispatches may hold (default
    /// 256 MiB).
    pub max_held_input_bytes_per_principal: usize,
    /// How long a worker has to answer or acknowledge a task whose dispatch ended (deadline,
    /// cancel) before its slot is reclaimed and the worker marked unresponsive (default 30 s).
    pub cancel_ack_timeout: Duration,
    /// Reclaimed tasks after which a worker is drained and deregistered as unresponsive
    /// (default 3).
    pub max_unresponsive_tasks: u32,
}

/// Default of the two parked-dispatch quotas.
pub const DEFAULT_MAX_PARKED: usize = 10_000;
/// Default of the two held-input-bytes quotas: 256 MiB.
pub const DEFAULT_MAX_HELD_INPUT_BYTES: usize = 256 * 1024 * 1024;

/// Default [`DispatchConfig::max_input_bytes`]: 4 MiB less 64 KiB for the task frame around it.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            loss_budget: 3,
            loss_window: Duration::from_secs(60),
            max_timeout: Duration::from_secs(3600),
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            max_parked_per_namespace: DEFAULT_MAX_PARKED,
            max_parked_per_principal: DEFAULT_MAX_PARKED,
            max_held_input_bytes_per_namespace: DEFAULT_MAX_HELD_INPUT_BYTES,
            max_held_input_bytes_per_principal: DEFAULT_MAX_HELD_INPUT_BYTES,
            cancel_ack_timeout: Duration::from_secs(30),
            max_unresponsive_tasks: 3,
        }
    }
}
