//! The producer and operator gRPC API (`switchyard.v1.Gateway`), served next to the gRPC
//! worker service on one port.
//!
//! Callers are identified like workers ([`crate::auth`]); a caller only reaches the
//! namespaces its principal is granted, and only the RPCs its roles allow ([`access`]). Every
//! dispatch goes through core's one dispatcher ([`run`]: a durable one through core's durable
//! dispatcher first, [`durable`] for the RPCs on durable dispatches), and every outcome and
//! refusal reaches the wire through one mapping ([`outcome`]).

mod access;
mod caller;
mod cluster_answer;
mod cluster_drain;
mod cluster_views;
mod convert;
mod dispatch_info;
mod drain;
mod durability;
mod durable;
mod outcome;
mod oversized;
mod run;
mod service;
mod stream;

pub(crate) use caller::identify;
pub(crate) use cluster_answer::ViewsHandler;
pub(crate) use cluster_views::ClusterViews;
pub(crate) use convert::unix_ms;
pub(crate) use durability::DurabilityDefaults;
pub(crate) use oversized::OversizedAsExhausted;
pub use service::{ApiConfig, GatewayApi};
