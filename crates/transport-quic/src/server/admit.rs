//! The first control frame of a connection: a registration through core's gate, or the resume
//! of a session; either ends with `registered` on the wire and the worker announced to core.

use std::sync::Arc;

use quinn::{Connection, SendStream};
use rustls_pki_types::CertificateDer;
use switchyard_core::{
    CallerIdentity, RegistrationToken, SessionGrant, TaskId, WorkerDelivery, WorkerId,
};
use switchyard_proto::v1::{
    QuicControlDown, QuicControlUp, QuicRegister, QuicRegistered, QuicResume, quic_control_down,
    quic_control_up,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout_at};

use super::ServerShared;
use super::connection::{CONTROL, write_control};
use super::datagram;
use super::delivery::{QueuedControl, QuicDelivery};
use super::intake::Pass;
use super::lane::OpenedLane;
use crate::convert;
use crate::fault::{Fault, close_connection};
use crate::frame::FrameReader;
use crate::protocol::ErrorCode;
use crate::redundancy::Redundancy;

/// A worker through the gate (or resumed), with its streams.
pub(super) struct Admitted {
    pub(super) token: RegistrationToken,
    pub(super) namespaces: Vec<String>,
    pub(super) delivery: Arc<QuicDelivery>,
    pub(super) control_send: SendStream,
    pub(super) control_reader: FrameReader,
    pub(super) control_rx: mpsc::Receiver<QueuedControl>,
    /// The capacity in force: none after a registration, the session's after a resume.
    pub(super) capacity: Option<u32>,
}

/// A worker through the gate (or resumed), before its control streams join it.
struct Entered {
    token: RegistrationToken,
    namespaces: Vec<String>,
    delivery: Arc<QuicDelivery>,
    control_rx: mpsc::Receiver<QueuedControl>,
    capacity: Option<u32>,
}

/// Reads the first control frame and admits the worker it registers or resumes, by
/// `deadline`. A refusal (the deadline's included) closes the connection here, before the
/// control streams are dropped: dropping a send stream finishes it, and a worker that read
/// that clean end before the close would not learn why it was refused.
pub(super) async fn admit(
    conn: &Connection,
    server: &ServerShared,
    pass: &mut Pass,
    deadline: Instant,
) -> Result<Admitted, Fault> {
    let (mut control_send, control_recv) = match timeout_at(deadline, conn.accept_bi()).await {
        Ok(Ok(streams)) => streams,
        Ok(Err(_)) => return Err(Fault::Gone),
        Err(_) => return Err(refuse(conn, timed_out(server))),
    };
    let mut control_reader = FrameReader::new(control_recv, server.config.frames.control);
    let entered = timeout_at(
        deadline,
        enter(conn, server, &mut control_send, &mut control_reader, pass),
    )
    .await
    .unwrap_or_else(|_| Err(timed_out(server)));
    match entered {
        Ok(entered) => Ok(Admitted {
            token: entered.token,
            namespaces: entered.namespaces,
            delivery: entered.delivery,
            control_send,
            control_reader,
            control_rx: entered.control_rx,
            capacity: entered.capacity,
        }),
        Err(fault) => Err(refuse(conn, fault)),
    }
}

/// Closes `conn` for `fault` when it is a refusal, and gives it back.
fn refuse(conn: &Connection, fault: Fault) -> Fault {
    if let Fault::Close { code, reason } = &fault {
        close_connection(conn, *code, reason);
    }
    fault
}

/// The refusal of a connection the registration deadline ended.
fn timed_out(server: &ServerShared) -> Fault {
    Fault::close(
        ErrorCode::RegistrationTimeout,
        format!(
            "no registration within {} ms of the first packet",
            server.config.registration_timeout.as_millis()
        ),
    )
}

/// The first control frame, then the registration or resume it asks for.
async fn enter(
    conn: &Connection,
    server: &ServerShared,
    control_send: &mut SendStream,
    control_reader: &mut FrameReader,
    pass: &mut Pass,
) -> Result<Entered, Fault> {
    let first = control_reader
        .next::<QuicControlUp>()
        .await
        .map_err(|error| Fault::read(error, &CONTROL))?;
    match first.map(|up| up.frame) {
        Some(Some(quic_control_up::Frame::Register(register))) => {
            register_worker(conn, server, register, control_send, pass).await
        }
        Some(Some(quic_control_up::Frame::Resume(resume))) => {
            resume_session(conn, server, resume, control_send, pass).await
        }
        Some(None) => Err(Fault::empty(&CONTROL)),
        Some(Some(_)) => Err(Fault::close(
            ErrorCode::ProtocolViolation,
            "the first control frame must be register or resume",
        )),
        None => Err(Fault::close(
            ErrorCode::ProtocolViolation,
            "the control stream ended before register",
        )),
    }
}

