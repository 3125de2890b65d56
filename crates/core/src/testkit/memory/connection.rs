//! The gateway side of one worker's link: hands every frame to core's entry points.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::link::Frame;
use crate::address::WorkerId;
use crate::events::DisconnectReason;
use crate::handle::Core;
use crate::registry::RegistrationToken;

/// Serves one worker until its link closes, the worker says goodbye, or the gateway stops.
///
/// Holds the registration token, so the worker is deregistered however this ends: `Drained`
/// after a goodbye, `Disconnect` when the link drops without one. When core lets the worker go
/// first (a liveness timeout), the link is cut.
pub(super) async fn serve(
    core: Core,
    token: RegistrationToken,
    mut frames: mpsc::Receiver<Frame>,
    stopped: CancellationToken,
    cut_on_departure: Option<Arc<AtomicBool>>,
) {
    let worker = token.worker_id();
    loop {
        let frame = tokio::select! {
            frame = frames.recv() => frame,
            () = stopped.cancelled() => None,
            _ = token.departed(), if cut_on_departure.is_some() => {
                if let Some(severed) = &cut_on_departure {
                    severed.store(true, Ordering::Release);
                }
                return;
            }
        };
        match frame {
            Some(Frame::Goodbye) => {
                token.deregister(DisconnectReason::Drained);
                return;
            }
            Some(Frame::Capabilities {
                max_concurrency,
                reply,
            }) => {
                core.record_frame(worker);
                let announced = core
                    .registry()
                    .set_advertised_capacity(worker, max_concurrency);
                if announced.is_err() {
                    // Refused: the worker leaves before it hears why, so a refused worker is
                    // never seen registered once its connect has failed.
                    token.deregister(DisconnectReason::Disconnect);
                    let _ = reply.send(announced);
                    return;
                }
                let _ = reply.send(announced);
            }
            Some(frame) => handle(&core, worker, frame),
            None => return,
        }
    }
}

fn handle(core: &Core, worker: WorkerId, frame: Frame) {
    match frame {
        Frame::Pong { seq } => core.record_pong(worker, seq),
        Frame::Result { task, result } => {
            // A refused result is core's business (it counts it); the link stays up.
            let _ = core.complete(worker, task, result);
        }
        Frame::CancelAck { task } => {
            let _ = core.cancel_acknowledged(worker, task);
        }
        Frame::Capabilities { .. } | Frame::Goodbye => {}
    }
}
