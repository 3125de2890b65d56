//! What a principal may do: its roles, checked by the admission gate and the producer API.
//!
//! Roles are orthogonal to the namespace grant: the grant says *where*, the roles say *what*.
//! `admin` holds every other role; no other role implies another.

use std::fmt;

/// One thing a principal may be allowed to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Role {
    /// Register workers.
    Worker,
    /// Dispatch, and cancel and look up its own dispatches.
    Producer,
    /// List, explain, drain and watch; cancel any dispatch in its namespaces.
    Operator,
    /// Everything the other roles allow.
    Admin,
}

impl Role {
    /// Every role, in the order they are documented.
    pub const ALL: [Role; 4] = [Role::Worker, Role::Producer, Role::Operator, Role::Admin];

    /// The role's configuration name (`worker`, `producer`, `operator`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Producer => "producer",
            Self::Operator => "operator",
            Self::Admin => "admin",
        }
    }

    /// The role named `name` (as in configuration), if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == name)
    }

    fn bit(self) -> u8 {
        match self {
            Self::Worker => 1,
            Self::Producer => 2,
            Self::Operator => 4,
            Self::Admin => 8,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The set of roles a principal holds.
///
/// # Examples
///
/// ```
/// use switchyard_core::{Role, Roles};
///
/// let roles = Roles::from_iter([Role::Worker, Role::Producer]);
/// assert!(roles.allows(Role::Producer));
/// assert!(!roles.allows(Role::Operator));
/// assert!(Roles::ADMIN.allows(Role::Operator), "admin holds every role");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Roles(u8);

impl Roles {
    /// No role at all: the principal authenticates but may do nothing.
    pub const NONE: Roles = Roles(0);
    /// `admin`: every role (development mode, trusted embedding, principals without `roles`).
    pub const ADMIN: Roles = Roles(8);

    /// True when the set holds `role`, or holds `admin`.
    pub fn allows(self, role: Role) -> bool {
        self.0 & (role.bit() | Role::Admin.bit()) != 0
    }

    /// The roles in the set, in documented order.
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL
            .into_iter()
            .filter(move |role| self.0 & role.bit() != 0)
    }
}

impl FromIterator<Role> for Roles {
    fn from_iter<I: IntoIterator<Item = Role>>(roles: I) -> Self {
        Roles(roles.into_iter().fold(0, |bits, role| bits | role.bit()))
    }
}

impl fmt::Debug for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_allows_only_itself_and_admin_allows_all() {
        for held in Role::ALL {
            let roles = Roles::from_iter([held]);
            for asked in Role::ALL {
                let expected = held == asked || held == Role::Admin;
                assert_eq!(roles.allows(asked), expected, "{held} asked {asked}");
            }
        }
        for asked in Role::ALL {
            assert!(!Roles::NONE.allows(asked), "no role allows {asked}");
        }
    }

    #[test]
    fn names_round_trip() {
        for role in Role::ALL {
            assert_eq!(Role::from_name(role.as_str()), Some(role));
        }
        assert_eq!(Role::from_name("Admin"), None, "names are lowercase");
    }
}
