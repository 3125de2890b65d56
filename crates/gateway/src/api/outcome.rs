//! The one mapping between a dispatch on the wire and in core: request in, outcome or refusal
//! out. `Dispatch`, `DispatchStream` and the durable-dispatch RPCs all go through here: a
//! dispatcher's refusal, a dispatch store's refusal or failure, and a durable lookup's
//! `NotFound` each become a status in one place.

use std::time::Duration;

use switchyard_core::{
    ActivityOutcome, ActivityRequest, CancelError, DispatchError, DispatchId, DispatchStoreError,
    LookupError, SubmitError,
};
use switchyard_proto::v1 as pb;
use tonic::{Code, Status};

use super::convert;

/// The core request for a wire request; a zero timeout takes `default_timeout`.
pub(crate) fn request(wire: pb::DispatchRequest, default_timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: wire.namespace,
        task_queue: wire.task_queue,
        activity_type: wire.activity_type,
        node: (!wire.node.is_empty()).then_some(wire.node),
        input: wire.input,
        activity_id: (!wire.activity_id.is_empty()).then_some(wire.activity_id),
        timeout: if wire.timeout_ms == 0 {
            default_timeout
        } else {
            Duration::from_millis(wire.timeout_ms)
        },
    }
}

/// The core request and the idempotency key (empty means none) of a durable submission.
pub(crate) fn durable_request(
    mut wire: pb::DispatchRequest,
    default_timeout: Duration,
) -> (ActivityRequest, Option<String>) {
    let key = std::mem::take(&mut wire.idempotency_key);
    (
        request(wire, default_timeout),
        (!key.is_empty()).then_some(key),
    )
}

/// The wire outcome of a dispatch: every core outcome is an OK reply with one field set.
pub(crate) fn outcome(outcome: ActivityOutcome) -> pb::DispatchOutcome {
    use pb::dispatch_outcome::Outcome;
    let body = match outcome {
        ActivityOutcome::Completed(output) => Outcome::Completed(pb::DispatchCompleted { output }),
        ActivityOutcome::Failed { message, retryable } => {
            Outcome::Failed(pb::Failure { message, retryable })
        }
        ActivityOutcome::TimedOut => Outcome::TimedOut(pb::DispatchTimedOut {}),
        ActivityOutcome::Cancelled => Outcome::Cancelled(pb::DispatchCancelled {}),
        ActivityOutcome::Unserved { reason, detail } => Outcome::Unserved(pb::DispatchUnserved {
            reason: convert::unserved_reason(reason).into(),
            detail,
        }),
        ActivityOutcome::TransportLost {
            transport,
            attempts,
        } => Outcome::TransportLost(pb::DispatchTransportLost {
            transport: transport.as_str().to_owned(),
            attempts,
        }),
        ActivityOutcome::ShuttingDown => Outcome::ShuttingDown(pb::DispatchShuttingDown {}),
        other => Outcome::Other(pb::DispatchOtherOutcome {
            label: other.label().to_owned(),
        }),
    };
    pb::DispatchOutcome {
        outcome: Some(body),
    }
}

/// The status of a dispatch refused before it started.
pub(crate) fn refusal(error: &DispatchError) -> Status {
    let code = match error {
        DispatchError::Invalid { .. } => Code::InvalidArgument,
        DispatchError::NamespaceNotGranted { .. } => Code::PermissionDenied,
        DispatchError::DuplicateActivityId { .. } => Code::AlreadyExists,
        DispatchError::InputTooLarge { .. } | DispatchError::QuotaExceeded { .. } => {
            Code::ResourceExhausted
        }
        _ => Code::FailedPrecondition,
    };
    Status::new(code, error.to_string())
}

/// The status for a request tonic would not decode because it exceeds the API's decode limit
/// (tonic reports `OUT_OF_RANGE`): `RESOURCE_EXHAUSTED`, like an input over the dispatch
/// limit, stating that limit. `None` for any other status.
pub(crate) fn oversized_request(status: &Status, max_input: usize) -> Option<Status> {
    let oversized = status.code() == Code::OutOfRange
        && status
            .message()
            .contains("decoded message length too large");
    oversized.then(|| {
        Status::resource_exhausted(format!(
            "request too large for the producer API ({}); an input may be at most {max_input} \
             bytes",
            status.message()
        ))
    })
}

/// The status of a dispatch store's refusal or failure: a bound reached or a full disk is
/// `RESOURCE_EXHAUSTED` with the store's sentence (which names the key), a bad idempotency
/// key `INVALID_ARGUMENT`, a configuration that takes no durable dispatch
/// `FAILED_PRECONDITION` (naming the setting), a store that cannot be read or written
/// `UNAVAILABLE`.
pub(crate) fn store_refusal(error: &DispatchStoreError) -> Status {
    let code = match error {
        DispatchStoreError::QueueFull { .. }
        | DispatchStoreError::StoreFull { .. }
        | DispatchStoreError::DiskFull { .. } => Code::ResourceExhausted,
        DispatchStoreError::InvalidKey { .. } => Code::InvalidArgument,
        DispatchStoreError::Refused { .. } => Code::FailedPrecondition,
        DispatchStoreError::Unavailable { .. } => Code::Unavailable,
        _ => Code::Unavailable,
    };
    Status::new(code, error.to_string())
}

