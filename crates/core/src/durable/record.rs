//! The plain data a [`DispatchStore`](super::DispatchStore) keeps: one row per dispatch.

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::address::WorkerId;
use crate::delivery::TransportName;
use crate::outcome::ActivityOutcome;
use crate::registry::UnservedReason;

/// Longest idempotency key a producer may give, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;

/// Checks a producer's idempotency key: not empty, at most [`MAX_IDEMPOTENCY_KEY_BYTES`].
/// Every store applies this rule at [`record`](super::DispatchStore::record).
pub fn check_idempotency_key(key: &str) -> Result<(), super::DispatchStoreError> {
    let problem = if key.is_empty() {
        "empty".to_owned()
    } else if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        format!(
            "{} bytes, longer than the limit of {MAX_IDEMPOTENCY_KEY_BYTES}",
            key.len()
        )
    } else {
        return Ok(());
    };
    Err(super::DispatchStoreError::InvalidKey { problem })
}

/// The id of a durable dispatch: 32 lowercase hex digits (128 random bits), unguessable so an
/// id alone reveals nothing about other dispatches.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DispatchId(String);

impl DispatchId {
    /// A fresh id: the milliseconds since the Unix epoch in its first 12 hex digits, then 80
    /// random bits. Ids of one process sort by creation time (to the millisecond), so a store
    /// indexing them appends new ids at the end of its index instead of at random places.
    pub fn generate() -> Self {
        Self::generate_at(SystemTime::now())
    }

    /// [`generate`](Self::generate) at `now`.
    fn generate_at(now: SystemTime) -> Self {
        let millis = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let time = u64::try_from(millis).unwrap_or(u64::MAX) & 0xffff_ffff_ffff;
        let random: u128 = rand::random::<u128>() >> 48;
        Self(format!("{time:012x}{random:020x}"))
    }

    /// Parses an id given by a producer or read from a store; `None` unless it is 32 lowercase
    /// hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        let well_formed = text.len() == 32
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        well_formed.then(|| Self(text.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DispatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A dispatch to record, as the producer submitted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewDispatch {
    /// Its id, minted by the caller of [`record`](super::DispatchStore::record); a repeated
    /// idempotency key returns the first id instead.
    pub id: DispatchId,
    /// Namespace it runs in.
    pub namespace: String,
    /// Task queue (normalised, never empty).
    pub task_queue: String,
    /// Activity type to run.
    pub activity_type: String,
    /// Node label it must run on, if any.
    pub node: Option<String>,
    /// The producer's input.
    pub input: Bytes,
    /// The principal that submitted it; only it (or an operator) reads or cancels it.
    pub principal: String,
    /// Producer's idempotency key, unique per namespace within the retention window.
    pub idempotency_key: Option<String>,
    /// When it was submitted (wall clock).
    pub submitted_at: SystemTime,
    /// When the producer stops caring: the dispatch ends `TimedOut` or `Unserved` then.
    pub deadline: SystemTime,
}

/// What [`record`](super::DispatchStore::record) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The dispatch is new and now durably recorded.
    New(DispatchId),
    /// The idempotency key was already used in the namespace; this is the first dispatch's id
    /// and nothing new was recorded.
    Existing(DispatchId),
}

impl Recorded {
    /// The id the producer gets back either way.
    pub fn id(&self) -> &DispatchId {
        match self {
            Self::New(id) | Self::Existing(id) => id,
        }
    }
}

/// Where a durable dispatch stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DispatchState {
    /// Recorded, waiting to be selected (also: back from a restart or a release).
    Queued {
        /// Not selected before this instant (a release with a delay).
        not_before: Option<SystemTime>,
    },
    /// Waiting for a worker; `reason` is the operator sentence's label
    /// ([`UnservedReason::as_str`]).
    Parked {
        /// Why no worker takes it.
        reason: String,
    },
    /// Delivered to a worker.
    Running {
        /// The worker it was delivered to (ids are per gateway process).
        worker: WorkerId,
        /// Delivery number, counted across restarts.
        attempt: u32,
    },
    /// Its one outcome is recorded.
    Finished {
        /// The outcome.
        outcome: OutcomeRecord,
        /// When it was recorded.
        at: SystemTime,
    },
}

impl DispatchState {
    /// A stable lowercase label: `queued`, `parked`, `running`, `finished`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Queued { .. } => "queued",
            Self::Parked { .. } => "parked",
            Self::Running { .. } => "running",
            Self::Finished { .. } => "finished",
        }
    }
}

/// One dispatch as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDispatch {
    /// What was submitted.
    pub dispatch: NewDispatch,
    /// Where it stands.
    pub state: DispatchState,
    /// Deliveries made so far, across restarts (0 before the first).
    pub attempts: u32,
}

/// The outcome as stored: flat fields that round-trip every [`ActivityOutcome`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutcomeRecord {
    /// [`ActivityOutcome::label`].
    pub kind: String,
    /// Output of a completed activity (empty otherwise).
    pub output: Bytes,
    /// Failure message, unserved sentence, or the lost transport's name (empty otherwise).
    pub message: String,
    /// A failure's retryable flag; for `unserved`, nothing.
    pub retryable: bool,
    /// `unserved`: the reason label; empty otherwise.
    pub reason: String,
    /// `transport_lost`: deliveries made.
    pub attempts: u32,
}

