//! Shared by the test targets: a test gateway and PKI, a raw protocol peer, and the conformance
//! kit's harness. The loopback relay that freezes or cuts a connection, the CA behind the PKI
//! and `within` come from `switchyard-test-support`.
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
