//! One connection of a worker: register, announce capacity, accept lanes, follow the control
//! stream, and report how the connection ended.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use quinn::{ConnectionError, Endpoint, SendStream, VarInt};
use switchyard_core::{IdMap, ResumeRequest, ResumeSecret, SessionGrant, TaskId, WorkerId};
use switchyard_proto::v1::{
    QuicCapabilities, QuicControlDown, QuicControlUp, QuicDrainReason, QuicDrainRequest,
    QuicRegister, QuicRegistered, QuicResume, quic_control_down, quic_control_up,
};
use switchyard_worker::{
    ConnectionContext, Registered, ReplySink, TaskKeeper, TaskReply, WorkerOptions,
};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::lane::{self, LaneContext, LaneCopyRouter, Route};
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
    /// Connects and registers, or with `resume` resumes that session; the capacity is
    /// announced when the connection starts serving.
    pub(crate) async fn open(
        endpoint: &Endpoint,
        settings: &DialConfig,
        options: &WorkerOptions,
        resume: Option<&ResumeRequest>,
    ) -> Result<(Self, Registered), QuicLinkError> {
        let mut client = quinn::ClientConfig::new(settings.tls.quic());
        let credit = opening_stream_credit(options.max_concurrency, resume.is_some());
        client.transport_config(Arc::new(
            settings.connection.transport(credit, settings.redundancy)?,
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
        let auth_token = options.token.clone().unwrap_or_default();
        let first = match resume {
            Some(request) => quic_control_up::Frame::Resume(QuicResume {
                protocol_version: PROTOCOL_VERSION,
                auth_token,
                session_id: request.session_id.get(),
                resume_secret: request.secret.clone().into(),
                running_task_ids: request.running.iter().map(|task| task.get()).collect(),
                unacked_task_ids: request.unacked.iter().map(|task| task.get()).collect(),
                redundancy: asked.wire().into(),
            }),
            None => quic_control_up::Frame::Register(QuicRegister {
                protocol_version: PROTOCOL_VERSION,
                namespaces: options.namespaces.clone(),
                task_queue: options.task_queue.clone(),
                node: options.node.clone(),
                activity_types: options.activities.keys().cloned().collect(),
                identity: options.identity.clone(),
                auth_token,
                redundancy: asked.wire().into(),
                resumable: options.resume,
            }),
        };
        let register = QuicControlUp { frame: Some(first) };
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
        let session = session(&registered);
        let QuicRegistered {
            worker_id,
            max_control_frame_bytes,
            max_lane_frame_bytes,
            task_queue,
            redundancy,
            resumed,
            held_task_ids,
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
        let registered = Registered {
            session,
            held: resumed.then(|| held_task_ids.into_iter().map(TaskId::from_raw).collect()),
            ..Registered::new(worker, task_queue)
        };
        Ok((connection, registered))
    }

    /// Serves the connection until it ends, and says why it ended: tasks go to the worker's
    /// keeper, and each reply it yields goes back on its task's lane.
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
        let keeper = context.keeper;
        let replies = Arc::new(Mutex::new(Replies::default()));
        let lanes = Arc::new(LaneContext {
            outbox: Outbox::spawn(Arc::new(move |fault| {
                if let Fault::Close { code, reason } = fault {
                    tracing::warn!(%code, %reason, "closing the gateway connection");
                    close_connection(&closer, code, &reason);
                }
            })),
            worker: self.worker,
            tasks: context.keeper.starter(),
            replies: Arc::clone(&replies),
            frame_limit: self.lane_limit,
            copies,
        });
        // Replies whose lane is known go out from the task that finished; the rest (and all of
        // them once this connection ends) wait for this loop or the next connection.
        let _sink = keeper.install_sink(Arc::new(LaneReplies {
            conn: self.conn.clone(),
            lanes: Arc::clone(&lanes),
        }));
        // The lanes start their tasks themselves and most replies go out through the sink, so
        // this loop turns only for the rest. Its waits are made once and renewed only when they
        // resolve: a fresh `accept_bi()`, `cancelled()` or `changed()` each turn costs a lock
        // and a waiter registration apiece.
        let acceptor = self.conn.clone();
        let accept = acceptor.accept_bi();
        tokio::pin!(accept);
        let mut capacity = context.handle.capacity();
        let mut announce = Some(*capacity.borrow_and_update());
        let resized = capacity_changed(capacity);
        tokio::pin!(resized);
        let mut capacity_followed = true;
        let drain = context.handle.drain_requested().clone().cancelled_owned();
        tokio::pin!(drain);
        let mut drain_sent = false;
        let mut control_ended = false;
        let fault = loop {
            if let Some(max_concurrency) = announce.take() {
                if let Err(fault) = self.announce(max_concurrency).await {
                    break fault;
                }
            }
            // In this order, and stopping at the first ready: a turn taken for a reply polls
            // nothing else. Replies cannot starve the rest, as the gateway sends no more tasks
            // than the capacity before their replies went out.
            let fault = tokio::select! {
                biased;
                reply = keeper.next_reply() => {
                    // The replies that finished meanwhile go in the same turn.
                    let mut next = Some(reply);
                    let mut fault = None;
                    while let Some(reply) = next {
                        let routed = lock(&replies).reply(reply);
                        fault = routed.and_then(|(route, reply)| {
                            lane::write_reply(&self.conn, &lanes, &route, reply).err()
                        });
                        next = if fault.is_none() { keeper.try_next_reply() } else { None };
                    }
                    fault
                }
                accepted = &mut accept => {
                    accept.set(acceptor.accept_bi());
                    match accepted {
                        Ok((send, recv)) => {
                            let stop = self.stop_lanes.token().clone();
                            lane::spawn(self.conn.clone(), send, recv, Arc::clone(&lanes), stop);
                            None
                        }
                        Err(_) => Some(Fault::Gone),
                    }
                }
                down = self.control_reader.next::<QuicControlDown>(), if !control_ended => match down {
                    Ok(Some(down)) => self.control(down, keeper).err(),
                    Ok(None) => {
                        // The gateway finishes its streams right before it closes, so that
                        // what it sent arrives first: wait for its close and its code.
                        tracing::debug!(worker = %self.worker, "the gateway finished the control stream");
                        control_ended = true;
                        None
                    }
                    Err(error) => Some(Fault::read(error, &CONTROL)),
                },
                (changed, capacity) = &mut resized, if capacity_followed => {
                    let mut capacity = capacity;
                    capacity_followed = changed;
                    if changed {
                        announce = Some(*capacity.borrow_and_update());
                    }
                    resized.set(capacity_changed(capacity));
                    None
                }
                () = &mut drain, if !drain_sent => {
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
    async fn announce(&mut self, max_concurrency: u32) -> Result<(), Fault> {
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

    fn control(&mut self, down: QuicControlDown, keeper: &TaskKeeper) -> Result<(), Fault> {
        match down.frame {
            Some(quic_control_down::Frame::ResultsAck(ack)) => {
                keeper.acknowledged(ack.task_ids.into_iter().map(TaskId::from_raw));
                Ok(())
            }
            Some(quic_control_down::Frame::Drain(drain)) => {
                if drain.reason() == QuicDrainReason::ShuttingDown {
                    tracing::info!(worker = %self.worker,
                        "the gateway is shutting down: finishing tasks in flight, then reconnecting");
                } else {
                    tracing::info!(worker = %self.worker, "draining: finishing tasks in flight");
                }
                Ok(())
            }
            Some(quic_control_down::Frame::Registered(_)) => Err(Fault::close(
                ErrorCode::ProtocolViolation,
                "registered sent twice",
            )),
            None => Err(Fault::empty(&CONTROL)),
        }
    }
}

/// The lanes of the connection's tasks, and the replies that came before their lane was
/// known (a re-sent result whose `held` frame is still on its way).
#[derive(Default)]
pub(crate) struct Replies {
    routes: IdMap<TaskId, Route>,
    waiting: IdMap<TaskId, TaskReply>,
}

impl Replies {
    /// `task` answers on `route`; returns its reply if it was waiting for it.
    pub(crate) fn route(&mut self, task: TaskId, route: Route) -> Option<(Route, TaskReply)> {
        match self.waiting.remove(&task) {
            Some(reply) => Some((route, reply)),
            None => {
                self.routes.insert(task, route);
                None
            }
        }
    }

    /// Whether `task` was routed to a lane and its reply has not gone out yet.
    pub(crate) fn awaits_reply(&self, task: TaskId) -> bool {
        self.routes.contains_key(&task)
    }

    /// Where `reply` goes, or `None` while its lane is not known yet.
    fn reply(&mut self, reply: TaskReply) -> Option<(Route, TaskReply)> {
        let task = match &reply {
            TaskReply::Result { task_id, .. } | TaskReply::CancelAck { task_id } => *task_id,
        };
        match self.routes.remove(&task) {
            Some(route) => Some((route, reply)),
            None => {
                self.waiting.insert(task, reply);
                None
            }
        }
    }
}

pub(crate) fn lock(replies: &Mutex<Replies>) -> MutexGuard<'_, Replies> {
    // Map operations cannot panic part-way.
    replies.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection's [`ReplySink`]: writes a finished task's reply on its lane, when its lane is
/// known, from the task that finished.
struct LaneReplies {
    conn: quinn::Connection,
    lanes: Arc<LaneContext>,
}

impl ReplySink for LaneReplies {
    fn try_write(&self, reply: &TaskReply) -> bool {
        let task = match reply {
            TaskReply::Result { task_id, .. } | TaskReply::CancelAck { task_id } => *task_id,
        };
        let mut replies = lock(&self.lanes.replies);
        let Some(route) = replies.routes.remove(&task) else {
            return false;
        };
        if lane::write_reply(&self.conn, &self.lanes, &route, reply.clone()).is_ok() {
            return true;
        }
        // The connection's loop meets the fault again when it writes the queued reply.
        replies.routes.insert(task, route);
        false
    }
}

/// The session a `registered` grants; none unless it carries an id, a grace and a 32-byte
/// secret.
fn session(registered: &QuicRegistered) -> Option<SessionGrant> {
    if registered.session_id == 0 || registered.reconnect_grace_ms == 0 {
        return None;
    }
    Some(SessionGrant {
        session_id: WorkerId::from_raw(registered.session_id),
        secret: ResumeSecret::from_slice(&registered.resume_secret)?,
        grace: Duration::from_millis(u64::from(registered.reconnect_grace_ms)),
    })
}

/// Waits for the capacity to change; hands the receiver back, with false once the handle that
/// sets it is gone.
async fn capacity_changed(mut capacity: watch::Receiver<u32>) -> (bool, watch::Receiver<u32>) {
    let changed = capacity.changed().await.is_ok();
    (changed, capacity)
}

/// The bidirectional stream credit a connection grants the gateway before its first frame.
///
/// A registration needs one (lane 0) until capacity is announced. A resume needs one per slot
/// of the capacity the gateway kept, which a resize may have changed since the options were
/// set: the gateway opens them all, held tasks on some, before it answers, and never more than
/// that capacity; so a resume grants the larger of `max_concurrency` and the gateway's default
/// ceiling on announced capacity.
fn opening_stream_credit(max_concurrency: u32, resuming: bool) -> u32 {
    if resuming {
        max_concurrency.max(switchyard_core::DEFAULT_MAX_CONCURRENCY_LIMIT)
    } else {
        1
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

#[cfg(test)]
mod tests {
    use super::opening_stream_credit;

    #[test]
    fn a_resume_grants_the_larger_of_max_concurrency_and_1024_streams_and_a_registration_one() {
        assert_eq!(switchyard_core::DEFAULT_MAX_CONCURRENCY_LIMIT, 1024);
        assert_eq!(opening_stream_credit(4, true), 1024);
        assert_eq!(opening_stream_credit(1024, true), 1024);
        assert_eq!(opening_stream_credit(2000, true), 2000);
        // Control: a registration grants one lane whatever its capacity.
        assert_eq!(opening_stream_credit(4, false), 1);
        assert_eq!(opening_stream_credit(2000, false), 1);
    }
}
