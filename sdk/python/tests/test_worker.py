"""The worker against the real gateway: registration, round trips, failures, the concurrency
bound, cancellation, drains, a gateway restart, and a frozen worker replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from conftest import PATIENCE, Gateway, WorkerProcess

from switchyard import (
    ActivityContext,
    Backoff,
    Cancelled,
    CancelReason,
    Completed,
    Failed,
    FatalError,
    Outcome,
    Producer,
    RetryableError,
    TimedOut,
    Worker,
)
from switchyard.v1 import gateway_pb2, worker_pb2

NS = "tests"


def new_worker(gateway: Gateway, **options: object) -> Worker:
    """A worker in namespace `tests` with fast reconnects and no signal handling."""
    return Worker(
        namespaces=[NS],
        connection=gateway.connection(),
        backoff=Backoff(initial=0.05, max=0.5),
        handle_signals=False,
        **options,  # type: ignore[arg-type]
    )


async def eventually(check: object, what: str, timeout: float = PATIENCE) -> None:
    """Polls an async predicate every 50 ms until it holds, failing after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_registration_is_listed_with_its_capacity(
    gateway: Gateway, producer: Producer
) -> None:
    assert await producer.list_workers(namespace=NS) == [], "control: no worker before the start"
    worker = new_worker(gateway, task_queue="q1", node="n1", max_concurrency=7)
    worker.register("echo", lambda context, data: data)
    async with worker.serving():
        listed = await producer.list_workers(namespace=NS)
        assert [w.worker_id for w in listed] == [worker.worker_id]
        info = listed[0]
        assert list(info.namespaces) == [NS]
        assert (info.task_queue, info.node) == ("q1", "n1")
        assert list(info.activity_types) == ["echo"]
        assert info.HasField("capacity") and info.capacity == 7
        assert info.transport == "grpc"
    await eventually(lambda: _no_workers(producer), "the stopped worker leaves the gateway")


async def _no_workers(producer: Producer) -> bool:
    return await producer.list_workers(namespace=NS) == []


async def test_round_trip_of_empty_binary_and_one_mib_payloads(
    gateway: Gateway, producer: Producer
) -> None:
    worker = new_worker(gateway)

    @worker.activity("wrap")
    async def wrap(context: ActivityContext, data: bytes) -> bytes:
        return b"<" + data + b">"

    payloads = [b"", bytes(range(256)) * 4, bytes((i * 7) % 256 for i in range(1 << 20))]
    async with worker.serving():
        for payload in payloads:
            outcome = await producer.dispatch(NS, "wrap", payload, timeout=PATIENCE)
            # Control: the output differs from the input, so the handler ran on these bytes.
            assert outcome == Completed(b"<" + payload + b">"), len(payload)


async def test_failures_carry_the_retryable_flag(gateway: Gateway, producer: Producer) -> None:
    worker = new_worker(gateway)

    @worker.activity("fail")
    async def fail(context: ActivityContext, data: bytes) -> bytes:
        if data == b"retry":
            raise RetryableError("the bank is busy")
        if data == b"fatal":
            raise FatalError("no such account")
        raise ValueError("bad input")

    async with worker.serving():
        retry = await producer.dispatch(NS, "fail", b"retry", timeout=PATIENCE)
        fatal = await producer.dispatch(NS, "fail", b"fatal", timeout=PATIENCE)
        bug = await producer.dispatch(NS, "fail", b"other", timeout=PATIENCE)
    assert retry == Failed("the bank is busy", True)
    assert fatal == Failed("no such account", False), "control: the flag follows the error"
    assert bug == Failed("ValueError: bad input", False)


