//! The seam a transport SDK implements: open and register, then serve one connection.

use std::future::Future;

use switchyard_core::WorkerId;

use crate::{LinkError, TaskRunner, WorkerHandle, WorkerOptions};

/// What the gateway acknowledged at registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The id of this registration (each reconnection registers under a new one).
    pub worker_id: WorkerId,
    /// The task queue the gateway registered the worker in (never empty).
    pub task_queue: String,
}

/// What a connection may use while it serves.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionContext<'a> {
    /// The worker's options.
    pub options: &'a WorkerOptions,
    /// Starts each task that arrives.
    pub runner: &'a TaskRunner,
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
/// `open` dials and registers (the runtime bounds it by the connect timeout); `serve` turns
/// inbound frames into tasks for [`ConnectionContext::runner`], writes their replies, answers
/// pings, and returns when the connection ends. Dropping the `serve` future stops the connection.
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

    /// Dials the gateway and registers with `options`.
    fn open(
        &self,
        options: &WorkerOptions,
    ) -> impl Future<Output = Result<(Self::Connection, Registered), Self::Error>> + Send;

    /// Serves one connection until it ends.
    fn serve(
        &self,
        connection: Self::Connection,
        context: ConnectionContext<'_>,
    ) -> impl Future<Output = ConnectionEnd<Self::Error>> + Send;
}
