//! An in-memory [`Authenticate`]: fixed tokens and certificate principals.

use std::collections::HashMap;
use std::fmt;

use switchyard_core::CallerIdentity;

use crate::{AuthError, Authenticate, Credentials};

/// A fixed table of bearer tokens and certificate principals, each mapped to its caller; the one
/// place the precedence between credentials is decided.
///
/// A verified client certificate wins over a token: its principal
/// ([`crate::certificate_principal`]) must be in the table, else
/// [`AuthError::SubjectNotRecognised`]. Otherwise a bearer token must be in the table, else
/// [`AuthError::TokenNotRecognised`]. With neither, the [`CallerTable::anonymous`] identity
/// applies, or [`AuthError::NoCredential`]. An unrecognised credential is never downgraded to
/// the anonymous identity. `Debug` prints principals, never tokens.
#[derive(Clone, Default)]
pub struct CallerTable {
    tokens: HashMap<String, CallerIdentity>,
    certificates: HashMap<String, CallerIdentity>,
    anonymous: Option<CallerIdentity>,
}

impl CallerTable {
    /// An empty table: every credential is unknown and anonymous callers are refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bearer token and the caller it authenticates.
    pub fn with_token(mut self, token: impl Into<String>, caller: CallerIdentity) -> Self {
        self.tokens.insert(token.into(), caller);
        self
    }

    /// Adds a certificate principal (see [`crate::certificate_principal`]) and its caller.
    pub fn with_certificate(
        mut self,
        principal: impl Into<String>,
        caller: CallerIdentity,
    ) -> Self {
        self.certificates.insert(principal.into(), caller);
        self
    }

    /// The identity of callers that present no credential at all (default: refused).
    pub fn anonymous(mut self, caller: CallerIdentity) -> Self {
        self.anonymous = Some(caller);
        self
    }

    /// True when the table holds no token and no certificate principal.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.certificates.is_empty()
    }
}

impl Authenticate for CallerTable {
    fn authenticate(&self, credentials: &Credentials<'_>) -> Result<CallerIdentity, AuthError> {
        if let Some(principal) = credentials.certificate_principal()? {
            return self
                .certificates
                .get(&principal)
                .cloned()
                .ok_or(AuthError::SubjectNotRecognised(principal));
        }
        if let Some(token) = credentials.bearer_token {
            return self
                .tokens
                .get(token)
                .cloned()
                .ok_or(AuthError::TokenNotRecognised);
        }
        self.anonymous.clone().ok_or(AuthError::NoCredential)
    }
}

impl fmt::Debug for CallerTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let principals = |map: &HashMap<String, CallerIdentity>| {
            map.values()
                .map(|c| c.principal.clone())
                .collect::<Vec<_>>()
        };
        f.debug_struct("CallerTable")
            .field("token_principals", &principals(&self.tokens))
            .field("certificate_principals", &principals(&self.certificates))
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::NamespaceGrant;

    fn table() -> CallerTable {
        CallerTable::new()
            .with_token("t1", CallerIdentity::granted("alice", ["a"]))
            .with_certificate("worker.test", CallerIdentity::trusted("ops"))
    }

    fn certificate(common_name: &str) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn known_token_resolves_and_unknown_token_is_refused() {
        let token = |t| table().authenticate(&Credentials::new().bearer_token(Some(t)));
        assert_eq!(token("t1"), Ok(CallerIdentity::granted("alice", ["a"])));
        assert_eq!(token("t2"), Err(AuthError::TokenNotRecognised));
    }

    #[test]
    fn certificate_wins_over_token() {
        let chain = [certificate("worker.test")];
        let caller = table()
            .authenticate(
                &Credentials::new()
                    .certificate_chain(&chain)
                    .bearer_token(Some("t1")),
            )
            .unwrap();
        assert_eq!(caller.principal, "ops");
        assert_eq!(caller.grant, NamespaceGrant::All);
    }

    #[test]
    fn unknown_certificate_subject_is_refused_even_with_a_good_token() {
        let chain = [certificate("stranger")];
        let refused = table().authenticate(
            &Credentials::new()
                .certificate_chain(&chain)
                .bearer_token(Some("t1")),
        );
        assert_eq!(
            refused,
            Err(AuthError::SubjectNotRecognised("stranger".into()))
        );
    }

    #[test]
    fn no_credential_is_refused_unless_anonymous_is_configured() {
        assert_eq!(
            table().authenticate(&Credentials::new()),
            Err(AuthError::NoCredential)
        );
        let guest = CallerIdentity::granted("guest", ["public"]);
        let open = table().anonymous(guest.clone());
        assert_eq!(open.authenticate(&Credentials::new()), Ok(guest));
        let blank = Credentials::new().bearer_token(Some("  "));
        assert_eq!(
            table().authenticate(&blank),
            Err(AuthError::NoCredential),
            "a blank token is no token"
        );
        assert_eq!(
            open.authenticate(&Credentials::new().bearer_token(Some("guess"))),
            Err(AuthError::TokenNotRecognised),
            "an unknown token is not downgraded to anonymous"
        );
    }

    #[test]
    fn debug_never_prints_tokens() {
        let printed = format!("{:?}", table());
        assert!(printed.contains("alice"));
        assert!(!printed.contains("t1"));
    }
}
