//! Liveness verdicts as plain data: fed pings, pongs, frames and the current time.
//!
//! A round costs what falls due in it, not the number of workers: each worker has one entry in
//! a schedule ordered by when it next needs a look (its next ping, or the end of its heartbeat
//! window if that comes first), every ping sent waits in one queue ordered by when it was sent
//! (so by when it expires), and the workers under an exclusion are kept apart. With 10,000 idle
//! workers a round visits the few due, not all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use tokio::time::Instant;

use super::LivenessConfig;
use crate::address::WorkerId;
use crate::eligibility::DispatchExclusion;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// Not yet proven (new): `answered` pings in a row so far.
    Probation { answered: u32 },
    /// Proven and answering.
    Healthy,
    /// Lost; `answered` pings in a row so far towards a fresh probation.
    Lost { answered: u32 },
}

impl Standing {
    fn exclusion(self) -> Option<DispatchExclusion> {
        match self {
            Standing::Healthy => None,
            Standing::Probation { .. } => Some(DispatchExclusion::OpeningProbation),
            Standing::Lost { .. } => Some(DispatchExclusion::ReachabilityLost),
        }
    }
}

#[derive(Debug)]
struct Probe {
    standing: Standing,
    /// Outstanding pings by sequence, with when they were sent.
    outstanding: BTreeMap<u64, Instant>,
    misses: u32,
    last_frame: Instant,
    /// When the next regular ping is due. Anchored to the schedule (advanced by the interval
    /// from the previous due time, not from when a round happened to run), so a round running
    /// a millisecond late never pushes a ping a whole round later.
    next_ping: Instant,
    /// This worker's key in [`LivenessTracker::schedule`].
    visit: Instant,
}

impl Probe {
    /// A miss during probation or recovery restarts it: no flapping back on one answer among
    /// misses.
    fn restart_progress(&mut self) {
        match &mut self.standing {
            Standing::Probation { answered } | Standing::Lost { answered } => *answered = 0,
            Standing::Healthy => {}
        }
    }

    /// When a round next has something to do for this worker: its next ping, or the end of
    /// its heartbeat window if the worker stays silent until then. A frame moves the window
    /// without touching the schedule; a visit that finds the window moved just reschedules.
    /// A window too long for the clock to reach its end never ends: the next ping is the visit.
    fn next_visit(&self, heartbeat_window: std::time::Duration) -> Instant {
        self.last_frame
            .checked_add(heartbeat_window)
            .map_or(self.next_ping, |end| self.next_ping.min(end))
    }
}

/// What one [`LivenessTracker::tick`] asks the driver to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TickActions {
    /// Pings to send now: worker and sequence.
    pub pings: Vec<(WorkerId, u64)>,
    /// Workers silent for the whole heartbeat window: deregister them as `Timeout`.
    pub timed_out: Vec<WorkerId>,
    /// Workers newly excluded this tick.
    pub newly_lost: Vec<WorkerId>,
}

/// Per-worker ping bookkeeping and the verdicts derived from it.
#[derive(Debug)]
pub struct LivenessTracker {
    config: LivenessConfig,
    probes: BTreeMap<WorkerId, Probe>,
    /// One entry per tracked worker: when it next needs a look (see [`Probe::next_visit`]).
    schedule: BTreeSet<(Instant, WorkerId)>,
    /// Every ping sent and not yet expired, in the order sent, which is the order they expire
    /// in. Answered pings stay until they would have expired and are skipped then.
    sent: VecDeque<(Instant, WorkerId, u64)>,
    /// The workers whose standing is not `Healthy`.
    excluded: BTreeSet<WorkerId>,
    next_seq: u64,
    /// Schedule entries and sent pings looked at by ticks so far.
    #[cfg(test)]
    visited: usize,
}

impl LivenessTracker {
    /// An empty tracker.
    pub fn new(config: LivenessConfig) -> Self {
        Self {
            config,
            probes: BTreeMap::new(),
            schedule: BTreeSet::new(),
            sent: VecDeque::new(),
            excluded: BTreeSet::new(),
            next_seq: 1,
            #[cfg(test)]
            visited: 0,
        }
    }

    /// Starts tracking a new worker on opening probation; returns the probation pings to send
    /// at once, back to back.
    pub fn add_worker(&mut self, worker: WorkerId, now: Instant) -> Vec<u64> {
        if self.probes.contains_key(&worker) {
            return Vec::new();
        }
        let next_ping = now + self.config.ping_interval;
        let mut probe = Probe {
            standing: Standing::Probation { answered: 0 },
            outstanding: BTreeMap::new(),
            misses: 0,
            last_frame: now,
            next_ping,
            visit: next_ping,
        };
        probe.visit = probe.next_visit(self.config.heartbeat_window);
        self.schedule.insert((probe.visit, worker));
        self.excluded.insert(worker);
        self.probes.insert(worker, probe);
        (0..self.config.probation_pings.max(1))
            .map(|_| self.ping(worker, now))
            .collect()
    }

