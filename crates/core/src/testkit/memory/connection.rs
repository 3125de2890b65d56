//! The gateway side of one worker's link: hands every frame to core's entry points.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::link::{Down, Frame};
use crate::address::WorkerId;
use crate::events::DisconnectReason;
use crate::handle::Core;
use crate::registry::RegistrationToken;

/// One link as the gateway serves it.
pub(super) struct Served {
    pub(super) token: RegistrationToken,
    pub(super) frames: mpsc::Receiver<Frame>,
    /// Where result acknowledgements go; weak, so the worker's inbox still closes when core
    /// drops the delivery leg.
    pub(super) acks: mpsc::WeakSender<Down>,
    pub(super) severed: Arc<AtomicBool>,
    /// Cut the link when core lets the worker go (false only for a broken control gateway).
    pub(super) cut_on_departure: bool,
    /// Fires the link's `closed` once this side has ended.
    pub(super) closed: DropGuard,
}

/// Serves one worker until its link closes or is cut, the worker says goodbye, or the gateway
/// stops.
///
/// Holds the registration token, so the worker leaves however this ends: `Drained` after a
/// goodbye, `Disconnect` when the link drops without one (a session worker is suspended
/// instead). When core lets the worker go first (a liveness timeout), the link is cut.
pub(super) async fn serve(core: Core, served: Served, stopped: CancellationToken) {
    let Served {
        token,
        mut frames,
        acks,
        severed,
        cut_on_departure,
        closed: _closed,
    } = served;
    let worker = token.worker_id();
    loop {
        let frame = tokio::select! {
            frame = frames.recv() => frame,
            () = stopped.cancelled() => None,
            _ = token.departed(), if cut_on_departure => {
                severed.store(true, Ordering::Release);
                return;
            }
        };
        if severed.load(Ordering::Acquire) {
            // Frames still in flight on a cut link are lost with it.
            return;
        }
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
            Some(frame) => handle(&core, worker, frame, &acks),
            None => return,
        }
    }
}

fn handle(core: &Core, worker: WorkerId, frame: Frame, acks: &mpsc::WeakSender<Down>) {
    match frame {
        Frame::Pong { seq } => core.record_pong(worker, seq),
        Frame::Result { task, result } => {
            // A refused result is core's business (it counts it); the link stays up. Applied
            // or refused, the worker may forget it.
            let _ = core.complete(worker, task, result);
            if let Some(acks) = acks.upgrade() {
                let _ = acks.try_send(Down::ResultsAck(task));
            }
        }
        Frame::CancelAck { task } => {
            let _ = core.cancel_acknowledged(worker, task);
        }
        Frame::Capabilities { .. } | Frame::Goodbye => {}
    }
}
