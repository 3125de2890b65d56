//! The end of a forwarded dispatch on the wire (batched wire version 2): a fixed binary head,
//! the reason or transport name, then the payload as is, with no JSON.
//!
//! ```text
//! end  u64 forward | u8 kind | u8 retryable | u32 attempts | u16 label length | label | payload
//! ```
//!
//! `kind` is one of the `KIND_*` values below; `label` is the unserved reason's label or the
//! lost transport's name (empty otherwise); `payload`, up to the end of the frame, is the
//! output, the failure message or the unserved detail. Integers are big-endian. An end always
//! travels inside a batch, whose `u32` length bounds it.

use bytes::{BufMut, Bytes, BytesMut};
use switchyard_core::{ActivityOutcome, TransportName, UnservedReason};

use super::{RemoteEnd, WireError};

const KIND_LOST: u8 = 0;
const KIND_COMPLETED: u8 = 1;
const KIND_FAILED: u8 = 2;
const KIND_TIMED_OUT: u8 = 3;
const KIND_CANCELLED: u8 = 4;
const KIND_UNSERVED: u8 = 5;
const KIND_TRANSPORT_LOST: u8 = 6;
const KIND_SHUTTING_DOWN: u8 = 7;
/// An outcome this version does not know, its label as the label: refused by the reader.
const KIND_OTHER: u8 = 255;

/// The bytes of the fixed head: forward, kind, retryable, attempts, label length.
const HEAD: usize = 8 + 1 + 1 + 4 + 2;

/// The parts of an end as written: kind, retryable, attempts, label, payload.
fn parts(end: &RemoteEnd) -> (u8, bool, u32, &[u8], &[u8]) {
    let outcome = match end {
        RemoteEnd::Lost => return (KIND_LOST, false, 0, &[], &[]),
        RemoteEnd::Outcome(outcome) => outcome,
    };
    match outcome {
        ActivityOutcome::Completed(output) => (KIND_COMPLETED, false, 0, &[], output),
        ActivityOutcome::Failed { message, retryable } => {
            (KIND_FAILED, *retryable, 0, &[], message.as_bytes())
        }
        ActivityOutcome::TimedOut => (KIND_TIMED_OUT, false, 0, &[], &[]),
        ActivityOutcome::Cancelled => (KIND_CANCELLED, false, 0, &[], &[]),
        ActivityOutcome::Unserved { reason, detail } => (
            KIND_UNSERVED,
            false,
            0,
            reason.as_str().as_bytes(),
            detail.as_bytes(),
        ),
        ActivityOutcome::TransportLost {
            transport,
            attempts,
        } => (
            KIND_TRANSPORT_LOST,
            false,
            *attempts,
            transport.as_str().as_bytes(),
            &[],
        ),
        ActivityOutcome::ShuttingDown => (KIND_SHUTTING_DOWN, false, 0, &[], &[]),
        other => (KIND_OTHER, false, 0, other.label().as_bytes(), &[]),
    }
}

/// How many bytes [`put_end`] writes for `end`.
pub(super) fn end_len(end: &RemoteEnd) -> usize {
    let (_, _, _, label, payload) = parts(end);
    HEAD + label.len().min(usize::from(u16::MAX)) + payload.len()
}

/// Writes the end of `forward` into `body`.
pub(super) fn put_end(body: &mut BytesMut, forward: u64, end: &RemoteEnd) {
    let (kind, retryable, attempts, label, payload) = parts(end);
    let label = &label[..label.len().min(usize::from(u16::MAX))];
    body.put_u64(forward);
    body.put_u8(kind);
    body.put_u8(u8::from(retryable));
    body.put_u32(attempts);
    body.put_u16(u16::try_from(label.len()).unwrap_or(u16::MAX));
    body.put_slice(label);
    body.put_slice(payload);
}

/// The end of `forward` as a frame of its own.
#[cfg(test)]
pub(crate) fn encode_end(forward: u64, end: &RemoteEnd) -> Bytes {
    let mut body = BytesMut::with_capacity(end_len(end));
    put_end(&mut body, forward, end);
    body.freeze()
}

