"""Every exception the SDK raises, and the one mapping from a gRPC status to them.

A refusal by the gateway is a `GatewayError` subclass named after its status code, carrying the
gateway's own sentence (`sentence`), which names the field or rule it broke. An activity handler
reports its own failure with `RetryableError` or `FatalError`.
"""

from __future__ import annotations

import grpc


class SwitchyardError(Exception):
    """Base of every error this SDK raises."""


class ConfigError(SwitchyardError, ValueError):
    """A worker or producer option is unusable; nothing was sent."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        #: The option.
        self.field = field
        #: The rule it broke.
        self.reason = reason


class GatewayError(SwitchyardError):
    """The gateway refused a call, or the call failed, with a gRPC status."""

    #: The status code this class stands for (the base class: any other code).
    status: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, sentence: str) -> None:
        super().__init__(f"{sentence} ({code.name})")
        #: The gRPC status code.
        self.code = code
        #: The gateway's sentence, naming the field or rule.
        self.sentence = sentence


class InvalidArgument(GatewayError):
    """A field is empty, too long or malformed; retrying unchanged gets the same answer."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class Unauthenticated(GatewayError):
    """No credential, or one the gateway does not know."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(GatewayError):
    """The caller's principal is not granted the namespace, or its role does not allow it."""

    status = grpc.StatusCode.PERMISSION_DENIED


class NotFound(GatewayError):
    """Nothing matches: no such dispatch in flight, no such worker, a closed namespace."""

    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(GatewayError):
    """A dispatch with the same activity id (or correlation id) is in flight."""

    status = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(GatewayError):
    """A limit or quota was reached; the sentence names the key and its value."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(GatewayError):
    """The gateway's state forbids it now (a pinned namespace, a draining session)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(GatewayError):
    """The gateway cannot be reached, is shutting down, or could not decide; retry later."""

    status = grpc.StatusCode.UNAVAILABLE


class Aborted(GatewayError):
    """The call was ended by a newer one (a resumed session superseding this stream)."""

    status = grpc.StatusCode.ABORTED


class DeadlineExceeded(GatewayError):
    """The call's own deadline passed before the gateway answered."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE: dict[grpc.StatusCode, type[GatewayError]] = {
    cls.status: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        AlreadyExists,
        ResourceExhausted,
        FailedPrecondition,
        Unavailable,
        Aborted,
        DeadlineExceeded,
    )
}
_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def gateway_error(code: grpc.StatusCode, sentence: str) -> GatewayError:
    """The typed exception for a status `code` with the gateway's `sentence`."""
    return _BY_CODE.get(code, GatewayError)(code, sentence)


def from_rpc_error(error: grpc.aio.AioRpcError) -> GatewayError:
    """The typed exception for a failed call."""
    return gateway_error(error.code(), error.details() or "")


def from_status_number(number: int, sentence: str) -> GatewayError:
    """The typed exception for a status given as its number (a `DispatchRefusal.code`)."""
    return gateway_error(_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN), sentence)


class ActivityError(SwitchyardError):
    """Raised by an activity handler: the task failed with this message and retry hint.

    Any other exception a handler raises is reported as a fatal failure named after its type.
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        #: The message given to the producer.
        self.message = message
        #: Whether running the activity again may succeed.
        self.retryable = retryable


class RetryableError(ActivityError):
    """A failure that running the activity again may cure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class FatalError(ActivityError):
    """A failure that running the activity again will not cure."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)