/// Authenticates, admits through core's gate, opens lane 0, answers `registered`, then
/// announces the worker to core.
async fn register_worker(
    conn: &Connection,
    server: &ServerShared,
    register: QuicRegister,
    control_send: &mut SendStream,
    pass: &mut Pass,
) -> Result<Entered, Fault> {
    let caller = authenticate(conn, server, &register.auth_token)?;
    let redundancy = negotiate(conn, server, register.redundancy);
    let resumable = register.resumable;
    let registration = convert::registration(register, server.config.reconnect_grace)
        .map_err(|(code, reason)| Fault::close(code, reason))?;
    let namespaces: Vec<String> = registration.namespaces.iter().cloned().collect();
    let task_queue = switchyard_core::normalise_task_queue(&registration.task_queue).to_owned();
    let (delivery, control_rx) = connection_delivery(conn, server, redundancy, resumable);
    let leg: Arc<dyn WorkerDelivery> = delivery.clone();
    let token = server
        .core
        .registry()
        .admit_unannounced(&caller, registration, leg)
        .await
        .map_err(|error| Fault::close(convert::refusal_code(&error), error.to_string()))?;
    let worker = token.worker_id();
    open_lanes(conn, server, &delivery, worker, 1).await?;
    let registered = Answer {
        worker,
        task_queue,
        redundancy,
        grant: token.session(),
        held: None,
    }
    .frame(server);
    // The slot is given back before the worker hears it is in, so a connection it opens next
    // finds the slot free.
    pass.registered();
    write_control(control_send, &registered, server.config.frames.control).await?;
    // Core pings and drains the worker only from here, after `registered` is written.
    token.announce();
    tracing::info!(worker = %worker, ?redundancy, session = token.session().is_some(),
        "quic worker registered; capacity unannounced");
    Ok(Entered {
        token,
        namespaces,
        delivery,
        control_rx,
        capacity: None,
    })
}

/// Authenticates and asks core to resume the session; opens the lanes the session's capacity
/// needs and puts each held task on one (`held`), answers `registered` (`resumed`), then
/// announces the connection, which sends the cancels core queued for it. A refusal closes
/// with `RESUME_REFUSED` and core's sentence, which starts `resume refused: <label>`.
async fn resume_session(
    conn: &Connection,
    server: &ServerShared,
    resume: QuicResume,
    control_send: &mut SendStream,
    pass: &mut Pass,
) -> Result<Entered, Fault> {
    let caller = authenticate(conn, server, &resume.auth_token)?;
    let redundancy = negotiate(conn, server, resume.redundancy);
    let request =
        convert::resume_request(resume).map_err(|(code, reason)| Fault::close(code, reason))?;
    let (delivery, control_rx) = connection_delivery(conn, server, redundancy, true);
    let leg: Arc<dyn WorkerDelivery> = delivery.clone();
    let resumed = server
        .core
        .resume(&caller, request, leg)
        .await
        .map_err(|refusal| Fault::close(ErrorCode::ResumeRefused, refusal.to_string()))?;
    let worker = resumed.token.worker_id();
    // Every slot gets its lane before the connection is announced, so a task core selects the
    // worker for always finds an idle one; a held task takes a lane like a task sent.
    let capacity = resumed.capacity;
    let lanes = capacity.map_or(1, |capacity| capacity as usize);
    if let Some(capacity) = capacity {
        delivery.lanes().set_target(capacity);
    }
    open_lanes(
        conn,
        server,
        &delivery,
        worker,
        lanes.max(resumed.held.len()),
    )
    .await?;
    for task in &resumed.held {
        delivery.hold(*task).map_err(|error| {
            Fault::close(
                ErrorCode::Internal,
                format!("no lane for held task {task}: {error}"),
            )
        })?;
    }
    let registered = Answer {
        worker,
        task_queue: resumed.task_queue.clone(),
        redundancy,
        grant: Some(&resumed.grant),
        held: Some(&resumed.held),
    }
    .frame(server);
    // The slot is given back before the worker hears it is in, so a connection it opens next
    // finds the slot free.
    pass.registered();
    write_control(control_send, &registered, server.config.frames.control).await?;
    resumed.token.announce();
    tracing::info!(worker = %worker, held = resumed.held.len(), ?redundancy, "quic worker resumed its session");
    Ok(Entered {
        token: resumed.token,
        namespaces: Vec::new(),
        delivery,
        control_rx,
        capacity,
    })
}

