//! The producer side every baseline shares: latency recording, the table of send instants,
//! the split of tasks and outstanding slots over connections, and the driver of one bidi
//! stream that keeps its share of tasks outstanding.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use hdrhistogram::Histogram;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::wire::Task;
use crate::{Args, Failure, ID_BYTES, system};

/// Largest latency recorded, in microseconds (10 minutes).
const MAX_LATENCY_US: u64 = 600_000_000;
/// Longest wait for any one reply before the run is abandoned.
const REPLY_PATIENCE: Duration = Duration::from_secs(60);

/// Latencies and replies of one producer (or of all, merged).
pub(crate) struct Run {
    pub(crate) latency: Histogram<u64>,
    pub(crate) replies: u64,
}

impl Run {
    pub(crate) fn new() -> Result<Self, Failure> {
        Ok(Self {
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?,
            replies: 0,
        })
    }

    pub(crate) fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(MAX_LATENCY_US);
        let _ = self.latency.record(micros.clamp(1, MAX_LATENCY_US));
        self.replies += 1;
    }

    fn merge(&mut self, other: &Self) -> Result<(), Failure> {
        self.latency.add(&other.latency)?;
        self.replies += other.replies;
        Ok(())
    }
}

/// A run with the wall time and the machine's busy CPU ticks around the measured phase.
pub(crate) struct Measured {
    pub(crate) run: Run,
    pub(crate) elapsed: Duration,
    pub(crate) cpu_before: Option<u64>,
    pub(crate) cpu_after: Option<u64>,
}

/// Times `phase` (the load, after every connection is up) and reads the CPU around it.
pub(crate) async fn measure(
    phase: impl Future<Output = Result<Run, Failure>>,
) -> Result<Measured, Failure> {
    let cpu_before = system::busy_ticks();
    let started = Instant::now();
    let run = phase.await?;
    let elapsed = started.elapsed();
    let cpu_after = system::busy_ticks();
    Ok(Measured {
        run,
        elapsed,
        cpu_before,
        cpu_after,
    })
}

/// The wait for the next reply: the patience, or what is left of the run's deadline.
pub(crate) fn patience(deadline: Instant) -> Duration {
    REPLY_PATIENCE.min(deadline.saturating_duration_since(Instant::now()))
}

/// The payload of task `id`: its number, then filler.
pub(crate) fn payload(id: u64, size: usize) -> Bytes {
    let mut payload = BytesMut::zeroed(size.max(ID_BYTES));
    payload[..ID_BYTES].copy_from_slice(&id.to_le_bytes());
    payload.freeze()
}

/// The task number at the start of a payload.
pub(crate) fn id_of(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(
        payload.get(..ID_BYTES)?.try_into().ok()?,
    ))
}

/// The share of `total` that part `index` of `parts` takes (the first `total % parts` parts
/// take one more).
pub(crate) fn share(total: u64, parts: u64, index: u64) -> u64 {
    let parts = parts.max(1);
    total / parts + u64::from(index < total % parts)
}

/// Send instants as nanoseconds since `origin`, indexed by task number.
pub(crate) struct SendTimes {
    origin: Instant,
    at: Vec<AtomicU64>,
}

impl SendTimes {
    pub(crate) fn new(tasks: u32) -> Self {
        Self {
            origin: Instant::now(),
            at: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(crate) fn mark(&self, id: u64) {
        if let Some(slot) = usize::try_from(id).ok().and_then(|id| self.at.get(id)) {
            let nanos = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
            slot.store(nanos, Ordering::Relaxed);
        }
    }

    pub(crate) fn since(&self, id: u64) -> Option<Duration> {
        let slot = usize::try_from(id).ok().and_then(|id| self.at.get(id))?;
        let sent = Duration::from_nanos(slot.load(Ordering::Relaxed));
        Some(self.origin.elapsed().saturating_sub(sent))
    }
}

/// The task numbers one producer stream sends: `first`, `first + step`, ..., `count` of them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ids {
    pub(crate) first: u64,
    pub(crate) step: u64,
    pub(crate) count: u64,
}

impl Ids {
    /// Stream `index` of `args.connections`, with its share of the tasks.
    pub(crate) fn of_stream(args: &Args, index: u32) -> Self {
        let parts = u64::from(args.connections);
        Self {
            first: u64::from(index),
            step: parts,
            count: share(u64::from(args.tasks), parts, u64::from(index)),
        }
    }
}

/// Drives one producer stream opened by `open`: a sender task keeps `outstanding` tasks in
/// flight while this task reads echoes, so sending never waits behind an echo.
pub(crate) async fn one_stream<F, Fut>(
    open: F,
    ids: Ids,
    outstanding: u64,
    size: usize,
    times: Arc<SendTimes>,
    deadline: Instant,
) -> Result<Run, Failure>
where
    F: FnOnce(ReceiverStream<Task>) -> Fut,
    Fut: Future<Output = Result<Streaming<Task>, tonic::Status>>,
{
    let outstanding = usize::try_from(outstanding).unwrap_or(usize::MAX).max(1);
    let (requests, outbound) = mpsc::channel(outstanding);
    let mut replies = open(ReceiverStream::new(outbound)).await?;
    let slots = Arc::new(Semaphore::new(outstanding));
    let sender = {
        let (times, slots) = (Arc::clone(&times), Arc::clone(&slots));
        tokio::spawn(async move {
            for n in 0..ids.count {
                let id = ids.first + n * ids.step;
                let Ok(permit) = slots.acquire().await else {
                    return;
                };
                permit.forget();
                times.mark(id);
                let task = Task {
                    id,
                    payload: payload(id, size),
                    route: 0,
                };
                if requests.send(task).await.is_err() {
                    return;
                }
            }
            requests.closed().await;
        })
    };
    let mut run = Run::new()?;
    let result = async {
        for received in 0..ids.count {
            let wait = patience(deadline);
            let echo = tokio::time::timeout(wait, replies.next())
                .await
                .map_err(|_| format!("no echo for {wait:?} after {received}"))?
                .ok_or("the reply stream ended early")??;
            run.record(times.since(echo.id).unwrap_or_default());
            slots.add_permits(1);
        }
        Ok::<_, Failure>(())
    }
    .await;
    drop(replies);
    slots.close();
    sender.abort();
    result.map(|()| run)
}

/// Waits for every producer and merges their runs.
pub(crate) async fn collect(
    producers: Vec<tokio::task::JoinHandle<Result<Run, Failure>>>,
) -> Result<Run, Failure> {
    let mut total = Run::new()?;
    for producer in producers {
        total.merge(&producer.await??)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::{id_of, payload, share};

    #[test]
    fn shares_add_up_to_the_total() {
        let shares: Vec<u64> = (0..4).map(|index| share(10, 4, index)).collect();
        assert_eq!(shares, [3, 3, 2, 2]);
        assert_eq!(share(10, 1, 0), 10);
    }

    #[test]
    fn a_payload_carries_its_task_number() {
        assert_eq!(id_of(&payload(7, 64)), Some(7));
        assert_eq!(payload(7, 64).len(), 64);
        assert_eq!(id_of(&[1, 2, 3]), None);
    }
}
