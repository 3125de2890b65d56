//! Who is calling: the principal table shared by every transport and the producer API.
//!
//! [`Principals`] is the gateway's one [`Authenticate`]: every transport and the producer API
//! hand it what the caller presented, and `switchyard-auth`'s [`CallerTable`] decides (the
//! certificate wins over a token; an unrecognised certificate subject or token is refused as
//! unauthenticated). With no principal configured the gateway runs in development mode: every
//! caller is `anonymous` and granted every namespace (configuration refuses that mode on
//! non-loopback addresses).

use switchyard_auth::{AllowAll, AuthError, Authenticate, CallerTable, Credentials};
use switchyard_core::{CallerIdentity, NamespaceGrant};

use crate::config::PrincipalSection;

/// The principal table: credentials to [`CallerIdentity`]; cheap to share behind an `Arc`.
#[derive(Clone, Debug, Default)]
pub struct Principals {
    table: CallerTable,
}

impl Principals {
    /// The table for `principals`; development mode when the list is empty.
    pub fn new(principals: &[PrincipalSection]) -> Self {
        let table = principals
            .iter()
            .fold(CallerTable::new(), |table, principal| {
                let grant = if principal.namespaces.iter().any(|ns| ns == "*") {
                    NamespaceGrant::All
                } else {
                    NamespaceGrant::Only(principal.namespaces.iter().cloned().collect())
                };
                let identity = CallerIdentity {
                    principal: principal.name.clone(),
                    grant,
                };
                let table = if principal.token.is_empty() {
                    table
                } else {
                    table.with_token(principal.token.clone(), identity.clone())
                };
                if principal.cert_subject.is_empty() {
                    table
                } else {
                    table.with_certificate(principal.cert_subject.clone(), identity)
                }
            });
        Self { table }
    }

    /// True when no principal is configured and every caller is trusted.
    pub fn is_development(&self) -> bool {
        self.table.is_empty()
    }
}

impl Authenticate for Principals {
    fn authenticate(&self, credentials: &Credentials<'_>) -> Result<CallerIdentity, AuthError> {
        if self.is_development() {
            return AllowAll.authenticate(credentials);
        }
        self.table.authenticate(credentials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, token: &str, subject: &str, namespaces: &[&str]) -> PrincipalSection {
        PrincipalSection {
            name: name.to_owned(),
            token: token.to_owned(),
            cert_subject: subject.to_owned(),
            namespaces: namespaces.iter().map(|ns| (*ns).to_owned()).collect(),
        }
    }

    fn token(table: &Principals, token: &str) -> Result<CallerIdentity, AuthError> {
        table.authenticate(&Credentials::new().bearer_token(Some(token)))
    }

    #[test]
    fn tokens_map_to_their_principal_and_grant() {
        let table = Principals::new(&[
            principal("billing", "t-billing", "", &["billing"]),
            principal("ops", "t-ops", "ops.example", &["*"]),
        ]);
        let billing = token(&table, "t-billing").unwrap();
        assert_eq!(billing.principal, "billing");
        assert!(billing.grant.allows("billing"));
        assert!(!billing.grant.allows("payroll"));
        let ops = token(&table, "t-ops").unwrap();
        assert_eq!(ops.principal, "ops");
        assert!(ops.grant.allows("anything"));
    }

    #[test]
    fn unknown_or_missing_credentials_are_refused_unless_in_development_mode() {
        let table = Principals::new(&[principal("a", "t", "", &["x"])]);
        assert!(!table.is_development());
        assert_eq!(
            table.authenticate(&Credentials::new()),
            Err(AuthError::NoCredential)
        );
        assert_eq!(token(&table, "nope"), Err(AuthError::TokenNotRecognised));
        let dev = Principals::new(&[]);
        assert!(dev.is_development());
        let anonymous = dev.authenticate(&Credentials::new()).unwrap();
        assert_eq!(anonymous.principal, "anonymous");
        assert_eq!(anonymous.grant, NamespaceGrant::All);
        assert_eq!(token(&dev, "nope").unwrap().principal, "anonymous");
    }
}
