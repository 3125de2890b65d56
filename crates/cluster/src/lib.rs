//! Cluster mode: several `switchyard serve` nodes act as one gateway, over NATS.
//!
//! A node joins with [`Cluster::start`]: it holds its node name in the membership bucket (a
//! key-value bucket whose entries age out, refreshed while the node lives), and installs an
//! [`Overflow`](switchyard_core::Overflow) on the dispatcher, so an ephemeral dispatch that
//! finds no local worker is offered to the nodes that have a free slot for its pool. Local
//! first: a dispatch a local worker takes sends nothing to NATS. While NATS is unreachable the
//! node keeps serving its own workers, reports itself degraded ([`ClusterStatus`]) and rejoins
//! by itself. [`Admin`] carries cluster-wide views and drains: one node asks every other.
//! `docs/cluster.md` has the design: subjects, buckets, failure cases.

#![forbid(unsafe_code)]

mod admin;
mod cluster;
mod config;
mod error;
mod forward;
mod hints;
mod id_hash;
mod kv_bucket;
mod leave;
mod members;
mod membership;
mod names;
mod numbers;
mod offers;
mod slots;
mod status;
mod store;
mod taker;
mod wire;

pub use admin::{
    ASK_TIMEOUT, Admin, AdminCall, AdminHandler, Gathered, MAX_ASKING, MAX_SERVING, NodeAnswer,
    SilentNode,
};
pub use cluster::Cluster;
pub use config::{ClusterConfig, DEFAULT_OFFER_HOLD, default_node_name};
pub use error::JoinError;
pub use members::NodeInfo;
pub use names::{check_name, pool_hash};
pub use status::{ClusterStatus, Standing};
pub use store::{JetStreamLimits, JetStreamStore, StoreOpenError};
pub use taker::OFFER_POOLS;
