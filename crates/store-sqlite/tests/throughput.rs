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
use switchyard_store_sqlite::{SqliteOptions, Synchronous};

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
