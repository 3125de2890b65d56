//! Settings for both ends: QUIC link tuning, frame limits, and the gateway's abuse limits.
//!
//! Defaults suit constrained links (high RTT, loss, NAT rebinding) without hurting loopback;
//! `docs/quic-protocol.md` lists each with its reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::{BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};
use quinn::{AckFrequencyConfig, IdleTimeout, TransportConfig, VarInt};

use crate::protocol::{DEFAULT_MAX_CONTROL_FRAME, DEFAULT_MAX_LANE_FRAME};
use crate::redundancy::{DATAGRAM_RECEIVE_BUFFER, DATAGRAM_SEND_BUFFER, Redundancy};

/// The congestion controller a connection uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CongestionControl {
    /// CUBIC (RFC 9438), the default: the well-trodden choice for mixed traffic.
    #[default]
    Cubic,
    /// BBR: model-based, far less sensitive to random (non-congestion) loss.
    Bbr,
    /// NewReno (RFC 9002's reference controller).
    NewReno,
}

impl CongestionControl {
    /// quinn's factory of this controller, with its default settings.
    fn factory(self) -> Arc<dyn ControllerFactory + Send + Sync> {
        match self {
            Self::Cubic => Arc::new(CubicConfig::default()),
            Self::Bbr => Arc::new(BbrConfig::default()),
            Self::NewReno => Arc::new(NewRenoConfig::default()),
        }
    }
}

/// QUIC transport tuning shared by the gateway and the worker SDK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Congestion controller (default [`CongestionControl::Cubic`]).
    pub congestion: CongestionControl,
    /// Interval of QUIC keep-alive packets when nothing else is sent (default 10 s: well
    /// inside common UDP NAT binding lifetimes of 30 s and more).
    pub keep_alive_interval: Option<Duration>,
    /// The connection closes after this long without any packet from the peer (default 30 s;
    /// each side proposes its own and the smaller one applies).
    pub max_idle_timeout: Duration,
    /// RTT assumed before the first sample (default 333 ms, RFC 9002's recommendation).
    pub initial_rtt: Duration,
    /// Bytes one stream may receive ahead of the reader (default 1 MiB).
    pub stream_receive_window: u32,
    /// Bytes the whole connection may receive ahead of the readers (default 16 MiB).
    pub receive_window: u32,
    /// Bytes the connection buffers unacknowledged for sending (default 16 MiB).
    pub send_window: u64,
    /// Round-robin between lanes with data to send (default true, quinn's own default).
    /// Off, frames leave in the order they were written: fewer, fuller packets and far less
    /// CPU per task on a busy connection with small frames, but a large frame holds back
    /// the small ones written after it until all of it is sent. For links and payloads where
    /// that is acceptable; `docs/benchmarks.md` (Session 11: QUIC via stream) has figures.
    pub send_fairness: bool,
    /// Ask the peer (QUIC ACK frequency extension, when it supports it) to acknowledge only
    /// once more than this many ack-eliciting packets arrived, or its `max_ack_delay` passed
    /// (default `None`: the peer's own policy, an ACK for every second packet). Fewer ACK
    /// packets each way on a busy connection; on a link whose congestion window holds fewer
    /// packets than this, each round trip waits up to the peer's `max_ack_delay`.
    /// At most [`MAX_ACK_ELICITING_THRESHOLD`].
    pub ack_eliciting_threshold: Option<u32>,
}

/// Largest [`ConnectionConfig::ack_eliciting_threshold`]: 64 packets. Far beyond what a loopback
/// connection's congestion window holds at once (a few dozen packets), so a larger threshold
/// would only leave every acknowledgement to the peer's `max_ack_delay`.
pub const MAX_ACK_ELICITING_THRESHOLD: u32 = 64;

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            congestion: CongestionControl::Cubic,
            keep_alive_interval: Some(Duration::from_secs(10)),
            max_idle_timeout: Duration::from_secs(30),
            initial_rtt: Duration::from_millis(333),
            stream_receive_window: 1024 * 1024,
            receive_window: 16 * 1024 * 1024,
            send_window: 16 * 1024 * 1024,
            send_fairness: true,
            ack_eliciting_threshold: None,
        }
    }
}

