//! The propagation delay line: packets that left the bottleneck and are not yet delivered.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::Rng;

/// Packets in flight, each delivered `delay ± jitter` after it left the bottleneck.
///
/// Without `reorder`, a packet is never delivered before the one launched ahead of it: its
/// due time is raised to its predecessor's. Because launches come in time order, that keeps
/// every delay within `delay ± jitter`.
#[derive(Debug)]
pub(crate) struct Wire {
    delay: Duration,
    jitter_ns: u64,
    reorder: bool,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    last_due: Option<Instant>,
    /// Launch order, which breaks ties between equal due times.
    next_seq: u64,
}

impl Wire {
    pub(crate) fn new(delay: Duration, jitter: Duration, reorder: bool) -> Self {
        Self {
            delay,
            jitter_ns: u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX),
            reorder,
            in_flight: BinaryHeap::new(),
            last_due: None,
            next_seq: 0,
        }
    }

    /// Puts `packet`, which left the bottleneck at `departed`, on the wire.
    pub(crate) fn launch(&mut self, packet: Bytes, departed: Instant, rng: &mut impl Rng) {
        let mut due = self.due_time(departed, rng);
        if !self.reorder {
            if let Some(last) = self.last_due {
                due = due.max(last);
            }
        }
        self.last_due = Some(due);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.push(Reverse(InFlight { due, seq, packet }));
    }

    /// When the next packet is due, if any is in flight.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse(p)| p.due)
    }

    /// The next packet due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Bytes> {
        if self.next_due()? > now {
            return None;
        }
        self.in_flight.pop().map(|Reverse(p)| p.packet)
    }

    /// Packets in flight.
    pub(crate) fn len(&self) -> usize {
        self.in_flight.len()
    }

    fn due_time(&self, departed: Instant, rng: &mut impl Rng) -> Instant {
        let base = departed.checked_add(self.delay).unwrap_or(departed);
        if self.jitter_ns == 0 {
            return base;
        }
        let offset = rng.random_range(0..=self.jitter_ns.saturating_mul(2));
        let (later, by) = if offset >= self.jitter_ns {
            (true, offset - self.jitter_ns)
        } else {
            (false, self.jitter_ns - offset)
        };
        let by = Duration::from_nanos(by);
        let due = if later {
            base.checked_add(by)
        } else {
            base.checked_sub(by)
        };
        // A jitter wider than the delay must not deliver a packet before it left.
        due.unwrap_or(base).max(departed)
    }
}

#[derive(Debug)]
struct InFlight {
    due: Instant,
    seq: u64,
    packet: Bytes,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn equal_due_times_deliver_in_launch_order() {
        let t0 = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut wire = Wire::new(Duration::from_millis(5), Duration::ZERO, false);
        for i in 0..10u8 {
            wire.launch(Bytes::from(vec![i]), t0, &mut rng);
        }
        let due = t0 + Duration::from_millis(5);
        assert_eq!(wire.pop_due(due - Duration::from_nanos(1)), None);
        let order: Vec<u8> = std::iter::from_fn(|| wire.pop_due(due))
            .map(|p| p[0])
            .collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn jitter_wider_than_the_delay_never_delivers_before_departure() {
        let t0 = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut wire = Wire::new(Duration::from_millis(1), Duration::from_millis(10), true);
        for _ in 0..1000 {
            wire.launch(Bytes::new(), t0, &mut rng);
        }
        assert!(wire.next_due().unwrap() >= t0);
        assert_eq!(wire.len(), 1000);
    }
}
