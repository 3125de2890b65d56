//! The NATS server's message counters, read from its monitoring endpoint (`/varz`).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cmd::Failure;

/// Longest `/varz` answer read (nats-server's is a few KiB).
const MAX_VARZ_BYTES: u64 = 1024 * 1024;
/// How long one `/varz` read may take.
const VARZ_TIMEOUT: Duration = Duration::from_secs(5);

/// Messages the server has taken in from clients and delivered to them so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// `in_msgs`: messages clients published (a request, a reply and a publish count one each).
    pub(crate) in_msgs: u64,
    /// `out_msgs`: messages the server delivered to subscribers.
    pub(crate) out_msgs: u64,
}

/// NATS traffic over one measured phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Traffic {
    /// Messages published into NATS during the phase (every client, membership refreshes
    /// included).
    pub(crate) nats_in_msgs: u64,
    /// Messages NATS delivered during the phase.
    pub(crate) nats_out_msgs: u64,
    /// `nats_in_msgs` per dispatch of the phase: a forwarded dispatch publishes an offer, its
    /// reply and the outcome.
    pub(crate) nats_messages_per_dispatch: f64,
}

impl Traffic {
    /// The traffic between two readings, spread over `dispatches`.
    pub(crate) fn between(before: Counters, after: Counters, dispatches: u64) -> Self {
        let nats_in_msgs = after.in_msgs.saturating_sub(before.in_msgs);
        Self {
            nats_in_msgs,
            nats_out_msgs: after.out_msgs.saturating_sub(before.out_msgs),
            nats_messages_per_dispatch: nats_in_msgs as f64 / dispatches.max(1) as f64,
        }
    }
}

/// The `/varz` fields the bench reads.
#[derive(Debug)]
pub(crate) struct Varz {
    /// Message counters.
    pub(crate) counters: Counters,
    /// The server's version.
    pub(crate) version: String,
}

/// Reads `http://<monitor>/varz`.
pub(crate) async fn read(monitor: SocketAddr) -> Result<Varz, Failure> {
    let fail = |why: String| Failure::runtime(format!("NATS monitor {monitor}/varz: {why}"));
    let body = tokio::time::timeout(VARZ_TIMEOUT, get(monitor, "/varz"))
        .await
        .map_err(|_| fail(format!("no answer within {VARZ_TIMEOUT:?}")))?
        .map_err(|error| fail(error.to_string()))?;
    parse(&body).ok_or_else(|| fail("no in_msgs/out_msgs in the answer".to_owned()))
}

/// One HTTP/1.0 GET; the body, without the headers.
async fn get(monitor: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(monitor).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {monitor}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    stream
        .take(MAX_VARZ_BYTES)
        .read_to_string(&mut answer)
        .await?;
    Ok(answer
        .split_once("\r\n\r\n")
        .map_or(answer.as_str(), |(_, body)| body)
        .to_owned())
}

fn parse(body: &str) -> Option<Varz> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(Varz {
        counters: Counters {
            in_msgs: value.get("in_msgs")?.as_u64()?,
            out_msgs: value.get("out_msgs")?.as_u64()?,
        },
        version: value
            .get("version")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("unknown")
            .to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varz_gives_the_counters_and_the_version() {
        let body = r#"{"server_id":"x","version":"2.9.10","in_msgs":12,"out_msgs":30}"#;
        let varz = parse(body).expect("parses");
        assert_eq!(
            varz.counters,
            Counters {
                in_msgs: 12,
                out_msgs: 30
            }
        );
        assert_eq!(varz.version, "2.9.10");
        // Control: an answer without the counters is refused, not read as zero.
        assert!(parse(r#"{"version":"2.9.10"}"#).is_none());
    }

    #[test]
    fn traffic_counts_published_messages_per_dispatch() {
        let before = Counters {
            in_msgs: 100,
            out_msgs: 200,
        };
        let after = Counters {
            in_msgs: 400,
            out_msgs: 500,
        };
        let traffic = Traffic::between(before, after, 100);
        assert_eq!(traffic.nats_in_msgs, 300);
        assert_eq!(traffic.nats_out_msgs, 300);
        assert!((traffic.nats_messages_per_dispatch - 3.0).abs() < f64::EPSILON);
        // Control: no traffic, none per dispatch.
        let idle = Traffic::between(before, before, 100);
        assert_eq!(idle.nats_messages_per_dispatch, 0.0);
    }
}
