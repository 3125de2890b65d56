//! The WARN for a refused dispatch is logged once a minute per quota key, the next line
//! carrying the count it kept quiet (`docs/security.md`, "Quotas and fairness between
//! tenants"). A binary of its own: the subscriber that captures the lines is the process's
//! only one, so no other test's first log line can race its registration.
// Test helpers outside `#[test]` functions assert too.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{
    ActivityRequest, CallerIdentity, DispatchConfig, DispatchError, Dispatcher, Registry,
};

/// Everything logged, in the process.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// The quota refusals' WARN lines so far.
    fn refusals(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains("WARN") && line.contains("quota reached"))
            .map(str::to_owned)
            .collect()
    }
}

fn request(input: &'static [u8]) -> ActivityRequest {
    ActivityRequest {
        namespace: "ns".into(),
        task_queue: String::new(),
        activity_type: "work".into(),
        node: None,
        input: Bytes::from_static(input),
        activity_id: None,
        timeout: Duration::from_secs(5),
    }
}

/// Dispatches `input`, expecting a refusal for the quota `limit`.
async fn refused(dispatcher: &Dispatcher, input: &'static [u8], limit: &str) {
    match dispatcher
        .dispatch(&CallerIdentity::trusted("p"), request(input))
        .await
    {
        Err(DispatchError::QuotaExceeded { limit: got, .. }) => assert_eq!(got, limit),
        other => panic!("expected a refusal for {limit}, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_refusal_warns_once_a_minute_per_key_with_the_count_kept_quiet() {
    let lines = Lines::default();
    let writer = {
        let lines = lines.clone();
        move || lines.clone()
    };
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish(),
    )
    .unwrap();
    const BYTES: &str = "dispatch.max_held_input_bytes_per_namespace";
    const PARKED: &str = "dispatch.max_parked_per_namespace";
    let dispatcher = Dispatcher::new(
        Registry::default(),
        DispatchConfig {
            max_held_input_bytes_per_namespace: 4,
            max_parked_per_namespace: 0,
            ..DispatchConfig::default()
        },
    );
    let big: &[u8] = b"too big";
    for _ in 0..3 {
        refused(&dispatcher, big, BYTES).await;
    }
    assert_eq!(lines.refusals().len(), 1, "{:#?}", lines.refusals());
    // Another key has a line of its own within the same minute: a small input, no worker, and
    // no room to park.
    refused(&dispatcher, b"ok", PARKED).await;
    let refusals = lines.refusals();
    assert_eq!(refusals.len(), 2, "{refusals:#?}");
    assert!(refusals[1].contains(PARKED), "{}", refusals[1]);
    // Still within the minute: quiet.
    tokio::time::advance(Duration::from_secs(59)).await;
    refused(&dispatcher, big, BYTES).await;
    assert_eq!(lines.refusals().len(), 2, "{:#?}", lines.refusals());
    // A minute after the first line: the next one, counting the three kept quiet.
    tokio::time::advance(Duration::from_secs(1)).await;
    refused(&dispatcher, big, BYTES).await;
    let refusals = lines.refusals();
    assert_eq!(refusals.len(), 3, "{refusals:#?}");
    assert!(refusals[2].contains(BYTES), "{}", refusals[2]);
    assert!(refusals[2].contains("suppressed=3"), "{}", refusals[2]);
}
