"""Pure parts without a gateway: backoff, the limiter, the status mapping, options."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from switchyard import Backoff, ConfigError, Connection, NotFound, PermissionDenied, Worker
from switchyard.errors import GatewayError, from_status_number
from switchyard.limiter import Limiter


def test_backoff_doubles_up_to_its_maximum_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(initial=0.1, max=1.0)
    assert [backoff.ceiling(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    rng = random.Random(7)
    delays = [backoff.delay(3, rng) for _ in range(200)]
    assert all(0.4 <= d <= 0.8 for d in delays)
    # Control: the waits are spread, not one value.
    assert max(delays) - min(delays) > 0.2


def test_backoff_refuses_a_zero_initial_wait() -> None:
    with pytest.raises(ConfigError) as error:
        Backoff(initial=0)
    assert error.value.field == "backoff.initial"
    Backoff(initial=0.01)  # control


async def test_the_limiter_admits_up_to_its_limit_and_grows_at_once() -> None:
    limiter = Limiter(2)
    await limiter.acquire()
    await limiter.acquire()
    third = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not third.done(), "a third waits at limit 2"
    limiter.resize(3)
    await asyncio.sleep(0)
    assert third.done() and limiter.held == 3
    limiter.resize(1)
    fourth = asyncio.ensure_future(limiter.acquire())
    limiter.release()
    limiter.release()
    await asyncio.sleep(0)
    assert not fourth.done(), "a shrink holds new ones until below the new limit"
    limiter.release()
    await asyncio.sleep(0)
    assert fourth.done() and limiter.held == 1


def test_a_refusal_number_maps_to_its_exception() -> None:
    assert isinstance(from_status_number(5, "no such dispatch"), NotFound)
    assert isinstance(from_status_number(7, "not granted"), PermissionDenied)
    other = from_status_number(2, "odd")
    assert type(other) is GatewayError and other.code == grpc.StatusCode.UNKNOWN


async def test_worker_options_are_checked_before_dialing() -> None:
    worker = Worker(namespaces=["a"], handle_signals=False)
    with pytest.raises(ConfigError) as missing:
        await worker.run()
    assert missing.value.field == "activity_types"
    worker.register("echo", lambda context, data: data)
    with pytest.raises(ConfigError) as capacity:
        worker.resize(0)
    assert capacity.value.field == "max_concurrency"
    with pytest.raises(ConfigError):
        Connection(client_cert=b"cert")
    with pytest.raises(ConfigError):
        Worker(namespaces="a")  # type: ignore[arg-type]


async def test_a_stop_interrupts_a_connect_that_hangs() -> None:
    dialled = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dialled.set()
        await reader.read()  # accepts and never answers the TLS handshake

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    worker = Worker(
        namespaces=["a"],
        connection=Connection(endpoint=f"127.0.0.1:{port}"),
        connect_timeout=600,
        handle_signals=False,
    )
    worker.register("echo", lambda context, data: data)
    running = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(dialled.wait(), 10)
    assert not running.done(), "control: the connect hangs"
    worker.stop()
    # Far inside the 600 s connect timeout.
    await asyncio.wait_for(running, 10)
    server.close()


def test_every_wire_outcome_has_its_class_and_label() -> None:
    """`docs/python.md`: each outcome on the wire reads as its class, with its label."""
    from switchyard.outcome import (
        Cancelled,
        Completed,
        Failed,
        OtherOutcome,
        ShuttingDown,
        TimedOut,
        TransportLost,
        Unserved,
        from_proto,
    )
    from switchyard.v1 import common_pb2
    from switchyard.v1 import gateway_pb2 as pb

    cases = [
        (pb.DispatchOutcome(completed=pb.DispatchCompleted(output=b"out")), Completed(b"out")),
        (
            pb.DispatchOutcome(failed=common_pb2.Failure(message="bad", retryable=True)),
            Failed("bad", True),
        ),
        (pb.DispatchOutcome(timed_out=pb.DispatchTimedOut()), TimedOut()),
        (pb.DispatchOutcome(cancelled=pb.DispatchCancelled()), Cancelled()),
        (
            pb.DispatchOutcome(
                unserved=pb.DispatchUnserved(
                    reason=pb.UNSERVED_REASON_NO_WORKERS, detail="nobody serves it"
                )
            ),
            Unserved("no_workers", "nobody serves it"),
        ),
        (
            pb.DispatchOutcome(
                transport_lost=pb.DispatchTransportLost(transport="quic", attempts=3)
            ),
            TransportLost("quic", 3),
        ),
        (pb.DispatchOutcome(shutting_down=pb.DispatchShuttingDown()), ShuttingDown()),
        (pb.DispatchOutcome(other=pb.DispatchOtherOutcome(label="later")), OtherOutcome("later")),
    ]
    labels = []
    for wire, expected in cases:
        outcome = from_proto(wire)
        assert outcome == expected, wire
        labels.append(outcome.label)
    assert labels == [
        "completed",
        "failed",
        "timed_out",
        "cancelled",
        "unserved",
        "transport_lost",
        "shutting_down",
        "later",
    ]


def test_every_documented_status_has_its_exception() -> None:
    """`docs/python.md`: every refusal raises the subclass of its status, with the sentence."""
    import switchyard.errors as errors

    documented = [
        "InvalidArgument",
        "Unauthenticated",
        "PermissionDenied",
        "NotFound",
        "AlreadyExists",
        "ResourceExhausted",
        "FailedPrecondition",
        "Unavailable",
        "Aborted",
        "DeadlineExceeded",
    ]
    for name in documented:
        cls = getattr(errors, name)
        error = from_status_number(cls.status.value[0], f"because of {name}")
        assert type(error) is cls, name
        assert error.sentence == f"because of {name}"
