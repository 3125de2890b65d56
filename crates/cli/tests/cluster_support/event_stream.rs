//! An open `/v1/events` stream read the way a browser's `EventSource` reads it: raw HTTP/1.0
//! on loopback, `Last-Event-ID` sent when resuming, events split on blank lines.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

use serde_json::Value;

use crate::harness::PATIENCE;

/// An open `/v1/events` stream on a loopback operations port, read as raw text.
pub struct EventStream {
    stream: tokio::net::TcpStream,
    /// Everything read so far, the response's head included.
    pub seen: String,
}

impl EventStream {
    /// Opens `/v1/events` on `port`, sending `last_event_id` when given.
    pub async fn open(port: u16, last_event_id: Option<&str>) -> Self {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("ops listens");
        let resume = last_event_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
        stream
            .write_all(
                format!("GET /v1/events HTTP/1.0\r\nHost: localhost\r\n{resume}\r\n").as_bytes(),
            )
            .await
            .unwrap();
        Self {
            stream,
            seen: String::new(),
        }
    }

    /// Reads until an event's data line satisfies `wanted`; returns that line's JSON and the
    /// `id` sent with it.
    pub async fn until(&mut self, wanted: impl Fn(&Value) -> bool) -> (Value, String) {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(found) = self.events().into_iter().find(|(json, _)| wanted(json)) {
                return found;
            }
            let mut buffer = [0u8; 4096];
            let read = tokio::time::timeout_at(deadline, self.stream.read(&mut buffer))
                .await
                .unwrap_or_else(|_| panic!("no such event; the stream sent: {}", self.seen))
                .unwrap();
            assert!(read > 0, "the stream ended: {}", self.seen);
            self.seen
                .push_str(&String::from_utf8_lossy(&buffer[..read]));
        }
    }

    /// Every complete event read so far: its data as JSON and its id (empty when none).
    pub fn events(&self) -> Vec<(Value, String)> {
        let body = self
            .seen
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body);
        let complete = body.rsplit_once("\n\n").map_or("", |(done, _)| done);
        complete
            .split("\n\n")
            .filter_map(|event| {
                let field = |name: &str| {
                    event
                        .lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(str::to_owned)
                };
                let data = serde_json::from_str(&field("data: ")?).ok()?;
                Some((data, field("id: ").unwrap_or_default()))
            })
            .collect()
    }
}
