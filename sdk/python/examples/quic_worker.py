"""A Switchyard QUIC worker written from `docs/quic-protocol.md` alone, on aioquic.

No Switchyard SDK is used: this is what a worker in a language without one needs, in one file.
It dials with ALPN `switchyard-worker/1`, sends `register` on the control stream, announces its
capacity once `registered` arrives, and serves the lanes the gateway opens: one task at a time
per lane, every `ping` answered on its lane, a `cancel` stopped and acknowledged, a lane's FIN
answered with its own. `drain()` asks the gateway to drain it. A worker that registers
`resumable` keeps a `Session` that outlives its connection: `resume()` on a new connection
carries on its tasks and resends the results not yet acknowledged (section 5.1). Datagram
copies (section 3.1), optional in the protocol, are left out.

    python examples/quic_worker.py --gateway 127.0.0.1:7701 \\
        --ca ~/.local/share/switchyard/tls/ca.pem --namespace default --activity echo

runs an `echo` worker (its output is its input) until interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamDataReceived
from google.protobuf.message import Message

from switchyard.v1 import common_pb2, quic_pb2

#: The only ALPN the gateway accepts (section 2.1).
ALPN = "switchyard-worker/1"
#: Body limits until `registered` states the gateway's (section 3).
CONTROL_FRAME_LIMIT = 65_536
LANE_FRAME_LIMIT = 4_194_304

#: An activity: takes the task, returns its output; an exception is a failure result.
Handler = Callable[[quic_pb2.QuicTask], Awaitable[bytes]]


class ProtocolError(Exception):
    """The gateway sent what the protocol does not allow; the worker closes the connection."""


@dataclass
class Closed:
    """How the connection ended: the application code and reason phrase (section 6)."""

    code: int
    reason: str


def frame(envelope: Message) -> bytes:
    """One frame: the body's length as a big-endian u32, then the body (section 3)."""
    body = envelope.SerializeToString()
    return struct.pack(">I", len(body)) + body


@dataclass
class FrameReader:
    """Splits one stream's bytes into frame bodies, checking each prefix against `limit`."""

    limit: int
    buffer: bytearray = field(default_factory=bytearray)

    def push(self, data: bytes) -> list[bytes]:
        self.buffer += data
        bodies = []
        while len(self.buffer) >= 4:
            (length,) = struct.unpack(">I", self.buffer[:4])
            if length > self.limit:
                raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self.limit}")
            if len(self.buffer) < 4 + length:
                break
            bodies.append(bytes(self.buffer[4 : 4 + length]))
            del self.buffer[: 4 + length]
        return bodies


@dataclass
class Task:
    """A task the worker runs, or has answered without seeing the answer acknowledged."""

    task_id: int
    #: The stream it is answered on; `None` after a resume until a `held` frame names a lane.
    lane: int | None
    runner: asyncio.Task[None] | None = None
    #: The gateway cancelled it on its lane.
    cancelled: bool = False
    #: Its result once sent, kept until a `results_ack` names it (resumable workers only).
    result: quic_pb2.QuicResult | None = None


class Session:
    """What outlives one connection (section 5.1): the activity, the capacity, the tasks running
    and the results not yet acknowledged, and, for a resumable worker, its id and secret."""

    def __init__(self, handler: Handler, capacity: int, resumable: bool) -> None:
        self.handler = handler
        self.capacity = capacity
        self.resumable = resumable
        self.session_id = 0
        self.secret = b""
        self.tasks: dict[int, Task] = {}
        #: The connection results go out on now.
        self.connection: Worker | None = None

    async def run(self, task: quic_pb2.QuicTask, held: Task) -> None:
        result = quic_pb2.QuicResult(task_id=task.task_id)
        try:
            result.output = await self.handler(task)
        except asyncio.CancelledError:
            self.tasks.pop(task.task_id, None)
            if held.cancelled and held.lane is not None and self.connection is not None:
                ack = quic_pb2.QuicCancelAck(task_id=task.task_id)
                self.connection.answer(held.lane, quic_pb2.QuicLaneUp(cancel_ack=ack))
            return
        except Exception as error:
            result.failure.CopyFrom(common_pb2.Failure(message=str(error), retryable=False))
        held.runner = None
        if self.resumable:
            held.result = result
        else:
            self.tasks.pop(task.task_id, None)
        # Without a lane yet (resuming), the `held` frame that names one sends it.
        if held.lane is not None and self.connection is not None:
            self.connection.answer(held.lane, quic_pb2.QuicLaneUp(result=result))


