//! The seam a transport SDK implements: open and register, then serve one connection.

use std::future::Future;

use switchyard_core::{ResumeRequest, SessionGrant, TaskId, WorkerId};

use crate::{LinkError, TaskKeeper, TaskRunner, WorkerHandle, WorkerOptions};

/// What the gateway acknowledged at registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The id of this registration (a fresh registration gets a new one; a resume keeps it).
    pub worker_id: WorkerId,
    /// The task queue the gateway registered the worker in (never empty).
    pub task_queue: String,
    /// The session the gateway granted, if any: what a later resume presents.
    pub session: Option<SessionGrant>,
    /// Set iff this connection resumed a session: the tasks the gateway still waits on.
    pub held: Option<Vec<TaskId>>,
}

impl Registered {
    /// A fresh registration without a session.
    pub fn new(worker_id: WorkerId, task_queue: String) -> Self {
        Self {
            worker_id,
            task_queue,
            session: None,
            held: None,
        }
    }
}

/// What a connection may use while it serves.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionContext<'a> {
    /// The worker's options.
    pub options: &'a WorkerOptions,
    /// The worker's runner (the keeper starts tasks on it).
    pub runner: &'a TaskRunner,
    /// Owns the worker's tasks across connections: hand it each task, cancel and results
    /// acknowledgement, and write what it yields.
    pub keeper: &'a TaskKeeper,
    /// The worker's handle: a requested drain and the announced capacity.
    pub handle: &'a WorkerHandle,
}

/// How a connection ended, as the link classifies it for the reconnect loop.
#[derive(Debug)]
pub enum ConnectionEnd<E> {
    /// A requested drain completed: the worker stops.
    Drained,
    /// The gateway is shutting down (or restarted) or the connection was lost: the worker
    /// comes back with backoff.
    ComeBack {
        /// What happened, for the log.
        reason: String,
        /// True when the gateway asked the worker back (shutdown, stateless reset).
        shutting_down: bool,
    },
    /// The link failed; the worker stops when the error is permanent, else comes back.
    Failed(E),
}

/// A transport's worker link.
///
/// `open` dials and registers, or resumes the session in `resume` (the runtime bounds it by the
/// connect timeout); `serve` hands inbound tasks, cancels and results acknowledgements to
/// [`ConnectionContext::keeper`], writes the replies it yields, answers pings, and returns when
/// the connection ends. Dropping the `serve` future stops the connection, not the tasks: the
/// runtime decides whether they outlive it (a session) or are let go.
pub trait Link: Send + Sync + 'static {
    /// One registered connection or stream.
    type Connection: Send + 'static;
    /// The link's own failure.
    type Error: LinkError;
    /// The transport's name, for errors and logs.
    const TRANSPORT: &'static str;
    /// Whether the protocol lets the worker ask to be drained.
    const CAN_DRAIN: bool;
    /// Whether the protocol lets the worker announce a new capacity.
    const CAN_RESIZE: bool;

    /// Dials the gateway and registers with `options` (announcing the worker resumable when
    /// `options.resume`), or, given `resume`, presents it instead of a registration. A refused
    /// resume is an error whose [`LinkError::is_resume_refused`] is true.
    fn open(
        &self,
        options: &WorkerOptions,
        resume: Option<&ResumeRequest>,
    ) -> impl Future<Output = Result<(Self::Connection, Registered), Self::Error>> + Send;

    /// Serves one connection until it ends.
    fn serve(
        &self,
        connection: Self::Connection,
        context: ConnectionContext<'_>,
    ) -> impl Future<Output = ConnectionEnd<Self::Error>> + Send;
}
