"""The producer and operator client of the gateway's `switchyard.v1.Gateway` service."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from .connection import Connection
from .errors import GatewayError, from_rpc_error, from_status_number
from .outcome import Outcome, from_proto
from .v1 import gateway_pb2

_SERVICE = "/switchyard.v1.Gateway/"
M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class DispatchRequest:
    """One activity to run."""

    #: Namespace to dispatch in.
    namespace: str
    #: Activity type to run.
    activity_type: str
    #: Opaque input handed to the activity.
    input: bytes = b""
    #: Task queue; empty means `default`.
    task_queue: str = ""
    #: Run only on workers advertising this node label; empty means any.
    node: str = ""
    #: Caller-chosen id, unique in the namespace while in flight; needed to `cancel`.
    activity_id: str = ""
    #: Seconds to wait for the outcome; None means the gateway's default.
    timeout: float | None = None
    #: Record it in the gateway's store first, so it survives a gateway restart; None follows
    #: the namespace's default (`docs/durability.md`).
    durable: bool | None = None
    #: With `submit`: a repeated key within the retention window returns the first dispatch.
    idempotency_key: str = ""

    def to_proto(self) -> gateway_pb2.DispatchRequest:
        """The wire request."""
        request = gateway_pb2.DispatchRequest(
            namespace=self.namespace,
            task_queue=self.task_queue,
            activity_type=self.activity_type,
            node=self.node,
            input=self.input,
            activity_id=self.activity_id,
            timeout_ms=0 if self.timeout is None else max(1, round(self.timeout * 1000)),
            idempotency_key=self.idempotency_key,
        )
        if self.durable is not None:
            request.durable = self.durable
        return request


@dataclass(frozen=True)
class Submitted:
    """What `submit` returns: the durable dispatch's id."""

    #: The id to ask `await_outcome` and `get_dispatch` about (32 lowercase hex digits).
    dispatch_id: str
    #: True when the idempotency key had been used before: this is the first dispatch's id and
    #: nothing new was recorded.
    existing: bool


@dataclass(frozen=True)
class DispatchResult:
    """One reply of `dispatch_many`: the request's position and its outcome or refusal."""

    #: Position of the request in the iterable given to `dispatch_many`.
    index: int
    #: How it ended, when it ran.
    outcome: Outcome | None
    #: Why it was refused before it started, when it was.
    error: GatewayError | None