impl From<&ActivityOutcome> for OutcomeRecord {
    fn from(outcome: &ActivityOutcome) -> Self {
        let mut record = Self {
            kind: outcome.label().to_owned(),
            output: Bytes::new(),
            message: String::new(),
            retryable: false,
            reason: String::new(),
            attempts: 0,
        };
        match outcome {
            ActivityOutcome::Completed(output) => record.output = output.clone(),
            ActivityOutcome::Failed { message, retryable } => {
                record.message = message.clone();
                record.retryable = *retryable;
            }
            ActivityOutcome::Unserved { reason, detail } => {
                record.reason = reason.as_str().to_owned();
                record.message = detail.clone();
            }
            ActivityOutcome::TransportLost {
                transport,
                attempts,
            } => {
                record.message = transport.as_str().to_owned();
                record.attempts = *attempts;
            }
            ActivityOutcome::TimedOut
            | ActivityOutcome::Cancelled
            | ActivityOutcome::ShuttingDown => {}
        }
        record
    }
}

impl OutcomeRecord {
    /// The outcome back; `None` for a kind or reason this build does not know (a store
    /// written by a newer version).
    pub fn to_outcome(&self) -> Option<ActivityOutcome> {
        Some(match self.kind.as_str() {
            "completed" => ActivityOutcome::Completed(self.output.clone()),
            "failed" => ActivityOutcome::Failed {
                message: self.message.clone(),
                retryable: self.retryable,
            },
            "timed_out" => ActivityOutcome::TimedOut,
            "cancelled" => ActivityOutcome::Cancelled,
            "unserved" => ActivityOutcome::Unserved {
                reason: UnservedReason::from_label(&self.reason)?,
                detail: self.message.clone(),
            },
            "transport_lost" => ActivityOutcome::TransportLost {
                transport: TransportName::new(self.message.clone()),
                attempts: self.attempts,
            },
            "shutting_down" => ActivityOutcome::ShuttingDown,
            _ => return None,
        })
    }
}

/// What [`complete`](super::DispatchStore::complete) did: the first outcome wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// This outcome is now the dispatch's one outcome.
    Recorded,
    /// An outcome was already recorded; this is it, and the new one was dropped.
    AlreadyFinished(OutcomeRecord),
    /// No such dispatch (never recorded, or deleted after its retention).
    Unknown,
}

/// Which dispatches [`list`](super::DispatchStore::list) returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchFilter {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this task queue.
    pub task_queue: Option<String>,
    /// Only this activity type.
    pub activity_type: Option<String>,
    /// Only dispatches in this state ([`DispatchState::label`]).
    pub state: Option<String>,
    /// Only this principal's.
    pub principal: Option<String>,
    /// At most this many, oldest submission first.
    pub limit: usize,
}

/// Backlog of one pool address in the store: dispatches recorded and not finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BacklogCensus {
    /// Namespace.
    pub namespace: String,
    /// Task queue.
    pub task_queue: String,
    /// Activity type.
    pub activity_type: String,
    /// Dispatches queued or parked (not running, not finished).
    pub waiting: u64,
    /// Dispatches running on a worker.
    pub running: u64,
    /// Age of the oldest waiting one at the census.
    pub oldest_waiting: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_the_millisecond_they_were_made_in() {
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_764_000_000_000);
        let ids: Vec<DispatchId> = (0..50u64)
            .map(|ms| DispatchId::generate_at(start + std::time::Duration::from_millis(ms)))
            .collect();
        for id in &ids {
            assert_eq!(DispatchId::parse(id.as_str()).as_ref(), Some(id));
        }
        assert!(
            ids.windows(2).all(|pair| pair[0] < pair[1]),
            "ids of later milliseconds sort later"
        );
        // Control: within one millisecond the rest is random, so ids still differ.
        let same = [
            DispatchId::generate_at(start),
            DispatchId::generate_at(start),
        ];
        assert_ne!(same[0], same[1]);
        assert_eq!(same[0].as_str()[..12], same[1].as_str()[..12]);
    }

    #[test]
    fn ids_are_32_hex_digits_and_parse_back() {
        let id = DispatchId::generate();
        assert_eq!(id.as_str().len(), 32);
        assert_eq!(DispatchId::parse(id.as_str()), Some(id.clone()));
        assert_ne!(DispatchId::generate(), id, "two ids collide");
        assert_eq!(DispatchId::parse("xyz"), None);
        assert_eq!(DispatchId::parse(&"A".repeat(32)), None, "upper case");
        assert_eq!(DispatchId::parse(&"a".repeat(33)), None, "too long");
    }

    #[test]
    fn every_outcome_round_trips_through_its_record() {
        let outcomes = [
            ActivityOutcome::Completed(Bytes::from_static(b"out")),
            ActivityOutcome::Failed {
                message: "boom".into(),
                retryable: true,
            },
            ActivityOutcome::TimedOut,
            ActivityOutcome::Cancelled,
            ActivityOutcome::Unserved {
                reason: UnservedReason::AllAtCapacity,
                detail: "every worker is busy".into(),
            },
            ActivityOutcome::TransportLost {
                transport: TransportName::new("quic"),
                attempts: 3,
            },
            ActivityOutcome::ShuttingDown,
        ];
        for outcome in outcomes {
            let record = OutcomeRecord::from(&outcome);
            assert_eq!(record.kind, outcome.label());
            assert_eq!(record.to_outcome(), Some(outcome));
        }
        let unknown = OutcomeRecord {
            kind: "teleported".into(),
            ..OutcomeRecord::from(&ActivityOutcome::TimedOut)
        };
        assert_eq!(unknown.to_outcome(), None);
    }
}
