//! Durable dispatch across a gateway's death and restart, and the store's refusals at start:
//! the real `switchyard serve` binary, loopback only, a temporary data directory.
//!
//! - An idempotency key submitted before and after a SIGKILL names one dispatch, run once.
//! - A dispatch accepted by the SQLite store is still there after a SIGKILL; with
//!   `store.backend = "memory"` the same kill loses it (the control that the store is what
//!   keeps it).
//! - A second gateway on the same data directory refuses to start, naming the lock holder.
//! - A store written by a newer version refuses to start (exit code 2), naming both versions.
//! - A file at the store's path that is not a database, or is another application's, refuses
//!   to start (exit code 2), naming the file, and is left as it was.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;

use std::sync::Arc;
use std::time::Duration;

use harness::{
    Ledger, Process, Site, TestWorker, completed_output, free_port, serve_command, tagged,
};

const ACTIVITY: &str = "restart-echo";
const TIMEOUT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);

fn instant(_: u64) -> Duration {
    Duration::ZERO
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_before_and_after_a_sigkill_is_one_dispatch_run_once() {
    let site = Site::new();
    let mut gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    // No worker yet: the dispatch waits in the store while the gateway dies.
    let first = producer
        .submit(ACTIVITY, 7, Some("order-7".into()), TIMEOUT)
        .await
        .unwrap();
    assert!(!first.existing);
    let again = producer
        .submit(ACTIVITY, 7, Some("order-7".into()), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(again.id, first.id);
    assert!(again.existing);

    gateway.kill_9();
    let _gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    let after = producer
        .submit(ACTIVITY, 7, Some("order-7".into()), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(after.id, first.id, "the key still names the same dispatch");
    assert!(after.existing);
    // Control: another key is another dispatch.
    let other = producer
        .submit(ACTIVITY, 8, Some("order-8".into()), TIMEOUT)
        .await
        .unwrap();
    assert_ne!(other.id, first.id);
    assert!(!other.existing);

    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&site, ACTIVITY, 4, Arc::clone(&ledger), instant).await;
    for (id, tag) in [(&first.id, 7), (&other.id, 8)] {
        let outcome = producer.await_outcome(id, WAIT).await.unwrap().unwrap();
        assert_eq!(completed_output(&outcome), Some(&tagged(tag)));
    }
    // Once finished, the key still answers with the same id and does not run the work again;
    // a later dispatch completing is the point by which a second run would have started.
    let finished = producer
        .submit(ACTIVITY, 7, Some("order-7".into()), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(finished.id, first.id);
    assert!(finished.existing);
    let later = producer.submit(ACTIVITY, 9, None, TIMEOUT).await.unwrap();
    producer
        .await_outcome(&later.id, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ledger.executions(7), 1, "one key, one execution");
    assert_eq!(ledger.executions(8), 1);
    assert_eq!(ledger.executions(9), 1);
    worker.stop().await;
}

/// Submits a dispatch no worker serves, kills the gateway, restarts it; returns the restarted
/// gateway and the dispatch's id if `GetDispatch` still knows it, else its status.
async fn parked_dispatch_after_a_sigkill(site: &Site) -> (Process, Result<String, tonic::Status>) {
    let mut gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    let submitted = producer.submit(ACTIVITY, 1, None, TIMEOUT).await.unwrap();
    gateway.kill_9();
    let gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    let known = producer.get(&submitted.id).await.map(|_| submitted.id);
    (gateway, known)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_keeps_accepted_dispatches_in_sqlite_and_loses_them_in_memory() {
    // A process's death loses nothing the store acknowledged, whether or not each commit is
    // fsynced: with `synchronous = "normal"` the commit is in the WAL file, which outlives the
    // process (only the machine's power loss or a kernel crash can lose it).
    for (synchronous, store) in [("full", ""), ("normal", r#"synchronous = "normal""#)] {
        let sqlite = Site::with_store(store);
        let (_gateway, id) = parked_dispatch_after_a_sigkill(&sqlite).await;
        let id = id.unwrap_or_else(|status| panic!("{synchronous}: not kept: {status}"));
        // It runs once a worker comes.
        let ledger = Arc::new(Ledger::default());
        let worker = TestWorker::connect(&sqlite, ACTIVITY, 1, Arc::clone(&ledger), instant).await;
        let mut producer = sqlite.producer().await.unwrap();
        let outcome = producer.await_outcome(&id, WAIT).await.unwrap().unwrap();
        assert_eq!(
            completed_output(&outcome),
            Some(&tagged(1)),
            "{synchronous}"
        );
        assert_eq!(ledger.executions(1), 1, "{synchronous}");
        worker.stop().await;
    }

    // Control: the memory store forgets it with the process.
    let memory = Site::with_store(r#"backend = "memory""#);
    let (_gateway, lost) = parked_dispatch_after_a_sigkill(&memory).await;
    assert_eq!(
        lost.map_err(|status| status.code()),
        Err(tonic::Code::NotFound),
        "the memory store does not survive the process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_data_directory_refuses_naming_the_lock_holder() {
    let site = Site::new();
    let mut first = site.serve().await;
    let mut second = serve_command(&site.sibling_config(free_port()));
    let status = second.exit().await;
    assert_eq!(status.code(), Some(2), "the second gateway must not start");
    let stderr = second.stderr();
    let refusal = format!(
        "store {}: locked by another gateway (pid {} on host ",
        site.store_file().display(),
        first.pid()
    );
    assert!(
        stderr.contains(&refusal),
        "the refusal names the store and the holder ({refusal}...): {stderr}"
    );
    // Control: once the first is gone (killed: its lock is not left behind), the same second
    // configuration starts.
    first.kill_9();
    let mut second = serve_command(&site.sibling_config(free_port()));
    second.line_containing("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_a_newer_version_is_refused_naming_both_versions() {
    // SIGKILL rather than SIGTERM to stop each gateway: `serve` prints its banner before it
    // listens for SIGTERM, so a SIGTERM right after the banner can find no handler yet.
    let site = Site::new();
    site.serve().await.kill_9();
    // Control: the store as this version left it opens again.
    site.serve().await.kill_9();

    let ours: i64 = {
        let store = rusqlite::Connection::open(site.store_file()).unwrap();
        let ours = store
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        store.pragma_update(None, "user_version", 9_999).unwrap();
        ours
    };
    let mut refused = serve_command(&site.config);
    let status = refused.exit().await;
    assert_eq!(status.code(), Some(2), "a newer store must not be opened");
    let stderr = refused.stderr();
    let refusal = format!(
        "store {}: written by a newer version of Switchyard (found schema 9999, this build \
         reads up to {ours})",
        site.store_file().display()
    );
    assert!(
        stderr.contains(&refusal),
        "the refusal names both versions ({refusal}): {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_store_is_refused_at_start_and_left_alone() {
    let site = Site::new();
    // Control: a fresh data directory starts.
    site.serve().await.kill_9();
    let path = site.store_file();
    let p = path.display();
    let text = "dispatch log, not a database\n".repeat(300);
    let foreign = |store: &rusqlite::Connection| {
        store
            .execute_batch("PRAGMA application_id = 305419896; CREATE TABLE notes (body TEXT);")
            .unwrap();
    };
    /// A case: its name, how it writes the file, the exact refusal.
    type Case<'a> = (&'static str, Box<dyn Fn() + 'a>, String);
    let cases: [Case<'_>; 2] = [
        (
            "text",
            Box::new(|| std::fs::write(&path, &text).unwrap()),
            format!("store {p}: not an SQLite database, or corrupt (file is not a database)"),
        ),
        (
            "foreign",
            Box::new(|| foreign(&rusqlite::Connection::open(&path).unwrap())),
            format!(
                "store {p}: an SQLite database of another application (application_id \
                 0x12345678, a Switchyard store has 0x53575944)"
            ),
        ),
    ];
    for (case, write, refusal) in cases {
        for stale in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{p}{stale}"));
        }
        write();
        let before = std::fs::read(&path).unwrap();
        let mut refused = serve_command(&site.config);
        let status = refused.exit().await;
        assert_eq!(status.code(), Some(2), "{case}: the gateway must not start");
        let stderr = refused.stderr();
        assert!(
            stderr.contains(&refusal),
            "{case}: the refusal names the file ({refusal}): {stderr}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{case}: the file was changed"
        );
    }
}
