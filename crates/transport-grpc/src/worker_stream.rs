//! One worker stream on the server, from its first frame to its deregistration.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{
    CallerIdentity, DisconnectReason, Registration, RegistrationToken, ResumeRequest, TaskId,
    WorkerDelivery, WorkerId, normalise_task_queue,
};
use switchyard_proto::v1::{WorkerFrame, worker_frame::Frame};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::delivery::{Farewell, GrpcDelivery};
use crate::outbound::Control;
use crate::service::ServiceState;
use crate::status::SessionError;
use crate::wire::{self, AckSession};

/// Drives one `Connect` call; see [`WorkerService`](crate::WorkerService) for the rules.
pub(crate) struct WorkerStream {
    shared: Arc<ServiceState>,
    caller: CallerIdentity,
    control: mpsc::Sender<Control>,
}

/// The first frame of a stream.
enum First {
    /// A registration.
    Register(Registration),
    /// A claim to a session.
    Resume(ResumeRequest),
}

/// Most results one `results_ack` acknowledges. Each frame costs a write on both ends, so a
/// busy stream acknowledges in batches this large; the worker keeps at most this many results
/// (plus its capacity) waiting for one.
const ACK_BATCH: usize = 256;

/// Longest a processed result waits for its acknowledgement.
const ACK_DELAY: Duration = Duration::from_millis(20);

/// The results processed on a session worker's stream and not yet acknowledged: sent as one
/// `results_ack` when [`ACK_BATCH`] are pending or [`ACK_DELAY`] after the first.
#[derive(Default)]
struct ResultsAcks {
    pending: Vec<u64>,
}

impl ResultsAcks {
    /// Notes a processed result; true when it is the first pending (the delay starts).
    fn processed(&mut self, task: u64) -> bool {
        self.pending.push(task);
        self.pending.len() == 1
    }

    fn is_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn is_full(&self) -> bool {
        self.pending.len() >= ACK_BATCH
    }

