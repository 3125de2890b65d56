//! `linkem`: a packet-level link emulator for constrained-link benchmarks.
//!
//! It joins two network namespaces through two TUN devices and forwards the IP packets
//! between them through a [`EmulatedLink`] per direction, which applies one-way delay, jitter, random
//! loss, a rate-limited, drop-tail bottleneck queue and scheduled blackouts. Acting on packets, it treats TCP and
//! UDP alike.
//!
//! The emulation itself ([`EmulatedLink`]) is plain data driven by the current time; the rest is
//! setup ([`Topology`]), a thin async driver ([`forward()`]) and small UDP probes ([`probe`])
//! that the tests and scripts run inside the namespaces.
#![forbid(unsafe_code)]

mod blackout;
mod config;
mod forward;
mod link;
pub mod probe;
mod profile;
mod topology;
mod units;

pub use blackout::{Blackout, BlackoutError};
pub use config::{ConfigError, DEFAULT_HOLD_LIMIT, DEFAULT_MTU, LinkConfig};
pub use forward::{DirectionReport, ForwardError, forward};
pub use link::{EmulatedLink, LinkStats, Verdict};
pub use profile::Profile;
pub use topology::{
    InterfaceAddr, SideSpec, Topology, TopologyError, TopologySpec, remove_namespaces,
};
pub use units::{Loss, Rate, UnitError, parse_duration};