/// Reads one end; the payload shares `body`'s buffer.
pub(crate) fn decode_end(body: &Bytes) -> Result<(u64, RemoteEnd), WireError> {
    let head: [u8; HEAD] = body
        .get(..HEAD)
        .and_then(|head| head.try_into().ok())
        .ok_or(WireError::Truncated)?;
    let [
        f0,
        f1,
        f2,
        f3,
        f4,
        f5,
        f6,
        f7,
        kind,
        retryable,
        a0,
        a1,
        a2,
        a3,
        l0,
        l1,
    ] = head;
    let forward = u64::from_be_bytes([f0, f1, f2, f3, f4, f5, f6, f7]);
    let attempts = u32::from_be_bytes([a0, a1, a2, a3]);
    let label_end = HEAD + usize::from(u16::from_be_bytes([l0, l1]));
    let label = body.get(HEAD..label_end).ok_or(WireError::Truncated)?;
    let label = std::str::from_utf8(label)
        .map_err(|_| WireError::Metadata("end label is not UTF-8".to_owned()))?;
    let payload = body.slice(label_end..);
    let text = || String::from_utf8_lossy(&payload).into_owned();
    let outcome = match kind {
        KIND_LOST => return Ok((forward, RemoteEnd::Lost)),
        KIND_COMPLETED => ActivityOutcome::Completed(payload.clone()),
        KIND_FAILED => ActivityOutcome::Failed {
            message: text(),
            retryable: retryable != 0,
        },
        KIND_TIMED_OUT => ActivityOutcome::TimedOut,
        KIND_CANCELLED => ActivityOutcome::Cancelled,
        KIND_UNSERVED => ActivityOutcome::Unserved {
            reason: UnservedReason::from_label(label)
                .unwrap_or(UnservedReason::NoCapacityInCluster),
            detail: text(),
        },
        KIND_TRANSPORT_LOST => ActivityOutcome::TransportLost {
            transport: TransportName::new(label.to_owned()),
            attempts,
        },
        KIND_SHUTTING_DOWN => ActivityOutcome::ShuttingDown,
        KIND_OTHER => return Err(WireError::Metadata(format!("unknown end {label:?}"))),
        kind => return Err(WireError::Metadata(format!("unknown end kind {kind}"))),
    };
    Ok((forward, RemoteEnd::Outcome(outcome)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_round_trips_in_the_length_it_announces() {
        let ends = [
            RemoteEnd::Lost,
            RemoteEnd::Outcome(ActivityOutcome::Completed(Bytes::from_static(b"\0out\n"))),
            RemoteEnd::Outcome(ActivityOutcome::Failed {
                message: "bad\ninput".to_owned(),
                retryable: true,
            }),
            RemoteEnd::Outcome(ActivityOutcome::Failed {
                message: String::new(),
                retryable: false,
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
            assert_eq!(body.len(), end_len(&end));
            assert_eq!(decode_end(&body), Ok((n as u64, end)));
        }
    }

    #[test]
    fn a_completed_end_carries_its_output_with_a_sixteen_byte_head_and_no_json() {
        let body = encode_end(
            0x0102,
            &RemoteEnd::Outcome(ActivityOutcome::Completed(Bytes::from_static(b"out"))),
        );
        assert_eq!(
            &body[..],
            b"\0\0\0\0\0\0\x01\x02\x01\0\0\0\0\0\0\0out".as_slice()
        );
        // Control: the JSON end of wire version 1 is not read as an end of this one.
        let json = b"\0\0\0\x20{\"forward\":1,\"end\":\"completed\"}out";
        assert!(decode_end(&Bytes::from_static(json)).is_err());
    }

    #[test]
    fn a_short_or_garbled_end_is_refused_not_trusted() {
        let body = encode_end(
            7,
            &RemoteEnd::Outcome(ActivityOutcome::TransportLost {
                transport: TransportName::new("grpc"),
                attempts: 2,
            }),
        );
        for cut in 0..body.len() {
            assert_eq!(
                decode_end(&body.slice(..cut)),
                Err(WireError::Truncated),
                "cut at {cut}"
            );
        }
        let mut wrong = body.to_vec();
        wrong[8] = 42;
        assert!(matches!(
            decode_end(&Bytes::from(wrong)),
            Err(WireError::Metadata(_))
        ));
        // Control: the intact body reads.
        assert!(decode_end(&body).is_ok());
    }

    /// `docs/cluster.md`, "Batched offers": the kind byte of each end (0 lost, 1 completed,
    /// 2 failed, 3 timed out, 4 cancelled, 5 unserved, 6 transport lost, 7 shutting down),
    /// byte 8 of the head, with the retryable flag, attempts and label where they apply:
    /// numbers written here, so a renumbering breaks a mixed-version cluster visibly.
    #[test]
    fn each_end_kind_has_its_documented_byte() {
        let cases = [
            (RemoteEnd::Lost, 0, 0, 0, &b""[..]),
            (
                RemoteEnd::Outcome(ActivityOutcome::Completed(Bytes::new())),
                1,
                0,
                0,
                b"",
            ),
            (
                RemoteEnd::Outcome(ActivityOutcome::Failed {
                    message: String::new(),
                    retryable: true,
                }),
                2,
                1,
                0,
                b"",
            ),
            (RemoteEnd::Outcome(ActivityOutcome::TimedOut), 3, 0, 0, b""),
            (RemoteEnd::Outcome(ActivityOutcome::Cancelled), 4, 0, 0, b""),
            (
                RemoteEnd::Outcome(ActivityOutcome::Unserved {
                    reason: UnservedReason::NoWorkers,
                    detail: String::new(),
                }),
                5,
                0,
                0,
                b"no_workers",
            ),
            (
                RemoteEnd::Outcome(ActivityOutcome::TransportLost {
                    transport: TransportName::new("quic"),
                    attempts: 3,
                }),
                6,
                0,
                3,
                b"quic",
            ),
            (
                RemoteEnd::Outcome(ActivityOutcome::ShuttingDown),
                7,
                0,
                0,
                b"",
            ),
        ];
        for (end, kind, retryable, attempts, label) in cases {
            let body = encode_end(9, &end);
            let mut head = vec![0, 0, 0, 0, 0, 0, 0, 9, kind, retryable];
            head.extend_from_slice(&u32::to_be_bytes(attempts));
            head.extend_from_slice(&u16::to_be_bytes(label.len() as u16));
            head.extend_from_slice(label);
            assert_eq!(&body[..], &head[..], "{end:?}");
        }
    }
}
