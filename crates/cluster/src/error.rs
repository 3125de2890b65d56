//! Why a node could not join its cluster.

/// Why [`Cluster::start`](crate::Cluster::start) refused to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// Another live node holds this node name.
    #[error("cluster {cluster}: node name {node:?} is held by a live node ({holder})")]
    NodeNameTaken {
        /// The cluster.
        cluster: String,
        /// The contested name.
        node: String,
        /// What the holder published about itself.
        holder: String,
    },
    /// A name breaks the subject rules.
    #[error("cluster.{field}: {problem}")]
    InvalidName {
        /// `name` or `node`.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The NATS options could not be built (a credentials file that cannot be read).
    #[error("cluster: {0}")]
    Options(String),
}
