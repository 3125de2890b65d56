"""A Switchyard QUIC worker written from `docs/quic-protocol.md` alone, on aioquic.

No Switchyard SDK is used: this is what a worker in a language without one needs, in one file.
It dials with ALPN `switchyard-worker/1`, sends `register` on the control stream, announces its
capacity once `registered` arrives, and serves the lanes the gateway opens: one task at a time
per lane, every `ping` answered on its lane, a `cancel` stopped and acknowledged, a lane's FIN
answered with its own (a task still running on it is stopped: nobody will take its result).
`resize()` announces another capacity and `drain()` asks the gateway to drain the worker. A
worker that registers `resumable` keeps a `Session` that outlives its connection: `resume()` on
a new connection carries on its tasks and sends again the results not yet acknowledged (section
5.1). A worker that registers with `redundancy` (and dials with `configuration(...,
datagrams=True)`) takes datagram copies of tasks and sends copies of its results (section
3.1).

    python examples/quic_worker.py --gateway 127.0.0.1:7701 \\
        --ca ~/.local/share/switchyard/tls/ca.pem --namespace default --activity echo

runs an `echo` worker (its output is its input) until its connection ends. A real worker then
reconnects with backoff and jitter, resuming its session if it has one (section 8, steps 7 and
8); this example stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    DatagramFrameReceived,
    QuicEvent,
    StreamDataReceived,
)
from google.protobuf.message import DecodeError, Message

from switchyard.v1 import common_pb2, quic_pb2

#: The only ALPN the gateway accepts (section 2.1).
ALPN = "switchyard-worker/1"
#: Body limits until `registered` states the gateway's (section 3).
CONTROL_FRAME_LIMIT = 65_536
LANE_FRAME_LIMIT = 4_194_304
#: Bidirectional streams aioquic lets the gateway open: the most lanes, so the most capacity.
STREAM_CREDIT = 128
#: A keep-alive this often (section 8, step 9): once the gateway is gone, it draws the
#: stateless reset of a restarted gateway within seconds.
KEEP_ALIVE = 2.0

#: The datagram frame size a worker asking for redundancy offers (section 2.2).
MAX_DATAGRAM_FRAME = 65_535
#: A result's datagram copy leaves this long after its lane copy, in another packet (3.1).
COPY_SPACING = 0.005
#: The largest copy sent: room in one packet on any path (QUIC's 1,200-byte minimum, less
#: headers); a larger result goes by its lane alone.
MAX_COPY_BYTES = 1_000

#: Application codes of section 6 this worker sends or acts on.
CLOSED = 0x00
DEREGISTERED = 0x27
PROTOCOL_VIOLATION = 0x10
MALFORMED_FRAME = 0x11
FRAME_TOO_LARGE = 0x12
SUPERSEDED = 0x2A

#: An activity: takes the task, returns its output; an exception is a failure result.
Handler = Callable[[quic_pb2.QuicTask], Awaitable[bytes]]


class ProtocolError(Exception):
    """The gateway sent what the protocol does not allow: the worker closes with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass
class Closed:
    """How the connection ended (section 6): the code and reason phrase of an application
    close, or (`application` false) a QUIC transport error or the idle timeout."""

    code: int
    reason: str
    application: bool

    def keeps_session(self) -> bool:
        """Whether a session survives this end (section 5.1): a loss does, and so does the
        gateway's close for silence (`DEREGISTERED`, reason ending `timeout`); a close the
        gateway or the worker decided otherwise ends it."""
        if not self.application:
            return True
        return self.code == DEREGISTERED and self.reason.endswith("timeout")


def frame(envelope: Message) -> bytes:
    """One frame: the body's length as a big-endian u32, then the body (section 3)."""
    body = envelope.SerializeToString()
    return struct.pack(">I", len(body)) + body


