//! Protocol constants: ALPN, version, default limits and the application error codes.
//!
//! `docs/quic-protocol.md` is the normative description; every value here appears there.

use std::fmt;

use quinn::VarInt;

/// The ALPN identifier both sides must offer; the version is part of the name.
pub const ALPN: &[u8] = b"switchyard-worker/1";

/// The value of `QuicRegister.protocol_version` this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Bytes in a frame's length prefix (an unsigned 32-bit big-endian integer).
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// Default largest control-stream frame, prefix excluded (64 KiB).
pub const DEFAULT_MAX_CONTROL_FRAME: u32 = 64 * 1024;

/// Default largest lane frame, prefix excluded (4 MiB): bounds task input and result output.
pub const DEFAULT_MAX_LANE_FRAME: u32 = 4 * 1024 * 1024;

/// An application error code carried in a QUIC `CONNECTION_CLOSE` frame.
///
/// Every close names its problem twice: the code, for programs, and the reason phrase, for
/// people (for example `max_concurrency 0: a worker must accept at least one task`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Closed without a problem (the worker stopped without draining).
    Closed,
    /// The drain finished: every task the worker held has ended. Do not reconnect.
    Drained,
    /// The gateway is shutting down; reconnect later.
    ShuttingDown,
    /// The gateway failed internally.
    Internal,
    /// A frame arrived where the protocol does not allow it.
    ProtocolViolation,
    /// A frame could not be decoded, or a stream ended inside a frame.
    MalformedFrame,
    /// A frame's length prefix exceeds the limit for its stream.
    FrameTooLarge,
    /// A result or cancel acknowledgement named a task its lane does not hold.
    UnknownTask,
    /// No registration was completed within the registration deadline.
    RegistrationTimeout,
    /// `QuicRegister.protocol_version` is not one the gateway speaks.
    UnsupportedVersion,
    /// The auth token or client certificate was refused.
    Unauthenticated,
    /// The admission gate found the registration malformed.
    RegistrationInvalid,
    /// The caller is not granted a namespace it registered for.
    NamespaceNotGranted,
    /// A namespace does not exist and the gateway's namespace policy is closed.
    NamespaceUnknown,
    /// A pinned namespace requires a node the worker does not advertise.
    PlacementRefused,
    /// The gateway could not decide on the registration; retry later.
    Unavailable,
    /// `max_concurrency` was zero or above the gateway's limit.
    CapacityRefused,
    /// The gateway removed the worker (for example, silent past the heartbeat window).
    Deregistered,
    /// A connection limit was reached once the handshake proved the worker's address (the
    /// reason names the limit); reconnect later.
    ConnectionRefused,
    /// A `resume` was refused (the reason starts `resume refused: <label>`); register afresh.
    ResumeRefused,
    /// A newer connection resumed this connection's session; this one is closed.
    Superseded,
}

impl ErrorCode {
    /// Every code, in wire order.
    pub const ALL: [ErrorCode; 21] = [
        Self::Closed,
        Self::Drained,
        Self::ShuttingDown,
        Self::Internal,
        Self::ProtocolViolation,
        Self::MalformedFrame,
        Self::FrameTooLarge,
        Self::UnknownTask,
        Self::RegistrationTimeout,
        Self::UnsupportedVersion,
        Self::Unauthenticated,
        Self::RegistrationInvalid,
        Self::NamespaceNotGranted,
        Self::NamespaceUnknown,
        Self::PlacementRefused,
        Self::Unavailable,
        Self::CapacityRefused,
        Self::Deregistered,
        Self::ConnectionRefused,
        Self::ResumeRefused,
        Self::Superseded,
    ];

    /// The code's number on the wire.
    pub const fn value(self) -> u32 {
        match self {
            Self::Closed => 0x00,
            Self::Drained => 0x01,
            Self::ShuttingDown => 0x02,
            Self::Internal => 0x03,
            Self::ProtocolViolation => 0x10,
            Self::MalformedFrame => 0x11,
            Self::FrameTooLarge => 0x12,
            Self::UnknownTask => 0x13,
            Self::RegistrationTimeout => 0x14,
            Self::UnsupportedVersion => 0x15,
            Self::Unauthenticated => 0x20,
            Self::RegistrationInvalid => 0x21,
            Self::NamespaceNotGranted => 0x22,
            Self::NamespaceUnknown => 0x23,
            Self::PlacementRefused => 0x24,
            Self::Unavailable => 0x25,
            Self::CapacityRefused => 0x26,
            Self::Deregistered => 0x27,
            Self::ConnectionRefused => 0x28,
            Self::ResumeRefused => 0x29,
            Self::Superseded => 0x2a,
        }
    }

    /// The code for a wire number, if it is one of ours.
    pub fn from_value(value: u64) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|c| u64::from(c.value()) == value)
    }

    /// The upper-case name used in the specification.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Closed => "CLOSED",
            Self::Drained => "DRAINED",
            Self::ShuttingDown => "SHUTTING_DOWN",
            Self::Internal => "INTERNAL",
            Self::ProtocolViolation => "PROTOCOL_VIOLATION",
            Self::MalformedFrame => "MALFORMED_FRAME",
            Self::FrameTooLarge => "FRAME_TOO_LARGE",
            Self::UnknownTask => "UNKNOWN_TASK",
            Self::RegistrationTimeout => "REGISTRATION_TIMEOUT",
            Self::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::RegistrationInvalid => "REGISTRATION_INVALID",
            Self::NamespaceNotGranted => "NAMESPACE_NOT_GRANTED",
            Self::NamespaceUnknown => "NAMESPACE_UNKNOWN",
            Self::PlacementRefused => "PLACEMENT_REFUSED",
            Self::Unavailable => "UNAVAILABLE",
            Self::CapacityRefused => "CAPACITY_REFUSED",
            Self::Deregistered => "DEREGISTERED",
            Self::ConnectionRefused => "CONNECTION_REFUSED",
            Self::ResumeRefused => "RESUME_REFUSED",
            Self::Superseded => "SUPERSEDED",
        }
    }

    /// True when a worker SDK should give up rather than reconnect after this close.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            Self::Drained
                | Self::UnsupportedVersion
                | Self::Unauthenticated
                | Self::RegistrationInvalid
                | Self::NamespaceNotGranted
                | Self::NamespaceUnknown
                | Self::PlacementRefused
                | Self::CapacityRefused
        )
    }

    /// The code as a QUIC variable-length integer.
    pub fn var_int(self) -> VarInt {
        VarInt::from_u32(self.value())
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (0x{:02x})", self.name(), self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.value()), "{code} reuses a number");
            assert_eq!(ErrorCode::from_value(u64::from(code.value())), Some(code));
        }
        assert_eq!(ErrorCode::from_value(0xff), None);
    }
}
