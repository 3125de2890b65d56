"""The tasks a worker holds: running them under the concurrency bound, stopping them, and
keeping their replies until the gateway has them.

The keeper outlives connections: with a session, running tasks keep running across a lost
stream and their results wait here (unsent, or sent and unacknowledged) for the resume.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from .context import ActivityContext, CancelReason
from .errors import ActivityError
from .limiter import Limiter
from .v1 import common_pb2, worker_pb2

log = logging.getLogger("switchyard.worker")

#: What a handler may return: the output bytes (None means empty).
Output = bytes | bytearray | memoryview | None
#: An activity handler: `async def` (run on the event loop) or plain `def` (run in a thread).
Handler = Callable[[ActivityContext, bytes], Awaitable[Output] | Output]


def is_async(handler: Handler) -> bool:
    """True when `handler` returns an awaitable (an `async def`, or an object whose `__call__`
    is one)."""
    call = getattr(handler, "__call__", None)  # noqa: B004 - the bound method is what runs
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def result_frame(task_id: int, output: bytes) -> worker_pb2.WorkerFrame:
    """The frame reporting success."""
    return worker_pb2.WorkerFrame(result=worker_pb2.ActivityResult(task_id=task_id, output=output))


def failure_frame(task_id: int, message: str, retryable: bool) -> worker_pb2.WorkerFrame:
    """The frame reporting a failure."""
    failure = common_pb2.Failure(message=message, retryable=retryable)
    return worker_pb2.WorkerFrame(
        result=worker_pb2.ActivityResult(task_id=task_id, failure=failure)
    )


def cancel_ack_frame(task_id: int) -> worker_pb2.WorkerFrame:
    """The frame confirming a cancelled task stopped."""
    return worker_pb2.WorkerFrame(cancel_ack=worker_pb2.CancelAck(task_id=task_id))


@dataclass
class _Running:
    context: ActivityContext
    task: asyncio.Task[None]
    #: False once let go: the gateway no longer expects anything for it.
    report: bool = True


class TaskKeeper:
    """Runs tasks and queues their replies; one per worker, shared by its connections."""

    def __init__(self, activities: Mapping[str, Handler], max_concurrency: int) -> None:
        self._handlers = dict(activities)
        self._async = {name: is_async(handler) for name, handler in activities.items()}
        self._limiter = Limiter(max_concurrency)
        self._executor = self._new_executor(max_concurrency)
        self._running: dict[int, _Running] = {}
        # Replies in order, not yet handed to a connection.
        self._unsent: dict[int, worker_pb2.WorkerFrame] = {}
        # Results handed to a connection that the gateway has not acknowledged (sessions only).
        self._unacked: dict[int, worker_pb2.WorkerFrame] = {}
        self._wake = asyncio.Event()
        #: Keep sent results until a `results_ack` names them (set when a session is granted).
        self.keep_unacked = False

    @staticmethod
    def _new_executor(threads: int) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="switchyard-activity"
        )

    @property
    def running(self) -> int:
        """Tasks started and not yet finished."""
        return len(self._running)

    def start(self, task: worker_pb2.ActivityTask) -> None:
        """Starts running a task the gateway pushed."""
        if task.task_id in self._running or task.task_id in self._unsent:
            log.warning("task %d delivered twice; ignoring the second", task.task_id)
            return
        deadline = datetime.datetime.fromtimestamp(
            task.deadline_unix_ms / 1000, tz=datetime.timezone.utc
        )
        context = ActivityContext(
            task_id=task.task_id,
            namespace=task.namespace,
            task_queue=task.task_queue,
            activity_type=task.activity_type,
            attempt=task.attempt,
            deadline=deadline,
        )
        runner = self._run(context, bytes(task.input))
        name = f"switchyard-task-{task.task_id}"
        running = asyncio.get_running_loop().create_task(runner, name=name)
        self._running[task.task_id] = _Running(context, running)

    def cancel(self, task_id: int, reason: CancelReason) -> None:
        """Stops a task at the gateway's request; its cancel ack follows once it stopped."""
        running = self._running.get(task_id)
        if running is not None:
            running.context._cancel(reason)
            running.task.cancel(reason.value)
        elif task_id not in self._unsent and task_id not in self._unacked:
            # Not held (it never reached us, or we let it go): acknowledge so the slot frees.
            self._queue(task_id, cancel_ack_frame(task_id))

    async def next_reply(self) -> worker_pb2.WorkerFrame:
        """The next reply to send; a result stays kept until acknowledged when
        `keep_unacked`."""
        while not self._unsent:
            self._wake.clear()
            await self._wake.wait()
        task_id = next(iter(self._unsent))
        frame = self._unsent.pop(task_id)
        if self.keep_unacked and frame.WhichOneof("frame") == "result":
            self._unacked[task_id] = frame
        return frame

    def acknowledged(self, task_ids: Iterable[int]) -> None:
        """Forgets results the gateway processed."""
        for task_id in task_ids:
            self._unacked.pop(task_id, None)

    def resume_lists(self) -> tuple[list[int], list[int]]:
        """What a `resume` lists: tasks running or finished unsent, and results unacked."""
        unsent = [t for t, f in self._unsent.items() if f.WhichOneof("frame") == "result"]
        return [*self._running, *unsent], list(self._unacked)

    def reconcile(self, held: Iterable[int]) -> None:
        """After a resume: keeps what the gateway still waits on and lets go of the rest; the
        unacknowledged results it holds are sent again."""
        keep = set(held)
        for task_id in [t for t in self._running if t not in keep]:
            self._let_go(task_id)
        resend = {t: f for t, f in self._unacked.items() if t in keep}
        unsent = {t: f for t, f in self._unsent.items() if t in keep}
        self._unacked.clear()
        self._unsent = {**resend, **unsent}
        if self._unsent:
            self._wake.set()

    def abandon(self) -> None:
        """Lets go of everything held (the gateway dispatches it again)."""
        if self._running or self._unsent or self._unacked:
            log.info("letting go of %d running tasks", len(self._running))
        for task_id in list(self._running):
            self._let_go(task_id)
        self._unsent.clear()
        self._unacked.clear()

    def resize(self, max_concurrency: int) -> None:
        """Changes the bound; a shrink lets running tasks finish."""
        if max_concurrency > self._limiter.limit:
            old, self._executor = self._executor, self._new_executor(max_concurrency)
            old.shutdown(wait=False)
        self._limiter.resize(max_concurrency)

    async def close(self, timeout: float) -> None:
        """Lets go of everything and waits (up to `timeout` s) for the handlers to stop."""
        tasks = [running.task for running in self._running.values()]
        self.abandon()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        self._executor.shutdown(wait=False)

    def _let_go(self, task_id: int) -> None:
        running = self._running.pop(task_id)
        running.report = False
        running.context._cancel(CancelReason.RELEASED)
        running.task.cancel(CancelReason.RELEASED.value)

    def _queue(self, task_id: int, frame: worker_pb2.WorkerFrame) -> None:
        self._unsent[task_id] = frame
        self._wake.set()

    async def _run(self, context: ActivityContext, data: bytes) -> None:
        frame = await self._outcome(context, data)
        running = self._running.get(context.task_id)
        if running is None or not running.report:
            return
        del self._running[context.task_id]
        self._queue(context.task_id, frame)

    async def _outcome(self, context: ActivityContext, data: bytes) -> worker_pb2.WorkerFrame:
        task_id = context.task_id
        try:
            await self._limiter.acquire()
            try:
                output = await self._call(context, data)
            finally:
                self._limiter.release()
        except asyncio.CancelledError:
            if context.cancel_reason is None:
                raise
            return cancel_ack_frame(task_id)
        except ActivityError as error:
            if context.is_cancelled:
                return cancel_ack_frame(task_id)
            return failure_frame(task_id, error.message, error.retryable)
        except Exception as error:
            if context.is_cancelled:
                return cancel_ack_frame(task_id)
            log.warning("activity %s failed: %r", context.activity_type, error)
            return failure_frame(task_id, f"{type(error).__name__}: {error}", False)
        if context.is_cancelled:
            # It finished despite the cancel: the gateway wants the ack, not the output.
            return cancel_ack_frame(task_id)
        return result_frame(task_id, output)

    async def _call(self, context: ActivityContext, data: bytes) -> bytes:
        handler = self._handlers.get(context.activity_type)
        if handler is None:
            raise ActivityError(
                f"activity type {context.activity_type!r} has no handler on this worker",
                retryable=False,
            )
        if self._async[context.activity_type]:
            produced = handler(context, data)
            assert inspect.isawaitable(produced)
            output = await produced
        else:
            output = await self._in_thread(handler, context, data)
        return _as_bytes(output)

    async def _in_thread(self, handler: Handler, context: ActivityContext, data: bytes) -> Output:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, functools.partial(handler, context, data))
        cancelled = False
        # A thread cannot be interrupted: the task keeps its place under the bound until the
        # handler returns, and the cancel is re-raised afterwards.
        while True:
            try:
                produced = await asyncio.shield(future)
                break
            except asyncio.CancelledError:
                cancelled = True
                if future.done():
                    break
        if cancelled:
            reason = context.cancel_reason
            raise asyncio.CancelledError(reason.value if reason else None)
        assert not inspect.isawaitable(produced)
        return produced


def _as_bytes(output: object) -> bytes:
    if output is None:
        return b""
    if isinstance(output, (bytes, bytearray, memoryview)):
        return bytes(output)
    raise ActivityError(
        f"the handler returned {type(output).__name__}; return bytes", retryable=False
    )
