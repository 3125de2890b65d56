"""One `ConnectWorker` stream: opening it (register or resume), serving its frames, and how it
ended. The reconnect loop in `worker.py` decides what to do next."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from ._keeper import TaskKeeper, failure_frame
from .connection import MAX_MESSAGE_BYTES, Connection
from .context import CancelReason
from .errors import GatewayError, Unavailable, from_rpc_error
from .v1 import worker_pb2

log = logging.getLogger("switchyard.worker")

CONNECT_WORKER = "/switchyard.v1.WorkerGateway/ConnectWorker"
_RESUME_REFUSED = "resume refused:"
#: Refusals that trying again unchanged cannot cure (the worker protocol's registration list).
_PERMANENT = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
_CANCEL_REASONS = {
    worker_pb2.CancelActivity.REASON_REQUESTED: CancelReason.REQUESTED,
    worker_pb2.CancelActivity.REASON_DEADLINE_EXCEEDED: CancelReason.DEADLINE_EXCEEDED,
    worker_pb2.CancelActivity.REASON_SHUTTING_DOWN: CancelReason.SHUTTING_DOWN,
    worker_pb2.CancelActivity.REASON_CALLER_GONE: CancelReason.CALLER_GONE,
    worker_pb2.CancelActivity.REASON_DRAIN_DEADLINE: CancelReason.DRAIN_DEADLINE,
}


def is_permanent(error: GatewayError) -> bool:
    """True when the worker should stop instead of reconnecting."""
    return error.code in _PERMANENT


class ResumeRefused(Exception):
    """The gateway refused a resume: register afresh at once."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(str(error))
        self.error = error


class End(enum.Enum):
    """How a registered stream ended."""

    #: A requested drain finished: final.
    DRAINED = "drained"
    #: The gateway shut down after the worker finished its tasks: reconnect, afresh.
    SHUTTING_DOWN = "shutting_down"
    #: The stream was lost: reconnect (resuming, with a session).
    LOST = "lost"


@dataclass(frozen=True)
class Session:
    """A session the gateway granted."""

    session_id: int
    secret: bytes
    #: Seconds the session outlives a lost stream.
    grace: float


@dataclass(frozen=True)
class Registered:
    """What the `register_ack` said."""

    worker_id: int
    task_queue: str
    session: Session | None
    #: On a resume: the listed tasks the gateway still waits on; None for a registration.
    held: list[int] | None
    max_worker_frame_bytes: int


async def _frames(
    queue: asyncio.Queue[worker_pb2.WorkerFrame | None],
) -> AsyncIterator[worker_pb2.WorkerFrame]:
    while (frame := await queue.get()) is not None:
        yield frame


