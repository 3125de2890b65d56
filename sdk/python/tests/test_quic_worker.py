"""`examples/quic_worker.py`, a QUIC worker written from `docs/quic-protocol.md` alone on aioquic
(no Switchyard code), against the real gateway over UDP on loopback: it registers and serves
dispatched tasks, never more at once than the capacity it announced; a task whose deadline
passes is cancelled on its lane, the acknowledgement frees the slot at once; its `drain_request`
ends in `DRAINED`; a session resumed on a new connection (the old one closed `SUPERSEDED`)
carries its running task there and it runs once, and a result sent and never acknowledged is
sent again there; a smaller capacity retires a lane (FIN) and a
larger one opens a new lane; a `register` of another protocol version is closed
`UNSUPPORTED_VERSION`; with datagram copies (section 3.1) each task runs once whichever copy of
a task or a result comes first; a lane the worker stops is `PROTOCOL_VIOLATION` naming it; a
stream opened beyond the one the gateway grants ends the connection with the transport error
`STREAM_LIMIT_ERROR`. Run as its docstring shows, the example serves a dispatch and stops
cleanly on an interrupt. What the document promises a worker in any language."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import pathlib
import re
import signal
import sys
import urllib.request
from collections.abc import Iterator

import pytest
import quic_worker
from conftest import ADMIN_TOKEN, PATIENCE, REPO, Gateway

from switchyard import Completed, Producer, TimedOut
from switchyard.v1 import quic_pb2

NS = "tests"
#: Application codes of section 6.
DRAINED = 0x01
UNSUPPORTED_VERSION = 0x15
SUPERSEDED = 0x2A
PROTOCOL_VIOLATION = 0x10
#: QUIC transport error `STREAM_LIMIT_ERROR` (RFC 9000).
STREAM_LIMIT_ERROR = 0x04
#: `QUIC_CANCEL_REASON_DEADLINE_EXCEEDED`.
DEADLINE_EXCEEDED = 2


@pytest.fixture
def quic_gateway(tmp_path: pathlib.Path) -> Iterator[Gateway]:
    """A running gateway with its QUIC listener, killed when the test ends."""
    running = Gateway(tmp_path, quic=True)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def copying_gateway(tmp_path: pathlib.Path) -> Iterator[Gateway]:
    """A running gateway that sends datagram copies to workers that ask (`quic.redundancy =
    "datagram"`), with `/metrics`; stopped when the test ends."""
    running = Gateway(tmp_path, quic=True, redundancy=True, ops=True)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def register(
    activity: str, version: int = 1, resumable: bool = False, redundancy: bool = False
) -> quic_pb2.QuicRegister:
    return quic_pb2.QuicRegister(
        protocol_version=version,
        resumable=resumable,
        redundancy=quic_pb2.QUIC_REDUNDANCY_DATAGRAM if redundancy else 0,
        namespaces=[NS],
        activity_types=[activity],
        identity="tests/test_quic_worker.py",
        auth_token=ADMIN_TOKEN,
    )


def dial(
    gateway: Gateway, datagrams: bool = False
) -> contextlib.AbstractAsyncContextManager[quic_worker.Worker]:
    """A worker's connection to `gateway`, closed when the block ends."""
    config = quic_worker.configuration(str(gateway.ca), datagrams=datagrams)
    return quic_worker.connected("127.0.0.1", gateway.quic_port, config)


def copies(gateway: Gateway) -> collections.Counter[str]:
    """The gateway's `switchyard_quic_datagram_copies_total`, by `event`."""
    url = f"http://127.0.0.1:{gateway.ops_port}/metrics"
    with urllib.request.urlopen(url, timeout=PATIENCE) as reply:
        text = reply.read().decode()
    found = re.findall(r'^switchyard_quic_datagram_copies_total\{event="(\w+)"\} (\d+)', text, re.M)
    return collections.Counter({event: int(count) for event, count in found})