/// The status of a refused durable submission: the refusal of `Dispatch`, or the store's.
pub(crate) fn submit_refusal(error: &SubmitError) -> Status {
    match error {
        SubmitError::Dispatch(error) => refusal(error),
        SubmitError::Store(error) => store_refusal(error),
        other => Status::unavailable(other.to_string()),
    }
}

/// The status of a durable dispatch that could not be read or cancelled: `NOT_FOUND` (also for
/// another principal's id, so existence is not revealed), or the store's failure.
pub(crate) fn lookup_refusal(error: &LookupError) -> Status {
    match error {
        LookupError::NotFound { .. } => Status::not_found(error.to_string()),
        LookupError::Store(error) => store_refusal(error),
        other => Status::unavailable(other.to_string()),
    }
}

/// The dispatch id a producer sent, or `INVALID_ARGUMENT` naming the field.
pub(crate) fn dispatch_id(text: &str) -> Result<DispatchId, Status> {
    if text.is_empty() {
        return Err(Status::invalid_argument("dispatch_id is empty"));
    }
    DispatchId::parse(text).ok_or_else(|| {
        Status::invalid_argument(format!(
            "dispatch_id {text:?} is not a dispatch id (32 lowercase hex digits)"
        ))
    })
}

/// The status of a cancel that found nothing to cancel.
pub(crate) fn cancel_refusal(error: &CancelError) -> Status {
    let code = match error {
        CancelError::NotFound { .. } => Code::NotFound,
        CancelError::NamespaceNotGranted { .. } => Code::PermissionDenied,
        _ => Code::FailedPrecondition,
    };
    Status::new(code, error.to_string())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use switchyard_core::{TransportName, UnservedReason};

    use super::*;

    #[test]
    fn every_outcome_maps_to_its_own_field() {
        use pb::dispatch_outcome::Outcome;
        let cases = [
            ActivityOutcome::Completed(Bytes::from_static(b"out")),
            ActivityOutcome::Failed {
                message: "boom".to_owned(),
                retryable: true,
            },
            ActivityOutcome::TimedOut,
            ActivityOutcome::Cancelled,
            ActivityOutcome::Unserved {
                reason: UnservedReason::Draining,
                detail: "draining: 1 compatible worker(s) are draining".to_owned(),
            },
            ActivityOutcome::TransportLost {
                transport: TransportName::from_static("quic"),
                attempts: 4,
            },
            ActivityOutcome::ShuttingDown,
        ];
        let mapped: Vec<Outcome> = cases
            .into_iter()
            .map(|case| outcome(case).outcome.unwrap())
            .collect();
        assert!(matches!(&mapped[0], Outcome::Completed(c) if c.output == "out"));
        assert!(matches!(&mapped[1], Outcome::Failed(f) if f.message == "boom" && f.retryable));
        assert!(matches!(&mapped[2], Outcome::TimedOut(_)));
        assert!(matches!(&mapped[3], Outcome::Cancelled(_)));
        assert!(matches!(&mapped[4], Outcome::Unserved(u)
            if u.reason == i32::from(pb::UnservedReason::Draining) && u.detail.starts_with("draining")));
        assert!(matches!(&mapped[5], Outcome::TransportLost(t)
            if t.transport == "quic" && t.attempts == 4));
        assert!(matches!(&mapped[6], Outcome::ShuttingDown(_)));
    }

    #[test]
    fn refusals_map_to_statuses_naming_the_problem() {
        let invalid = refusal(&DispatchError::Invalid {
            field: "namespace",
            problem: "empty".to_owned(),
        });
        assert_eq!(invalid.code(), Code::InvalidArgument);
        assert!(invalid.message().contains("namespace"));
        let denied = refusal(&DispatchError::NamespaceNotGranted {
            principal: "p".to_owned(),
            namespace: "ns".to_owned(),
        });
        assert_eq!(denied.code(), Code::PermissionDenied);
        let duplicate = refusal(&DispatchError::DuplicateActivityId {
            namespace: "ns".to_owned(),
            activity_id: "a".to_owned(),
        });
        assert_eq!(duplicate.code(), Code::AlreadyExists);
        let missing = cancel_refusal(&CancelError::NotFound {
            namespace: "ns".to_owned(),
            activity_id: "a".to_owned(),
        });
        assert_eq!(missing.code(), Code::NotFound);
        let too_large = refusal(&DispatchError::InputTooLarge {
            size: 11,
            limit: 10,
        });
        assert_eq!(too_large.code(), Code::ResourceExhausted);
        assert!(too_large.message().contains("limit of 10 bytes"));
    }

    #[test]
    fn store_refusals_are_exhausted_invalid_or_unavailable_with_the_stores_sentence() {
        let queue = store_refusal(&DispatchStoreError::QueueFull {
            namespace: "billing".to_owned(),
            limit: 3,
        });
        assert_eq!(queue.code(), Code::ResourceExhausted);
        assert_eq!(
            queue.message(),
            "`store.max_queued_per_namespace` (3) reached for namespace \"billing\""
        );
        let bytes = store_refusal(&DispatchStoreError::StoreFull { size: 9, limit: 8 });
        assert_eq!(bytes.code(), Code::ResourceExhausted);
        assert!(
            bytes.message().contains("`store.max_bytes` (8)"),
            "{}",
            bytes.message()
        );
        let disk = store_refusal(&DispatchStoreError::DiskFull {
            path: "/data/dispatches.sqlite3".to_owned(),
        });
        assert_eq!(disk.code(), Code::ResourceExhausted);
        assert!(disk.message().contains("/data/dispatches.sqlite3"));
        let key = store_refusal(&DispatchStoreError::InvalidKey {
            problem: "longer than 256 bytes".to_owned(),
        });
        assert_eq!(key.code(), Code::InvalidArgument);
        assert!(key.message().starts_with("idempotency_key"));
        let refused = store_refusal(&DispatchStoreError::Refused {
            setting: "store.backend = \"jetstream\"".to_owned(),
            reason: "in cluster mode".to_owned(),
        });
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(
            refused
                .message()
                .ends_with("set store.backend = \"jetstream\"")
        );
        // Control: a store that fails is not a refusal of the request: UNAVAILABLE, retryable.
        let down = store_refusal(&DispatchStoreError::Unavailable {
            detail: "writer closed".to_owned(),
        });
        assert_eq!(down.code(), Code::Unavailable);
    }

    #[test]
    fn durable_refusals_keep_the_dispatchers_and_the_stores_statuses() {
        let invalid = submit_refusal(&SubmitError::Dispatch(DispatchError::Invalid {
            field: "activity_type",
            problem: "empty".to_owned(),
        }));
        assert_eq!(invalid.code(), Code::InvalidArgument);
        let full = submit_refusal(&SubmitError::Store(DispatchStoreError::QueueFull {
            namespace: "ns".to_owned(),
            limit: 1,
        }));
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert!(full.message().contains("store.max_queued_per_namespace"));
        let id = DispatchId::generate();
        let missing = lookup_refusal(&LookupError::NotFound { id: id.clone() });
        assert_eq!(missing.code(), Code::NotFound);
        assert!(missing.message().contains(id.as_str()));
        let down = lookup_refusal(&LookupError::Store(DispatchStoreError::Unavailable {
            detail: "reader gone".to_owned(),
        }));
        assert_eq!(down.code(), Code::Unavailable);
        // Ids: a well-formed one parses; empty and malformed ones name the field.
        assert_eq!(dispatch_id(id.as_str()).unwrap(), id);
        for bad in ["", "xyz", &"A".repeat(32)] {
            let refused = dispatch_id(bad).unwrap_err();
            assert_eq!(refused.code(), Code::InvalidArgument);
            assert!(
                refused.message().starts_with("dispatch_id"),
                "{}",
                refused.message()
            );
        }
    }

    #[test]
    fn a_durable_request_carries_its_key_and_an_empty_key_is_none() {
        let (request, key) = durable_request(
            pb::DispatchRequest {
                namespace: "ns".to_owned(),
                activity_type: "echo".to_owned(),
                idempotency_key: "order-7".to_owned(),
                ..pb::DispatchRequest::default()
            },
            Duration::from_secs(7),
        );
        assert_eq!(key.as_deref(), Some("order-7"));
        assert_eq!(request.timeout, Duration::from_secs(7));
        let (_, none) = durable_request(pb::DispatchRequest::default(), Duration::from_secs(7));
        assert_eq!(none, None);
    }

    #[test]
    fn a_request_over_the_decode_limit_is_resource_exhausted_naming_the_input_limit() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 9000 bytes, the limit is: 5000 bytes",
        );
        let mapped = oversized_request(&tonic, 4000).expect("recognised");
        assert_eq!(mapped.code(), Code::ResourceExhausted);
        assert!(
            mapped.message().contains("at most 4000 bytes"),
            "{}",
            mapped.message()
        );
        // Control: other statuses, even OUT_OF_RANGE ones, pass through untouched.
        assert!(oversized_request(&Status::out_of_range("seq"), 4000).is_none());
        assert!(oversized_request(&Status::cancelled("gone"), 4000).is_none());
    }

    #[test]
    fn empty_wire_fields_mean_none_and_zero_timeout_means_the_default() {
        let core = request(
            pb::DispatchRequest {
                namespace: "ns".to_owned(),
                activity_type: "echo".to_owned(),
                ..pb::DispatchRequest::default()
            },
            Duration::from_secs(7),
        );
        assert_eq!(core.node, None);
        assert_eq!(core.activity_id, None);
        assert_eq!(core.timeout, Duration::from_secs(7));
        let timed = request(
            pb::DispatchRequest {
                timeout_ms: 250,
                node: "n1".to_owned(),
                ..pb::DispatchRequest::default()
            },
            Duration::from_secs(7),
        );
        assert_eq!(timed.timeout, Duration::from_millis(250));
        assert_eq!(timed.node.as_deref(), Some("n1"));
    }
}
