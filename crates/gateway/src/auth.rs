//! Who is calling: the principal table shared by every transport and the producer API.
//!
//! A caller proves who it is with a TLS client certificate (the principal it names: its
//! subject's common name, read the same way by every transport) or a bearer token. The
//! certificate wins when both are present. With no principal configured the gateway runs in
//! development mode: every caller is `anonymous` and granted every namespace (configuration
//! refuses that mode on non-loopback addresses).

use std::collections::HashMap;

use switchyard_core::{CallerIdentity, NamespaceGrant};

use crate::config::PrincipalConfig;

/// Why a caller was not identified.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// It presented no credential and the gateway requires one.
    #[error("no credential: present a client certificate or an authorization bearer token")]
    Missing,
    /// Its bearer token matches no principal.
    #[error("bearer token matches no principal")]
    UnknownToken,
    /// Its certificate subject matches no principal.
    #[error("client certificate subject {0:?} matches no principal")]
    UnknownSubject(String),
    /// Its certificate could not be read.
    #[error("client certificate cannot be read: {0}")]
    BadCertificate(String),
}

/// The credentials a transport found on a connection or call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Credentials<'a> {
    /// The principal a verified client certificate names, if one was presented.
    pub cert_subject: Option<&'a str>,
    /// Bearer token, if one was presented.
    pub bearer_token: Option<&'a str>,
}

/// The principal table: credentials to [`CallerIdentity`]; cheap to share behind an `Arc`.
#[derive(Clone, Debug, Default)]
pub struct Principals {
    by_token: HashMap<String, CallerIdentity>,
    by_subject: HashMap<String, CallerIdentity>,
    development: bool,
}

impl Principals {
    /// The table for `principals`; development mode when the list is empty.
    pub fn new(principals: &[PrincipalConfig]) -> Self {
        let mut table = Self {
            development: principals.is_empty(),
            ..Self::default()
        };
        for principal in principals {
            let grant = if principal.namespaces.iter().any(|ns| ns == "*") {
                NamespaceGrant::All
            } else {
                NamespaceGrant::Only(principal.namespaces.iter().cloned().collect())
            };
            let identity = CallerIdentity {
                principal: principal.name.clone(),
                grant,
            };
            if !principal.token.is_empty() {
                table
                    .by_token
                    .insert(principal.token.clone(), identity.clone());
            }
            if !principal.cert_subject.is_empty() {
                table
                    .by_subject
                    .insert(principal.cert_subject.clone(), identity);
            }
        }
        table
    }

    /// True when no principal is configured and every caller is trusted.
    pub fn is_development(&self) -> bool {
        self.development
    }

    /// The caller for a bearer token, if it matches a principal.
    pub fn by_token(&self, token: &str) -> Option<&CallerIdentity> {
        self.by_token.get(token)
    }

    /// The caller for a client certificate subject, if it matches a principal.
    pub fn by_subject(&self, subject: &str) -> Option<&CallerIdentity> {
        self.by_subject.get(subject)
    }

    /// Identifies a caller from what it presented.
    pub fn identify(&self, credentials: Credentials<'_>) -> Result<CallerIdentity, AuthError> {
        if let Some(subject) = credentials.cert_subject {
            if let Some(identity) = self.by_subject(subject) {
                return Ok(identity.clone());
            }
            if !self.development {
                return Err(AuthError::UnknownSubject(subject.to_owned()));
            }
        }
        if let Some(token) = credentials.bearer_token {
            if let Some(identity) = self.by_token(token) {
                return Ok(identity.clone());
            }
            if !self.development {
                return Err(AuthError::UnknownToken);
            }
        }
        if self.development {
            Ok(CallerIdentity::trusted("anonymous"))
        } else {
            Err(AuthError::Missing)
        }
    }
}

/// The token of an `authorization` header value of the form `Bearer <token>`.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, token: &str, subject: &str, namespaces: &[&str]) -> PrincipalConfig {
        PrincipalConfig {
            name: name.to_owned(),
            token: token.to_owned(),
            cert_subject: subject.to_owned(),
            namespaces: namespaces.iter().map(|ns| (*ns).to_owned()).collect(),
        }
    }

    #[test]
    fn tokens_and_subjects_map_to_their_principal_and_grant() {
        let table = Principals::new(&[
            principal("billing", "t-billing", "", &["billing"]),
            principal("ops", "", "ops.example", &["*"]),
        ]);
        let billing = table
            .identify(Credentials {
                bearer_token: Some("t-billing"),
                ..Credentials::default()
            })
            .unwrap();
        assert_eq!(billing.principal, "billing");
        assert!(billing.grant.allows("billing"));
        assert!(!billing.grant.allows("payroll"));
        let ops = table
            .identify(Credentials {
                cert_subject: Some("ops.example"),
                bearer_token: Some("t-billing"),
            })
            .unwrap();
        assert_eq!(ops.principal, "ops", "the certificate wins over the token");
        assert!(ops.grant.allows("anything"));
    }

    #[test]
    fn unknown_or_missing_credentials_are_refused_unless_in_development_mode() {
        let table = Principals::new(&[principal("a", "t", "", &["x"])]);
        assert_eq!(
            table.identify(Credentials::default()),
            Err(AuthError::Missing)
        );
        assert_eq!(
            table.identify(Credentials {
                bearer_token: Some("nope"),
                ..Credentials::default()
            }),
            Err(AuthError::UnknownToken)
        );
        let dev = Principals::new(&[]);
        assert!(dev.is_development());
        let anonymous = dev.identify(Credentials::default()).unwrap();
        assert_eq!(anonymous.principal, "anonymous");
        assert_eq!(anonymous.grant, NamespaceGrant::All);
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }
}
