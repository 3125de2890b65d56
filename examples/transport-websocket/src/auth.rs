//! Who is calling: a bearer token, handed to the embedder's [`Authenticate`].
//!
//! A worker presents its token in the upgrade request's `Authorization: Bearer <token>` header
//! (the scheme in any case, as everywhere in Switchyard), or, when it cannot set headers (a
//! browser's `WebSocket` cannot), in the `token` field of its `register` frame. Presenting both
//! is refused, so there is never a question of which one counts. Failures are reported after the
//! upgrade, as a close with code 4401, because a browser is shown nothing of a refused upgrade's
//! HTTP status.
//!
//! No cookie or other ambient credential is read, so a page on another origin cannot ride on a
//! user's session (cross-site WebSocket hijacking): the caller is whoever knows a token.

use switchyard_auth::{AuthError, Authenticate, Credentials, bearer_token};
use switchyard_core::CallerIdentity;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// The caller behind a connection, from its header token, its frame token, or neither.
pub(crate) fn authenticate(
    header: Option<&HeaderValue>,
    frame_token: Option<&str>,
    auth: &dyn Authenticate,
) -> Result<CallerIdentity, AuthError> {
    let header_token = match header {
        Some(value) => {
            let value = value
                .to_str()
                .map_err(|_| AuthError::MalformedAuthorization)?;
            bearer_token(value)?
        }
        None => None,
    };
    let frame_token = frame_token.filter(|token| !token.trim().is_empty());
    if header_token.is_some() && frame_token.is_some() {
        return Err(AuthError::TokenGivenTwice);
    }
    auth.authenticate(&Credentials::new().bearer_token(header_token.or(frame_token)))
}

#[cfg(test)]
mod tests {
    use switchyard_auth::CallerTable;

    use super::*;

    fn table() -> CallerTable {
        CallerTable::new().with_token("s3cret", CallerIdentity::granted("team", ["ns"]))
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn header_token_and_frame_token_each_authenticate() {
        let by_header = authenticate(Some(&header("Bearer s3cret")), None, &table());
        assert_eq!(by_header.unwrap().principal, "team");
        let by_frame = authenticate(None, Some("s3cret"), &table());
        assert_eq!(by_frame.unwrap().principal, "team");
        let lower_case_scheme = authenticate(Some(&header("bearer s3cret")), None, &table());
        assert_eq!(lower_case_scheme.unwrap().principal, "team");
    }

    #[test]
    fn unknown_malformed_doubled_and_missing_tokens_are_refused_by_name() {
        let cases = [
            (
                Some(header("Bearer guess")),
                None,
                AuthError::TokenNotRecognised,
            ),
            (
                Some(header("Basic czNjcmV0")),
                None,
                AuthError::MalformedAuthorization,
            ),
            (Some(header("Bearer ")), None, AuthError::NoCredential),
            (
                Some(header("s3cret")),
                None,
                AuthError::MalformedAuthorization,
            ),
            (
                Some(header("Bearer s3cret")),
                Some("s3cret"),
                AuthError::TokenGivenTwice,
            ),
            (None, None, AuthError::NoCredential),
        ];
        for (header, frame, expected) in cases {
            let got = authenticate(header.as_ref(), frame, &table());
            assert_eq!(got, Err(expected.clone()), "{header:?} / {frame:?}");
        }
    }

    #[test]
    fn anonymous_identity_applies_only_without_any_token() {
        let anonymous = CallerIdentity::trusted("anonymous");
        let open = table().anonymous(anonymous.clone());
        assert_eq!(authenticate(None, None, &open), Ok(anonymous));
        let wrong = authenticate(None, Some("guess"), &open);
        assert_eq!(wrong, Err(AuthError::TokenNotRecognised));
    }
}
