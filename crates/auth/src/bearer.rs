//! The one reader of an `authorization` value.

use crate::AuthError;

/// The token of an `authorization` value `Bearer <token>`; `Ok(None)` when the value or the
/// token is empty.
///
/// The scheme is case-insensitive (RFC 9110 §11.1), so `bearer abc` is `abc`; whitespace around
/// the value and around the token is trimmed. Any other scheme, or no scheme, is
/// [`AuthError::MalformedAuthorization`].
///
/// # Examples
///
/// ```
/// use switchyard_auth::{AuthError, bearer_token};
///
/// assert_eq!(bearer_token(" bearer abc "), Ok(Some("abc")));
/// assert_eq!(bearer_token("Bearer "), Ok(None));
/// assert_eq!(bearer_token("Basic dTpw"), Err(AuthError::MalformedAuthorization));
/// ```
pub fn bearer_token(value: &str) -> Result<Option<&str>, AuthError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::MalformedAuthorization);
    }
    let token = token.trim();
    Ok((!token.is_empty()).then_some(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_is_case_insensitive_and_whitespace_is_trimmed() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "  bearer   abc  "] {
            assert_eq!(bearer_token(value), Ok(Some("abc")), "{value:?}");
        }
    }

    #[test]
    fn empty_token_is_no_token() {
        for value in ["", "  ", "Bearer", "Bearer ", "bearer    "] {
            assert_eq!(bearer_token(value), Ok(None), "{value:?}");
        }
    }

    #[test]
    fn other_schemes_are_malformed() {
        for value in ["abc", "Basic dTpw", "Bearerabc"] {
            assert_eq!(
                bearer_token(value),
                Err(AuthError::MalformedAuthorization),
                "{value:?}"
            );
        }
    }
}
