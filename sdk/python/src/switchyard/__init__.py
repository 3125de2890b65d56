"""Switchyard workers and producers for asyncio.

A `Worker` registers with a gateway over gRPC and runs the activities it serves; a `Producer`
dispatches activities and asks about pools and workers. Both reach the gateway through a
`Connection` (endpoint, CA, token or client certificate). Wire types are in `switchyard.v1`.

Example::

    import asyncio
    from switchyard import ActivityContext, Connection, Worker

    worker = Worker(namespaces=["demo"], connection=Connection(ca="ca.pem"))

    @worker.activity("echo")
    async def echo(context: ActivityContext, data: bytes) -> bytes:
        return data

    asyncio.run(worker.run())
"""

from .backoff import Backoff
from .connection import Connection
from .context import ActivityContext, CancelReason
from .errors import (
    Aborted,
    ActivityError,
    AlreadyExists,
    ConfigError,
    DeadlineExceeded,
    FailedPrecondition,
    FatalError,
    GatewayError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RetryableError,
    SwitchyardError,
    Unauthenticated,
    Unavailable,
)
from .outcome import (
    Cancelled,
    Completed,
    Failed,
    OtherOutcome,
    Outcome,
    ShuttingDown,
    TimedOut,
    TransportLost,
    Unserved,
)
from .producer import DispatchRequest, DispatchResult, Producer, Submitted
from .worker import Worker

__all__ = [
    "Aborted",
    "ActivityContext",
    "ActivityError",
    "AlreadyExists",
    "Backoff",
    "CancelReason",
    "Cancelled",
    "Completed",
    "ConfigError",
    "Connection",
    "DeadlineExceeded",
    "DispatchRequest",
    "DispatchResult",
    "Failed",
    "FailedPrecondition",
    "FatalError",
    "GatewayError",
    "InvalidArgument",
    "NotFound",
    "OtherOutcome",
    "Outcome",
    "PermissionDenied",
    "Producer",
    "ResourceExhausted",
    "RetryableError",
    "ShuttingDown",
    "Submitted",
    "SwitchyardError",
    "TimedOut",
    "TransportLost",
    "Unauthenticated",
    "Unavailable",
    "Unserved",
    "Worker",
]
