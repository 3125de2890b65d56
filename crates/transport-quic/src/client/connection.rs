//! One connection of a worker: register, announce capacity, accept lanes, follow the control
//! stream, and report how the connection ended.

use std::sync::Arc;

use quinn::{ConnectionError, Endpoint, SendStream, VarInt};
use switchyard_core::WorkerId;
use switchyard_proto::v1::{
    QuicCapabilities, QuicControlDown, QuicControlUp, QuicDrainReason, QuicDrainRequest,
    QuicRegister, QuicRegistered, quic_control_down, quic_control_up,
};
use switchyard_worker::{ConnectionContext, Registered, WorkerOptions};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::lane::{self, LaneContext, LaneCopyRouter};
use super::{DialConfig, QuicLinkError};
use crate::fault::{Fault, close_connection};
use crate::frame::{FrameReader, encode_frame};
use crate::outbox::Outbox;
use crate::protocol::{DEFAULT_MAX_CONTROL_FRAME, ErrorCode, PROTOCOL_VERSION};
use crate::redundancy::{Redundancy, RedundancyCounters};

const CONTROL: &str = "control stream";

/// A registered connection.
pub(crate) struct QuicConnection {
    conn: quinn::Connection,
    control_send: SendStream,
    control_reader: FrameReader,
    control_limit: u32,
    /// The gateway's `max_lane_frame_bytes`.
    lane_limit: u32,
    worker: WorkerId,
    /// What the gateway enabled.
    redundancy: Redundancy,
    /// Stops the lane tasks when the connection is dropped, even mid-serve.
    stop_lanes: DropGuard,
}

impl QuicConnection {
    /// Connects and registers; the capacity is announced when the connection starts serving.
    pub(crate) async fn open(
        endpoint: &Endpoint,
        settings: &DialConfig,
        options: &WorkerOptions,
    ) -> Result<(Self, Registered), QuicLinkError> {
        let mut client = quinn::ClientConfig::new(settings.tls.quic());
        // One stream credit for lane 0 until capacity is announced.
        client.transport_config(Arc::new(
            settings.connection.transport(1, settings.redundancy)?,
        ));
        let conn = endpoint
            .connect_with(client, settings.addr, &settings.server_name)?
            .await?;
        let (mut control_send, control_recv) = conn.open_bi().await?;
        // Only what this connection can carry is asked for: datagrams need the gateway's
        // transport parameters to accept them.
        let asked = if conn.max_datagram_size().is_some() {
            settings.redundancy
        } else {
            Redundancy::Off
        };
        let register = QuicControlUp {
            frame: Some(quic_control_up::Frame::Register(QuicRegister {
                protocol_version: PROTOCOL_VERSION,
                namespaces: options.namespaces.clone(),
                task_queue: options.task_queue.clone(),
                node: options.node.clone(),
                activity_types: options.activities.keys().cloned().collect(),
                identity: options.identity.clone(),
                auth_token: options.token.clone().unwrap_or_default(),
                redundancy: asked.wire().into(),
                resumable: false,
            })),
        };
        write(&mut control_send, &register, DEFAULT_MAX_CONTROL_FRAME)
            .await
            .map_err(|fault| closed(&conn, fault))?;
        let mut control_reader = FrameReader::new(control_recv, DEFAULT_MAX_CONTROL_FRAME);
        let registered = match control_reader.next::<QuicControlDown>().await {
            Ok(Some(QuicControlDown {
                frame: Some(quic_control_down::Frame::Registered(registered)),
            })) => registered,
            Ok(_) => {
                let fault = Fault::close(
                    ErrorCode::ProtocolViolation,
                    "the first control frame from the gateway must be registered",
                );
                return Err(closed(&conn, fault));
            }
            Err(error) => return Err(closed(&conn, Fault::read(error, &CONTROL))),
        };
        let QuicRegistered {
            worker_id,
            max_control_frame_bytes,
            max_lane_frame_bytes,
            task_queue,
            redundancy,
            ..
        } = registered;
        // The gateway's answer cannot turn on what was not asked for.
        let redundancy = Redundancy::negotiate(Redundancy::from_wire(redundancy), asked, true);
        let worker = WorkerId::from_raw(worker_id);
        let connection = Self {
            conn,
            control_send,
            control_reader,
            control_limit: nonzero_or(max_control_frame_bytes, DEFAULT_MAX_CONTROL_FRAME),
            lane_limit: nonzero_or(
                max_lane_frame_bytes,
                crate::protocol::DEFAULT_MAX_LANE_FRAME,
            ),
            worker,
            redundancy,
            stop_lanes: CancellationToken::new().drop_guard(),
        };
        tracing::info!(worker = %worker, gateway = %settings.addr, ?redundancy, "registered");
        let registered = Registered::new(worker, task_queue);
        Ok((connection, registered))
    }

