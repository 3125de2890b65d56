//! The lanes of one worker connection as plain data: which are idle, which task each holds.
//!
//! A lane is a long-lived bidirectional stream the gateway opened toward the worker. It
//! carries at most one task at a time, so a loss on one lane delays only that lane's task,
//! and it is reused for the next task instead of opening a stream per task. The table hands a
//! task to an idle lane, finds the lane of a task to cancel, rotates pings over every lane,
//! and retires lanes when the worker shrinks its capacity (idle lanes at once, busy ones as
//! they finish). It does no I/O: each lane is reached through a [`LaneSink`].
//!
//! With datagram redundancy, a result may arrive twice: first as a datagram copy
//! ([`LaneTable::finish_copy`]), then on its lane. The table remembers, per lane, the results
//! taken from a datagram whose lane copy is still due, and [`LaneTable::finish`] recognises
//! that copy as a duplicate, even after the lane was retired.

use std::collections::VecDeque;

use bytes::Bytes;
use switchyard_core::{DeliveryError, IdMap, TaskId};

use crate::redundancy::MAX_ECHOES;

/// Where a lane's outgoing frames are queued; must never wait.
pub(crate) trait LaneSink {
    /// Queues one encoded frame on the lane.
    fn push(&self, frame: Bytes) -> Result<(), DeliveryError>;
}

/// Names a lane by the index of its QUIC stream among the gateway-opened bidirectional
/// streams (stream id `4 * index + 1`), which the worker sees too; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LaneId(u64);

impl LaneId {
    pub(crate) fn new(stream_index: u64) -> Self {
        Self(stream_index)
    }

    /// The index of the lane's stream, as datagram copies name it.
    pub(crate) fn index(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for LaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lane {}", self.0)
    }
}

/// The frame that ended a lane's task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A result.
    Result,
    /// An acknowledgement of a cancel.
    CancelAck,
}

/// What ending a lane's task changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Finished {
    /// The lane was above the target and is retired (its sink dropped).
    pub(crate) retired: bool,
    /// A drain is under way and this was the last task held.
    pub(crate) drain_complete: bool,
    /// The frame was the lane copy of a result a datagram already brought: nothing changed,
    /// and core must not hear of it again.
    pub(crate) duplicate: bool,
}

/// Why an ending frame does not match what its lane holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FinishError {
    /// The lane holds another task, or none.
    #[error("{lane} holds {}, not task {task}", held.map_or_else(|| "no task".to_owned(), |t| format!("task {t}")))]
    NotHeld {
        /// The lane the frame came on.
        lane: LaneId,
        /// The task quoted.
        task: TaskId,
        /// The task the lane holds.
        held: Option<TaskId>,
    },
    /// A cancel acknowledgement for a task that was never cancelled.
    #[error("task {task} was not cancelled")]
    NotCancelled {
        /// The task quoted.
        task: TaskId,
    },
}

struct Lane<S> {
    sink: S,
    task: Option<TaskId>,
    cancelled: bool,
    /// Tasks assigned on this lane so far: the number of the last one.
    seq: u64,
    /// Results taken from a datagram whose lane copy has not been read yet, oldest first.
    echoes: VecDeque<TaskId>,
}

/// The lane bookkeeping of one connection.
pub(crate) struct LaneTable<S> {
    lanes: IdMap<LaneId, Lane<S>>,
    /// Every lane in opening order, for ping rotation.
    order: Vec<LaneId>,
    idle: Vec<LaneId>,
    by_task: IdMap<TaskId, LaneId>,
    /// The echoes of retired lanes, until their lane copies are read or the reader ends.
    retired_echoes: IdMap<LaneId, VecDeque<TaskId>>,
    target: usize,
    ping_cursor: usize,
    draining: bool,
    closed: bool,
}

impl<S: LaneSink> LaneTable<S> {
    /// An empty table wanting `target` lanes.
    pub(crate) fn new(target: u32) -> Self {
        Self {
            lanes: IdMap::default(),
            order: Vec::new(),
            idle: Vec::new(),
            by_task: IdMap::default(),
            retired_echoes: IdMap::default(),
            target: target as usize,
            ping_cursor: 0,
            draining: false,
            closed: false,
        }
    }

