//! The jetstream store's buckets and their entries: opening a bucket, listing it, keys, and
//! the store errors its failures become.

use async_nats::jetstream::{self, kv};
use futures::TryStreamExt;
use switchyard_core::{DispatchId, DispatchState, DispatchStoreError, OutcomeRecord};

use super::codec::{Row, decode};

/// Opens (creating if needed) a file-storage bucket of one entry per key holding at most
/// `max_bytes` (-1: no bound). Made as a stream rather than with `create_key_value`, which
/// first reads the account info, a reply async-nats 0.42 cannot parse from a 2.9 server.
pub(super) async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_bytes: i64,
) -> Result<kv::Store, String> {
    let stream = jetstream::stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_bytes,
        max_messages: -1,
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
        .map_err(|error| format!("bucket {name}: {error}"))?;
    js.get_key_value(name)
        .await
        .map_err(|error| format!("bucket {name}: {error}"))
}

/// Every live entry of `kv`: key, revision, row (unreadable entries are skipped, logged).
pub(super) async fn scan(kv: &kv::Store) -> Result<Vec<(String, u64, Row)>, DispatchStoreError> {
    let what = "scan";
    let keys: Vec<String> = kv
        .keys()
        .await
        .map_err(unavailable(what))?
        .try_collect()
        .await
        .map_err(unavailable(what))?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(entry) = kv.entry(key.clone()).await.map_err(unavailable(what))? else {
            continue;
        };
        if entry.operation != kv::Operation::Put {
            continue;
        }
        match decode(&entry.value) {
            Ok(row) => rows.push((key, entry.revision, row)),
            Err(problem) => tracing::warn!(bucket = %kv.name, %key, %problem,
                "skipping an unreadable durable dispatch"),
        }
    }
    Ok(rows)
}

/// The idempotency bucket's key for `key` in `namespace`: both in hex (a bucket key allows
/// only letters, digits and a few marks).
pub(super) fn idempotency_key(namespace: &str, key: &str) -> String {
    let hex = |text: &str| text.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    format!("{}.{}", hex(namespace), hex(key))
}

/// `error` and every error under it, `: `-separated (async-nats keeps the server's words in
/// the source).
pub(super) fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub(super) fn unavailable<E: std::fmt::Display>(
    bucket: &'static str,
) -> impl Fn(E) -> DispatchStoreError {
    move |error| DispatchStoreError::Unavailable {
        detail: format!("jetstream {bucket}: {error}"),
    }
}

pub(super) fn unreadable(id: &DispatchId) -> impl Fn(String) -> DispatchStoreError + '_ {
    move |problem| DispatchStoreError::Unavailable {
        detail: format!("jetstream: dispatch {id} is unreadable: {problem}"),
    }
}

pub(super) fn finished_outcome(row: &Row) -> Option<OutcomeRecord> {
    match &row.stored.state {
        DispatchState::Finished { outcome, .. } => Some(outcome.clone()),
        _ => None,
    }
}
