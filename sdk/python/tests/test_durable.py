"""Durable dispatch from Python: `submit`, `await_outcome` and `get_dispatch` against the real
gateway, whose SQLite store lives in the test's data directory."""

from __future__ import annotations

import asyncio

import pytest
from conftest import PATIENCE, Gateway
from test_worker import NS, eventually, new_worker

from switchyard import ActivityContext, Completed, InvalidArgument, NotFound, Producer


async def test_a_submitted_dispatch_waits_for_a_worker_and_its_outcome_is_awaited(
    gateway: Gateway, producer: Producer
) -> None:
    submitted = await producer.submit(NS, "echo", b"kept", timeout=PATIENCE)
    assert len(submitted.dispatch_id) == 32 and not submitted.existing
    # Control: no worker yet, so no outcome, and the gateway says why it waits.
    assert await producer.await_outcome(submitted.dispatch_id, wait=0.2) is None

    async def parked() -> bool:
        info = await producer.get_dispatch(submitted.dispatch_id)
        return info.WhichOneof("state") == "parked"

    await eventually(parked, "the dispatch is parked")
    worker = new_worker(gateway)
    worker.register("echo", lambda context, data: b"echo:" + data)
    running = asyncio.ensure_future(worker.run())
    try:
        outcome = await producer.await_outcome(submitted.dispatch_id, wait=PATIENCE)
        assert outcome == Completed(b"echo:kept")
        info = await producer.get_dispatch(submitted.dispatch_id)
        assert info.WhichOneof("state") == "finished" and info.attempts == 1
        # Asked again, from another connection, the one outcome is the same.
        async with Producer(gateway.connection()) as other:
            assert await other.await_outcome(submitted.dispatch_id, wait=0) == outcome
    finally:
        worker.stop()
        await asyncio.wait_for(running, PATIENCE)


async def test_a_repeated_idempotency_key_returns_the_first_id_and_runs_once(
    gateway: Gateway, producer: Producer
) -> None:
    runs: list[bytes] = []

    async def count(context: ActivityContext, data: bytes) -> bytes:
        runs.append(data)
        return data

    worker = new_worker(gateway)
    worker.register("count", count)
    running = asyncio.ensure_future(worker.run())
    try:
        first = await producer.submit(NS, "count", b"once", idempotency_key="order-7")
        again = await producer.submit(NS, "count", b"once", idempotency_key="order-7")
        assert again.dispatch_id == first.dispatch_id and again.existing
        # Control: another key is another dispatch.
        other = await producer.submit(NS, "count", b"other", idempotency_key="order-8")
        assert other.dispatch_id != first.dispatch_id and not other.existing
        for submitted in (first, other):
            outcome = await producer.await_outcome(submitted.dispatch_id, wait=PATIENCE)
            assert isinstance(outcome, Completed)
        assert sorted(runs) == [b"once", b"other"]
    finally:
        worker.stop()
        await asyncio.wait_for(running, PATIENCE)


async def test_unknown_and_malformed_ids_are_refused_by_status(producer: Producer) -> None:
    with pytest.raises(NotFound):
        await producer.await_outcome("0" * 32, wait=0)
    with pytest.raises(NotFound):
        await producer.get_dispatch("0" * 32)
    with pytest.raises(InvalidArgument):
        await producer.get_dispatch("not-an-id")


async def test_await_outcome_answers_across_a_gateway_restart(gateway: Gateway) -> None:
    """docs/python.md, A producer: `await_outcome` works from any connection within the
    retention window, also after a restart: for a dispatch that finished before it, and for
    one still queued through it (the gateway dispatches it once a worker comes)."""
    async with Producer(gateway.connection()) as producer:
        finished = await producer.submit(NS, "echo", b"before", timeout=PATIENCE)
        worker = new_worker(gateway)
        worker.register("echo", lambda context, data: b"echo:" + data)
        async with worker.serving():
            done = await producer.await_outcome(finished.dispatch_id, wait=PATIENCE)
            assert done == Completed(b"echo:before")
        queued = await producer.submit(NS, "echo", b"across", timeout=PATIENCE)
        # Control: no worker now, so nothing answers it before the restart.
        assert await producer.await_outcome(queued.dispatch_id, wait=0.2) is None
    gateway.stop()
    gateway.start()
    async with Producer(gateway.connection()) as producer:
        assert await producer.await_outcome(finished.dispatch_id, wait=0) == done
        worker = new_worker(gateway)
        worker.register("echo", lambda context, data: b"echo:" + data)
        async with worker.serving():
            outcome = await producer.await_outcome(queued.dispatch_id, wait=PATIENCE)
        assert outcome == Completed(b"echo:across")