@dataclass
class FrameReader:
    """Splits one stream's bytes into frame bodies, checking each prefix against `limit`."""

    limit: int
    buffer: bytearray = field(default_factory=bytearray)

    def push(self, data: bytes, stream: str) -> list[bytes]:
        self.buffer += data
        bodies = []
        while len(self.buffer) >= 4:
            (length,) = struct.unpack(">I", self.buffer[:4])
            if length > self.limit:
                raise ProtocolError(
                    FRAME_TOO_LARGE,
                    f"{stream}: frame of {length} bytes exceeds the limit of {self.limit} bytes",
                )
            if len(self.buffer) < 4 + length:
                break
            bodies.append(bytes(self.buffer[4 : 4 + length]))
            del self.buffer[: 4 + length]
        return bodies


def decode(kind: type[Any], body: bytes, stream: str) -> Any:
    """`body` as the envelope `kind`; a body that does not decode, or sets no variant, is
    malformed (section 3)."""
    try:
        envelope = kind.FromString(body)
    except DecodeError as error:
        raise ProtocolError(MALFORMED_FRAME, f"{stream}: {error}") from error
    if envelope.WhichOneof("frame") is None:
        raise ProtocolError(MALFORMED_FRAME, f"{stream}: an envelope with no frame")
    return envelope


@dataclass
class Task:
    """A task the worker runs, or has answered without seeing the answer acknowledged."""

    task_id: int
    #: The connection and stream it is answered on; `None` after a resume until a `held` frame
    #: names a lane of the new connection.
    connection: Worker | None
    lane: int | None
    runner: asyncio.Task[None] | None = None
    #: The gateway cancelled it on its lane.
    cancelled: bool = False
    #: Its result, once the handler returned; kept until a `results_ack` names it
    #: (resumable workers only).
    result: quic_pb2.QuicResult | None = None
    #: The result went out on a lane.
    sent: bool = False
    #: The task's number on its lane, for datagram copies (section 3.1).
    seq: int = 0


