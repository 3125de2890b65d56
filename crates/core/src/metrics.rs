//! Every series core records, so an embedder can export them at zero from the start.
//!
//! A dashboard or an `absent()` alert reads a series that was never written as "no data"; a
//! fresh gateway should say "0". Core records its counters lazily (on the first dispatch, the
//! first refusal), so [`register_metrics`] writes each counter with every label value it can
//! take, and the latency histogram, before any traffic. Series labelled by namespace or
//! transport appear with their first worker.

use crate::admission::AdmissionError;
use crate::dispatcher::quota;
use crate::events::DisconnectReason;
use crate::outcome::{ActivityOutcome, CompletionRefused};
use crate::registry::UnservedReason;

/// `switchyard_dispatches_total{outcome}`: dispatches ended, by outcome.
pub const DISPATCHES_TOTAL: &str = "switchyard_dispatches_total";
/// `switchyard_dispatch_latency_seconds`: time from a dispatch call to its outcome.
pub const DISPATCH_LATENCY_SECONDS: &str = "switchyard_dispatch_latency_seconds";
/// `switchyard_results_refused_total{reason}`: worker results core refused, by reason.
pub const RESULTS_REFUSED_TOTAL: &str = "switchyard_results_refused_total";
/// `switchyard_results_after_cancel_total`: results that arrived for a cancelled task still
/// held, taken as its cancel acknowledgement (not refusals).
pub const RESULTS_AFTER_CANCEL_TOTAL: &str = "switchyard_results_after_cancel_total";
/// `switchyard_unserved_episodes_total{reason}`: episodes of a pool having no worker to take a
/// dispatch, by reason.
pub const UNSERVED_EPISODES_TOTAL: &str = "switchyard_unserved_episodes_total";
/// `switchyard_admission_refusals_total{reason}`: registrations refused by the gate, by rule.
pub const ADMISSION_REFUSALS_TOTAL: &str = "switchyard_admission_refusals_total";

/// `switchyard_dispatch_refusals_total{limit}`: dispatches refused by a quota, by the quota's
/// configuration key.
pub const DISPATCH_REFUSALS_TOTAL: &str = "switchyard_dispatch_refusals_total";

/// `switchyard_worker_departures_total{reason}`: workers that left the registry, by reason.
pub const WORKER_DEPARTURES_TOTAL: &str = "switchyard_worker_departures_total";
/// `switchyard_tasks_reclaimed_total`: slots taken back from workers that neither answered
/// nor acknowledged an ended task within `dispatch.cancel_ack_timeout`.
pub const TASKS_RECLAIMED_TOTAL: &str = "switchyard_tasks_reclaimed_total";

/// `switchyard_workers_suspended`: session workers whose connection is lost and whose
/// session waits for a resume.
pub const WORKERS_SUSPENDED: &str = "switchyard_workers_suspended";
/// `switchyard_sessions_resumed_total`: sessions resumed on a new connection.
pub const SESSIONS_RESUMED_TOTAL: &str = "switchyard_sessions_resumed_total";
/// `switchyard_resume_refused_total{reason}`: resumes refused, by
/// [`crate::ResumeRefused::label`].
pub const RESUME_REFUSED_TOTAL: &str = "switchyard_resume_refused_total";

/// Every `reason` label of [`WORKER_DEPARTURES_TOTAL`].
pub const DEPARTURE_LABELS: [&str; 6] = [
    "disconnect",
    "timeout",
    "drained",
    "unresponsive",
    "reconnect_grace_expired",
    "closed",
];

/// Every `reason` label of [`RESUME_REFUSED_TOTAL`].
pub const RESUME_REFUSED_LABELS: [&str; 6] = [
    "unknown_session",
    "wrong_secret",
    "wrong_principal",
    "draining",
    "shutting_down",
    "too_many_tasks",
];

