//! Switchyard wire types.
//!
//! The `.proto` files under `proto/switchyard/v1/` are the contract; this crate holds the Rust
//! types and tonic service stubs generated from them at build time by `protox` (no `protoc`
//! needed). Everything lives in package `switchyard.v1`, re-exported here as [`v1`].

mod codec;

pub use codec::{CALL_BUFFER_BYTES, WireCodec};

/// Package `switchyard.v1`: worker, producer and operator messages and services.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]
pub mod v1 {
    tonic::include_proto!("switchyard.v1");
}

/// Serialized `FileDescriptorSet` of every `.proto` file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("switchyard_descriptor");
