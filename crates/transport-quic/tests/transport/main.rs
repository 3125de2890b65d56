//! End-to-end tests of the QUIC transport over real UDP loopback sockets.
// The helpers outside `#[test]` functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod address_cap;
mod capacity;
mod closing;
mod conformance;
mod delivery;
mod handshake_deadline;
mod initial_flood;
mod isolation;
mod observe;
mod oversized;
mod redundancy;
mod registration;
mod sessions;
mod spec;
mod support;
mod violations;
