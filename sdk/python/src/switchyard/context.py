"""What a handler knows about the task it runs, and why a task was cancelled."""

from __future__ import annotations

import datetime
import enum
import threading
from dataclasses import dataclass, field


class CancelReason(enum.Enum):
    """Why a running task was stopped; also the message of the handler's `CancelledError`."""

    #: The producer cancelled the dispatch.
    REQUESTED = "requested"
    #: The dispatch deadline passed.
    DEADLINE_EXCEEDED = "deadline_exceeded"
    #: The gateway is shutting down and its grace ended.
    SHUTTING_DOWN = "shutting_down"
    #: The producer went away.
    CALLER_GONE = "caller_gone"
    #: A drain passed its deadline with the task running.
    DRAIN_DEADLINE = "drain_deadline"
    #: A reason this SDK version does not name.
    UNSPECIFIED = "unspecified"
    #: The worker let go of the task: its connection was lost for good, or it was stopped.
    RELEASED = "released"


@dataclass
class ActivityContext:
    """One delivery of a task: its identity, its deadline and its cancellation.

    A cancelled async handler sees `asyncio.CancelledError` (its message is the reason's value);
    a sync handler, which cannot be interrupted, polls `is_cancelled` or waits on `cancelled`.
    """

    #: The gateway's id for this delivery.
    task_id: int
    #: The namespace the task was dispatched in.
    namespace: str
    #: The task queue the task was dispatched in.
    task_queue: str
    #: The activity type being run.
    activity_type: str
    #: Delivery number: 1, plus one per earlier delivery lost with its worker.
    attempt: int
    #: When the producer stops waiting for the result (UTC).
    deadline: datetime.datetime
    #: Set (from any thread) once the task is cancelled.
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _reason: CancelReason | None = field(default=None, repr=False)

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the task was cancelled; None while it is not."""
        return self._reason

    @property
    def is_cancelled(self) -> bool:
        """True once the task is cancelled."""
        return self.cancelled.is_set()

    def _cancel(self, reason: CancelReason) -> None:
        if self._reason is None:
            self._reason = reason
        self.cancelled.set()
