"""The task keeper without a gateway: what a resume lists, what it keeps, cancel acks, and the
bound."""

from __future__ import annotations

import asyncio

from switchyard import ActivityContext, CancelReason
from switchyard._keeper import TaskKeeper
from switchyard.v1 import worker_pb2


def task(task_id: int, activity: str = "hold") -> worker_pb2.ActivityTask:
    return worker_pb2.ActivityTask(
        task_id=task_id, namespace="n", task_queue="q", activity_type=activity, attempt=1
    )


class Gates:
    """A handler that holds each task until its gate opens, recording cancels."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.cancelled: list[tuple[int, CancelReason | None]] = []

    async def __call__(self, context: ActivityContext, data: bytes) -> bytes:
        gate = self.gates.setdefault(context.task_id, asyncio.Event())
        try:
            await asyncio.wait_for(gate.wait(), 30)
        except asyncio.CancelledError:
            self.cancelled.append((context.task_id, context.cancel_reason))
            raise
        return b"out-%d" % context.task_id

    def open(self, task_id: int) -> None:
        self.gates.setdefault(task_id, asyncio.Event()).set()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_resume_lists_running_and_unacked_and_keeps_only_what_is_held() -> None:
    gates = Gates()
    keeper = TaskKeeper({"hold": gates}, max_concurrency=8)
    keeper.keep_unacked = True
    for task_id in (1, 2, 3, 4):
        keeper.start(task(task_id))
    await settle()
    gates.open(3)
    gates.open(4)
    await settle()
    sent = await keeper.next_reply()  # task 3's result: sent, so kept until acknowledged
    assert sent.result.task_id == 3
    running, unacked = keeper.resume_lists()
    # Task 4 finished but was never sent: it is listed as running.
    assert (sorted(running), unacked) == ([1, 2, 4], [3])
    keeper.reconcile(held=[1, 3])
    await settle()
    # Control: the held task keeps running, the other is let go without a reply.
    assert gates.cancelled == [(2, CancelReason.RELEASED)]
    assert keeper.running == 1
    resent = await keeper.next_reply()
    assert resent.result.task_id == 3 and resent.result.output == b"out-3"
    keeper.acknowledged([3])
    assert keeper.resume_lists() == ([1], [])
    await keeper.close(timeout=1)


async def test_a_cancel_stops_the_handler_and_is_acknowledged() -> None:
    gates = Gates()
    keeper = TaskKeeper({"hold": gates}, max_concurrency=1)
    keeper.start(task(1))
    keeper.start(task(2))  # waits for the one place
    await settle()
    keeper.cancel(1, CancelReason.DEADLINE_EXCEEDED)
    keeper.cancel(2, CancelReason.REQUESTED)
    keeper.cancel(9, CancelReason.REQUESTED)  # never held: acknowledged so its slot frees
    replies = [await keeper.next_reply() for _ in range(3)]
    assert sorted(r.cancel_ack.task_id for r in replies) == [1, 2, 9]
    # Task 2 never got a place, so its handler never ran; task 1 saw the reason.
    assert gates.cancelled == [(1, CancelReason.DEADLINE_EXCEEDED)]
    # Control: a task nobody cancels completes with its output.
    keeper.start(task(3))
    gates.open(3)
    done = await keeper.next_reply()
    assert done.result.output == b"out-3"
    await keeper.close(timeout=1)


async def test_an_unknown_activity_fails_fatally_naming_it() -> None:
    keeper = TaskKeeper({"hold": Gates()}, max_concurrency=1)
    keeper.start(task(1, activity="other"))
    reply = await keeper.next_reply()
    assert not reply.result.failure.retryable
    assert "'other'" in reply.result.failure.message
    await keeper.close(timeout=1)