class Producer:
    """Dispatches activities and asks the gateway about its pools and workers.

    Every refusal is raised as the `GatewayError` subclass of its status (`InvalidArgument`,
    `PermissionDenied`, `NotFound`, ...), carrying the gateway's sentence. Use it as an async
    context manager, or call `close()`.

    Example::

        async with Producer(Connection(ca="ca.pem")) as producer:
            outcome = await producer.dispatch("billing", "charge", b"42")
            match outcome:
                case Completed(output=output):
                    print(output)
    """

    def __init__(self, connection: Connection | None = None) -> None:
        self._connection = connection or Connection()
        self._channel = self._connection.channel()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel; calls in progress are cancelled."""
        await self._channel.close(grace=None)

    async def _unary(
        self, method: str, request: Message, reply: type[M], timeout: float | None
    ) -> M:
        call = self._channel.unary_unary(
            _SERVICE + method,
            request_serializer=_serialize,
            response_deserializer=reply.FromString,
        )
        try:
            answer: M = await call(request, metadata=self._connection.metadata(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        return answer

    async def dispatch(
        self,
        namespace: str,
        activity_type: str,
        input: bytes = b"",
        *,
        task_queue: str = "",
        node: str = "",
        activity_id: str = "",
        timeout: float | None = None,
    ) -> Outcome:
        """Runs one activity and returns its outcome; raises the refusal if it never started."""
        request = DispatchRequest(
            namespace, activity_type, input, task_queue, node, activity_id, timeout
        )
        return await self.dispatch_request(request)

    async def dispatch_request(self, request: DispatchRequest) -> Outcome:
        """`dispatch` of a prepared request."""
        # The gateway bounds the wait by the dispatch timeout; the call's own deadline only
        # guards against a gateway that stopped answering.
        deadline = None if request.timeout is None else request.timeout + 30.0
        reply = await self._unary(
            "Dispatch", request.to_proto(), gateway_pb2.DispatchReply, deadline
        )
        return from_proto(reply.outcome)

    async def submit(
        self,
        namespace: str,
        activity_type: str,
        input: bytes = b"",
        *,
        task_queue: str = "",
        node: str = "",
        timeout: float | None = None,
        idempotency_key: str = "",
    ) -> Submitted:
        """Records a durable dispatch and returns its id once the gateway has committed it; the
        outcome comes later, from `await_outcome` (any connection, also after a restart)."""
        request = DispatchRequest(
            namespace,
            activity_type,
            input,
            task_queue,
            node,
            timeout=timeout,
            idempotency_key=idempotency_key,
        )
        reply = await self._unary("Submit", request.to_proto(), gateway_pb2.SubmitReply, 30.0)
        return Submitted(reply.dispatch_id, reply.existing)

    async def await_outcome(self, dispatch_id: str, wait: float = 30.0) -> Outcome | None:
        """The durable dispatch's one outcome, waiting up to `wait` seconds for it; None when it
        has none yet (ask again)."""
        request = gateway_pb2.AwaitOutcomeRequest(
            dispatch_id=dispatch_id, wait_ms=max(0, round(wait * 1000))
        )
        reply = await self._unary(
            "AwaitOutcome", request, gateway_pb2.AwaitOutcomeReply, wait + 30.0
        )
        if reply.WhichOneof("result") == "outcome":
            return from_proto(reply.outcome)
        return None

    async def get_dispatch(self, dispatch_id: str) -> gateway_pb2.DispatchInfo:
        """Where a durable dispatch stands: queued, parked (why), running (where) or finished."""
        request = gateway_pb2.GetDispatchRequest(dispatch_id=dispatch_id)
        reply = await self._unary("GetDispatch", request, gateway_pb2.GetDispatchReply, 30.0)
        return reply.dispatch

    async def dispatch_many(
        self,
        requests: Iterable[DispatchRequest] | AsyncIterable[DispatchRequest],
        *,
        max_outstanding: int = 256,
    ) -> AsyncIterator[DispatchResult]:
        """Runs many dispatches over one `DispatchStream`, at most `max_outstanding` unanswered
        at once, yielding each result in completion order. A refused request is yielded with
        its `error`; the others go on. Ends after the last reply."""
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be at least 1")
        window = asyncio.Semaphore(max_outstanding)
        outbound: asyncio.Queue[gateway_pb2.DispatchStreamRequest | None] = asyncio.Queue()

        async def frames() -> AsyncIterator[gateway_pb2.DispatchStreamRequest]:
            while (frame := await outbound.get()) is not None:
                yield frame

        async def send() -> None:
            index = 0
            try:
                async for request in _aiter(requests):
                    await window.acquire()
                    outbound.put_nowait(
                        gateway_pb2.DispatchStreamRequest(
                            correlation_id=index, request=request.to_proto()
                        )
                    )
                    index += 1
            finally:
                # Half-close even when the requests fail to iterate: what was sent finishes,
                # the stream ends, and the failure is raised after the last reply.
                outbound.put_nowait(None)

        method = self._channel.stream_stream(
            _SERVICE + "DispatchStream",
            request_serializer=_serialize,
            response_deserializer=gateway_pb2.DispatchStreamReply.FromString,
        )
        call = method(frames(), metadata=self._connection.metadata())
        sender = asyncio.get_running_loop().create_task(send())
        try:
            while True:
                try:
                    reply = await call.read()
                except grpc.aio.AioRpcError as error:
                    raise from_rpc_error(error) from None
                if not isinstance(reply, gateway_pb2.DispatchStreamReply):
                    break
                window.release()
                if reply.HasField("refused"):
                    refusal = from_status_number(reply.refused.code, reply.refused.message)
                    yield DispatchResult(reply.correlation_id, None, refusal)
                else:
                    yield DispatchResult(reply.correlation_id, from_proto(reply.outcome), None)
            if sender.done() and sender.exception() is not None:
                sender.result()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            call.cancel()

    async def cancel(self, namespace: str, activity_id: str) -> None:
        """Cancels the in-flight dispatch with this activity id (`NotFound` when none)."""
        request = gateway_pb2.CancelDispatchRequest(namespace=namespace, activity_id=activity_id)
        await self._unary("Cancel", request, gateway_pb2.CancelDispatchReply, 30.0)

    async def describe_pool(
        self, namespace: str, activity_type: str, *, task_queue: str = "", node: str = ""
    ) -> gateway_pb2.DescribePoolReply:
        """A pool's census for one activity type and, when unserved, why."""
        request = gateway_pb2.DescribePoolRequest(
            namespace=namespace, task_queue=task_queue, activity_type=activity_type, node=node
        )
        return await self._unary("DescribePool", request, gateway_pb2.DescribePoolReply, 30.0)

    async def explain_pool(
        self, namespace: str, activity_type: str, *, task_queue: str = "", node: str = ""
    ) -> list[gateway_pb2.WorkerExplanation]:
        """Every worker of a pool with the reason it can or cannot take the activity now."""
        request = gateway_pb2.ExplainPoolRequest(
            namespace=namespace, task_queue=task_queue, activity_type=activity_type, node=node
        )
        reply = await self._unary("ExplainPool", request, gateway_pb2.ExplainPoolReply, 30.0)
        return list(reply.workers)

    async def list_workers(
        self, *, namespace: str = "", task_queue: str = ""
    ) -> list[gateway_pb2.WorkerInfo]:
        """The connected workers of the caller's namespaces, by worker id."""
        request = gateway_pb2.ListWorkersRequest(namespace=namespace, task_queue=task_queue)
        reply = await self._unary("ListWorkers", request, gateway_pb2.ListWorkersReply, 30.0)
        return list(reply.workers)

    async def unserved(self) -> list[gateway_pb2.UnservedQueueInfo]:
        """The addresses where dispatches wait for a worker, with the reason."""
        request = gateway_pb2.UnservedQueuesRequest()
        reply = await self._unary("UnservedQueues", request, gateway_pb2.UnservedQueuesReply, 30.0)
        return list(reply.queues)

    async def drain(
        self,
        *,
        worker_id: int | None = None,
        node: str | None = None,
        deadline: float | None = None,
    ) -> AsyncIterator[gateway_pb2.DrainProgress]:
        """Drains one worker or every worker on a node, yielding its progress until `done`."""
        if (worker_id is None) == (node is None):
            raise ValueError("give exactly one of worker_id and node")
        request = gateway_pb2.DrainWorkersRequest(
            deadline_ms=0 if deadline is None else max(1, round(deadline * 1000))
        )
        if worker_id is not None:
            request.worker_id = worker_id
        else:
            request.node = node or ""
        async for progress in self._server_stream(
            "Drain", request, gateway_pb2.DrainProgress.FromString
        ):
            yield progress

    async def watch_events(self) -> AsyncIterator[gateway_pb2.GatewayEvent]:
        """Worker lifecycle events as they happen (needs a principal granted every namespace)."""
        async for event in self._server_stream(
            "WatchEvents", gateway_pb2.WatchEventsRequest(), gateway_pb2.GatewayEvent.FromString
        ):
            yield event

    async def _server_stream(
        self, method: str, request: Message, decode: Callable[[bytes], M]
    ) -> AsyncIterator[M]:
        call = self._channel.unary_stream(
            _SERVICE + method, request_serializer=_serialize, response_deserializer=decode
        )
        stream = call(request, metadata=self._connection.metadata())
        try:
            while True:
                try:
                    item: Any = await stream.read()
                except grpc.aio.AioRpcError as error:
                    raise from_rpc_error(error) from None
                if item is grpc.aio.EOF:
                    return
                yield item
        finally:
            stream.cancel()


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


async def _aiter(
    items: Iterable[DispatchRequest] | AsyncIterable[DispatchRequest],
) -> AsyncIterator[DispatchRequest]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
