//! One worker stream on the server, from its first frame to its deregistration.

use std::sync::Arc;

use switchyard_core::{
    CallerIdentity, DisconnectReason, Registration, RegistrationToken, TaskId, WorkerDelivery,
    WorkerId, normalise_task_queue,
};
use switchyard_proto::v1::{WorkerFrame, worker_frame::Frame};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::delivery::{Farewell, GrpcDelivery};
use crate::outbound::Control;
use crate::service::ServiceState;
use crate::status::SessionError;
use crate::wire;

/// Drives one `Connect` call; see [`WorkerService`](crate::WorkerService) for the rules.
pub(crate) struct WorkerStream {
    shared: Arc<ServiceState>,
    caller: CallerIdentity,
    control: mpsc::Sender<Control>,
}

/// How a registered stream's frame loop ended.
enum End {
    /// The worker half-closed its side.
    WorkerClosed,
    /// The stream broke: reset by the peer, connection lost, keepalive timeout.
    Lost(Status),
    /// The response half was dropped: the call is gone.
    CallGone,
    /// The gateway ends the stream with this error.
    Refused(SessionError),
    /// The worker was asked to leave and holds nothing any more: the gateway ends the stream.
    Farewell(Farewell),
}

impl WorkerStream {
    pub(crate) fn new(
        shared: Arc<ServiceState>,
        caller: CallerIdentity,
        control: mpsc::Sender<Control>,
    ) -> Self {
        Self {
            shared,
            caller,
            control,
        }
    }

    pub(crate) async fn run(self, mut inbound: Streaming<WorkerFrame>) {
        let registration = match self.await_registration(&mut inbound).await {
            Ok(registration) => registration,
            Err(Some(error)) => return self.close(error).await,
            Err(None) => return,
        };
        let core = &self.shared.core;
        let task_queue = normalise_task_queue(&registration.task_queue).to_owned();
        let queue = self.shared.config.queue_size(registration.max_concurrency);
        let (frames, pushed) = mpsc::channel(queue);
        let acknowledgement = frames.clone();
        let max_frame_bytes = self.shared.config.max_message_bytes;
        let delivery = Arc::new(GrpcDelivery::new(frames, max_frame_bytes));
        let leg: Arc<dyn WorkerDelivery> = delivery.clone();
        tracing::Span::current().record(
            "namespaces",
            tracing::field::debug(&registration.namespaces),
        );
        let admitted = core
            .registry()
            .admit_unannounced(&self.caller, registration, leg)
            .await;
        let token = match admitted {
            Ok(token) => token,
            Err(error) => {
                tracing::info!(%error, "registration refused");
                return self.close(error.into()).await;
            }
        };
        let worker = token.worker_id();
        tracing::Span::current().record("worker", tracing::field::display(worker));
        let ping_interval = core.liveness().config().ping_interval;
        let ack = wire::register_ack(worker, &task_queue, ping_interval, max_frame_bytes);
        // Core sends nothing to an unannounced worker, so the acknowledgement is the first
        // frame of the queue, and announcing after it is queued keeps it first.
        let acknowledged = acknowledgement.send(ack).await.is_ok()
            && self
                .control
                .send(Control::Registered { frames: pushed })
                .await
                .is_ok();
        drop(acknowledgement);
        let end = if acknowledged {
            token.announce();
            self.serve(worker, &mut inbound, &token, &delivery).await
        } else {
            End::CallGone
        };
        delivery.close();
        let farewell = delivery.farewell();
        let reason = match (&end, farewell) {
            (End::WorkerClosed | End::Farewell(_), Some(_)) => DisconnectReason::Drained,
            _ => DisconnectReason::Disconnect,
        };
        let deregistered = token.deregister(reason);
        match &end {
            End::WorkerClosed => tracing::info!(deregistered, "worker closed its stream"),
            End::Lost(status) => tracing::info!(deregistered, %status, "worker stream lost"),
            End::CallGone => tracing::info!(deregistered, "worker call dropped"),
            End::Refused(error) => tracing::info!(deregistered, %error, "worker stream ended"),
            End::Farewell(farewell) => {
                tracing::info!(
                    deregistered,
                    ?farewell,
                    "drained worker holds nothing; ending its stream"
                );
            }
        }
        match (end, farewell) {
            (End::Refused(error), _) => self.close(error).await,
            // However the drained worker left, a shutdown says "come back later".
            (End::WorkerClosed | End::Farewell(_), Some(Farewell::ShuttingDown)) => {
                self.close(SessionError::ShuttingDown).await;
            }
            // A final drain ends cleanly: the control sender drops with the stream.
            _ => {}
        }
    }

