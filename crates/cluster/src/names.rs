//! Every subject and bucket name the cluster uses, in one place.
//!
//! Subjects: `switchyard.<cluster>.offer.<pool hash>` (offers, queue group `takers`),
//! `switchyard.<cluster>.capacity.<pool hash>` (a node gained a free slot for the pool),
//! `switchyard.<cluster>.node.<node>.outcome`, `.cancel` and `.admin` (addressed to one node),
//! `switchyard.<cluster>.cancel` (a cancel whose taker is unknown). Buckets:
//! `switchyard_<cluster>_nodes` (membership), `switchyard_<cluster>_numbers` (worker-id
//! numbers); with the jetstream dispatch store `switchyard_<cluster>_dispatches`, `_outcomes`,
//! `_idempotency` and `_queued`.

/// The queue group every node's offer subscriptions join: one taker per offer.
pub(crate) const TAKERS: &str = "takers";

/// Checks a cluster or node name: 1–64 ASCII letters, digits, `-` or `_` (a subject token
/// and a key-value key, with no wildcard or separator).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty".to_owned());
    }
    if name.len() > 64 {
        return Err(format!("{} bytes, more than the limit of 64", name.len()));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        Some(c) => Err(format!("{c:?} is not a letter, digit, '-' or '_'")),
        None => Ok(()),
    }
}

/// A pool's subject token: FNV-1a 64 of `namespace`, task queue, activity type and node pin,
/// each followed by a zero byte, in hex. Stable across nodes and releases.
pub fn pool_hash(
    namespace: &str,
    task_queue: &str,
    activity_type: &str,
    node: Option<&str>,
) -> String {
    format!(
        "{:016x}",
        pool_key(namespace, task_queue, activity_type, node)
    )
}

/// The number [`pool_hash`] writes in hex (a key without an allocation).
pub(crate) fn pool_key(
    namespace: &str,
    task_queue: &str,
    activity_type: &str,
    node: Option<&str>,
) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [namespace, task_queue, activity_type, node.unwrap_or("")] {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The names of one cluster.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    cluster: String,
}

impl Names {
    pub(crate) fn new(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
        }
    }

    pub(crate) fn members_bucket(&self) -> String {
        format!("switchyard_{}_nodes", self.cluster)
    }

    pub(crate) fn numbers_bucket(&self) -> String {
        format!("switchyard_{}_numbers", self.cluster)
    }

    /// The durable dispatches not finished, by id (the jetstream dispatch store).
    pub(crate) fn dispatches_bucket(&self) -> String {
        format!("switchyard_{}_dispatches", self.cluster)
    }

    /// The durable dispatches' one outcome each, by id.
    pub(crate) fn outcomes_bucket(&self) -> String {
        format!("switchyard_{}_outcomes", self.cluster)
    }

    /// Producers' idempotency keys, per namespace, to the id recorded with each.
    pub(crate) fn idempotency_bucket(&self) -> String {
        format!("switchyard_{}_idempotency", self.cluster)
    }

    /// Each namespace's count of unfinished durable dispatches (`max_queued_per_namespace`).
    pub(crate) fn queued_bucket(&self) -> String {
        format!("switchyard_{}_queued", self.cluster)
    }

    pub(crate) fn offer(&self, pool: &str) -> String {
        format!("switchyard.{}.offer.{pool}", self.cluster)
    }

    pub(crate) fn capacity(&self, pool: &str) -> String {
        format!("switchyard.{}.capacity.{pool}", self.cluster)
    }

    pub(crate) fn all_capacity(&self) -> String {
        format!("switchyard.{}.capacity.*", self.cluster)
    }

    pub(crate) fn outcome(&self, node: &str) -> String {
        format!("switchyard.{}.node.{node}.outcome", self.cluster)
    }

    pub(crate) fn cancel(&self, node: &str) -> String {
        format!("switchyard.{}.node.{node}.cancel", self.cluster)
    }

    /// Admin calls addressed to `node` (cluster-wide views, drains).
    pub(crate) fn admin(&self, node: &str) -> String {
        format!("switchyard.{}.node.{node}.admin", self.cluster)
    }

    /// Cancels for an offer whose taker the origin never learned (its answer was still on
    /// the way, or lost): every node hears them.
    pub(crate) fn cancel_unaddressed(&self) -> String {
        format!("switchyard.{}.cancel", self.cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_hash_separates_its_parts() {
        let a = pool_hash("ns", "q", "act", None);
        assert_eq!(a, pool_hash("ns", "q", "act", None), "stable");
        assert_eq!(a.len(), 16);
        // Control: moving a byte from one part to the next changes the hash.
        assert_ne!(a, pool_hash("n", "sq", "act", None));
        assert_ne!(a, pool_hash("ns", "q", "act", Some("rack1")));
    }

    /// Operators and other tools find the cluster's state by these names: they are the ones
    /// `docs/cluster.md` lists, letter for letter.
    #[test]
    fn the_subjects_and_buckets_are_the_documented_ones() {
        let names = Names::new("c");
        let documented = [
            (names.members_bucket(), "switchyard_c_nodes"),
            (names.numbers_bucket(), "switchyard_c_numbers"),
            (names.dispatches_bucket(), "switchyard_c_dispatches"),
            (names.outcomes_bucket(), "switchyard_c_outcomes"),
            (names.idempotency_bucket(), "switchyard_c_idempotency"),
            (names.queued_bucket(), "switchyard_c_queued"),
            (names.offer("p"), "switchyard.c.offer.p"),
            (names.capacity("p"), "switchyard.c.capacity.p"),
            (names.all_capacity(), "switchyard.c.capacity.*"),
            (names.outcome("n"), "switchyard.c.node.n.outcome"),
            (names.cancel("n"), "switchyard.c.node.n.cancel"),
            (names.admin("n"), "switchyard.c.node.n.admin"),
            (names.cancel_unaddressed(), "switchyard.c.cancel"),
        ];
        for (name, expected) in documented {
            assert_eq!(name, expected);
        }
    }

    #[test]
    fn names_are_subject_tokens() {
        assert_eq!(check_name("node-a_1"), Ok(()));
        assert!(check_name("a.b").is_err());
        assert!(check_name("*").is_err());
        assert!(check_name("").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
    }

    /// `docs/cluster.md`: FNV-1a 64 over the four parts, each followed by a zero byte, in
    /// hex: values computed apart from this code, so a change of hash breaks them.
    #[test]
    fn the_pool_hash_is_fnv_1a_of_its_parts() {
        assert_eq!(
            pool_hash("payments", "default", "charge", None),
            "6761c1e19d3b91f1"
        );
        assert_eq!(
            pool_hash("payments", "default", "charge", Some("n1")),
            "ea5a14046a90949e"
        );
    }
}
