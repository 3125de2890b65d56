//! Shared by the test targets: a test PKI, a loopback relay that can freeze or cut a
//! connection, and the conformance kit's harness over the WebSocket transport.
#![allow(dead_code, unreachable_pub)]

pub mod harness;
pub mod pki;
pub mod relay;
