//! The baseline's producer: publishes tasks with at most `--outstanding` whose reply has not
//! come, each publish acknowledged by JetStream (the acknowledgements are awaited by a second
//! task, in order, so publishing never waits behind one), and times each task from publish to
//! reply.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use hdrhistogram::Histogram;
use tokio::sync::{Semaphore, mpsc};

use crate::{Args, Failure, ID_BYTES, REPLY_SUBJECT, TASK_SUBJECT};

/// Largest latency recorded, in microseconds (10 minutes).
const MAX_LATENCY_US: u64 = 600_000_000;
/// Longest wait for any one reply before the run is abandoned.
const REPLY_PATIENCE: Duration = Duration::from_secs(60);

/// What the producer saw.
pub(crate) struct Run {
    pub(crate) latency: Histogram<u64>,
    pub(crate) replies: u64,
    pub(crate) publish_errors: u64,
}

/// The payload of task `id`: its number, then filler.
fn payload(id: u64, size: usize) -> Bytes {
    let mut payload = BytesMut::zeroed(size);
    payload[..ID_BYTES].copy_from_slice(&id.to_le_bytes());
    payload.freeze()
}

fn id_of(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(
        payload.get(..ID_BYTES)?.try_into().ok()?,
    ))
}

/// Runs `--tasks` tasks through the stream and the workers.
pub(crate) async fn run(
    args: &Args,
    client: &async_nats::Client,
    js: &jetstream::Context,
    deadline: Instant,
) -> Result<Run, Failure> {
    let mut replies = client.subscribe(REPLY_SUBJECT).await?;
    let tasks = u64::from(args.tasks);
    let origin = Instant::now();
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    let slots = Arc::new(Semaphore::new(usize::try_from(args.outstanding)?));
    let publish_errors = Arc::new(AtomicU64::new(0));
    let (acks, mut pending_acks) = mpsc::channel::<PublishAckFuture>(1024);
    let ack_checker = {
        let publish_errors = Arc::clone(&publish_errors);
        tokio::spawn(async move {
            while let Some(ack) = pending_acks.recv().await {
                if ack.await.is_err() {
                    publish_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let publisher = {
        let (js, slots, sent_at, size) = (
            js.clone(),
            Arc::clone(&slots),
            Arc::clone(&sent_at),
            args.payload,
        );
        let publish_errors = Arc::clone(&publish_errors);
        tokio::spawn(async move {
            for id in 0..tasks {
                let Ok(permit) = slots.acquire().await else {
                    return;
                };
                permit.forget();
                let nanos = u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
                if let Some(slot) = usize::try_from(id).ok().and_then(|i| sent_at.get(i)) {
                    slot.store(nanos, Ordering::Relaxed);
                }
                match js.publish(TASK_SUBJECT, payload(id, size)).await {
                    Ok(ack) => {
                        if acks.send(ack).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => {
                        publish_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let mut latency = Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?;
    let mut received = 0;
    let result = async {
        while received < tasks {
            let patience = REPLY_PATIENCE.min(deadline.saturating_duration_since(Instant::now()));
            let reply = tokio::time::timeout(patience, replies.next())
                .await
                .map_err(|_| format!("no reply for {patience:?} after {received} replies"))?
                .ok_or("the reply subscription ended")?;
            let sent = id_of(&reply.payload)
                .and_then(|id| usize::try_from(id).ok())
                .and_then(|id| sent_at.get(id))
                .map(|slot| Duration::from_nanos(slot.load(Ordering::Relaxed)));
            if let Some(sent) = sent {
                let micros = origin.elapsed().saturating_sub(sent).as_micros();
                let _ = latency.record(
                    u64::try_from(micros)
                        .unwrap_or(MAX_LATENCY_US)
                        .clamp(1, MAX_LATENCY_US),
                );
            }
            received += 1;
            slots.add_permits(1);
        }
        Ok::<_, Failure>(())
    }
    .await;
    slots.close();
    publisher.abort();
    let _ = publisher.await;
    let _ = ack_checker.await;
    result?;
    Ok(Run {
        latency,
        replies: received,
        publish_errors: publish_errors.load(Ordering::Relaxed),
    })
}
