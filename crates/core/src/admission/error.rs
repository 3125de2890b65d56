//! Why the admission gate refused a registration.

use crate::address::Node;
use crate::namespace::StoreError;
use crate::role::Role;

/// A registration refused by the admission gate; each variant names the field or rule it broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// A required field was empty.
    #[error("{field} is empty")]
    Empty {
        /// The field.
        field: &'static str,
    },
    /// A list held an empty name (an entry, not the list, is empty).
    #[error("{field} holds an empty entry")]
    EmptyEntry {
        /// The list field.
        field: &'static str,
    },
    /// A name was longer than allowed.
    #[error("{field} entry is {len} bytes, more than the limit of {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A set had more entries than allowed.
    #[error("{field} has {count} entries, more than the limit of {max}")]
    TooMany {
        /// The field.
        field: &'static str,
        /// Its number of entries.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A name held a control character.
    #[error("{field} contains a control character")]
    ControlCharacter {
        /// The field.
        field: &'static str,
    },
    /// The transport carries capacity in its registration and none was given.
    #[error("max_concurrency is required on this transport")]
    MissingCapacity,
    /// Capacity zero was stated, at registration or in a later announcement.
    #[error("max_concurrency 0: a worker must accept at least one task")]
    ZeroCapacity,
    /// A capacity above the registry's ceiling was stated, at registration or in a later
    /// announcement.
    #[error("max_concurrency {max_concurrency} exceeds this gateway's limit of {limit}")]
    CapacityAboveLimit {
        /// The capacity stated.
        max_concurrency: u32,
        /// The ceiling ([`crate::Registry::max_concurrency_limit`]).
        limit: u32,
    },
    /// The caller is not granted one of the namespaces.
    #[error("principal {principal:?} is not granted namespace {namespace:?}")]
    NamespaceNotGranted {
        /// The authenticated caller.
        principal: String,
        /// The first namespace outside its grant.
        namespace: String,
    },
    /// The caller does not hold the role registering a worker needs.
    #[error("principal `{principal}` lacks role `{role}` to register a worker")]
    RoleMissing {
        /// The authenticated caller.
        principal: String,
        /// The role it lacks (`worker`).
        role: Role,
    },
    /// The caller already holds as many registered workers as its quota allows.
    #[error("`principals[].max_workers` ({limit}) reached for principal `{principal}`")]
    PrincipalWorkerLimit {
        /// The authenticated caller.
        principal: String,
        /// Its quota.
        limit: u32,
    },
    /// Closed namespace policy and the namespace does not exist.
    #[error("namespace {namespace:?} does not exist and the namespace policy is closed")]
    UnknownNamespace {
        /// The namespace.
        namespace: String,
    },
    /// A pinned namespace requires a node the worker does not advertise.
    #[error(
        "namespace {namespace:?} is pinned to nodes [{}] and the worker advertises {}",
        required.iter().map(Node::as_str).collect::<Vec<_>>().join(", "),
        node.as_ref().map_or_else(|| "no node".to_owned(), |n| format!("node {:?}", n.as_str()))
    )]
    PlacementViolated {
        /// The pinned namespace.
        namespace: String,
        /// The worker's node, if any.
        node: Option<Node>,
        /// The nodes the namespace is pinned to.
        required: Vec<Node>,
    },
    /// The gateway is shutting down and admits no worker; register again once it is back.
    #[error("the gateway is shutting down; register again once it is back")]
    ShuttingDown,
    /// The worker being announced is not registered.
    #[error("worker is not registered")]
    UnknownWorker,
    /// The namespace store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The registration names a new namespace while `registry.max_namespaces` namespaces
    /// already have workers or dispatches.
    #[error(
        "`registry.max_namespaces` ({limit}) reached: every listed namespace has workers or dispatches"
    )]
    NamespaceLimit {
        /// The configured limit.
        limit: usize,
    },
}

/// The family a refusal belongs to, for transports mapping refusals to wire status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalKind {
    /// The request itself is malformed (validation and capacity).
    Invalid,
    /// The caller may not use a namespace.
    Unauthorised,
    /// A namespace does not exist under a closed policy.
    NotFound,
    /// Placement rules forbid this worker.
    Placement,
    /// The gateway could not decide (store failure).
    Unavailable,
    /// A quota or a limit on what the gateway holds is reached; the same registration may
    /// succeed once the caller (or the gateway) holds less.
    Exhausted,
}

impl AdmissionError {
    /// The refusal's family.
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Empty { .. }
            | Self::EmptyEntry { .. }
            | Self::TooLong { .. }
            | Self::TooMany { .. }
            | Self::ControlCharacter { .. }
            | Self::MissingCapacity
            | Self::ZeroCapacity
            | Self::CapacityAboveLimit { .. }
            | Self::UnknownWorker => RefusalKind::Invalid,
            Self::NamespaceNotGranted { .. } | Self::RoleMissing { .. } => {
                RefusalKind::Unauthorised
            }
            Self::PrincipalWorkerLimit { .. } => RefusalKind::Exhausted,
            Self::UnknownNamespace { .. } => RefusalKind::NotFound,
            Self::PlacementViolated { .. } => RefusalKind::Placement,
            Self::Store(_) | Self::ShuttingDown => RefusalKind::Unavailable,
            Self::NamespaceLimit { .. } => RefusalKind::Exhausted,
        }
    }

    /// A stable lowercase label for metrics (`admission refusals by reason`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Empty { .. } => "empty_field",
            Self::EmptyEntry { .. } => "empty_entry",
            Self::TooLong { .. } => "too_long",
            Self::TooMany { .. } => "too_many",
            Self::ControlCharacter { .. } => "control_character",
            Self::MissingCapacity => "missing_capacity",
            Self::ZeroCapacity => "zero_capacity",
            Self::CapacityAboveLimit { .. } => "capacity_above_limit",
            Self::NamespaceNotGranted { .. } => "namespace_not_granted",
            Self::RoleMissing { .. } => "role_missing",
            Self::PrincipalWorkerLimit { .. } => "principal_max_workers",
            Self::UnknownNamespace { .. } => "unknown_namespace",
            Self::PlacementViolated { .. } => "placement_violated",
            Self::UnknownWorker => "unknown_worker",
            Self::Store(_) => "store_error",
            Self::ShuttingDown => "shutting_down",
            Self::NamespaceLimit { .. } => "namespace_limit",
        }
    }
}
