//! Command-line arguments.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use switchyard_linkem::{
    Blackout, DEFAULT_HOLD_LIMIT, DEFAULT_MTU, InterfaceAddr, LinkConfig, Loss, Profile, Rate,
    SideSpec, TopologySpec, UnitError, parse_duration,
};

const ABOUT: &str = "Packet-level link emulator: joins two network namespaces through two TUN \
devices and forwards IP packets between them with delay, jitter, loss and a rate-limited \
drop-tail queue";

const LONG_ABOUT: &str = "Packet-level link emulator: joins two network namespaces through two \
TUN devices and forwards IP packets between them with one-way delay, jitter, random loss and a \
rate-limited, drop-tail bottleneck queue. It acts on IP packets, so TCP and UDP cross the same \
link.

It creates namespaces A and B (default sy-gw and sy-wk), each holding only `lo` and one TUN \
device addressed 10.77.0.1/30 (A) or 10.77.0.2/30 (B), prints one JSON line \
{\"event\":\"ready\",...} on stdout once traffic can flow, and forwards until SIGINT, SIGTERM, \
SIGHUP or --duration. It then prints {\"event\":\"stopped\",...} with each direction's \
counters and deletes the devices and namespaces (also on error). Run programs on either side \
with `ip netns exec sy-gw ...` / `ip netns exec sy-wk ...`. Needs root and /dev/net/tun.

A profile sets every impairment; each flag given overrides its part. Impairments apply \
independently to each direction: --delay is one-way (RTT = 2 x delay) and --loss is per \
direction.";

const AFTER_HELP: &str = "Profiles (per direction; RTT = 2 x one-way delay):
  lan           no delay, no loss, no rate limit
  wan           20 ms one-way (40 ms RTT), 0.1% loss, 50 Mbit/s, 200-packet queue
  lossy         50 ms one-way (100 ms RTT), 2% loss, 10 Mbit/s, 100-packet queue
  cellular-bad  150 ms one-way (300 ms RTT), 5% loss, 1 Mbit/s, 50-packet queue
All profiles: no jitter, burst = MTU (1500 bytes), hold limit 16384 packets.

Examples:
  linkem --profile lossy
  linkem --profile wan --loss 1% --jitter 5ms --seed 7 --duration 120s
  linkem --profile cellular-bad --blackout-at 20s --blackout-for 3s --blackout-every 20s
  linkem cleanup            # after a run killed with SIGKILL";

/// `linkem`.
#[derive(Debug, Parser)]
#[command(
    name = "linkem",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// Subcommands besides running the emulator.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Delete the namespaces a killed run left behind (those that exist).
    Cleanup(CleanupArgs),
    /// Count numbered UDP datagrams (test probe).
    #[command(hide = true)]
    UdpSink(SinkArgs),
    /// Send numbered UDP datagrams at a steady rate (test probe).
    #[command(hide = true)]
    UdpSend(SendArgs),
    /// Echo UDP datagrams (test probe).
    #[command(hide = true)]
    UdpEcho(EchoArgs),
    /// Time UDP echoes one at a time (test probe).
    #[command(hide = true)]
    UdpPing(PingArgs),
}