    /// Serves the connection until it ends, and says why it ended.
    pub(crate) async fn serve(
        mut self,
        context: ConnectionContext<'_>,
        counters: &Arc<RedundancyCounters>,
    ) -> QuicLinkError {
        let closer = self.conn.clone();
        let copies = self.redundancy.wants_datagrams().then(|| {
            let copies = Arc::new(LaneCopyRouter::new(Arc::clone(counters)));
            lane::spawn_copy_reader(
                self.conn.clone(),
                Arc::clone(&copies),
                self.stop_lanes.token().clone(),
            );
            copies
        });
        let lanes = Arc::new(LaneContext {
            outbox: Outbox::spawn(Arc::new(move |fault| {
                if let Fault::Close { code, reason } = fault {
                    tracing::warn!(%code, %reason, "closing the gateway connection");
                    close_connection(&closer, code, &reason);
                }
            })),
            worker: self.worker,
            runner: context.runner.clone(),
            frame_limit: self.lane_limit,
            copies,
        });
        let mut capacity = context.handle.capacity();
        let drain = context.handle.drain_requested().clone();
        let mut drain_sent = false;
        let mut announce = true;
        let mut control_ended = false;
        let fault = loop {
            if announce {
                announce = false;
                if let Err(fault) = self.announce(&mut capacity).await {
                    break fault;
                }
            }
            let fault = tokio::select! {
                accepted = self.conn.accept_bi() => match accepted {
                    Ok((send, recv)) => {
                        let stop = self.stop_lanes.token().clone();
                        lane::spawn(self.conn.clone(), send, recv, Arc::clone(&lanes), stop);
                        None
                    }
                    Err(_) => Some(Fault::Gone),
                },
                down = self.control_reader.next::<QuicControlDown>(), if !control_ended => match down {
                    Ok(Some(down)) => self.control(down).err(),
                    Ok(None) => {
                        // The gateway finishes its streams right before it closes, so that
                        // what it sent arrives first: wait for its close and its code.
                        tracing::debug!(worker = %self.worker, "the gateway finished the control stream");
                        control_ended = true;
                        None
                    }
                    Err(error) => Some(Fault::read(error, &CONTROL)),
                },
                changed = capacity.changed() => {
                    announce = changed.is_ok();
                    None
                }
                () = drain.cancelled(), if !drain_sent => {
                    drain_sent = true;
                    let request = QuicControlUp {
                        frame: Some(quic_control_up::Frame::DrainRequest(QuicDrainRequest {})),
                    };
                    write(&mut self.control_send, &request, self.control_limit).await.err()
                }
            };
            if let Some(fault) = fault {
                break fault;
            }
        };
        closed(&self.conn, fault)
    }

    /// Grants the gateway one stream per slot, then tells it the capacity: in that order, so
    /// the lanes it opens for the new capacity find credit waiting.
    async fn announce(&mut self, capacity: &mut watch::Receiver<u32>) -> Result<(), Fault> {
        let max_concurrency = *capacity.borrow_and_update();
        self.conn
            .set_max_concurrent_bi_streams(VarInt::from_u32(max_concurrency));
        let frame = QuicControlUp {
            frame: Some(quic_control_up::Frame::Capabilities(QuicCapabilities {
                max_concurrency,
            })),
        };
        tracing::debug!(worker = %self.worker, max_concurrency, "announcing capacity");
        write(&mut self.control_send, &frame, self.control_limit).await
    }

    fn control(&mut self, down: QuicControlDown) -> Result<(), Fault> {
        match down.frame {
            Some(quic_control_down::Frame::Drain(drain)) => {
                if drain.reason() == QuicDrainReason::ShuttingDown {
                    tracing::info!(worker = %self.worker,
                        "the gateway is shutting down: finishing tasks in flight, then reconnecting");
                } else {
                    tracing::info!(worker = %self.worker, "draining: finishing tasks in flight");
                }
                Ok(())
            }
            // Results are not kept across connections yet: nothing to forget.
            Some(quic_control_down::Frame::ResultsAck(_)) => Ok(()),
            Some(quic_control_down::Frame::Registered(_)) => Err(Fault::close(
                ErrorCode::ProtocolViolation,
                "registered sent twice",
            )),
            None => Err(Fault::empty(&CONTROL)),
        }
    }
}

fn nonzero_or(value: u32, default: u32) -> u32 {
    if value == 0 { default } else { value }
}

async fn write(send: &mut SendStream, frame: &QuicControlUp, limit: u32) -> Result<(), Fault> {
    let bytes = encode_frame(frame, limit)
        .map_err(|error| Fault::close(ErrorCode::Internal, format!("{CONTROL}: {error}")))?;
    send.write_chunk(bytes)
        .await
        .map_err(|error| Fault::write(error, &CONTROL))
}

/// Closes the connection for `fault` (when it is ours to close) and reports why it ended,
/// preferring the gateway's own close code when it closed first.
fn closed(conn: &quinn::Connection, fault: Fault) -> QuicLinkError {
    if let Fault::Close { code, reason } = &fault {
        if conn.close_reason().is_none() {
            tracing::warn!(%code, %reason, "closing the gateway connection");
            close_connection(conn, *code, reason);
            return QuicLinkError::Protocol {
                code: *code,
                reason: reason.clone(),
            };
        }
    }
    match conn.close_reason() {
        Some(error) => QuicLinkError::from(error),
        None => QuicLinkError::Connection(ConnectionError::LocallyClosed),
    }
}
