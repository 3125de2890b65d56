//! What the topology is made of: namespace and device names, addresses, and their rules.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::topology::TopologyError;

/// Longest network namespace name accepted (a file name under `/run/netns`).
const MAX_NAMESPACE_LEN: usize = 64;

/// Longest interface name Linux accepts (`IFNAMSIZ` less the terminating NUL).
const MAX_DEVICE_LEN: usize = 15;

/// An IPv4 interface address with its prefix length, written `10.77.0.1/30`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length, 0 to 32.
    pub prefix: u8,
}

impl InterfaceAddr {
    /// The first address of the subnet.
    pub fn network(self) -> Ipv4Addr {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        Ipv4Addr::from(u32::from(self.addr) & mask)
    }
}

impl FromStr for InterfaceAddr {
    type Err = TopologyError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || TopologyError::InvalidAddress {
            input: input.to_owned(),
        };
        let (addr, prefix) = input.trim().split_once('/').ok_or_else(invalid)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        if prefix > 32 {
            return Err(invalid());
        }
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for InterfaceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One end of the link: a namespace holding one TUN device with one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideSpec {
    /// The network namespace the emulator creates for this side.
    pub namespace: String,
    /// The TUN device's name.
    pub device: String,
    /// The device's address inside the namespace.
    pub address: InterfaceAddr,
}

/// Both ends of the link and the devices' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologySpec {
    /// Side A (by convention the gateway's).
    pub a: SideSpec,
    /// Side B (by convention the workers').
    pub b: SideSpec,
    /// MTU of both TUN devices.
    pub mtu: u16,
    /// Transmit queue length of both TUN devices, in packets.
    pub tx_queue_len: u32,
}

impl TopologySpec {
    /// Checks names and addresses before anything is created.
    ///
    /// Both addresses must be private (RFC 1918), distinct, and in one subnet of one prefix
    /// length of at most /30, so the emulator never routes to any other host.
    pub fn validate(&self) -> Result<(), TopologyError> {
        for side in [&self.a, &self.b] {
            check_namespace_name(&side.namespace)?;
            check_device_name(&side.device)?;
            if !side.address.addr.is_private() {
                return Err(TopologyError::NotPrivate {
                    addr: side.address.addr,
                });
            }
        }
        if self.a.namespace == self.b.namespace {
            return Err(TopologyError::SameName {
                what: "namespace",
                name: self.a.namespace.clone(),
            });
        }
        if self.a.device == self.b.device {
            return Err(TopologyError::SameName {
                what: "device",
                name: self.a.device.clone(),
            });
        }
        let (a, b) = (self.a.address, self.b.address);
        if a.prefix != b.prefix || a.prefix < 30 || a.network() != b.network() || a.addr == b.addr {
            return Err(TopologyError::NotOneSubnet { a, b });
        }
        if self.mtu < 576 {
            return Err(TopologyError::MtuTooSmall { mtu: self.mtu });
        }
        Ok(())
    }
}

fn check_namespace_name(name: &str) -> Result<(), TopologyError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAMESPACE_LEN
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    ok.then_some(()).ok_or_else(|| TopologyError::InvalidName {
        what: "namespace",
        name: name.to_owned(),
    })
}

fn check_device_name(name: &str) -> Result<(), TopologyError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_DEVICE_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    ok.then_some(()).ok_or_else(|| TopologyError::InvalidName {
        what: "device",
        name: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TopologySpec {
        TopologySpec {
            a: SideSpec {
                namespace: "sy-gw".into(),
                device: "lkgw0".into(),
                address: "10.77.0.1/30".parse().unwrap(),
            },
            b: SideSpec {
                namespace: "sy-wk".into(),
                device: "lkwk0".into(),
                address: "10.77.0.2/30".parse().unwrap(),
            },
            mtu: 1500,
            tx_queue_len: 1000,
        }
    }

    #[test]
    fn the_default_layout_is_valid() {
        assert!(spec().validate().is_ok());
    }

    #[test]
    fn public_addresses_are_refused() {
        let mut s = spec();
        s.a.address = "8.8.8.1/30".parse().unwrap();
        s.b.address = "8.8.8.2/30".parse().unwrap();
        assert!(matches!(
            s.validate(),
            Err(TopologyError::NotPrivate { .. })
        ));
    }

    #[test]
    fn addresses_must_share_one_small_subnet() {
        let mut s = spec();
        s.b.address = "10.77.0.6/30".parse().unwrap();
        assert!(matches!(
            s.validate(),
            Err(TopologyError::NotOneSubnet { .. })
        ));
        let mut s = spec();
        s.a.address = "10.77.0.1/8".parse().unwrap();
        s.b.address = "10.77.0.2/8".parse().unwrap();
        assert!(matches!(
            s.validate(),
            Err(TopologyError::NotOneSubnet { .. })
        ));
        let mut s = spec();
        s.b.address = s.a.address;
        assert!(matches!(
            s.validate(),
            Err(TopologyError::NotOneSubnet { .. })
        ));
    }

    #[test]
    fn names_are_checked() {
        let mut s = spec();
        s.a.device = "a-device-name-too-long".into();
        assert!(matches!(
            s.validate(),
            Err(TopologyError::InvalidName { .. })
        ));
        let mut s = spec();
        s.b.namespace = "../etc".into();
        assert!(matches!(
            s.validate(),
            Err(TopologyError::InvalidName { .. })
        ));
        let mut s = spec();
        s.b.namespace = s.a.namespace.clone();
        assert!(matches!(s.validate(), Err(TopologyError::SameName { .. })));
    }

    #[test]
    fn interface_addresses_parse_and_print() {
        let a: InterfaceAddr = "10.77.0.2/30".parse().unwrap();
        assert_eq!(a.network(), Ipv4Addr::new(10, 77, 0, 0));
        assert_eq!(a.to_string(), "10.77.0.2/30");
        assert!("10.77.0.2".parse::<InterfaceAddr>().is_err());
        assert!("10.77.0.2/33".parse::<InterfaceAddr>().is_err());
    }
}
