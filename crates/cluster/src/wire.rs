//! The bodies of cluster messages.
//!
//! Offers, their answers and the ends of forwarded dispatches travel in batches (wire version
//! 1, [`batch`]): one offer message carries up to [`MAX_BATCH`] dispatches of one pool, the
//! taker answers once for all of them (per forward: busy, taken, or ended with its end), and
//! the ends that come later travel several to a message. Inside a batch, an end (and a
//! cancel) is a *frame*: a 4-byte big-endian length, that many bytes of JSON metadata, then
//! the opaque payload (a task's output or failure message) as is.

use std::time::Duration;

mod batch;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use switchyard_core::{ActivityOutcome, ActivityRequest, TransportName, UnservedReason};

/// Why a message body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Shorter than its length prefix says.
    #[error("message body truncated")]
    Truncated,
    /// The metadata is not the expected JSON.
    #[error("message metadata: {0}")]
    Metadata(String),
    /// The body opens with another kind's or another version's tag.
    #[error("message tag {found}, expected {expected} (another wire version?)")]
    Tag { expected: String, found: String },
    /// A batch declares more entries than [`MAX_BATCH`].
    #[error("batch of {count} entries, more than the limit of {}", MAX_BATCH)]
    TooManyEntries { count: usize },
    /// Bytes follow the last entry of a batch.
    #[error("{extra} bytes after the last entry of a batch")]
    TrailingBytes { extra: usize },
}

pub(crate) use batch::{
    BatchAnswer, EntryAnswer, MAX_BATCH, OfferEntry, OfferHeader, decode_answers, decode_ends,
    decode_offers, encode_answers, encode_answers_bounded, encode_ends_bounded, encode_offers,
};

/// How a forwarded dispatch ended on its taker; the payload is the output, failure message
/// or unserved detail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndMeta {
    pub(crate) forward: u64,
    /// An [`ActivityOutcome::label`], or `lost` (the taker's worker was lost and it has no
    /// other: the origin offers again).
    pub(crate) end: String,
    #[serde(default)]
    pub(crate) retryable: bool,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) transport: Option<String>,
    #[serde(default)]
    pub(crate) attempts: u32,
}

/// What the origin learns at the end of a forwarded dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RemoteEnd {
    Outcome(ActivityOutcome),
    Lost,
}

/// A cancel's metadata, addressed to the taker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CancelMeta {
    pub(crate) origin: String,
    pub(crate) forward: u64,
}

pub(crate) fn frame<T: Serialize>(meta: &T, payload: &[u8]) -> Bytes {
    let json = serde_json::to_vec(meta).unwrap_or_default();
    let mut body = BytesMut::with_capacity(4 + json.len() + payload.len());
    body.put_u32(u32::try_from(json.len()).unwrap_or(u32::MAX));
    body.put_slice(&json);
    body.put_slice(payload);
    body.freeze()
}

pub(crate) fn unframe<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<(T, Bytes), WireError> {
    let len_bytes: [u8; 4] = body
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(WireError::Truncated)?;
    let len = u32::from_be_bytes(len_bytes) as usize;
    let end = 4usize.checked_add(len).ok_or(WireError::Truncated)?;
    let json = body.get(4..end).ok_or(WireError::Truncated)?;
    let meta = serde_json::from_slice(json).map_err(|e| WireError::Metadata(e.to_string()))?;
    Ok((meta, body.slice(end..)))
}

/// The request an offer asks the taker to run (no activity id: the origin holds it).
pub(crate) fn offered_request(header: &OfferHeader, entry: &OfferEntry) -> ActivityRequest {
    ActivityRequest {
        namespace: header.namespace.clone(),
        task_queue: header.task_queue.clone(),
        activity_type: header.activity_type.clone(),
        node: header.node.clone(),
        input: entry.input.clone(),
        activity_id: None,
        timeout: Duration::from_millis(entry.timeout_ms),
    }
}

pub(crate) fn encode_end(forward: u64, end: &RemoteEnd) -> Bytes {
    let mut meta = EndMeta {
        forward,
        end: String::new(),
        retryable: false,
        reason: None,
        transport: None,
        attempts: 0,
    };
    let payload: &[u8] = match end {
        RemoteEnd::Lost => {
            meta.end = "lost".to_owned();
            &[]
        }
        RemoteEnd::Outcome(outcome) => {
            meta.end = outcome.label().to_owned();
            match outcome {
                ActivityOutcome::Completed(output) => output,
                ActivityOutcome::Failed { message, retryable } => {
                    meta.retryable = *retryable;
                    message.as_bytes()
                }
                ActivityOutcome::Unserved { reason, detail } => {
                    meta.reason = Some(reason.as_str().to_owned());
                    detail.as_bytes()
                }
                ActivityOutcome::TransportLost {
                    transport,
                    attempts,
                } => {
                    meta.transport = Some(transport.as_str().to_owned());
                    meta.attempts = *attempts;
                    &[]
                }
                _ => &[],
            }
        }
    };
    frame(&meta, payload)
}

