//! What each subcommand does; JSON lines on stdout, logs on stderr.

use std::error::Error;
use std::io::Write;

use serde_json::json;
use switchyard_linkem::{EmulatedLink, Topology, forward, probe, remove_namespaces};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cli::{CleanupArgs, EchoArgs, PingArgs, RunArgs, SendArgs, SinkArgs};

/// Errors at the binary's edge are only printed.
type Outcome = Result<(), Box<dyn Error>>;

/// The random stream of each direction, so they draw independently from one seed.
const STREAM_A_TO_B: u64 = 0;
const STREAM_B_TO_A: u64 = 1;

/// Builds the topology, forwards until a signal or `--duration`, then tears it down.
pub(crate) fn emulate(args: &RunArgs) -> Outcome {
    let config = args.link_config();
    config.validate_for_mtu(args.mtu)?;
    let spec = args.topology();
    spec.validate()?;
    let a_to_b = EmulatedLink::new(config.clone(), args.seed, STREAM_A_TO_B)?;
    let b_to_a = EmulatedLink::new(config.clone(), args.seed, STREAM_B_TO_A)?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let stop = CancellationToken::new();
        // Handlers go in before anything is created, so a signal during setup still ends
        // in teardown rather than in a process killed with namespaces left behind.
        watch_signals(&stop)?;
        if let Some(duration) = args.duration {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(duration).await;
                stop.cancel();
            });
        }
        let topology = Topology::create(spec)?;
        // The blackout schedule counts from the moment traffic can flow, the same for both ways.
        let origin = std::time::Instant::now();
        let (a_to_b, b_to_a) = (a_to_b.starting_at(origin), b_to_a.starting_at(origin));
        let spec = topology.spec();
        emit(&json!({
            "event": "ready",
            "profile": args.profile.name(),
            "seed": args.seed,
            "link": &config,
            "a": { "namespace": spec.a.namespace, "device": spec.a.device,
                   "address": spec.a.address.addr.to_string() },
            "b": { "namespace": spec.b.namespace, "device": spec.b.device,
                   "address": spec.b.address.addr.to_string() },
        }))?;
        let (a, b) = (topology.device_a(), topology.device_b());
        // Either direction failing stops the other, so teardown is never skipped.
        let (ab, ba) = tokio::join!(
            async {
                let report = forward(a, b, a_to_b, &stop).await;
                stop.cancel();
                report
            },
            async {
                let report = forward(b, a, b_to_a, &stop).await;
                stop.cancel();
                report
            },
        );
        let torn_down = topology.teardown();
        let (ab, ba) = (ab?, ba?);
        emit(&json!({ "event": "stopped", "a_to_b": ab, "b_to_a": ba }))?;
        torn_down?;
        Ok(())
    })
}

fn watch_signals(stop: &CancellationToken) -> Result<(), std::io::Error> {
    let mut signals = [
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
        signal(SignalKind::hangup())?,
    ];
    let stop = stop.clone();
    tokio::spawn(async move {
        let [int, term, hup] = &mut signals;
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        tracing::info!("signal received; stopping");
        stop.cancel();
    });
    Ok(())
}

/// `linkem cleanup`.
pub(crate) fn cleanup(args: &CleanupArgs) -> Outcome {
    remove_namespaces(&[&args.ns_a, &args.ns_b])?;
    Ok(())
}

/// `linkem udp-sink`.
pub(crate) fn udp_sink(args: &SinkArgs) -> Outcome {
    let options = probe::SinkOptions {
        bind: args.bind,
        expect: args.expect,
        idle: args.idle,
        limit: args.limit,
    };
    let report = probe::udp_sink(&options, announce_ready)?;
    emit(&json!({ "event": "done", "report": report }))
}

/// `linkem udp-send`.
pub(crate) fn udp_send(args: &SendArgs) -> Outcome {
    let report = probe::udp_send(&probe::SendOptions {
        to: args.to,
        count: args.count,
        size: args.size,
        per_second: args.pps,
    })?;
    emit(&json!({ "event": "done", "report": report }))
}

/// `linkem udp-echo`.
pub(crate) fn udp_echo(args: &EchoArgs) -> Outcome {
    let options = probe::EchoOptions {
        bind: args.bind,
        count: args.count,
        idle: args.idle,
        limit: args.limit,
    };
    let echoed = probe::udp_echo(&options, announce_ready)?;
    emit(&json!({ "event": "done", "report": { "echoed": echoed } }))
}

/// `linkem udp-ping`.
pub(crate) fn udp_ping(args: &PingArgs) -> Outcome {
    let report = probe::udp_ping(&probe::PingOptions {
        to: args.to,
        count: args.count,
        timeout: args.timeout,
        size: args.size,
    })?;
    emit(&json!({ "event": "done", "report": report }))
}

fn announce_ready(addr: std::net::SocketAddr) {
    // A reader waiting for this line would otherwise wait for the probe's time limit.
    if let Err(error) = emit(&json!({ "event": "ready", "addr": addr.to_string() })) {
        tracing::warn!(%error, "could not announce readiness");
    }
}

/// Writes one JSON line to stdout and flushes it, so a script reading the pipe sees it now.
fn emit(value: &serde_json::Value) -> Outcome {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}")?;
    out.flush()?;
    Ok(())
}
