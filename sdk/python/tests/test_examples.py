"""The examples run as documented against the real gateway."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

from conftest import ADMIN_TOKEN, DEMO_TOKEN, PATIENCE, REPO, Gateway

EXAMPLES = REPO / "sdk" / "python" / "examples"


def example(
    name: str, gateway: Gateway, *args: str, token: str = ADMIN_TOKEN, **popen: object
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "sdk" / "python" / "src")}
    command = [sys.executable, str(EXAMPLES / name), "--endpoint", gateway.endpoint]
    command += ["--ca", str(gateway.ca), "--token", token, *args]
    return subprocess.Popen(command, env=env, text=True, **popen)  # type: ignore[call-overload]


def test_the_example_producer_gets_answers_from_the_example_worker(
    gateway: Gateway, tmp_path: pathlib.Path
) -> None:
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    worker = example("worker.py", gateway, stdout=log, stderr=subprocess.STDOUT)
    try:
        # A producer granted only `demo`, as a tenant's would be: its dispatch to another
        # namespace is the refusal the example shows.
        producer = example("producer.py", gateway, stdout=subprocess.PIPE, token=DEMO_TOKEN)
        output, _ = producer.communicate(timeout=PATIENCE)
        assert producer.returncode == 0
        lines = output.splitlines()
        assert lines[0] == "hello, world"
        assert lines[1] == "100/100 checksums completed"
        assert lines[2].startswith("refused as expected: "), lines
        assert "not-mine" in lines[2], lines
        # Control: the worker is still serving until it is told to stop, then leaves cleanly.
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=PATIENCE) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=PATIENCE)
        log.close()
    assert "drain requested" in pathlib.Path(tmp_path / "worker.log").read_text()
