//! What a worker asks for when it registers, and who is asking.

use std::collections::BTreeSet;

use crate::address::Node;

/// A transport-neutral registration request, as decoded from any transport's first frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registration {
    /// Namespaces the worker serves; it is reachable in each and only these.
    pub namespaces: BTreeSet<String>,
    /// Task queue inside each namespace; empty means the default queue.
    pub task_queue: String,
    /// Optional locality label.
    pub node: Option<Node>,
    /// Activity types the worker runs.
    pub activity_types: BTreeSet<String>,
    /// Free-form name of the worker process (host, pid, build), for operators.
    pub identity: String,
    /// How many tasks the worker runs at once; `None` when the transport announces it later.
    pub max_concurrency: Option<u32>,
}

/// Which namespaces a caller may register workers into or dispatch into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceGrant {
    /// Every namespace.
    All,
    /// Only the listed namespaces.
    Only(BTreeSet<String>),
}

impl NamespaceGrant {
    /// True when `namespace` is inside the grant.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(set) => set.contains(namespace),
        }
    }
}

/// An authenticated caller: the principal a transport established and what it is granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerIdentity {
    /// The authenticated name (certificate subject, token owner, or `anonymous`).
    pub principal: String,
    /// The namespaces this principal may use.
    pub grant: NamespaceGrant,
}

impl CallerIdentity {
    /// A caller granted every namespace (development mode, trusted embedding).
    pub fn trusted(principal: impl Into<String>) -> Self {
        Self {
            principal: principal.into(),
            grant: NamespaceGrant::All,
        }
    }

    /// A caller granted exactly the listed namespaces.
    pub fn granted<I, S>(principal: impl Into<String>, namespaces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            principal: principal.into(),
            grant: NamespaceGrant::Only(namespaces.into_iter().map(Into::into).collect()),
        }
    }
}
