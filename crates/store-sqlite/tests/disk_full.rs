//! A full file system refuses the write in progress with `DiskFull`, loses nothing committed
//! before, and writes work again once space returns.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/tmpfs.rs"]
mod tmpfs;

use switchyard_core::{DispatchId, DispatchStore, DispatchStoreError, Recorded};
use switchyard_store_sqlite::SqliteOptions;

/// Records at most this many: a 3 MiB file system fills long before.
const MAX_RECORDS: usize = 2_000;

#[tokio::test]
async fn a_full_disk_refuses_the_write_and_keeps_what_was_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = tmpfs::Tmpfs::mount(&dir.path().join("small"), "size=3m");
    let ballast = mount.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; 512 * 1024]).expect("ballast");
    let path = fixtures::store_path(mount.path());
    let options = SqliteOptions {
        max_bytes: 1 << 30,
        ..SqliteOptions::default()
    };
    let store = fixtures::open_with(mount.path(), options.clone());

    let input = "i".repeat(4096);
    let mut recorded: Vec<DispatchId> = Vec::new();
    let refusal = loop {
        assert!(recorded.len() < MAX_RECORDS, "3 MiB never filled");
        let d = fixtures::dispatch("ns", &input);
        match store.record(d.clone()).await {
            Ok(Recorded::New(id)) => recorded.push(id),
            Ok(other) => panic!("recorded as {other:?}"),
            Err(err) => break err,
        }
    };
    assert_eq!(
        refusal.to_string(),
        format!(
            "no space left on the file system holding the store ({}); nothing was recorded",
            path.display()
        )
    );
    // Each commit appends its pages to the WAL (about 20 KiB here): some 100 fit.
    assert!(recorded.len() > 20, "only {} recorded", recorded.len());
    let refused = store.record(fixtures::dispatch("ns", &input)).await;
    assert!(
        matches!(refused, Err(DispatchStoreError::DiskFull { .. })),
        "still full: {refused:?}"
    );

    // Space returns: writes work again without reopening.
    std::fs::remove_file(&ballast).expect("remove ballast");
    let after = fixtures::dispatch("ns", "small");
    assert_eq!(
        store.record(after.clone()).await,
        Ok(Recorded::New(after.id.clone()))
    );
    recorded.push(after.id);
    drop(store);

    let store = fixtures::open_with(mount.path(), options);
    let unfinished = store.unfinished().await.expect("unfinished");
    let kept: Vec<DispatchId> = unfinished.into_iter().map(|s| s.dispatch.id).collect();
    assert_eq!(
        kept, recorded,
        "a dispatch committed before the disk filled was lost"
    );
}
