//! Two network namespaces joined only through the emulator's two TUN devices.
//!
//! ```text
//!  netns A (sy-gw)           the emulator's process               netns B (sy-wk)
//!  lo                        (stays in its own netns)             lo
//!  tun A 10.77.0.1/30 <-fd A-> EmulatedLink A->B, EmulatedLink B->A <-fd B-> tun B 10.77.0.2/30
//! ```
//!
//! The emulator creates both TUN devices in its own namespace, moves each into its namespace
//! with `ip link set DEV netns NS`, and keeps the file descriptors: a TUN device keeps working
//! across the move, so one process holds both ends without entering either namespace. Each
//! namespace has only `lo` and its TUN device, with a route to the /30 through it, so traffic
//! between the two addresses can only cross the emulator and no other host is reachable.
//!
//! Teardown is tied to ownership: the devices are not persistent, so closing their file
//! descriptors deletes them, and [`Topology`]'s drop deletes the namespaces it created (only
//! those). A process killed with SIGKILL leaves the namespaces behind; [`remove_namespaces`]
//! (`linkem cleanup`) deletes them.

mod ip;
mod spec;

use std::io;
use std::net::Ipv4Addr;

use tun_rs::{AsyncDevice, DeviceBuilder};

use ip::Ip;
pub use spec::{InterfaceAddr, SideSpec, TopologySpec};

/// The two namespaces and the TUN device file descriptors that join them.
///
/// Dropping it closes the devices (deleting them), then deletes the namespaces.
pub struct Topology {
    // Field order is drop order: devices go before their namespaces.
    a: AsyncDevice,
    b: AsyncDevice,
    namespaces: Namespaces,
    spec: TopologySpec,
}

impl Topology {
    /// Creates both namespaces and devices and configures them; on any failure, removes what
    /// it had created. Must be called inside a Tokio runtime.
    pub fn create(spec: TopologySpec) -> Result<Self, TopologyError> {
        spec.validate()?;
        let ip = Ip::locate();
        let mut namespaces = Namespaces {
            ip: ip.clone(),
            created: Vec::new(),
        };
        for side in [&spec.a, &spec.b] {
            if Ip::namespace_exists(&side.namespace) {
                return Err(TopologyError::NamespaceExists {
                    name: side.namespace.clone(),
                });
            }
            ip.run(&["netns", "add", &side.namespace])?;
            namespaces.created.push(side.namespace.clone());
        }
        let a = create_device(&spec.a.device)?;
        let b = create_device(&spec.b.device)?;
        for side in [&spec.a, &spec.b] {
            configure_side(&ip, side, &spec)?;
        }
        tracing::info!(
            ns_a = %spec.a.namespace, addr_a = %spec.a.address,
            ns_b = %spec.b.namespace, addr_b = %spec.b.address,
            "topology up"
        );
        Ok(Self {
            a,
            b,
            namespaces,
            spec,
        })
    }

    /// The TUN device in namespace A.
    pub fn device_a(&self) -> &AsyncDevice {
        &self.a
    }

    /// The TUN device in namespace B.
    pub fn device_b(&self) -> &AsyncDevice {
        &self.b
    }

    /// What was created.
    pub fn spec(&self) -> &TopologySpec {
        &self.spec
    }

    /// Deletes the devices and namespaces now, reporting the first failure.
    pub fn teardown(self) -> Result<(), TopologyError> {
        let Self {
            a, b, namespaces, ..
        } = self;
        drop((a, b));
        namespaces.remove()
    }
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("spec", &self.spec)
            .field("namespaces", &self.namespaces)
            .finish_non_exhaustive()
    }
}

fn create_device(name: &str) -> Result<AsyncDevice, TopologyError> {
    // Left down until it is in its namespace: a device up in ours would start IPv6
    // autoconfiguration and queue its solicitations for the link.
    DeviceBuilder::new()
        .name(name)
        .enable(false)
        .build_async()
        .map_err(|source| TopologyError::Tun {
            device: name.to_owned(),
            source,
        })
}

