//! One worker connection from first packet to last: handshake and registration under a
//! deadline, admission through core's gate, then the control stream and the lanes.

use std::sync::Arc;

use quinn::{ConnectionError, Incoming, SendStream};
use switchyard_core::{DisconnectReason, RegistrationToken, WorkerId};
use switchyard_proto::v1::{
    QuicControlDown, QuicControlUp, QuicResultsAck, quic_control_down, quic_control_up,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::ServerShared;
use super::admit::{Admitted, admit};
use super::delivery::{FLUSH_PATIENCE, QueuedControl, QuicDelivery};
use super::intake::Pass;
use super::lane::OpenedLane;
use super::refusals::RegistrationEnd;
use crate::convert;
use crate::fault::{Fault, close_connection};
use crate::frame::encode_frame;
use crate::protocol::ErrorCode;

pub(super) const CONTROL: &str = "control stream";

/// Serves one incoming connection until it closes; `pass` holds its share of the intake's
/// limits for as long.
pub(crate) async fn serve(incoming: Incoming, server: Arc<ServerShared>, mut pass: Pass) {
    let remote = incoming.remote_address();
    let span = tracing::debug_span!(
        "quic_worker",
        %remote,
        worker = tracing::field::Empty,
        namespaces = tracing::field::Empty
    );
    async move {
        let deadline = Instant::now() + server.config.registration_timeout;
        let connecting = match incoming.accept() {
            Ok(connecting) => connecting,
            Err(error) => {
                tracing::debug!(%error, "connection not accepted");
                return;
            }
        };
        let conn = match tokio::time::timeout_at(deadline, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => {
                tracing::debug!(%error, "handshake failed");
                return;
            }
            // Dropping the handshake abandons it.
            Err(_) => {
                tracing::debug!("handshake not finished within the registration deadline");
                return;
            }
        };
        if let Err(refusal) = pass.handshaken() {
            server
                .refusals
                .refused(refusal, conn.remote_address(), Instant::now());
            close_connection(&conn, ErrorCode::ConnectionRefused, &refusal.to_string());
            return;
        }
        // A refusal was closed by `admit`, its control stream still open.
        let admitted = match admit(&conn, &server, &mut pass, deadline).await {
            Ok(admitted) => admitted,
            Err(Fault::Gone) => return,
            Err(Fault::Close { code, reason }) => {
                let end = if code == ErrorCode::RegistrationTimeout {
                    RegistrationEnd::TimedOut
                } else {
                    RegistrationEnd::Refused(code)
                };
                server
                    .refusals
                    .registration_ended(end, &reason, Instant::now());
                return;
            }
        };
        let span = tracing::Span::current();
        span.record(
            "worker",
            tracing::field::display(admitted.token.worker_id()),
        );
        span.record("namespaces", tracing::field::debug(&admitted.namespaces));
        run(admitted, &server).await;
        drop(pass);
    }
    .instrument(span)
    .await;
}

/// Writes one control frame toward the worker.
pub(super) async fn write_control(
    send: &mut SendStream,
    frame: &QuicControlDown,
    limit: u32,
) -> Result<(), Fault> {
    let bytes = encode_frame(frame, limit)
        .map_err(|error| Fault::close(ErrorCode::Internal, format!("{CONTROL}: {error}")))?;
    send.write_chunk(bytes)
        .await
        .map_err(|error| Fault::write(error, &CONTROL))
}

/// How a registered connection ended.
enum Exit {
    /// The drain finished.
    Drained,
    /// The connection ended otherwise; its close says how (see [`Ending`]).
    Ended,
}

/// What the end of a registered connection without a drain means for the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Lost (idle timeout, reset, a transport error, the worker's close with a code other
    /// than `CLOSED`): a session worker is suspended, waiting for a resume.
    Lost,
    /// The worker said goodbye (`CLOSED`), or the gateway closed the connection itself (a
    /// fault it found, a departure, a shutdown): the worker leaves, session or not.
    Left,
}

impl Ending {
    /// The ending a connection's close reason stands for.
    fn of(close: Option<&ConnectionError>) -> Self {
        match close {
            Some(ConnectionError::LocallyClosed) => Self::Left,
            Some(ConnectionError::ApplicationClosed(close))
                if close.error_code == ErrorCode::Closed.var_int() =>
            {
                Self::Left
            }
            _ => Self::Lost,
        }
    }
}

/// Lets core know the connection of `token` ended: a lost one suspends a session worker (as
/// dropping the token does), any other end deregisters the worker.
fn end_registration(token: RegistrationToken, exit: Exit, ending: Ending) {
    match (exit, ending) {
        (Exit::Drained, _) => {
            token.deregister(DisconnectReason::Drained);
        }
        (Exit::Ended, Ending::Lost) => {
            token.deregister(DisconnectReason::Disconnect);
        }
        // The worker closed on purpose, or the gateway closed it for a fault: it leaves, with
        // no suspension (a token a resume replaced does nothing).
        (Exit::Ended, Ending::Left) => {
            token.deregister(DisconnectReason::Closed);
        }
    }
}