    /// Waits for the `register` frame. `Err(None)` means the call ended before it.
    async fn await_registration(
        &self,
        inbound: &mut Streaming<WorkerFrame>,
    ) -> Result<Registration, Option<SessionError>> {
        let deadline = self.shared.config.registration_deadline;
        let first = tokio::select! {
            first = inbound.message() => first,
            () = tokio::time::sleep(deadline) => {
                return Err(Some(SessionError::RegistrationDeadline { deadline }));
            }
            () = self.control.closed() => return Err(None),
        };
        match first {
            Ok(Some(WorkerFrame {
                frame: Some(Frame::Register(register)),
            })) => Ok(wire::registration(register)),
            Ok(Some(other)) => Err(Some(SessionError::NotRegisteredFirst {
                got: wire::worker_frame_name(other.frame.as_ref()),
            })),
            Ok(None) => Err(None),
            Err(status) => {
                tracing::debug!(%status, "worker stream broke before registering");
                Err(SessionError::from_inbound(&status))
            }
        }
    }

    async fn serve(
        &self,
        worker: WorkerId,
        inbound: &mut Streaming<WorkerFrame>,
        token: &RegistrationToken,
        delivery: &GrpcDelivery,
    ) -> End {
        let mut refused: u64 = 0;
        let end = loop {
            if let Some(farewell) = delivery.farewell_due() {
                break End::Farewell(farewell);
            }
            tokio::select! {
                frame = inbound.message() => match frame {
                    Ok(Some(frame)) => match self.handle(worker, frame, &mut refused) {
                        Ok(Some(answered)) => delivery.answered(answered.get()),
                        Ok(None) => {}
                        Err(error) => break End::Refused(error),
                    },
                    Ok(None) => break End::WorkerClosed,
                    Err(status) => match SessionError::from_inbound(&status) {
                        Some(error) => break End::Refused(error),
                        None => break End::Lost(status),
                    },
                },
                reason = token.departed() => {
                    break End::Refused(SessionError::Deregistered { worker, reason });
                }
                () = self.control.closed() => break End::CallGone,
                () = delivery.changed() => {}
            }
        };
        if refused > 0 {
            tracing::info!(refused, "results refused on this stream");
        }
        end
    }

    /// Hands one frame to core; returns the task it answers (a result or a cancel
    /// acknowledgement), if any.
    fn handle(
        &self,
        worker: WorkerId,
        frame: WorkerFrame,
        refused: &mut u64,
    ) -> Result<Option<TaskId>, SessionError> {
        let core = &self.shared.core;
        match frame.frame {
            Some(Frame::Result(result)) => {
                let (task, result) = wire::task_result(result)?;
                if let Err(refusal) = core.complete(worker, task, result) {
                    *refused += 1;
                    tracing::debug!(%task, %refusal, "result refused");
                }
                return Ok(Some(task));
            }
            Some(Frame::Pong(pong)) => core.record_pong(worker, pong.seq),
            Some(Frame::CancelAck(ack)) => {
                let task = TaskId::from_raw(ack.task_id);
                if let Err(refusal) = core.cancel_acknowledged(worker, task) {
                    tracing::debug!(%task, %refusal, "cancel acknowledgement refused");
                }
                return Ok(Some(task));
            }
            Some(Frame::DrainRequest(_)) => {
                core.record_frame(worker);
                tracing::info!("worker asked to be drained");
                core.registry().drain_worker(worker);
            }
            Some(Frame::Capacity(update)) => {
                core.record_frame(worker);
                // Core's gate owns the capacity rule (zero, the ceiling) and its wording; a
                // refusal ends the stream with the gate's status, as QUIC closes the connection.
                core.registry()
                    .set_advertised_capacity(worker, update.max_concurrency)?;
                tracing::debug!(max_concurrency = update.max_concurrency, "capacity changed");
            }
            Some(Frame::Register(_) | Frame::Resume(_)) => {
                return Err(SessionError::DoubleRegistration { worker });
            }
            // A frame kind from a newer protocol version: it still proves the worker alive.
            None => core.record_frame(worker),
        }
        Ok(None)
    }

    /// Ends the stream with `error`'s status.
    async fn close(self, error: SessionError) {
        // The call may already be gone; then there is nobody to tell.
        let _ = self.control.send(Control::Close(error.status())).await;
    }
}

/// Fuzzing entry, not API (built only under `--cfg fuzzing`, as cargo-fuzz sets it): feeds
/// `frames` to the frame handler of a stream registered as `worker` on `service`, exactly as a
/// stream does after registration, until one would end the stream. Returns that error, or
/// `None` if the stream would stay open.
#[cfg(fuzzing)]
pub fn fuzz_registered_frames(
    service: &crate::WorkerService,
    worker: WorkerId,
    frames: impl IntoIterator<Item = WorkerFrame>,
) -> Option<SessionError> {
    let (control, _) = mpsc::channel(1);
    let stream = WorkerStream::new(service.shared(), CallerIdentity::trusted("fuzz"), control);
    let mut refused = 0;
    frames
        .into_iter()
        .find_map(|frame| stream.handle(worker, frame, &mut refused).err())
}
