//! What a peer may hold before it registers, decided per new connection: a stateless Retry, a
//! refusal naming its limit, or a handshake.
//!
//! Three counts bound it. Handshakes from addresses nobody has validated yet
//! (`max_unvalidated_handshakes`): the only state a spoofed Initial packet can make the gateway
//! keep, and beyond which it answers with a stateless Retry (or, with Retry off, refuses).
//! Connections per proven address (`max_connections_per_address`): an address counts only once
//! it has proven it receives our packets, by a Retry token or by finishing the handshake, so
//! forged packets cannot use up a victim's share. Connections through their handshake but not
//! registered (`max_unregistered_connections`): a slot is taken only after the handshake, and
//! given back at registration. [`Intake`] is the plain table; [`SharedIntake`] hands out
//! [`Pass`]es that give their counts back when the connection ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::config::{QuicServerConfig, RetryPolicy};
use crate::metrics::LIMIT_LABELS;

/// A limit of the intake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Limit {
    /// `max_unvalidated_handshakes`.
    UnvalidatedHandshakes,
    /// `max_unregistered_connections`.
    UnregisteredConnections,
    /// `max_connections_per_address`.
    ConnectionsPerAddress,
}

impl Limit {
    /// Every limit, in the order of [`LIMIT_LABELS`].
    pub(crate) const ALL: [Self; 3] = [
        Self::UnvalidatedHandshakes,
        Self::UnregisteredConnections,
        Self::ConnectionsPerAddress,
    ];

    /// The setting's name, the `limit` label of the refusal counter.
    pub(crate) const fn label(self) -> &'static str {
        LIMIT_LABELS[self as usize]
    }
}

/// A connection refused because a limit is reached; says `` `quic.<limit>` (<value>) reached``.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`quic.{}` ({value}) reached", limit.label())]
pub(crate) struct Refusal {
    /// The limit.
    pub(crate) limit: Limit,
    /// Its configured value.
    pub(crate) value: usize,
}

/// What the intake decided for a new connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Start the handshake; the connection holds what [`Holds`] says.
    Handshake(Holds),
    /// Answer with a stateless Retry; nothing is held.
    Retry,
    /// Refuse with `CONNECTION_REFUSED`.
    Refuse(Refusal),
}

/// The counts one connection holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Holds {
    /// Counted against its (proven) address.
    address: Option<IpAddr>,
    /// Counted as an unvalidated handshake.
    unvalidated: bool,
    /// Counted as handshaken but unregistered.
    unregistered: bool,
}

/// The counts and the limits, as plain data.
#[derive(Debug)]
pub(crate) struct Intake {
    retry: RetryPolicy,
    max_unvalidated: usize,
    max_unregistered: usize,
    max_per_address: usize,
    unvalidated: usize,
    unregistered: usize,
    per_address: HashMap<IpAddr, usize>,
}

impl Intake {
    /// An empty intake with `config`'s limits.
    pub(crate) fn new(config: &QuicServerConfig) -> Self {
        Self {
            retry: config.retry,
            max_unvalidated: config.max_unvalidated_handshakes,
            max_unregistered: config.max_unregistered_connections,
            max_per_address: config.max_connections_per_address,
            unvalidated: 0,
            unregistered: 0,
            per_address: HashMap::new(),
        }
    }

