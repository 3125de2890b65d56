//! The async driver: moves packets from one TUN device through a [`EmulatedLink`] to the other.

use std::future::pending;
use std::io;
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tun_rs::AsyncDevice;

use crate::link::{EmulatedLink, LinkStats};

/// Largest packet read from a device; TUN reads truncate anything longer.
const READ_BUFFER: usize = 65_536;

/// Packets read back to back before the link's timers get a turn, so a flood in one
/// direction cannot starve deliveries.
const READ_BATCH: usize = 64;

/// What one direction did, at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DirectionReport {
    /// The link's counters.
    #[serde(flatten)]
    pub link: LinkStats,
    /// Packets the link delivered that the far device refused.
    pub write_errors: u64,
    /// Packets still queued or in flight when the run stopped, never delivered.
    pub abandoned: u64,
}

/// Why forwarding stopped before it was told to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// Reading the source device failed; it is gone or broken.
    #[error("reading tun device: {0}")]
    Read(#[source] io::Error),
}

/// Forwards every packet read from `from` through `link` to `to` until `stop` is cancelled.
///
/// Packets are stamped with the time they were read and written once the link hands them
/// out; the wait between is a Tokio timer, so a packet leaves no earlier than the link says
/// and usually within the timer's millisecond resolution after. A failed write is counted
/// and the packet dropped, as a real link would; a failed read ends forwarding.
///
/// # Examples
///
/// ```no_run
/// use switchyard_linkem::{EmulatedLink, Profile, Topology, TopologySpec, forward};
/// use tokio_util::sync::CancellationToken;
///
/// async fn emulate(
///     spec: TopologySpec,
///     stop: CancellationToken,
/// ) -> Result<(), Box<dyn std::error::Error>> {
///     let topology = Topology::create(spec)?;
///     let (a, b) = (topology.device_a(), topology.device_b());
///     let there = EmulatedLink::new(Profile::Lossy.config(), 1, 0)?;
///     let back = EmulatedLink::new(Profile::Lossy.config(), 1, 1)?;
///     let (there, back) =
///         tokio::join!(forward(a, b, there, &stop), forward(b, a, back, &stop));
///     println!("{:?} {:?}", there?, back?);
///     topology.teardown()?;
///     Ok(())
/// }
/// ```
pub async fn forward(
    from: &AsyncDevice,
    to: &AsyncDevice,
    mut link: EmulatedLink,
    stop: &CancellationToken,
) -> Result<DirectionReport, ForwardError> {
    let mut buf = vec![0u8; READ_BUFFER];
    let mut write_errors = 0u64;
    loop {
        let now = Instant::now();
        while let Some(packet) = link.poll_ready(now) {
            if let Err(error) = to.send(&packet).await {
                write_errors += 1;
                tracing::debug!(%error, "tun write failed; packet dropped");
            }
        }
        let deadline = link.next_deadline();
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            read = from.recv(&mut buf) => {
                let len = read.map_err(ForwardError::Read)?;
                link.offer(Bytes::copy_from_slice(&buf[..len]), Instant::now());
                for _ in 1..READ_BATCH {
                    match from.try_recv(&mut buf) {
                        Ok(len) => {
                            link.offer(Bytes::copy_from_slice(&buf[..len]), Instant::now());
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(ForwardError::Read(e)),
                    }
                }
            }
            () = sleep_until(deadline) => {}
        }
    }
    Ok(DirectionReport {
        link: link.stats().clone(),
        write_errors,
        abandoned: (link.queued() + link.in_flight()) as u64,
    })
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => pending().await,
    }
}
