"""Pure parts without a gateway: backoff, the limiter, the status mapping, options, and which
datagram copies of a task `examples/quic_worker.py` starts (fed its QUIC events directly)."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
import quic_worker
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import DatagramFrameReceived, StreamDataReceived
from google.protobuf.message import Message

from switchyard import Backoff, ConfigError, Connection, NotFound, PermissionDenied, Worker
from switchyard.errors import GatewayError, from_status_number
from switchyard.limiter import Limiter
from switchyard.v1 import quic_pb2


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


class Gated:
    """An activity whose tasks each run until the test opens their gate; it records the ids of
    the tasks it ran, in order."""

    def __init__(self) -> None:
        self.ran: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}

    async def __call__(self, task: quic_pb2.QuicTask) -> bytes:
        self.ran.append(task.task_id)
        await self.gates.setdefault(task.task_id, asyncio.Event()).wait()
        return task.input

    async def finish(self, worker: quic_worker.Worker, task_id: int) -> None:
        """Opens `task_id`'s gate and waits until the worker has answered it."""
        runner = worker.session.tasks[task_id].runner
        assert runner is not None
        self.gates.setdefault(task_id, asyncio.Event()).set()
        await asyncio.wait_for(runner, 10)


def copying_worker(activity: Gated) -> tuple[quic_worker.Worker, list[tuple[int, Message]]]:
    """A QUIC worker with datagram copies in force and no socket, as after a `registered`
    granting them; what it sends is recorded as (stream, envelope) instead."""
    worker = quic_worker.Worker(QuicConnection(configuration=QuicConfiguration(is_client=True)))
    asked = quic_pb2.QUIC_REDUNDANCY_DATAGRAM
    worker.session = quic_worker.Session(activity, 2, resumable=False, redundancy=asked)
    worker.session.connection = worker
    worker.redundancy = True
    sent: list[tuple[int, Message]] = []

    def record(stream: int, envelope: Message) -> None:
        sent.append((stream, envelope))

    worker._send = record  # type: ignore[method-assign]
    worker._send_datagram = lambda copy: record(-1, copy)  # type: ignore[method-assign]
    return worker, sent


def on_lane(worker: quic_worker.Worker, lane: int, down: quic_pb2.QuicLaneDown) -> None:
    """`down` read on lane `lane` (stream id 4 * lane + 1), as one frame."""
    data = quic_worker.frame(down)
    worker.quic_event_received(
        StreamDataReceived(data=data, end_stream=False, stream_id=4 * lane + 1)
    )


def task_frame(task_id: int) -> quic_pb2.QuicLaneDown:
    return quic_pb2.QuicLaneDown(task=quic_pb2.QuicTask(task_id=task_id, input=b"in"))


def datagram(lane: int, seq: int, task_id: int) -> DatagramFrameReceived:
    """A datagram copy of task `task_id`, number `seq` on lane `lane`."""
    task = quic_pb2.QuicTask(task_id=task_id, input=b"in")
    copy = quic_pb2.QuicDatagramDown(lane=lane, seq=seq, task=task)
    return DatagramFrameReceived(data=copy.SerializeToString())


async def test_a_task_copy_for_a_lane_no_frame_arrived_on_is_dropped() -> None:
    """`docs/quic-protocol.md` 3.1: a datagram for a lane the worker has not seen is dropped."""
    activity = Gated()
    worker, _ = copying_worker(activity)
    copy = datagram(lane=0, seq=1, task_id=7)
    worker.quic_event_received(copy)
    assert worker.copies_dropped == 1
    assert worker.started_by_datagram == 0 and 7 not in worker.session.tasks
    # Control: once a frame (a ping) has arrived on the lane, left idle, the same copy, the
    # next number there, starts its task.
    on_lane(worker, 0, quic_pb2.QuicLaneDown(ping=quic_pb2.QuicPing(seq=1)))
    worker.quic_event_received(copy)
    assert worker.started_by_datagram == 1 and 7 in worker.session.tasks
    assert worker.copies_dropped == 1
    # Its lane copy, arriving second, is dropped: the task runs once.
    on_lane(worker, 0, task_frame(7))
    assert worker.copies_dropped == 2
    await activity.finish(worker, 7)
    assert activity.ran == [7]


async def test_a_task_copy_for_a_lane_whose_task_still_runs_is_dropped() -> None:
    """`docs/quic-protocol.md` 3.1: a datagram for a lane whose task is still running is dropped,
    even with the next number; the lane copy brings the task."""
    activity = Gated()
    worker, sent = copying_worker(activity)
    on_lane(worker, 0, task_frame(1))
    assert 1 in worker.session.tasks
    copy = datagram(lane=0, seq=2, task_id=2)
    worker.quic_event_received(copy)
    assert worker.copies_dropped == 1
    assert worker.started_by_datagram == 0 and 2 not in worker.session.tasks
    await activity.finish(worker, 1)
    assert [up.result.task_id for _, up in sent if up.WhichOneof("frame") == "result"] == [1]
    # Control: the same copy, once the lane's task has ended, starts its task.
    worker.quic_event_received(copy)
    assert worker.started_by_datagram == 1 and 2 in worker.session.tasks
    assert worker.copies_dropped == 1
    await activity.finish(worker, 2)
    assert activity.ran == [1, 2]


async def test_a_task_copy_with_a_number_already_started_or_past_the_next_is_dropped() -> None:
    """`docs/quic-protocol.md` 3.1: on an idle lane a copy starts its task only when its number
    is the highest started + 1."""
    activity = Gated()
    worker, _ = copying_worker(activity)
    on_lane(worker, 0, task_frame(1))
    await activity.finish(worker, 1)
    stale, skipping, following = datagram(0, 1, 1), datagram(0, 3, 3), datagram(0, 2, 2)
    worker.quic_event_received(stale)
    worker.quic_event_received(skipping)
    assert worker.copies_dropped == 2 and worker.started_by_datagram == 0
    assert worker.session.tasks == {}
    # Control: on the same idle lane, number 2 starts its task.
    worker.quic_event_received(following)
    assert worker.started_by_datagram == 1 and 2 in worker.session.tasks
    assert worker.copies_dropped == 2
    await activity.finish(worker, 2)
    assert activity.ran == [1, 2]
