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

/// The id of a durable dispatch: 32 lowercase hex digits, the millisecond it was made in (48
/// bits) then 80 random bits: unguessable, though it tells when it was made.
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
        Self(Self::text(time, random))
    }

    /// `time` (48 bits) then `random` (80 bits) as 32 lowercase hex digits: what
    /// `format!("{time:012x}{random:020x}")` writes, without the formatting machinery, which
    /// was a percent of the runtime's CPU in the durable stream's profile.
    fn text(time: u64, random: u128) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let value = (u128::from(time) << 80) | (random & ((1u128 << 80) - 1));
        (0..32)
            .rev()
            .map(|nibble| char::from(DIGITS[((value >> (4 * nibble)) & 0xf) as usize]))
            .collect()
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

impl DispatchFilter {
    /// Whether `row` passes every field this filter sets (the limit aside).
    pub fn admits(&self, row: &StoredDispatch) -> bool {
        let d = &row.dispatch;
        let same =
            |wanted: &Option<String>, actual: &str| wanted.as_deref().is_none_or(|w| w == actual);
        same(&self.namespace, &d.namespace)
            && same(&self.task_queue, &d.task_queue)
            && same(&self.activity_type, &d.activity_type)
            && same(&self.principal, &d.principal)
            && same(&self.state, row.state.label())
    }
}

impl BacklogCensus {
    /// The backlog per pool address of `rows` at `now`, ordered by address: finished rows are
    /// skipped, running ones counted as running, the rest as waiting with the oldest's age.
    pub fn tally<'a>(
        rows: impl IntoIterator<Item = &'a StoredDispatch>,
        now: SystemTime,
    ) -> Vec<BacklogCensus> {
        let mut pools: std::collections::BTreeMap<(String, String, String), BacklogCensus> =
            std::collections::BTreeMap::new();
        for row in rows {
            let waiting = match row.state {
                DispatchState::Queued { .. } | DispatchState::Parked { .. } => true,
                DispatchState::Running { .. } => false,
                DispatchState::Finished { .. } => continue,
            };
            let d = &row.dispatch;
            let census = pools
                .entry((
                    d.namespace.clone(),
                    d.task_queue.clone(),
                    d.activity_type.clone(),
                ))
                .or_insert_with(|| BacklogCensus {
                    namespace: d.namespace.clone(),
                    task_queue: d.task_queue.clone(),
                    activity_type: d.activity_type.clone(),
                    waiting: 0,
                    running: 0,
                    oldest_waiting: None,
                });
            if waiting {
                census.waiting += 1;
                let age = now.duration_since(d.submitted_at).unwrap_or_default();
                census.oldest_waiting = Some(census.oldest_waiting.map_or(age, |a| a.max(age)));
            } else {
                census.running += 1;
            }
        }
        pools.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(activity: &str, principal: &str, age_s: u64, state: DispatchState) -> StoredDispatch {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        StoredDispatch {
            dispatch: NewDispatch {
                id: DispatchId::generate(),
                namespace: "ns".to_owned(),
                task_queue: "default".to_owned(),
                activity_type: activity.to_owned(),
                node: None,
                input: Bytes::new(),
                principal: principal.to_owned(),
                idempotency_key: None,
                submitted_at: now - Duration::from_secs(age_s),
                deadline: now + Duration::from_secs(60),
            },
            state,
            attempts: 0,
        }
    }

    #[test]
    fn a_tally_counts_waiting_and_running_per_pool_and_skips_finished() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let queued = DispatchState::Queued { not_before: None };
        let parked = DispatchState::Parked {
            reason: "no_workers".to_owned(),
        };
        let running = DispatchState::Running {
            worker: WorkerId::from_raw(1),
            attempt: 1,
        };
        let finished = DispatchState::Finished {
            outcome: OutcomeRecord::from(&ActivityOutcome::Cancelled),
            at: now,
        };
        let rows = [
            row("b", "p", 5, queued.clone()),
            row("a", "p", 30, parked),
            row("a", "p", 90, running),
            row("a", "p", 10, queued),
            row("c", "p", 99, finished),
        ];
        let census = BacklogCensus::tally(&rows, now);
        let summary: Vec<(&str, u64, u64, Option<u64>)> = census
            .iter()
            .map(|c| {
                let oldest = c.oldest_waiting.map(|age| age.as_secs());
                (c.activity_type.as_str(), c.waiting, c.running, oldest)
            })
            .collect();
        // The running row's age does not count as a wait; the finished pool is absent.
        assert_eq!(
            summary,
            [("a", 2, 1, Some(30)), ("b", 1, 0, Some(5))],
            "{census:?}"
        );
    }

    #[test]
    fn a_filter_admits_only_rows_matching_every_field_it_sets() {
        let queued = DispatchState::Queued { not_before: None };
        let mine = row("a", "me", 0, queued.clone());
        let theirs = row("a", "them", 0, queued);
        assert!(
            DispatchFilter::default().admits(&theirs),
            "an empty filter admits all"
        );
        let filter = DispatchFilter {
            activity_type: Some("a".to_owned()),
            principal: Some("me".to_owned()),
            state: Some("queued".to_owned()),
            ..DispatchFilter::default()
        };
        assert!(filter.admits(&mine));
        assert!(!filter.admits(&theirs), "another principal");
        let running = DispatchFilter {
            state: Some("running".to_owned()),
            ..DispatchFilter::default()
        };
        assert!(!running.admits(&mine), "another state");
    }

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
    fn id_text_is_what_format_writes() {
        let cases = [
            (0u64, 0u128),
            (1, 1),
            (0xffff_ffff_ffff, (1u128 << 80) - 1),
            (0x0123_4567_89ab, 0x0fed_cba9_8765_4321_0f1e),
            (1_764_000_000_000, 0xdead_beef),
        ];
        for (time, random) in cases {
            assert_eq!(
                DispatchId::text(time, random),
                format!("{time:012x}{random:020x}"),
                "time {time:#x}, random {random:#x}"
            );
        }
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
