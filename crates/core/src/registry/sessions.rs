//! Suspension, resume and grace expiry of session workers: the registry's half of
//! [`crate::session`].
//!
//! A session worker whose connection ends without a drain is suspended, not removed: it keeps
//! its entry (slots, in-flight count, rotations) but stands [`Eligibility::Suspended`] and its
//! [`SessionLeg`] is detached. A resume attaches the new connection's leg under a new
//! generation; a token of an older generation can no longer suspend or remove the worker. A
//! timer per suspension removes the worker as [`DisconnectReason::ReconnectGraceExpired`]
//! unless a resume came first.
//!
//! [`Eligibility::Suspended`]: crate::Eligibility::Suspended

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::departure::departure;
use super::{Inner, RegistrationToken};
use crate::address::WorkerId;
use crate::delivery::WorkerDelivery;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::metrics::{RESUME_REFUSED_TOTAL, SESSIONS_RESUMED_TOTAL, WORKERS_SUSPENDED};
use crate::registration::CallerIdentity;
use crate::session::{MAX_RESUME_TASKS, ResumeRefused, ResumeRequest, SessionGrant, SessionLeg};

/// A session worker's session, kept in its registry entry.
pub(crate) struct SessionState {
    pub(crate) grant: SessionGrant,
    pub(crate) leg: Arc<SessionLeg>,
    /// Bumped by each resume; a token carries the generation it was issued for.
    pub(crate) generation: u64,
    /// Set while suspended: when the grace ends.
    pub(crate) suspended_until: Option<Instant>,
    /// Set by a resume until the transport announces the new connection.
    pub(crate) resuming: bool,
}

impl super::workers::WorkerEntry {
    /// True while the worker's session waits for a resume.
    pub(crate) fn is_suspended(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|session| session.suspended_until.is_some())
    }
}

/// What ending one connection of a worker comes to.
enum Ending {
    /// The token is of an older generation (a resume replaced it), or the worker is already
    /// suspended: nothing to do.
    Stale,
    /// The worker was suspended for `grace`, until `until`; the connection's departure, when
    /// its transport must close a connection that may still be open.
    Suspended {
        grace: Duration,
        until: Instant,
        close: Option<super::departure::DepartureSender>,
    },
    /// The worker leaves.
    Deregister,
}

/// A resume the registry accepted, before the dispatcher reconciles the held tasks.
pub(crate) struct Reattached {
    pub(crate) token: RegistrationToken,
    pub(crate) grant: SessionGrant,
    pub(crate) task_queue: String,
    pub(crate) capacity: Option<u32>,
}

impl Inner {
    /// The connection of `generation` of `worker` ended with `reason`: a session worker whose
    /// connection was lost (`Disconnect`) or fell silent (`Timeout`, from the liveness prober),
    /// not draining, the gateway not closing, its acknowledgement sent, is suspended; anything
    /// else leaves. Returns whether the worker was suspended or removed.
    pub(crate) fn connection_ended(
        self: &Arc<Self>,
        worker: WorkerId,
        generation: u64,
        reason: DisconnectReason,
    ) -> bool {
        let ending = {
            let mut state = self.lock();
            let closed = state.closed;
            match state.workers.get_mut(worker) {
                None => Ending::Deregister,
                Some(entry) => {
                    let draining = entry.draining;
                    let announced = entry.announced;
                    match entry.session.as_mut() {
                        None => Ending::Deregister,
                        Some(session) if session.generation != generation => Ending::Stale,
                        Some(session) if session.suspended_until.is_some() => Ending::Stale,
                        // A first registration lost before its acknowledgement went out: the
                        // worker never learnt its secret, so nobody could resume it.
                        Some(session) if !announced && !session.resuming => Ending::Deregister,
                        Some(_) if !suspends(reason) || draining || closed => Ending::Deregister,
                        Some(session) => {
                            let grace = session.grant.grace;
                            let until = Instant::now() + grace;
                            session.suspended_until = Some(until);
                            session.resuming = false;
                            session.leg.detach();
                            // A silent connection may still be open: its transport closes it.
                            let close = (reason == DisconnectReason::Timeout)
                                .then(|| entry.departure.take())
                                .flatten();
                            state.refresh_id(worker);
                            Ending::Suspended {
                                grace,
                                until,
                                close,
                            }
                        }
                    }
                }
            }
        };
        match ending {
            Ending::Stale => false,
            Ending::Deregister => self.deregister(worker, reason),
            Ending::Suspended {
                grace,
                until,
                close,
            } => {
                tracing::info!(worker = %worker, grace_ms = grace.as_millis() as u64,
                    reason = reason.as_str(),
                    "worker connection lost; session suspended until it resumes or the grace ends");
                if let Some(departure) = close {
                    departure.depart(reason);
                }
                metrics::gauge!(WORKERS_SUSPENDED).increment(1.0);
                self.emit(WorkerEvent::Suspended { worker, grace });
                self.expire_at(worker, generation, until);
                true
            }
        }
    }

    /// The liveness prober found `worker` silent for its whole window: a session worker is
    /// suspended (its connection closed by its transport), anything else leaves as `Timeout`.
    pub(crate) fn timed_out(self: &Arc<Self>, worker: WorkerId) -> bool {
        let generation = {
            let state = self.lock();
            state
                .workers
                .get(worker)
                .and_then(|entry| entry.session.as_ref())
                .map(|session| session.generation)
        };
        match generation {
            Some(generation) => {
                self.connection_ended(worker, generation, DisconnectReason::Timeout)
            }
            None => self.deregister(worker, DisconnectReason::Timeout),
        }
    }

