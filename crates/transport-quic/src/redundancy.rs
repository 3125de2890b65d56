//! Redundancy for small frames: a task or result that fits one QUIC DATAGRAM (RFC 9221) is sent
//! on its lane as always and also as a datagram, so one lost packet costs nothing.
//!
//! The lane stays the reliable path: it carries every frame, in order, and its copy arrives
//! sooner or later. The datagram copy is a race against the lane's loss recovery; whichever
//! copy arrives first is used and the other is recognised and dropped. Both copies name the
//! lane and the task's number on it (`seq`: 1 for the lane's first task, plus one per task),
//! which is all the receiver needs:
//!
//! - the **worker** counts the tasks read on each lane; a task is started once, by the first
//!   copy to arrive, and the other copy (a lane frame whose number was already started, or a
//!   datagram whose number is not the lane's next) is dropped ([`LaneCopies`]);
//! - the **gateway** knows the task each lane holds; a result copy for the task its lane holds
//!   ends it, and the lane copy that follows is recognised by the lane's list of ended tasks
//!   whose lane copy is still due (bounded: see [`MAX_ECHOES`]).
//!
//! Both rules are plain data, bounded by the number of lanes, with no time window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use switchyard_proto::v1::QuicRedundancy;

/// Bytes of datagrams one connection buffers, received and not yet read, before quinn drops
/// the oldest: room for a few dozen copies, which are worthless once their lane copy arrived.
pub(crate) const DATAGRAM_RECEIVE_BUFFER: usize = 64 * 1024;

/// Bytes of datagrams one connection queues for sending before quinn drops the oldest.
pub(crate) const DATAGRAM_SEND_BUFFER: usize = 64 * 1024;

/// Results the gateway took from a datagram whose lane copy it has not read yet, per lane;
/// while a lane owes this many, its further datagram copies are ignored (the lane alone
/// carries its results until it catches up), so a lane whose stream is stuck cannot make
/// the list grow.
pub(crate) const MAX_ECHOES: usize = 16;

/// Time between a frame's lane copy and its datagram copy. quinn packs the frames queued at
/// one moment into one packet, and a packet lost takes every copy in it: spaced by a timer
/// tick, the two copies leave in different packets, so one loss cannot take both.
pub(crate) const COPY_SPACING: Duration = Duration::from_millis(5);

/// Whether small task and result frames also travel as QUIC datagrams
/// (`quic.redundancy`, negotiated at registration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Redundancy {
    /// Lanes only (the default).
    #[default]
    Off,
    /// A task or result that fits one datagram is also sent as a datagram; the first copy to
    /// arrive is used.
    Datagram,
}

impl Redundancy {
    /// True when datagrams must be enabled in the QUIC transport parameters.
    pub(crate) fn wants_datagrams(self) -> bool {
        self == Self::Datagram
    }

    /// The value on the wire.
    pub(crate) fn wire(self) -> QuicRedundancy {
        match self {
            Self::Off => QuicRedundancy::Off,
            Self::Datagram => QuicRedundancy::Datagram,
        }
    }

    /// The value a wire field names; unknown values read as `Off`.
    pub(crate) fn from_wire(value: i32) -> Self {
        match QuicRedundancy::try_from(value) {
            Ok(QuicRedundancy::Datagram) => Self::Datagram,
            _ => Self::Off,
        }
    }

    /// The redundancy a connection runs with: datagram copies only when the gateway is
    /// configured for them, the worker asked for them, and the peer's transport parameters
    /// accept datagrams. Anything else is `Off`.
    pub(crate) fn negotiate(gateway: Self, worker: Self, peer_accepts_datagrams: bool) -> Self {
        if gateway == Self::Datagram && worker == Self::Datagram && peer_accepts_datagrams {
            Self::Datagram
        } else {
            Self::Off
        }
    }
}

/// Counters of datagram copies, for one gateway listener or one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedundancyStats {
    /// Datagram copies sent.
    pub copies_sent: u64,
    /// Bytes of datagram payload sent (QUIC framing excluded).
    pub copy_bytes_sent: u64,
    /// Datagram copies that arrived first and were used.
    pub copies_used: u64,
    /// Datagram copies that arrived after their lane copy (or for a lane the receiver does not
    /// hold), dropped.
    pub copies_dropped: u64,
    /// Lane frames recognised as the second copy of a frame a datagram brought first, dropped.
    pub lane_copies_dropped: u64,
}

