//! The codec of every generated service and client: tonic's prost codec with 1 KiB first
//! buffers instead of 8 KiB.
//!
//! tonic gives each call's encoder and decoder a buffer of that size when the call starts,
//! and a worker's call lasts as long as its connection, so the default cost every idle worker
//! 16 KiB in the gateway before a task was sent. The buffers still grow to the largest
//! message and yield every 32 KiB, as with the default.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// First size of a call's encode and decode buffers, in bytes.
pub const CALL_BUFFER_BYTES: usize = 1024;
/// Encoded bytes a streaming call gathers before it hands them on (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// tonic's prost codec with [`CALL_BUFFER_BYTES`] first buffers.
#[derive(Debug, Clone, Copy)]
pub struct WireCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(CALL_BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

#[cfg(test)]
mod tests {
    use tonic::codec::{Decoder, Encoder};

    use super::*;

    #[test]
    fn calls_start_with_small_buffers_and_keep_tonic_s_yield_threshold() {
        let mut codec = WireCodec::<crate::v1::WorkerFrame, crate::v1::GatewayFrame>::default();
        let encoder = codec.encoder().buffer_settings();
        let decoder = codec.decoder().buffer_settings();
        let default = format!("{:?}", BufferSettings::default());
        let ours = format!("{:?}", settings());
        // Control: tonic's default is 8 KiB, so a codec left at it fails this.
        assert_ne!(default, ours);
        for used in [encoder, decoder] {
            assert_eq!(format!("{used:?}"), ours);
        }
        assert!(ours.contains("buffer_size: 1024"), "{ours}");
        assert!(ours.contains("yield_threshold: 32768"), "{ours}");
    }
}
