//! Shared by the test targets: a test gateway and PKI, a raw protocol peer, a loopback relay
//! that can freeze or cut a connection, and the conformance kit's harness.
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
pub mod relay;
