//! Liveness settings.

use std::time::Duration;

/// How the prober judges workers. Defaults suit links up to a few hundred ms of RTT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Time between pings to a proven worker (default 2 s).
    pub ping_interval: Duration,
    /// A ping unanswered this long counts as missed (default 5 s: well above a bad cellular
    /// RTT, so loss-induced retransmission does not read as an outage).
    pub ping_timeout: Duration,
    /// Answered pings that lift opening probation, and that restore a lost worker (default 2).
    pub probation_pings: u32,
    /// Consecutive missed pings that publish `ReachabilityLost` (default 3).
    pub miss_threshold: u32,
    /// Silence (no frame at all) after which a worker is deregistered as `Timeout`
    /// (default 30 s).
    pub heartbeat_window: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(2),
            ping_timeout: Duration::from_secs(5),
            probation_pings: 2,
            miss_threshold: 3,
            heartbeat_window: Duration::from_secs(30),
        }
    }
}
