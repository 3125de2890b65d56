//! The `sqlite3` steps of `docs/durability.md`, run as an operator would against the real
//! `switchyard serve` and its store: the inspection queries through `sqlite3 -readonly` while
//! the gateway runs, `.backup` while it runs, and a restore (stop, put the copy in place, drop
//! the old `-wal`/`-shm`, start) after which the copy's unfinished dispatch resumes and a
//! dispatch recorded after the backup is gone; and a cold copy of a killed gateway's store,
//! which holds every submission with its `-wal` and not without. The first test needs the
//! `sqlite3` program (Debian's package;
//! `.ci/run` installs it): without it the test is skipped with a printed reason, unless
//! `CI_REQUIRE_SQLITE3` is set, where it fails.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use harness::{Ledger, NAMESPACE, Site, TestWorker, completed_output, tagged};

const ACTIVITY: &str = "backup-echo";
const TIMEOUT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);
/// Set by `.ci/run`: a missing `sqlite3` fails the test instead of skipping it.
const REQUIRE_SQLITE3: &str = "CI_REQUIRE_SQLITE3";

/// Whether `sqlite3` runs here; `false` (with the reason printed) skips the test.
fn sqlite3_available() -> bool {
    let found = Command::new("sqlite3")
        .arg("-version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        assert!(
            std::env::var_os(REQUIRE_SQLITE3).is_none(),
            "sqlite3 is not on PATH and {REQUIRE_SQLITE3} is set (install it: apt-get install -y \
             sqlite3)"
        );
        eprintln!("skipped: sqlite3 is not on PATH (apt-get install -y sqlite3)");
    }
    found
}

/// `sqlite3 ARGS...`; returns its standard output, trimmed, failing the test on an error.
fn sqlite3(args: &[&str]) -> String {
    let out = Command::new("sqlite3")
        .args(args)
        .output()
        .expect("sqlite3 runs");
    assert!(
        out.status.success(),
        "sqlite3 {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_sqlite3_steps_inspect_back_up_and_restore_a_running_store() {
    if !sqlite3_available() {
        return;
    }
    let site = Site::new();
    let store = site.store_file();
    let mut gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    // No worker: the dispatch stays unfinished in the store.
    let kept = producer.submit(ACTIVITY, 1, None, TIMEOUT).await.unwrap();

    // Inspection, read-only, while the gateway runs: the queries as the page prints them.
    let by_pool = sqlite3(&[
        "-readonly",
        text(&store),
        "SELECT namespace, task_queue, activity_type, state, count(*) \
           FROM dispatches WHERE state <> 'finished' GROUP BY 1, 2, 3, 4;",
    ]);
    let fields: Vec<&str> = by_pool.split('|').collect();
    assert_eq!(fields.len(), 5, "one unfinished pool: {by_pool:?}");
    assert_eq!(fields[0], NAMESPACE);
    assert_eq!(fields[2], ACTIVITY);
    assert!(["queued", "parked"].contains(&fields[3]), "{by_pool:?}");
    assert_eq!(fields[4], "1");
    let one = sqlite3(&[
        "-readonly",
        text(&store),
        &format!(
            "SELECT id, state, parked_reason, worker, attempts, \
               datetime(submitted_at_ns / 1000000000, 'unixepoch') AS submitted, \
               datetime(deadline_ns / 1000000000, 'unixepoch') AS deadline, \
               outcome_kind, outcome_message \
             FROM dispatches WHERE id = '{}';",
            kept.id
        ),
    ]);
    assert!(one.starts_with(&format!("{}|", kept.id)), "{one:?}");
    assert_eq!(one.split('|').count(), 9, "{one:?}");
    assert_eq!(
        sqlite3(&["-readonly", text(&store), "PRAGMA user_version;"]),
        "3"
    );
    assert_eq!(
        sqlite3(&["-readonly", text(&store), "PRAGMA application_id;"]),
        "1398233412"
    );

    // `.backup` while the gateway runs; then one more dispatch, which the copy cannot hold.
    let backup = site.data_dir.join("backup.sqlite3");
    sqlite3(&[text(&store), &format!(".backup {}", text(&backup))]);
    let later = producer.submit(ACTIVITY, 2, None, TIMEOUT).await.unwrap();
    assert!(producer.get(&later.id).await.is_ok());

    // Restore: stop the gateway, put the copy in place, remove the old -wal and -shm, start.
    gateway.terminate().await;
    std::fs::copy(&backup, &store).unwrap();
    for stale in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{stale}", store.display()));
    }
    let _gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    let gone = producer.get(&later.id).await.unwrap_err();
    assert_eq!(
        gone.code(),
        tonic::Code::NotFound,
        "recorded after the backup: {gone}"
    );
    // The copy's unfinished dispatch resumes and runs once a worker comes.
    let ledger = Arc::new(Ledger::default());
    let worker =
        TestWorker::connect(&site, ACTIVITY, 1, Arc::clone(&ledger), |_| Duration::ZERO).await;
    let outcome = producer
        .await_outcome(&kept.id, WAIT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(completed_output(&outcome), Some(&tagged(1)));
    assert_eq!(ledger.executions(1), 1);
    assert_eq!(
        ledger.executions(2),
        0,
        "the dispatch after the backup is gone"
    );
    worker.stop().await;
}

/// `docs/durability.md`, backup while stopped: a gateway killed with SIGKILL leaves committed
/// submissions in the WAL; a copy of the file with its `-wal` holds every one of them, a copy
/// of the file alone does not. (No `sqlite3` needed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_copy_of_a_killed_gateways_store_needs_its_wal_and_then_holds_every_submission() {
    const SUBMITTED: u64 = 20;
    let site = Site::new();
    let store = site.store_file();
    let mut gateway = site.serve().await;
    let mut producer = site.producer().await.unwrap();
    let mut ids = Vec::new();
    for tag in 0..SUBMITTED {
        ids.push(
            producer
                .submit(ACTIVITY, tag, None, TIMEOUT)
                .await
                .unwrap()
                .id,
        );
    }
    gateway.kill_9();
    let wal = format!("{}-wal", store.display());
    assert!(
        std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0),
        "the killed gateway left its WAL"
    );
    // How many of the submissions a copy holds, started on a site of its own.
    let restored = |with_wal: bool| {
        let ids = ids.clone();
        let (store, wal) = (store.clone(), wal.clone());
        async move {
            let copy = Site::new();
            std::fs::create_dir_all(&copy.data_dir).unwrap();
            std::fs::copy(&store, copy.store_file()).unwrap();
            if with_wal {
                std::fs::copy(&wal, format!("{}-wal", copy.store_file().display())).unwrap();
            }
            let mut gateway = copy.serve().await;
            let mut producer = copy.producer().await.unwrap();
            let mut found = 0;
            for id in &ids {
                if producer.get(id).await.is_ok() {
                    found += 1;
                }
            }
            gateway.kill_9();
            found
        }
    };
    assert_eq!(
        restored(true).await,
        SUBMITTED,
        "the file and its WAL hold them all"
    );
    // Control: the file alone misses what only the WAL held.
    assert!(restored(false).await < SUBMITTED);
}
