//! The worker runtime every Switchyard SDK runs on.
//!
//! A transport SDK is a thin [`Link`]: it opens a connection and registers, turns inbound
//! frames into [`ActivityTask`](switchyard_core::ActivityTask)s for the [`TaskRunner`], and
//! writes the [`TaskReply`]s back. Everything else is written once, here: the
//! [`WorkerOptions`] and their validation, the task runner (concurrency permit, cancellation,
//! panic catching, the result-size check, result or cancel-ack), the reconnect loop with its
//! jittered [`Backoff`], the [`WorkerHandle`] and the one [`WorkerError`].
//!
//! The loop asks the link how each session ended ([`SessionEnd`]): a requested drain is
//! final, a gateway shutting down or a lost connection brings the worker back with backoff,
//! and a failure the link marks permanent ([`LinkError::is_permanent`]) ends the worker.
#![forbid(unsafe_code)]

mod error;
mod handle;
mod link;
mod options;
mod reconnect;
mod runner;

pub use error::{LinkError, WorkerError};
pub use handle::WorkerHandle;
pub use link::{Link, Registered, SessionContext, SessionEnd};
pub use options::WorkerOptions;
pub use reconnect::Worker;
pub use runner::{RunningTask, TaskReply, TaskRunner};
pub use switchyard_core::{ActivityContext, ActivityError, ActivityHandler, Backoff};
