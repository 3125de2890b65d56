//! Controls a running worker, whatever its transport.

use std::sync::Arc;

use switchyard_core::WorkerId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::options::validate_max_concurrency;
use crate::{TaskRunner, WorkerError};

/// Drains, resizes, stops or observes a running worker; cheap to clone.
///
/// A transport whose protocol has no frame for an operation answers it with
/// [`WorkerError::Unsupported`] rather than pretending.
#[derive(Clone)]
pub struct WorkerHandle(Arc<HandleState>);

struct HandleState {
    transport: &'static str,
    can_drain: bool,
    can_resize: bool,
    runner: TaskRunner,
    stop: CancellationToken,
    drain: CancellationToken,
    capacity: watch::Sender<u32>,
    registered: watch::Sender<Option<WorkerId>>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("transport", &self.0.transport)
            .field("worker", &*self.0.registered.borrow())
            .finish_non_exhaustive()
    }
}

impl WorkerHandle {
    pub(crate) fn new(
        transport: &'static str,
        (can_drain, can_resize): (bool, bool),
        runner: TaskRunner,
        max_concurrency: u32,
    ) -> Self {
        Self(Arc::new(HandleState {
            transport,
            can_drain,
            can_resize,
            runner,
            stop: CancellationToken::new(),
            drain: CancellationToken::new(),
            capacity: watch::Sender::new(max_concurrency),
            registered: watch::Sender::new(None),
        }))
    }

    /// Asks the gateway to drain this worker: no new task comes, running ones finish, then
    /// the worker stops and `run` returns `Ok`.
    pub fn drain(&self) -> Result<(), WorkerError> {
        if !self.0.can_drain {
            return Err(self.unsupported("drain"));
        }
        self.0.drain.cancel();
        Ok(())
    }

    /// Changes the worker's concurrency and announces it to the gateway; running tasks are
    /// never stopped by a shrink.
    pub fn set_max_concurrency(&self, max_concurrency: u32) -> Result<(), WorkerError> {
        validate_max_concurrency(max_concurrency)?;
        if !self.0.can_resize {
            return Err(self.unsupported("set_max_concurrency"));
        }
        self.0.runner.resize(max_concurrency);
        self.0.capacity.send_replace(max_concurrency);
        Ok(())
    }

    /// Stops the worker without a drain: running handlers are dropped, the connection is
    /// closed (the gateway dispatches their tasks again, after its reconnect grace when the
    /// worker had a session) and `run` returns `Ok`.
    pub fn shutdown(&self) {
        self.0.stop.cancel();
    }

    /// A token that stops the worker when cancelled, as [`WorkerHandle::shutdown`] does.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.0.stop.clone()
    }

    /// Fires when a drain was requested; a link that can drain watches it.
    pub fn drain_requested(&self) -> &CancellationToken {
        &self.0.drain
    }

    /// Follows the capacity to announce; a link that can resize watches it.
    pub fn capacity(&self) -> watch::Receiver<u32> {
        self.0.capacity.subscribe()
    }

    /// The capacity now: the options' until a resize, then the last resize's.
    pub(crate) fn current_capacity(&self) -> u32 {
        *self.0.capacity.borrow()
    }

    /// The id of the current registration, `None` while disconnected.
    pub fn worker_id(&self) -> Option<WorkerId> {
        *self.0.registered.borrow()
    }

    /// Follows registrations: the id after each (re)connection, `None` after each loss.
    pub fn registrations(&self) -> watch::Receiver<Option<WorkerId>> {
        self.0.registered.subscribe()
    }

    pub(crate) fn set_registered(&self, worker: Option<WorkerId>) {
        self.0.registered.send_replace(worker);
    }

    fn unsupported(&self, operation: &'static str) -> WorkerError {
        WorkerError::Unsupported {
            operation,
            transport: self.0.transport,
        }
    }
}
