//! The worker runtime every Switchyard SDK runs on.
//!
//! A transport SDK is a thin [`Link`]: it opens a connection and registers, turns inbound
//! frames into [`ActivityTask`](switchyard_core::ActivityTask)s for the [`TaskRunner`], and
//! writes the [`TaskReply`]s back. Everything else is written once, here: the
//! [`WorkerOptions`] and their validation, the task runner (concurrency permit, cancellation,
//! panic catching, the result-size check, result or cancel-ack), the [`TaskKeeper`] that owns
//! running tasks and unacknowledged results across connections, the reconnect loop with its
//! jittered [`Backoff`] (resuming the session first when there is one), the [`WorkerHandle`]
//! and the one [`WorkerError`].
//!
//! The loop asks the link how each connection ended ([`ConnectionEnd`]): a requested drain is
//! final, a gateway shutting down or a lost connection brings the worker back with backoff,
//! and a failure the link marks permanent ([`LinkError::is_permanent`]) ends the worker.
//!
//! # Examples
//!
//! A link in memory: it registers once, and its connection ends with a requested drain, so
//! [`Worker::run`] returns `Ok`.
//!
//! ```
//! use bytes::Bytes;
//! use switchyard_core::{ResumeRequest, WorkerId};
//! use switchyard_worker::{
//!     ActivityContext, ActivityError, Link, LinkError, Registered, ConnectionContext, ConnectionEnd,
//!     Worker, WorkerOptions,
//! };
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("never fails")]
//! struct Never;
//!
//! impl LinkError for Never {
//!     fn is_permanent(&self) -> bool {
//!         true
//!     }
//! }
//!
//! struct InMemory;
//!
//! impl Link for InMemory {
//!     type Connection = ();
//!     type Error = Never;
//!     const TRANSPORT: &'static str = "in-memory";
//!     const CAN_DRAIN: bool = false;
//!     const CAN_RESIZE: bool = false;
//!
//!     async fn open(
//!         &self,
//!         options: &WorkerOptions,
//!         _resume: Option<&ResumeRequest>,
//!     ) -> Result<((), Registered), Never> {
//!         let task_queue = options.task_queue.clone();
//!         Ok(((), Registered::new(WorkerId::from_raw(1), task_queue)))
//!     }
//!
//!     async fn serve(&self, (): (), _: ConnectionContext<'_>) -> ConnectionEnd<Never> {
//!         ConnectionEnd::Drained
//!     }
//! }
//!
//! async fn echo(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
//!     Ok(input)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), switchyard_worker::WorkerError> {
//! let mut options = WorkerOptions::default();
//! options.namespaces(["media"]);
//! options.task_queue = "images".into();
//! options.activity("echo", echo);
//! let worker = Worker::connect(InMemory, options).await?;
//! assert_eq!(worker.worker_id(), WorkerId::from_raw(1));
//! assert!(worker.handle().drain().is_err(), "this link cannot drain");
//! worker.run().await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod error;
mod handle;
mod keeper;
mod link;
mod options;
mod reconnect;
mod runner;
mod setters;

pub use error::{LinkError, WorkerError};
pub use handle::WorkerHandle;
pub use keeper::{InlineTask, ReplySink, SinkGuard, TaskKeeper, TaskStarter};
pub use link::{ConnectionContext, ConnectionEnd, Link, Registered};
pub use options::WorkerOptions;
pub use reconnect::Worker;
pub use runner::{RunningTask, TaskReply, TaskRunner};
pub use switchyard_core::{ActivityContext, ActivityError, ActivityHandler, Backoff};
