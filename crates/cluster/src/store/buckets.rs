//! The jetstream store's buckets and their entries: opening a bucket, listing it, keys, and
//! the store errors its failures become.

use async_nats::jetstream::{self, kv};
use futures::TryStreamExt;
use switchyard_core::{DispatchId, DispatchState, DispatchStoreError, OutcomeRecord};

use super::codec::{Row, decode};
use crate::kv_bucket::BucketLimits;

/// Opens (creating if needed) a bucket of the store holding at most `max_bytes` (-1: no
/// bound), its entries kept until deleted.
pub(super) async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_bytes: i64,
) -> Result<kv::Store, String> {
    let limits = BucketLimits {
        max_age: std::time::Duration::ZERO,
        max_bytes,
    };
    crate::kv_bucket::open(js, "bucket", name, limits).await
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