    /// Decides on a connection's first packet from `ip`; `validated` when it carries a token
    /// proving the address (a Retry's or an earlier connection's).
    pub(crate) fn arrive(&mut self, ip: IpAddr, validated: bool) -> Arrival {
        let ip = ip.to_canonical();
        // Would the connection be refused once its address is proven?
        let refusal = self
            .address_refusal(ip)
            .or_else(|| self.unregistered_refusal());
        if validated {
            if let Some(refusal) = refusal {
                return Arrival::Refuse(refusal);
            }
            *self.per_address.entry(ip).or_default() += 1;
            return Arrival::Handshake(Holds {
                address: Some(ip),
                ..Holds::default()
            });
        }
        let busy = self.unvalidated >= self.max_unvalidated;
        match self.retry {
            RetryPolicy::Always => return Arrival::Retry,
            RetryPolicy::UnderLoad => {
                if busy || refusal.is_some() || self.unregistered * 2 > self.max_unregistered {
                    return Arrival::Retry;
                }
            }
            RetryPolicy::Off => {
                if busy {
                    return Arrival::Refuse(Refusal {
                        limit: Limit::UnvalidatedHandshakes,
                        value: self.max_unvalidated,
                    });
                }
                if let Some(refusal) = self.unregistered_refusal() {
                    return Arrival::Refuse(refusal);
                }
            }
        }
        self.unvalidated += 1;
        Arrival::Handshake(Holds {
            unvalidated: true,
            ..Holds::default()
        })
    }

    /// The handshake from `ip` finished: the address is proven and the connection now waits
    /// for its registration, if the limits allow.
    pub(crate) fn handshaken(&mut self, ip: IpAddr, holds: &mut Holds) -> Result<(), Refusal> {
        let ip = ip.to_canonical();
        if std::mem::take(&mut holds.unvalidated) {
            self.unvalidated = self.unvalidated.saturating_sub(1);
        }
        if holds.address.is_none() {
            if let Some(refusal) = self.address_refusal(ip) {
                return Err(refusal);
            }
            *self.per_address.entry(ip).or_default() += 1;
            holds.address = Some(ip);
        }
        if !holds.unregistered {
            if let Some(refusal) = self.unregistered_refusal() {
                return Err(refusal);
            }
            self.unregistered += 1;
            holds.unregistered = true;
        }
        Ok(())
    }

    /// The connection registered: it no longer counts as unregistered.
    pub(crate) fn registered(&mut self, holds: &mut Holds) {
        if std::mem::take(&mut holds.unregistered) {
            self.unregistered = self.unregistered.saturating_sub(1);
        }
    }

    /// The connection ended: gives back everything it holds.
    pub(crate) fn release(&mut self, holds: &mut Holds) {
        self.registered(holds);
        if std::mem::take(&mut holds.unvalidated) {
            self.unvalidated = self.unvalidated.saturating_sub(1);
        }
        if let Some(ip) = holds.address.take() {
            if let Some(count) = self.per_address.get_mut(&ip) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.per_address.remove(&ip);
                }
            }
        }
    }

    fn address_refusal(&self, ip: IpAddr) -> Option<Refusal> {
        let at_address = self.per_address.get(&ip).copied().unwrap_or(0);
        (at_address >= self.max_per_address).then_some(Refusal {
            limit: Limit::ConnectionsPerAddress,
            value: self.max_per_address,
        })
    }

    fn unregistered_refusal(&self) -> Option<Refusal> {
        (self.unregistered >= self.max_unregistered).then_some(Refusal {
            limit: Limit::UnregisteredConnections,
            value: self.max_unregistered,
        })
    }
}

/// An [`Intake`] shared by the accept loop and the connections.
#[derive(Clone, Debug)]
pub(crate) struct SharedIntake(Arc<Mutex<Intake>>);

/// What [`SharedIntake::arrive`] decided, with the [`Pass`] of an accepted connection.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Start the handshake, holding the pass for the connection's life.
    Handshake(Pass),
    /// Answer with a stateless Retry.
    Retry,
    /// Refuse with `CONNECTION_REFUSED`.
    Refuse(Refusal),
}

impl SharedIntake {
    /// An empty intake with `config`'s limits.
    pub(crate) fn new(config: &QuicServerConfig) -> Self {
        Self(Arc::new(Mutex::new(Intake::new(config))))
    }

    fn lock(&self) -> MutexGuard<'_, Intake> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections through their handshake and not yet registered.
    pub(crate) fn unregistered(&self) -> usize {
        self.lock().unregistered
    }

