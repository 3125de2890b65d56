//! Frame encoding: a 4-byte big-endian length, then that many bytes of one protobuf envelope.
//!
//! [`FrameDecoder`] is the whole decoder, with no I/O: bytes are pushed in as they arrive and
//! complete frame bodies come out. The length prefix is checked against the stream's limit
//! before any room is reserved for the body, so a peer cannot make the reader allocate more
//! than the limit plus one read's worth of bytes.

mod io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

pub(crate) use io::{FrameReader, ReadFrameError};

use crate::protocol::LENGTH_PREFIX_BYTES;

/// Why bytes could not be turned into a frame, or a message into bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix (or an outgoing message) exceeds the limit for its stream.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The declared (or encoded) body length.
        len: u64,
        /// The limit in force.
        max: u32,
    },
    /// The body is not a valid protobuf encoding of the stream's envelope.
    #[error("frame body does not decode: {0}")]
    Malformed(#[from] prost::DecodeError),
    /// The message could not be encoded (the buffer refused it).
    #[error("frame does not encode: {0}")]
    Unencodable(#[from] prost::EncodeError),
    /// The envelope decoded but carries no frame variant.
    #[error("frame envelope carries no message")]
    Empty,
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({buffered} bytes of it received)")]
    Truncated {
        /// Bytes of the unfinished frame that had arrived.
        buffered: usize,
    },
}

/// Incremental decoder of length-prefixed frames for one stream direction.
///
/// # Examples
///
/// ```
/// use switchyard_transport_quic::frame::{FrameDecoder, encode_frame};
/// use switchyard_proto::v1::{QuicPing, QuicLaneDown, quic_lane_down::Frame};
///
/// let ping = QuicLaneDown { frame: Some(Frame::Ping(QuicPing { seq: 7 })) };
/// let bytes = encode_frame(&ping, 64)?;
/// assert_eq!(&bytes[..], &[0, 0, 0, 4, 0x12, 0x02, 0x08, 0x07]);
///
/// let mut decoder = FrameDecoder::new(64);
/// decoder.push(&bytes[..3]);
/// assert_eq!(decoder.next_frame()?, None, "the prefix is not complete yet");
/// decoder.push(&bytes[3..]);
/// let body = decoder.next_frame()?.expect("a whole frame was pushed");
/// assert_eq!(switchyard_transport_quic::frame::decode::<QuicLaneDown>(body)?, ping);
/// # Ok::<(), switchyard_transport_quic::frame::FrameError>(())
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max: u32,
    /// Body length of the frame being assembled, once its prefix has been read.
    body_len: Option<usize>,
}

impl FrameDecoder {
    /// A decoder refusing bodies longer than `max_frame` bytes.
    pub fn new(max_frame: u32) -> Self {
        Self {
            buf: BytesMut::new(),
            max: max_frame,
            body_len: None,
        }
    }

    /// The largest body this decoder accepts.
    pub fn max_frame(&self) -> u32 {
        self.max
    }

    /// Appends bytes received from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that do not yet form a whole frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes still missing before the next frame (or its prefix) is complete.
    pub fn wanted(&self) -> usize {
        let need = match self.body_len {
            Some(len) => LENGTH_PREFIX_BYTES + len,
            None => LENGTH_PREFIX_BYTES,
        };
        need.saturating_sub(self.buf.len()).max(1)
    }

    /// The next complete frame body, `None` until enough bytes have been pushed.
    ///
    /// A [`FrameError::TooLarge`] is final: the stream cannot be resynchronised.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        let len = match self.body_len {
            Some(len) => len,
            None => {
                let Some(prefix) = self.buf.get(..LENGTH_PREFIX_BYTES) else {
                    return Ok(None);
                };
                let declared = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
                if declared > self.max {
                    return Err(FrameError::TooLarge {
                        len: u64::from(declared),
                        max: self.max,
                    });
                }
                let len = declared as usize;
                // Only now, with the length known to be within the limit, make room for it.
                self.buf
                    .reserve((LENGTH_PREFIX_BYTES + len).saturating_sub(self.buf.len()));
                self.body_len = Some(len);
                len
            }
        };
        if self.buf.len() < LENGTH_PREFIX_BYTES + len {
            return Ok(None);
        }
        self.buf.advance(LENGTH_PREFIX_BYTES);
        self.body_len = None;
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// Called at the end of the stream: an error if a frame was left unfinished.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buf.len(),
            })
        }
    }
}

/// Decodes one frame body as the envelope `M`.
pub fn decode<M: Message + Default>(body: Bytes) -> Result<M, FrameError> {
    Ok(M::decode(body)?)
}