/// Running the emulator.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Link profile: the impairments any other flag overrides.
    #[arg(long, value_enum, default_value = "lan")]
    pub(crate) profile: Profile,
    /// One-way delay, e.g. 20ms (RTT is twice this).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) delay: Option<Duration>,
    /// Jitter: each packet's delay is drawn uniformly from delay ± jitter, e.g. 5ms.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) jitter: Option<Duration>,
    /// Let jitter reorder packets (by default a packet never overtakes an earlier one).
    #[arg(long)]
    pub(crate) reorder: bool,
    /// Random loss per direction, in percent, e.g. 2 or 2%.
    #[arg(long)]
    pub(crate) loss: Option<Loss>,
    /// Bottleneck rate, e.g. 10mbit, 500kbit, 1gbit, or `unlimited`.
    #[arg(long, value_parser = parse_rate_limit)]
    pub(crate) rate: Option<RateLimit>,
    /// Token-bucket depth in bytes: most bytes sent back to back at line rate (>= MTU).
    #[arg(long, value_name = "BYTES")]
    pub(crate) burst: Option<u32>,
    /// Bottleneck queue size in packets; arrivals at a full queue are dropped (drop-tail).
    #[arg(long, value_name = "PACKETS")]
    pub(crate) queue: Option<usize>,
    /// Most packets one direction holds at once (queue plus in flight); a memory bound.
    #[arg(long, value_name = "PACKETS", default_value_t = DEFAULT_HOLD_LIMIT)]
    pub(crate) hold_limit: usize,
    /// Start of the first blackout after the link is ready, e.g. 20s (with --blackout-for).
    #[arg(long, value_parser = parse_duration, requires = "blackout_for")]
    pub(crate) blackout_at: Option<Duration>,
    /// Length of each blackout, e.g. 3s: everything is dropped, both ways (needs --blackout-at).
    #[arg(long, value_parser = parse_duration, requires = "blackout_at")]
    pub(crate) blackout_for: Option<Duration>,
    /// Repeat the blackout this long after each start, e.g. 20s (default: once).
    #[arg(long, value_parser = parse_duration, requires = "blackout_for")]
    pub(crate) blackout_every: Option<Duration>,
    /// Seed of the random loss and jitter; the same seed and traffic give the same drops.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Stop by itself after this long, e.g. 300s (default: run until a signal).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Namespace of side A (created by linkem; must not exist).
    #[arg(long, default_value = "sy-gw")]
    pub(crate) ns_a: String,
    /// Namespace of side B (created by linkem; must not exist).
    #[arg(long, default_value = "sy-wk")]
    pub(crate) ns_b: String,
    /// TUN device name of side A (at most 15 characters).
    #[arg(long, default_value = "lkgw0")]
    pub(crate) dev_a: String,
    /// TUN device name of side B (at most 15 characters).
    #[arg(long, default_value = "lkwk0")]
    pub(crate) dev_b: String,
    /// Address of side A with prefix (private range, /30 or narrower subnet shared with B).
    #[arg(long, default_value = "10.77.0.1/30")]
    pub(crate) addr_a: InterfaceAddr,
    /// Address of side B with prefix.
    #[arg(long, default_value = "10.77.0.2/30")]
    pub(crate) addr_b: InterfaceAddr,
    /// MTU of both TUN devices in bytes.
    #[arg(long, default_value_t = DEFAULT_MTU)]
    pub(crate) mtu: u16,
    /// Transmit queue length of both TUN devices in packets (the kernel's, before linkem).
    #[arg(long, default_value_t = 1000)]
    pub(crate) txqueuelen: u32,
}

/// A rate limit, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateLimit {
    Unlimited,
    Limited(Rate),
}

fn parse_rate_limit(input: &str) -> Result<RateLimit, UnitError> {
    if matches!(input.trim(), "unlimited" | "none") {
        return Ok(RateLimit::Unlimited);
    }
    input.parse().map(RateLimit::Limited)
}

impl RunArgs {
    /// The profile's impairments with the given flags applied over them.
    pub(crate) fn link_config(&self) -> LinkConfig {
        let mut config = self.profile.config();
        if let Some(delay) = self.delay {
            config.delay = delay;
        }
        if let Some(jitter) = self.jitter {
            config.jitter = jitter;
        }
        if let Some(loss) = self.loss {
            config.loss = loss;
        }
        match self.rate {
            Some(RateLimit::Unlimited) => config.rate = None,
            Some(RateLimit::Limited(rate)) => config.rate = Some(rate),
            None => {}
        }
        config.burst = self.burst.unwrap_or(u32::from(self.mtu));
        if let Some(queue) = self.queue {
            config.queue_limit = queue;
        }
        config.hold_limit = self.hold_limit;
        config.reorder = self.reorder;
        if let (Some(at), Some(duration)) = (self.blackout_at, self.blackout_for) {
            config.blackout = Some(Blackout {
                at,
                duration,
                every: self.blackout_every,
            });
        }
        config
    }

    /// The namespaces, devices and addresses to create.
    pub(crate) fn topology(&self) -> TopologySpec {
        TopologySpec {
            a: SideSpec {
                namespace: self.ns_a.clone(),
                device: self.dev_a.clone(),
                address: self.addr_a,
            },
            b: SideSpec {
                namespace: self.ns_b.clone(),
                device: self.dev_b.clone(),
                address: self.addr_b,
            },
            mtu: self.mtu,
            tx_queue_len: self.txqueuelen,
        }
    }
}

/// `linkem cleanup`.
#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// Namespace of side A.
    #[arg(long, default_value = "sy-gw")]
    pub(crate) ns_a: String,
    /// Namespace of side B.
    #[arg(long, default_value = "sy-wk")]
    pub(crate) ns_b: String,
}