class Peak:
    """Counts tasks inside a handler and the most at once (thread-safe)."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


async def test_fifty_concurrent_dispatches_never_exceed_max_concurrency(
    gateway: Gateway, producer: Producer
) -> None:
    peak = Peak()
    worker = new_worker(gateway, max_concurrency=5)

    @worker.activity("slow")
    async def slow(context: ActivityContext, data: bytes) -> bytes:
        peak.enter()
        try:
            await asyncio.sleep(0.05)
        finally:
            peak.leave()
        return data

    async with worker.serving():
        outcomes = await asyncio.gather(
            *(producer.dispatch(NS, "slow", b"%d" % i, timeout=PATIENCE) for i in range(50))
        )
    assert outcomes == [Completed(b"%d" % i) for i in range(50)]
    # Control: the bound is reached, so the tasks did run concurrently up to it.
    assert peak.most == 5


async def test_sync_handlers_run_in_threads_under_the_same_bound(
    gateway: Gateway, producer: Producer
) -> None:
    peak = Peak()
    threads: set[int] = set()
    worker = new_worker(gateway, max_concurrency=4)

    @worker.activity("blocking")
    def blocking(context: ActivityContext, data: bytes) -> bytes:
        peak.enter()
        threads.add(threading.get_ident())
        try:
            time.sleep(0.05)
        finally:
            peak.leave()
        return data

    async with worker.serving():
        outcomes = await asyncio.gather(
            *(producer.dispatch(NS, "blocking", b"x", timeout=PATIENCE) for _ in range(50))
        )
    assert all(outcome == Completed(b"x") for outcome in outcomes)
    assert peak.most == 4
    assert threading.get_ident() not in threads, "control: not run on the event loop's thread"


async def test_a_cancel_reaches_the_handler_as_cancelled_error(
    gateway: Gateway, producer: Producer
) -> None:
    started = asyncio.Event()
    seen: list[tuple[str, CancelReason | None, str]] = []
    worker = new_worker(gateway)

    @worker.activity("wait")
    async def wait(context: ActivityContext, data: bytes) -> bytes:
        started.set()
        try:
            await asyncio.sleep(0 if data == b"quick" else PATIENCE)
        except asyncio.CancelledError as cancelled:
            seen.append(("cancelled", context.cancel_reason, str(cancelled)))
            raise
        seen.append(("finished", context.cancel_reason, ""))
        return data

    async with worker.serving():
        dispatch = asyncio.ensure_future(
            producer.dispatch(NS, "wait", b"long", activity_id="job-1", timeout=PATIENCE)
        )
        await asyncio.wait_for(started.wait(), PATIENCE)
        await producer.cancel(NS, "job-1")
        outcome = await asyncio.wait_for(dispatch, PATIENCE)
        # Control: a task nobody cancels finishes and sees no cancel.
        quick = await producer.dispatch(NS, "wait", b"quick", timeout=PATIENCE)
    assert outcome == Cancelled()
    assert quick == Completed(b"quick")
    assert seen == [
        ("cancelled", CancelReason.REQUESTED, "requested"),
        ("finished", None, ""),
    ]


async def test_a_sync_handler_sees_its_cancel_and_keeps_its_slot_until_it_returns(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Cancellation: a sync handler cannot be interrupted; it sees the cancel
    on `context.cancelled` (a `threading.Event`) and `context.is_cancelled`, and keeps its slot
    until it returns: the next task waits for it."""
    saw_cancel = threading.Event()
    let_go = threading.Event()
    seen: list[tuple[bool, CancelReason | None]] = []
    worker = new_worker(gateway, max_concurrency=1)

    @worker.activity("sync-wait")
    def sync_wait(context: ActivityContext, data: bytes) -> bytes:
        if data == b"next":
            return b"next"
        assert context.cancelled.wait(PATIENCE)
        seen.append((context.is_cancelled, context.cancel_reason))
        saw_cancel.set()
        let_go.wait(PATIENCE)
        return b"too late"

    loop = asyncio.get_running_loop()
    async with worker.serving():
        outcome = await producer.dispatch(NS, "sync-wait", b"slow", timeout=0.3)
        assert isinstance(outcome, TimedOut), outcome
        assert await loop.run_in_executor(None, saw_cancel.wait, PATIENCE)
        assert seen == [(True, CancelReason.DEADLINE_EXCEEDED)]
        following = asyncio.ensure_future(
            producer.dispatch(NS, "sync-wait", b"next", timeout=PATIENCE)
        )

        async def held() -> bool:
            (listed,) = await producer.list_workers(namespace=NS)
            return listed.in_flight == 1

        # The cancelled handler still runs: its slot is not free for the next task.
        await eventually(held, "the cancelled task holds the slot")
        done, _ = await asyncio.wait({following}, timeout=0.5)
        assert not done, "the next task ran while the cancelled handler held the slot"
        let_go.set()
        assert await asyncio.wait_for(following, PATIENCE) == Completed(b"next")


