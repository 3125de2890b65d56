//! Shared by the test modules: a test gateway and PKI, a raw protocol peer, and the conformance
//! kit's harness. The loopback relay that freezes or cuts a connection, the CA behind the PKI
//! and `within` come from `switchyard-test-support`.
// Test layout, the same in every transport crate (gRPC, QUIC, WebSocket): one test binary,
// `tests/transport/main.rs`, with one module per behaviour next to this `support` module. One
// binary links once per crate rather than once per file, and `support.rs` needs neither a
// `mod.rs` nor an `autotests = false` list to keep it from being a test target of its own.
// Each test target uses part of the support; a failed setup step fails its test loudly.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod fake;
pub mod gateway;
pub mod harness;
pub mod pki;
pub mod raw;
