//! The durable-dispatch commands against a running `switchyard serve`: `submit` prints an id
//! (the same one for a repeated idempotency key, and `--queue` picks the queue), `outcome`
//! says the dispatch is pending (exit 4) until a `switchyard worker` arrives and then prints it
//! completed (exit 0), or how it ended otherwise (exit 3); `dispatches` lists dispatches with
//! their state (`--pool`, `--state` and `--limit` select), `pool` and `unserved` show the
//! store's backlog; `dispatch --durable` records the
//! dispatch it runs; a second `serve` on the same store refuses to start naming the holder
//! (exit 2), and a malformed `--pool` is a usage error (exit 2).
//! The real binary in processes of its own, loopback only, a temporary data directory.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn switchyard() -> Command {
    Command::new(PathBuf::from(env!("CARGO_BIN_EXE_switchyard")))
}

/// `switchyard serve` on ephemeral loopback ports; returns it with the gRPC address from its
/// banner.
fn serve(data_dir: &Path) -> (Killed, String) {
    let mut child = switchyard()
        .args(["serve", "--grpc-listen", "127.0.0.1:0", "--no-quic"])
        .args(["--ops-listen", "127.0.0.1:0", "--log-filter", "warn"])
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("switchyard serve starts");
    let stdout = child.stdout.take().unwrap();
    let (found, grpc) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["grpc", "tcp", addr] = words.as_slice() {
                let _ = found.send((*addr).to_owned());
            }
        }
    });
    let serve = Killed(child);
    let addr = grpc
        .recv_timeout(Duration::from_secs(30))
        .expect("the banner names the gRPC listener");
    (serve, addr)
}

/// Runs a client command against the gateway at `addr` and returns its output.
fn client(addr: &str, data_dir: &Path, args: &[&str]) -> Output {
    switchyard()
        .args(args)
        .args(["--endpoint", &format!("https://{addr}")])
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("the client runs")
}

