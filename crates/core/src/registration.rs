//! What a worker asks for when it registers, and who is asking.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::address::Node;
use crate::role::{Role, Roles};

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
    /// How long the worker's session outlives a lost connection ([`crate::SessionGrant`]);
    /// `ZERO` (the default) for no session: the worker leaves when its connection ends. A
    /// transport sets its configured grace when the worker said it can resume.
    pub reconnect_grace: Duration,
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

/// An authenticated caller: the principal a transport established, where it may act (its
/// namespace grant), what it may do there (its roles) and its quotas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerIdentity {
    /// The authenticated name (certificate subject, token owner, or `anonymous`).
    pub principal: String,
    /// The namespaces this principal may use.
    pub grant: NamespaceGrant,
    /// What this principal may do in those namespaces.
    pub roles: Roles,
    /// The most workers this principal may have registered at once; `None` for no bound.
    pub max_workers: Option<u32>,
}

impl CallerIdentity {
    /// A caller granted every namespace and every role, with no worker bound (development mode,
    /// trusted embedding).
    pub fn trusted(principal: impl Into<String>) -> Self {
        Self {
            principal: principal.into(),
            grant: NamespaceGrant::All,
            roles: Roles::ADMIN,
            max_workers: None,
        }
    }

    /// A caller granted exactly the listed namespaces, with every role there and no worker
    /// bound; narrow it with [`CallerIdentity::with_roles`] and
    /// [`CallerIdentity::with_max_workers`].
    pub fn granted<I, S>(principal: impl Into<String>, namespaces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            grant: NamespaceGrant::Only(namespaces.into_iter().map(Into::into).collect()),
            ..Self::trusted(principal)
        }
    }

    /// The same caller holding exactly `roles`.
    pub fn with_roles(mut self, roles: impl IntoIterator<Item = Role>) -> Self {
        self.roles = roles.into_iter().collect();
        self
    }

    /// The same caller limited to `max_workers` registered workers at once.
    pub fn with_max_workers(mut self, max_workers: u32) -> Self {
        self.max_workers = Some(max_workers);
        self
    }

    /// True when the caller holds `role` (or `admin`).
    pub fn has_role(&self, role: Role) -> bool {
        self.roles.allows(role)
    }

    /// True when the caller operates `namespace`: it is granted it and holds `operator`.
    pub fn operates(&self, namespace: &str) -> bool {
        self.has_role(Role::Operator) && self.grant.allows(namespace)
    }
}
