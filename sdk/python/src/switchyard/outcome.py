"""A dispatch's one outcome, as plain typed values (match on the class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .v1 import gateway_pb2


@dataclass(frozen=True)
class Completed:
    """The activity returned output."""

    label: ClassVar[str] = "completed"
    #: The bytes the activity returned.
    output: bytes


@dataclass(frozen=True)
class Failed:
    """The activity reported a failure."""

    label: ClassVar[str] = "failed"
    #: The activity's message.
    message: str
    #: Whether the activity judged that running it again may succeed.
    retryable: bool


@dataclass(frozen=True)
class TimedOut:
    """The deadline passed while a worker held the task."""

    label: ClassVar[str] = "timed_out"


@dataclass(frozen=True)
class Cancelled:
    """The dispatch was cancelled."""

    label: ClassVar[str] = "cancelled"


@dataclass(frozen=True)
class Unserved:
    """No worker could take the task before its deadline."""

    label: ClassVar[str] = "unserved"
    #: The `UnservedReason` name, lowercase without its prefix (`no_workers`, ...).
    reason: str
    #: The operator sentence, with the numbers behind it.
    detail: str


@dataclass(frozen=True)
class TransportLost:
    """Workers holding the task were lost more often than the loss budget allows."""

    label: ClassVar[str] = "transport_lost"
    #: Transport of the last worker lost.
    transport: str
    #: Deliveries made.
    attempts: int


@dataclass(frozen=True)
class ShuttingDown:
    """The gateway is shutting down and did not run (or finish) the task; retry elsewhere."""

    label: ClassVar[str] = "shutting_down"


@dataclass(frozen=True)
class OtherOutcome:
    """An outcome this SDK version has no class for."""

    #: The gateway's label for it.
    label: str


#: Every outcome a dispatch can end with.
Outcome = (
    Completed
    | Failed
    | TimedOut
    | Cancelled
    | Unserved
    | TransportLost
    | ShuttingDown
    | OtherOutcome
)


def unserved_reason(value: int) -> str:
    """`UNSERVED_REASON_NO_WORKERS` → `no_workers`."""
    name: str = gateway_pb2.UnservedReason.Name(value)
    return name.removeprefix("UNSERVED_REASON_").lower()


def from_proto(outcome: gateway_pb2.DispatchOutcome) -> Outcome:
    """The typed value of a wire outcome."""
    kind = outcome.WhichOneof("outcome")
    if kind == "completed":
        return Completed(bytes(outcome.completed.output))
    if kind == "failed":
        return Failed(outcome.failed.message, outcome.failed.retryable)
    if kind == "timed_out":
        return TimedOut()
    if kind == "cancelled":
        return Cancelled()
    if kind == "unserved":
        return Unserved(unserved_reason(outcome.unserved.reason), outcome.unserved.detail)
    if kind == "transport_lost":
        lost = outcome.transport_lost
        return TransportLost(lost.transport, lost.attempts)
    if kind == "shutting_down":
        return ShuttingDown()
    if kind == "other":
        return OtherOutcome(outcome.other.label)
    return OtherOutcome("unset")
