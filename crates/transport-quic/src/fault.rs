//! How a stream's failure ends its connection: a documented code and a reason phrase, or
//! nothing at all when the connection is already gone.

use quinn::{Connection, ReadError, WriteError};

use crate::frame::{FrameError, ReadFrameError};
use crate::protocol::ErrorCode;

/// Longest reason phrase sent in a close; longer ones are cut at a character boundary.
const MAX_REASON_BYTES: usize = 512;

/// Closes `conn` with `code` and `reason`, cut to [`MAX_REASON_BYTES`].
pub(crate) fn close_connection(conn: &Connection, code: ErrorCode, reason: &str) {
    conn.close(code.var_int(), reason_phrase(reason).as_bytes());
}

/// `reason` cut to at most [`MAX_REASON_BYTES`], at a character boundary so the phrase stays
/// UTF-8.
fn reason_phrase(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Why a stream driver stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The connection ended; there is nobody left to tell.
    Gone,
    /// The peer broke the protocol (or we failed): close the connection with this code.
    Close {
        /// The code.
        code: ErrorCode,
        /// The reason phrase.
        reason: String,
    },
}

impl Fault {
    pub(crate) fn close(code: ErrorCode, reason: impl Into<String>) -> Self {
        Self::Close {
            code,
            reason: reason.into(),
        }
    }

    /// A failed read on `stream` (a name for the reason phrase, like `lane 3`).
    pub(crate) fn read(error: ReadFrameError, stream: &dyn std::fmt::Display) -> Self {
        match error {
            ReadFrameError::Frame(error @ FrameError::TooLarge { .. }) => {
                Self::close(ErrorCode::FrameTooLarge, format!("{stream}: {error}"))
            }
            ReadFrameError::Frame(error) => {
                Self::close(ErrorCode::MalformedFrame, format!("{stream}: {error}"))
            }
            ReadFrameError::Stream(ReadError::ConnectionLost(_)) => Self::Gone,
            ReadFrameError::Stream(ReadError::Reset(code)) => Self::close(
                ErrorCode::ProtocolViolation,
                format!("{stream} was reset by the peer (code {code})"),
            ),
            ReadFrameError::Stream(error) => {
                Self::close(ErrorCode::Internal, format!("{stream}: {error}"))
            }
        }
    }

    /// A failed write on `stream`.
    pub(crate) fn write(error: WriteError, stream: &dyn std::fmt::Display) -> Self {
        match error {
            WriteError::ConnectionLost(_) => Self::Gone,
            WriteError::Stopped(code) => Self::close(
                ErrorCode::ProtocolViolation,
                format!("{stream} was stopped by the peer (code {code})"),
            ),
            error => Self::close(ErrorCode::Internal, format!("{stream}: {error}")),
        }
    }

    /// A frame with no message in its envelope.
    pub(crate) fn empty(stream: &dyn std::fmt::Display) -> Self {
        Self::close(
            ErrorCode::MalformedFrame,
            format!("{stream}: {}", FrameError::Empty),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_phrase_is_cut_to_512_bytes_at_a_character_boundary() {
        // Control: a phrase within the limit goes out whole.
        let whole = "a".repeat(MAX_REASON_BYTES);
        assert_eq!(reason_phrase(&whole), whole);
        // One byte over: the 513th byte is dropped.
        let over = format!("{whole}b");
        assert_eq!(reason_phrase(&over), whole);
        // A two-byte character straddling byte 512 is dropped whole, not split.
        let straddling = format!("{}é tail", "a".repeat(MAX_REASON_BYTES - 1));
        let cut = reason_phrase(&straddling);
        assert_eq!(cut.len(), MAX_REASON_BYTES - 1);
        assert!(cut.bytes().all(|b| b == b'a'), "{cut:?}");
    }

    #[test]
    fn frame_errors_map_to_their_codes_and_name_the_stream() {
        let too_large = Fault::read(
            ReadFrameError::Frame(FrameError::TooLarge { len: 9, max: 4 }),
            &"lane 2",
        );
        assert_eq!(
            too_large,
            Fault::close(
                ErrorCode::FrameTooLarge,
                "lane 2: frame of 9 bytes exceeds the limit of 4 bytes"
            )
        );
        let malformed = Fault::read(
            ReadFrameError::Frame(FrameError::Truncated { buffered: 3 }),
            &"control stream",
        );
        assert!(matches!(
            malformed,
            Fault::Close { code: ErrorCode::MalformedFrame, ref reason } if reason.starts_with("control stream: ")
        ));
    }
}
