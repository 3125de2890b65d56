//! The connection table: how many connections a listener holds, in all and per source
//! address, and whether one more may be admitted. Plain data, no I/O.

use std::collections::HashMap;
use std::net::IpAddr;

/// How many connections one TCP listener holds at once, checked at accept before a byte is
/// read; a connection beyond either limit is closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections the listener holds in all.
    pub max_connections: usize,
    /// Connections the listener holds from one source IP address.
    pub max_connections_per_address: usize,
}

/// Why a connection was closed at accept: the limit it met, named as its configuration field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionRefusal {
    /// The listener holds `max_connections` connections already.
    #[error("max_connections ({limit}) reached")]
    Listener {
        /// The limit in force.
        limit: usize,
    },
    /// The source address holds `max_connections_per_address` connections already.
    #[error("max_connections_per_address ({limit}) reached by {address}")]
    Address {
        /// The limit in force.
        limit: usize,
        /// The source address.
        address: IpAddr,
    },
}

impl ConnectionRefusal {
    /// The limit's field name, as the `limit` label of the refusal counter.
    pub fn limit_name(&self) -> &'static str {
        match self {
            Self::Listener { .. } => "max_connections",
            Self::Address { .. } => "max_connections_per_address",
        }
    }
}

/// Connections held, in all and per source address.
#[derive(Debug)]
pub(crate) struct ConnectionTable {
    limits: ConnectionLimits,
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl ConnectionTable {
    pub(crate) fn new(limits: ConnectionLimits) -> Self {
        Self {
            limits,
            total: 0,
            by_address: HashMap::new(),
        }
    }

    /// Counts one more connection from `address`, unless a limit is met.
    pub(crate) fn admit(&mut self, address: IpAddr) -> Result<(), ConnectionRefusal> {
        if self.total >= self.limits.max_connections {
            return Err(ConnectionRefusal::Listener {
                limit: self.limits.max_connections,
            });
        }
        let held = self.by_address.entry(address).or_insert(0);
        if *held >= self.limits.max_connections_per_address {
            return Err(ConnectionRefusal::Address {
                limit: self.limits.max_connections_per_address,
                address,
            });
        }
        *held += 1;
        self.total += 1;
        Ok(())
    }

    /// Forgets one connection from `address`; an address with none left leaves the table.
    pub(crate) fn release(&mut self, address: IpAddr) {
        if let Some(held) = self.by_address.get_mut(&address) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.by_address.remove(&address);
            }
            self.total = self.total.saturating_sub(1);
        }
    }

    /// Connections held in all.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Source addresses with a connection held.
    #[cfg(test)]
    pub(crate) fn addresses(&self) -> usize {
        self.by_address.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    fn table(total: usize, per_address: usize) -> ConnectionTable {
        ConnectionTable::new(ConnectionLimits {
            max_connections: total,
            max_connections_per_address: per_address,
        })
    }

    #[test]
    fn an_address_at_its_limit_is_refused_while_another_is_admitted() {
        let mut table = table(10, 2);
        assert_eq!(table.admit(A), Ok(()));
        assert_eq!(table.admit(A), Ok(()));
        let refused = table.admit(A).unwrap_err();
        assert_eq!(
            refused,
            ConnectionRefusal::Address {
                limit: 2,
                address: A
            }
        );
        assert_eq!(refused.limit_name(), "max_connections_per_address");
        assert!(
            refused
                .to_string()
                .contains("max_connections_per_address (2)")
        );
        assert_eq!(table.admit(B), Ok(()), "another address is not held back");
        // Control: a released connection makes room for the address again.
        table.release(A);
        assert_eq!(table.admit(A), Ok(()));
    }

    #[test]
    fn the_listener_limit_holds_across_addresses() {
        let mut table = table(3, 2);
        table.admit(A).unwrap();
        table.admit(A).unwrap();
        table.admit(B).unwrap();
        let refused = table.admit(B).unwrap_err();
        assert_eq!(refused, ConnectionRefusal::Listener { limit: 3 });
        assert_eq!(refused.limit_name(), "max_connections");
        table.release(B);
        assert_eq!(table.admit(B), Ok(()));
    }

    #[test]
    fn released_addresses_leave_the_table() {
        let mut table = table(10, 10);
        table.admit(A).unwrap();
        table.admit(B).unwrap();
        table.release(A);
        table.release(B);
        assert_eq!((table.total(), table.addresses()), (0, 0));
        // A release without an admission changes nothing.
        table.release(A);
        assert_eq!(table.total(), 0);
    }
}