/// A setting that quinn cannot represent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `max_idle_timeout` is beyond what QUIC can encode (2^62 ms).
    #[error("max_idle_timeout {0:?} is too large for QUIC")]
    IdleTimeoutTooLarge(Duration),
    /// A limit that must allow at least one is zero.
    #[error("{field} must be at least 1")]
    Zero {
        /// The setting.
        field: &'static str,
    },
    /// A size is beyond what the setting can carry.
    #[error("{field} {value} is above the limit of {max}")]
    TooLarge {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: usize,
        /// The largest accepted.
        max: usize,
    },
}

impl ConnectionConfig {
    /// The quinn transport config for one side; `bidi_streams` is how many bidirectional
    /// streams the peer may open at first. Uni streams are never used; datagrams only with
    /// [`Redundancy::Datagram`].
    pub(crate) fn transport(
        &self,
        bidi_streams: u32,
        redundancy: Redundancy,
    ) -> Result<TransportConfig, ConfigError> {
        let idle = IdleTimeout::try_from(self.max_idle_timeout)
            .map_err(|_| ConfigError::IdleTimeoutTooLarge(self.max_idle_timeout))?;
        let mut transport = TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(VarInt::from_u32(bidi_streams))
            .max_concurrent_uni_streams(VarInt::from_u32(0))
            .datagram_receive_buffer_size(
                redundancy
                    .wants_datagrams()
                    .then_some(DATAGRAM_RECEIVE_BUFFER),
            )
            .datagram_send_buffer_size(DATAGRAM_SEND_BUFFER)
            .max_idle_timeout(Some(idle))
            .keep_alive_interval(self.keep_alive_interval)
            .initial_rtt(self.initial_rtt)
            .stream_receive_window(VarInt::from_u32(self.stream_receive_window))
            .receive_window(VarInt::from_u32(self.receive_window))
            .send_window(self.send_window);
        if let Some(threshold) = self.ack_eliciting_threshold {
            if threshold > MAX_ACK_ELICITING_THRESHOLD {
                return Err(ConfigError::TooLarge {
                    field: "ack_eliciting_threshold",
                    value: threshold as usize,
                    max: MAX_ACK_ELICITING_THRESHOLD as usize,
                });
            }
            let mut ack = AckFrequencyConfig::default();
            ack.ack_eliciting_threshold(VarInt::from_u32(threshold));
            transport.ack_frequency_config(Some(ack));
        }
        transport.send_fairness(self.send_fairness);
        transport.congestion_controller_factory(self.congestion.factory());
        Ok(transport)
    }
}

/// Largest frames accepted on each kind of stream, prefix excluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Control-stream frames (default 64 KiB).
    pub control: u32,
    /// Lane frames, which carry task input and result output (default 4 MiB).
    pub lane: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        Self {
            control: DEFAULT_MAX_CONTROL_FRAME,
            lane: DEFAULT_MAX_LANE_FRAME,
        }
    }
}

impl FrameLimits {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        nonzero("frames.control", self.control as usize)?;
        nonzero("frames.lane", self.lane as usize)
    }
}

/// Largest [`QuicServerConfig::socket_buffer`]: 1 GiB (the kernel takes an `int`).
pub const MAX_SOCKET_BUFFER: usize = 1 << 30;

/// When the gateway answers a new connection with a stateless Retry, making the client prove it
/// receives packets at its address before the gateway keeps any state for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryPolicy {
    /// Every connection from an address not yet validated gets a Retry (one round trip more
    /// per connection).
    Always,
    /// A Retry only under load, the default: when
    /// [`QuicServerConfig::max_unvalidated_handshakes`] handshakes from unvalidated addresses
    /// are under way, when more than half of
    /// [`QuicServerConfig::max_unregistered_connections`] is in use, or when the address has
    /// reached [`QuicServerConfig::max_connections_per_address`] (so a refusal only ever goes
    /// to an address that proved itself).
    #[default]
    UnderLoad,
    /// Never: an unvalidated handshake beyond
    /// [`QuicServerConfig::max_unvalidated_handshakes`] is refused, so a flood of spoofed
    /// Initial packets locks real workers out. For tests and comparisons.
    Off,
}

