//! Switchyard core: the transport-agnostic heart of the worker gateway.
//!
//! Workers reach core through a transport that implements [`WorkerDelivery`]; every
//! registration passes the one admission gate ([`Registry::admit`]); every dispatch picks its
//! worker through the one selection path ([`Registry::select_and_reserve`]), round-robin per
//! `(namespace, task queue, activity type)`, never beyond a worker's advertised capacity.
//! Core knows no wire format and no socket library.
#![forbid(unsafe_code)]

mod activity;
mod address;
mod admission;
mod arrival;
mod backoff;
mod delivery;
mod dispatcher;
mod durable;
mod eligibility;
mod events;
mod handle;
mod id_hash;
mod liveness;
mod metrics;
mod namespace;
mod outcome;
mod registration;
mod registry;
mod role;
mod session;
#[cfg(feature = "testkit")]
pub mod testkit;
mod throttle;
mod worker;

pub use activity::{ActivityContext, ActivityError, ActivityFuture, ActivityHandler};
pub use address::{
    ActivityKey, DEFAULT_TASK_QUEUE, Node, PoolAddress, WorkerId, normalise_task_queue,
};
pub use admission::{
    AdmissionAudit, AdmissionError, DEFAULT_MAX_CONCURRENCY_LIMIT,
    DEFAULT_MAX_WORKERS_PER_PRINCIPAL, MAX_ACTIVITY_TYPES, MAX_NAME_BYTES, MAX_NAMESPACES,
    MAX_SERVED_PAIRS, RefusalKind,
};
pub use arrival::WorkerArrival;
pub use backoff::Backoff;
pub use delivery::{
    ActivityTask, CancelReason, DeliveryError, TaskId, TransportName, WorkerDelivery, WorkerMessage,
};
pub use dispatcher::{
    BatchCancel, DEFAULT_MAX_HELD_INPUT_BYTES, DEFAULT_MAX_INPUT_BYTES, DEFAULT_MAX_PARKED,
    DeliveredHook, DispatchConfig, DispatchHooks, Dispatcher, Forwarded, LocalBatch, LocalEntry,
    LocalPool, LocalStart, Offered, Overflow, OverflowFuture, OverflowOffer, ParkedHook,
    RefusedCounts, UnservedAddress, UnservedQueue,
};
pub use durable::{
    Awaited, BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchState, DispatchStore,
    DispatchStoreError, DurableConfig, DurableDispatcher, LookupError, MAX_IDEMPOTENCY_KEY_BYTES,
    MemoryDispatchStore, MemoryStoreLimits, NewDispatch, OutcomeRecord, OutcomeWatch, Recorded,
    StoredDispatch, SubmitError, Submitted, WatchEvent, check_idempotency_key,
};
pub use eligibility::{DispatchExclusion, Eligibility};
pub use events::{DisconnectReason, WorkerEvent};
pub use handle::{Core, CoreConfig};
pub use id_hash::{IdBuildHasher, IdHasher, IdMap, IdSet};
pub use liveness::{Liveness, LivenessConfig, LivenessTracker, TickActions};
pub use metrics::{
    ADMISSION_LABELS, ADMISSION_REFUSALS_TOTAL, DEPARTURE_LABELS, DISPATCH_LATENCY_SECONDS,
    DISPATCH_REFUSALS_TOTAL, DISPATCHES_TOTAL, OUTCOME_LABELS, QUOTA_LABELS, REFUSED_RESULT_LABELS,
    RESULTS_AFTER_CANCEL_TOTAL, RESULTS_REFUSED_TOTAL, RESUME_REFUSED_LABELS, RESUME_REFUSED_TOTAL,
    SESSIONS_RESUMED_TOTAL, TASKS_RECLAIMED_TOTAL, UNSERVED_EPISODES_TOTAL, UNSERVED_LABELS,
    WORKER_DEPARTURES_TOTAL, WORKERS_SUSPENDED, register_metrics,
};
pub use namespace::{
    InMemoryNamespaceStore, NamespacePolicy, NamespaceRecord, NamespaceStore, Placement, StoreError,
};
pub use outcome::{
    ActivityOutcome, ActivityRequest, CancelError, CompletionRefused, DispatchError, TaskResult,
};
pub use registration::{CallerIdentity, NamespaceGrant, Registration};
pub use registry::{
    DEFAULT_EVENT_CAPACITY, DEFAULT_MAX_NAMESPACES_LIVE, DEFAULT_NAMESPACE_IDLE_EXPIRY, Departure,
    DepartureObserver, DispatchReservation, MAX_NODE_NUMBER, NamespaceInUse, NamespaceSeries,
    NodeNumber, PoolCensus, PoolWaiter, RegistrationToken, Registry, RegistryBuilder,
    UnservedReason, WORKER_ID_NODE_SHIFT, WorkerExplanation,
};
pub use role::{Role, Roles};
pub use session::{
    MAX_RESUME_TASKS, RESUME_SECRET_BYTES, ResumeRefused, ResumeRequest, ResumeSecret, Resumed,
    SessionGrant,
};
pub use throttle::{DEFAULT_THROTTLE_INTERVAL, KeyedThrottle, Throttle};
pub use worker::{Worker, WorkerSnapshot};
