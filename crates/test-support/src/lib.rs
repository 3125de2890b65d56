//! What Switchyard's tests share, in one place: a test PKI ([`TestCa`], [`Issued`]) for
//! loopback TLS, fault relays that stand between a worker and the gateway and can go silent
//! or cut the link ([`TcpRelay`], [`UdpRelay`]), and [`within`], a wait bounded by
//! [`PATIENCE`]; and a real NATS server ([`NatsServer`]) for the cluster and JetStream tests.
//!
//! Test support only: a certificate that cannot be made panics, naming the step, so the test
//! that called it fails there; a relay that cannot bind returns the error for the caller's
//! harness to report.
#![forbid(unsafe_code)]
#![allow(clippy::expect_used, clippy::panic)]

mod nats;
mod pki;
mod tcp_relay;
mod udp_relay;
mod within;

pub use nats::{NatsServer, REQUIRE_NATS};
pub use pki::{Issued, TestCa};
pub use tcp_relay::TcpRelay;
pub use udp_relay::UdpRelay;
pub use within::{PATIENCE, within};

#[cfg(test)]
mod nats_tests {
    use super::NatsServer;
    use std::net::TcpStream;

    #[test]
    fn a_started_server_accepts_and_a_killed_one_refuses_until_restarted() {
        let Some(mut server) = NatsServer::start() else {
            return;
        };
        assert!(server.url().starts_with("nats://127.0.0.1:"));
        assert!(
            TcpStream::connect(server.addr()).is_ok(),
            "running server accepts"
        );
        server.kill();
        assert!(
            TcpStream::connect(server.addr()).is_err(),
            "control: a killed server refuses"
        );
        server.restart();
        assert!(
            TcpStream::connect(server.addr()).is_ok(),
            "restarted on the same port"
        );
    }
}