/// The shared, lock-free form of [`RedundancyStats`].
#[derive(Debug, Default)]
pub(crate) struct RedundancyCounters {
    copies_sent: AtomicU64,
    copy_bytes_sent: AtomicU64,
    copies_used: AtomicU64,
    copies_dropped: AtomicU64,
    lane_copies_dropped: AtomicU64,
    /// The same counts in the process's `metrics` recorder (the gateway's `/metrics`).
    exported: Option<Exported>,
}

/// Handles of the `/metrics` series, looked up once.
#[derive(Debug)]
struct Exported {
    sent: metrics::Counter,
    bytes: metrics::Counter,
    used: metrics::Counter,
    dropped: metrics::Counter,
    lane_copy_dropped: metrics::Counter,
}

impl RedundancyCounters {
    /// Counters that also feed [`QUIC_DATAGRAM_COPIES_TOTAL`](crate::metrics::QUIC_DATAGRAM_COPIES_TOTAL)
    /// (the gateway's listener; a worker keeps its counts to itself).
    pub(crate) fn exported() -> Self {
        use crate::metrics::{QUIC_DATAGRAM_COPY_BYTES_TOTAL, copies};
        Self {
            exported: Some(Exported {
                sent: copies("sent"),
                bytes: metrics::counter!(QUIC_DATAGRAM_COPY_BYTES_TOTAL),
                used: copies("used"),
                dropped: copies("dropped"),
                lane_copy_dropped: copies("lane_copy_dropped"),
            }),
            ..Self::default()
        }
    }

    pub(crate) fn snapshot(&self) -> RedundancyStats {
        RedundancyStats {
            copies_sent: self.copies_sent.load(Ordering::Relaxed),
            copy_bytes_sent: self.copy_bytes_sent.load(Ordering::Relaxed),
            copies_used: self.copies_used.load(Ordering::Relaxed),
            copies_dropped: self.copies_dropped.load(Ordering::Relaxed),
            lane_copies_dropped: self.lane_copies_dropped.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn used(&self) {
        self.copies_used.fetch_add(1, Ordering::Relaxed);
        if let Some(exported) = &self.exported {
            exported.used.increment(1);
        }
    }

    pub(crate) fn dropped(&self) {
        self.copies_dropped.fetch_add(1, Ordering::Relaxed);
        if let Some(exported) = &self.exported {
            exported.dropped.increment(1);
        }
    }

    pub(crate) fn lane_copy_dropped(&self) {
        self.lane_copies_dropped.fetch_add(1, Ordering::Relaxed);
        if let Some(exported) = &self.exported {
            exported.lane_copy_dropped.increment(1);
        }
    }

    /// Sends `message` as one datagram on `conn`, [`COPY_SPACING`] after its lane copy, when
    /// it fits the datagram size the path allows now; larger messages (and a connection
    /// without datagrams) go by lane alone.
    pub(crate) fn send_copy<M: Message>(self: &Arc<Self>, conn: &quinn::Connection, message: &M) {
        let len = message.encoded_len();
        if conn.max_datagram_size().is_none_or(|max| len > max) {
            return;
        }
        let payload = Bytes::from(message.encode_to_vec());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.send_now(conn, payload);
            return;
        };
        let (counters, conn) = (Arc::clone(self), conn.clone());
        runtime.spawn(async move {
            tokio::time::sleep(COPY_SPACING).await;
            counters.send_now(&conn, payload);
        });
    }

    fn send_now(&self, conn: &quinn::Connection, payload: Bytes) {
        let len = payload.len() as u64;
        // A refused copy (connection closing, datagrams turned off) leaves the lane copy.
        if conn.send_datagram(payload).is_ok() {
            self.copies_sent.fetch_add(1, Ordering::Relaxed);
            self.copy_bytes_sent.fetch_add(len, Ordering::Relaxed);
            if let Some(exported) = &self.exported {
                exported.sent.increment(1);
                exported.bytes.increment(len);
            }
        }
    }
}

/// What to do with one copy of a task on a worker's lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyVerdict {
    /// The first copy: start the task.
    Start,
    /// The task was already started by the other copy (or the datagram is stale): drop it.
    Drop,
}

/// The worker's de-duplication rule for one lane: which task numbers were started.
///
/// Tasks on a lane are numbered from 1 in the order the gateway sent them, and the gateway
/// sends task `n + 1` only after the worker's result (or cancel acknowledgement) for task
/// `n`, so the worker has started task `n` by then. A lane frame's number is its position
/// among the lane's task frames; a datagram carries its number. A copy starts its task when
/// its number is the next one (`started + 1`); every other copy is the second of a pair, or
/// a datagram delayed past its lane copy, and is dropped. A datagram that arrives while the
/// lane's task still runs is dropped too, whatever its number: the gateway cannot have sent
/// it yet, and the lane copy brings the task should it be real.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LaneCopies {
    /// Task frames read on the lane.
    read: u64,
    /// The highest task number started, by either copy.
    started: u64,
}