/// Every `limit` label of [`DISPATCH_REFUSALS_TOTAL`].
pub const QUOTA_LABELS: [&str; 4] = [
    quota::MAX_PARKED_PER_NAMESPACE,
    quota::MAX_PARKED_PER_PRINCIPAL,
    quota::MAX_HELD_BYTES_PER_NAMESPACE,
    quota::MAX_HELD_BYTES_PER_PRINCIPAL,
];

/// Every `outcome` label of [`DISPATCHES_TOTAL`].
pub const OUTCOME_LABELS: [&str; 7] = [
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "unserved",
    "transport_lost",
    "shutting_down",
];

/// Every `reason` label of [`RESULTS_REFUSED_TOTAL`].
pub const REFUSED_RESULT_LABELS: [&str; 3] = ["unknown", "foreign", "late"];

/// Every `reason` label of [`UNSERVED_EPISODES_TOTAL`].
pub const UNSERVED_LABELS: [&str; 10] = [
    "no_workers",
    "workers_incompatible",
    "all_at_capacity",
    "capacity_unannounced",
    "awaiting_streams",
    "workers_unreachable",
    "on_probation",
    "draining",
    "workers_suspended",
    "no_capacity_in_cluster",
];

/// Every `reason` label of [`ADMISSION_REFUSALS_TOTAL`].
pub const ADMISSION_LABELS: [&str; 17] = [
    "empty_field",
    "empty_entry",
    "too_long",
    "too_many",
    "control_character",
    "missing_capacity",
    "zero_capacity",
    "capacity_above_limit",
    "namespace_not_granted",
    "role_missing",
    "principal_max_workers",
    "unknown_namespace",
    "placement_violated",
    "unknown_worker",
    "store_error",
    "shutting_down",
    "namespace_limit",
];

/// Registers every label-complete series core records, at zero, with the installed `metrics`
/// recorder. Idempotent; call it once the recorder is installed.
pub fn register_metrics() {
    for outcome in OUTCOME_LABELS {
        metrics::counter!(DISPATCHES_TOTAL, "outcome" => outcome).increment(0);
    }
    for reason in REFUSED_RESULT_LABELS {
        metrics::counter!(RESULTS_REFUSED_TOTAL, "reason" => reason).increment(0);
    }
    metrics::counter!(RESULTS_AFTER_CANCEL_TOTAL).increment(0);
    for reason in DEPARTURE_LABELS {
        metrics::counter!(WORKER_DEPARTURES_TOTAL, "reason" => reason).increment(0);
    }
    metrics::counter!(TASKS_RECLAIMED_TOTAL).increment(0);
    metrics::gauge!(WORKERS_SUSPENDED).increment(0.0);
    metrics::counter!(SESSIONS_RESUMED_TOTAL).increment(0);
    for reason in RESUME_REFUSED_LABELS {
        metrics::counter!(RESUME_REFUSED_TOTAL, "reason" => reason).increment(0);
    }
    for limit in QUOTA_LABELS {
        metrics::counter!(DISPATCH_REFUSALS_TOTAL, "limit" => limit).increment(0);
    }
    for reason in UNSERVED_LABELS {
        metrics::counter!(UNSERVED_EPISODES_TOTAL, "reason" => reason).increment(0);
    }
    for reason in ADMISSION_LABELS {
        metrics::counter!(ADMISSION_REFUSALS_TOTAL, "reason" => reason).increment(0);
    }
    // Registering the histogram makes the exporter render it (all buckets at 0).
    let _ = metrics::histogram!(DISPATCH_LATENCY_SECONDS);
}

/// The handles of the two series every dispatch writes, looked up once when the dispatcher
/// starts rather than by name and label per dispatch (a lookup builds a key, hashes it and
/// takes the registry's lock). They belong to the recorder installed at that moment, so an
/// embedder installs its recorder before it starts core, as it must anyway for
/// [`register_metrics`].
pub(crate) struct DispatchMetrics {
    /// `switchyard_dispatches_total`, one handle per label of [`OUTCOME_LABELS`], same order.
    outcomes: [metrics::Counter; OUTCOME_LABELS.len()],
    /// `switchyard_dispatch_latency_seconds`.
    latency: metrics::Histogram,
}

