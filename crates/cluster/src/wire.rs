//! The bodies of cluster messages.
//!
//! Offers, their answers and the ends of forwarded dispatches travel in batches (wire version
//! 2, [`batch`]): one offer message carries up to [`MAX_BATCH`] dispatches of one pool, the
//! taker answers once for all of them (per forward: busy, taken, or ended with its end), and
//! the ends that come later travel several to a message. An end is binary ([`end`]): a fixed
//! head, then the opaque payload (a task's output or failure message) as is. A cancel (and an
//! admin call) is a *frame*: a 4-byte big-endian length, that many bytes of JSON metadata,
//! then the payload.

use std::time::Duration;

mod batch;
mod end;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use switchyard_core::{ActivityOutcome, LocalEntry, LocalPool};

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

/// The pool an offer batch asks the taker to run its dispatches in.
pub(crate) fn offered_pool(header: &OfferHeader) -> LocalPool {
    LocalPool {
        namespace: header.namespace.clone(),
        task_queue: header.task_queue.clone(),
        activity_type: header.activity_type.clone(),
        node: header.node.clone(),
    }
}

/// What one dispatch of an offer batch asks the taker to run (no activity id: the origin
/// holds it).
pub(crate) fn offered_entry(entry: OfferEntry) -> LocalEntry {
    LocalEntry {
        input: entry.input,
        timeout: Duration::from_millis(entry.timeout_ms),
        attempt_offset: entry.attempt_offset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(offered_pool(&read).namespace, "ns");
        let local = offered_entry(entries[0].clone());
        assert_eq!(&local.input[..], b"input");
        assert_eq!(local.timeout, Duration::from_millis(1500));
    }
}
