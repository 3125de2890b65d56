//! Opening a key-value bucket: the one shape every bucket of the cluster has.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

/// How long a bucket's entries live and how many bytes it holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BucketLimits {
    /// Entries older than this are removed (`Duration::ZERO`: kept until deleted).
    pub(crate) max_age: Duration,
    /// At most this many bytes, new entries refused past it (-1: no bound).
    pub(crate) max_bytes: i64,
}

/// Opens (creating if needed) the file-storage bucket `name` of one entry per key, with
/// rollups, no deletes of the stream's messages, and `limits`; `what` names the bucket in
/// errors (e.g. `membership bucket`).
///
/// The bucket's stream is made here rather than with `create_key_value`, which first reads
/// the account info, a reply async-nats 0.42 cannot parse from a 2.9 server; the stream is
/// the one `create_key_value` would make.
pub(crate) async fn open(
    js: &jetstream::Context,
    what: &str,
    name: &str,
    limits: BucketLimits,
) -> Result<kv::Store, String> {
    let stream = jetstream::stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_bytes: limits.max_bytes,
        max_messages: -1,
        max_age: limits.max_age,
        max_message_size: -1,
        storage: jetstream::stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        num_replicas: 1,
        discard: jetstream::stream::DiscardPolicy::New,
        ..jetstream::stream::Config::default()
    };
    js.get_or_create_stream(stream)
        .await
        .map_err(|error| format!("{what} {name}: {error}"))?;
    js.get_key_value(name)
        .await
        .map_err(|error| format!("{what} {name}: {error}"))
}