    /// Lanes open (idle or busy).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Tasks held.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.by_task.len()
    }

    /// True while `lane` is open (not retired).
    pub(crate) fn contains(&self, lane: LaneId) -> bool {
        self.lanes.contains_key(&lane)
    }

    /// Adds a freshly opened lane, idle.
    pub(crate) fn add(&mut self, id: LaneId, sink: S) {
        self.lanes.insert(
            id,
            Lane {
                sink,
                task: None,
                cancelled: false,
                seq: 0,
                echoes: VecDeque::new(),
            },
        );
        self.order.push(id);
        self.idle.push(id);
    }

    /// Sets how many lanes are wanted; idle lanes above it are retired at once. Returns how
    /// many lanes must be opened to reach it.
    ///
    /// The lanes kept are the `target` lowest-numbered ones; every lane above them is retired,
    /// idle ones now and busy ones when their task ends ([`LaneTable::finish`]).
    pub(crate) fn set_target(&mut self, target: u32) -> usize {
        self.target = target as usize;
        let above: Vec<LaneId> = self.order.iter().skip(self.target).copied().collect();
        for lane in above {
            if self.idle.contains(&lane) {
                self.retire(lane);
            }
        }
        self.target.saturating_sub(self.lanes.len())
    }

    /// True when `lane` is above the wanted lanes: `target` or more lanes have lower numbers.
    fn is_above_target(&self, lane: LaneId) -> bool {
        // Nothing is above the target while there are no more lanes than wanted (every finish
        // under steady load), so the scan is left for a shrink.
        if self.order.len() <= self.target {
            return false;
        }
        self.order
            .iter()
            .position(|id| *id == lane)
            .is_some_and(|rank| rank >= self.target)
    }

    /// Queues `frame` (a task) on an idle lane, which then holds `task`.
    pub(crate) fn assign(&mut self, task: TaskId, frame: Bytes) -> Result<LaneId, DeliveryError> {
        if self.closed {
            return Err(DeliveryError::Closed);
        }
        // Core never reserves more slots than lanes were opened for, so an idle lane exists
        // whenever a task is delivered; `Full` only guards a broken invariant.
        let lane_id = self.idle.pop().ok_or(DeliveryError::Full)?;
        let Some(lane) = self.lanes.get_mut(&lane_id) else {
            return Err(DeliveryError::Full);
        };
        if let Err(error) = lane.sink.push(frame) {
            self.idle.push(lane_id);
            return Err(error);
        }
        lane.task = Some(task);
        lane.cancelled = false;
        lane.seq += 1;
        self.by_task.insert(task, lane_id);
        Ok(lane_id)
    }

    /// The number of the last task assigned on `lane` (1 for its first), 0 for none.
    pub(crate) fn task_seq(&self, lane: LaneId) -> u64 {
        self.lanes.get(&lane).map_or(0, |lane| lane.seq)
    }

    /// Queues `frame` (a ping) on the next lane in rotation that has room.
    pub(crate) fn ping(&mut self, frame: Bytes) -> Result<LaneId, DeliveryError> {
        if self.closed {
            return Err(DeliveryError::Closed);
        }
        let count = self.order.len();
        let mut last_error = DeliveryError::Full;
        for step in 0..count {
            let lane_id = self.order[(self.ping_cursor + step) % count];
            let Some(lane) = self.lanes.get(&lane_id) else {
                continue;
            };
            match lane.sink.push(frame.clone()) {
                Ok(()) => {
                    self.ping_cursor = (self.ping_cursor + step + 1) % count;
                    return Ok(lane_id);
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// Queues `frame` (a cancel) on the lane holding `task`; nothing to do once it ended.
    pub(crate) fn cancel(&mut self, task: TaskId, frame: Bytes) -> Result<(), DeliveryError> {
        if self.closed {
            return Err(DeliveryError::Closed);
        }
        let Some(lane) = self
            .by_task
            .get(&task)
            .and_then(|lane| self.lanes.get_mut(lane))
        else {
            return Ok(());
        };
        lane.sink.push(frame)?;
        lane.cancelled = true;
        Ok(())
    }

    /// The worker ended `task` on `lane`; the lane becomes idle, or is retired when the
    /// table holds more lanes than wanted.
    pub(crate) fn finish(
        &mut self,
        lane_id: LaneId,
        task: TaskId,
        ending: Ending,
    ) -> Result<Finished, FinishError> {
        if ending == Ending::Result && self.take_echo(lane_id, task) {
            return Ok(Finished {
                duplicate: true,
                ..Finished::default()
            });
        }
        // A cancel_ack is judged by the task first: one the gateway never cancelled is a
        // protocol violation wherever it came from (so a wrong lane does not hide it).
        if ending == Ending::CancelAck {
            let holder = self
                .by_task
                .get(&task)
                .and_then(|holder| self.lanes.get(holder));
            if holder.is_some_and(|holder| !holder.cancelled) {
                return Err(FinishError::NotCancelled { task });
            }
        }
        let lane = self.lanes.get_mut(&lane_id);
        let held = lane.as_ref().and_then(|lane| lane.task);
        let Some(lane) = lane.filter(|_| held == Some(task)) else {
            return Err(FinishError::NotHeld {
                lane: lane_id,
                task,
                held,
            });
        };
        lane.task = None;
        lane.cancelled = false;
        self.by_task.remove(&task);
        let retired = self.is_above_target(lane_id);
        if retired {
            self.retire(lane_id);
        } else {
            self.idle.push(lane_id);
        }
        Ok(Finished {
            retired,
            drain_complete: self.draining && self.by_task.is_empty(),
            duplicate: false,
        })
    }

    /// A datagram copy of the result of task number `seq` on `lane`: ends the task as its
    /// lane copy would, when the lane holds that task, and remembers that the lane copy is
    /// still due. `None` (nothing changed) for a stale copy, one for a task the lane does not
    /// hold, or while the lane owes [`MAX_ECHOES`] lane copies.
    pub(crate) fn finish_copy(
        &mut self,
        lane_id: LaneId,
        seq: u64,
        task: TaskId,
    ) -> Option<Finished> {
        let lane = self.lanes.get(&lane_id)?;
        if lane.task != Some(task) || lane.seq != seq || lane.echoes.len() >= MAX_ECHOES {
            return None;
        }
        let finished = self.finish(lane_id, task, Ending::Result).ok()?;
        match self.lanes.get_mut(&lane_id) {
            Some(lane) => lane.echoes.push_back(task),
            None => self
                .retired_echoes
                .entry(lane_id)
                .or_default()
                .push_back(task),
        }
        Some(finished)
    }

    /// True (and forgotten) when `task` is the oldest result of `lane` taken from a datagram
    /// whose lane copy was still due.
    fn take_echo(&mut self, lane_id: LaneId, task: TaskId) -> bool {
        let echoes = match self.lanes.get_mut(&lane_id) {
            Some(lane) => &mut lane.echoes,
            None => match self.retired_echoes.get_mut(&lane_id) {
                Some(echoes) => echoes,
                None => return false,
            },
        };
        if echoes.front() != Some(&task) {
            return false;
        }
        echoes.pop_front();
        if echoes.is_empty() {
            self.retired_echoes.remove(&lane_id);
        }
        true
    }

    /// The reader of `lane` ended: its lane copies will never come.
    pub(crate) fn forget(&mut self, lane: LaneId) {
        self.retired_echoes.remove(&lane);
    }

    /// Starts a drain; true when no task is held, so it is already complete.
    pub(crate) fn start_drain(&mut self) -> bool {
        self.draining = true;
        self.by_task.is_empty()
    }

    /// True when every task held has been sent its cancel (or none is held): nothing more
    /// will be queued on a lane for the tasks in flight.
    pub(crate) fn settled(&self) -> bool {
        self.lanes
            .values()
            .all(|lane| lane.task.is_none() || lane.cancelled)
    }

    /// The connection is gone: every later call is refused, and the sinks are handed back
    /// (dropping them finishes the lanes).
    pub(crate) fn close(&mut self) -> Vec<S> {
        self.closed = true;
        self.order.clear();
        self.idle.clear();
        self.by_task.clear();
        self.retired_echoes.clear();
        self.lanes.drain().map(|(_, lane)| lane.sink).collect()
    }

    fn retire(&mut self, lane: LaneId) {
        if let Some(retired) = self.lanes.remove(&lane) {
            if !retired.echoes.is_empty() {
                self.retired_echoes.insert(lane, retired.echoes);
            }
        }
        self.order.retain(|id| *id != lane);
        self.idle.retain(|id| *id != lane);
        if self.ping_cursor >= self.order.len() {
            self.ping_cursor = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    /// A lane sink recording what was queued, with a settable capacity.
    #[derive(Clone)]
    struct Recorder {
        frames: Rc<RefCell<Vec<Bytes>>>,
        room: usize,
    }

    impl Recorder {
        fn new(room: usize) -> Self {
            Self {
                frames: Rc::default(),
                room,
            }
        }

        fn queued(&self) -> Vec<Bytes> {
            self.frames.borrow().clone()
        }
    }

    impl LaneSink for Recorder {
        fn push(&self, frame: Bytes) -> Result<(), DeliveryError> {
            let mut frames = self.frames.borrow_mut();
            if frames.len() >= self.room {
                return Err(DeliveryError::Full);
            }
            frames.push(frame);
            Ok(())
        }
    }

    fn t(n: u64) -> TaskId {
        TaskId::from_raw(n)
    }

    fn frame(text: &'static str) -> Bytes {
        Bytes::from_static(text.as_bytes())
    }

    fn table_with(lanes: &[Recorder]) -> (LaneTable<Recorder>, Vec<LaneId>) {
        let mut table = LaneTable::new(lanes.len() as u32);
        let ids: Vec<LaneId> = (0..lanes.len() as u64).map(LaneId::new).collect();
        for (id, sink) in ids.iter().zip(lanes) {
            table.add(*id, sink.clone());
        }
        (table, ids)
    }

    #[test]
    fn a_result_copied_by_datagram_ends_its_task_once_whichever_copy_comes_first() {
        let sinks = [Recorder::new(8)];
        let (mut table, ids) = table_with(&sinks);
        let lane = ids[0];
        // Datagram first: it ends the task; the lane copy that follows is a duplicate.
        table.assign(t(1), frame("task1")).unwrap();
        assert_eq!(table.task_seq(lane), 1);
        let first = table
            .finish_copy(lane, 1, t(1))
            .expect("the copy ends the task");
        assert!(!first.duplicate);
        assert_eq!(table.busy(), 0, "the slot is free at once");
        let echo = table.finish(lane, t(1), Ending::Result).unwrap();
        assert!(echo.duplicate, "the lane copy is recognised");
        // Lane copy first: the datagram that follows changes nothing.
        table.assign(t(2), frame("task2")).unwrap();
        assert!(!table.finish(lane, t(2), Ending::Result).unwrap().duplicate);
        assert_eq!(
            table.finish_copy(lane, 2, t(2)),
            None,
            "a late copy is dropped"
        );
        // Control: without its copy, a second lane result for the same task is still refused.
        assert!(table.finish(lane, t(2), Ending::Result).is_err());
    }

    #[test]
    fn a_copy_for_another_task_or_number_is_dropped() {
        let sinks = [Recorder::new(8)];
        let (mut table, ids) = table_with(&sinks);
        let lane = ids[0];
        table.assign(t(1), frame("task1")).unwrap();
        assert_eq!(table.finish_copy(lane, 1, t(9)), None, "not the task held");
        assert_eq!(table.finish_copy(lane, 2, t(1)), None, "not its number");
        assert_eq!(
            table.finish_copy(LaneId::new(7), 1, t(1)),
            None,
            "no such lane"
        );
        assert_eq!(table.busy(), 1);
        assert!(table.finish_copy(lane, 1, t(1)).is_some());
    }

    #[test]
    fn the_echoes_a_lane_owes_are_bounded_and_survive_its_retirement() {
        let sinks = [Recorder::new(usize::MAX)];
        let (mut table, ids) = table_with(&sinks);
        let lane = ids[0];
        for n in 1..=MAX_ECHOES as u64 {
            assert_eq!(table.assign(t(n), frame("task")).unwrap(), lane);
            assert!(table.finish_copy(lane, n, t(n)).is_some());
        }
        let next = MAX_ECHOES as u64 + 1;
        assert_eq!(table.assign(t(next), frame("task")).unwrap(), lane);
        assert_eq!(
            table.finish_copy(lane, next, t(next)),
            None,
            "a lane owing {MAX_ECHOES} lane copies takes no more datagrams"
        );
        // Its lane copies arrive; the first one frees room again.
        assert!(table.finish(lane, t(1), Ending::Result).unwrap().duplicate);
        assert!(table.finish_copy(lane, next, t(next)).is_some());
        // Shrinking retires the (now idle) lane; its lane copies are still recognised.
        table.set_target(0);
        assert!(!table.contains(lane));
        assert!(table.finish(lane, t(2), Ending::Result).unwrap().duplicate);
        table.forget(lane);
        assert!(
            table.finish(lane, t(3), Ending::Result).is_err(),
            "once its reader ended, nothing is owed"
        );
    }

    #[test]
    fn each_task_gets_its_own_lane_and_the_lane_is_reused_after_the_result() {
        let sinks = [Recorder::new(8), Recorder::new(8)];
        let (mut table, _) = table_with(&sinks);
        let first = table.assign(t(1), frame("task1")).unwrap();
        let second = table.assign(t(2), frame("task2")).unwrap();
        assert_ne!(first, second, "two tasks never share a lane");
        assert_eq!(
            table.assign(t(3), frame("task3")),
            Err(DeliveryError::Full),
            "no third lane"
        );
        table.finish(first, t(1), Ending::Result).unwrap();
        assert_eq!(table.assign(t(3), frame("task3")).unwrap(), first);
        assert_eq!(table.busy(), 2);
    }

    #[test]
    fn a_result_quoting_another_lanes_task_is_refused() {
        let sinks = [Recorder::new(8), Recorder::new(8)];
        let (mut table, ids) = table_with(&sinks);
        let lane = table.assign(t(1), frame("task")).unwrap();
        let other = ids.into_iter().find(|id| *id != lane).unwrap();
        assert_eq!(
            table.finish(other, t(1), Ending::Result),
            Err(FinishError::NotHeld {
                lane: other,
                task: t(1),
                held: None
            })
        );
        assert_eq!(
            table.finish(lane, t(9), Ending::Result),
            Err(FinishError::NotHeld {
                lane,
                task: t(9),
                held: Some(t(1))
            })
        );
        assert!(table.finish(lane, t(1), Ending::Result).is_ok());
        assert!(
            table.finish(lane, t(1), Ending::Result).is_err(),
            "a second result for the same task is refused"
        );
    }

    #[test]
    fn cancel_goes_to_the_lane_of_its_task_and_only_then_may_be_acknowledged() {
        let sinks = [Recorder::new(8), Recorder::new(8)];
        let (mut table, ids) = table_with(&sinks);
        let lane = table.assign(t(5), frame("task")).unwrap();
        assert_eq!(
            table.finish(lane, t(5), Ending::CancelAck),
            Err(FinishError::NotCancelled { task: t(5) })
        );
        table.cancel(t(5), frame("cancel")).unwrap();
        let holder = &sinks[ids.iter().position(|id| *id == lane).unwrap()];
        assert_eq!(holder.queued(), vec![frame("task"), frame("cancel")]);
        assert!(table.finish(lane, t(5), Ending::CancelAck).is_ok());
        // The task ended: a late cancel is a no-op, queued nowhere.
        table.cancel(t(5), frame("late")).unwrap();
        assert_eq!(holder.queued().len(), 2);
    }

    #[test]
    fn pings_rotate_over_every_lane_busy_or_idle_and_skip_full_ones() {
        let sinks = [Recorder::new(8), Recorder::new(1), Recorder::new(8)];
        let (mut table, ids) = table_with(&sinks);
        table.assign(t(1), frame("task")).unwrap();
        let first_round: Vec<LaneId> = (0..3).map(|_| table.ping(frame("p")).unwrap()).collect();
        assert_eq!(first_round, ids, "one ping per lane, in order");
        // The middle lane holds one frame already; the next round passes over it.
        let second_round: Vec<LaneId> = (0..2).map(|_| table.ping(frame("p")).unwrap()).collect();
        assert_eq!(second_round, vec![ids[0], ids[2]]);
    }

    #[test]
    fn shrinking_retires_idle_lanes_now_and_busy_lanes_when_they_finish() {
        let sinks: Vec<Recorder> = (0..4).map(|_| Recorder::new(8)).collect();
        let (mut table, ids) = table_with(&sinks);
        let busy: Vec<LaneId> = (1..=2)
            .map(|n| table.assign(t(n), frame("task")).unwrap())
            .collect();
        assert_eq!(busy, [ids[3], ids[2]]);
        assert_eq!(table.set_target(1), 0);
        assert_eq!(
            table.len(),
            3,
            "idle lane 1 went; lane 0 stays, the busy ones too"
        );
        assert!(!table.contains(ids[1]));
        assert_eq!(table.busy(), 2, "shrinking cancels nothing");
        let done = table.finish(busy[0], t(1), Ending::Result).unwrap();
        assert!(done.retired);
        assert!(!table.contains(busy[0]));
        let last = table.finish(busy[1], t(2), Ending::Result).unwrap();
        assert!(last.retired);
        assert_eq!(table.len(), 1);
        assert!(table.contains(ids[0]), "the target lane stays");
        assert_eq!(table.set_target(3), 2, "growing asks for lanes to open");
    }

    #[test]
    fn shrinking_keeps_the_lowest_lanes_and_finishes_every_lane_above_the_target() {
        // Every order of idle and busy lanes: the lanes kept are always 0..m.
        for busy_mask in 0u8..16 {
            let sinks: Vec<Recorder> = (0..4).map(|_| Recorder::new(8)).collect();
            let (mut table, ids) = table_with(&sinks);
            table.idle = ids.clone();
            let mut held = Vec::new();
            for (n, lane) in ids.iter().enumerate() {
                if busy_mask & (1 << n) != 0 {
                    let task = t(n as u64 + 1);
                    let lanes = table.lanes.get_mut(lane).unwrap();
                    lanes.task = Some(task);
                    table.by_task.insert(task, *lane);
                    table.idle.retain(|id| id != lane);
                    held.push((*lane, task));
                }
            }
            table.set_target(2);
            // Tasks end in lane order, so a low lane ends first (it used to be retired then).
            for (lane, task) in held {
                let finished = table.finish(lane, task, Ending::Result).unwrap();
                assert_eq!(
                    finished.retired,
                    lane >= ids[2],
                    "mask {busy_mask:04b}, {lane}"
                );
            }
            let kept: Vec<LaneId> = table.order.clone();
            assert_eq!(kept, ids[..2], "mask {busy_mask:04b}");
            assert_eq!(table.len(), 2);
        }
    }

    #[test]
    fn drain_completes_when_the_last_task_ends() {
        let sinks = [Recorder::new(8), Recorder::new(8)];
        let (mut table, _) = table_with(&sinks);
        let a = table.assign(t(1), frame("task")).unwrap();
        let b = table.assign(t(2), frame("task")).unwrap();
        assert!(!table.start_drain());
        assert!(
            !table
                .finish(a, t(1), Ending::Result)
                .unwrap()
                .drain_complete
        );
        assert!(
            table
                .finish(b, t(2), Ending::Result)
                .unwrap()
                .drain_complete
        );
        let (mut idle, _) = table_with(&[Recorder::new(1)]);
        assert!(idle.start_drain(), "nothing held: complete at once");
    }

    #[test]
    fn a_closed_table_refuses_everything() {
        let sinks = [Recorder::new(8)];
        let (mut table, _) = table_with(&sinks);
        table.close();
        assert_eq!(
            table.assign(t(1), frame("task")),
            Err(DeliveryError::Closed)
        );
        assert_eq!(table.ping(frame("p")), Err(DeliveryError::Closed));
        assert_eq!(table.cancel(t(1), frame("c")), Err(DeliveryError::Closed));
    }

    #[test]
    fn a_full_lane_gives_its_task_back() {
        let sinks = [Recorder::new(0)];
        let (mut table, _) = table_with(&sinks);
        assert_eq!(table.assign(t(1), frame("task")), Err(DeliveryError::Full));
        assert_eq!(table.busy(), 0);
        assert_eq!(table.set_target(1), 0, "the lane is still idle and counted");
    }
}