/// A `switchyard worker` serving `echo` in namespace `shop` for the gateway at `addr`.
fn echo_worker(addr: &str, dir: &Path) -> Killed {
    Killed(
        switchyard()
            .args(["worker", "--transport", "grpc", "--activity", "echo=echo"])
            .args(["--namespace", "shop"])
            .args(["--endpoint", &format!("https://{addr}")])
            .arg("--data-dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("switchyard worker starts"),
    )
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn submit_outcome_and_dispatches_follow_a_durable_dispatch() {
    let data_dir = tempfile::tempdir().unwrap();
    let dir = data_dir.path();
    let (_serve, addr) = serve(dir);
    let submit = [
        "submit",
        "--namespace",
        "shop",
        "--activity",
        "echo",
        "--input",
        "hello",
        "--idempotency-key",
        "order-1",
        "--timeout",
        "5m",
    ];
    let submitted = client(&addr, dir, &submit);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();
    assert_eq!(id.len(), 32, "{id:?}");
    let again = client(&addr, dir, &submit);
    assert_eq!(stdout(&again).trim(), id, "the same key gives the same id");
    assert!(
        stderr(&again).contains("already used"),
        "{}",
        stderr(&again)
    );

    // No worker yet: pending, exit 4, saying where it stands.
    let pending = client(&addr, dir, &["outcome", &id]);
    assert_eq!(pending.status.code(), Some(4), "{}", stderr(&pending));
    assert!(
        stderr(&pending).contains("has no outcome yet"),
        "{}",
        stderr(&pending)
    );
    let listed = client(&addr, dir, &["dispatches", "--pool", "shop/default"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let table = stdout(&listed);
    assert!(table.starts_with("ID "), "{table}");
    let row = table.lines().find(|l| l.starts_with(&id)).expect("listed");
    assert!(!row.contains("finished"), "{row}");
    // The store's backlog, refreshed every 5 s, in `pool` and `unserved`.
    let pool = until("the backlog line of `switchyard pool`", || {
        let out = stdout(&client(&addr, dir, &["pool", "shop", "default", "echo"]));
        out.contains("durable backlog: ").then_some(out)
    });
    assert!(
        pool.contains("durable backlog: 1 waiting, 0 running, oldest waiting "),
        "{pool}"
    );
    let unserved = stdout(&client(&addr, dir, &["unserved"]));
    let backlog = unserved
        .split_once("durable backlog (dispatch store):")
        .map(|(_, table)| table.to_owned())
        .unwrap_or_else(|| panic!("no backlog table: {unserved}"));
    let row: Vec<&str> = backlog
        .lines()
        .find(|l| l.starts_with("shop "))
        .expect("the pool's row")
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..5],
        ["shop", "default", "echo", "1", "0"],
        "{backlog}"
    );

    let _worker = echo_worker(&addr, dir);
    let done = client(&addr, dir, &["outcome", &id, "--wait", "20s"]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(stdout(&done).trim(), "completed: hello");
    let finished = client(
        &addr,
        dir,
        &["dispatches", "--state", "finished", "--pool", "shop"],
    );
    let row = stdout(&finished)
        .lines()
        .find(|l| l.starts_with(&id))
        .map(str::to_owned)
        .expect("listed as finished");
    assert!(
        row.contains("finished") && row.contains("completed"),
        "{row}"
    );
    // Control: a state filter that matches nothing lists only the header.
    let none = client(&addr, dir, &["dispatches", "--state", "parked"]);
    assert_eq!(stdout(&none).lines().count(), 1, "{}", stdout(&none));

    // A second gateway on the same store refuses to start, naming the holder: exit 2.
    let second = switchyard()
        .args(["serve", "--grpc-listen", "127.0.0.1:0", "--no-quic"])
        .args(["--ops-listen", "127.0.0.1:0", "--log-filter", "off"])
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("a second serve runs");
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    let refusal = stderr(&second);
    assert!(
        refusal.contains("dispatches.sqlite3: locked by another gateway (pid "),
        "{refusal}"
    );

    let bad = client(&addr, dir, &["dispatches", "--pool", "/default"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--pool"), "{}", stderr(&bad));
}

/// Calls `check` until it returns something, for at most 20 s (the gateway refreshes what it
/// reads from the store every 5 s), a fifth of a second apart.
fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "never saw {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The rows of a `switchyard dispatches` table, header left out.
fn rows(output: &Output) -> Vec<String> {
    stdout(output).lines().skip(1).map(str::to_owned).collect()
}

#[test]
fn outcome_exits_3_when_a_dispatch_did_not_complete_and_the_list_filters_select() {
    let data_dir = tempfile::tempdir().unwrap();
    let dir = data_dir.path();
    let (_serve, addr) = serve(dir);
    let _worker = echo_worker(&addr, dir);
    let submit = |queue: &str, timeout: &str| {
        let submitted = client(
            &addr,
            dir,
            &[
                "submit",
                "--namespace",
                "shop",
                "--activity",
                "echo",
                "--queue",
                queue,
                "--input",
                queue,
                "--timeout",
                timeout,
            ],
        );
        assert!(submitted.status.success(), "{}", stderr(&submitted));
        stdout(&submitted).trim().to_owned()
    };
    // `--queue` puts the dispatch in that queue: no worker serves `nobody`, so its deadline
    // ends it unserved.
    let stranded = submit("nobody", "1s");
    let served = submit("default", "5m");

    let ended = client(&addr, dir, &["outcome", &stranded, "--wait", "20s"]);
    assert_eq!(ended.status.code(), Some(3), "{}", stderr(&ended));
    assert!(
        stderr(&ended).contains("unserved: no_workers: no worker is registered in this pool"),
        "{}",
        stderr(&ended)
    );
    // Control: the one the worker ran exits 0 through the same command.
    let done = client(&addr, dir, &["outcome", &served, "--wait", "20s"]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(stdout(&done).trim(), "completed: default");

    // `--pool` selects by queue; `--limit` caps the rows, oldest first.
    let nobody = rows(&client(
        &addr,
        dir,
        &["dispatches", "--pool", "shop/nobody"],
    ));
    assert_eq!(nobody.len(), 1, "{nobody:?}");
    assert!(nobody[0].starts_with(&stranded), "{nobody:?}");
    let all = rows(&client(&addr, dir, &["dispatches", "--pool", "shop"]));
    assert_eq!(all.len(), 2, "{all:?}");
    let first = rows(&client(&addr, dir, &["dispatches", "--limit", "1"]));
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].starts_with(&stranded), "oldest first: {first:?}");

    // `dispatch --durable` records the dispatch before running it and prints its outcome;
    // control: the same command without `--durable` leaves no record.
    for durable in [false, true] {
        let mut args = vec!["dispatch", "shop", "echo", "--input", "direct"];
        if durable {
            args.push("--durable");
        }
        let ran = client(&addr, dir, &args);
        assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
        assert_eq!(stdout(&ran).trim(), "completed: direct");
        let listed = rows(&client(
            &addr,
            dir,
            &["dispatches", "--pool", "shop/default"],
        ));
        let recorded = listed.len() - 1;
        assert_eq!(
            recorded,
            usize::from(durable),
            "durable {durable}: {listed:?}"
        );
    }
}