/// `linkem udp-sink`.
#[derive(Debug, Args)]
pub(crate) struct SinkArgs {
    /// Address to receive on.
    #[arg(long)]
    pub(crate) bind: SocketAddr,
    /// Stop once datagrams 0..N have all arrived.
    #[arg(long)]
    pub(crate) expect: u64,
    /// Stop this long after the last datagram.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) idle: Duration,
    /// Stop after this long in any case.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) limit: Duration,
}

/// `linkem udp-send`.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// Destination address.
    #[arg(long)]
    pub(crate) to: SocketAddr,
    /// Datagrams to send.
    #[arg(long)]
    pub(crate) count: u64,
    /// Datagram size in bytes.
    #[arg(long, default_value_t = 64)]
    pub(crate) size: usize,
    /// Datagrams per second.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) pps: u32,
}

/// `linkem udp-echo`.
#[derive(Debug, Args)]
pub(crate) struct EchoArgs {
    /// Address to serve on.
    #[arg(long)]
    pub(crate) bind: SocketAddr,
    /// Stop after echoing this many datagrams.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) count: u64,
    /// Stop this long after the last datagram.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub(crate) idle: Duration,
    /// Stop after this long in any case.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) limit: Duration,
}

/// `linkem udp-ping`.
#[derive(Debug, Args)]
pub(crate) struct PingArgs {
    /// The echo server's address.
    #[arg(long)]
    pub(crate) to: SocketAddr,
    /// Pings to send, one at a time.
    #[arg(long, default_value_t = 10)]
    pub(crate) count: u32,
    /// How long to wait for each reply.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) timeout: Duration,
    /// Datagram size in bytes.
    #[arg(long, default_value_t = 64)]
    pub(crate) size: usize,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn run_args(args: &[&str]) -> RunArgs {
        let cli =
            Cli::try_parse_from(std::iter::once("linkem").chain(args.iter().copied())).unwrap();
        assert!(cli.command.is_none());
        cli.run
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_override_the_profile_one_by_one() {
        let lossy = run_args(&["--profile", "lossy"]).link_config();
        assert_eq!(lossy, Profile::Lossy.config());
        let tuned = run_args(&["--profile", "lossy", "--loss", "7%", "--jitter", "3ms"]);
        let config = tuned.link_config();
        assert_eq!(config.loss, Loss::from_percent(7.0).unwrap());
        assert_eq!(config.jitter, Duration::from_millis(3));
        assert_eq!(config.delay, lossy.delay);
        assert_eq!(config.rate, lossy.rate);
        let unlimited = run_args(&["--profile", "wan", "--rate", "unlimited"]).link_config();
        assert_eq!(unlimited.rate, None);
    }

    #[test]
    fn blackout_flags_schedule_a_blackout_and_need_each_other() {
        let blip = run_args(&[
            "--profile",
            "cellular-bad",
            "--blackout-at",
            "20s",
            "--blackout-for",
            "3s",
            "--blackout-every",
            "20s",
        ])
        .link_config();
        assert_eq!(
            blip.blackout,
            Some(Blackout {
                at: Duration::from_secs(20),
                duration: Duration::from_secs(3),
                every: Some(Duration::from_secs(20)),
            })
        );
        assert_eq!(blip.delay, Profile::CellularBad.config().delay);
        // Control: no flag, no blackout; a length without a start is refused.
        assert_eq!(
            run_args(&["--profile", "cellular-bad"])
                .link_config()
                .blackout,
            None
        );
        let alone = Cli::try_parse_from(["linkem", "--blackout-for", "3s"]);
        assert!(alone.is_err());
    }

    #[test]
    fn the_default_layout_is_the_documented_one() {
        let spec = run_args(&[]).topology();
        assert_eq!(spec.a.namespace, "sy-gw");
        assert_eq!(spec.b.namespace, "sy-wk");
        assert_eq!(spec.a.address.to_string(), "10.77.0.1/30");
        assert_eq!(spec.b.address.to_string(), "10.77.0.2/30");
        assert!(spec.validate().is_ok());
    }

    #[test]
    fn run_flags_and_subcommands_do_not_mix() {
        let mixed = Cli::try_parse_from(["linkem", "--profile", "wan", "cleanup"]);
        assert!(mixed.is_err());
    }
}
