//! Frames from quinn streams: a reader that feeds [`FrameDecoder`].

use prost::Message;
use quinn::{ReadError, RecvStream};

use super::{FrameDecoder, FrameError, decode};

/// Largest read asked of quinn beyond what the current frame still needs: small frames that
/// arrive back to back are taken in one call, while the buffer stays within the frame limit
/// plus this much.
const READ_AHEAD: usize = 16 * 1024;

/// Why the next frame could not be read from a stream.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadFrameError {
    /// The bytes did not form a valid frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The stream or its connection failed.
    #[error(transparent)]
    Stream(#[from] ReadError),
}

/// Reads whole frames from one receive stream.
#[derive(Debug)]
pub(crate) struct FrameReader {
    stream: RecvStream,
    decoder: FrameDecoder,
}

impl FrameReader {
    pub(crate) fn new(stream: RecvStream, max_frame: u32) -> Self {
        Self {
            stream,
            decoder: FrameDecoder::new(max_frame),
        }
    }

    /// The next envelope, or `None` when the peer finished the stream between frames.
    pub(crate) async fn next<M: Message + Default>(&mut self) -> Result<Option<M>, ReadFrameError> {
        loop {
            if let Some(body) = self.decoder.next_frame()? {
                return Ok(Some(decode(body)?));
            }
            let limit = self.decoder.wanted().max(READ_AHEAD);
            match self.stream.read_chunk(limit, true).await? {
                Some(chunk) => self.decoder.push(&chunk.bytes),
                None => {
                    self.decoder.finish()?;
                    return Ok(None);
                }
            }
        }
    }
}