class Session:
    """What outlives one connection (section 5.1): the activity, the capacity, the tasks running
    and the results not yet acknowledged, and, for a resumable worker, its id and secret."""

    def __init__(
        self,
        handler: Handler,
        capacity: int,
        resumable: bool,
        redundancy: quic_pb2.QuicRedundancy = quic_pb2.QUIC_REDUNDANCY_OFF,
    ) -> None:
        if not 1 <= capacity <= STREAM_CREDIT:
            raise ValueError(f"capacity {capacity}: 1 to {STREAM_CREDIT} (aioquic's credit)")
        self.handler = handler
        self.capacity = capacity
        self.resumable = resumable
        #: What the worker asked for in `register`, asked again in each `resume`.
        self.redundancy = redundancy
        self.session_id = 0
        self.secret = b""
        self.grace = 0.0
        #: When the last connection was lost (monotonic seconds), for the grace.
        self.lost_at: float | None = None
        self.tasks: dict[int, Task] = {}
        #: The connection results go out on now.
        self.connection: Worker | None = None

    def let_go(self) -> None:
        """Stops every task and forgets every result: the session is over."""
        for task in self.tasks.values():
            if task.runner is not None:
                task.runner.cancel()
        self.tasks.clear()

    async def run(self, task: quic_pb2.QuicTask, held: Task) -> None:
        result = quic_pb2.QuicResult(task_id=task.task_id)
        try:
            result.output = await self.handler(task)
        except asyncio.CancelledError:
            self.tasks.pop(task.task_id, None)
            if held.cancelled and held.connection is not None and held.lane is not None:
                ack = quic_pb2.QuicCancelAck(task_id=task.task_id)
                held.connection.answer(held.lane, quic_pb2.QuicLaneUp(cancel_ack=ack))
            return
        except Exception as error:
            result.failure.CopyFrom(common_pb2.Failure(message=str(error), retryable=False))
        limit = self.connection.lane_limit() if self.connection is not None else LANE_FRAME_LIMIT
        size = quic_pb2.QuicLaneUp(result=result).ByteSize()
        if size > limit:
            # Section 4.4: never a frame the gateway would close for; the sentence every SDK uses.
            message = f"result of {size} bytes exceeds the gateway's frame limit of {limit} bytes"
            result = quic_pb2.QuicResult(task_id=task.task_id)
            result.failure.CopyFrom(common_pb2.Failure(message=message, retryable=False))
        held.runner = None
        held.result = result
        if not self.resumable:
            self.tasks.pop(task.task_id, None)
        # Without a lane yet (resuming), the `held` frame that names one sends it.
        if held.connection is not None and held.lane is not None:
            up = quic_pb2.QuicLaneUp(result=result)
            held.sent = held.connection.answer(held.lane, up, held.seq)


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
        #: Cancels received: (task id, reason); `cancel_heard` is set at each.
        self.cancels: list[tuple[int, int]] = []
        self.cancel_heard = asyncio.Event()
        #: Lanes (stream ids) that carried a frame, and those the gateway then retired (FIN).
        self.lanes: set[int] = set()
        self.retired: list[int] = []
        #: Set when the gateway retires a lane, and when the first lane shows itself.
        self.lane_retired = asyncio.Event()
        self.first_lane = asyncio.Event()
        self._readers: dict[int, FrameReader] = {}
        #: The task each busy lane carries.
        self._busy: dict[int, int] = {}
        #: Lanes this worker finished: nothing more is written on them.
        self._finished: set[int] = set()
        #: Lane copies of results whose datagram copy went first, not sent yet, in order.
        self._late: dict[int, list[quic_pb2.QuicLaneUp]] = {}
        #: Datagram copies (section 3.1): in force, per lane the task frames read and the
        #: highest task number started, and what the copies did.
        self.redundancy = False
        self._task_frames: dict[int, int] = {}
        self._started: dict[int, int] = {}
        #: Tasks started from a datagram copy, and copies dropped as second of a pair;
        #: `copy_heard` is set at each task copy.
        self.started_by_datagram = 0
        self.copies_dropped = 0
        self.copy_heard = asyncio.Event()
        #: Send a result's datagram copy before its lane copy instead of after, and read a
        #: lane's task frames this many seconds late, as if their packets were lost (tests).
        self.result_copy_first = False
        self.lane_task_delay = 0.0
        #: Drop results instead of sending them, as if their packets were lost and the
        #: connection then failed (tests); `result_lost` is set at each.
        self.results_lost = False
        self.result_lost = asyncio.Event()
        self._keep_alive: asyncio.Task[None] | None = None

    def start(self, register: quic_pb2.QuicRegister, handler: Handler, capacity: int) -> None:
        """Opens the control stream and sends `register` (section 5, step 1)."""
        self.session = Session(handler, capacity, register.resumable, register.redundancy)
        self.session.connection = self
        self._open_control(quic_pb2.QuicControlUp(register=register))

    def resume(self, session: Session, auth_token: str = "") -> None:
        """Sends `resume` for `session` (section 5.1), listing the tasks it still runs (or has
        answered on no lane) and the results it sent without an acknowledgement; this connection
        carries the session from now on. aioquic grants 128 bidirectional streams: credit for
        every lane the session can need."""
        lost_for = time.monotonic() - (session.lost_at or time.monotonic())
        if session.session_id == 0 or lost_for > session.grace:
            raise ValueError("no session to resume (none granted, or its grace passed)")
        self.session = session
        session.connection = self
        running: list[int] = []
        unacked: list[int] = []
        for held in session.tasks.values():
            held.connection, held.lane = None, None
            (unacked if held.sent else running).append(held.task_id)
        resume = quic_pb2.QuicResume(
            protocol_version=1,
            auth_token=auth_token,
            session_id=session.session_id,
            resume_secret=session.secret,
            running_task_ids=running,
            unacked_task_ids=unacked,
            redundancy=session.redundancy,
        )
        self._open_control(quic_pb2.QuicControlUp(resume=resume))

    def resize(self, capacity: int) -> None:
        """Announces a new capacity (section 5, step 6): above the old one the gateway opens
        lanes first; below it, it retires lanes as their tasks end."""
        if not 1 <= capacity <= STREAM_CREDIT:
            raise ValueError(f"capacity {capacity}: 1 to {STREAM_CREDIT} (aioquic's credit)")
        if self.registered.done() and capacity > self.registered.result().max_concurrency_limit:
            # More would be closed `CAPACITY_REFUSED`, a final code.
            raise ValueError(f"capacity {capacity}: above the gateway's limit")
        self.session.capacity = capacity
        capabilities = quic_pb2.QuicCapabilities(max_concurrency=capacity)
        self._send(self.control, quic_pb2.QuicControlUp(capabilities=capabilities))

    def drain(self) -> None:
        """Asks to be drained: the gateway closes with `DRAINED` once every task has ended."""
        self._send(self.control, quic_pb2.QuicControlUp(drain_request=quic_pb2.QuicDrainRequest()))

    def answer(self, lane: int, up: quic_pb2.QuicLaneUp, seq: int = 0) -> bool:
        """Ends the task `lane` carries with `up` (a result or a cancel acknowledgement);
        `False` when the lane or the connection is gone and nothing was sent. With redundancy
        in force a result (task number `seq` on the lane) also goes as a datagram copy."""
        self._busy.pop(lane, None)
        if self.closed.done() or lane in self._finished:
            return False
        if self.results_lost and up.WhichOneof("frame") == "result":
            self.result_lost.set()
            return True
        copy = None
        if self.redundancy and up.WhichOneof("frame") == "result" and seq > 0:
            copy = quic_pb2.QuicDatagramUp(lane=lane // 4, seq=seq, result=up.result)
        if copy is not None and self.result_copy_first:
            self._send_datagram(copy)
            self._late.setdefault(lane, []).append(up)
            asyncio.get_running_loop().call_later(COPY_SPACING, self._send_late, lane)
            return True
        self._send(lane, up)
        if copy is not None:
            asyncio.get_running_loop().call_later(COPY_SPACING, self._send_datagram, copy)
        return True

    def _send_late(self, lane: int) -> None:
        """The lane copy of a result whose datagram copy went first: every result MUST go on
        its lane too (section 3.1)."""
        pending = self._late.get(lane)
        if not pending:
            return
        up = pending.pop(0)
        if not self.closed.done() and lane not in self._finished:
            self._send(lane, up)

    def _send_datagram(self, copy: quic_pb2.QuicDatagramUp) -> None:
        # A copy larger than the peer takes is not sent: the lane copy suffices (3.1).
        data = copy.SerializeToString()
        limit = self._quic._remote_max_datagram_frame_size
        if self.closed.done() or limit is None or len(data) > min(limit, MAX_COPY_BYTES):
            return
        self._quic.send_datagram_frame(data)
        self.transmit()

    def _open_control(self, first: quic_pb2.QuicControlUp) -> None:
        self.control = self._quic.get_next_available_stream_id(is_unidirectional=False)
        self._readers[self.control] = FrameReader(CONTROL_FRAME_LIMIT)
        self._send(self.control, first)
        self._keep_alive = asyncio.get_running_loop().create_task(self._keep_alive_loop())

    async def _keep_alive_loop(self) -> None:
        while not self.closed.done():
            await asyncio.sleep(KEEP_ALIVE)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ping(), KEEP_ALIVE)

    def _send(self, stream: int, envelope: Message) -> None:
        self._quic.send_stream_data(stream, frame(envelope))
        self.transmit()

    def _close(self, error: ProtocolError) -> None:
        self._quic.close(error_code=error.code, reason_phrase=str(error))
        self.transmit()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self._terminated(event)
            return
        if isinstance(event, DatagramFrameReceived) and not self.closed.done():
            try:
                self._on_datagram(event.data)
            except ProtocolError as error:
                self._close(error)
            return
        if not isinstance(event, StreamDataReceived) or self.closed.done():
            return
        stream = event.stream_id
        name = "control stream" if stream == self.control else f"lane {stream // 4}"
        if stream != self.control:
            self.lanes.add(stream)
            self.first_lane.set()
        limit = self.lane_limit() if stream != self.control else self._control_limit()
        reader = self._readers.setdefault(stream, FrameReader(limit))
        try:
            for body in reader.push(event.data, name):
                if stream == self.control:
                    self._on_control(decode(quic_pb2.QuicControlDown, body, name))
                else:
                    self._on_lane(stream, decode(quic_pb2.QuicLaneDown, body, name))
            if event.end_stream:
                if reader.buffer:
                    raise ProtocolError(MALFORMED_FRAME, f"{name} ended inside a frame")
                if stream != self.control:
                    self._retired(stream)
        except ProtocolError as error:
            self._close(error)

    def _terminated(self, event: ConnectionTerminated) -> None:
        closed = Closed(event.error_code, event.reason_phrase, event.frame_type is None)
        if self._keep_alive is not None:
            self._keep_alive.cancel()
        session = self.session
        if session.connection is self:
            if session.resumable and closed.keeps_session():
                session.lost_at = time.monotonic()
            else:
                # Nobody can take these results any more.
                session.let_go()
        if not self.closed.done():
            self.closed.set_result(closed)

    def _retired(self, lane: int) -> None:
        """The gateway finished its side of `lane` (a shrink, or the close to come): finish
        ours, and stop a task still running there (section 5, steps 6 and 7)."""
        while self._late.get(lane):
            self._send_late(lane)
        self._finished.add(lane)
        self._quic.send_stream_data(lane, b"", end_stream=True)
        self.transmit()
        self._readers.pop(lane, None)
        task_id = self._busy.pop(lane, None)
        task = self.session.tasks.get(task_id) if task_id is not None else None
        if task is not None and task.connection is self and task.lane == lane:
            del self.session.tasks[task.task_id]
            if task.runner is not None:
                task.runner.cancel()
        self.retired.append(lane)
        self.lane_retired.set()

    def _control_limit(self) -> int:
        """The gateway's control frame limit once `registered` stated it (section 3)."""
        stated = self.registered.result().max_control_frame_bytes if self.registered.done() else 0
        return stated or CONTROL_FRAME_LIMIT

    def lane_limit(self) -> int:
        """The gateway's lane frame limit once `registered` stated it (section 3)."""
        stated = self.registered.result().max_lane_frame_bytes if self.registered.done() else 0
        return stated or LANE_FRAME_LIMIT

    def _on_control(self, down: quic_pb2.QuicControlDown) -> None:
        kind = down.WhichOneof("frame")
        session = self.session
        if kind == "registered":
            registered = down.registered
            if registered.resumed:
                session.lost_at = None
                # Let go of what the gateway no longer waits on.
                for task_id in set(session.tasks) - set(registered.held_task_ids):
                    gone = session.tasks.pop(task_id)
                    if gone.runner is not None:
                        gone.runner.cancel()
            else:
                session.session_id = registered.session_id
                session.secret = registered.resume_secret
                session.grace = registered.reconnect_grace_ms / 1000
            self.redundancy = registered.redundancy == quic_pb2.QUIC_REDUNDANCY_DATAGRAM
            if not self.registered.done():
                self.registered.set_result(registered)
            # The gateway's limits from now on, for the streams already read too.
            self._readers[self.control].limit = self._control_limit()
            for stream, reader in self._readers.items():
                if stream != self.control:
                    reader.limit = self.lane_limit()
            self.resize(session.capacity)
        elif kind == "drain":
            self.drains.append(down.drain.reason)
        elif kind == "results_ack":
            for task_id in down.results_ack.task_ids:
                acked = session.tasks.get(task_id)
                if acked is not None and acked.sent:
                    del session.tasks[task_id]

    def _start(self, lane: int, seq: int, task: quic_pb2.QuicTask) -> None:
        """Starts `task`, number `seq` on `lane`. The gateway sends one task at a time per
        lane (section 4.3); a second one would run too, as the reference SDK does (no close
        code exists for it)."""
        session = self.session
        self._started[lane] = seq
        held = Task(task.task_id, self, lane, seq=seq)
        held.runner = asyncio.get_running_loop().create_task(session.run(task, held))
        session.tasks[held.task_id] = held
        self._busy[lane] = held.task_id

    def _lane_task(self, lane: int, task: quic_pb2.QuicTask) -> None:
        """A task frame read on `lane`: the k-th is task number k (section 3.1), started only
        if no datagram copy started it first."""
        if self.closed.done() or lane in self._finished or self.session.connection is not self:
            return
        seq = self._task_frames.get(lane, 0) + 1
        self._task_frames[lane] = seq
        if seq <= self._started.get(lane, 0):
            self.copies_dropped += 1
            self.copy_heard.set()
            return
        self._start(lane, seq, task)

    def _on_datagram(self, data: bytes) -> None:
        """A datagram copy of a task (section 3.1): it starts the task only when its number is
        the next one on a lane already seen and not busy; any other copy is dropped."""
        if not self.redundancy:
            return  # ignored while redundancy is not in force
        self.copy_heard.set()
        try:
            copy = quic_pb2.QuicDatagramDown.FromString(data)
        except DecodeError as error:
            raise ProtocolError(MALFORMED_FRAME, f"datagram: {error}") from error
        if not copy.HasField("task"):
            raise ProtocolError(MALFORMED_FRAME, "datagram: a copy with no task")
        lane = 4 * copy.lane + 1
        next_seq = self._started.get(lane, 0) + 1
        busy = lane in self._busy or lane in self._finished
        if lane not in self.lanes or busy or copy.seq != next_seq:
            self.copies_dropped += 1
            return
        if self.session.connection is not self:
            return
        self.started_by_datagram += 1
        self._start(lane, copy.seq, copy.task)

    def _on_lane(self, lane: int, down: quic_pb2.QuicLaneDown) -> None:
        kind = down.WhichOneof("frame")
        session = self.session
        if kind == "ping":
            self._send(lane, quic_pb2.QuicLaneUp(pong=quic_pb2.QuicPong(seq=down.ping.seq)))
            return
        if session.connection is not self:
            # A connection the session has left (a resume is under way elsewhere): its tasks
            # reach the session through the gateway's `held` frames on the new one.
            return
        if kind == "task":
            if self.lane_task_delay > 0:
                loop = asyncio.get_running_loop()
                loop.call_later(self.lane_task_delay, self._lane_task, lane, down.task)
            else:
                self._lane_task(lane, down.task)
        elif kind == "held":
            self._task_frames[lane] = self._task_frames.get(lane, 0) + 1
            self._started[lane] = self._task_frames[lane]
            resumed = session.tasks.get(down.held.task_id)
            if resumed is None:
                raise ProtocolError(
                    PROTOCOL_VIOLATION, f"held: task {down.held.task_id} was not listed"
                )
            # Its number on this lane is the held frame's: a result copy quotes it.
            resumed.connection, resumed.lane = self, lane
            resumed.seq = self._task_frames[lane]
            self._busy[lane] = resumed.task_id
            # A result sent before the break goes again, here; a running task answers here.
            if resumed.result is not None:
                up = quic_pb2.QuicLaneUp(result=resumed.result)
                resumed.sent = self.answer(lane, up, resumed.seq)
        elif kind == "cancel":
            self.cancels.append((down.cancel.task_id, down.cancel.reason))
            self.cancel_heard.set()
            target = session.tasks.get(down.cancel.task_id)
            # A cancel that crossed its task's result names no running task: ignore it.
            if target is not None and target.lane == lane and target.runner is not None:
                target.cancelled = True
                target.runner.cancel()


def configuration(
    ca: str, server_name: str = "localhost", datagrams: bool = False
) -> QuicConfiguration:
    """QUIC v1 and TLS 1.3 with the protocol's ALPN, verifying the gateway against `ca`; with
    `datagrams`, offering the datagram frames a request for redundancy needs (section 2.2)."""
    config = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], server_name=server_name)
    config.load_verify_locations(cafile=ca)
    config.idle_timeout = 30.0  # the worker's own choice (section 2.2)
    if datagrams:
        config.max_datagram_frame_size = MAX_DATAGRAM_FRAME
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
    parser.add_argument("--capacity", type=int, default=4, help=f"1 to {STREAM_CREDIT}")
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
        kind = "code" if closed.application else "transport error"
        print(f"closed: {kind} {closed.code:#x}: {closed.reason}", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
