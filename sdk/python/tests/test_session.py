"""A lost connection with a session: the worker resumes it and its running task's result is
delivered once; without a session the task is dispatched again."""

from __future__ import annotations

import asyncio
import collections
import time

from conftest import PATIENCE, Gateway
from relay import Relay
from test_worker import NS, eventually

from switchyard import (
    ActivityContext,
    Backoff,
    Completed,
    Connection,
    Producer,
    Worker,
)


def relayed_worker(
    gateway: Gateway, relay: Relay, *, resume: bool, backoff: Backoff | None = None
) -> Worker:
    connection = Connection(
        endpoint=f"127.0.0.1:{relay.port}", ca=gateway.ca, token=gateway.connection().token
    )
    return Worker(
        namespaces=[NS],
        connection=connection,
        backoff=backoff or Backoff(initial=0.05, max=0.2),
        resume=resume,
        handle_signals=False,
    )


class Held:
    """A `held` activity registered on a worker: each run's attempt in `runs` and on `started`,
    every run waiting for `release`, then answering `done`."""

    def __init__(self, worker: Worker) -> None:
        self.runs: list[int] = []
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.release = asyncio.Event()

        @worker.activity("held")
        async def held(context: ActivityContext, data: bytes) -> bytes:
            self.runs.append(context.attempt)
            self.started.put_nowait(context.attempt)
            await asyncio.wait_for(self.release.wait(), PATIENCE)
            return b"done"

    async def next_start(self) -> int:
        """The attempt of the next run to start (bounded wait)."""
        return await asyncio.wait_for(self.started.get(), PATIENCE)


async def run_across_a_cut(
    gateway: Gateway, producer: Producer, *, resume: bool
) -> tuple[int, int, collections.Counter[int], object]:
    relay = Relay(gateway.port)
    await relay.start()
    worker = relayed_worker(gateway, relay, resume=resume)
    held = Held(worker)
    try:
        async with worker.serving():
            first_id = worker.worker_id
            assert first_id is not None
            dispatch = asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE))
            await held.next_start()
            relay.cut()
            await eventually(
                lambda: _true(worker.registrations == 2 and worker.worker_id is not None),
                "the worker is back",
            )
            held.release.set()
            outcome = await asyncio.wait_for(dispatch, PATIENCE)
            assert worker.worker_id is not None
            return worker.worker_id, first_id, collections.Counter(held.runs), outcome
    finally:
        await relay.close()


async def _true(value: bool) -> bool:
    return value


async def test_a_resumed_session_keeps_the_running_task(
    gateway: Gateway, producer: Producer
) -> None:
    worker_id, first_id, attempts, outcome = await run_across_a_cut(gateway, producer, resume=True)
    assert outcome == Completed(b"done")
    assert attempts == {1: 1}, "ran once, across the break"
    assert worker_id == first_id, "the same worker, resumed"


async def test_without_a_session_the_task_is_dispatched_again(
    gateway: Gateway, producer: Producer
) -> None:
    # Control for the test above: the same break without resuming loses the task.
    worker_id, first_id, attempts, outcome = await run_across_a_cut(gateway, producer, resume=False)
    assert outcome == Completed(b"done")
    assert attempts == {1: 1, 2: 1}
    assert worker_id != first_id, "registered afresh"


async def test_the_reconnect_wait_is_capped_at_half_the_grace_so_the_session_resumes(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Reconnect and resume: with a session, the waits are capped at half the
    grace (the test gateway's is 2 s). This worker's backoff alone would wait 2.5-5 s, past the
    grace; capped, it is back within it and resumes the same session and task."""
    relay = Relay(gateway.port)
    await relay.start()
    worker = relayed_worker(gateway, relay, resume=True, backoff=Backoff(initial=5.0, max=30.0))
    held = Held(worker)
    try:
        async with worker.serving():
            first_id = worker.worker_id
            dispatch = asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE))
            assert await held.next_start() == 1
            cut_at = time.monotonic()
            relay.cut()
            await eventually(lambda: _true(worker.registrations == 2), "the worker is back")
            back_after = time.monotonic() - cut_at
            assert back_after < 2.0, f"back after {back_after:.2f} s, not within the grace"
            held.release.set()
            assert await asyncio.wait_for(dispatch, PATIENCE) == Completed(b"done")
            assert worker.worker_id == first_id, "the same session, resumed"
            assert held.runs == [1]
    finally:
        await relay.close()


async def test_past_the_grace_the_worker_registers_afresh_and_the_task_runs_again(
    gateway: Gateway, producer: Producer
) -> None:
    """docs/python.md, Reconnect and resume: after the grace the worker registers afresh and
    lets go of what it held; the gateway dispatches the task again (attempt 2)."""
    relay = Relay(gateway.port)
    await relay.start()
    worker = relayed_worker(gateway, relay, resume=True)
    held = Held(worker)
    try:
        async with worker.serving():
            first_id = worker.worker_id
            dispatch = asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE))
            assert await held.next_start() == 1
            relay.refusing = True
            relay.cut()

            async def expired() -> bool:
                listed = await producer.list_workers(namespace=NS)
                return all(w.worker_id != first_id for w in listed)

            # The gateway ends the session once the grace passes without a resume.
            await eventually(expired, "the session expires")
            relay.refusing = False
            assert await held.next_start() == 2
            held.release.set()
            assert await asyncio.wait_for(dispatch, PATIENCE) == Completed(b"done")
            assert worker.registrations == 2
            assert worker.worker_id != first_id, "registered afresh"
            assert held.runs == [1, 2]
    finally:
        await relay.close()