    /// Stops tracking a worker.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        if let Some(probe) = self.probes.remove(&worker) {
            self.schedule.remove(&(probe.visit, worker));
            self.excluded.remove(&worker);
        }
    }

    /// Workers being tracked, in id order.
    pub fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.probes.keys().copied()
    }

    /// The newest (highest id) worker being tracked.
    pub fn newest(&self) -> Option<WorkerId> {
        self.probes.keys().next_back().copied()
    }

    fn ping(&mut self, worker: WorkerId, now: Instant) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(probe) = self.probes.get_mut(&worker) {
            probe.outstanding.insert(seq, now);
            self.sent.push_back((now, worker, seq));
        }
        seq
    }

    /// Any frame from the worker: it is not silent.
    pub fn record_frame(&mut self, worker: WorkerId, now: Instant) {
        if let Some(probe) = self.probes.get_mut(&worker) {
            probe.last_frame = now;
        }
    }

    /// An answer to ping `seq`. Returns true when the worker's exclusion changed (probation
    /// lifted or recovery completed), so the caller republishes verdicts. An answer to a ping
    /// never sent, already answered or already counted as missed changes nothing.
    ///
    /// Pings travel the worker's ordered task path, so an answer to `seq` while an older ping
    /// is still outstanding means the older one went unanswered: it counts as missed at once,
    /// and probation (or recovery) progress restarts from this answer.
    pub fn record_pong(&mut self, worker: WorkerId, seq: u64, now: Instant) -> bool {
        let needed = self.config.probation_pings.max(1);
        let Some(probe) = self.probes.get_mut(&worker) else {
            return false;
        };
        probe.last_frame = now;
        if probe.outstanding.remove(&seq).is_none() {
            return false;
        }
        let skipped = probe.outstanding.range(..seq).count();
        if skipped > 0 {
            probe.outstanding = probe.outstanding.split_off(&seq);
            probe.restart_progress();
        }
        probe.misses = 0;
        let (next, changed) = match probe.standing {
            Standing::Healthy => (Standing::Healthy, false),
            Standing::Probation { answered } if answered + 1 >= needed => (Standing::Healthy, true),
            Standing::Probation { answered } => (
                Standing::Probation {
                    answered: answered + 1,
                },
                false,
            ),
            Standing::Lost { answered } if answered + 1 >= needed => (Standing::Healthy, true),
            Standing::Lost { answered } => (
                Standing::Lost {
                    answered: answered + 1,
                },
                false,
            ),
        };
        probe.standing = next;
        if changed {
            self.excluded.remove(&worker);
        }
        changed
    }

    /// Expires overdue pings, decides who is lost or silent, and schedules the next pings.
    /// Visits only the pings that expire and the workers that fall due by `now`.
    pub fn tick(&mut self, now: Instant) -> TickActions {
        let mut actions = TickActions::default();
        self.expire(now, &mut actions);
        let window = self.config.heartbeat_window;
        let mut due = Vec::new();
        while let Some(&(at, worker)) = self.schedule.first() {
            if at > now {
                break;
            }
            self.schedule.pop_first();
            #[cfg(test)]
            {
                self.visited += 1;
            }
            let Some(probe) = self.probes.get_mut(&worker) else {
                continue;
            };
            if now.saturating_duration_since(probe.last_frame) >= window {
                actions.timed_out.push(worker);
                continue;
            }
            if now >= probe.next_ping {
                probe.next_ping += self.config.ping_interval;
                if probe.next_ping <= now {
                    // The prober stalled for more than an interval: resume the cadence from
                    // now rather than sending the missed pings in a burst.
                    probe.next_ping = now + self.config.ping_interval;
                }
                due.push(worker);
            }
            // Always after `now`: the next ping was just moved past it, and a worker not
            // timed out heard from within the window. So no worker is visited twice a round.
            probe.visit = probe.next_visit(window);
            self.schedule.insert((probe.visit, worker));
        }
        for worker in &actions.timed_out {
            self.probes.remove(worker);
            self.excluded.remove(worker);
        }
        for worker in due {
            let seq = self.ping(worker, now);
            actions.pings.push((worker, seq));
        }
        actions
    }

    /// Counts the pings sent at least `ping_timeout` before `now` and still unanswered as
    /// missed, and marks lost the workers that reach `miss_threshold` misses in a row.
    fn expire(&mut self, now: Instant, actions: &mut TickActions) {
        while let Some(&(sent, worker, seq)) = self.sent.front() {
            if now.saturating_duration_since(sent) < self.config.ping_timeout {
                break;
            }
            self.sent.pop_front();
            #[cfg(test)]
            {
                self.visited += 1;
            }
            let Some(probe) = self.probes.get_mut(&worker) else {
                continue;
            };
            if probe.outstanding.remove(&seq).is_none() {
                continue;
            }
            probe.misses += 1;
            probe.restart_progress();
            if probe.misses >= self.config.miss_threshold
                && !matches!(probe.standing, Standing::Lost { .. })
            {
                probe.standing = Standing::Lost { answered: 0 };
                self.excluded.insert(worker);
                actions.newly_lost.push(worker);
            }
        }
    }

    /// The earliest time a worker needs a round (a ping falls due or a heartbeat window may
    /// end), so the driver can run one exactly then. Expiries wait for the next round.
    pub fn next_ping_due(&self) -> Option<Instant> {
        self.schedule.first().map(|(at, _)| *at)
    }

    /// The exclusion `worker` stands under now (`None` when healthy or untracked).
    pub fn exclusion(&self, worker: WorkerId) -> Option<DispatchExclusion> {
        self.probes.get(&worker)?.standing.exclusion()
    }

    /// The whole exclusion map, for [`crate::Registry::publish_verdicts`]; costs the number
    /// of excluded workers, not of tracked ones.
    pub fn exclusions(&self) -> HashMap<WorkerId, DispatchExclusion> {
        self.excluded
            .iter()
            .filter_map(|id| Some((*id, self.exclusion(*id)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> LivenessConfig {
        LivenessConfig {
            ping_interval: Duration::from_secs(1),
            ping_timeout: Duration::from_secs(3),
            probation_pings: 2,
            miss_threshold: 3,
            heartbeat_window: Duration::from_secs(10),
        }
    }

    fn w(n: u64) -> WorkerId {
        WorkerId::from_raw(n)
    }

    #[test]
    fn probation_lifts_after_n_answers_sent_back_to_back() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        let pings = tracker.add_worker(w(1), t0);
        assert_eq!(pings.len(), 2, "both probation pings go out at once");
        assert_eq!(
            tracker.exclusions().get(&w(1)),
            Some(&DispatchExclusion::OpeningProbation)
        );
        assert!(!tracker.record_pong(w(1), pings[0], t0));
        assert_eq!(
            tracker.exclusions().get(&w(1)),
            Some(&DispatchExclusion::OpeningProbation)
        );
        assert!(tracker.record_pong(w(1), pings[1], t0));
        assert!(tracker.exclusions().is_empty());
    }

    #[test]
    fn unknown_sequences_change_nothing() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        let pings = tracker.add_worker(w(1), t0);
        assert!(!tracker.record_pong(w(1), 999, t0));
        assert!(!tracker.record_pong(w(1), 999, t0));
        assert!(!tracker.record_pong(w(1), pings[0], t0));
        assert!(
            !tracker.record_pong(w(1), pings[0], t0),
            "a duplicate pong is not a second answer"
        );
        assert_eq!(
            tracker.exclusions().get(&w(1)),
            Some(&DispatchExclusion::OpeningProbation)
        );
    }

    fn healthy(tracker: &mut LivenessTracker, worker: WorkerId, now: Instant) {
        for seq in tracker.add_worker(worker, now) {
            tracker.record_pong(worker, seq, now);
        }
        assert!(tracker.exclusions().is_empty());
    }

    #[test]
    fn k_misses_mark_lost_and_recovery_needs_full_probation() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        healthy(&mut tracker, w(1), t0);
        let mut now = t0;
        let mut sent = Vec::new();
        // Ticks send pings that go unanswered; frames keep arriving so it is not silent.
        for _ in 0..6 {
            now += Duration::from_secs(1);
            tracker.record_frame(w(1), now);
            let actions = tracker.tick(now);
            sent.extend(actions.pings.iter().map(|(_, s)| *s));
            if !actions.newly_lost.is_empty() {
                break;
            }
        }
        assert_eq!(
            tracker.exclusions().get(&w(1)),
            Some(&DispatchExclusion::ReachabilityLost)
        );
        // One answer among misses does not restore it.
        now += Duration::from_secs(1);
        let actions = tracker.tick(now);
        let (_, seq) = actions.pings[0];
        assert!(!tracker.record_pong(w(1), seq, now));
        assert_eq!(
            tracker.exclusions().get(&w(1)),
            Some(&DispatchExclusion::ReachabilityLost)
        );
        // A miss in between resets the count; two fresh answers in a row restore it.
        now += Duration::from_secs(1);
        tracker.record_frame(w(1), now);
        let _unanswered = tracker.tick(now).pings[0];
        now += Duration::from_secs(1);
        let (_, a) = tracker.tick(now).pings[0];
        assert!(
            !tracker.record_pong(w(1), a, now),
            "answer, miss, answer is not two in a row"
        );
        now += Duration::from_secs(1);
        let actions = tracker.tick(now);
        let (_, b) = actions.pings[0];
        assert!(tracker.record_pong(w(1), b, now));
        assert!(tracker.exclusions().is_empty());
    }

    #[test]
    fn an_answer_after_a_skipped_ping_restarts_probation() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        let probation = tracker.add_worker(w(1), t0);
        // The first probation ping goes unanswered, the second is answered.
        assert!(!tracker.record_pong(w(1), probation[1], t0));
        assert_eq!(
            tracker.exclusion(w(1)),
            Some(DispatchExclusion::OpeningProbation)
        );
        assert!(
            !tracker.record_pong(w(1), probation[0], t0),
            "the skipped ping already counted as missed"
        );
        let now = t0 + Duration::from_secs(1);
        let (_, next) = tracker.tick(now).pings[0];
        assert!(
            tracker.record_pong(w(1), next, now),
            "control: two answers in a row lift probation"
        );
        assert_eq!(tracker.exclusion(w(1)), None);
    }

    #[test]
    fn a_loss_and_a_recovery_are_each_reported_once() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        healthy(&mut tracker, w(1), t0);
        let mut reported = 0;
        let mut now = t0;
        let mut pings = Vec::new();
        for _ in 0..20 {
            now += Duration::from_secs(1);
            tracker.record_frame(w(1), now);
            let actions = tracker.tick(now);
            reported += actions.newly_lost.len();
            pings.extend(actions.pings.into_iter().map(|(_, seq)| seq));
        }
        assert_eq!(
            tracker.exclusion(w(1)),
            Some(DispatchExclusion::ReachabilityLost)
        );
        assert_eq!(reported, 1, "twenty rounds lost, one report");
        let mut recoveries = 0;
        for _ in 0..4 {
            now += Duration::from_secs(1);
            tracker.record_frame(w(1), now);
            for (_, seq) in tracker.tick(now).pings {
                recoveries += usize::from(tracker.record_pong(w(1), seq, now));
            }
        }
        assert_eq!(recoveries, 1);
        assert_eq!(tracker.exclusion(w(1)), None);
    }

    #[test]
    fn silence_for_the_window_times_out_but_frames_prevent_it() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        healthy(&mut tracker, w(1), t0);
        healthy(&mut tracker, w(2), t0);
        let mut now = t0;
        let mut timed_out = Vec::new();
        for _ in 0..10 {
            now += Duration::from_secs(1);
            tracker.record_frame(w(2), now);
            timed_out.extend(tracker.tick(now).timed_out);
        }
        assert_eq!(timed_out, vec![w(1)]);
        assert_eq!(tracker.workers().collect::<Vec<_>>(), vec![w(2)]);
    }

    #[test]
    fn a_round_running_late_keeps_the_ping_cadence_anchored_to_the_interval() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        healthy(&mut tracker, w(1), t0);
        let late = Duration::from_micros(300);
        // The first regular ping is due at t0 + 1 s; the round runs a little late.
        let first = tracker.tick(t0 + Duration::from_secs(1) + late);
        assert_eq!(first.pings.len(), 1);
        for (_, seq) in first.pings {
            tracker.record_pong(w(1), seq, t0 + Duration::from_secs(1) + late);
        }
        // The next round runs on time, a hair under an interval after the late one: the ping
        // is due by the schedule (t0 + 2 s), not a whole interval after the late send.
        let second = tracker.tick(t0 + Duration::from_secs(2));
        assert_eq!(second.pings.len(), 1, "due at t0 + 2 s, sent at t0 + 2 s");
        assert_eq!(
            tracker.next_ping_due(),
            Some(t0 + Duration::from_secs(3)),
            "the schedule stays on whole intervals from registration"
        );
        // Control: nothing is due before the schedule says so.
        assert!(
            tracker
                .tick(t0 + Duration::from_millis(2999))
                .pings
                .is_empty()
        );
    }

    #[test]
    fn a_stalled_prober_resumes_the_cadence_without_a_burst() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        healthy(&mut tracker, w(1), t0);
        let resumed = t0 + Duration::from_millis(4500);
        assert_eq!(tracker.tick(resumed).pings.len(), 1, "one ping, not four");
        assert_eq!(
            tracker.next_ping_due(),
            Some(resumed + Duration::from_secs(1))
        );
        assert!(tracker.tick(resumed).pings.is_empty());
    }

    #[test]
    fn a_round_visits_the_workers_due_not_every_worker() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        // 1,000 proven workers registered 1 ms apart: their pings fall due 1 ms apart.
        for n in 1..=1000 {
            let at = t0 + Duration::from_millis(n);
            for seq in tracker.add_worker(w(n), at) {
                tracker.record_pong(w(n), seq, at);
            }
        }
        assert!(tracker.exclusions().is_empty());
        let start = tracker.visited;
        let round = tracker.tick(t0 + Duration::from_millis(1003));
        assert_eq!(
            round.pings.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![w(1), w(2), w(3)],
            "exactly the workers whose interval ended"
        );
        assert!(
            tracker.visited - start <= 3,
            "a round looked at {} entries for 3 due",
            tracker.visited - start
        );
        // Control: a round when every worker is due visits and pings every one.
        let start = tracker.visited;
        let all = tracker.tick(t0 + Duration::from_millis(2000));
        assert_eq!(all.pings.len(), 997);
        assert!(tracker.visited - start >= 997);
    }

    #[test]
    fn answered_pings_are_not_counted_as_missed_when_their_time_comes() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config());
        healthy(&mut tracker, w(1), t0);
        healthy(&mut tracker, w(2), t0);
        let mut now = t0;
        // w(1) answers every ping; w(2) answers none (but sends frames, so it is not silent).
        for _ in 0..8 {
            now += Duration::from_secs(1);
            tracker.record_frame(w(2), now);
            for (worker, seq) in tracker.tick(now).pings {
                if worker == w(1) {
                    tracker.record_pong(worker, seq, now);
                }
            }
        }
        assert_eq!(
            tracker.exclusion(w(1)),
            None,
            "answered pings expire harmlessly"
        );
        assert_eq!(
            tracker.exclusion(w(2)),
            Some(DispatchExclusion::ReachabilityLost),
            "control: the unanswered ones count"
        );
        assert_eq!(
            tracker.exclusions().keys().copied().collect::<Vec<_>>(),
            vec![w(2)]
        );
    }

    #[test]
    fn a_frame_during_the_window_moves_the_timeout_without_an_extra_ping() {
        let mut config = config();
        config.ping_interval = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config);
        healthy(&mut tracker, w(1), t0);
        healthy(&mut tracker, w(2), t0);
        tracker.record_frame(w(2), t0 + Duration::from_secs(5));
        assert_eq!(tracker.next_ping_due(), Some(t0 + Duration::from_secs(10)));
        let first = tracker.tick(t0 + Duration::from_secs(10));
        assert_eq!(first.timed_out, vec![w(1)], "silent for the window");
        assert!(first.pings.is_empty(), "a window check sends no ping");
        assert_eq!(
            tracker.next_ping_due(),
            Some(t0 + Duration::from_secs(15)),
            "w(2)'s window runs from its last frame"
        );
        assert!(
            tracker
                .tick(t0 + Duration::from_millis(14_999))
                .timed_out
                .is_empty()
        );
        assert_eq!(
            tracker.tick(t0 + Duration::from_secs(15)).timed_out,
            vec![w(2)],
            "control: silent for the window since its frame"
        );
        assert_eq!(tracker.workers().count(), 0);
        assert_eq!(tracker.next_ping_due(), None);
    }

    #[test]
    fn a_heartbeat_window_past_the_clocks_end_schedules_pings_and_never_times_out() {
        let mut config = config();
        config.heartbeat_window = Duration::MAX;
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(config);
        healthy(&mut tracker, w(1), t0);
        assert_eq!(tracker.next_ping_due(), Some(t0 + Duration::from_secs(1)));
        let round = tracker.tick(t0 + Duration::from_secs(1));
        assert_eq!(round.pings.len(), 1, "pinged on its interval");
        assert!(round.timed_out.is_empty());
        // Control: with an ordinary window the same silent worker times out.
        let mut tracker = LivenessTracker::new(self::config());
        healthy(&mut tracker, w(1), t0);
        let round = tracker.tick(t0 + Duration::from_secs(10));
        assert_eq!(round.timed_out, vec![w(1)]);
    }
}