    /// [`Intake::arrive`], with a [`Pass`] for an accepted connection.
    pub(crate) fn arrive(&self, ip: IpAddr, validated: bool) -> Verdict {
        match self.lock().arrive(ip, validated) {
            Arrival::Handshake(holds) => Verdict::Handshake(Pass {
                intake: self.clone(),
                ip,
                holds,
            }),
            Arrival::Retry => Verdict::Retry,
            Arrival::Refuse(refusal) => Verdict::Refuse(refusal),
        }
    }
}

/// One connection's share of the intake, given back when dropped.
#[derive(Debug)]
pub(crate) struct Pass {
    intake: SharedIntake,
    ip: IpAddr,
    holds: Holds,
}

impl Pass {
    /// [`Intake::handshaken`].
    pub(crate) fn handshaken(&mut self) -> Result<(), Refusal> {
        self.intake.lock().handshaken(self.ip, &mut self.holds)
    }

    /// [`Intake::registered`].
    pub(crate) fn registered(&mut self) {
        self.intake.lock().registered(&mut self.holds);
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.intake.lock().release(&mut self.holds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    fn intake(retry: RetryPolicy, unvalidated: usize, unregistered: usize, per: usize) -> Intake {
        Intake::new(&QuicServerConfig {
            retry,
            max_unvalidated_handshakes: unvalidated,
            max_unregistered_connections: unregistered,
            max_connections_per_address: per,
            ..QuicServerConfig::default()
        })
    }

    fn handshake(arrival: Arrival) -> Holds {
        match arrival {
            Arrival::Handshake(holds) => holds,
            other => panic!("expected a handshake, got {other:?}"),
        }
    }

    #[test]
    fn under_load_spoofed_initials_hold_a_bounded_count_then_get_retries() {
        let mut intake = intake(RetryPolicy::UnderLoad, 2, 10, 10);
        let _a = handshake(intake.arrive(HOST, false));
        let _b = handshake(intake.arrive(HOST, false));
        for _ in 0..1_000 {
            assert_eq!(intake.arrive(HOST, false), Arrival::Retry);
        }
        // A peer that answered the Retry starts its handshake although the budget is spent.
        let validated = handshake(intake.arrive(HOST, true));
        assert_eq!(validated.address, Some(HOST));
        assert_eq!(intake.unvalidated, 2);
    }

    #[test]
    fn with_retry_off_the_same_flood_is_refused_naming_the_limit() {
        // Control for the test above: without Retry the flood's excess is refused, and so is a
        // real worker arriving after it.
        let mut intake = intake(RetryPolicy::Off, 2, 10, 10);
        let _a = handshake(intake.arrive(HOST, false));
        let _b = handshake(intake.arrive(HOST, false));
        let refused = Arrival::Refuse(Refusal {
            limit: Limit::UnvalidatedHandshakes,
            value: 2,
        });
        assert_eq!(intake.arrive(OTHER, false), refused);
        assert_eq!(
            refused_text(&intake.arrive(OTHER, false)),
            "`quic.max_unvalidated_handshakes` (2) reached"
        );
    }

    fn refused_text(arrival: &Arrival) -> String {
        match arrival {
            Arrival::Refuse(refusal) => refusal.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn always_retries_every_unvalidated_connection_and_only_those() {
        let mut intake = intake(RetryPolicy::Always, 100, 100, 100);
        assert_eq!(intake.arrive(HOST, false), Arrival::Retry);
        assert!(matches!(intake.arrive(HOST, true), Arrival::Handshake(_)));
    }

    #[test]
    fn under_load_retries_once_more_than_half_the_unregistered_slots_are_used() {
        let mut intake = intake(RetryPolicy::UnderLoad, 100, 4, 100);
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut holds = handshake(intake.arrive(HOST, false));
            intake.handshaken(HOST, &mut holds).unwrap();
            held.push(holds);
        }
        // Control: at half, a new connection still goes straight to its handshake.
        let mut third = handshake(intake.arrive(HOST, false));
        intake.handshaken(HOST, &mut third).unwrap();
        assert_eq!(intake.arrive(HOST, false), Arrival::Retry, "3 of 4 in use");
        intake.registered(&mut third);
        assert!(matches!(intake.arrive(HOST, false), Arrival::Handshake(_)));
    }

    #[test]
    fn unregistered_slots_are_taken_after_the_handshake_and_given_back_at_registration() {
        let mut intake = intake(RetryPolicy::UnderLoad, 100, 1, 100);
        let mut first = handshake(intake.arrive(HOST, true));
        let mut second = handshake(intake.arrive(OTHER, true));
        assert_eq!(
            intake.unregistered, 0,
            "handshakes in progress hold no slot"
        );
        intake.handshaken(HOST, &mut first).unwrap();
        assert_eq!(
            intake.handshaken(OTHER, &mut second),
            Err(Refusal {
                limit: Limit::UnregisteredConnections,
                value: 1
            })
        );
        assert_eq!(
            intake.arrive(OTHER, true),
            Arrival::Refuse(Refusal {
                limit: Limit::UnregisteredConnections,
                value: 1
            }),
            "a proven address is refused at once while the slots are taken"
        );
        intake.registered(&mut first);
        assert!(intake.handshaken(OTHER, &mut second).is_ok());
    }

    #[test]
    fn a_proven_address_beyond_its_cap_is_refused_and_another_address_is_not() {
        let mut intake = intake(RetryPolicy::UnderLoad, 100, 100, 2);
        let mut first = handshake(intake.arrive(HOST, true));
        let mut second = handshake(intake.arrive(HOST, false));
        intake.handshaken(HOST, &mut second).unwrap();
        let cap = Refusal {
            limit: Limit::ConnectionsPerAddress,
            value: 2,
        };
        assert_eq!(intake.arrive(HOST, true), Arrival::Refuse(cap));
        assert_eq!(
            intake.arrive(HOST, false),
            Arrival::Retry,
            "an unproven packet from the address must prove it before it is refused"
        );
        assert!(matches!(intake.arrive(OTHER, true), Arrival::Handshake(_)));
        // Control: a connection of the address ending frees its place.
        intake.release(&mut first);
        assert!(matches!(intake.arrive(HOST, true), Arrival::Handshake(_)));
        intake.release(&mut second);
    }

    #[test]
    fn spoofed_handshakes_do_not_count_against_the_address_they_name() {
        let mut intake = intake(RetryPolicy::UnderLoad, 100, 100, 1);
        let _spoofed: Vec<Holds> = (0..50)
            .map(|_| handshake(intake.arrive(HOST, false)))
            .collect();
        assert!(matches!(intake.arrive(HOST, true), Arrival::Handshake(_)));
    }

    #[test]
    fn releasing_gives_back_every_count() {
        let mut intake = intake(RetryPolicy::UnderLoad, 100, 100, 100);
        let mut unproven = handshake(intake.arrive(HOST, false));
        let mut waiting = handshake(intake.arrive(HOST, true));
        intake.handshaken(HOST, &mut waiting).unwrap();
        assert_eq!(
            (
                intake.unvalidated,
                intake.unregistered,
                intake.per_address.len()
            ),
            (1, 1, 1)
        );
        intake.release(&mut unproven);
        intake.release(&mut waiting);
        assert_eq!(
            (
                intake.unvalidated,
                intake.unregistered,
                intake.per_address.len()
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn ipv4_mapped_addresses_count_as_their_ipv4_address() {
        let mut intake = intake(RetryPolicy::UnderLoad, 100, 100, 1);
        let _held = handshake(intake.arrive(HOST, true));
        let mapped = match HOST {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(_) => unreachable!(),
        };
        assert!(matches!(intake.arrive(mapped, true), Arrival::Refuse(_)));
    }

    #[test]
    fn limit_labels_name_the_settings() {
        let labels = Limit::ALL.map(Limit::label);
        assert_eq!(labels, LIMIT_LABELS);
        assert_eq!(
            Limit::ConnectionsPerAddress.label(),
            "max_connections_per_address"
        );
    }
}
