//! One direction of the emulated link as a plain data structure driven by `now`.

mod token_bucket;
mod wire;

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::blackout::Blackout;
use crate::config::{ConfigError, LinkConfig};
use token_bucket::TokenBucket;
use wire::Wire;

/// One direction of the link: loss, a drop-tail bottleneck queue drained by a token bucket,
/// then a delay line.
///
/// It does no I/O and reads no clock: [`EmulatedLink::offer`] takes a packet that arrived at `now`,
/// [`EmulatedLink::poll_ready`] hands out the packets due by `now`, and [`EmulatedLink::next_deadline`] says
/// when to poll next. Departure and delivery times come from the model, not from when the
/// caller happens to poll, so a late poll delays delivery but never changes the link's
/// timing for later packets. Random choices come from a ChaCha8 generator seeded by the
/// caller, so the same seed, stream and arrivals give the same drops and delays.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
///
/// use bytes::Bytes;
/// use switchyard_linkem::{EmulatedLink, LinkConfig, Verdict};
///
/// let config = LinkConfig { delay: Duration::from_millis(20), ..LinkConfig::unimpaired() };
/// let mut link = EmulatedLink::new(config, 7, 0)?;
/// let t0 = Instant::now();
/// assert_eq!(link.offer(Bytes::from_static(b"ping"), t0), Verdict::Accepted);
/// assert_eq!(link.poll_ready(t0), None);
/// let due = link.next_deadline().unwrap();
/// assert_eq!(due, t0 + Duration::from_millis(20));
/// assert_eq!(link.poll_ready(due), Some(Bytes::from_static(b"ping")));
/// # Ok::<(), switchyard_linkem::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct EmulatedLink {
    loss: f64,
    queue_limit: usize,
    hold_limit: usize,
    rng: ChaCha8Rng,
    queue: VecDeque<Queued>,
    bucket: Option<TokenBucket>,
    wire: Wire,
    blackout: Option<Blackout>,
    /// Time zero of the blackout schedule: set by [`EmulatedLink::starting_at`], else the first
    /// instant the link sees.
    origin: Option<Instant>,
    stats: LinkStats,
}

/// What happened to an offered packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Queued for the bottleneck; it will be delivered.
    Accepted,
    /// Dropped by random loss.
    Lost,
    /// Dropped because the bottleneck queue was full (drop-tail).
    QueueFull,
    /// Dropped because the direction already holds its limit of packets.
    HoldLimit,
    /// Dropped because it is larger than the token bucket and could never leave.
    Oversize,
    /// Dropped because the link is in a scheduled blackout.
    Blackout,
}

/// Counters of one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Packets offered.
    pub offered: u64,
    /// Packets accepted for delivery.
    pub accepted: u64,
    /// Packets dropped by random loss.
    pub lost: u64,
    /// Packets dropped at a full bottleneck queue.
    pub queue_full: u64,
    /// Packets dropped at the hold limit.
    pub hold_limit: u64,
    /// Packets dropped as larger than the token bucket.
    pub oversize: u64,
    /// Packets dropped by a blackout: arriving while dark, or due for delivery while dark.
    pub blackout: u64,
    /// Packets handed out by [`EmulatedLink::poll_ready`].
    pub delivered: u64,
    /// Bytes handed out by [`EmulatedLink::poll_ready`].
    pub delivered_bytes: u64,
    /// Most packets ever waiting in the bottleneck queue at once.
    pub peak_queue: usize,
}

#[derive(Debug)]
struct Queued {
    packet: Bytes,
    arrived: Instant,
}

impl EmulatedLink {
    /// A link with `config`, drawing random choices from `seed` and `stream` (use one stream
    /// per direction so the two directions draw independently).
    pub fn new(config: LinkConfig, seed: u64, stream: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Ok(Self {
            loss: config.loss.probability(),
            queue_limit: config.queue_limit,
            hold_limit: config.hold_limit,
            rng,
            queue: VecDeque::new(),
            bucket: config.rate.map(|rate| TokenBucket::new(rate, config.burst)),
            wire: Wire::new(config.delay, config.jitter, config.reorder),
            blackout: config.blackout,
            origin: None,
            stats: LinkStats::default(),
        })
    }