async def unused(task: quic_pb2.QuicTask) -> bytes:
    """The activity of a worker the test sends no task."""
    raise AssertionError("no task is dispatched to this worker")


async def start_registered(
    worker: quic_worker.Worker, frame: quic_pb2.QuicRegister, handler: quic_worker.Handler
) -> quic_pb2.QuicRegistered:
    """Starts `worker` with `frame` and capacity 1; returns the gateway's `registered`."""
    worker.start(frame, handler, capacity=1)
    return await asyncio.wait_for(asyncio.shield(worker.registered), PATIENCE)


async def closed(worker: quic_worker.Worker) -> quic_worker.Closed:
    return await asyncio.wait_for(asyncio.shield(worker.closed), PATIENCE)


async def test_it_serves_within_its_capacity_and_its_drain_request_ends_drained(
    quic_gateway: Gateway,
) -> None:
    running = 0
    most = 0

    async def slow_echo(task: quic_pb2.QuicTask) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1
        return b"echo:" + task.input

    async with dial(quic_gateway) as worker:
        worker.start(register("slow-echo"), slow_echo, capacity=2)
        registered = await asyncio.wait_for(asyncio.shield(worker.registered), PATIENCE)
        assert registered.task_queue == "default"
        async with Producer(quic_gateway.connection()) as producer:
            inputs = [f"task-{i}".encode() for i in range(6)]
            outcomes = await asyncio.gather(
                *(producer.dispatch(NS, "slow-echo", data, timeout=PATIENCE) for data in inputs)
            )
        assert outcomes == [Completed(b"echo:" + data) for data in inputs]
        # Never beyond the announced capacity; and it did run two at once.
        assert most == 2
        worker.drain()
        ended = await closed(worker)
        assert ended.application and ended.code == DRAINED, ended
        assert worker.drains == [quic_pb2.QUIC_DRAIN_REASON_REQUESTED]


async def test_a_resize_retires_lanes_and_opens_new_ones(quic_gateway: Gateway) -> None:
    running = 0
    most = 0
    #: Set when two tasks run at once; a task waits for it while two are expected.
    pair = asyncio.Event()
    expect_pair = False

    async def slow(task: quic_pb2.QuicTask) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 2:
            pair.set()
        try:
            if expect_pair:
                # Bounded: with one slot only the pair never forms and the task fails.
                await asyncio.wait_for(pair.wait(), PATIENCE / 3)
            else:
                await asyncio.sleep(0.1)
        finally:
            running -= 1
        return task.input

    async def most_at_once(producer: Producer, tasks: int, pairs: bool) -> int:
        nonlocal most, expect_pair
        most, expect_pair = 0, pairs
        pair.clear()
        outcomes = await asyncio.gather(
            *(producer.dispatch(NS, "resize", b"x", timeout=PATIENCE) for _ in range(tasks))
        )
        assert outcomes == [Completed(b"x")] * tasks
        return most

    async with dial(quic_gateway) as worker:
        worker.start(register("resize"), slow, capacity=2)
        await asyncio.wait_for(asyncio.shield(worker.registered), PATIENCE)
        async with Producer(quic_gateway.connection()) as producer:
            assert await most_at_once(producer, 4, pairs=True) == 2
            before = set(worker.lanes)
            # Down to one: the gateway finishes (FIN) the lane above it.
            worker.resize(1)
            await asyncio.wait_for(worker.lane_retired.wait(), PATIENCE)
            assert await most_at_once(producer, 3, pairs=False) == 1
            # Up to two again: a new lane (a new stream), not the retired one.
            worker.resize(2)
            assert await most_at_once(producer, 4, pairs=True) == 2
            assert worker.lanes - before, "the gateway opened a new lane"
            assert set(worker.retired) <= before


