//! A dispatch whose `record` returned survives the process being killed with SIGKILL right
//! after: the child process below records and prints each id once `record` returned, the
//! test kills it mid-way and finds every printed id after reopening.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_core::{DispatchStore, Recorded};
use switchyard_store_sqlite::{OpenError, SqliteOptions, SqliteStore};

/// Where the child keeps its store; set only in the child.
const CHILD_DIR: &str = "SWITCHYARD_STORE_CRASH_CHILD_DIR";
/// Concurrent submitters in the child, so batches are in flight at the kill.
const SUBMITTERS: usize = 32;
/// Records per submitter at most, and the child's time limit: it is killed long before.
const PER_SUBMITTER: usize = 1_000;
const CHILD_TIME_LIMIT: Duration = Duration::from_secs(60);
/// The parent kills the child once this many ids were printed.
const KILL_AFTER: usize = 300;

/// The child: records from `SUBMITTERS` tasks, printing `recorded <id>` after each `record`
/// returned. Run only by `dispatches_acknowledged_before_a_sigkill_survive_it`.
#[test]
#[ignore = "the child process of dispatches_acknowledged_before_a_sigkill_survive_it"]
fn child_records_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = Arc::new(fixtures::open(Path::new(&dir)));
        let started = Instant::now();
        let tasks: Vec<_> = (0..SUBMITTERS)
            .map(|submitter| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    for i in 0..PER_SUBMITTER {
                        if started.elapsed() > CHILD_TIME_LIMIT {
                            return;
                        }
                        let d = fixtures::dispatch("ns", &format!("{submitter}-{i}"));
                        match store.record(d).await {
                            Ok(Recorded::New(id)) => println!("recorded {id}"),
                            other => panic!("record: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("submitter");
        }
    });
}

#[tokio::test]
async fn dispatches_acknowledged_before_a_sigkill_survive_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_records_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = HashSet::new();
    while printed.len() < KILL_AFTER {
        let line = lines
            .next()
            .expect("the child stopped before it was killed")
            .expect("read child stdout");
        if let Some(id) = line.strip_prefix("recorded ") {
            printed.insert(id.to_owned());
        }
    }

    // While the child runs, its lock keeps this process out and names the child.
    let path = fixtures::store_path(dir.path());
    match SqliteStore::open(&path, SqliteOptions::default()) {
        Err(OpenError::Locked { holder, .. }) => {
            assert!(
                holder.starts_with(&format!("pid {} ", child.id())),
                "{holder}"
            );
        }
        other => panic!("opened beside a live gateway: {other:?}"),
    }

    child.kill().expect("SIGKILL the child");
    for line in lines {
        let line = line.expect("read child stdout");
        if let Some(id) = line.strip_prefix("recorded ") {
            printed.insert(id.to_owned());
        }
    }
    let status = child.wait().expect("wait for the child");
    assert!(
        !status.success(),
        "the child finished before the kill: {status}"
    );
    assert!(
        printed.len() < SUBMITTERS * PER_SUBMITTER,
        "every record printed: the kill came too late to test anything"
    );

    let store = fixtures::open(dir.path());
    let kept: HashSet<String> = store
        .unfinished()
        .await
        .expect("unfinished")
        .into_iter()
        .map(|s| s.dispatch.id.to_string())
        .collect();
    let lost: Vec<_> = printed.difference(&kept).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged dispatches lost by the kill: {lost:?}",
        lost.len(),
        printed.len()
    );
}
