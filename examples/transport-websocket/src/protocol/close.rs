//! The close codes that end a worker's socket, each naming one rule.

use switchyard_core::RefusalKind;

/// Why a worker socket was closed, carried as the WebSocket close code; the close reason text
/// carries the detail (cut to the 123 bytes a close frame allows; a refusal's whole text comes
/// first in a `refused` frame).
///
/// Codes below 4000 are RFC 6455's; the 4000–4999 range is private use, and this protocol
/// numbers its codes 4000 + the nearest HTTP status, so `4401` reads as "unauthenticated".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseCode {
    /// 1000: a drained worker finished its work and is leaving.
    Normal,
    /// 1001: the gateway (or the worker) is shutting down.
    GoingAway,
    /// 1002: frames out of order (no `register` first, or a second one).
    ProtocolError,
    /// 1003: a binary message; the protocol is JSON text.
    UnsupportedData,
    /// 1007: a text message that is not a valid protocol frame.
    InvalidPayload,
    /// 1009: a message larger than the receiver's limit.
    TooBig,
    /// 4000: the admission gate refused the registration for a reason this version does not
    /// name more precisely.
    Refused,
    /// 4400: the registration is malformed (an empty, oversized or zero field).
    InvalidRegistration,
    /// 4401: no bearer token, an unknown one, or a malformed `Authorization` header.
    Unauthenticated,
    /// 4403: the caller is not granted a namespace it registered for.
    NamespaceNotGranted,
    /// 4404: a namespace does not exist and the namespace policy is closed.
    UnknownNamespace,
    /// 4408: no `register` frame within the registration timeout.
    RegistrationTimeout,
    /// 4409: a pinned namespace requires a node the worker does not advertise.
    Placement,
    /// 4410: the gateway deregistered the worker (it was silent too long).
    Deregistered,
    /// 4503: the gateway could not decide (its namespace store failed); try again later.
    Unavailable,
}

impl CloseCode {
    /// Every code, for lookups and tests.
    pub const ALL: [CloseCode; 15] = [
        Self::Normal,
        Self::GoingAway,
        Self::ProtocolError,
        Self::UnsupportedData,
        Self::InvalidPayload,
        Self::TooBig,
        Self::Refused,
        Self::InvalidRegistration,
        Self::Unauthenticated,
        Self::NamespaceNotGranted,
        Self::UnknownNamespace,
        Self::RegistrationTimeout,
        Self::Placement,
        Self::Deregistered,
        Self::Unavailable,
    ];

    /// The numeric close code.
    pub fn code(self) -> u16 {
        match self {
            Self::Normal => 1000,
            Self::GoingAway => 1001,
            Self::ProtocolError => 1002,
            Self::UnsupportedData => 1003,
            Self::InvalidPayload => 1007,
            Self::TooBig => 1009,
            Self::Refused => 4000,
            Self::InvalidRegistration => 4400,
            Self::Unauthenticated => 4401,
            Self::NamespaceNotGranted => 4403,
            Self::UnknownNamespace => 4404,
            Self::RegistrationTimeout => 4408,
            Self::Placement => 4409,
            Self::Deregistered => 4410,
            Self::Unavailable => 4503,
        }
    }

    /// The code with this number, if the protocol defines it.
    pub fn from_code(code: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|known| known.code() == code)
    }

    /// The code that reports an admission refusal of `kind`.
    pub fn for_refusal(kind: RefusalKind) -> Self {
        match kind {
            RefusalKind::Invalid => Self::InvalidRegistration,
            RefusalKind::Unauthorised => Self::NamespaceNotGranted,
            RefusalKind::NotFound => Self::UnknownNamespace,
            RefusalKind::Placement => Self::Placement,
            RefusalKind::Unavailable => Self::Unavailable,
            _ => Self::Refused,
        }
    }

    /// The admission refusal family this code reports, if it reports one; an unauthenticated
    /// caller counts as unauthorised.
    pub fn refusal_kind(self) -> Option<RefusalKind> {
        match self {
            Self::InvalidRegistration => Some(RefusalKind::Invalid),
            Self::Unauthenticated | Self::NamespaceNotGranted => Some(RefusalKind::Unauthorised),
            Self::UnknownNamespace => Some(RefusalKind::NotFound),
            Self::Placement => Some(RefusalKind::Placement),
            Self::Unavailable => Some(RefusalKind::Unavailable),
            _ => None,
        }
    }
}

impl std::fmt::Display for CloseCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.code())
    }
}

/// The longest close reason a close frame can carry, in bytes.
pub(crate) const MAX_REASON_BYTES: usize = 123;

/// `reason` cut at a character boundary to fit a close frame.
pub(crate) fn fit_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_read_back() {
        for code in CloseCode::ALL {
            assert_eq!(CloseCode::from_code(code.code()), Some(code));
        }
        assert_eq!(CloseCode::from_code(4999), None);
    }

    #[test]
    fn every_refusal_kind_maps_back_to_itself() {
        for kind in [
            RefusalKind::Invalid,
            RefusalKind::Unauthorised,
            RefusalKind::NotFound,
            RefusalKind::Placement,
            RefusalKind::Unavailable,
        ] {
            assert_eq!(CloseCode::for_refusal(kind).refusal_kind(), Some(kind));
        }
        assert_eq!(CloseCode::Normal.refusal_kind(), None);
    }

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        let short = "namespace \"billing\" is not granted";
        assert_eq!(fit_reason(short), short);
        let long = "é".repeat(100);
        let cut = fit_reason(&long);
        assert!(cut.len() <= MAX_REASON_BYTES);
        assert_eq!(
            cut.len(),
            122,
            "61 two-byte characters fit, the 62nd would not"
        );
        assert!(long.starts_with(cut));
    }
}