impl DispatchMetrics {
    /// The handles, from the recorder installed now.
    pub(crate) fn new() -> Self {
        Self {
            outcomes: OUTCOME_LABELS
                .map(|outcome| metrics::counter!(DISPATCHES_TOTAL, "outcome" => outcome)),
            latency: metrics::histogram!(DISPATCH_LATENCY_SECONDS),
        }
    }

    /// A dispatch ended with `outcome` after `latency`.
    pub(crate) fn ended(&self, outcome: &ActivityOutcome, latency: std::time::Duration) {
        if let Some(counter) = self.outcomes.get(outcome_index(outcome)) {
            counter.increment(1);
        }
        self.latency.record(latency.as_secs_f64());
    }
}

impl std::fmt::Debug for DispatchMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchMetrics").finish_non_exhaustive()
    }
}

/// The position of `outcome`'s label in [`OUTCOME_LABELS`].
fn outcome_index(outcome: &ActivityOutcome) -> usize {
    use ActivityOutcome as O;
    match outcome {
        O::Completed(_) => 0,
        O::Failed { .. } => 1,
        O::TimedOut => 2,
        O::Cancelled => 3,
        O::Unserved { .. } => 4,
        O::TransportLost { .. } => 5,
        O::ShuttingDown => 6,
    }
}

