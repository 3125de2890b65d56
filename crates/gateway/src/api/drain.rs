//! `Drain`: fence workers, ask them to finish, and report as what they hold falls.
//!
//! Core owns the drain itself ([`Registry::drain_worker`]): the worker takes no new work, its
//! transport tells it to finish and close, and it leaves the registry when it does. This
//! driver only watches: it samples the drained workers on every registry event and on a short
//! tick (in-flight counts fall without events), sends a message whenever the picture changes,
//! and at the deadline cancels what the drained workers still hold: those dispatches end
//! `Cancelled` and each worker is sent a cancel per task; the workers stay fenced and leave once
//! they have let go. The last message (`done`) is sent once every drained worker has left,
//! whether or not a deadline passed first.

use std::time::Duration;

use switchyard_core::{CancelReason, Core, Registry, WorkerId};
use switchyard_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// Progress messages of one drain.
pub(crate) type ProgressStream = ReceiverStream<Result<pb::DrainProgress, Status>>;

/// How often in-flight counts are sampled between events.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Drains `targets` (already checked to exist and be permitted) and streams progress.
pub(crate) fn start(
    core: Core,
    targets: Vec<WorkerId>,
    deadline: Option<Duration>,
    closing: CancellationToken,
) -> ProgressStream {
    let registry = core.registry().clone();
    let (progress, receiver) = mpsc::channel(16);
    let mut events = registry.subscribe_events();
    for worker in &targets {
        registry.drain_worker(*worker);
    }
    tracing::info!(workers = ?targets, deadline_ms = deadline.map(|d| d.as_millis() as u64),
        "drain requested");
    tokio::spawn(async move {
        let mut deadline = deadline.map(|d| Instant::now() + d);
        let mut cancelled_at_deadline = 0;
        let mut last: Option<pb::DrainProgress> = None;
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            let now = pb::DrainProgress {
                cancelled_at_deadline,
                ..sample(&registry, &targets)
            };
            // Done means every drained worker has left the registry, deadline or not.
            let finished = now.workers.is_empty();
            if last.as_ref() != Some(&now) || finished {
                let message = pb::DrainProgress {
                    done: finished,
                    ..now.clone()
                };
                if progress.send(Ok(message)).await.is_err() || finished {
                    return;
                }
                last = Some(now);
            }
            tokio::select! {
                _ = events.recv() => {}
                _ = tick.tick() => {}
                () = sleep_until(deadline) => {
                    deadline = None;
                    let cancelled: usize = targets
                        .iter()
                        .map(|id| core.dispatcher().cancel_held_by(*id, CancelReason::DrainDeadline))
                        .sum();
                    tracing::warn!(workers = ?targets, tasks = cancelled,
                        "drain deadline passed; cancelled what the workers still held");
                    cancelled_at_deadline = u32::try_from(cancelled).unwrap_or(u32::MAX);
                }
                () = progress.closed() => return,
                () = closing.cancelled() => return,
            }
        }
    });
    ReceiverStream::new(receiver)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn sample(registry: &Registry, targets: &[WorkerId]) -> pb::DrainProgress {
    let mut progress = pb::DrainProgress::default();
    for id in targets {
        match registry.worker(*id) {
            Some(snapshot) => {
                progress.tasks_remaining += snapshot.in_flight;
                progress.workers.push(pb::DrainingWorker {
                    worker_id: id.get(),
                    in_flight: snapshot.in_flight,
                    gateway_node: String::new(),
                });
            }
            None => progress.workers_left += 1,
        }
    }
    progress
}
