//! The writer's inbox: commands queued in order, taken by the writer a batch at a time.
//!
//! A sender wakes the writer only when it sleeps on an empty inbox (or waits for a batch to
//! fill), never once per command: under load the writer finds everything queued while it
//! committed and takes it in one go. A write the writer may hold back for its outcome (see
//! [`hold`](crate::hold)) does not wake a writer that wakes on its own before that hold ends:
//! woken for it, the writer would only hold it and sleep again. Room is bounded; a sender
//! waits (asynchronously) for it.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::writer::{BatchPolicy, Command};

/// What the writer is blocked on, if anything: who must wake it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// Working: nobody wakes it.
    No,
    /// Sleeping on an empty inbox until `until` (`None`: until woken): the next command wakes
    /// it, unless it may be held back past `until` ([`wakes`]).
    ForAny { until: Option<Instant> },
    /// Gathering a batch until its delay ends: a command that fills the batch wakes it.
    ForFull,
}

#[derive(Debug)]
struct State {
    commands: Vec<Command>,
    closed: bool,
    waiting: Waiting,
    /// The most commands the queue has held when the writer took it: the room the next queue
    /// starts with, so senders do not grow it (commands are a few hundred bytes, copied at
    /// every doubling).
    peak: usize,
}

/// The commands waiting for the writer.
#[derive(Debug)]
pub(crate) struct Inbox {
    state: Mutex<State>,
    wake: Condvar,
    /// One permit per command the inbox has room for.
    room: Semaphore,
    policy: BatchPolicy,
}

/// Whether a command held back at most until `hold_until` (`None`: not held) wakes a writer
/// sleeping until `until`: not when the writer wakes first anyway, since it would only hold it.
fn wakes(until: Option<Instant>, hold_until: Option<Instant>) -> bool {
    match (until, hold_until) {
        (Some(until), Some(hold_until)) => hold_until < until,
        _ => true,
    }
}

/// The inbox was closed: the writer stopped.
#[derive(Debug)]
pub(crate) struct Closed;

