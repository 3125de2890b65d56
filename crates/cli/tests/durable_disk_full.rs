//! A full disk under the real `switchyard serve`, as a producer in any language meets it over
//! the wire: a durable unary `Dispatch` is refused with `RESOURCE_EXHAUSTED` and the store's
//! sentence naming its file, before the dispatch's own timeout (not by it); once space returns,
//! durable dispatches are recorded again without a restart.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;
#[path = "../../store-sqlite/tests/support/tmpfs.rs"]
mod tmpfs;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use harness::{Ledger, NAMESPACE, Producer, Site, TestWorker, completed_output, tagged};
use switchyard_proto::v1 as pb;
use tokio::time::Instant;

const ACTIVITY: &str = "disk-echo";
/// The dispatches' timeout: a refusal must come well before it.
const TIMEOUT: Duration = Duration::from_secs(60);
/// At most this many dispatches fill the file system (4 KiB inputs, a 4 MiB file system).
const MAX_DISPATCHES: u64 = 2_000;

fn instant(_: u64) -> Duration {
    Duration::ZERO
}

/// A durable unary `Dispatch` of a 4 KiB input tagged `tag`.
async fn dispatch(producer: &mut Producer, tag: u64) -> Result<pb::DispatchReply, tonic::Status> {
    let mut input = BytesMut::from(&tagged(tag)[..]);
    input.put_bytes(b'd', 4096);
    producer
        .0
        .dispatch(pb::DispatchRequest {
            namespace: NAMESPACE.into(),
            activity_type: ACTIVITY.into(),
            input: input.freeze(),
            timeout_ms: u64::try_from(TIMEOUT.as_millis()).unwrap(),
            durable: Some(true),
            ..pb::DispatchRequest::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Fills the file system holding `dir` with one file, until a write finds no space.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    let ballast = dir.join("ballast");
    let mut file = std::fs::File::create(&ballast).unwrap();
    let chunk = vec![0u8; 16 * 1024];
    for _ in 0..1024 {
        if let Err(error) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
            assert_eq!(error.raw_os_error(), Some(28), "not ENOSPC: {error}");
            return ballast;
        }
    }
    panic!("16 MiB written to a 4 MiB file system");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_dispatch_on_a_full_disk_is_refused_at_once_naming_the_store_file() {
    let site = Site::new();
    let mount = tmpfs::Tmpfs::mount(&site.data_dir, "size=4m");
    let _gateway = site.serve().await;
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&site, ACTIVITY, 8, Arc::clone(&ledger), instant).await;
    let mut producer = site.producer().await.unwrap();

    // Control: with space, a durable dispatch is recorded and runs.
    let before = dispatch(&mut producer, 0)
        .await
        .expect("recorded with space");
    let output = before.outcome.as_ref().and_then(completed_output).unwrap();
    assert_eq!(&output[..8], &tagged(0)[..]);
    assert_eq!(ledger.executions(0), 1);

    // The ballast leaves the store only what its files already hold; the dispatches that
    // follow use that up (the WAL is reused after a checkpoint) until one is refused.
    let ballast = fill(mount.path());
    let mut tag = 1;
    let (refusal, took) = loop {
        assert!(
            tag < MAX_DISPATCHES,
            "the full file system never refused a dispatch"
        );
        let sent = Instant::now();
        match dispatch(&mut producer, tag).await {
            Ok(reply) => assert!(
                reply.outcome.as_ref().and_then(completed_output).is_some(),
                "dispatch {tag}: {reply:?}"
            ),
            Err(status) => break (status, sent.elapsed()),
        }
        tag += 1;
    };
    assert_eq!(
        refusal.code(),
        tonic::Code::ResourceExhausted,
        "{refusal:?}"
    );
    assert_eq!(
        refusal.message(),
        format!(
            "no space left on the file system holding the store ({}); nothing was recorded",
            site.store_file().display()
        )
    );
    assert!(
        took < TIMEOUT / 4,
        "the refusal took {took:?}: it came with the dispatch's timeout, not with the store's \
         answer"
    );

    // Space returns: recorded again without a restart; the gateway kept serving meanwhile.
    std::fs::remove_file(&ballast).unwrap();
    let after = dispatch(&mut producer, MAX_DISPATCHES)
        .await
        .expect("recorded again");
    assert!(after.outcome.as_ref().and_then(completed_output).is_some());
    worker.stop().await;
}

/// `docs/durability.md`, start-up refusals: a store whose directory cannot be written stops
/// `switchyard serve` with exit code 2 and the store's sentence naming the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_written_stops_serve_with_exit_2_naming_it() {
    let place = tempfile::tempdir().unwrap();
    let mount = tmpfs::Tmpfs::mount(&place.path().join("ro"), "ro,size=1m");
    let store = mount.path().join("dispatches.sqlite3");
    let site = Site::with_store(&format!("path = {:?}", store.display().to_string()));
    let mut refused = harness::serve_command(&site.config);
    let status = refused.exit().await;
    let stderr = refused.stderr();
    assert_eq!(status.code(), Some(2), "{stderr}");
    let p = store.display();
    assert!(
        stderr.contains(&format!(
            "store {p}: not writable: cannot create {p}.lock: Read-only file system"
        )),
        "{stderr}"
    );
    // Control: the same place made writable, the gateway starts.
    mount.remount("remount,rw");
    let _gateway = site.serve().await;
}