    /// Queues the pending acknowledgements as one frame; false when the queue had no room
    /// (they stay pending).
    fn flush(&mut self, delivery: &GrpcDelivery) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let batch = std::mem::replace(&mut self.pending, Vec::with_capacity(ACK_BATCH));
        match delivery.push_results_ack(batch) {
            Ok(()) => true,
            Err(batch) => {
                self.pending = batch;
                false
            }
        }
    }
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
        let first = match self.await_first(&mut inbound).await {
            Ok(first) => first,
            Err(Some(error)) => return self.close(error).await,
            Err(None) => return,
        };
        let core = &self.shared.core;
        let capacity = match &first {
            First::Register(registration) => registration.max_concurrency,
            // Sized like the session's first stream; a session that is not there is refused
            // below, before anything is queued.
            First::Resume(request) => core
                .registry()
                .worker(request.session_id)
                .and_then(|worker| worker.capacity),
        };
        let queue = self.shared.config.queue_size(capacity);
        let (frames, pushed) = mpsc::channel(queue);
        let acknowledgement = frames.clone();
        let max_frame_bytes = self.shared.config.max_message_bytes;
        let delivery = Arc::new(GrpcDelivery::new(frames, max_frame_bytes));
        let leg: Arc<dyn WorkerDelivery> = delivery.clone();
        let ping_interval = core.liveness().config().ping_interval;
        let (token, ack) = match first {
            First::Register(registration) => {
                let task_queue = normalise_task_queue(&registration.task_queue).to_owned();
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
                let session = AckSession {
                    grant: token.session(),
                    held: None,
                };
                let ack = wire::register_ack(
                    token.worker_id(),
                    &task_queue,
                    ping_interval,
                    max_frame_bytes,
                    session,
                );
                (token, ack)
            }
            First::Resume(request) => {
                let resumed = match core.resume(&self.caller, request, leg).await {
                    Ok(resumed) => resumed,
                    Err(refusal) => return self.close(refusal.into()).await,
                };
                tracing::info!(held = resumed.held.len(), "worker session resumed");
                let session = AckSession {
                    grant: Some(&resumed.grant),
                    held: Some(&resumed.held),
                };
                let ack = wire::register_ack(
                    resumed.token.worker_id(),
                    &resumed.task_queue,
                    ping_interval,
                    max_frame_bytes,
                    session,
                );
                (resumed.token, ack)
            }
        };
        let worker = token.worker_id();
        tracing::Span::current().record("worker", tracing::field::display(worker));
        // Core sends nothing to an unannounced worker, so the acknowledgement is the first
        // frame of the queue, and announcing after it is queued keeps it first.
        let acknowledged = acknowledgement.send(Box::new(ack)).await.is_ok()
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
        // A lost stream of a session worker suspends it (core decides); a drained one leaves,
        // and so does one that broke the protocol. A half-close without a drain counts as lost:
        // HTTP/2 can end a stream cleanly when its connection dies (a keepalive timeout), so
        // the gateway cannot tell a worker's goodbye from a link gone.
        let reason = match (&end, farewell) {
            (End::WorkerClosed | End::Farewell(_), Some(_)) => DisconnectReason::Drained,
            (End::Refused(error), None) if error.is_fault() => DisconnectReason::Closed,
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

    /// Waits for the `register` or `resume` frame. `Err(None)` means the call ended before it.
    async fn await_first(
        &self,
        inbound: &mut Streaming<WorkerFrame>,
    ) -> Result<First, Option<SessionError>> {
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
            })) => Ok(First::Register(wire::registration(
                register,
                self.shared.config.reconnect_grace,
            ))),
            Ok(Some(WorkerFrame {
                frame: Some(Frame::Resume(resume)),
            })) => Ok(First::Resume(wire::resume_request(resume))),
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
        // Only a session worker keeps results until acknowledged.
        let mut acks = token.session().map(|_| ResultsAcks::default());
        let ack_due = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(ack_due);
        // Waits made once (`changed` again each time it fires): made afresh each turn, once per
        // frame, each would register and unregister a waiter under a lock.
        let departed = token.departed();
        tokio::pin!(departed);
        let call_gone = self.control.closed();
        tokio::pin!(call_gone);
        let changed = delivery.changed();
        tokio::pin!(changed);
        let end = loop {
            let acks_pending = acks.as_ref().is_some_and(ResultsAcks::is_pending);
            tokio::select! {
                frame = inbound.message() => match frame {
                    Ok(Some(frame)) => {
                        let is_result = matches!(frame.frame, Some(Frame::Result(_)));
                        match self.handle(worker, frame, &mut refused) {
                            Ok(Some(answered)) => {
                                delivery.answered(answered.get());
                                if let (true, Some(acks)) = (is_result, acks.as_mut()) {
                                    if acks.processed(answered.get()) {
                                        ack_due.as_mut().reset(Instant::now() + ACK_DELAY);
                                    }
                                    if acks.is_full() {
                                        acks.flush(delivery);
                                    }
                                }
                            }
                            Ok(None) => {}
                            Err(error) => break End::Refused(error),
                        }
                    }
                    Ok(None) => break End::WorkerClosed,
                    Err(status) => match SessionError::from_inbound(&status) {
                        Some(error) => break End::Refused(error),
                        None => break End::Lost(status),
                    },
                },
                () = &mut ack_due, if acks_pending => {
                    if let Some(acks) = acks.as_mut() {
                        if !acks.flush(delivery) {
                            // The queue is full: try again after another delay.
                            ack_due.as_mut().reset(Instant::now() + ACK_DELAY);
                        }
                    }
                }
                reason = &mut departed => {
                    break End::Refused(match reason {
                        DisconnectReason::Superseded => SessionError::Superseded,
                        reason => SessionError::Deregistered { worker, reason },
                    });
                }
                () = &mut call_gone => break End::CallGone,
                // The only moment a farewell can become due (a notice queued, or a task
                // answered after one): checked here rather than on every frame, which would
                // take the leg's lock once more per result.
                () = &mut changed => {
                    changed.set(delivery.changed());
                    if let Some(farewell) = delivery.farewell_due() {
                        break End::Farewell(farewell);
                    }
                }
            }
        };
        if let Some(acks) = acks.as_mut() {
            // Results processed just before a drain's end are acknowledged with it.
            acks.flush(delivery);
        }
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

#[cfg(test)]
mod tests {
    use switchyard_proto::v1::{GatewayFrame, gateway_frame};

    use super::*;

    fn acked(frame: Option<GatewayFrame>) -> Option<Vec<u64>> {
        match frame?.frame? {
            gateway_frame::Frame::ResultsAck(ack) => Some(ack.task_ids),
            _ => None,
        }
    }

    #[test]
    fn results_are_acknowledged_in_batches_and_kept_while_the_queue_is_full() {
        let (frames, mut pushed) = mpsc::channel(1);
        let delivery = GrpcDelivery::new(frames, 1024);
        let mut acks = ResultsAcks::default();
        assert!(
            acks.processed(1),
            "the first pending result starts the delay"
        );
        assert!(!acks.processed(2));
        assert!(!acks.is_full());
        for task in 3..=ACK_BATCH as u64 {
            acks.processed(task);
        }
        assert!(acks.is_full(), "a full batch goes at once");
        assert!(acks.flush(&delivery));
        let first = acked(pushed.try_recv().ok().map(|frame| *frame));
        assert_eq!(first, Some((1..=ACK_BATCH as u64).collect()), "one frame");
        assert!(!acks.is_pending());
        // The queue is full: the batch stays pending until there is room.
        delivery
            .deliver(switchyard_core::WorkerMessage::Ping { seq: 1 })
            .unwrap_or_else(|error| panic!("{error}"));
        acks.processed(ACK_BATCH as u64 + 1);
        assert!(!acks.flush(&delivery));
        assert!(acks.is_pending(), "control: nothing was lost");
        let _ping = pushed.try_recv();
        assert!(acks.flush(&delivery));
        assert_eq!(
            acked(pushed.try_recv().ok().map(|frame| *frame)),
            Some(vec![ACK_BATCH as u64 + 1])
        );
    }
}
