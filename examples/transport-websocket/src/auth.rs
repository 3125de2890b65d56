//! Who is calling: a bearer token, looked up in the embedder's token directory.
//!
//! A worker presents its token in the upgrade request's `Authorization: Bearer <token>` header,
//! or, when it cannot set headers (a browser's `WebSocket` cannot), in the `token` field of its
//! `register` frame. Presenting both is refused, so there is never a question of which one
//! counts. Failures are reported after the upgrade, as a close with code 4401, because a
//! browser is shown nothing of a refused upgrade's HTTP status.
//!
//! No cookie or other ambient credential is read, so a page on another origin cannot ride on a
//! user's session (cross-site WebSocket hijacking): the caller is whoever knows a token.

use std::collections::HashMap;
use std::fmt;

use switchyard_core::CallerIdentity;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// Where the transport looks callers up; provided by the embedder (the gateway's principal
/// table).
pub trait TokenDirectory: Send + Sync + 'static {
    /// The caller holding bearer `token`; `None` when the token is unknown.
    fn caller(&self, token: &str) -> Option<CallerIdentity>;
}

/// A fixed [`TokenDirectory`] built in memory.
///
/// # Examples
///
/// ```
/// use switchyard_core::CallerIdentity;
/// use switchyard_transport_websocket::{TokenDirectory, TokenTable};
///
/// let tokens = TokenTable::new()
///     .with_token("s3cret", CallerIdentity::granted("billing-workers", ["billing"]));
/// assert_eq!(tokens.caller("s3cret").map(|c| c.principal), Some("billing-workers".into()));
/// assert!(tokens.caller("guess").is_none());
/// ```
#[derive(Clone, Default)]
pub struct TokenTable {
    tokens: HashMap<String, CallerIdentity>,
}

impl TokenTable {
    /// An empty table: every token is unknown.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bearer token and the caller it authenticates.
    pub fn with_token(mut self, token: impl Into<String>, caller: CallerIdentity) -> Self {
        self.tokens.insert(token.into(), caller);
        self
    }
}

impl fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenTable")
            .field(
                "principals",
                &self
                    .tokens
                    .values()
                    .map(|c| &c.principal)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl TokenDirectory for TokenTable {
    fn caller(&self, token: &str) -> Option<CallerIdentity> {
        self.tokens.get(token).cloned()
    }
}

/// Why a caller could not be authenticated; every variant closes with code 4401.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthenticationError {
    /// No bearer token anywhere, and anonymous callers are refused.
    #[error("no bearer token: send an Authorization header or a token in the register frame")]
    NoCredentials,
    /// The `Authorization` header is not `Bearer <token>`.
    #[error("authorization header is not of the form \"Bearer <token>\"")]
    MalformedAuthorization,
    /// A token came both in the header and in the `register` frame.
    #[error("bearer token given twice: in the authorization header and in the register frame")]
    TwoTokens,
    /// The bearer token is not in the directory.
    #[error("bearer token not recognised")]
    UnknownToken,
}

/// The token in an `Authorization: Bearer <token>` header value.
pub(crate) fn bearer(header: &HeaderValue) -> Result<String, AuthenticationError> {
    let value = header
        .to_str()
        .map_err(|_| AuthenticationError::MalformedAuthorization)?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or(AuthenticationError::MalformedAuthorization)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(AuthenticationError::MalformedAuthorization);
    }
    Ok(token.to_owned())
}

/// The caller behind a connection, from its header token, its frame token, or neither.
pub(crate) fn authenticate(
    header: Option<&HeaderValue>,
    frame_token: Option<&str>,
    directory: &dyn TokenDirectory,
    anonymous: Option<&CallerIdentity>,
) -> Result<CallerIdentity, AuthenticationError> {
    let header_token = header.map(bearer).transpose()?;
    let token = match (header_token.as_deref(), frame_token) {
        (Some(_), Some(_)) => return Err(AuthenticationError::TwoTokens),
        (Some(token), None) | (None, Some(token)) => token,
        (None, None) => return anonymous.cloned().ok_or(AuthenticationError::NoCredentials),
    };
    directory
        .caller(token)
        .ok_or(AuthenticationError::UnknownToken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TokenTable {
        TokenTable::new().with_token("s3cret", CallerIdentity::granted("team", ["ns"]))
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn header_token_and_frame_token_each_authenticate() {
        let by_header = authenticate(Some(&header("Bearer s3cret")), None, &table(), None);
        assert_eq!(by_header.unwrap().principal, "team");
        let by_frame = authenticate(None, Some("s3cret"), &table(), None);
        assert_eq!(by_frame.unwrap().principal, "team");
        let lower_case_scheme = authenticate(Some(&header("bearer s3cret")), None, &table(), None);
        assert_eq!(lower_case_scheme.unwrap().principal, "team");
    }

    #[test]
    fn unknown_malformed_doubled_and_missing_tokens_are_refused_by_name() {
        let cases = [
            (
                Some(header("Bearer guess")),
                None,
                AuthenticationError::UnknownToken,
            ),
            (
                Some(header("Basic czNjcmV0")),
                None,
                AuthenticationError::MalformedAuthorization,
            ),
            (
                Some(header("Bearer ")),
                None,
                AuthenticationError::MalformedAuthorization,
            ),
            (
                Some(header("s3cret")),
                None,
                AuthenticationError::MalformedAuthorization,
            ),
            (
                Some(header("Bearer s3cret")),
                Some("s3cret"),
                AuthenticationError::TwoTokens,
            ),
            (None, None, AuthenticationError::NoCredentials),
        ];
        for (header, frame, expected) in cases {
            let got = authenticate(header.as_ref(), frame, &table(), None);
            assert_eq!(got, Err(expected.clone()), "{header:?} / {frame:?}");
        }
    }

    #[test]
    fn anonymous_identity_applies_only_without_any_token() {
        let anonymous = CallerIdentity::trusted("anonymous");
        let got = authenticate(None, None, &table(), Some(&anonymous));
        assert_eq!(got, Ok(anonymous.clone()));
        let wrong = authenticate(None, Some("guess"), &table(), Some(&anonymous));
        assert_eq!(wrong, Err(AuthenticationError::UnknownToken));
    }

    #[test]
    fn debug_never_prints_tokens() {
        let printed = format!("{:?}", table());
        assert!(printed.contains("team"));
        assert!(!printed.contains("s3cret"));
    }
}