/// The gateway side's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuicServerConfig {
    /// UDP address to listen on (default `[::]:7443`).
    pub listen: SocketAddr,
    /// QUIC tuning.
    pub connection: ConnectionConfig,
    /// Frame limits the gateway enforces on what it reads.
    pub frames: FrameLimits,
    /// Let a worker's connection survive a change of its address (NAT rebinding, network
    /// switch) (default true).
    pub migration: bool,
    /// Time from the first packet to a completed registration; slower connections are
    /// closed with `REGISTRATION_TIMEOUT` (default 10 s).
    pub registration_timeout: Duration,
    /// Connections through their handshake but not yet registered, at once; more are
    /// refused (default 1024). Handshakes in progress do not count: they are bounded by
    /// [`Self::max_unvalidated_handshakes`] and [`Self::max_connections_per_address`].
    pub max_unregistered_connections: usize,
    /// When to answer a new connection with a stateless Retry (default
    /// [`RetryPolicy::UnderLoad`]).
    pub retry: RetryPolicy,
    /// Handshakes under way at once from addresses that have not been validated (default
    /// 256); beyond it a new one gets a Retry, or under [`RetryPolicy::Off`] is refused.
    pub max_unvalidated_handshakes: usize,
    /// Connections at once from one IP address whose address is proven (validated by a Retry
    /// or through the handshake), registered or not (default 256); more are refused with
    /// `CONNECTION_REFUSED`. Spoofed packets never count against an address.
    pub max_connections_per_address: usize,
    /// Receive and send buffer asked of the kernel for the listening UDP socket, in bytes
    /// (default 4 MiB; the kernel caps it at `net.core.rmem_max` / `wmem_max`; 0 keeps the
    /// kernel's default). Every worker's
    /// packets arrive on this one socket, so the kernel's default drops bursts.
    pub socket_buffer: usize,
    /// Whether small task and result frames also travel as QUIC datagrams, for workers that
    /// ask for it at registration (default [`Redundancy::Off`]).
    pub redundancy: Redundancy,
    /// How long the session of a worker that registered as resumable outlives a lost
    /// connection, suspended, waiting for it to resume (default 15 s); zero grants no session,
    /// and a lost connection deregisters the worker at once.
    pub reconnect_grace: Duration,
}

/// [`QuicServerConfig::reconnect_grace`]'s default: longer than a cellular handover or a NAT
/// rebinding takes, short enough that a worker that is gone for good gives its tasks back soon.
pub const DEFAULT_RECONNECT_GRACE: Duration = Duration::from_secs(15);

/// The longest [`QuicServerConfig::reconnect_grace`]: `QuicRegistered.reconnect_grace_ms` is a
/// 32-bit count of milliseconds.
pub const MAX_RECONNECT_GRACE: Duration = Duration::from_millis(u32::MAX as u64);

impl QuicServerConfig {
    /// Refuses settings that would make the listener useless, naming the setting.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        self.frames.check()?;
        nonzero(
            "max_unregistered_connections",
            self.max_unregistered_connections,
        )?;
        nonzero(
            "max_unvalidated_handshakes",
            self.max_unvalidated_handshakes,
        )?;
        nonzero(
            "max_connections_per_address",
            self.max_connections_per_address,
        )?;
        if self.reconnect_grace > MAX_RECONNECT_GRACE {
            let millis = |d: Duration| usize::try_from(d.as_millis()).unwrap_or(usize::MAX);
            return Err(ConfigError::TooLarge {
                field: "reconnect_grace (ms)",
                value: millis(self.reconnect_grace),
                max: millis(MAX_RECONNECT_GRACE),
            });
        }
        if self.socket_buffer > MAX_SOCKET_BUFFER {
            return Err(ConfigError::TooLarge {
                field: "socket_buffer",
                value: self.socket_buffer,
                max: MAX_SOCKET_BUFFER,
            });
        }
        self.connection.transport(1, self.redundancy).map(drop)
    }
}

fn nonzero(field: &'static str, value: usize) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::Zero { field })
    } else {
        Ok(())
    }
}

