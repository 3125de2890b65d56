//! Sessions: what lets a worker whose connection broke come back as itself.
//!
//! A worker that registers as resumable on a transport with a reconnect grace gets a session:
//! its worker id is the session id, and a random [`ResumeSecret`] proves it. When its
//! connection ends without a drain it is suspended (not eligible, keeping its slots and held
//! tasks) for the grace; a new connection that presents the id and secret from the same
//! principal ([`ResumeRequest`]) resumes it ([`Resumed`]), and after the grace it is
//! deregistered as [`DisconnectReason::ReconnectGraceExpired`](crate::DisconnectReason).

mod leg;

use std::fmt;
use std::time::Duration;

use rand::RngCore;

use crate::address::WorkerId;
use crate::delivery::TaskId;
use crate::registry::RegistrationToken;
pub(crate) use leg::SessionLeg;

/// Length of a resume secret, in bytes.
pub const RESUME_SECRET_BYTES: usize = 32;

/// The most task ids one resume request may list in each of its two sets.
pub const MAX_RESUME_TASKS: usize = 65_536;

/// The unguessable proof that a connection may resume a session; never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct ResumeSecret([u8; RESUME_SECRET_BYTES]);

impl ResumeSecret {
    /// A fresh secret from the thread's cryptographically secure generator.
    pub(crate) fn generate() -> Self {
        let mut bytes = [0_u8; RESUME_SECRET_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// The secret's bytes, as carried on the wire.
    pub fn as_bytes(&self) -> &[u8; RESUME_SECRET_BYTES] {
        &self.0
    }

    /// The secret in `bytes`; `None` unless it is exactly [`RESUME_SECRET_BYTES`] long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// True when `presented` is this secret; takes the same time wherever they differ.
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        if presented.len() != RESUME_SECRET_BYTES {
            return false;
        }
        let difference = self
            .0
            .iter()
            .zip(presented)
            .fold(0_u8, |acc, (a, b)| acc | (a ^ b));
        difference == 0
    }
}

impl fmt::Debug for ResumeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResumeSecret(..)")
    }
}

/// What a session worker's acknowledgement carries so that it can resume later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionGrant {
    /// The session's id: the worker id.
    pub session_id: WorkerId,
    /// The secret a resuming connection presents.
    pub secret: ResumeSecret,
    /// How long the session outlives a lost connection.
    pub grace: Duration,
}

/// What a reconnecting worker presents to resume its session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeRequest {
    /// The session (worker id) to resume.
    pub session_id: WorkerId,
    /// The secret from the session's acknowledgement, as the worker sent it.
    pub secret: Vec<u8>,
    /// Tasks the worker is still running.
    pub running: Vec<TaskId>,
    /// Tasks whose results the worker sent and never saw acknowledged.
    pub unacked: Vec<TaskId>,
}

/// A session resumed on a new connection.
#[derive(Debug)]
pub struct Resumed {
    /// The worker's registration, now on the new connection; same worker id. Not dispatched
    /// to until [`RegistrationToken::announce`].
    pub token: RegistrationToken,
    /// The tasks the gateway still waits on from this worker (of those it listed); the worker
    /// lets go of every other task it listed.
    pub held: Vec<TaskId>,
    /// The session, unchanged.
    pub grant: SessionGrant,
    /// The worker's task queue (normalised, never empty).
    pub task_queue: String,
    /// The worker's capacity in force, if announced.
    pub capacity: Option<u32>,
}

/// Why a resume was refused; the worker should register afresh. No state changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeRefused {
    /// No such session: it expired, never existed, or lived in another gateway process.
    #[error(
        "resume refused: unknown_session: no session {session_id} (expired, or never on this gateway)"
    )]
    UnknownSession {
        /// The session asked for.
        session_id: WorkerId,
    },
    /// The secret does not match the session's.
    #[error("resume refused: wrong_secret: the resume secret does not match session {session_id}")]
    WrongSecret {
        /// The session asked for.
        session_id: WorkerId,
    },
    /// Another principal registered the session.
    #[error("resume refused: wrong_principal: session {session_id} belongs to another principal")]
    WrongPrincipal {
        /// The session asked for.
        session_id: WorkerId,
    },
    /// The session's worker is being drained; it takes no new connection.
    #[error("resume refused: draining: session {session_id} is being drained")]
    Draining {
        /// The session asked for.
        session_id: WorkerId,
    },
    /// The gateway is shutting down.
    #[error("resume refused: shutting_down: the gateway is shutting down")]
    ShuttingDown,
    /// A task list is longer than [`MAX_RESUME_TASKS`].
    #[error(
        "resume refused: too_many_tasks: `{field}` lists {count} task ids, more than the limit of {limit}"
    )]
    TooManyTasks {
        /// `running` or `unacked`.
        field: &'static str,
        /// How many it listed.
        count: usize,
        /// [`MAX_RESUME_TASKS`].
        limit: usize,
    },
}

impl ResumeRefused {
    /// A short label for metrics and the wire.
    pub fn label(&self) -> &'static str {
        match self {
            Self::UnknownSession { .. } => "unknown_session",
            Self::WrongSecret { .. } => "wrong_secret",
            Self::WrongPrincipal { .. } => "wrong_principal",
            Self::Draining { .. } => "draining",
            Self::ShuttingDown => "shutting_down",
            Self::TooManyTasks { .. } => "too_many_tasks",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_matches_only_itself_and_never_prints() {
        let secret = ResumeSecret::generate();
        assert!(secret.matches(secret.as_bytes()));
        let mut other = *secret.as_bytes();
        other[31] ^= 1;
        assert!(!secret.matches(&other), "one bit off");
        assert!(!secret.matches(&secret.as_bytes()[..31]), "too short");
        assert_ne!(ResumeSecret::generate(), secret, "fresh secrets differ");
        assert_eq!(format!("{secret:?}"), "ResumeSecret(..)");
        assert_eq!(ResumeSecret::from_slice(secret.as_bytes()), Some(secret));
        assert_eq!(ResumeSecret::from_slice(&[0; 31]), None);
    }
}