class Worker(QuicConnectionProtocol):
    """One connection, one registration or resume (section 1)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session = Session(echo, 1, resumable=False)
        self.control = -1
        self.registered: asyncio.Future[quic_pb2.QuicRegistered] = asyncio.Future()
        self.closed: asyncio.Future[Closed] = asyncio.Future()
        #: `drain` frames received (their reasons), in order.
        self.drains: list[int] = []
        #: Cancels received: (task id, reason).
        self.cancels: list[tuple[int, int]] = []
        #: Lanes (stream ids) that carried a frame, and those the gateway then retired (FIN).
        self.lanes: set[int] = set()
        self.retired: list[int] = []
        #: Set when the gateway retires a lane.
        self.lane_retired = asyncio.Event()
        self._readers: dict[int, FrameReader] = {}
        #: The task each busy lane carries.
        self._busy: dict[int, int] = {}
        self._lane_limit = LANE_FRAME_LIMIT

    def start(self, register: quic_pb2.QuicRegister, handler: Handler, capacity: int) -> None:
        """Opens the control stream and sends `register` (section 5, step 1)."""
        self.session = Session(handler, capacity, register.resumable)
        self.session.connection = self
        self._open_control(quic_pb2.QuicControlUp(register=register))

    def resume(self, session: Session, auth_token: str = "") -> None:
        """Sends `resume` for `session` (section 5.1), listing the tasks it still runs and the
        results it sent without an acknowledgement; this connection carries it from now on.
        aioquic grants 128 bidirectional streams: credit for every lane of a small worker."""
        self.session = session
        session.connection = self
        running: list[int] = []
        unacked: list[int] = []
        for held in session.tasks.values():
            held.lane = None
            (unacked if held.result is not None else running).append(held.task_id)
        resume = quic_pb2.QuicResume(
            protocol_version=1,
            auth_token=auth_token,
            session_id=session.session_id,
            resume_secret=session.secret,
            running_task_ids=running,
            unacked_task_ids=unacked,
        )
        self._open_control(quic_pb2.QuicControlUp(resume=resume))

    def _open_control(self, first: quic_pb2.QuicControlUp) -> None:
        self.control = self._quic.get_next_available_stream_id(is_unidirectional=False)
        self._readers[self.control] = FrameReader(CONTROL_FRAME_LIMIT)
        self._send(self.control, first)

    def resize(self, capacity: int) -> None:
        """Announces a new capacity (section 5, step 6): above the old one the gateway opens
        lanes first; below it, it retires lanes as their tasks end."""
        self.session.capacity = capacity
        capabilities = quic_pb2.QuicCapabilities(max_concurrency=capacity)
        self._send(self.control, quic_pb2.QuicControlUp(capabilities=capabilities))

    def drain(self) -> None:
        """Asks to be drained: the gateway closes with `DRAINED` once every task has ended."""
        self._send(self.control, quic_pb2.QuicControlUp(drain_request=quic_pb2.QuicDrainRequest()))

    def answer(self, lane: int, up: quic_pb2.QuicLaneUp) -> None:
        """Ends the task `lane` carries with `up` (a result or a cancel acknowledgement)."""
        self._busy.pop(lane, None)
        if not self.closed.done():
            self._send(lane, up)

    def _send(self, stream: int, envelope: Message) -> None:
        self._quic.send_stream_data(stream, frame(envelope))
        self.transmit()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            if not self.session.resumable and self.session.connection is self:
                # Nobody can take these results any more.
                for held in self.session.tasks.values():
                    if held.runner is not None:
                        held.runner.cancel()
            if not self.closed.done():
                self.closed.set_result(Closed(event.error_code, event.reason_phrase))
            return
        if not isinstance(event, StreamDataReceived):
            return
        stream = event.stream_id
        if stream != self.control:
            self.lanes.add(stream)
        reader = self._readers.setdefault(stream, FrameReader(self._lane_limit))
        try:
            for body in reader.push(event.data):
                if stream == self.control:
                    self._on_control(quic_pb2.QuicControlDown.FromString(body))
                else:
                    self._on_lane(stream, quic_pb2.QuicLaneDown.FromString(body))
        except ProtocolError as error:
            self._quic.close(error_code=0x10, reason_phrase=str(error))
            self.transmit()
            return
        if event.end_stream and stream != self.control:
            # The gateway retired the lane: finish our side (section 5, step 6).
            self._quic.send_stream_data(stream, b"", end_stream=True)
            self.transmit()
            self._readers.pop(stream, None)
            self.retired.append(stream)
            self.lane_retired.set()

    def _on_control(self, down: quic_pb2.QuicControlDown) -> None:
        kind = down.WhichOneof("frame")
        session = self.session
        if kind == "registered":
            registered = down.registered
            self._lane_limit = registered.max_lane_frame_bytes or LANE_FRAME_LIMIT
            if registered.resumed:
                # Let go of what the gateway no longer waits on.
                for task_id in set(session.tasks) - set(registered.held_task_ids):
                    gone = session.tasks.pop(task_id)
                    if gone.runner is not None:
                        gone.runner.cancel()
            else:
                session.session_id = registered.session_id
                session.secret = registered.resume_secret
            # aioquic grants 128 bidirectional streams, enough lanes for any capacity used here.
            self.resize(session.capacity)
            if not self.registered.done():
                self.registered.set_result(registered)
        elif kind == "drain":
            self.drains.append(down.drain.reason)
        elif kind == "results_ack":
            for task_id in down.results_ack.task_ids:
                acked = session.tasks.get(task_id)
                if acked is not None and acked.result is not None:
                    del session.tasks[task_id]
        else:
            raise ProtocolError("control: an envelope with no frame")

    def _on_lane(self, lane: int, down: quic_pb2.QuicLaneDown) -> None:
        kind = down.WhichOneof("frame")
        session = self.session
        if kind == "ping":
            self._send(lane, quic_pb2.QuicLaneUp(pong=quic_pb2.QuicPong(seq=down.ping.seq)))
        elif kind == "task":
            if lane in self._busy:
                raise ProtocolError(f"lane {lane // 4}: a second task on a busy lane")
            held = Task(down.task.task_id, lane)
            held.runner = asyncio.get_running_loop().create_task(session.run(down.task, held))
            session.tasks[held.task_id] = held
            self._busy[lane] = held.task_id
        elif kind == "held":
            resumed = session.tasks.get(down.held.task_id)
            if resumed is None:
                raise ProtocolError(f"held: task {down.held.task_id} was not listed")
            resumed.lane = lane
            self._busy[lane] = resumed.task_id
            # A result sent before the break goes again, here; a running task answers here.
            if resumed.result is not None:
                self.answer(lane, quic_pb2.QuicLaneUp(result=resumed.result))
        elif kind == "cancel":
            self.cancels.append((down.cancel.task_id, down.cancel.reason))
            target = session.tasks.get(down.cancel.task_id)
            # A cancel that crossed its task's result names no running task: ignore it.
            if target is not None and target.lane == lane and target.runner is not None:
                target.cancelled = True
                target.runner.cancel()
        else:
            raise ProtocolError(f"lane {lane // 4}: unexpected frame {kind}")


def configuration(ca: str, server_name: str = "localhost") -> QuicConfiguration:
    """QUIC v1 and TLS 1.3 with the protocol's ALPN, verifying the gateway against `ca`."""
    config = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], server_name=server_name)
    config.load_verify_locations(cafile=ca)
    config.idle_timeout = 30.0  # the worker's own choice (section 2.2)
    return config


