//! A wait that fails the test instead of hanging it.

use std::future::Future;
use std::time::Duration;

/// How long any single wait in a test may take before the test fails: long enough for a
/// loaded CI machine to finish a loopback handshake and a few round trips, short enough that a
/// hang is reported rather than waited out.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Awaits `future`, panicking with "timed out waiting for `what`" after [`PATIENCE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}
