"""The worker: what it serves, and the loop that keeps it registered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from . import _signals
from ._keeper import Handler, TaskKeeper
from ._stream import End, Registered, ResumeRefused, Session, Stream, is_permanent
from .backoff import Backoff
from .connection import Connection
from .errors import ConfigError, GatewayError
from .v1 import worker_pb2

log = logging.getLogger("switchyard.worker")

H = TypeVar("H", bound=Handler)
T = TypeVar("T")


@dataclass
class _Lost:
    session: Session
    until: float


class Worker:
    """A worker serving activities through a gateway's gRPC worker service.

    It registers its namespaces, task queue, node and activity types with `max_concurrency`
    slots, answers the gateway's pings, runs each task with its handler (an `async def` on the
    event loop, a plain `def` in a thread pool, both under the same `max_concurrency` bound),
    and reconnects with jittered backoff when the connection is lost, resuming its session
    when the gateway granted one (running tasks keep running and their results are delivered
    once). `drain()` (or SIGTERM) finishes the tasks in flight and leaves; `stop()` leaves at
    once. A cancelled task's async handler sees `asyncio.CancelledError`, with the reason in
    `context.cancel_reason`.

    Example::

        worker = Worker(namespaces=["billing"], connection=Connection(ca="ca.pem"))

        @worker.activity("charge")
        async def charge(context: ActivityContext, data: bytes) -> bytes:
            return b"charged " + data

        asyncio.run(worker.run())
    """

    def __init__(
        self,
        *,
        namespaces: Sequence[str],
        connection: Connection | None = None,
        task_queue: str = "",
        node: str = "",
        identity: str | None = None,
        activities: Mapping[str, Handler] | None = None,
        max_concurrency: int = 16,
        backoff: Backoff | None = None,
        connect_timeout: float = 10.0,
        resume: bool = True,
        handle_signals: bool = True,
    ) -> None:
        if isinstance(namespaces, str):
            raise ConfigError("namespaces", "a list of namespaces, not one string")
        self._namespaces = list(namespaces)
        self._connection = connection or Connection()
        self._task_queue = task_queue
        self._node = node
        self._identity = identity or f"python-sdk {socket.gethostname()} pid {os.getpid()}"
        self._activities: dict[str, Handler] = dict(activities or {})
        self._max_concurrency = max_concurrency
        self._backoff = backoff or Backoff()
        self._connect_timeout = connect_timeout
        self._resume = resume
        self._handle_signals = handle_signals
        self._stream: Stream | None = None
        self._registered: Registered | None = None
        self._announced = max_concurrency
        self._connected = asyncio.Event()
        self._drain = asyncio.Event()
        self._stop = asyncio.Event()
        self._keeper: TaskKeeper | None = None
        #: Registrations and resumes so far.
        self.registrations = 0

    def activity(self, name: str | None = None) -> Callable[[H], H]:
        """Decorator serving an activity type (the function's name when `name` is None)."""

        def register(handler: H) -> H:
            self.register(name or str(getattr(handler, "__name__", "")), handler)
            return handler

        return register

    def register(self, name: str, handler: Handler) -> None:
        """Serves activity type `name` with `handler`, replacing an earlier one."""
        if not name:
            raise ConfigError("activity_types", "an activity type needs a name")
        self._activities[name] = handler

    @property
    def worker_id(self) -> int | None:
        """The gateway's id for this worker while registered."""
        return self._registered.worker_id if self._registered else None

    @property
    def max_concurrency(self) -> int:
        """The current capacity."""
        return self._max_concurrency

    async def wait_registered(self, timeout: float) -> int:
        """Waits (at most `timeout` s) until the worker is registered; returns its id."""
        await asyncio.wait_for(self._connected.wait(), timeout)
        registered = self._registered
        if registered is None:
            raise asyncio.TimeoutError("the worker lost its registration again")
        return registered.worker_id

    def drain(self) -> None:
        """Takes no new task, finishes those in flight, then leaves for good."""
        if self._drain.is_set():
            return
        self._drain.set()
        if self._stream is not None:
            self._stream.send(worker_pb2.WorkerFrame(drain_request=worker_pb2.WorkerDrainRequest()))

    def stop(self) -> None:
        """Leaves at once; tasks in flight are let go (the gateway dispatches them again)."""
        self._stop.set()

    def resize(self, max_concurrency: int) -> None:
        """Changes the capacity: at once locally, and announced to the gateway (a shrink lets
        running tasks finish)."""
        _check_capacity(max_concurrency)
        self._max_concurrency = max_concurrency
        if self._keeper is not None:
            self._keeper.resize(max_concurrency)
        self._announce()

    def _announce(self) -> None:
        if self._stream is not None and self._announced != self._max_concurrency:
            update = worker_pb2.CapacityUpdate(max_concurrency=self._max_concurrency)
            self._stream.send(worker_pb2.WorkerFrame(capacity=update))
            self._announced = self._max_concurrency

    def _validate(self) -> None:
        if not self._namespaces:
            raise ConfigError("namespaces", "empty: serve at least one namespace")
        if not self._activities:
            raise ConfigError("activity_types", "empty: register at least one activity")
        _check_capacity(self._max_concurrency)
        if not self._connect_timeout > 0:
            raise ConfigError("connect_timeout", "must be above 0")

    def _register_frame(self) -> worker_pb2.WorkerFrame:
        return worker_pb2.WorkerFrame(
            register=worker_pb2.RegisterWorker(
                namespaces=self._namespaces,
                task_queue=self._task_queue,
                node=self._node,
                activity_types=sorted(self._activities),
                identity=self._identity,
                max_concurrency=self._max_concurrency,
                resumable=self._resume,
            )
        )

    @contextlib.asynccontextmanager
    async def serving(self, timeout: float = 30.0) -> AsyncIterator[Worker]:
        """Runs the worker in the background while the block runs, registered when it starts;
        stops it on exit."""
        running = asyncio.get_running_loop().create_task(self.run())
        try:
            waiting = asyncio.ensure_future(self._connected.wait())
            await asyncio.wait(
                {running, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            waiting.cancel()
            if running.done():
                running.result()
            if not self._connected.is_set():
                raise asyncio.TimeoutError(f"the worker did not register within {timeout} s")
            yield self
        finally:
            self.stop()
            await asyncio.wait({running}, timeout=timeout)

    async def run(self) -> None:
        """Serves until a drain completes or `stop()`; raises `GatewayError` when the gateway
        refuses the worker for good (a bad field, a namespace not granted, a bad credential)
        and `ConfigError` for unusable options."""
        self._validate()
        keeper = TaskKeeper(self._activities, self._max_concurrency)
        self._keeper = keeper
        if self._handle_signals:
            _signals.join(id(self), self.drain, self.stop)
        try:
            await self._reconnect_loop(keeper)
        finally:
            self._stream = None
            self._registered = None
            self._connected.clear()
            if self._handle_signals:
                _signals.leave(id(self))
            await keeper.close(timeout=5.0)
            self._keeper = None

    async def _reconnect_loop(self, keeper: TaskKeeper) -> None:
        rng = random.Random()
        attempt = 0
        lost: _Lost | None = None
        at_once = True
        while not self._stop.is_set():
            if self._drain.is_set() and self.registrations > 0:
                # Nothing reaches a disconnected worker: a drain ends it now.
                return
            if lost is not None and time.monotonic() >= lost.until:
                lost = None
                keeper.abandon()
            delay = 0.0 if at_once else self._backoff.delay(attempt, rng)
            at_once = False
            if lost is not None:
                delay = min(delay, lost.session.grace / 2)
            if delay > 0 and await self._interrupted_within(delay):
                continue
            attempt += 1
            first = self._resume_frame(lost.session, keeper) if lost else self._register_frame()
            try:
                opened = await self._unless_stopped(
                    Stream.open(self._connection, first, self._connect_timeout)
                )
            except ResumeRefused as refused:
                log.warning("session resume refused (%s); registering afresh", refused.error)
                lost = None
                keeper.abandon()
                at_once = True
                continue
            except GatewayError as error:
                if is_permanent(error):
                    raise
                log.warning("connecting failed (attempt %d): %s; retrying", attempt, error)
                continue
            if opened is None:
                return
            stream, registered = opened
            if registered.held is not None:
                log.info("resumed session %d", registered.worker_id)
                keeper.reconcile(registered.held)
            else:
                keeper.abandon()
                self._announced = self._max_concurrency
                log.info("registered as worker %d", registered.worker_id)
            keeper.keep_unacked = registered.session is not None
            lost = None
            attempt = 0
            end = await self._serve(stream, registered, keeper)
            if end is None or end is End.DRAINED or self._drain.is_set():
                return
            if end is End.LOST and registered.session is not None and self._resume:
                lost = _Lost(registered.session, time.monotonic() + registered.session.grace)
            else:
                keeper.abandon()

    async def _serve(
        self, stream: Stream, registered: Registered, keeper: TaskKeeper
    ) -> End | None:
        """Serves one stream; None when stopped."""
        self._stream = stream
        self._registered = registered
        self.registrations += 1
        self._connected.set()
        if self._drain.is_set():
            stream.send(worker_pb2.WorkerFrame(drain_request=worker_pb2.WorkerDrainRequest()))
        self._announce()
        loop = asyncio.get_running_loop()
        serving = loop.create_task(stream.serve(keeper, registered.max_worker_frame_bytes))
        stopping = loop.create_task(self._stop.wait())
        try:
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            self._connected.clear()
            self._stream = None
            self._registered = None
            if not serving.done():
                serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({serving})
            await stream.close()
        if serving.cancelled():
            return None
        return serving.result()

    def _resume_frame(self, session: Session, keeper: TaskKeeper) -> worker_pb2.WorkerFrame:
        running, unacked = keeper.resume_lists()
        return worker_pb2.WorkerFrame(
            resume=worker_pb2.ResumeWorker(
                session_id=session.session_id,
                resume_secret=session.secret,
                running_task_ids=running,
                unacked_task_ids=unacked,
            )
        )

    async def _unless_stopped(self, opening: Awaitable[T]) -> T | None:
        """Awaits `opening`, or cancels it and returns None when the worker is stopped or
        drained first (nothing reaches a worker that is not connected)."""
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(opening)
        interrupts = {loop.create_task(self._stop.wait())}
        if self.registrations > 0:
            # Before the first registration a drain waits for it, and is sent once registered.
            interrupts.add(loop.create_task(self._drain.wait()))
        try:
            await asyncio.wait({work, *interrupts}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for interrupt in interrupts:
                interrupt.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return None

    async def _interrupted_within(self, delay: float) -> bool:
        """Sleeps `delay` s; True when a stop or a drain came first."""
        loop = asyncio.get_running_loop()
        waits = {loop.create_task(self._stop.wait()), loop.create_task(self._drain.wait())}
        done, pending = await asyncio.wait(waits, timeout=delay)
        for task in pending:
            task.cancel()
        return bool(done)


def _check_capacity(max_concurrency: int) -> None:
    if max_concurrency < 1:
        raise ConfigError("max_concurrency", f"{max_concurrency}: must be at least 1")