impl Inbox {
    /// An inbox holding at most `capacity` commands, batched by `policy`.
    pub(crate) fn new(capacity: usize, policy: BatchPolicy) -> Self {
        Self {
            state: Mutex::new(State {
                commands: Vec::new(),
                closed: false,
                waiting: Waiting::No,
                peak: 0,
            }),
            wake: Condvar::new(),
            room: Semaphore::new(capacity.max(1)),
            policy,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a queue and two flags, consistent after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `command` behind every command sent before it, waiting for room.
    pub(crate) async fn send(&self, command: Command) -> Result<(), Closed> {
        let permit = self.room.acquire().await.map_err(|_| Closed)?;
        // Given back by the writer when it takes the command.
        permit.forget();
        let mut state = self.lock();
        if state.closed {
            return Err(Closed);
        }
        let hold_until = command.hold_until;
        state.commands.push(command);
        let wake = match state.waiting {
            Waiting::No => false,
            Waiting::ForAny { until } => wakes(until, hold_until),
            Waiting::ForFull => self.policy.is_full(state.commands.len()),
        };
        if wake {
            state.waiting = Waiting::No;
            drop(state);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Refuses further commands; the writer still takes those queued.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.waiting = Waiting::No;
        drop(state);
        self.room.close();
        self.wake.notify_one();
    }

    /// The next batch, blocking until there is one: `None` once closed and empty.
    #[cfg(test)]
    pub(crate) fn take(&self) -> Option<Vec<Command>> {
        self.take_until(None)
    }

    /// The next batch, blocking until there is one or until `until` (then an empty batch, so
    /// the writer can write what it held back): `None` once closed and empty.
    pub(crate) fn take_until(&self, until: Option<Instant>) -> Option<Vec<Command>> {
        let mut state = self.lock();
        while state.commands.is_empty() {
            if state.closed {
                return None;
            }
            state.waiting = Waiting::ForAny { until };
            state = match until {
                None => self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(until) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        state.waiting = Waiting::No;
                        return Some(Vec::new());
                    }
                    self.wake
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        if let Some(first) = state.commands.first() {
            let deadline = self.policy.deadline(first.sent);
            while !state.closed && !self.policy.is_full(state.commands.len()) {
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                if left.is_zero() {
                    break;
                }
                state.waiting = Waiting::ForFull;
                state = self
                    .wake
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        state.waiting = Waiting::No;
        let n = state.commands.len().min(self.policy.max_batch.max(1));
        state.peak = state.peak.max(state.commands.len());
        let batch: Vec<Command> = if n == state.commands.len() {
            let room = state.peak;
            std::mem::replace(&mut state.commands, Vec::with_capacity(room))
        } else {
            state.commands.drain(..n).collect()
        };
        drop(state);
        self.room.add_permits(batch.len());
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use switchyard_core::DispatchId;

    use super::*;
    use crate::ops::Op;

    fn command() -> Command {
        Command {
            op: Op::Park {
                id: DispatchId::generate(),
                reason: "r".into(),
            },
            reply: None,
            sent: Instant::now(),
            hold_until: None,
        }
    }

    fn inbox(max_batch: usize, max_delay: Duration) -> Inbox {
        Inbox::new(
            16,
            BatchPolicy {
                max_batch,
                max_delay,
            },
        )
    }

    #[tokio::test]
    async fn the_writer_takes_everything_queued_at_once_up_to_max_batch() {
        let inbox = inbox(3, Duration::ZERO);
        for _ in 0..5 {
            inbox.send(command()).await.expect("send");
        }
        assert_eq!(
            inbox.take().map(|b| b.len()),
            Some(3),
            "capped at max_batch"
        );
        assert_eq!(
            inbox.take().map(|b| b.len()),
            Some(2),
            "the rest, in one go"
        );
        inbox.close();
        assert!(inbox.take().is_none(), "closed and empty");
        assert!(inbox.send(command()).await.is_err(), "closed to senders");
    }

    #[tokio::test]
    async fn commands_queued_before_close_are_still_taken() {
        let inbox = inbox(8, Duration::ZERO);
        inbox.send(command()).await.expect("send");
        inbox.close();
        assert_eq!(inbox.take().map(|b| b.len()), Some(1));
        assert!(inbox.take().is_none());
    }

    #[tokio::test]
    async fn a_sleeping_writer_is_woken_by_the_first_command_and_a_full_batch_ends_the_delay() {
        let inbox = Arc::new(inbox(2, Duration::from_secs(3600)));
        let writer = {
            let inbox = Arc::clone(&inbox);
            std::thread::spawn(move || inbox.take().map(|b| b.len()))
        };
        inbox.send(command()).await.expect("send");
        inbox.send(command()).await.expect("send");
        // Without the wake on a full batch this join would wait the hour's delay.
        assert_eq!(writer.join().expect("writer thread"), Some(2));
    }

    #[tokio::test]
    async fn room_taken_by_queued_commands_comes_back_when_the_writer_takes_them() {
        let inbox = Inbox::new(
            1,
            BatchPolicy {
                max_batch: 4,
                max_delay: Duration::ZERO,
            },
        );
        inbox.send(command()).await.expect("send");
        let second = inbox.send(command());
        tokio::pin!(second);
        assert!(
            futures_poll_once(second.as_mut()).await.is_none(),
            "a full inbox lets a sender through"
        );
        assert_eq!(inbox.take().map(|b| b.len()), Some(1));
        second.await.expect("room after the take");
    }

    #[tokio::test]
    async fn a_write_that_may_be_held_wakes_a_sleeping_writer_only_if_its_hold_ends_first() {
        let now = Instant::now();
        let soon = now + Duration::from_millis(10);
        let later = now + Duration::from_secs(60);
        let held_until = |hold_until| Command {
            hold_until,
            ..command()
        };
        // (writer sleeps until, the command's hold ends, woken)
        let cases = [
            (Some(soon), Some(later), false),
            // Controls: a hold ending first, a write that may not wait, a writer without a
            // time of its own to wake at.
            (Some(later), Some(soon), true),
            (Some(soon), None, true),
            (None, Some(later), true),
        ];
        for (until, hold_until, woken) in cases {
            let inbox = inbox(8, Duration::ZERO);
            inbox.lock().waiting = Waiting::ForAny { until };
            inbox.send(held_until(hold_until)).await.expect("send");
            assert_eq!(
                inbox.lock().waiting == Waiting::No,
                woken,
                "writer until {until:?}, hold until {hold_until:?}"
            );
            assert_eq!(inbox.lock().commands.len(), 1, "queued either way");
        }
    }

    /// Polls `future` once: `Some` when it finished.
    async fn futures_poll_once<F: std::future::Future + Unpin>(future: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = future => Some(out),
            () = std::future::ready(()) => None,
        }
    }
}