pub(crate) fn decode_end(body: &Bytes) -> Result<(u64, RemoteEnd), WireError> {
    let (meta, payload): (EndMeta, Bytes) = unframe(body)?;
    let text = || String::from_utf8_lossy(&payload).into_owned();
    let outcome = match meta.end.as_str() {
        "lost" => return Ok((meta.forward, RemoteEnd::Lost)),
        "completed" => ActivityOutcome::Completed(payload.clone()),
        "failed" => ActivityOutcome::Failed {
            message: text(),
            retryable: meta.retryable,
        },
        "timed_out" => ActivityOutcome::TimedOut,
        "cancelled" => ActivityOutcome::Cancelled,
        "unserved" => ActivityOutcome::Unserved {
            reason: meta
                .reason
                .as_deref()
                .and_then(UnservedReason::from_label)
                .unwrap_or(UnservedReason::NoCapacityInCluster),
            detail: text(),
        },
        "transport_lost" => ActivityOutcome::TransportLost {
            transport: TransportName::new(meta.transport.unwrap_or_default()),
            attempts: meta.attempts,
        },
        "shutting_down" => ActivityOutcome::ShuttingDown,
        other => return Err(WireError::Metadata(format!("unknown end {other:?}"))),
    };
    Ok((meta.forward, RemoteEnd::Outcome(outcome)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_round_trips() {
        let ends = [
            RemoteEnd::Lost,
            RemoteEnd::Outcome(ActivityOutcome::Completed(Bytes::from_static(b"\0out\n"))),
            RemoteEnd::Outcome(ActivityOutcome::Failed {
                message: "bad\ninput".to_owned(),
                retryable: true,
            }),
            RemoteEnd::Outcome(ActivityOutcome::TimedOut),
            RemoteEnd::Outcome(ActivityOutcome::Cancelled),
            RemoteEnd::Outcome(ActivityOutcome::Unserved {
                reason: UnservedReason::AllAtCapacity,
                detail: "full".to_owned(),
            }),
            RemoteEnd::Outcome(ActivityOutcome::TransportLost {
                transport: TransportName::new("quic"),
                attempts: 3,
            }),
            RemoteEnd::Outcome(ActivityOutcome::ShuttingDown),
        ];
        for (n, end) in ends.into_iter().enumerate() {
            let body = encode_end(n as u64, &end);
            assert_eq!(decode_end(&body), Ok((n as u64, end)));
        }
    }

    #[test]
    fn a_short_or_garbled_body_is_refused_not_trusted() {
        let body = encode_end(7, &RemoteEnd::Lost);
        assert_eq!(decode_end(&body.slice(..3)), Err(WireError::Truncated));
        assert_eq!(
            decode_end(&body.slice(..body.len() - 1)).map(|_| ()),
            Err(WireError::Truncated)
        );
        let mut wrong = body.to_vec();
        wrong[0] = 0xff;
        assert_eq!(decode_end(&Bytes::from(wrong)), Err(WireError::Truncated));
        // Control: the intact body reads.
        assert!(decode_end(&body).is_ok());
    }

    #[test]
    fn every_answer_round_trips_and_an_unknown_one_is_refused() {
        let answer = BatchAnswer {
            taker: "n2".to_owned(),
            entries: vec![
                (1, EntryAnswer::Busy),
                (2, EntryAnswer::Taken),
                (
                    9,
                    EntryAnswer::Ended(RemoteEnd::Outcome(ActivityOutcome::Completed(
                        Bytes::from_static(b"out"),
                    ))),
                ),
                (10, EntryAnswer::Ended(RemoteEnd::Lost)),
            ],
        };
        assert_eq!(decode_answers(&encode_answers(&answer)), Ok(answer));
        // Control: the words of the unbatched format are not read as answers.
        assert!(decode_answers(&Bytes::from_static(b"busy")).is_err());
        assert!(decode_answers(&Bytes::from_static(b"taken n2")).is_err());
    }

    #[test]
    fn an_offer_round_trips_without_its_activity_id() {
        let header = OfferHeader {
            origin: "a".to_owned(),
            namespace: "ns".to_owned(),
            task_queue: "q".to_owned(),
            activity_type: "act".to_owned(),
            node: None,
        };
        let entry = OfferEntry {
            forward: 1,
            timeout_ms: 1500,
            attempt_offset: 0,
            input: Bytes::from_static(b"input"),
        };
        let body = encode_offers(&header, std::slice::from_ref(&entry));
        let (read, entries) = decode_offers(&body).expect("round trip");
        assert_eq!(read, header);
        assert_eq!(entries, vec![entry]);
        let request = offered_request(&read, &entries[0]);
        assert_eq!(&request.input[..], b"input");
        assert_eq!(request.timeout, Duration::from_millis(1500));
        assert_eq!(request.activity_id, None);
    }
}
