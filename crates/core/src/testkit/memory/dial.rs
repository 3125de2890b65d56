//! Opening a link: a fresh registration, or the resume of a session, and the gateway's task
//! that serves it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::connection::{self, Served};
use super::link::{self, Frame, Link, MemoryDelivery};
use crate::address::WorkerId;
use crate::admission::AdmissionError;
use crate::delivery::TaskId;
use crate::handle::Core;
use crate::registration::{CallerIdentity, Registration};
use crate::registry::RegistrationToken;
use crate::session::{ResumeRefused, ResumeRequest, SessionGrant};

/// How a memory gateway (and, for the kit's controls, its workers) behaves.
#[derive(Clone, Copy, Debug)]
pub(super) struct Policy {
    /// Registrations carry no capacity; workers announce it in a frame.
    pub(super) announces_capacity: bool,
    /// Broken: keep a link open after core let its worker go.
    pub(super) ignores_departures: bool,
    /// A worker asking for a session gets one (the gateway's grace is the one it asked for).
    pub(super) grants_sessions: bool,
    /// Broken: a resuming worker reports no task, letting go of everything it held.
    pub(super) forgets_tasks_on_resume: bool,
}

/// A freshly registered link.
pub(super) struct Opened {
    pub(super) link: Link,
    pub(super) worker: WorkerId,
    pub(super) session: Option<SessionGrant>,
}

/// Everything a worker needs to open links to its gateway, again and again.
#[derive(Clone)]
pub(super) struct Dialer {
    pub(super) core: Core,
    pub(super) caller: CallerIdentity,
    /// What the worker registers (its capacity included, even if the link announces it).
    pub(super) registration: Registration,
    pub(super) policy: Policy,
    /// Fired when the gateway stops: every link it serves ends.
    pub(super) stopped: CancellationToken,
}

impl Dialer {
    /// Registers afresh; resolves once admitted and (for an announcing link) capacity settled.
    pub(super) async fn register(&self) -> Result<Opened, AdmissionError> {
        let capacity = self.registration.max_concurrency;
        let registration = Registration {
            max_concurrency: if self.policy.announces_capacity {
                None
            } else {
                capacity
            },
            reconnect_grace: if self.policy.grants_sessions {
                self.registration.reconnect_grace
            } else {
                Duration::ZERO
            },
            ..self.registration.clone()
        };
        let ends = Ends::new(self.policy.announces_capacity);
        let token = self
            .core
            .registry()
            .admit(&self.caller, registration, ends.delivery())
            .await?;
        let worker = token.worker_id();
        let session = token.session().cloned();
        let link = self.serve(token, ends);
        if let (true, Some(max_concurrency)) = (self.policy.announces_capacity, capacity) {
            let (reply, answer) = oneshot::channel();
            let announced = link
                .outbox
                .send(Frame::Capabilities {
                    max_concurrency,
                    reply,
                })
                .await;
            match (announced, answer.await) {
                (Ok(()), Ok(Ok(()))) => {}
                (_, Ok(Err(refusal))) => return Err(refusal),
                _ => return Err(AdmissionError::UnknownWorker),
            }
        }
        Ok(Opened {
            link,
            worker,
            session,
        })
    }

    /// Resumes a session on a new link; resolves with the tasks the gateway still holds.
    pub(super) async fn resume(
        &self,
        request: ResumeRequest,
    ) -> Result<(Link, Vec<TaskId>), ResumeRefused> {
        let ends = Ends::new(self.policy.announces_capacity);
        let resumed = self
            .core
            .resume(&self.caller, request, ends.delivery())
            .await?;
        // The acknowledgement is "on the wire" once this returns, and anything core sends
        // now waits in the inbox until the worker has reconciled its tasks.
        resumed.token.announce();
        Ok((self.serve(resumed.token, ends), resumed.held))
    }

    /// Starts the gateway's task serving `token` over `ends`; returns the worker's end.
    fn serve(&self, token: RegistrationToken, ends: Ends) -> Link {
        let closed = CancellationToken::new();
        let served = Served {
            token,
            frames: ends.frames,
            acks: ends.to_worker.downgrade(),
            severed: Arc::clone(&ends.severed),
            cut_on_departure: !self.policy.ignores_departures,
            closed: closed.clone().drop_guard(),
        };
        drop(ends.to_worker);
        tokio::spawn(connection::serve(
            self.core.clone(),
            served,
            self.stopped.child_token(),
        ));
        Link {
            inbox: ends.inbox,
            outbox: ends.outbox,
            severed: ends.severed,
            closed,
        }
    }
}

/// The four channel ends of a new link and its cut flag.
struct Ends {
    to_worker: mpsc::Sender<link::Down>,
    inbox: mpsc::Receiver<link::Down>,
    outbox: mpsc::Sender<Frame>,
    frames: mpsc::Receiver<Frame>,
    severed: Arc<AtomicBool>,
    carries_capacity: bool,
}

impl Ends {
    fn new(announces_capacity: bool) -> Self {
        let (to_worker, inbox) = mpsc::channel(link::TO_WORKER);
        let (outbox, frames) = mpsc::channel(link::TO_GATEWAY);
        Self {
            to_worker,
            inbox,
            outbox,
            frames,
            severed: Arc::new(AtomicBool::new(false)),
            carries_capacity: !announces_capacity,
        }
    }

    /// The gateway's delivery leg over this link.
    fn delivery(&self) -> Arc<MemoryDelivery> {
        Arc::new(MemoryDelivery::new(
            self.to_worker.clone(),
            Arc::clone(&self.severed),
            self.carries_capacity,
        ))
    }
}