class Stream:
    """An open, registered worker stream on a channel of its own."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        call: grpc.aio.StreamStreamCall,  # type: ignore[type-arg]
        outbound: asyncio.Queue[worker_pb2.WorkerFrame | None],
    ) -> None:
        self._channel = channel
        self._call = call
        self._outbound = outbound

    @classmethod
    async def open(
        cls, connection: Connection, first: worker_pb2.WorkerFrame, timeout: float
    ) -> tuple[Stream, Registered]:
        """Opens a stream and sends `first` (a register or a resume); raises `GatewayError`
        (or `ResumeRefused`) when the gateway does not acknowledge it within `timeout` s."""
        resuming = first.WhichOneof("frame") == "resume"
        channel = connection.channel()
        outbound: asyncio.Queue[worker_pb2.WorkerFrame | None] = asyncio.Queue()
        outbound.put_nowait(first)
        try:
            method = channel.stream_stream(
                CONNECT_WORKER,
                request_serializer=worker_pb2.WorkerFrame.SerializeToString,
                response_deserializer=worker_pb2.GatewayFrame.FromString,
            )
            call = method(_frames(outbound), metadata=connection.metadata())
            frame = await asyncio.wait_for(call.read(), timeout)
        except grpc.aio.AioRpcError as rpc_error:
            await channel.close(grace=None)
            error = from_rpc_error(rpc_error)
            if resuming and error.sentence.startswith(_RESUME_REFUSED):
                raise ResumeRefused(error) from None
            raise error from None
        except (asyncio.TimeoutError, TimeoutError):
            await channel.close(grace=None)
            raise Unavailable(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no registration within {timeout} s"
            ) from None
        except BaseException:
            # Cancelled (the worker was stopped while connecting): the channel goes with it.
            await asyncio.shield(channel.close(grace=None))
            raise
        if not isinstance(frame, worker_pb2.GatewayFrame) or not frame.HasField("register_ack"):
            await channel.close(grace=None)
            raise Unavailable(
                grpc.StatusCode.UNAVAILABLE, "the gateway did not acknowledge the registration"
            )
        ack = frame.register_ack
        session = None
        if ack.session_id != 0 and ack.reconnect_grace_ms != 0 and len(ack.resume_secret) == 32:
            grace = ack.reconnect_grace_ms / 1000
            session = Session(ack.session_id, bytes(ack.resume_secret), grace)
        registered = Registered(
            worker_id=ack.worker_id,
            task_queue=ack.task_queue,
            session=session,
            held=list(ack.held_task_ids) if ack.resumed else None,
            max_worker_frame_bytes=ack.max_worker_frame_bytes or MAX_MESSAGE_BYTES,
        )
        return cls(channel, call, outbound), registered

    def send(self, frame: worker_pb2.WorkerFrame) -> None:
        """Queues a frame for the gateway."""
        self._outbound.put_nowait(frame)

    async def serve(self, keeper: TaskKeeper, max_frame_bytes: int) -> End:
        """Serves the stream until it ends; raises `GatewayError` for an ending the worker must
        not retry (a refused capacity, a malformed frame)."""
        pump = asyncio.get_running_loop().create_task(self._pump(keeper, max_frame_bytes))
        try:
            return await self._read(keeper)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _read(self, keeper: TaskKeeper) -> End:
        draining: End | None = None
        while True:
            try:
                frame = await self._call.read()
            except grpc.aio.AioRpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                if draining is not None:
                    log.info("the gateway ended the stream during the drain: %s", error)
                    return draining
                if is_permanent(error):
                    raise error from None
                log.warning("lost the gateway: %s", error)
                return End.LOST
            if not isinstance(frame, worker_pb2.GatewayFrame):
                if draining is not None:
                    return draining
                log.warning("lost the gateway: it closed the stream")
                return End.LOST
            kind = frame.WhichOneof("frame")
            if kind == "task":
                keeper.start(frame.task)
            elif kind == "ping":
                self.send(worker_pb2.WorkerFrame(pong=worker_pb2.Pong(seq=frame.ping.seq)))
            elif kind == "cancel":
                reason = _CANCEL_REASONS.get(frame.cancel.reason, CancelReason.UNSPECIFIED)
                keeper.cancel(frame.cancel.task_id, reason)
            elif kind == "results_ack":
                keeper.acknowledged(frame.results_ack.task_ids)
            elif kind == "drain":
                shutting_down = frame.drain.reason == worker_pb2.DrainRequest.REASON_SHUTTING_DOWN
                draining = End.SHUTTING_DOWN if shutting_down else End.DRAINED
                log.info(
                    "%s; finishing %d in-flight tasks",
                    "the gateway is shutting down" if shutting_down else "drain requested",
                    keeper.running,
                )

    async def _pump(self, keeper: TaskKeeper, max_frame_bytes: int) -> None:
        while True:
            frame = await keeper.next_reply()
            if frame.ByteSize() > max_frame_bytes:
                # The gateway would end the stream for it: fail the task here instead.
                task_id = frame.result.task_id
                size = len(frame.result.output)
                frame = failure_frame(
                    task_id,
                    f"output of {size} bytes exceeds the gateway's max_worker_frame_bytes "
                    f"{max_frame_bytes}",
                    False,
                )
            self.send(frame)

    async def close(self) -> None:
        """Half-closes and cancels the call and closes its channel."""
        self._outbound.put_nowait(None)
        self._call.cancel()
        await self._channel.close(grace=None)