    /// Starts the blackout schedule's clock at `origin` (give both directions the same one).
    pub fn starting_at(mut self, origin: Instant) -> Self {
        self.origin = Some(origin);
        self
    }

    /// True when a scheduled blackout covers `at`.
    pub fn is_dark(&mut self, at: Instant) -> bool {
        let Some(blackout) = self.blackout else {
            return false;
        };
        let origin = *self.origin.get_or_insert(at);
        blackout.is_dark(at.saturating_duration_since(origin))
    }

    /// Offers a packet that arrived at `now`; the verdict is also counted in [`Self::stats`].
    pub fn offer(&mut self, packet: Bytes, now: Instant) -> Verdict {
        self.advance(now);
        self.stats.offered += 1;
        let verdict = if self.is_dark(now) {
            Verdict::Blackout
        } else {
            self.judge(&packet)
        };
        match verdict {
            Verdict::Accepted => {
                self.stats.accepted += 1;
                self.queue.push_back(Queued {
                    packet,
                    arrived: now,
                });
                self.stats.peak_queue = self.stats.peak_queue.max(self.queue.len());
                self.advance(now);
            }
            Verdict::Lost => self.stats.lost += 1,
            Verdict::QueueFull => self.stats.queue_full += 1,
            Verdict::HoldLimit => self.stats.hold_limit += 1,
            Verdict::Oversize => self.stats.oversize += 1,
            Verdict::Blackout => self.stats.blackout += 1,
        }
        verdict
    }

    /// The next packet due for delivery at or before `now`, in delivery order. Packets due
    /// while the link is dark are dropped instead.
    pub fn poll_ready(&mut self, now: Instant) -> Option<Bytes> {
        self.advance(now);
        loop {
            let due = self.wire.next_due()?;
            let packet = self.wire.pop_due(now)?;
            if self.is_dark(due) {
                self.stats.blackout += 1;
                continue;
            }
            self.stats.delivered += 1;
            self.stats.delivered_bytes += packet.len() as u64;
            return Some(packet);
        }
    }

    /// When [`Self::poll_ready`] next has something to do: a packet leaves the queue or
    /// reaches the far end. `None` while the link is empty.
    pub fn next_deadline(&self) -> Option<Instant> {
        let leaves = self.queue.front().map(|head| self.departure(head));
        match (leaves, self.wire.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Packets waiting in the bottleneck queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Packets past the bottleneck and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.wire.len()
    }

    /// Counters since creation.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    fn judge(&mut self, packet: &Bytes) -> Verdict {
        if self.bucket.as_ref().is_some_and(|b| !b.fits(packet.len())) {
            return Verdict::Oversize;
        }
        if self.loss > 0.0 && self.rng.random::<f64>() < self.loss {
            return Verdict::Lost;
        }
        if self.queue.len() >= self.queue_limit {
            return Verdict::QueueFull;
        }
        if self.queue.len() + self.wire.len() >= self.hold_limit {
            return Verdict::HoldLimit;
        }
        Verdict::Accepted
    }

    /// Moves every packet whose departure from the bottleneck is due by `now` onto the wire,
    /// at its model departure time.
    fn advance(&mut self, now: Instant) {
        while let Some(head) = self.queue.front() {
            let departs = self.departure(head);
            if departs > now {
                break;
            }
            let Some(Queued { packet, .. }) = self.queue.pop_front() else {
                break;
            };
            if let Some(bucket) = &mut self.bucket {
                bucket.take(packet.len(), departs);
            }
            self.wire.launch(packet, departs, &mut self.rng);
        }
    }

