//! Fuzzes the decoding of QUIC datagram copies (`quic.redundancy = "datagram"`): arbitrary
//! bytes as a datagram payload must never panic, and every payload that decodes must re-encode
//! to bytes that decode to the same copy.
#![no_main]

use std::fmt::Debug;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use switchyard_proto::v1::{QuicDatagramDown, QuicDatagramUp};
use switchyard_transport_quic::frame::decode;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    round_trip::<QuicDatagramDown>(&payload);
    round_trip::<QuicDatagramUp>(&payload);
});

fn round_trip<M: Message + Default + PartialEq + Debug>(payload: &Bytes) {
    let Ok(copy) = decode::<M>(payload.clone()) else {
        return;
    };
    let again = Bytes::from(copy.encode_to_vec());
    assert_eq!(decode::<M>(again).expect("re-decodes"), copy);
}
