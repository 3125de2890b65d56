"""Starts the real `switchyard` binary for the tests: TLS with its development CA, principals
with tokens, fast liveness, and every process killed when its test ends."""

from __future__ import annotations

import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from switchyard import Connection, Producer

REPO = pathlib.Path(__file__).resolve().parents[3]
#: Upper bound on every wait in the tests.
PATIENCE = 30.0
ADMIN_TOKEN = "admin-token-0123456789"
#: A principal granted only namespace `billing`.
BILLING_TOKEN = "billing-token-0123456789"
#: A producer granted only namespace `demo` (the examples' namespace).
DEMO_TOKEN = "demo-producer-token-0123456789"


def switchyard_binary() -> pathlib.Path:
    """`$PYSDK_SWITCHYARD_BIN`, else the debug build of this checkout."""
    default = REPO / "target" / "debug" / "switchyard"
    path = pathlib.Path(os.environ.get("PYSDK_SWITCHYARD_BIN", default))
    if not path.is_file():
        pytest.fail(f"no switchyard binary at {path}: cargo build -p switchyard first")
    return path


CONFIG = """
[grpc]
listen = "127.0.0.1:{port}"
tls = {grpc_tls}
reconnect_grace = "2s"
# One worker stream per connection: a test whose workers shared a connection would fail.
max_workers_per_connection = 1

[quic]
enabled = {quic}
listen = "127.0.0.1:{quic_port}"
redundancy = "{redundancy}"

[ops]
enabled = {ops}
listen = "127.0.0.1:0"

[tls]
data_dir = "{data_dir}"
{client_ca}

[shutdown]
drain_timeout = "3s"

[liveness]
ping_interval = "200ms"
ping_timeout = "500ms"
miss_threshold = 2
heartbeat_window = "3s"

[log]
filter = "warn"

[[principals]]
name = "admin"
token = "{admin}"
namespaces = ["*"]
roles = ["admin"]

[[principals]]
name = "billing"
token = "{billing}"
namespaces = ["billing"]
roles = ["worker", "producer"]

[[principals]]
name = "certified"
cert_subject = "{cert_subject}"
namespaces = ["tests"]
roles = ["worker", "producer"]

[[principals]]
name = "demo-producer"
token = "{demo}"
namespaces = ["demo"]
roles = ["producer"]
"""
#: Subject common name of the client certificate the gateway maps to principal `certified`.
CERT_SUBJECT = "python-worker"


class Gateway:
    """One `switchyard serve` process at a time, on one port and one data directory."""

    def __init__(
        self,
        directory: pathlib.Path,
        client_ca: pathlib.Path | None = None,
        quic: bool = False,
        redundancy: bool = False,
        ops: bool = False,
        plaintext: bool = False,
    ) -> None:
        self.directory = directory
        #: CA that client certificates must chain to (mutual TLS); None for tokens only.
        self.client_ca = client_ca
        #: Whether the QUIC listener runs too (on `quic_port`).
        self.quic = quic
        #: Whether the QUIC listener sends datagram copies to workers that ask (`datagram`).
        self.redundancy = redundancy
        #: Whether the operations listener (`/metrics`) runs, on `ops_port`.
        self.ops = ops
        #: Whether the gRPC listener serves plaintext HTTP/2 (`grpc.tls = false`).
        self.plaintext = plaintext
        self.ops_port = 0
        self.data_dir = directory / "data"
        self.port = 0
        self.quic_port = 0
        self.process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    @property
    def ca(self) -> pathlib.Path:
        """The development CA the gateway generated."""
        return self.data_dir / "tls" / "ca.pem"

    @property
    def endpoint(self) -> str:
        """`127.0.0.1:PORT` of the gRPC listener."""
        return f"127.0.0.1:{self.port}"

    def connection(self, token: str | None = ADMIN_TOKEN) -> Connection:
        """A connection trusting the development CA, with `token`."""
        return Connection(endpoint=self.endpoint, ca=self.ca, token=token)

    def start(self) -> None:
        """Starts the gateway (on the port it had before, if any) and waits for its banner."""
        config = self.directory / "switchyard.toml"
        config.write_text(
            CONFIG.format(
                port=self.port,
                quic="true" if self.quic else "false",
                quic_port=self.quic_port,
                redundancy="datagram" if self.redundancy else "off",
                ops="true" if self.ops else "false",
                grpc_tls="false" if self.plaintext else "true",
                data_dir=self.data_dir,
                admin=ADMIN_TOKEN,
                billing=BILLING_TOKEN,
                demo=DEMO_TOKEN,
                cert_subject=CERT_SUBJECT,
                client_ca=f'client_ca = "{self.client_ca}"' if self.client_ca else "",
            )
        )
        stderr = open(self.directory / "gateway.err", "a")  # noqa: SIM115 - owned by the child
        # The gateway refuses SWITCHYARD_* variables it does not know; the file says it all.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
        self.process = subprocess.Popen(
            [str(switchyard_binary()), "serve", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        stderr.close()
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.process, self._lines), daemon=True).start()
        banner = self._line(r"grpc\s+tcp\s+127\.0\.0\.1:(\d+)")
        self.port = int(banner.group(1))
        if self.quic:
            # The banner lists the QUIC listener after the gRPC one, the operations one last.
            self.quic_port = int(self._line(r"quic\s+udp\s+127\.0\.0\.1:(\d+)").group(1))
        if self.ops:
            self.ops_port = int(self._line(r"ops\s+http://127\.0\.0\.1:(\d+)").group(1))

    @staticmethod
    def _read(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    def _line(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + PATIENCE
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if found := re.search(pattern, line):
                return found
        errors = (self.directory / "gateway.err").read_text()[-4000:]
        code = self.process.poll() if self.process else None
        pytest.fail(
            f"the gateway printed no line matching {pattern!r} (exit {code}); stderr:\n{errors}"
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signals the gateway and waits (bounded) for it to exit; kills it if it does not."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
        try:
            process.wait(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=PATIENCE)


@pytest.fixture
def gateway(tmp_path: pathlib.Path) -> Iterator[Gateway]:
    """A running gateway, killed when the test ends."""
    running = Gateway(tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop(signal.SIGKILL)


@pytest.fixture
async def producer(gateway: Gateway) -> AsyncIterator[Producer]:
    """An admin producer on the test's gateway."""
    async with Producer(gateway.connection()) as client:
        yield client


class WorkerProcess:
    """`tests/worker_process.py` in a child process, killed when the test ends."""

    def __init__(self, gateway: Gateway, *args: str) -> None:
        script = pathlib.Path(__file__).with_name("worker_process.py")
        env = {**os.environ, "PYTHONPATH": str(REPO / "sdk" / "python" / "src")}
        self.process = subprocess.Popen(
            [sys.executable, str(script), gateway.endpoint, str(gateway.ca), ADMIN_TOKEN, *args],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def line(self) -> str:
        """The child's next stdout line (bounded wait)."""
        lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            return lines.get(timeout=PATIENCE).strip()
        except queue.Empty:
            pytest.fail("the worker process printed nothing")

    def kill(self) -> None:
        """Kills the child (after thawing it, should it be stopped)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=PATIENCE)


@pytest.fixture
def worker_processes() -> Iterator[list[WorkerProcess]]:
    """Worker children started by the test, killed when it ends."""
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        for child in started:
            child.kill()
