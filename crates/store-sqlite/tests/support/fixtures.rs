//! Dispatches and stores for the store's tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use switchyard_core::{DispatchId, NewDispatch, OutcomeRecord};
use switchyard_store_sqlite::{SqliteOptions, SqliteStore};

/// The store's file in `dir`.
pub(crate) fn store_path(dir: &Path) -> PathBuf {
    dir.join("dispatches.sqlite3")
}

/// Opens the store in `dir` with `options`.
pub(crate) fn open_with(dir: &Path, options: SqliteOptions) -> SqliteStore {
    SqliteStore::open(store_path(dir), options).expect("open the store")
}

/// Opens the store in `dir` with the default options.
pub(crate) fn open(dir: &Path) -> SqliteStore {
    open_with(dir, SqliteOptions::default())
}

/// A new dispatch to `namespace/q/resize` by `producer`, with a fresh id and `input`.
pub(crate) fn dispatch(namespace: &str, input: &str) -> NewDispatch {
    let now = SystemTime::now();
    NewDispatch {
        id: DispatchId::generate(),
        namespace: namespace.to_owned(),
        task_queue: "q".to_owned(),
        activity_type: "resize".to_owned(),
        node: None,
        input: Bytes::copy_from_slice(input.as_bytes()),
        principal: "producer".to_owned(),
        idempotency_key: None,
        submitted_at: now,
        deadline: now + Duration::from_secs(60),
    }
}

/// The same, with an idempotency key.
pub(crate) fn keyed(namespace: &str, key: &str) -> NewDispatch {
    NewDispatch {
        idempotency_key: Some(key.to_owned()),
        ..dispatch(namespace, key)
    }
}

/// A completed outcome with `output`.
pub(crate) fn completed(output: &str) -> OutcomeRecord {
    OutcomeRecord {
        kind: "completed".to_owned(),
        output: Bytes::copy_from_slice(output.as_bytes()),
        message: String::new(),
        retryable: false,
        reason: String::new(),
        attempts: 0,
    }
}