fn configure_side(ip: &Ip, side: &SideSpec, spec: &TopologySpec) -> Result<(), TopologyError> {
    let ns = side.namespace.as_str();
    let dev = side.device.as_str();
    let mtu = spec.mtu.to_string();
    let qlen = spec.tx_queue_len.to_string();
    let addr = side.address.to_string();
    ip.run(&["link", "set", dev, "netns", ns])?;
    ip.run(&["-n", ns, "link", "set", "lo", "up"])?;
    // No IPv6 link-local address, so the kernel sends no solicitations of its own across
    // the link: only the traffic under test crosses it.
    ip.run(&["-n", ns, "link", "set", dev, "addrgenmode", "none"])?;
    ip.run(&["-n", ns, "addr", "add", &addr, "dev", dev])?;
    // Multicast off: no IGMP reports of the kernel's own cross the link either.
    ip.run(&[
        "-n",
        ns,
        "link",
        "set",
        dev,
        "multicast",
        "off",
        "mtu",
        &mtu,
        "txqueuelen",
        &qlen,
        "up",
    ])
}

/// Deletes the named namespaces that exist, as `linkem cleanup` does after a crash.
pub fn remove_namespaces(names: &[&str]) -> Result<(), TopologyError> {
    let ip = Ip::locate();
    let mut first_error = None;
    for name in names {
        if Ip::namespace_exists(name) {
            if let Err(e) = ip.run(&["netns", "del", name]) {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The namespaces this process created, deleted on drop.
#[derive(Debug)]
struct Namespaces {
    ip: Ip,
    created: Vec<String>,
}

impl Namespaces {
    fn remove(mut self) -> Result<(), TopologyError> {
        self.remove_created()
    }

    fn remove_created(&mut self) -> Result<(), TopologyError> {
        let mut first_error = None;
        for name in self.created.drain(..).rev() {
            match self.ip.run(&["netns", "del", &name]) {
                Ok(()) => tracing::info!(namespace = %name, "namespace deleted"),
                Err(e) => {
                    tracing::warn!(namespace = %name, error = %e, "could not delete namespace");
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Failures are already logged; a drop has no one to return them to.
        let _ = self.remove_created();
    }
}

/// Why the topology could not be built or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// An address that is not `a.b.c.d/len`.
    #[error("address {input:?}: expected an IPv4 address with prefix, e.g. 10.77.0.1/30")]
    InvalidAddress {
        /// The text given.
        input: String,
    },
    /// A name `ip` would refuse or misread.
    #[error("{what} name {name:?}: use 1-15 (device) or 1-64 (namespace) of [A-Za-z0-9_-.]")]
    InvalidName {
        /// `namespace` or `device`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// Both sides were given the same name.
    #[error("{what} name {name:?} is used for both sides")]
    SameName {
        /// `namespace` or `device`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// An address outside the private ranges.
    #[error("address {addr}: must be private (10/8, 172.16/12, 192.168/16)")]
    NotPrivate {
        /// The address given.
        addr: Ipv4Addr,
    },
    /// The two addresses are not two hosts of one subnet.
    #[error("addresses {a} and {b}: must be distinct hosts of one subnet of at most /30")]
    NotOneSubnet {
        /// Side A's address.
        a: InterfaceAddr,
        /// Side B's address.
        b: InterfaceAddr,
    },
    /// An MTU below the IPv4 minimum datagram size.
    #[error("mtu {mtu}: must be at least 576")]
    MtuTooSmall {
        /// The MTU given.
        mtu: u16,
    },
    /// The namespace exists already (another run, or a crash: see `linkem cleanup`).
    #[error("namespace {name:?} exists already; remove it with `linkem cleanup` if it is stale")]
    NamespaceExists {
        /// The namespace's name.
        name: String,
    },
    /// The TUN device could not be created.
    #[error("tun device {device:?}: {source}")]
    Tun {
        /// The device's name.
        device: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// `ip` could not be started.
    #[error("`{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// `ip` exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
}