impl LaneCopies {
    /// A task frame arrived on the lane; returns its number and whether to start it.
    pub(crate) fn lane_task(&mut self) -> (u64, CopyVerdict) {
        self.read += 1;
        (self.read, self.take(self.read))
    }

    /// A datagram copy of task number `seq` arrived; `busy` while the lane's task still runs.
    pub(crate) fn datagram_task(&mut self, seq: u64, busy: bool) -> CopyVerdict {
        if busy {
            return CopyVerdict::Drop;
        }
        self.take(seq)
    }

    fn take(&mut self, seq: u64) -> CopyVerdict {
        if seq == self.started + 1 {
            self.started = seq;
            CopyVerdict::Start
        } else {
            CopyVerdict::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_task_starts_once_whichever_copy_arrives_first() {
        // Lane copy first, then its datagram.
        let mut lane = LaneCopies::default();
        assert_eq!(lane.lane_task(), (1, CopyVerdict::Start));
        assert_eq!(lane.datagram_task(1, false), CopyVerdict::Drop);
        // Datagram first, then its lane copy.
        assert_eq!(lane.datagram_task(2, false), CopyVerdict::Start);
        assert_eq!(lane.lane_task(), (2, CopyVerdict::Drop));
        // The datagram alone (its lane copy still lost), then the next task by datagram too,
        // then both lane copies late.
        assert_eq!(lane.datagram_task(3, false), CopyVerdict::Start);
        assert_eq!(lane.datagram_task(4, false), CopyVerdict::Start);
        assert_eq!(lane.lane_task(), (3, CopyVerdict::Drop));
        assert_eq!(lane.lane_task(), (4, CopyVerdict::Drop));
        // Control: the next task's lane copy is not mistaken for a duplicate.
        assert_eq!(lane.lane_task(), (5, CopyVerdict::Start));
    }

    #[test]
    fn a_stale_or_skipping_datagram_never_starts_a_task() {
        let mut lane = LaneCopies::default();
        assert_eq!(lane.lane_task(), (1, CopyVerdict::Start));
        assert_eq!(lane.lane_task(), (2, CopyVerdict::Start));
        // Task 1's datagram, delayed past two lane copies.
        assert_eq!(lane.datagram_task(1, false), CopyVerdict::Drop);
        // A number beyond the next would hide task 3's lane copy: refused.
        assert_eq!(lane.datagram_task(4, false), CopyVerdict::Drop);
        assert_eq!(lane.lane_task(), (3, CopyVerdict::Start));
        // Control: the next number is taken.
        assert_eq!(lane.datagram_task(4, false), CopyVerdict::Start);
    }

    #[test]
    fn a_datagram_for_a_lane_whose_task_still_runs_is_dropped() {
        let mut lane = LaneCopies::default();
        assert_eq!(lane.lane_task(), (1, CopyVerdict::Start));
        // Task 1 still runs: a copy numbered 2, the next number, is dropped all the same.
        assert_eq!(lane.datagram_task(2, true), CopyVerdict::Drop);
        // Control: once task 1 has ended, the same copy starts task 2, and its lane copy is
        // then the duplicate.
        assert_eq!(lane.datagram_task(2, false), CopyVerdict::Start);
        assert_eq!(lane.lane_task(), (2, CopyVerdict::Drop));
        // A copy dropped while busy leaves the lane copy to start its task.
        assert_eq!(lane.datagram_task(3, true), CopyVerdict::Drop);
        assert_eq!(lane.lane_task(), (3, CopyVerdict::Start));
    }

    #[test]
    fn datagrams_are_used_only_when_both_ends_and_the_transport_agree() {
        use Redundancy::{Datagram, Off};
        assert_eq!(Redundancy::negotiate(Datagram, Datagram, true), Datagram);
        assert_eq!(Redundancy::negotiate(Off, Datagram, true), Off);
        assert_eq!(Redundancy::negotiate(Datagram, Off, true), Off);
        assert_eq!(Redundancy::negotiate(Datagram, Datagram, false), Off);
    }

    #[test]
    fn unknown_wire_values_read_as_off() {
        assert_eq!(Redundancy::from_wire(1), Redundancy::Datagram);
        assert_eq!(Redundancy::from_wire(0), Redundancy::Off);
        assert_eq!(Redundancy::from_wire(7), Redundancy::Off);
        assert_eq!(
            Redundancy::from_wire(Redundancy::Datagram.wire().into()),
            Redundancy::Datagram
        );
    }
}
