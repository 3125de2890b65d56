//! Fuzzes the QUIC frame decoder: arbitrary bytes, fed in arbitrary chunks under an arbitrary
//! frame limit, must never panic, never yield a body over the limit, and every body that
//! decodes as an envelope must re-encode to a frame that decodes to the same envelope.
#![no_main]

use std::fmt::Debug;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use switchyard_proto::v1::{QuicControlDown, QuicControlUp, QuicLaneDown, QuicLaneUp};
use switchyard_transport_quic::frame::{FrameDecoder, decode, encode_frame};

fuzz_target!(|data: &[u8]| {
    let Some((&shape, bytes)) = data.split_first() else {
        return;
    };
    // Small limits reach the too-large path; chunk sizes split prefixes and bodies anywhere.
    let max = 1 + u32::from(shape) * 64;
    let chunk = usize::from(shape % 7) + 1;
    let mut decoder = FrameDecoder::new(max);
    for piece in bytes.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(body)) => {
                    assert!(body.len() <= max as usize, "a body over the limit");
                    round_trip::<QuicControlUp>(&body);
                    round_trip::<QuicControlDown>(&body);
                    round_trip::<QuicLaneDown>(&body);
                    round_trip::<QuicLaneUp>(&body);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = decoder.finish();
});

fn round_trip<M: Message + Default + PartialEq + Debug>(body: &Bytes) {
    let Ok(message) = decode::<M>(body.clone()) else {
        return;
    };
    let frame = encode_frame(&message, u32::MAX).expect("any decoded message encodes");
    let mut decoder = FrameDecoder::new(u32::MAX);
    decoder.push(&frame);
    let again = decoder
        .next_frame()
        .expect("an encoded frame decodes")
        .expect("an encoded frame is whole");
    assert_eq!(decode::<M>(again).expect("re-decodes"), message);
}
