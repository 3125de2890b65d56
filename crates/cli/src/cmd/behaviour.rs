//! Ready-made activity behaviours for `switchyard worker` and `switchyard demo`, and the
//! per-worker counters the demo reports.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

/// What an activity does with its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Returns the input.
    Echo,
    /// Waits this many milliseconds (or until cancelled), then returns the input.
    Sleep(u64),
    /// Fails (retryable) with a fixed message.
    Fail,
}

/// `NAME=BEHAVIOUR` from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ActivitySpec {
    /// Activity type.
    pub(crate) name: String,
    /// What it does.
    pub(crate) behaviour: Behaviour,
}

impl FromStr for ActivitySpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, behaviour) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected NAME=echo, NAME=sleep:MS or NAME=fail"))?;
        if name.is_empty() {
            return Err(format!("{text:?}: the activity name is empty"));
        }
        let behaviour = match behaviour {
            "echo" => Behaviour::Echo,
            "fail" => Behaviour::Fail,
            other => match other.strip_prefix("sleep:").map(str::parse::<u64>) {
                Some(Ok(ms)) => Behaviour::Sleep(ms),
                _ => {
                    return Err(format!(
                        "{text:?}: behaviour {other:?} is not echo, sleep:MS or fail"
                    ));
                }
            },
        };
        Ok(Self {
            name: name.to_owned(),
            behaviour,
        })
    }
}

/// Tasks served and concurrency seen by one worker.
#[derive(Debug, Default)]
pub(crate) struct WorkerStats {
    served: AtomicU64,
    running: AtomicU32,
    peak: AtomicU32,
}

impl WorkerStats {
    /// Tasks finished.
    pub(crate) fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Most handlers seen running at once.
    pub(crate) fn peak(&self) -> u32 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// Counts one running handler for as long as it lives.
struct Running<'a>(&'a WorkerStats);

impl<'a> Running<'a> {
    fn start(stats: &'a WorkerStats) -> Self {
        let now = stats.running.fetch_add(1, Ordering::Relaxed) + 1;
        stats.peak.fetch_max(now, Ordering::Relaxed);
        Self(stats)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
        self.0.served.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `behaviour` on `input`; `Err` carries a retryable failure message.
pub(crate) async fn run(
    behaviour: Behaviour,
    input: Bytes,
    cancellation: CancellationToken,
    stats: Arc<WorkerStats>,
) -> Result<Bytes, String> {
    let _running = Running::start(&stats);
    match behaviour {
        Behaviour::Echo => Ok(input),
        Behaviour::Sleep(ms) => {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(input),
                () = cancellation.cancelled() => Err("cancelled".to_owned()),
            }
        }
        Behaviour::Fail => {
            Err("failed on purpose (switchyard worker --activity NAME=fail)".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_specs_parse_and_bad_ones_are_named() {
        assert_eq!(
            "greet=echo".parse::<ActivitySpec>().unwrap(),
            ActivitySpec {
                name: "greet".into(),
                behaviour: Behaviour::Echo
            }
        );
        assert_eq!(
            "nap=sleep:250".parse::<ActivitySpec>().unwrap().behaviour,
            Behaviour::Sleep(250)
        );
        assert_eq!(
            "x=fail".parse::<ActivitySpec>().unwrap().behaviour,
            Behaviour::Fail
        );
        for bad in ["echo", "=echo", "x=sleep", "x=sleep:soon", "x=dance"] {
            let error = bad.parse::<ActivitySpec>().unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stats_count_served_tasks_and_peak_concurrency() {
        let stats = Arc::new(WorkerStats::default());
        let runs = (0..3).map(|_| {
            run(
                Behaviour::Sleep(20),
                Bytes::from_static(b"x"),
                CancellationToken::new(),
                Arc::clone(&stats),
            )
        });
        let outputs = futures::future::join_all(runs).await;
        assert!(outputs.iter().all(|o| o.as_deref() == Ok(&b"x"[..])));
        assert_eq!(stats.served(), 3);
        assert_eq!(stats.peak(), 3);
        let failed = run(
            Behaviour::Fail,
            Bytes::new(),
            CancellationToken::new(),
            Arc::clone(&stats),
        )
        .await;
        assert!(failed.is_err());
        assert_eq!(stats.peak(), 3, "a lone task does not raise the peak");
    }
}