/// The redundancy in force: what the worker asked for, the gateway allows, and the connection
/// carries.
fn negotiate(conn: &Connection, server: &ServerShared, asked: i32) -> Redundancy {
    Redundancy::negotiate(
        server.config.redundancy,
        Redundancy::from_wire(asked),
        conn.max_datagram_size().is_some(),
    )
}

/// The connection's delivery; `acks` when the worker understands `results_ack`.
fn connection_delivery(
    conn: &Connection,
    server: &ServerShared,
    redundancy: Redundancy,
    acks: bool,
) -> (Arc<QuicDelivery>, mpsc::Receiver<QueuedControl>) {
    let copies = redundancy
        .wants_datagrams()
        .then(|| Arc::clone(&server.copies));
    let (delivery, control_rx) =
        QuicDelivery::new(conn.clone(), server.config.frames.lane, copies, acks);
    (Arc::new(delivery), control_rx)
}

/// Opens `count` lanes (at least one, for pings) and starts reading them, and the datagram
/// copies when redundancy is in force.
async fn open_lanes(
    conn: &Connection,
    server: &ServerShared,
    delivery: &Arc<QuicDelivery>,
    worker: WorkerId,
    count: usize,
) -> Result<(), Fault> {
    for _ in 0..count.max(1) {
        let (send, recv) = conn.open_bi().await.map_err(|_| Fault::Gone)?;
        OpenedLane::enter(delivery, send, recv).spawn(
            Arc::clone(delivery),
            server.core.clone(),
            worker,
        );
    }
    if delivery.copies().is_some() {
        datagram::spawn(Arc::clone(delivery), server.core.clone(), worker);
    }
    Ok(())
}

/// What `registered` tells the worker.
struct Answer<'a> {
    worker: WorkerId,
    task_queue: String,
    redundancy: Redundancy,
    grant: Option<&'a SessionGrant>,
    /// After a resume: the held tasks.
    held: Option<&'a [TaskId]>,
}

impl Answer<'_> {
    fn frame(self, server: &ServerShared) -> QuicControlDown {
        let limits = server.config.frames;
        let liveness = server.core.liveness().config();
        let (session_id, resume_secret, reconnect_grace_ms) = convert::grant(self.grant);
        QuicControlDown {
            frame: Some(quic_control_down::Frame::Registered(QuicRegistered {
                worker_id: self.worker.get(),
                ping_interval_ms: millis(liveness.ping_interval),
                ping_timeout_ms: millis(liveness.ping_timeout),
                max_concurrency_limit: server.core.registry().max_concurrency_limit(),
                max_control_frame_bytes: limits.control,
                max_lane_frame_bytes: limits.lane,
                task_queue: self.task_queue,
                redundancy: self.redundancy.wire().into(),
                session_id,
                resume_secret,
                reconnect_grace_ms,
                resumed: self.held.is_some(),
                held_task_ids: self
                    .held
                    .unwrap_or_default()
                    .iter()
                    .map(|task| task.get())
                    .collect(),
            })),
        }
    }
}

fn authenticate(
    conn: &Connection,
    server: &ServerShared,
    auth_token: &str,
) -> Result<CallerIdentity, Fault> {
    let certificates: Vec<CertificateDer<'static>> = conn
        .peer_identity()
        .and_then(|identity| identity.downcast::<Vec<CertificateDer<'static>>>().ok())
        .map(|chain| *chain)
        .unwrap_or_default();
    let credentials = switchyard_auth::Credentials::new()
        .certificate_chain(&certificates)
        .bearer_token(Some(auth_token))
        .remote(conn.remote_address());
    server
        .auth
        .authenticate(&credentials)
        .map_err(|error| Fault::close(ErrorCode::Unauthenticated, error.to_string()))
}

fn millis(duration: std::time::Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}