async def test_an_operator_drain_finishes_in_flight_work_and_the_worker_leaves(
    gateway: Gateway, producer: Producer
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    worker = new_worker(gateway)

    @worker.activity("held")
    async def held(context: ActivityContext, data: bytes) -> bytes:
        started.set()
        await asyncio.wait_for(release.wait(), PATIENCE)
        return b"done"

    running = asyncio.ensure_future(worker.run())
    worker_id = await worker.wait_registered(PATIENCE)
    dispatch = asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE))
    await asyncio.wait_for(started.wait(), PATIENCE)
    progress = producer.drain(worker_id=worker_id)
    first = await asyncio.wait_for(progress.__anext__(), PATIENCE)
    assert first.tasks_remaining == 1 and not first.done
    # Control: while its task runs, the drained worker is still there.
    assert not running.done()
    release.set()
    assert await asyncio.wait_for(dispatch, PATIENCE) == Completed(b"done")
    await asyncio.wait_for(running, PATIENCE)
    rest = [update async for update in progress]
    assert rest[-1].done and rest[-1].workers_left == 1
    assert await producer.list_workers(namespace=NS) == []


async def test_a_drain_by_node_with_a_deadline_cancels_what_is_left_and_spares_other_nodes(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, A producer: `drain(node=..., deadline=...)` drains every worker with the
    node label; tasks still running at the deadline end `Cancelled` and their handlers get the
    cancel. A worker on another node keeps its task and its registration."""
    started: asyncio.Queue[str] = asyncio.Queue()
    cancels: list[str] = []

    def labelled(node: str) -> Worker:
        worker = new_worker(gateway, node=node, max_concurrency=1)

        @worker.activity("held")
        async def held(context: ActivityContext, data: bytes) -> bytes:
            started.put_nowait(node)
            try:
                await asyncio.sleep(PATIENCE)
            except asyncio.CancelledError:
                cancels.append(node)
                raise
            return b"late"

        return worker

    workers = [labelled("edge-1"), labelled("edge-1"), labelled("edge-2")]
    runs = [asyncio.ensure_future(worker.run()) for worker in workers]
    for worker in workers:
        await worker.wait_registered(PATIENCE)
    calls = [
        asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE)) for _ in workers
    ]
    nodes = sorted([await asyncio.wait_for(started.get(), PATIENCE) for _ in workers])
    assert nodes == ["edge-1", "edge-1", "edge-2"]
    progress = await asyncio.wait_for(
        _collect(producer.drain(node="edge-1", deadline=0.5)), PATIENCE
    )
    assert progress[0].tasks_remaining == 2 and not progress[0].done
    last = progress[-1]
    assert last.done and last.cancelled_at_deadline == 2 and last.workers_left == 2, last
    await asyncio.wait_for(asyncio.gather(*runs[:2]), PATIENCE)
    assert sorted(cancels) == ["edge-1", "edge-1"]

    async def two_ended() -> bool:
        return sum(call.done() for call in calls) >= 2

    await eventually(two_ended, "the two calls cancelled at the deadline end")
    ended = [call for call in calls if call.done()]
    assert len(ended) == 2 and all(isinstance(call.result(), Cancelled) for call in ended)
    # Control: the worker on edge-2 is still registered with its task, which still runs.
    (listed,) = await producer.list_workers(namespace=NS)
    assert listed.node == "edge-2" and listed.in_flight == 1
    assert not runs[2].done()
    workers[2].stop()
    await asyncio.wait_for(runs[2], PATIENCE)
    for call in calls:
        call.cancel()


async def _collect(
    progress: AsyncIterator[gateway_pb2.DrainProgress],
) -> list[gateway_pb2.DrainProgress]:
    return [update async for update in progress]


async def test_a_worker_drained_by_itself_finishes_its_task_and_leaves(
    gateway: Gateway, producer: Producer
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    worker = new_worker(gateway)

    @worker.activity("held")
    async def held(context: ActivityContext, data: bytes) -> bytes:
        started.set()
        await asyncio.wait_for(release.wait(), PATIENCE)
        return b"done"

    running = asyncio.ensure_future(worker.run())
    await worker.wait_registered(PATIENCE)
    dispatch = asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE))
    await asyncio.wait_for(started.wait(), PATIENCE)
    worker.drain()

    async def draining() -> bool:
        listed = await producer.list_workers(namespace=NS)
        return bool(listed) and listed[0].eligibility == gateway_pb2.ELIGIBILITY_DRAINING

    await eventually(draining, "the gateway sees the worker draining")
    assert not running.done(), "control: the worker waits for its task"
    release.set()
    assert await asyncio.wait_for(dispatch, PATIENCE) == Completed(b"done")
    await asyncio.wait_for(running, PATIENCE)
    assert await producer.list_workers(namespace=NS) == []


async def test_the_worker_survives_a_gateway_restart(gateway: Gateway) -> None:
    worker = new_worker(gateway)
    worker.register("echo", lambda context, data: data)
    async with worker.serving():
        async with Producer(gateway.connection()) as producer:
            assert await producer.dispatch(NS, "echo", b"one", timeout=PATIENCE) == Completed(
                b"one"
            )
        await asyncio.get_running_loop().run_in_executor(None, gateway.stop)
        # Control: with the gateway gone the worker is not registered.
        await eventually(lambda: _async(worker.worker_id is None), "the worker notices")
        await asyncio.get_running_loop().run_in_executor(None, gateway.start)
        await worker.wait_registered(PATIENCE)
        # A new registration (ids restart with the gateway process), not a resume.
        assert worker.registrations == 2
        async with Producer(gateway.connection()) as producer:
            assert await producer.dispatch(NS, "echo", b"two", timeout=PATIENCE) == Completed(
                b"two"
            )


async def _async(value: bool) -> bool:
    return value


async def test_a_frozen_worker_is_replaced(
    gateway: Gateway, producer: Producer, worker_processes: list[WorkerProcess]
) -> None:
    frozen = WorkerProcess(gateway, "A")
    worker_processes.append(frozen)
    frozen_id = int(frozen.line().split()[1])
    worker = new_worker(gateway)
    worker.register("whoami", lambda context, data: b"B")
    async with worker.serving():

        async def both_eligible() -> bool:
            listed = await producer.list_workers(namespace=NS)
            return len(listed) == 2 and all(
                w.eligibility == gateway_pb2.ELIGIBILITY_ELIGIBLE for w in listed
            )

        await eventually(both_eligible, "both workers eligible")
        before = [await producer.dispatch(NS, "whoami", timeout=PATIENCE) for _ in range(6)]
        # Control: the worker about to freeze was serving.
        assert Completed(b"A") in before and Completed(b"B") in before
        frozen.process.send_signal(signal.SIGSTOP)

        async def frozen_excluded() -> bool:
            listed = {w.worker_id: w for w in await producer.list_workers(namespace=NS)}
            return (
                frozen_id not in listed
                or listed[frozen_id].eligibility != gateway_pb2.ELIGIBILITY_ELIGIBLE
            )

        await eventually(frozen_excluded, "the frozen worker is excluded")
        after = await asyncio.gather(
            *(producer.dispatch(NS, "whoami", timeout=PATIENCE) for _ in range(6))
        )
        assert after == [Completed(b"B")] * 6
        frozen.process.send_signal(signal.SIGCONT)


async def test_pings_are_answered_while_every_handler_is_busy(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Liveness: the runtime answers pings independently of the handlers. Both
    slots are held (one async handler awaiting, one sync handler blocked in its thread) for
    four ping timeouts of the test gateway (200 ms pings, 500 ms timeout); a worker whose pings
    went unanswered would read `unreachable`, as `test_a_frozen_worker_is_replaced` shows."""
    release = asyncio.Event()
    unblock = threading.Event()
    started: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    worker = new_worker(gateway, max_concurrency=2)

    @worker.activity("wait-async")
    async def wait_async(context: ActivityContext, data: bytes) -> bytes:
        started.put_nowait("async")
        await release.wait()
        return data

    @worker.activity("wait-sync")
    def wait_sync(context: ActivityContext, data: bytes) -> bytes:
        loop.call_soon_threadsafe(started.put_nowait, "sync")
        unblock.wait(PATIENCE)
        return data

    async with worker.serving():
        calls = [
            asyncio.ensure_future(producer.dispatch(NS, "wait-async", b"a", timeout=PATIENCE)),
            asyncio.ensure_future(producer.dispatch(NS, "wait-sync", b"s", timeout=PATIENCE)),
        ]
        seen = {await asyncio.wait_for(started.get(), PATIENCE) for _ in range(2)}
        assert seen == {"async", "sync"}
        readings = []
        window_ends = time.monotonic() + 4 * 0.5
        while time.monotonic() < window_ends:
            (listed,) = await producer.list_workers(namespace=NS)
            readings.append(listed.eligibility)
            await asyncio.sleep(0.1)
        assert len(readings) >= 10
        assert set(readings) == {gateway_pb2.ELIGIBILITY_AT_CAPACITY}, readings
        release.set()
        unblock.set()
        outcomes = await asyncio.gather(*calls)
    assert outcomes == [Completed(b"a"), Completed(b"s")]


async def test_stop_lets_go_of_the_held_task_and_the_gateway_runs_it_again(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Drain and stop: `worker.stop()` leaves at once, letting go of the tasks
    it holds, and the gateway dispatches them again (the next worker sees attempt 2)."""
    never = asyncio.Event()
    first_started = asyncio.Event()
    attempts: list[tuple[str, int]] = []
    first = new_worker(gateway, max_concurrency=1)

    @first.activity("held")
    async def held(context: ActivityContext, data: bytes) -> bytes:
        attempts.append(("first", context.attempt))
        first_started.set()
        await never.wait()
        return b"first"

    second = new_worker(gateway, max_concurrency=1)

    @second.activity("held")
    async def again(context: ActivityContext, data: bytes) -> bytes:
        attempts.append(("second", context.attempt))
        return b"second"

    running = asyncio.ensure_future(first.run())
    await first.wait_registered(PATIENCE)
    call = asyncio.ensure_future(producer.dispatch(NS, "held", b"x", timeout=PATIENCE))
    await asyncio.wait_for(first_started.wait(), PATIENCE)
    first.stop()
    await asyncio.wait_for(running, PATIENCE)
    # Control: the held task was not answered; it waits for a worker.
    assert not call.done()
    async with second.serving():
        outcome = await asyncio.wait_for(call, PATIENCE)
    assert outcome == Completed(b"second")
    assert attempts == [("first", 1), ("second", 2)]


async def child_holding_a_task(
    gateway: Gateway,
    producer: Producer,
    worker_processes: list[WorkerProcess],
    *args: str,
) -> tuple[WorkerProcess, asyncio.Future[Outcome]]:
    """A `worker_process.py` child (`args` after its gateway) holding one `whoami` task, and
    the producer's call for it."""
    child = WorkerProcess(gateway, *args)
    worker_processes.append(child)
    assert child.line().startswith("registered")
    dispatch = asyncio.ensure_future(producer.dispatch(NS, "whoami", timeout=PATIENCE))

    async def holding() -> bool:
        listed = await producer.list_workers(namespace=NS)
        return bool(listed) and listed[0].in_flight == 1

    await eventually(holding, "the child holds the task")
    return child, dispatch


async def test_sigterm_finishes_the_task_in_flight_then_exits(
    gateway: Gateway, producer: Producer, worker_processes: list[WorkerProcess]
) -> None:
    child, dispatch = await child_holding_a_task(gateway, producer, worker_processes, "A", "1.0")
    child.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(dispatch, PATIENCE) == Completed(b"A")
    assert child.line() == "exited"
    assert child.process.wait(timeout=PATIENCE) == 0


async def test_a_second_sigterm_stops_at_once_and_the_task_runs_again_elsewhere(
    gateway: Gateway, producer: Producer, worker_processes: list[WorkerProcess]
) -> None:
    """docs/python.md, Drain and stop: the first SIGTERM drains (the task in flight would run its
    30 s), a second one stops at once, letting the task go; the gateway runs it again."""
    child, dispatch = await child_holding_a_task(gateway, producer, worker_processes, "A", "30")
    child.process.send_signal(signal.SIGTERM)

    async def draining() -> bool:
        listed = await producer.list_workers(namespace=NS)
        return bool(listed) and listed[0].eligibility == gateway_pb2.ELIGIBILITY_DRAINING

    await eventually(draining, "the first SIGTERM drains the child")
    # Control: draining, the child keeps its task (30 s to go).
    assert not dispatch.done()
    asked = time.monotonic()
    child.process.send_signal(signal.SIGTERM)
    assert child.line() == "exited"
    assert child.process.wait(timeout=PATIENCE) == 0
    assert time.monotonic() - asked < 10, "the second signal did not wait for the task"
    assert not dispatch.done()
    other = new_worker(gateway)
    other.register("whoami", lambda context, data: f"B {context.attempt}".encode())
    async with other.serving():
        assert await asyncio.wait_for(dispatch, PATIENCE) == Completed(b"B 2")


async def test_with_handle_signals_off_sigterm_is_left_to_the_application(
    gateway: Gateway, producer: Producer, worker_processes: list[WorkerProcess]
) -> None:
    """docs/python.md: `handle_signals=False` installs no handler, so SIGTERM keeps Python's
    default action (the process ends at once, `run()` never returns) instead of a drain
    (`test_sigterm_finishes_the_task_in_flight_then_exits` is the control)."""
    child, dispatch = await child_holding_a_task(
        gateway, producer, worker_processes, "A", "30", "nosignals"
    )
    child.process.send_signal(signal.SIGTERM)
    assert child.process.wait(timeout=PATIENCE) == -signal.SIGTERM
    assert child.process.stdout is not None
    assert "exited" not in child.process.stdout.read()
    dispatch.cancel()


async def test_a_handler_returning_none_completes_with_empty_output(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Handlers: `None` is the empty output, from async and sync handlers."""
    worker = new_worker(gateway)

    @worker.activity("nothing-async")
    async def nothing_async(context: ActivityContext, data: bytes) -> None:
        return None

    worker.register("nothing-sync", lambda context, data: None)
    worker.register("something", lambda context, data: data)
    async with worker.serving():
        for activity in ("nothing-async", "nothing-sync"):
            outcome = await producer.dispatch(NS, activity, b"in", timeout=PATIENCE)
            assert outcome == Completed(b""), activity
        # Control: a handler returning its input is not answered empty.
        assert await producer.dispatch(NS, "something", b"in", timeout=PATIENCE) == Completed(b"in")


async def test_a_result_over_the_frame_limit_fails_locally_and_the_stream_survives(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Failures: a result larger than the gateway's `max_worker_frame_bytes`
    (from `grpc.max_message_size`, 4 MiB here) is failed (fatal) by the runtime instead of sent:
    the gateway would end the stream over it. The next task runs on the same registration."""
    limit = 4 * 1024 * 1024
    worker = new_worker(gateway, max_concurrency=1)
    worker.register("sized", lambda context, data: b"x" * int(data))
    async with worker.serving():
        registered = worker.worker_id
        outcome = await producer.dispatch(NS, "sized", str(limit + 1).encode(), timeout=PATIENCE)
        assert isinstance(outcome, Failed), outcome
        assert not outcome.retryable
        assert "max_worker_frame_bytes" in outcome.message, outcome.message
        small = await producer.dispatch(NS, "sized", b"3", timeout=PATIENCE)
        assert small == Completed(b"xxx")
        (listed,) = await producer.list_workers(namespace=NS)
        assert listed.worker_id == registered, "the same stream, not a new registration"


async def test_resize_announces_the_new_capacity(gateway: Gateway, producer: Producer) -> None:
    worker = new_worker(gateway, max_concurrency=1)
    worker.register("echo", lambda context, data: data)
    async with worker.serving():

        async def capacity(expected: int) -> bool:
            listed = await producer.list_workers(namespace=NS)
            return bool(listed) and listed[0].capacity == expected

        await eventually(lambda: capacity(1), "control: registered with capacity 1")
        worker.resize(3)
        await eventually(lambda: capacity(3), "the gateway sees capacity 3")


async def test_workers_in_one_process_do_not_share_a_connection(
    gateway: Gateway, producer: Producer
) -> None:
    workers = [new_worker(gateway) for _ in range(3)]
    for worker in workers:
        worker.register("echo", lambda context, data: data)
    # The gateway takes one worker stream per connection (`max_workers_per_connection = 1`).
    async with workers[0].serving(), workers[1].serving(), workers[2].serving():
        listed = await producer.list_workers(namespace=NS)
        assert len(listed) == 3
    # Control: two worker streams on one channel are refused, naming the key.
    channel = gateway.connection().channel()
    connect = channel.stream_stream(
        "/switchyard.v1.WorkerGateway/ConnectWorker",
        request_serializer=worker_pb2.WorkerFrame.SerializeToString,
        response_deserializer=worker_pb2.GatewayFrame.FromString,
    )
    register = worker_pb2.WorkerFrame(
        register=worker_pb2.RegisterWorker(
            namespaces=[NS], activity_types=["echo"], max_concurrency=1
        )
    )
    metadata = gateway.connection().metadata()
    hold = asyncio.Event()

    async def frames() -> AsyncIterator[worker_pb2.WorkerFrame]:
        yield register
        await hold.wait()  # keep the request side open: a half-close would end the stream

    async def silent() -> AsyncIterator[worker_pb2.WorkerFrame]:
        # Sends nothing: the refusal comes as the stream opens, and a frame still being sent
        # when it arrives would surface as the client's INTERNAL send failure instead.
        await hold.wait()
        nothing: list[worker_pb2.WorkerFrame] = []
        for frame in nothing:
            yield frame

    first = connect(frames(), metadata=metadata)
    await asyncio.wait_for(first.read(), PATIENCE)
    second = connect(silent(), metadata=metadata)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(second.read(), PATIENCE)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_workers_per_connection" in (refused.value.details() or "")
    hold.set()
    first.cancel()
    second.cancel()
    await channel.close()


async def test_a_worker_left_at_its_defaults_registers_as_documented(
    gateway: Gateway, producer: Producer
) -> None:
    """`docs/python.md`, options: capacity 16, task queue `default`, identity host and pid."""
    worker = Worker(namespaces=[NS], connection=gateway.connection(), handle_signals=False)
    worker.register("echo", lambda context, data: data)
    async with worker.serving():
        listed = await producer.list_workers(namespace=NS)
    assert len(listed) == 1, listed
    info = listed[0]
    assert info.capacity == 16
    assert info.task_queue == "default"
    assert info.identity == f"python-sdk {socket.gethostname()} pid {os.getpid()}"
    # Control: options given are what the gateway sees.
    named = new_worker(gateway, identity="named", max_concurrency=3, task_queue="q")
    named.register("echo", lambda context, data: data)
    async with named.serving():
        listed = await producer.list_workers(namespace=NS)
    named_rows = [(w.identity, w.capacity, w.task_queue) for w in listed if w.identity == "named"]
    assert named_rows == [("named", 3, "q")], listed
