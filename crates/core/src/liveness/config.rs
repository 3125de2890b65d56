//! Liveness settings.

use std::time::Duration;

/// How the prober judges workers. The defaults suit links with up to a few hundred
/// milliseconds of round trip and cost one small frame per worker every two seconds.
///
/// With them a dead-but-connected worker stops receiving work after about 11 s (three pings
/// sent 2 s apart, each missed 5 s after it left) and is deregistered after 30 s of silence;
/// a new worker on loopback is eligible within a round trip of registering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Time between pings to a worker (default 2 s): frequent enough to notice a dead worker
    /// in seconds, rare enough to be noise next to task traffic.
    pub ping_interval: Duration,
    /// A ping unanswered this long counts as missed (default 5 s: well above a bad cellular
    /// RTT with retransmissions, so packet loss does not read as an outage).
    pub ping_timeout: Duration,
    /// Consecutive answered pings that lift opening probation, and that restore a lost worker
    /// (default 2): one answer proves a path once; two in a row prove it holds. Probation pings
    /// go out back to back at registration.
    pub probation_pings: u32,
    /// Consecutive missed pings that publish `ReachabilityLost` (default 3): one or two can be
    /// a hiccup; three is an outage worth routing around.
    pub miss_threshold: u32,
    /// Silence (no frame at all) after which a worker is deregistered as `Timeout` and its
    /// tasks move (default 30 s): long enough to outlast a GC pause or a brief partition, so
    /// a worker is only dropped when it is truly gone.
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
