"""A lost connection with a session: the worker resumes it and its running task's result is
delivered once; without a session the task is dispatched again."""

from __future__ import annotations

import asyncio
import collections

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


def relayed_worker(gateway: Gateway, relay: Relay, *, resume: bool) -> Worker:
    connection = Connection(
        endpoint=f"127.0.0.1:{relay.port}", ca=gateway.ca, token=gateway.connection().token
    )
    return Worker(
        namespaces=[NS],
        connection=connection,
        backoff=Backoff(initial=0.05, max=0.2),
        resume=resume,
        handle_signals=False,
    )


async def run_across_a_cut(
    gateway: Gateway, producer: Producer, *, resume: bool
) -> tuple[int, int, collections.Counter[int], object]:
    relay = Relay(gateway.port)
    await relay.start()
    attempts: collections.Counter[int] = collections.Counter()
    started, release = asyncio.Event(), asyncio.Event()
    worker = relayed_worker(gateway, relay, resume=resume)

    @worker.activity("held")
    async def held(context: ActivityContext, data: bytes) -> bytes:
        attempts[context.attempt] += 1
        started.set()
        await asyncio.wait_for(release.wait(), PATIENCE)
        return b"done"

    try:
        async with worker.serving():
            first_id = worker.worker_id
            assert first_id is not None
            dispatch = asyncio.ensure_future(producer.dispatch(NS, "held", timeout=PATIENCE))
            await asyncio.wait_for(started.wait(), PATIENCE)
            relay.cut()
            await eventually(
                lambda: _true(worker.registrations == 2 and worker.worker_id is not None),
                "the worker is back",
            )
            release.set()
            outcome = await asyncio.wait_for(dispatch, PATIENCE)
            assert worker.worker_id is not None
            return worker.worker_id, first_id, attempts, outcome
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
