//! `store.max_queued_per_namespace` across the cluster: one count of unfinished dispatches
//! per namespace in the `switchyard_<cluster>_queued` bucket, changed only by
//! compare-and-set (an update naming the revision read, or a create).
//!
//! A submission adds one before its dispatch is recorded and the node that records the
//! dispatch's outcome (exactly one: the outcomes bucket's create) takes one away, so
//! concurrent submissions on any nodes never take the count past the limit: of two that read
//! the same revision, one write fails and reads again. A node that dies between its count
//! and its record (or between an outcome and its count) leaves the count one too high: the
//! namespace is refused one dispatch early, never admitted one too many.

use async_nats::jetstream::kv;
use bytes::Bytes;
use switchyard_core::DispatchStoreError;

use super::buckets::unavailable;

/// Compare-and-set attempts before a count that keeps changing is given up on.
const CAS_TRIES: usize = 64;

/// The per-namespace counts of unfinished dispatches and their bound.
#[derive(Debug)]
pub(super) struct Quota {
    counts: kv::Store,
    limit: u64,
}

/// What one compare-and-set attempt found.
enum Attempt {
    Done,
    Raced,
}

impl Quota {
    /// Counts in `counts`, refusing past `limit`.
    pub(super) fn new(counts: kv::Store, limit: u64) -> Self {
        Self { counts, limit }
    }

    /// Counts one more unfinished dispatch in `namespace`, or refuses it (`QueueFull`) when
    /// the namespace already has `limit`.
    pub(super) async fn take(&self, namespace: &str) -> Result<(), DispatchStoreError> {
        self.change(namespace, |count| {
            if count >= self.limit {
                Err(DispatchStoreError::QueueFull {
                    namespace: namespace.to_owned(),
                    limit: self.limit,
                })
            } else {
                Ok(count + 1)
            }
        })
        .await
    }

    /// Counts one unfinished dispatch fewer in `namespace`; a failure is logged (the count
    /// stays one too high).
    pub(super) async fn give_back(&self, namespace: &str) {
        let result = self
            .change(namespace, |count| Ok(count.saturating_sub(1)))
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, %namespace,
                "store.max_queued_per_namespace: the namespace's count was not lowered");
        }
    }

    async fn read(&self, key: &str) -> Result<(u64, Option<u64>), DispatchStoreError> {
        let entry = self
            .counts
            .entry(key)
            .await
            .map_err(unavailable("queued"))?;
        Ok(match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                (parse(&entry.value), Some(entry.revision))
            }
            Some(entry) => (0, Some(entry.revision)),
            None => (0, None),
        })
    }

    async fn change(
        &self,
        namespace: &str,
        next: impl Fn(u64) -> Result<u64, DispatchStoreError>,
    ) -> Result<(), DispatchStoreError> {
        let key = key(namespace);
        for _ in 0..CAS_TRIES {
            let (count, revision) = self.read(&key).await?;
            let value = Bytes::from(next(count)?.to_string());
            let attempt = match revision {
                Some(revision) => match self.counts.update(&key, value, revision).await {
                    Ok(_) => Attempt::Done,
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Attempt::Raced,
                    Err(e) => return Err(unavailable("queued")(e)),
                },
                None => match self.counts.create(&key, value).await {
                    Ok(_) => Attempt::Done,
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Attempt::Raced,
                    Err(e) => return Err(unavailable("queued")(e)),
                },
            };
            if let Attempt::Done = attempt {
                return Ok(());
            }
        }
        Err(DispatchStoreError::Unavailable {
            detail: format!(
                "jetstream queued: the count of namespace {namespace:?} changed under each of \
                 {CAS_TRIES} tries"
            ),
        })
    }
}

/// The bucket key of `namespace`'s count: the namespace in hex (a key allows only letters,
/// digits and a few marks).
fn key(namespace: &str) -> String {
    let hex: String = namespace.bytes().map(|b| format!("{b:02x}")).collect();
    if hex.is_empty() { "-".to_owned() } else { hex }
}

/// A stored count; an unreadable one counts as 0 (and is overwritten by the next change).
fn parse(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bucket_safe_and_distinct_per_namespace() {
        assert_eq!(key("ns"), "6e73");
        assert_ne!(key("a.b"), key("a_b"));
        // Control: the empty namespace still has a valid key.
        assert_eq!(key(""), "-");
    }

    #[test]
    fn an_unreadable_count_reads_as_zero() {
        assert_eq!(parse(b"17"), 17);
        assert_eq!(parse(b"seventeen"), 0);
    }

    /// `docs/cluster.md`: a count that keeps changing is given up on after 64 tries.
    #[test]
    fn a_count_is_tried_at_most_the_documented_64_times() {
        assert_eq!(CAS_TRIES, 64);
    }
}
