//! The console at the operations listener's `/`, driven in a real headless Chromium over
//! WebDriver against `switchyard serve` with gRPC and QUIC workers (`switchyard worker`
//! processes), loopback only: the pools, workers and unserved tables show what the JSON API
//! says; a worker that connects appears without a reload; a parked dispatch appears under
//! Unserved with its reason and its explanation opens; a drained worker's event shows up; the
//! page polls every 2 s, not while hidden, and at once when shown again. A screenshot is saved
//! under `target/tmp/console-test/`.
//!
//! Needs Debian's `chromium` and `chromium-driver`; without them the test says why and
//! passes, unless `CI_REQUIRE_CHROMIUM` is set (as `.ci/run` does), when it fails.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Every wait gives up after this long.
const PATIENCE: Duration = Duration::from_secs(40);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(200);

fn switchyard() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process, killed on drop.
struct Process(Child);

impl Process {
    /// The process's exit status once it exits by itself, within [`PATIENCE`].
    fn exited(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {PATIENCE:?}"
            );
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1 request on a fresh loopback connection; the status and the body.
async fn http(method: &str, addr: SocketAddr, path: &str, body: Option<&Value>) -> (u16, Bytes) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let payload = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(payload))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, bytes)
}

async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http("GET", addr, path, None).await;
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// Polls `check` until it gives `Some`, at most [`PATIENCE`].
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// A WebDriver session on chromedriver's HTTP JSON protocol: just what this test needs.
struct Browser {
    driver: SocketAddr,
    session: String,
    _chromedriver: Process,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Self {
        let port = free_tcp();
        let driver = SocketAddr::from(([127, 0, 0, 1], port));
        let chromedriver = Process(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts"),
        );
        wait_for("chromedriver to be ready", || async move {
            tokio::net::TcpStream::connect(driver).await.ok()?;
            let (status, body) = http("GET", driver, "/status", None).await;
            let status_json: Value = serde_json::from_slice(&body).ok()?;
            (status == 200 && status_json["value"]["ready"] == true).then_some(())
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": CHROMIUM,
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        "--window-size=1440,1300",
                        format!("--user-data-dir={}", profile.path().display()),
                    ],
                },
            }},
        });
        let (status, body) = http("POST", driver, "/session", Some(&capabilities)).await;
        let reply: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 200, "new session: {reply}");
        let session = reply["value"]["sessionId"].as_str().unwrap().to_owned();
        Self {
            driver,
            session,
            _chromedriver: chromedriver,
            _profile: profile,
        }
    }

    async fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, reply) = http(method, self.driver, &path, body.as_ref()).await;
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(status, 200, "{method} {path}: {reply}");
        reply["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` in the page (its `arguments` are `args`) and returns its value.
    async fn run(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Clicks the first element matching `css`.
    async fn click(&self, css: &str) {
        let found = self
            .command(
                "POST",
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        let id = found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap()
            .to_owned();
        self.command("POST", &format!("/element/{id}/click"), Some(json!({})))
            .await;
    }

    async fn screenshot(&self, path: &Path) {
        let encoded = self.command("GET", "/screenshot", None).await;
        let png = base64_decode(encoded.as_str().unwrap());
        assert_eq!(&png[..4], b"\x89PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    async fn close(self) {
        let path = format!("/session/{}", self.session);
        let _ = http("DELETE", self.driver, &path, None).await;
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// Whether the browser is here; when it is not, why (and a panic in CI).
fn browser_missing() -> Option<String> {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|p| !Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return None;
    }
    let why = format!(
        "{} missing (apt-get install -y chromium chromium-driver)",
        missing.join(" and ")
    );
    assert!(
        std::env::var_os("CI_REQUIRE_CHROMIUM").is_none(),
        "CI_REQUIRE_CHROMIUM is set but {why}"
    );
    Some(why)
}

/// `switchyard serve` on free loopback ports, its data directory and where it listens.
struct Gateway {
    _process: Process,
    data_dir: tempfile::TempDir,
    grpc: u16,
    quic: u16,
    ops: SocketAddr,
}

impl Gateway {
    fn start() -> Self {
        let data_dir = tempfile::tempdir().unwrap();
        let (grpc, quic, ops) = (free_tcp(), free_udp(), free_tcp());
        let mut child = Command::new(switchyard())
            .arg("serve")
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--quic-listen", &format!("127.0.0.1:{quic}")])
            .args(["--ops-listen", &format!("127.0.0.1:{ops}")])
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(["--log-filter", "warn"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let process = Process(child);
        // Read to the end on a thread of its own: a closed pipe would fail the gateway's next
        // line of output.
        let (lines, banner_lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut banner = String::new();
        while let Ok(line) = banner_lines.recv_timeout(PATIENCE) {
            banner.push_str(&line);
            banner.push('\n');
            if line.trim_start().starts_with("tls") {
                break;
            }
        }
        // The banner names the console's address.
        assert!(
            banner.contains(&format!("console http://127.0.0.1:{ops}/")),
            "{banner}"
        );
        Self {
            _process: process,
            data_dir,
            grpc,
            quic,
            ops: SocketAddr::from(([127, 0, 0, 1], ops)),
        }
    }

    fn client(&self, command: &mut Command) {
        command
            .args(["--endpoint", &format!("https://127.0.0.1:{}", self.grpc)])
            .arg("--data-dir")
            .arg(self.data_dir.path());
    }

    fn worker(&self, transport: &str, node: &str) -> Process {
        let mut command = Command::new(switchyard());
        command
            .args(["worker", "--transport", transport])
            .args(["--activity", "echo=echo", "--activity", "resize=sleep:50"])
            .args(["--activity", "flaky=fail"])
            .args(["--node", node, "--capacity", "4"]);
        if transport == "quic" {
            command.args(["--quic-addr", &format!("127.0.0.1:{}", self.quic)]);
        }
        self.client(&mut command);
        Process(
            command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn cli(&self, args: &[&str]) -> Command {
        let mut command = Command::new(switchyard());
        command.args(args);
        self.client(&mut command);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        command
    }

    async fn worker_ids(&self) -> Vec<u64> {
        let body = get_json(self.ops, "/v1/workers").await;
        body["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["worker_id"].as_u64().unwrap())
            .collect()
    }

    /// Waits for `n` workers registered, every one eligible; their ids.
    async fn eligible_workers(&self, n: usize) -> Vec<Value> {
        let ops = self.ops;
        wait_for(&format!("{n} eligible workers"), || async move {
            let body = get_json(ops, "/v1/workers").await;
            let workers = body["workers"].as_array().unwrap().clone();
            (workers.len() == n && workers.iter().all(|w| w["standing"] == "eligible"))
                .then_some(workers)
        })
        .await
    }
}

/// Waits until the page's `script` returns `want`; the last value seen on failure.
async fn wait_for_page(browser: &Browser, what: &str, script: &str, want: &Value) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen = browser.run(script, json!([])).await;
        if &seen == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {what}: page shows {seen}, want {want}"
        );
        tokio::time::sleep(POLL).await;
    }
}

const WORKER_IDS: &str = "return [...document.querySelectorAll('#workers tbody tr')]\
    .map(r => Number(r.dataset.workerId)).sort((a, b) => a - b);";

const POOL_ROWS: &str = "return [...document.querySelectorAll('#pools tbody tr')].map(r => ({\
    namespace: r.dataset.namespace, task_queue: r.dataset.taskQueue,\
    workers: Number(r.querySelector('[data-field=workers]').textContent),\
    capacity: Number(r.querySelector('[data-field=capacity]').textContent),\
    in_flight: Number(r.querySelector('[data-field=in_flight]').textContent),\
    parked: Number(r.querySelector('[data-field=parked]').textContent)}));";

const UNSERVED_ROWS: &str = "return [...document.querySelectorAll('#unserved tbody tr')].map(r => ({\
    namespace: r.dataset.namespace, activity_type: r.dataset.activity, reason: r.dataset.reason,\
    shown: r.querySelector('.reason').textContent,\
    waiting: Number(r.querySelector('[data-field=waiting]').textContent)}));";

fn pools_of(api: &Value) -> Value {
    Value::Array(
        api["pools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                json!({
                    "namespace": p["namespace"], "task_queue": p["task_queue"],
                    "workers": p["workers"], "capacity": p["capacity"],
                    "in_flight": p["in_flight"], "parked": p["parked"],
                })
            })
            .collect(),
    )
}

fn unserved_of(api: &Value) -> Value {
    Value::Array(
        api["unserved"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| {
                json!({
                    "namespace": q["namespace"], "activity_type": q["activity_type"],
                    "reason": q["reason"],
                    "shown": q["reason"].as_str().unwrap().replace('_', " "),
                    "waiting": q["waiting"],
                })
            })
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_what_the_api_says_and_follows_the_fleet_live() {
    if let Some(why) = browser_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let gateway = Gateway::start();
    let _grpc = gateway.worker("grpc", "rack-a");
    let mut quic = gateway.worker("quic", "rack-b");
    let two = gateway.eligible_workers(2).await;
    let quic_id = two
        .iter()
        .find(|w| w["transport"] == "quic")
        .map(|w| w["worker_id"].as_u64().unwrap())
        .unwrap();
    // Some dispatches, so the pool's chart has something to draw: they land in the history.
    // Control: none is there before.
    let history = get_json(gateway.ops, "/v1/history").await;
    assert_eq!(history["pools"], json!([]), "{history}");
    for i in 0..15 {
        let (activity, exit) = match i % 5 {
            0 => ("resize", 0),
            4 => ("flaky", 3),
            _ => ("echo", 0),
        };
        let status = gateway
            .cli(&["dispatch", "default", activity, "--input", "hello"])
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(exit), "dispatch {i} of {activity}");
    }
    let history = get_json(gateway.ops, "/v1/history").await;
    let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
    for point in history["pools"][0]["points"].as_array().unwrap() {
        for (outcome, n) in point["outcomes"].as_object().unwrap() {
            *outcomes.entry(outcome.clone()).or_default() += n.as_u64().unwrap();
        }
    }
    assert_eq!(history["pools"][0]["namespace"], "default");
    assert_eq!(
        outcomes,
        [("completed".to_owned(), 12), ("failed".to_owned(), 3)].into()
    );

    let browser = Browser::start().await;
    browser.goto(&format!("http://{}/", gateway.ops)).await;

    // Workers: the page lists exactly the API's workers.
    let ids = json!(gateway.worker_ids().await);
    wait_for_page(&browser, "the workers table", WORKER_IDS, &ids).await;
    let about = browser
        .run(
            "return document.getElementById('about').textContent;",
            json!([]),
        )
        .await;
    assert!(
        about
            .as_str()
            .unwrap()
            .contains(&format!("ops {}", gateway.ops)),
        "the page says which gateway it shows: {about}"
    );

    // Pools: the same rows and figures as /v1/pools.
    let pools = pools_of(&get_json(gateway.ops, "/v1/pools").await);
    assert_eq!(pools.as_array().unwrap().len(), 1, "{pools}");
    wait_for_page(&browser, "the pools table", POOL_ROWS, &pools).await;
    wait_for_page(
        &browser,
        "the pool's chart",
        "return document.querySelectorAll('#pools tbody tr svg rect').length > 0;",
        &json!(true),
    )
    .await;

    // A worker that connects appears without a reload. Control: it was not there before.
    let before = browser.run(WORKER_IDS, json!([])).await;
    let _third = gateway.worker("grpc", "rack-c");
    gateway.eligible_workers(3).await;
    let ids = json!(gateway.worker_ids().await);
    assert_ne!(before, ids);
    wait_for_page(&browser, "the new worker", WORKER_IDS, &ids).await;

    // A parked dispatch appears under Unserved with its reason. Control: nothing was parked.
    let none = browser.run(UNSERVED_ROWS, json!([])).await;
    assert_eq!(none, json!([]));
    let _parked = Process(
        gateway
            .cli(&["dispatch", "default", "transcode", "--timeout", "5m"])
            .spawn()
            .unwrap(),
    );
    let ops = gateway.ops;
    let unserved = wait_for("the dispatch to park", || async move {
        let body = get_json(ops, "/v1/unserved").await;
        (!body["unserved"].as_array().unwrap().is_empty()).then_some(body)
    })
    .await;
    let unserved = unserved_of(&unserved);
    assert_eq!(unserved[0]["activity_type"], "transcode");
    wait_for_page(&browser, "the unserved table", UNSERVED_ROWS, &unserved).await;

    // Its explanation opens on a click: every worker of the pool, and why it cannot take it.
    let hidden = browser
        .run(
            "return document.getElementById('explain').hidden;",
            json!([]),
        )
        .await;
    assert_eq!(hidden, json!(true));
    browser
        .click("#unserved tbody tr[data-activity=transcode]")
        .await;
    let explained = get_json(
        gateway.ops,
        "/v1/explain?namespace=default&task_queue=default&activity_type=transcode",
    )
    .await;
    let expected: Vec<Value> = explained["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| json!([w["worker_id"], w["explanation"]]))
        .collect();
    assert_eq!(expected.len(), 3);
    wait_for_page(
        &browser,
        "the explanation",
        "const e = document.getElementById('explain'); if (e.hidden) return null;\
         return [...e.querySelectorAll('tbody tr')].map(r => \
         [Number(r.dataset.workerId), r.querySelector('.why').textContent]);",
        &json!(expected),
    )
    .await;

    // A drained worker's event shows up. Control: no such event before the drain.
    let drained = format!(
        "return [...document.querySelectorAll('#events li[data-kind=disconnected]')]\
         .filter(li => li.dataset.workerId === '{quic_id}').map(li => li.dataset.detail);"
    );
    assert_eq!(browser.run(&drained, json!([])).await, json!([]));
    let status = gateway
        .cli(&["drain", &quic_id.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "drain");
    wait_for_page(&browser, "the drain event", &drained, &json!(["drained"])).await;
    // A final drain ends the `switchyard worker` process, with success.
    assert_eq!(quic.exited().code(), Some(0), "the drained worker's exit");

    // Settle the tables on the final state, then keep the picture.
    let ids = json!(gateway.worker_ids().await);
    wait_for_page(&browser, "the workers after the drain", WORKER_IDS, &ids).await;
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("console-test")
        .join("console.png");
    browser.screenshot(&shot).await;
    eprintln!("screenshot: {}", shot.display());
    browser.close().await;
}

/// Installs a recorder of the page's refreshes (each sets `body[data-refreshed]`) and a
/// stand-in for `document.hidden` the test flips.
const RECORD_REFRESHES: &str = "window.__refreshes = []; window.__hidden = false;\
    Object.defineProperty(document, 'hidden', { configurable: true, get: () => window.__hidden });\
    new MutationObserver(() => window.__refreshes.push(performance.now()))\
      .observe(document.body, { attributes: true, attributeFilter: ['data-refreshed'] });\
    return true;";

/// The page's refresh times recorded since the last call (ms, the page's clock), then cleared.
const TAKE_REFRESHES: &str = "const r = window.__refreshes; window.__refreshes = []; return r;";

/// Hides the page (`arguments[0]` true) or shows it again, telling it as a browser does; returns
/// the page's clock at that moment.
const SET_HIDDEN: &str = "window.__hidden = arguments[0];\
    document.dispatchEvent(new Event('visibilitychange')); return performance.now();";

/// As `docs/operations.md` says: the page polls every 2 s, not while the tab is hidden, and
/// refreshes as soon as it is shown again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_polls_every_2_s_and_not_while_hidden() {
    if let Some(why) = browser_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let gateway = Gateway::start();
    let browser = Browser::start().await;
    browser.goto(&format!("http://{}/", gateway.ops)).await;
    wait_for_page(
        &browser,
        "the first refresh",
        "return document.body.dataset.refreshed !== undefined;",
        &json!(true),
    )
    .await;
    assert_eq!(browser.run(RECORD_REFRESHES, json!([])).await, json!(true));
    let taken = |value: Value| -> Vec<f64> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap())
            .collect()
    };

    // Shown: a refresh every 2 s (and the time a refresh takes).
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    let shown = taken(browser.run(TAKE_REFRESHES, json!([])).await);
    assert!(
        (2..=4).contains(&shown.len()),
        "refreshes in 7 s shown: {shown:?}"
    );
    for gap in shown.windows(2).map(|w| w[1] - w[0]) {
        assert!((1_900.0..3_500.0).contains(&gap), "{shown:?}");
    }

    // Hidden for 2.5 s (at least one tick of the 2 s timer falls in it): no refresh. Shown
    // again: a refresh at once, not at the next tick. The cycles are 2.5 s apart, so the
    // moments the page is shown fall at different points of the timer's 2 s cycle: a page that
    // only refreshed at its ticks would miss the 700 ms bound in some of them.
    for cycle in 0..4 {
        let hidden_at = browser
            .run(SET_HIDDEN, json!([true]))
            .await
            .as_f64()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        // A refresh already under way when the page was hidden may still land in its first
        // moments; the 2.2 s after them hold at least one tick.
        let hidden: Vec<f64> = taken(browser.run(TAKE_REFRESHES, json!([])).await)
            .into_iter()
            .filter(|at| at - hidden_at > 300.0)
            .collect();
        assert!(
            hidden.is_empty(),
            "cycle {cycle}: refreshed while hidden: {hidden:?}"
        );
        let shown_at = browser
            .run(SET_HIDDEN, json!([false]))
            .await
            .as_f64()
            .unwrap();
        let deadline = Instant::now() + PATIENCE;
        let first = loop {
            let seen = taken(browser.run(TAKE_REFRESHES, json!([])).await);
            if let Some(first) = seen.first() {
                break *first;
            }
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: no refresh once shown"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            first - shown_at < 700.0,
            "cycle {cycle}: the refresh came {:.0} ms after the page was shown",
            first - shown_at
        );
    }
    browser.close().await;
}