    fn departure(&self, head: &Queued) -> Instant {
        match &self.bucket {
            Some(bucket) => bucket.departure(head.packet.len(), head.arrived),
            None => head.arrived,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::units::{Loss, Rate};

    const MS: Duration = Duration::from_millis(1);

    /// A packet of `len` bytes whose first 4 bytes carry `seq`.
    fn packet(seq: u32, len: usize) -> Bytes {
        let mut bytes = vec![0u8; len.max(4)];
        bytes[..4].copy_from_slice(&seq.to_be_bytes());
        Bytes::from(bytes)
    }

    fn seq_of(packet: &Bytes) -> u32 {
        u32::from_be_bytes([packet[0], packet[1], packet[2], packet[3]])
    }

    /// Delivers everything still held, polling exactly at each deadline, and returns each
    /// packet with its delivery time.
    fn drain(link: &mut EmulatedLink) -> Vec<(Instant, Bytes)> {
        let mut out = Vec::new();
        for _ in 0..1_000_000 {
            let Some(at) = link.next_deadline() else {
                return out;
            };
            while let Some(p) = link.poll_ready(at) {
                out.push((at, p));
            }
        }
        panic!("link never emptied");
    }

    fn config(f: impl FnOnce(&mut LinkConfig)) -> LinkConfig {
        let mut c = LinkConfig::unimpaired();
        f(&mut c);
        c
    }

    /// `k` standard deviations of a binomial(n, p) count.
    fn binomial_tolerance(n: u64, p: f64, k: f64) -> f64 {
        k * (n as f64 * p * (1.0 - p)).sqrt()
    }

    #[test]
    fn loss_rate_is_within_binomial_tolerance_over_10000_packets() {
        const N: u64 = 10_000;
        for (percent, seed) in [(0.1, 1), (2.0, 2), (5.0, 3), (50.0, 4)] {
            let loss = Loss::from_percent(percent).unwrap();
            let mut link = EmulatedLink::new(config(|c| c.loss = loss), seed, 0).unwrap();
            let t0 = Instant::now();
            for i in 0..N {
                link.offer(packet(i as u32, 100), t0 + MS * i as u32);
            }
            let expected = N as f64 * loss.probability();
            let lost = link.stats().lost as f64;
            let tolerance = binomial_tolerance(N, loss.probability(), 4.0).max(3.0);
            assert!(
                (lost - expected).abs() <= tolerance,
                "{percent}%: lost {lost}, expected {expected} ± {tolerance}"
            );
            assert_eq!(drain(&mut link).len() as u64, N - link.stats().lost);
        }
    }

    #[test]
    fn a_blackout_drops_what_arrives_and_what_is_due_while_dark_and_nothing_else() {
        use crate::blackout::Blackout;
        let blackout = Blackout {
            at: 100 * MS,
            duration: 50 * MS,
            every: Some(200 * MS),
        };
        let t0 = Instant::now();
        let mut link = EmulatedLink::new(
            config(|c| {
                c.delay = 10 * MS;
                c.blackout = Some(blackout);
            }),
            1,
            0,
        )
        .unwrap()
        .starting_at(t0);
        // One packet every millisecond for 400 ms, delivered 10 ms later.
        let mut delivered = Vec::new();
        for i in 0..400u32 {
            let now = t0 + MS * i;
            while let Some(p) = link.poll_ready(now) {
                delivered.push((now, seq_of(&p)));
            }
            let verdict = link.offer(packet(i, 64), now);
            let dark = (100..150).contains(&i) || (300..350).contains(&i);
            assert_eq!(verdict == Verdict::Blackout, dark, "packet {i} at {i} ms");
        }
        delivered.extend(drain(&mut link).into_iter().map(|(at, p)| (at, seq_of(&p))));
        // Packets sent in 90..100 ms were due in 100..110 ms, inside the blackout: lost too.
        let lost: Vec<u32> = (0..400)
            .filter(|i| !delivered.iter().any(|(_, seq)| seq == i))
            .collect();
        let expected: Vec<u32> = (90..150).chain(290..350).collect();
        assert_eq!(lost, expected);
        assert_eq!(link.stats().blackout, expected.len() as u64);
        assert!(
            delivered.iter().all(|(at, _)| !blackout.is_dark(*at - t0)),
            "nothing is delivered while dark"
        );
        // Control: the same traffic without a blackout loses nothing.
        let mut clear = EmulatedLink::new(config(|c| c.delay = 10 * MS), 1, 0).unwrap();
        for i in 0..400u32 {
            assert_eq!(clear.offer(packet(i, 64), t0 + MS * i), Verdict::Accepted);
        }
        assert_eq!(drain(&mut clear).len(), 400);
    }

    #[test]
    fn zero_loss_drops_nothing_and_full_loss_drops_everything() {
        let t0 = Instant::now();
        let mut clean = EmulatedLink::new(LinkConfig::unimpaired(), 1, 0).unwrap();
        let everything = Loss::from_percent(100.0).unwrap();
        let mut dead = EmulatedLink::new(config(|c| c.loss = everything), 1, 0).unwrap();
        for i in 0..1000 {
            assert_eq!(clean.offer(packet(i, 64), t0), Verdict::Accepted);
            assert_eq!(dead.offer(packet(i, 64), t0), Verdict::Lost);
        }
        assert_eq!(drain(&mut clean).len(), 1000);
        assert_eq!(drain(&mut dead).len(), 0);
    }

    #[test]
    fn the_same_seed_drops_the_same_packets_and_another_seed_does_not() {
        let loss = Loss::from_percent(10.0).unwrap();
        let verdicts = |seed, stream| {
            let mut link = EmulatedLink::new(config(|c| c.loss = loss), seed, stream).unwrap();
            let t0 = Instant::now();
            (0..1000)
                .map(|i| link.offer(packet(i, 64), t0))
                .collect::<Vec<_>>()
        };
        assert_eq!(verdicts(42, 0), verdicts(42, 0));
        assert_ne!(verdicts(42, 0), verdicts(43, 0));
        assert_ne!(verdicts(42, 0), verdicts(42, 1));
    }

    #[test]
    fn every_delay_stays_within_delay_plus_or_minus_jitter() {
        let delay = 20 * MS;
        let jitter = 5 * MS;
        for reorder in [false, true] {
            let mut link = EmulatedLink::new(
                config(|c| {
                    c.delay = delay;
                    c.jitter = jitter;
                    c.reorder = reorder;
                }),
                9,
                0,
            )
            .unwrap();
            let t0 = Instant::now();
            let sent: Vec<Instant> = (0..2000u32)
                .map(|i| t0 + Duration::from_micros(i as u64 * 250))
                .collect();
            let mut delays = Vec::new();
            for (i, at) in sent.iter().enumerate() {
                // Deliver what is due before each arrival, as a driver would.
                while let Some(due) = link.next_deadline().filter(|d| d <= at) {
                    while let Some(p) = link.poll_ready(due) {
                        delays.push(due - sent[seq_of(&p) as usize]);
                    }
                }
                assert_eq!(link.offer(packet(i as u32, 100), *at), Verdict::Accepted);
            }
            for (due, p) in drain(&mut link) {
                delays.push(due - sent[seq_of(&p) as usize]);
            }
            assert_eq!(delays.len(), sent.len());
            let min = *delays.iter().min().unwrap();
            let max = *delays.iter().max().unwrap();
            assert!(
                min >= delay - jitter,
                "reorder {reorder}: min delay {min:?}"
            );
            assert!(
                max <= delay + jitter,
                "reorder {reorder}: max delay {max:?}"
            );
            // Control: the jitter is really applied, spreading delays over most of the range.
            assert!(
                max - min >= jitter,
                "reorder {reorder}: spread {:?}",
                max - min
            );
        }
    }

    #[test]
    fn zero_jitter_delivers_exactly_after_the_delay() {
        let delay = 50 * MS;
        let mut link = EmulatedLink::new(config(|c| c.delay = delay), 1, 0).unwrap();
        let t0 = Instant::now();
        for i in 0..100u32 {
            link.offer(packet(i, 100), t0 + MS * i);
        }
        for (due, p) in drain(&mut link) {
            assert_eq!(due, t0 + MS * seq_of(&p) + delay);
        }
    }

    #[test]
    fn packets_keep_their_order_without_jitter_or_without_reorder() {
        let t0 = Instant::now();
        let rate = Rate::mbit(10);
        let cases = [
            config(|c| {
                c.delay = 10 * MS;
                c.rate = rate;
                c.burst = 3000;
            }),
            config(|c| {
                c.delay = 10 * MS;
                c.jitter = 8 * MS;
            }),
        ];
        for cfg in cases {
            let mut link = EmulatedLink::new(cfg.clone(), 5, 0).unwrap();
            for i in 0..500u32 {
                let len = 40 + (i as usize * 37) % 1400;
                let at = t0 + Duration::from_micros(u64::from(i) * 300);
                assert_eq!(link.offer(packet(i, len), at), Verdict::Accepted, "{cfg:?}");
            }
            let order: Vec<u32> = drain(&mut link).iter().map(|(_, p)| seq_of(p)).collect();
            assert_eq!(order, (0..500).collect::<Vec<_>>(), "{cfg:?}");
        }
    }

    #[test]
    fn jitter_with_reorder_allowed_does_reorder() {
        let t0 = Instant::now();
        let cfg = config(|c| {
            c.delay = 10 * MS;
            c.jitter = 8 * MS;
            c.reorder = true;
        });
        let mut link = EmulatedLink::new(cfg, 5, 0).unwrap();
        for i in 0..500u32 {
            link.offer(
                packet(i, 100),
                t0 + Duration::from_micros(u64::from(i) * 300),
            );
        }
        let order: Vec<u32> = drain(&mut link).iter().map(|(_, p)| seq_of(p)).collect();
        assert_eq!(order.len(), 500);
        assert!(
            order.windows(2).any(|w| w[0] > w[1]),
            "no packet overtook another"
        );
    }

    #[test]
    fn bytes_released_in_any_window_never_exceed_rate_plus_one_burst() {
        let bits_per_sec = 8_000_000; // 1,000,000 bytes per second.
        let burst = 3000u32;
        let cfg = config(|c| {
            c.rate = Rate::from_bits_per_sec(bits_per_sec);
            c.burst = burst;
            c.queue_limit = 100_000;
            c.hold_limit = 100_000;
        });
        let mut link = EmulatedLink::new(cfg, 1, 0).unwrap();
        let t0 = Instant::now();
        // Offered at twice the rate for 0.5 s, twice, with an idle gap that refills the bucket.
        let mut releases: Vec<(Instant, usize)> = Vec::new();
        let mut offered_bytes = 0usize;
        for round in 0..2u32 {
            let start = t0 + Duration::from_secs(2) * round;
            for i in 0..1000u32 {
                let at = start + Duration::from_micros(u64::from(i) * 500);
                while let Some(due) = link.next_deadline().filter(|d| *d <= at) {
                    while let Some(p) = link.poll_ready(due) {
                        releases.push((due, p.len()));
                    }
                }
                let len = 500 + (i as usize * 211) % 1000;
                offered_bytes += len;
                assert_eq!(link.offer(packet(i, len), at), Verdict::Accepted);
            }
        }
        releases.extend(drain(&mut link).iter().map(|(t, p)| (*t, p.len())));
        let bytes_per_sec = bits_per_sec as u128 / 8;
        for (i, (start, _)) in releases.iter().enumerate() {
            let mut bytes = 0u128;
            for (end, len) in &releases[i..] {
                bytes += *len as u128;
                let window = (*end - *start).as_nanos();
                let allowed = bytes_per_sec * window / 1_000_000_000 + u128::from(burst);
                assert!(bytes <= allowed, "{bytes} bytes in {window} ns");
            }
        }
        // Control: nothing is lost, and while backlogged (the first 0.9 s, offered at twice
        // the rate) the limiter passes the full rate, not less.
        let total: usize = releases.iter().map(|(_, len)| len).sum();
        assert_eq!(total, offered_bytes);
        let backlogged = Duration::from_millis(900);
        let passed: usize = releases
            .iter()
            .filter(|(t, _)| *t <= t0 + backlogged)
            .map(|(_, len)| len)
            .sum();
        let achieved = passed as f64 / backlogged.as_secs_f64();
        assert!(
            achieved > 0.99 * bytes_per_sec as f64,
            "achieved {achieved} B/s"
        );
    }

    #[test]
    fn a_full_queue_drops_tail_then_accepts_again_once_drained() {
        let cfg = config(|c| {
            c.rate = Rate::mbit(1);
            c.burst = 1500;
            c.queue_limit = 10;
        });
        let mut link = EmulatedLink::new(cfg, 1, 0).unwrap();
        let t0 = Instant::now();
        let verdicts: Vec<Verdict> = (0..30).map(|i| link.offer(packet(i, 1000), t0)).collect();
        // The first packet leaves at once on the full bucket; ten wait; the rest are dropped.
        assert_eq!(verdicts[..11], [Verdict::Accepted; 11]);
        assert_eq!(verdicts[11..], [Verdict::QueueFull; 19]);
        assert_eq!(link.stats().queue_full, 19);
        assert_eq!(link.stats().peak_queue, 10);
        let delivered: Vec<u32> = drain(&mut link).iter().map(|(_, p)| seq_of(p)).collect();
        assert_eq!(delivered, (0..11).collect::<Vec<_>>());
        let later = t0 + Duration::from_secs(1);
        assert_eq!(link.offer(packet(99, 1000), later), Verdict::Accepted);
    }

    #[test]
    fn the_hold_limit_bounds_packets_in_flight() {
        let cfg = config(|c| {
            c.delay = Duration::from_secs(1);
            c.queue_limit = 5;
            c.hold_limit = 5;
        });
        let mut link = EmulatedLink::new(cfg, 1, 0).unwrap();
        let t0 = Instant::now();
        let verdicts: Vec<Verdict> = (0..10).map(|i| link.offer(packet(i, 100), t0)).collect();
        assert_eq!(verdicts[..5], [Verdict::Accepted; 5]);
        assert_eq!(verdicts[5..], [Verdict::HoldLimit; 5]);
        assert_eq!(link.in_flight(), 5);
        assert_eq!(drain(&mut link).len(), 5);
        assert_eq!(
            link.offer(packet(10, 100), t0 + Duration::from_secs(1)),
            Verdict::Accepted
        );
    }

    #[test]
    fn a_packet_larger_than_the_bucket_is_dropped_as_oversize() {
        let cfg = config(|c| {
            c.rate = Rate::mbit(1);
            c.burst = 1500;
        });
        let mut link = EmulatedLink::new(cfg, 1, 0).unwrap();
        let t0 = Instant::now();
        assert_eq!(link.offer(packet(0, 1501), t0), Verdict::Oversize);
        assert_eq!(link.offer(packet(1, 1500), t0), Verdict::Accepted);
        assert_eq!(link.stats().oversize, 1);
    }

    #[test]
    fn a_late_poll_does_not_shift_the_schedule_of_later_packets() {
        let cfg = config(|c| {
            c.rate = Rate::from_bits_per_sec(8_000); // 1,000 bytes per second.
            c.burst = 1000;
            c.delay = 10 * MS;
        });
        let mut link = EmulatedLink::new(cfg, 1, 0).unwrap();
        let t0 = Instant::now();
        for i in 0..4 {
            link.offer(packet(i, 1000), t0);
        }
        // Polled late, well after the first two were due.
        let late = t0 + Duration::from_millis(1500);
        assert_eq!(std::iter::from_fn(|| link.poll_ready(late)).count(), 2);
        let times: Vec<Instant> = drain(&mut link).iter().map(|(t, _)| *t).collect();
        assert_eq!(times, [2, 3].map(|s| t0 + Duration::from_secs(s) + 10 * MS));
    }
}