    /// Starts the timer that ends the suspension of `generation` of `worker` at `until`: the
    /// instant the worker's snapshot counts down to, however late the timer task first runs.
    fn expire_at(self: &Arc<Self>, worker: WorkerId, generation: u64, until: Instant) {
        let weak: Weak<Self> = Arc::downgrade(self);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep_until(until).await;
                    if let Some(inner) = weak.upgrade() {
                        inner.grace_ended(worker, generation);
                    }
                });
            }
            // No runtime to wait on: the grace cannot be kept, so the worker leaves now.
            Err(_) => self.grace_ended(worker, generation),
        }
    }

    /// Removes `worker` as `ReconnectGraceExpired` if it is still suspended in `generation`.
    fn grace_ended(&self, worker: WorkerId, generation: u64) {
        let removed = {
            let mut state = self.lock();
            let expired = state.workers.get(worker).is_some_and(|entry| {
                entry.session.as_ref().is_some_and(|session| {
                    session.generation == generation && session.suspended_until.is_some()
                })
            });
            if expired {
                state.remove(worker, Instant::now())
            } else {
                None
            }
        };
        if let Some(entry) = removed {
            self.farewell(entry, DisconnectReason::ReconnectGraceExpired);
        }
    }

    /// Checks `request` against the session and, if it may resume, attaches `delivery` under a
    /// new generation. The worker is not dispatched to until the new token is announced. A
    /// refusal changes nothing.
    pub(crate) fn reattach(
        self: &Arc<Self>,
        caller: &CallerIdentity,
        request: &ResumeRequest,
        delivery: Arc<dyn WorkerDelivery>,
    ) -> Result<Reattached, ResumeRefused> {
        for (field, count) in [
            ("running", request.running.len()),
            ("unacked", request.unacked.len()),
        ] {
            if count > MAX_RESUME_TASKS {
                return Err(ResumeRefused::TooManyTasks {
                    field,
                    count,
                    limit: MAX_RESUME_TASKS,
                });
            }
        }
        let session_id = request.session_id;
        let (new_sender, departure) = departure();
        let (reattached, superseded, was_suspended) = {
            let mut state = self.lock();
            if state.closed {
                return Err(ResumeRefused::ShuttingDown);
            }
            let entry = state
                .workers
                .get_mut(session_id)
                .ok_or(ResumeRefused::UnknownSession { session_id })?;
            let draining = entry.draining;
            let principal_matches = entry.worker.principal() == caller.principal;
            let capacity = entry.capacity.map(std::num::NonZeroU32::get);
            let task_queue = entry.worker.task_queue().to_owned();
            let session = entry
                .session
                .as_mut()
                .ok_or(ResumeRefused::UnknownSession { session_id })?;
            if session.leg.transport() != delivery.transport() {
                return Err(ResumeRefused::UnknownSession { session_id });
            }
            if !session.grant.secret.matches(&request.secret) {
                return Err(ResumeRefused::WrongSecret { session_id });
            }
            if !principal_matches {
                return Err(ResumeRefused::WrongPrincipal { session_id });
            }
            if draining {
                return Err(ResumeRefused::Draining { session_id });
            }
            session.generation += 1;
            let generation = session.generation;
            let was_suspended = session.suspended_until.take().is_some();
            session.resuming = true;
            session.leg.stage(delivery);
            let grant = session.grant.clone();
            entry.announced = false;
            let superseded = entry.departure.replace(new_sender);
            state.refresh_id(session_id);
            let token = RegistrationToken::new(Arc::clone(self), session_id, departure)
                .with_session(grant.clone(), generation);
            (
                Reattached {
                    token,
                    grant,
                    task_queue,
                    capacity,
                },
                superseded,
                was_suspended,
            )
        };
        if was_suspended {
            metrics::gauge!(WORKERS_SUSPENDED).decrement(1.0);
        } else if let Some(old) = &superseded {
            tracing::info!(worker = %session_id,
                "session resumed while its old connection was still up; closing the old one");
            old.depart(DisconnectReason::Superseded);
        }
        metrics::counter!(SESSIONS_RESUMED_TOTAL).increment(1);
        tracing::info!(worker = %session_id, was_suspended, "session resumed");
        Ok(reattached)
    }

    /// Queues `messages` for the resumed `worker`, sent first once its connection is
    /// announced. They replace any queued by an earlier resume whose connection was lost before
    /// its announcement: each resume re-derives every cancel still owed.
    pub(crate) fn queue_after_resume(
        &self,
        worker: WorkerId,
        messages: Vec<crate::delivery::WorkerMessage>,
    ) {
        let leg = {
            let state = self.lock();
            state
                .workers
                .get(worker)
                .and_then(|entry| entry.session.as_ref())
                .map(|session| Arc::clone(&session.leg))
        };
        if let Some(leg) = leg {
            leg.stage_first(messages);
        }
    }

    /// Counts and logs a refused resume.
    pub(crate) fn resume_refused(&self, caller: &CallerIdentity, refusal: &ResumeRefused) {
        metrics::counter!(RESUME_REFUSED_TOTAL, "reason" => refusal.label()).increment(1);
        tracing::info!(principal = %caller.principal, %refusal, "resume refused");
    }
}

/// True for the ends of a connection that suspend a session worker rather than remove it: the
/// connection was lost, or fell silent.
fn suspends(reason: DisconnectReason) -> bool {
    matches!(
        reason,
        DisconnectReason::Disconnect | DisconnectReason::Timeout
    )
}