/// Writes the control frames still queued, then finishes the control stream and waits (until
/// `deadline`) for the worker to acknowledge it, so a `drain` queued just before a close is
/// not lost with it.
async fn flush_control(
    send: &mut SendStream,
    queued: &mut mpsc::Receiver<QueuedControl>,
    limit: u32,
    deadline: Instant,
) {
    while let Ok(down) = queued.try_recv() {
        if write_control(send, &down, limit).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
    let _ = tokio::time::timeout_at(deadline, send.stopped()).await;
}

/// Closes `delivery` with `code` once the control stream and every lane have been flushed.
async fn close_flushed(
    delivery: &QuicDelivery,
    control_send: &mut SendStream,
    control_rx: &mut mpsc::Receiver<QueuedControl>,
    limit: u32,
    (code, reason): (ErrorCode, &str),
) {
    let deadline = Instant::now() + FLUSH_PATIENCE;
    tokio::join!(
        flush_control(control_send, control_rx, limit, deadline),
        delivery.flush(deadline)
    );
    delivery.close(code, reason);
}

/// Serves a registered worker: capacity announcements, drains, result acknowledgements, and
/// the lane manager.
async fn run(admitted: Admitted, server: &ServerShared) {
    let Admitted {
        token,
        delivery,
        mut control_send,
        mut control_reader,
        mut control_rx,
        capacity,
        ..
    } = admitted;
    let worker = token.worker_id();
    let limit = server.config.frames.control;
    server.track(worker, &delivery);
    let (capacity_tx, capacity_rx) = watch::channel(capacity);
    let manager = manage_lanes(&delivery, server, worker, capacity_rx);
    tokio::pin!(manager);
    let exit = loop {
        let fault = tokio::select! {
            up = control_reader.next::<QuicControlUp>() => {
                match up {
                    Ok(Some(up)) => control(up, server, worker, &capacity_tx).err(),
                    Ok(None) => Some(Fault::close(
                        ErrorCode::ProtocolViolation,
                        "the worker finished the control stream",
                    )),
                    Err(error) => Some(Fault::read(error, &CONTROL)),
                }
            }
            Some(down) = control_rx.recv() => {
                write_control(&mut control_send, &down, limit).await.err()
            }
            ids = delivery.next_results_ack() => {
                let ack = QuicControlDown {
                    frame: Some(quic_control_down::Frame::ResultsAck(QuicResultsAck {
                        task_ids: ids.iter().map(|task| task.get()).collect(),
                    })),
                };
                write_control(&mut control_send, &ack, limit).await.err()
            }
            () = delivery.drained.notified() => {
                let close = delivery.drain_close();
                close_flushed(&delivery, &mut control_send, &mut control_rx, limit, close).await;
                break match close.0 {
                    ErrorCode::Drained => Exit::Drained,
                    _ => Exit::Ended,
                };
            }
            () = delivery.closing() => {
                // An operator's drain under way stays final.
                let close = match delivery.drain_close() {
                    (ErrorCode::Drained, _) => {
                        (ErrorCode::Drained, "drained; the gateway is shutting down")
                    }
                    close => close,
                };
                close_flushed(&delivery, &mut control_send, &mut control_rx, limit, close).await;
                break Exit::Ended;
            }
            reason = token.departed() => {
                let (code, reason) = departure_close(reason);
                delivery.close(code, &reason);
                break Exit::Ended;
            }
            Err(fault) = &mut manager => Some(fault),
            _ = delivery.connection().closed() => break Exit::Ended,
        };
        match fault {
            None => {}
            Some(Fault::Gone) => break Exit::Ended,
            Some(Fault::Close { code, reason }) => {
                tracing::warn!(%code, %reason, "closing worker connection");
                delivery.close(code, &reason);
                break Exit::Ended;
            }
        }
    };
    delivery.disconnect();
    server.untrack(worker, &delivery);
    let close = delivery.connection().close_reason();
    if let Some(error) = &close {
        tracing::info!(%error, "quic worker connection ended");
    }
    end_registration(token, exit, Ending::of(close.as_ref()));
}

/// The close for a worker core let go of: `SUPERSEDED` when a resume on a newer connection
/// replaced this one, `DEREGISTERED` with core's reason otherwise.
fn departure_close(reason: DisconnectReason) -> (ErrorCode, String) {
    match reason {
        DisconnectReason::Superseded => (
            ErrorCode::Superseded,
            "superseded by a resumed connection".to_owned(),
        ),
        reason => (
            ErrorCode::Deregistered,
            format!("deregistered by the gateway: {}", reason.as_str()),
        ),
    }
}

/// Handles one control frame from a registered worker.
fn control(
    up: QuicControlUp,
    server: &ServerShared,
    worker: WorkerId,
    capacity: &watch::Sender<Option<u32>>,
) -> Result<(), Fault> {
    server.core.record_frame(worker);
    match up.frame {
        Some(quic_control_up::Frame::Capabilities(capabilities)) => {
            // Core's gate owns the capacity rule (zero, the ceiling), its wording and its
            // audit; it is checked here because the lanes are sized by the announcement.
            let wanted = server
                .core
                .registry()
                .check_announced_capacity(worker, capabilities.max_concurrency)
                .map_err(refused)?
                .get();
            tracing::debug!(max_concurrency = wanted, "capacity announced");
            capacity.send_replace(Some(wanted));
            Ok(())
        }
        Some(quic_control_up::Frame::DrainRequest(_)) => {
            tracing::info!("worker asked to be drained");
            server.core.registry().drain_worker(worker);
            Ok(())
        }
        Some(quic_control_up::Frame::Register(_)) => Err(Fault::close(
            ErrorCode::ProtocolViolation,
            "register sent twice",
        )),
        Some(quic_control_up::Frame::Resume(_)) => Err(Fault::close(
            ErrorCode::ProtocolViolation,
            "resume after the connection was admitted",
        )),
        None => Err(Fault::empty(&CONTROL)),
    }
}

/// Keeps the lanes in line with the announced capacity, and core's capacity in line with the
/// lanes: growing opens the lanes first and announces after, shrinking announces first and
/// retires lanes after (busy ones when their task ends), so core never holds more slots
/// than there are lanes to carry them. Returns only on a fault.
async fn manage_lanes(
    delivery: &Arc<QuicDelivery>,
    server: &ServerShared,
    worker: WorkerId,
    mut wanted: watch::Receiver<Option<u32>>,
) -> Result<(), Fault> {
    let registry = server.core.registry();
    let mut applied: Option<u32> = None;
    loop {
        let target = *wanted.borrow_and_update();
        if let Some(target) = target {
            if applied.is_some_and(|applied| target < applied) {
                apply(registry, worker, target)?;
                applied = Some(target);
            }
            let mut to_open = delivery.lanes().set_target(target);
            if to_open > 0 {
                // Until the worker grants the stream credit, operators see why it takes no task.
                registry
                    .set_pending_capacity(worker, target)
                    .map_err(refused)?;
            }
            let mut superseded = false;
            while to_open > 0 {
                tokio::select! {
                    opened = delivery.connection().open_bi() => {
                        let (send, recv) = opened.map_err(|_| Fault::Gone)?;
                        OpenedLane::enter(delivery, send, recv)
                            .spawn(Arc::clone(delivery), server.core.clone(), worker);
                        to_open -= 1;
                    }
                    changed = wanted.changed() => {
                        changed.map_err(|_| Fault::Gone)?;
                        superseded = true;
                        break;
                    }
                }
            }
            if superseded {
                continue;
            }
            if applied != Some(target) {
                apply(registry, worker, target)?;
                applied = Some(target);
            }
        }
        wanted.changed().await.map_err(|_| Fault::Gone)?;
    }
}

fn apply(
    registry: &switchyard_core::Registry,
    worker: WorkerId,
    capacity: u32,
) -> Result<(), Fault> {
    registry
        .set_advertised_capacity(worker, capacity)
        .map_err(refused)
}

/// Closes the connection for a refusal of the gate, with its code and its sentence.
fn refused(error: switchyard_core::AdmissionError) -> Fault {
    Fault::close(convert::refusal_code(&error), error.to_string())
}

#[cfg(test)]
mod tests {
    use quinn::{ApplicationClose, VarInt};

    use super::*;

    fn closed_by_worker(code: ErrorCode) -> ConnectionError {
        ConnectionError::ApplicationClosed(ApplicationClose {
            error_code: code.var_int(),
            reason: bytes::Bytes::new(),
        })
    }

    #[test]
    fn a_lost_connection_suspends_and_a_goodbye_or_the_gateway_s_own_close_does_not() {
        for lost in [
            ConnectionError::TimedOut,
            ConnectionError::Reset,
            closed_by_worker(ErrorCode::ProtocolViolation),
        ] {
            assert_eq!(Ending::of(Some(&lost)), Ending::Lost, "{lost}");
        }
        // Control: the same end with the worker's `CLOSED`, or closed by the gateway itself.
        assert_eq!(
            Ending::of(Some(&closed_by_worker(ErrorCode::Closed))),
            Ending::Left
        );
        assert_eq!(
            Ending::of(Some(&ConnectionError::LocallyClosed)),
            Ending::Left
        );
        assert_eq!(
            Ending::of(Some(&ConnectionError::ApplicationClosed(
                ApplicationClose {
                    error_code: VarInt::from_u32(0x3f),
                    reason: bytes::Bytes::new(),
                }
            ))),
            Ending::Lost,
            "an unknown code is no goodbye"
        );
    }

    #[test]
    fn a_superseded_connection_is_told_so_and_others_hear_core_s_reason() {
        assert_eq!(
            departure_close(DisconnectReason::Superseded),
            (
                ErrorCode::Superseded,
                "superseded by a resumed connection".to_owned()
            )
        );
        assert_eq!(
            departure_close(DisconnectReason::Timeout),
            (
                ErrorCode::Deregistered,
                "deregistered by the gateway: timeout".to_owned()
            )
        );
    }
}
