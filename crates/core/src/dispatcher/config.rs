//! Dispatcher settings.

use std::time::Duration;

/// How the dispatcher treats lost workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchConfig {
    /// How many times one dispatch may lose the worker holding it and still be re-delivered
    /// (default 3): enough to ride out a rolling restart, few enough that a task which kills
    /// every worker it lands on stops after a handful.
    pub loss_budget: u32,
    /// The window the budget counts losses in (default 60 s).
    pub loss_window: Duration,
    /// Longest timeout a dispatch may ask for (default 1 hour); longer ones are clamped.
    pub max_timeout: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            loss_budget: 3,
            loss_window: Duration::from_secs(60),
            max_timeout: Duration::from_secs(3600),
        }
    }
}