@contextlib.asynccontextmanager
async def connected(host: str, port: int, config: QuicConfiguration) -> AsyncIterator[Worker]:
    """A connected [`Worker`], closed (`CLOSED`) when the block ends."""
    async with connect(host, port, configuration=config, create_protocol=Worker) as worker:
        assert isinstance(worker, Worker)
        yield worker


async def echo(task: quic_pb2.QuicTask) -> bytes:
    """The example activity: its output is its input."""
    return task.input


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="127.0.0.1:7701", help="HOST:PORT of quic.listen")
    parser.add_argument("--ca", required=True, help="the CA the gateway's certificate chains to")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--activity", default="echo")
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--token", default="", help="auth token, if the gateway wants one")
    args = parser.parse_args()
    host, port = args.gateway.rsplit(":", 1)
    register = quic_pb2.QuicRegister(
        protocol_version=1,
        namespaces=[args.namespace],
        activity_types=[args.activity],
        identity="examples/quic_worker.py",
        auth_token=args.token,
    )
    async with connected(host, int(port), configuration(args.ca)) as worker:
        worker.start(register, echo, args.capacity)
        registered = await worker.registered
        print(f"registered as worker {registered.worker_id}", flush=True)
        closed = await worker.closed
        print(f"closed: code {closed.code:#x}: {closed.reason}", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