/// Encodes `message` as one frame (prefix included), refusing bodies over `max_frame` bytes.
pub fn encode_frame<M: Message>(message: &M, max_frame: u32) -> Result<Bytes, FrameError> {
    let len = message.encoded_len();
    if len > max_frame as usize {
        return Err(FrameError::TooLarge {
            len: len as u64,
            max: max_frame,
        });
    }
    let mut buf = BytesMut::with_capacity(LENGTH_PREFIX_BYTES + len);
    // `len <= max_frame`, a u32, so the cast is exact.
    buf.put_u32(len as u32);
    message.encode(&mut buf)?;
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use switchyard_proto::v1::{
        Failure, QuicLaneDown, QuicLaneUp, QuicPong, QuicResult, QuicTask, quic_lane_down,
        quic_lane_up, quic_result,
    };

    use super::*;

    fn decode_all(decoder: &mut FrameDecoder) -> Result<Vec<Bytes>, FrameError> {
        let mut out = Vec::new();
        while let Some(body) = decoder.next_frame()? {
            out.push(body);
        }
        Ok(out)
    }

    #[test]
    fn oversized_prefix_is_refused_before_reserving_room() {
        let mut decoder = FrameDecoder::new(1024);
        decoder.push(&u32::MAX.to_be_bytes());
        let capacity_before = decoder.buf.capacity();
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLarge {
                len: u64::from(u32::MAX),
                max: 1024
            })
        );
        assert_eq!(
            decoder.buf.capacity(),
            capacity_before,
            "nothing was reserved"
        );
    }

    #[test]
    fn limit_is_inclusive() {
        let mut decoder = FrameDecoder::new(3);
        decoder.push(&[0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 4]);
        assert_eq!(decoder.next_frame().unwrap().unwrap(), &[1, 2, 3][..]);
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::TooLarge { len: 4, max: 3 })
        ));
    }

    #[test]
    fn zero_length_frame_is_an_empty_envelope() {
        let mut decoder = FrameDecoder::new(16);
        decoder.push(&[0, 0, 0, 0]);
        let body = decoder.next_frame().unwrap().unwrap();
        let envelope: QuicLaneUp = decode(body).unwrap();
        assert_eq!(envelope.frame, None);
    }

    #[test]
    fn truncated_stream_is_reported_with_what_arrived() {
        let mut decoder = FrameDecoder::new(16);
        assert_eq!(decoder.finish(), Ok(()));
        decoder.push(&[0, 0, 0, 5, 1]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.wanted(), 4);
        assert_eq!(decoder.finish(), Err(FrameError::Truncated { buffered: 5 }));
    }

    #[test]
    fn garbage_body_is_malformed() {
        // Field 1 with wire type 7 does not exist.
        let body = Bytes::from_static(&[0x0f, 0x01]);
        assert!(matches!(
            decode::<QuicLaneUp>(body),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn encoder_refuses_what_the_peer_would_refuse() {
        let pong = QuicLaneUp {
            frame: Some(quic_lane_up::Frame::Pong(QuicPong { seq: 1 })),
        };
        let len = pong.encoded_len();
        assert!(encode_frame(&pong, len as u32).is_ok());
        assert_eq!(
            encode_frame(&pong, len as u32 - 1),
            Err(FrameError::TooLarge {
                len: len as u64,
                max: len as u32 - 1
            })
        );
    }

    fn task_strategy() -> impl Strategy<Value = QuicLaneDown> {
        (
            any::<u64>(),
            ".{0,12}",
            ".{0,12}",
            prop::collection::vec(any::<u8>(), 0..300),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(
                |(task_id, namespace, activity_type, input, attempt, deadline)| QuicLaneDown {
                    frame: Some(quic_lane_down::Frame::Task(QuicTask {
                        task_id,
                        namespace,
                        task_queue: "default".to_owned(),
                        activity_type,
                        input: input.into(),
                        attempt,
                        deadline_unix_ms: deadline,
                    })),
                },
            )
    }

    fn result_strategy() -> impl Strategy<Value = QuicLaneUp> {
        (
            any::<u64>(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..200)),
            ".{0,20}",
            any::<bool>(),
        )
            .prop_map(|(task_id, output, message, retryable)| QuicLaneUp {
                frame: Some(quic_lane_up::Frame::Result(QuicResult {
                    task_id,
                    outcome: Some(match output {
                        Some(output) => quic_result::Outcome::Output(output.into()),
                        None => quic_result::Outcome::Failure(Failure { message, retryable }),
                    }),
                })),
            })
    }

    proptest! {
        #[test]
        fn tasks_round_trip_whatever_the_chunking(
            tasks in prop::collection::vec(task_strategy(), 1..6),
            cuts in prop::collection::vec(1usize..64, 0..40),
        ) {
            let mut wire = Vec::new();
            for task in &tasks {
                wire.extend_from_slice(&encode_frame(task, 4096).unwrap());
            }
            let mut decoder = FrameDecoder::new(4096);
            let mut decoded = Vec::new();
            let mut rest = &wire[..];
            for cut in cuts.iter().copied().chain(std::iter::repeat(usize::MAX)) {
                if rest.is_empty() {
                    break;
                }
                let (head, tail) = rest.split_at(cut.min(rest.len()));
                decoder.push(head);
                rest = tail;
                for body in decode_all(&mut decoder).unwrap() {
                    decoded.push(decode::<QuicLaneDown>(body).unwrap());
                }
            }
            prop_assert_eq!(decoded, tasks);
            prop_assert_eq!(decoder.finish(), Ok(()));
        }

        #[test]
        fn results_round_trip(result in result_strategy()) {
            let wire = encode_frame(&result, 4096).unwrap();
            let mut decoder = FrameDecoder::new(4096);
            decoder.push(&wire);
            let body = decoder.next_frame().unwrap().unwrap();
            prop_assert_eq!(decode::<QuicLaneUp>(body).unwrap(), result);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_never_exceed_the_limit(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            max in 0u32..128,
        ) {
            let mut decoder = FrameDecoder::new(max);
            decoder.push(&bytes);
            while let Ok(Some(body)) = decoder.next_frame() {
                prop_assert!(body.len() <= max as usize);
                let _ = decode::<QuicLaneUp>(body.clone());
                let _ = decode::<QuicLaneDown>(body);
            }
        }
    }
}
