//! Records per second through group commit with 256 concurrent submitters, for each
//! `synchronous` mode. A figure, not a test of behaviour: run it by hand, in release:
//! `cargo test -p switchyard-store-sqlite --release --locked --test throughput -- --ignored
//! --nocapture`.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_core::DispatchStore;
use switchyard_store_sqlite::{SqliteOptions, SqliteStore, Synchronous};

const SUBMITTERS: usize = 256;
/// Records in all, at most, and the time limit of one run.
const RECORDS: usize = 40_000;
const TIME_LIMIT: Duration = Duration::from_secs(60);
const INPUT_BYTES: usize = 256;

/// CPU time this process has used (user + system), from `/proc/self/stat`; zero elsewhere.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after the name; Linux
    // counts them in 100 Hz ticks.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

async fn measure(synchronous: Synchronous) {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).expect("tempdir");
    let options = SqliteOptions {
        synchronous,
        ..SqliteOptions::default()
    };
    let store = Arc::new(fixtures::open_with(dir.path(), options));
    let input = "x".repeat(INPUT_BYTES);
    let started = Instant::now();
    let cpu_before = cpu_time();
    let tasks: Vec<_> = (0..SUBMITTERS)
        .map(|_| {
            let (store, input) = (Arc::clone(&store), input.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(RECORDS / SUBMITTERS);
                for _ in 0..RECORDS / SUBMITTERS {
                    if started.elapsed() > TIME_LIMIT {
                        break;
                    }
                    let sent = Instant::now();
                    store
                        .record(fixtures::dispatch("ns", &input))
                        .await
                        .expect("record");
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("submitter"));
    }
    let elapsed = started.elapsed();
    let cpu = cpu_time() - cpu_before;
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let commits = store.commits();
    println!(
        "synchronous={}: {} records in {:.2} s = {:.0} records/s; {} commits ({:.1} records \
         each); latency p50 {:.2} ms, p99 {:.2} ms; CPU {:.1} us per record",
        synchronous.label(),
        latencies.len(),
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        commits,
        latencies.len() as f64 / commits as f64,
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        cpu.as_secs_f64() * 1e6 / latencies.len() as f64,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure for the benchmark page; run by hand in release"]
async fn records_per_second_with_256_submitters() {
    measure(Synchronous::Full).await;
    measure(Synchronous::Normal).await;
}

/// CPU time the writer thread (`store-writer`) of this process has used; zero elsewhere.
fn writer_cpu_time() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "store-writer" {
            continue;
        }
        // The scheduler's own count, in nanoseconds: finer than the 100 Hz ticks of `stat`.
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let on_cpu = schedstat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        return Duration::from_nanos(on_cpu);
    }
    Duration::ZERO
}

/// Which of the gateway's durable paths a lifecycle run plays.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// A durable `DispatchStream` item: the record sent with `record_before_outcome`, the
    /// claim and the outcome sent behind it without waiting for its commit.
    Stream,
    /// A `Submit`: the record awaited (its reply), then the claim and the outcome.
    Submit,
}

/// One dispatch through its life along `path`.
async fn lifecycle(store: &SqliteStore, path: Path, input: &str) {
    let dispatch = fixtures::dispatch("ns", input);
    let id = dispatch.id.clone();
    let outcome = async {
        store
            .claim(&id, switchyard_core::WorkerId::from_raw(1), 1)
            .await
            .expect("claim");
        store
            .complete(
                &id,
                &fixtures::completed("out"),
                std::time::SystemTime::now(),
            )
            .await
            .expect("complete")
    };
    match path {
        Path::Stream => {
            let record = store.record_before_outcome(Arc::new(dispatch));
            let outcome = async {
                tokio::task::yield_now().await;
                outcome.await
            };
            let (recorded, _) = tokio::join!(record, outcome);
            recorded.expect("record");
        }
        Path::Submit => {
            store.record(dispatch).await.expect("record");
            outcome.await;
        }
    }
}

/// Dispatches through their life along `path`, `SUBMITTERS` at once; prints the rate, the
/// commits and the writer thread's CPU per dispatch.
async fn measure_lifecycle(synchronous: Synchronous, path: Path) {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).expect("tempdir");
    let options = SqliteOptions {
        synchronous,
        ..SqliteOptions::default()
    };
    let store = Arc::new(fixtures::open_with(dir.path(), options));
    let input = "x".repeat(64);
    let started = Instant::now();
    let writer_before = writer_cpu_time();
    let commits_before = store.commits();
    let tasks: Vec<_> = (0..SUBMITTERS)
        .map(|_| {
            let (store, input) = (Arc::clone(&store), input.clone());
            tokio::spawn(async move {
                let mut done = 0usize;
                for _ in 0..LIFECYCLES / SUBMITTERS {
                    if started.elapsed() > TIME_LIMIT {
                        break;
                    }
                    lifecycle(&store, path, &input).await;
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for task in tasks {
        done += task.await.expect("submitter");
    }
    let elapsed = started.elapsed();
    let writer = writer_cpu_time() - writer_before;
    let commits = store.commits() - commits_before;
    println!(
        "lifecycle {path:?} synchronous={}: {done} dispatches in {:.2} s = {:.0}/s; {commits} \
         commits ({:.1} dispatches each); writer CPU {:.1} us per dispatch",
        synchronous.label(),
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64(),
        done as f64 / commits.max(1) as f64,
        writer.as_secs_f64() * 1e6 / done.max(1) as f64,
    );
}

/// Dispatches in all, at most, of one lifecycle run.
const LIFECYCLES: usize = 60_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure for the benchmark page; run by hand in release"]
async fn writer_cpu_per_dispatch_through_record_claim_complete() {
    for path in [Path::Stream, Path::Submit, Path::Stream, Path::Submit] {
        measure_lifecycle(Synchronous::Full, path).await;
    }
}