impl Default for QuicServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 7443)),
            connection: ConnectionConfig::default(),
            frames: FrameLimits::default(),
            migration: true,
            registration_timeout: Duration::from_secs(10),
            max_unregistered_connections: 1024,
            retry: RetryPolicy::UnderLoad,
            max_unvalidated_handshakes: 256,
            max_connections_per_address: 256,
            socket_buffer: 4 * 1024 * 1024,
            redundancy: Redundancy::Off,
            reconnect_grace: DEFAULT_RECONNECT_GRACE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_congestion_controller_builds() {
        for congestion in [
            CongestionControl::Cubic,
            CongestionControl::Bbr,
            CongestionControl::NewReno,
        ] {
            let link = ConnectionConfig {
                congestion,
                ..ConnectionConfig::default()
            };
            assert!(link.transport(1, Redundancy::Off).is_ok());
            assert!(link.transport(1, Redundancy::Datagram).is_ok());
        }
    }

    #[test]
    fn each_congestion_name_builds_its_own_controller() {
        let built = |congestion: CongestionControl| {
            congestion
                .factory()
                .build(std::time::Instant::now(), 1200)
                .into_any()
        };
        assert!(built(CongestionControl::Bbr).is::<quinn::congestion::Bbr>());
        assert!(built(CongestionControl::Cubic).is::<quinn::congestion::Cubic>());
        assert!(built(CongestionControl::NewReno).is::<quinn::congestion::NewReno>());
        // Control: the check tells the controllers apart.
        assert!(!built(CongestionControl::Cubic).is::<quinn::congestion::Bbr>());
        assert_eq!(CongestionControl::default(), CongestionControl::Cubic);
    }

    #[test]
    fn fairness_and_ack_frequency_reach_quinn_only_when_asked() {
        let shown = |link: &ConnectionConfig| {
            let transport = link.transport(1, Redundancy::Off);
            format!("{:?}", transport.ok())
        };
        // Control: the defaults keep quinn's own (round-robin, no ACK frequency request).
        let default = shown(&ConnectionConfig::default());
        assert!(default.contains("send_fairness: true"), "{default}");
        assert!(default.contains("ack_frequency_config: None"), "{default}");
        let tuned = shown(&ConnectionConfig {
            send_fairness: false,
            ack_eliciting_threshold: Some(8),
            ..ConnectionConfig::default()
        });
        assert!(tuned.contains("send_fairness: false"), "{tuned}");
        assert!(
            tuned.contains("ack_eliciting_threshold: 8"),
            "the threshold is asked of the peer: {tuned}"
        );
    }

    #[test]
    fn zero_limits_are_refused_by_name() {
        assert!(QuicServerConfig::default().check().is_ok());
        let config = QuicServerConfig {
            max_unregistered_connections: 0,
            ..QuicServerConfig::default()
        };
        assert_eq!(
            config.check(),
            Err(ConfigError::Zero {
                field: "max_unregistered_connections"
            })
        );
        for (field, config) in [
            (
                "max_unvalidated_handshakes",
                QuicServerConfig {
                    max_unvalidated_handshakes: 0,
                    ..QuicServerConfig::default()
                },
            ),
            (
                "max_connections_per_address",
                QuicServerConfig {
                    max_connections_per_address: 0,
                    ..QuicServerConfig::default()
                },
            ),
        ] {
            assert_eq!(config.check(), Err(ConfigError::Zero { field }));
        }
        let config = QuicServerConfig {
            frames: FrameLimits {
                lane: 0,
                ..FrameLimits::default()
            },
            ..QuicServerConfig::default()
        };
        assert_eq!(
            config.check(),
            Err(ConfigError::Zero {
                field: "frames.lane"
            })
        );
    }

    #[test]
    fn an_ack_threshold_beyond_the_limit_is_refused_by_name() {
        let at = |threshold| ConnectionConfig {
            ack_eliciting_threshold: Some(threshold),
            ..ConnectionConfig::default()
        };
        // Control: the limit itself is accepted.
        assert!(
            at(MAX_ACK_ELICITING_THRESHOLD)
                .transport(1, Redundancy::Off)
                .is_ok()
        );
        let error = at(MAX_ACK_ELICITING_THRESHOLD + 1)
            .transport(1, Redundancy::Off)
            .unwrap_err();
        assert_eq!(
            error,
            ConfigError::TooLarge {
                field: "ack_eliciting_threshold",
                value: MAX_ACK_ELICITING_THRESHOLD as usize + 1,
                max: MAX_ACK_ELICITING_THRESHOLD as usize,
            }
        );
    }

    #[test]
    fn unrepresentable_idle_timeout_is_refused_by_name() {
        let link = ConnectionConfig {
            max_idle_timeout: Duration::MAX,
            ..ConnectionConfig::default()
        };
        let error = link.transport(1, Redundancy::Off).unwrap_err();
        assert!(error.to_string().contains("max_idle_timeout"), "{error}");
    }
}