/// Compile-time guards: a new variant of any labelled enum fails to build here until its
/// label is added to the lists above (the tests check the lists hold each label).
#[allow(dead_code)]
fn every_variant_is_listed(
    outcome: &ActivityOutcome,
    refused: &CompletionRefused,
    unserved: UnservedReason,
    admission: &AdmissionError,
    departure: DisconnectReason,
) {
    use DisconnectReason as D;
    match departure {
        D::Disconnect
        | D::Timeout
        | D::Drained
        | D::Unresponsive
        | D::ReconnectGraceExpired
        | D::Closed => {}
        // Not a departure: never counted.
        D::Superseded => {}
    }
    use ActivityOutcome as O;
    match outcome {
        O::Completed(_)
        | O::Failed { .. }
        | O::TimedOut
        | O::Cancelled
        | O::Unserved { .. }
        | O::TransportLost { .. }
        | O::ShuttingDown => {}
    }
    match refused {
        CompletionRefused::UnknownTask { .. }
        | CompletionRefused::NotHeldByWorker { .. }
        | CompletionRefused::Late { .. } => {}
    }
    use UnservedReason as U;
    match unserved {
        U::NoWorkers
        | U::WorkersIncompatible
        | U::AllAtCapacity
        | U::CapacityUnannounced
        | U::AwaitingStreams
        | U::WorkersUnreachable
        | U::OnProbation
        | U::Draining
        | U::WorkersSuspended
        | U::NoCapacityInCluster => {}
    }
    use AdmissionError as A;
    match admission {
        A::Empty { .. }
        | A::EmptyEntry { .. }
        | A::TooLong { .. }
        | A::TooMany { .. }
        | A::ControlCharacter { .. }
        | A::MissingCapacity
        | A::ZeroCapacity
        | A::CapacityAboveLimit { .. }
        | A::NamespaceNotGranted { .. }
        | A::RoleMissing { .. }
        | A::PrincipalWorkerLimit { .. }
        | A::UnknownNamespace { .. }
        | A::PlacementViolated { .. }
        | A::UnknownWorker
        | A::Store(_)
        | A::ShuttingDown
        | A::NamespaceLimit { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::*;
    use crate::delivery::TransportName;

    /// Counts `switchyard_dispatches_total` by outcome label; ignores everything else.
    #[derive(Default)]
    struct Counting {
        outcomes: Mutex<HashMap<String, Arc<AtomicU64>>>,
    }

    impl Counting {
        fn count(&self, outcome: &str) -> u64 {
            let outcomes = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
            outcomes
                .get(outcome)
                .map_or(0, |count| count.load(Ordering::Relaxed))
        }
    }

    impl Recorder for Counting {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let Some(outcome) = key.labels().find(|label| label.key() == "outcome") else {
                return Counter::noop();
            };
            let mut outcomes = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
            let count = outcomes.entry(outcome.value().to_owned()).or_default();
            Counter::from_arc(Arc::clone(count))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn dispatch_outcomes_count_in_the_recorder_in_force_when_the_handles_were_made() {
        let recorder = Counting::default();
        let handles = metrics::with_local_recorder(&recorder, DispatchMetrics::new);
        // Outside the local recorder's scope: a lookup by name now would reach the global
        // (no-op) recorder and count nothing.
        handles.ended(&ActivityOutcome::TimedOut, Duration::from_millis(3));
        handles.ended(&ActivityOutcome::TimedOut, Duration::from_millis(4));
        handles.ended(&ActivityOutcome::Cancelled, Duration::from_millis(5));
        assert_eq!(recorder.count("timed_out"), 2);
        assert_eq!(recorder.count("cancelled"), 1);
        assert_eq!(
            recorder.count("completed"),
            0,
            "only the outcomes that ended count"
        );
    }

    #[test]
    fn the_lists_hold_each_label_core_records() {
        let outcomes = [
            ActivityOutcome::Completed(Bytes::new()),
            ActivityOutcome::Failed {
                message: String::new(),
                retryable: false,
            },
            ActivityOutcome::TimedOut,
            ActivityOutcome::Cancelled,
            ActivityOutcome::Unserved {
                reason: UnservedReason::NoWorkers,
                detail: String::new(),
            },
            ActivityOutcome::TransportLost {
                transport: TransportName::from_static("t"),
                attempts: 1,
            },
            ActivityOutcome::ShuttingDown,
        ];
        let labels: Vec<&str> = outcomes.iter().map(ActivityOutcome::label).collect();
        assert_eq!(labels, OUTCOME_LABELS);
        let indexed: Vec<&str> = outcomes
            .iter()
            .map(|outcome| OUTCOME_LABELS[outcome_index(outcome)])
            .collect();
        assert_eq!(
            indexed, labels,
            "each outcome's handle is the one of its own label"
        );

        let unserved = UnservedReason::ALL;
        let labels: Vec<&str> = unserved.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, UNSERVED_LABELS);

        let departures = [
            DisconnectReason::Disconnect,
            DisconnectReason::Timeout,
            DisconnectReason::Drained,
            DisconnectReason::Unresponsive,
            DisconnectReason::ReconnectGraceExpired,
            DisconnectReason::Closed,
        ];
        let labels: Vec<&str> = departures.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, DEPARTURE_LABELS);

        let session = crate::WorkerId::from_raw(1);
        let refusals = [
            crate::ResumeRefused::UnknownSession {
                session_id: session,
            },
            crate::ResumeRefused::WrongSecret {
                session_id: session,
            },
            crate::ResumeRefused::WrongPrincipal {
                session_id: session,
            },
            crate::ResumeRefused::Draining {
                session_id: session,
            },
            crate::ResumeRefused::ShuttingDown,
            crate::ResumeRefused::TooManyTasks {
                field: "running",
                count: 2,
                limit: 1,
            },
        ];
        let labels: Vec<&str> = refusals.iter().map(crate::ResumeRefused::label).collect();
        assert_eq!(labels, RESUME_REFUSED_LABELS);
    }

    #[test]
    fn every_admission_label_is_listed() {
        use crate::namespace::StoreError;
        let errors = [
            AdmissionError::MissingCapacity,
            AdmissionError::ZeroCapacity,
            AdmissionError::CapacityAboveLimit {
                max_concurrency: 2,
                limit: 1,
            },
            AdmissionError::UnknownWorker,
            AdmissionError::ShuttingDown,
            AdmissionError::NamespaceLimit { limit: 1 },
            AdmissionError::Store(StoreError(String::new())),
        ];
        for error in &errors {
            assert!(
                ADMISSION_LABELS.contains(&error.label()),
                "{}",
                error.label()
            );
        }
    }
}
