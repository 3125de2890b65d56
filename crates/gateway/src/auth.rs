//! Who is calling: the principal table shared by every transport and the producer API.
//!
//! [`Principals`] is the gateway's one [`Authenticate`]: every transport and the producer API
//! hand it what the caller presented, and `switchyard-auth`'s [`CallerTable`] decides (the
//! certificate wins over a token; an unrecognised certificate subject or token is refused as
//! unauthenticated). Each principal carries its roles (`principals[].roles`; absent means
//! `admin`, with a start-up warning naming the principal, so configurations written before roles
//! keep working) and its worker quota (`principals[].max_workers`). With no principal
//! configured the gateway runs in development mode: every caller is `anonymous`, granted every
//! namespace and every role, with no worker quota (configuration refuses that mode on
//! non-loopback addresses).

use switchyard_auth::{AllowAll, AuthError, Authenticate, CallerTable, Credentials};
use switchyard_core::{CallerIdentity, NamespaceGrant, Roles};

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
                    grant,
                    roles: roles_of(principal),
                    max_workers: Some(principal.max_workers),
                    ..CallerIdentity::trusted(principal.name.clone())
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

/// The roles `principal` holds: its `roles`, or `admin` when the key is absent (warned once,
/// at start, naming the principal: [`unlisted_roles_warning`]).
fn roles_of(principal: &PrincipalSection) -> Roles {
    if let Some(warning) = unlisted_roles_warning(principal) {
        tracing::warn!(principal = %principal.name, "{warning}");
    }
    match &principal.roles {
        Some(roles) => roles.iter().map(|role| role.role()).collect(),
        None => Roles::ADMIN,
    }
}

/// The warning a principal without `roles` gets at start (it holds `admin`); none for one
/// whose roles are listed.
fn unlisted_roles_warning(principal: &PrincipalSection) -> Option<String> {
    principal.roles.is_none().then(|| {
        format!(
            "principal {:?} has no `roles`: it holds `admin` (every role); list the roles it \
             needs (worker, producer, operator) to narrow it",
            principal.name
        )
    })
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
            ..PrincipalSection::default()
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

    #[test]
    fn roles_and_quota_come_from_the_section_and_absent_roles_mean_admin() {
        use crate::config::RoleName;
        use switchyard_core::Role;
        let mut narrow = principal("w1", "t-w1", "", &["a"]);
        narrow.roles = Some(vec![RoleName::Worker]);
        narrow.max_workers = 7;
        let table = Principals::new(&[narrow, principal("legacy", "t-legacy", "", &["a"])]);
        let w1 = token(&table, "t-w1").unwrap();
        assert!(w1.has_role(Role::Worker));
        assert!(!w1.has_role(Role::Producer), "only the listed roles");
        assert_eq!(w1.max_workers, Some(7));
        let legacy = token(&table, "t-legacy").unwrap();
        assert_eq!(legacy.roles, Roles::ADMIN, "no roles key: admin");
        assert_eq!(
            legacy.max_workers,
            Some(switchyard_core::DEFAULT_MAX_WORKERS_PER_PRINCIPAL)
        );
        let anonymous = Principals::new(&[])
            .authenticate(&Credentials::new())
            .unwrap();
        assert_eq!(anonymous.roles, Roles::ADMIN);
        assert_eq!(anonymous.max_workers, None, "development mode has no quota");
    }

    #[test]
    fn a_principal_without_roles_is_warned_about_at_start_by_name() {
        use crate::config::RoleName;
        let legacy = principal("legacy", "t-legacy", "", &["a"]);
        let warning = unlisted_roles_warning(&legacy).expect("warned");
        assert!(
            warning.starts_with("principal \"legacy\" has no `roles`: it holds `admin`"),
            "{warning}"
        );
        assert_eq!(roles_of(&legacy), Roles::ADMIN);
        // Control: a principal with its roles listed is not warned about.
        let mut narrow = principal("narrowed", "t-narrowed", "", &["a"]);
        narrow.roles = Some(vec![RoleName::Worker]);
        assert_eq!(unlisted_roles_warning(&narrow), None);
    }
}
