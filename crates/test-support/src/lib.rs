//! What Switchyard's tests share, in one place: a test PKI ([`TestCa`], [`Issued`]) for
//! loopback TLS, fault relays that stand between a worker and the gateway and can go silent
//! or cut the link ([`TcpRelay`], [`UdpRelay`]), and [`within`], a wait bounded by
//! [`PATIENCE`].
//!
//! Test support only: a certificate that cannot be made panics, naming the step, so the test
//! that called it fails there; a relay that cannot bind returns the error for the caller's
//! harness to report.
#![forbid(unsafe_code)]
#![allow(clippy::expect_used, clippy::panic)]

mod pki;
mod tcp_relay;
mod udp_relay;
mod within;

pub use pki::{Issued, TestCa};
pub use tcp_relay::TcpRelay;
pub use udp_relay::UdpRelay;
pub use within::{PATIENCE, within};
