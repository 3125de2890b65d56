//! The gateway's reader of one lane: hands the worker's answers to core. (Its frames go out
//! through the connection's outbox.)

use std::sync::Arc;

use quinn::{RecvStream, SendStream};
use switchyard_core::{Core, TaskId, WorkerId};
use switchyard_proto::v1::{QuicCancelAck, QuicLaneUp, QuicPong, quic_lane_up::Frame};
use tracing::Instrument;

use super::delivery::QuicDelivery;
use super::lanes::{Ending, FinishError, LaneId};
use crate::convert;
use crate::fault::Fault;
use crate::frame::FrameReader;
use crate::outbox::StreamOut;
use crate::protocol::ErrorCode;

/// A lane whose stream is open and whose sink is in the table, not yet read.
pub(crate) struct OpenedLane {
    id: LaneId,
    recv: RecvStream,
}

impl OpenedLane {
    /// Enters a freshly opened stream in `delivery`'s table as an idle lane; its frames go out
    /// through the connection's outbox.
    pub(crate) fn enter(delivery: &QuicDelivery, send: SendStream, recv: RecvStream) -> Self {
        let id = LaneId::new(send.id().index());
        let sink = delivery.lane_out(StreamOut::new(send));
        delivery.lanes().add(id, sink);
        Self { id, recv }
    }

    /// Reads the lane on its own task until the lane is retired or the connection ends.
    pub(crate) fn spawn(self, delivery: Arc<QuicDelivery>, core: Core, worker: WorkerId) {
        let span = tracing::debug_span!("lane", worker = %worker, lane = %self.id);
        tokio::spawn(
            async move {
                let id = self.id;
                let read = read(self, &delivery, &core, worker).await;
                delivery.lanes().forget(id);
                match read {
                    Ok(()) | Err(Fault::Gone) => tracing::trace!("lane ended"),
                    Err(Fault::Close { code, reason }) => {
                        tracing::warn!(%code, %reason, "closing worker connection");
                        delivery.close(code, &reason);
                    }
                }
            }
            .instrument(span),
        );
    }
}

async fn read(
    lane: OpenedLane,
    delivery: &QuicDelivery,
    core: &Core,
    worker: WorkerId,
) -> Result<(), Fault> {
    let OpenedLane { id, recv } = lane;
    let mut frames = FrameReader::new(recv, delivery.lane_frame_limit());
    loop {
        let next = frames
            .next::<QuicLaneUp>()
            .await
            .map_err(|error| Fault::read(error, &id))?;
        let Some(up) = next else {
            // The worker answers the FIN the gateway sends when it retires the lane.
            if delivery.lanes().contains(id) {
                return Err(Fault::close(
                    ErrorCode::ProtocolViolation,
                    format!("the worker finished {id}, which the gateway had not retired"),
                ));
            }
            return Ok(());
        };
        answer(up, id, delivery, core, worker)?;
    }
}

fn answer(
    up: QuicLaneUp,
    id: LaneId,
    delivery: &QuicDelivery,
    core: &Core,
    worker: WorkerId,
) -> Result<(), Fault> {
    match up.frame {
        Some(Frame::Result(result)) => {
            let Some((task, outcome)) = convert::result(result) else {
                return Err(Fault::close(
                    ErrorCode::MalformedFrame,
                    format!("{id}: result sets neither output nor failure"),
                ));
            };
            // The lane is free before core frees the slot, so the dispatch that the freed slot
            // lets in always finds an idle lane.
            let finished = delivery
                .finish(id, task, Ending::Result)
                .map_err(|error| refused("result", &error))?;
            if finished.duplicate {
                // A datagram brought this result first; core has had it.
                return Ok(());
            }
            if let Err(refusal) = core.complete(worker, task, outcome) {
                tracing::debug!(task = %task, %refusal, "result not taken");
            }
            delivery.processed(task);
        }
        Some(Frame::Pong(QuicPong { seq })) => core.record_pong(worker, seq),
        Some(Frame::CancelAck(QuicCancelAck { task_id })) => {
            let task = TaskId::from_raw(task_id);
            delivery
                .finish(id, task, Ending::CancelAck)
                .map_err(|error| refused("cancel_ack", &error))?;
            if let Err(refusal) = core.cancel_acknowledged(worker, task) {
                tracing::debug!(task = %task, %refusal, "cancel acknowledgement not taken");
            }
        }
        None => return Err(Fault::empty(&id)),
    }
    Ok(())
}

fn refused(frame: &str, error: &FinishError) -> Fault {
    let code = match error {
        FinishError::NotHeld { .. } => ErrorCode::UnknownTask,
        FinishError::NotCancelled { .. } => ErrorCode::ProtocolViolation,
    };
    Fault::close(code, format!("{frame}: {error}"))
}