async def test_a_resumed_session_carries_its_running_task_to_the_new_connection(
    copying_gateway: Gateway,
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    runs = 0
    task_ids: list[int] = []

    async def held_echo(task: quic_pb2.QuicTask) -> bytes:
        nonlocal runs
        runs += 1
        task_ids.append(task.task_id)
        started.set()
        await release.wait()
        return b"done:" + task.input

    gateway = copying_gateway
    async with dial(gateway, datagrams=True) as first:
        first.start(register("resume", resumable=True, redundancy=True), held_echo, capacity=1)
        registered = await asyncio.wait_for(asyncio.shield(first.registered), PATIENCE)
        assert registered.session_id == registered.worker_id != 0
        assert len(registered.resume_secret) == 32
        async with Producer(gateway.connection()) as producer:
            dispatch = asyncio.create_task(producer.dispatch(NS, "resume", b"x", timeout=PATIENCE))
            try:
                await asyncio.wait_for(started.wait(), PATIENCE)
                # The worker gives up on its connection first (section 5.1, both connections
                # alive): a new one resumes the session while the task still runs.
                async with dial(gateway, datagrams=True) as second:
                    # The held task's result goes as a datagram copy first: the gateway takes
                    # it only if the copy quotes the task's number on its new lane (the held
                    # frame is number 1 there, section 4.3).
                    second.result_copy_first = True
                    second.resume(first.session, ADMIN_TOKEN)
                    resumed = await asyncio.wait_for(asyncio.shield(second.registered), PATIENCE)
                    assert resumed.resumed
                    assert resumed.worker_id == registered.worker_id
                    assert resumed.redundancy == quic_pb2.QUIC_REDUNDANCY_DATAGRAM
                    assert list(resumed.held_task_ids) == task_ids
                    superseded = await closed(first)
                    assert superseded.application and superseded.code == SUPERSEDED, superseded
                    # The task ends now: its result goes out on the lane its `held` frame named.
                    used_before = copies(gateway)["used"]
                    release.set()
                    outcome = await asyncio.wait_for(asyncio.shield(dispatch), PATIENCE)
                    assert outcome == Completed(b"done:x")
                    assert copies(gateway)["used"] == used_before + 1
            finally:
                dispatch.cancel()
    assert runs == 1, "the resumed task was not run again"


async def test_a_result_sent_and_never_acknowledged_is_sent_again_on_the_resumed_connection(
    quic_gateway: Gateway,
) -> None:
    runs = 0

    async def counted_echo(task: quic_pb2.QuicTask) -> bytes:
        nonlocal runs
        runs += 1
        return b"done:" + task.input

    gateway = quic_gateway
    async with dial(gateway) as first:
        # Every result this connection sends is lost on the way: the gateway never has it.
        first.results_lost = True
        registered = await start_registered(
            first, register("unacked", resumable=True), counted_echo
        )
        async with Producer(gateway.connection()) as producer:
            dispatch = asyncio.create_task(producer.dispatch(NS, "unacked", b"y", timeout=PATIENCE))
            try:
                await asyncio.wait_for(first.result_lost.wait(), PATIENCE)
                (kept,) = first.session.tasks.values()
                assert kept.sent and kept.result is not None, "sent, kept until acknowledged"
                assert not dispatch.done(), "the gateway has no result"
                async with dial(gateway) as second:
                    second.resume(first.session, ADMIN_TOKEN)
                    resumed = await asyncio.wait_for(asyncio.shield(second.registered), PATIENCE)
                    assert resumed.resumed and resumed.worker_id == registered.worker_id
                    # Listed as unacknowledged (section 5.1), the gateway still waits on it:
                    assert list(resumed.held_task_ids) == [kept.task_id]
                    # ... and the kept result, sent again on the lane the `held` frame names,
                    # is the dispatch's outcome.
                    outcome = await asyncio.wait_for(asyncio.shield(dispatch), PATIENCE)
                    assert outcome == Completed(b"done:y")
            finally:
                dispatch.cancel()
    assert runs == 1, "the task ran once: its result was sent again, not recomputed"


async def test_a_task_past_its_deadline_is_cancelled_and_the_acknowledgement_frees_its_slot(
    quic_gateway: Gateway,
) -> None:
    never = asyncio.Event()

    async def hang_or_echo(task: quic_pb2.QuicTask) -> bytes:
        if task.input == b"hang":
            await never.wait()
        return task.input

    async with dial(quic_gateway) as worker:
        worker.start(register("hang"), hang_or_echo, capacity=1)
        await asyncio.wait_for(asyncio.shield(worker.registered), PATIENCE)
        async with Producer(quic_gateway.connection()) as producer:
            # A first task waits out the probation: the worker is eligible once it is served,
            # so the next one's 2 s are all spent on the worker.
            assert await producer.dispatch(NS, "hang", b"warm", timeout=PATIENCE) == Completed(
                b"warm"
            )
            assert isinstance(await producer.dispatch(NS, "hang", b"hang", timeout=2), TimedOut)
            # The cancel comes over QUIC, the outcome over gRPC: either may arrive first.
            await asyncio.wait_for(worker.cancel_heard.wait(), PATIENCE)
            assert [reason for _, reason in worker.cancels] == [DEADLINE_EXCEEDED]
            # The one slot is free again once the cancel is acknowledged (a slot whose cancel
            # is never acknowledged stays taken for `dispatch.cancel_ack_timeout`, 30 s).
            after = await producer.dispatch(NS, "hang", b"after", timeout=5)
        assert after == Completed(b"after")


async def test_a_register_of_another_protocol_version_is_closed_unsupported_version(
    quic_gateway: Gateway,
) -> None:
    async with dial(quic_gateway) as worker:
        worker.start(register("echo", version=2), unused, capacity=1)
        ended = await closed(worker)
        assert ended.application and ended.code == UNSUPPORTED_VERSION, ended
        assert "protocol_version 2" in ended.reason
        assert not worker.registered.done()
    # Control: version 1, otherwise the same, is registered.
    async with dial(quic_gateway) as worker:
        await start_registered(worker, register("echo"), unused)


async def test_a_stream_beyond_the_gateways_credit_is_a_stream_limit_error(
    quic_gateway: Gateway,
) -> None:
    async with dial(quic_gateway) as worker:
        await start_registered(worker, register("echo"), unused)
        # The gateway grants one bidirectional stream, the control stream (section 2.2). A QUIC
        # stack keeps to that by itself (aioquic holds a second stream back as blocked), so the
        # test pretends the gateway granted more, to send what a broken stack would.
        assert worker._quic._remote_max_streams_bidi == 1
        worker._quic._remote_max_streams_bidi = 2
        second = worker._quic.get_next_available_stream_id()
        worker._quic.send_stream_data(second, b"\x00\x00\x00\x00")
        worker.transmit()
        ended = await closed(worker)
        assert not ended.application, ended
        assert ended.code == STREAM_LIMIT_ERROR, ended


async def test_a_lane_stopped_by_the_worker_is_a_protocol_violation_naming_it(
    quic_gateway: Gateway,
) -> None:
    async with dial(quic_gateway) as worker:
        await start_registered(worker, register("echo"), unused)
        # Lane 0 (stream 1) shows itself with its first ping.
        await asyncio.wait_for(worker.first_lane.wait(), PATIENCE)
        worker._quic.stop_stream(1, 7)
        worker.transmit()
        # The gateway's next write there (a ping) finds the lane stopped.
        ended = await closed(worker)
        assert ended.application and ended.code == PROTOCOL_VIOLATION, ended
        assert ended.reason == "lane 0 was stopped by the peer (code 7)"


async def test_datagram_copies_run_each_task_once_whichever_copy_arrives_first(
    copying_gateway: Gateway,
) -> None:
    gateway = copying_gateway
    runs: collections.Counter[bytes] = collections.Counter()

    async def counted(task: quic_pb2.QuicTask) -> bytes:
        runs[task.input] += 1
        return task.input

    # Control: a worker that does not ask for copies gets none.
    async with dial(gateway) as plain:
        plain.start(register("plain"), counted, capacity=1)
        registered = await asyncio.wait_for(asyncio.shield(plain.registered), PATIENCE)
        assert registered.redundancy == quic_pb2.QUIC_REDUNDANCY_OFF
    # Results: the datagram copy after the lane copy (as the reference SDK sends them), then
    # before it: the gateway uses the first and drops the other. Tasks: the lane copy first
    # (loopback), then the lane read 100 ms late, as if its packet were lost: the datagram copy
    # starts the task and the lane copy is dropped.
    for copy_first, lane_delay in ((False, 0.0), (True, 0.0), (False, 0.1)):
        async with dial(gateway, datagrams=True) as worker:
            activity = f"copies-{copy_first}-{lane_delay}"
            worker.start(register(activity, redundancy=True), counted, capacity=2)
            worker.result_copy_first = copy_first
            worker.lane_task_delay = lane_delay
            registered = await asyncio.wait_for(asyncio.shield(worker.registered), PATIENCE)
            assert registered.redundancy == quic_pb2.QUIC_REDUNDANCY_DATAGRAM
            before = copies(gateway)
            inputs = [f"{activity}-{i}".encode() for i in range(20)]
            async with Producer(gateway.connection()) as producer:
                outcomes = await asyncio.gather(
                    *(producer.dispatch(NS, activity, data, timeout=PATIENCE) for data in inputs)
                )
            assert outcomes == [Completed(data) for data in inputs]
            # Each task's second copy, whichever it is, is dropped; the datagram copies leave 5
            # ms after their lane copies, so the last may still be on the way now.
            while worker.copies_dropped < len(inputs):
                worker.copy_heard.clear()
                await asyncio.wait_for(worker.copy_heard.wait(), PATIENCE)
            # Each task ran once though both its copies came, by datagram and by lane.
            assert all(runs[data] == 1 for data in inputs), runs
            if lane_delay:
                assert worker.started_by_datagram > 0, "no datagram copy came first"
            # The gateway sent a copy of every task, and used the worker's result copies that
            # came first (they quote the right lane and number) and dropped their lane copies.
            after = copies(gateway)
            assert after["sent"] - before["sent"] >= len(inputs)
            if copy_first:
                used = after["used"] - before["used"]
                assert used > 0, (before, after)
                # Each used copy's lane copy follows 5 ms later and is dropped, never applied.
                deadline = asyncio.get_running_loop().time() + PATIENCE
                while (dropped := copies(gateway)["lane_copy_dropped"]) - before[
                    "lane_copy_dropped"
                ] < used:
                    assert asyncio.get_running_loop().time() < deadline, (used, dropped)
                    await asyncio.sleep(0.01)
                assert dropped - before["lane_copy_dropped"] == used
            assert not worker.closed.done(), "the gateway took every copy without a close"


async def test_the_example_runs_as_its_docstring_shows(quic_gateway: Gateway) -> None:
    example = REPO / "sdk" / "python" / "examples" / "quic_worker.py"
    env = {**os.environ, "PYTHONPATH": str(REPO / "sdk" / "python" / "src")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(example),
        "--gateway",
        f"127.0.0.1:{quic_gateway.quic_port}",
        "--ca",
        str(quic_gateway.ca),
        "--namespace",
        NS,
        "--activity",
        "echo",
        "--token",
        ADMIN_TOKEN,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), PATIENCE)
        assert line.decode().startswith("registered as worker "), line
        async with Producer(quic_gateway.connection()) as producer:
            assert await producer.dispatch(NS, "echo", b"hi", timeout=PATIENCE) == Completed(b"hi")
        # Interrupted, it stops cleanly.
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), PATIENCE) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
