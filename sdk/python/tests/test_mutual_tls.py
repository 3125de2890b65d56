"""A worker and a producer authenticated by a client certificate instead of a token."""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from conftest import CERT_SUBJECT, PATIENCE, Gateway
from test_worker import NS

from switchyard import Completed, Connection, Producer, Unauthenticated, Worker


def openssl(*args: str, cwd: pathlib.Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("the mutual TLS test needs the openssl command to issue its certificates")
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=PATIENCE)


def issue_client_pki(directory: pathlib.Path) -> None:
    """A client CA (`client-ca.pem`) and a client certificate for CERT_SUBJECT signed by it."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "client-ca-key.pem", "-out", "client-ca.pem",
            "-subj", "/CN=python test client ca", "-days", "1",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign", cwd=directory)  # fmt: skip
    openssl("req", *ec, "-keyout", "client-key.pem", "-out", "client.csr",
            "-subj", f"/CN={CERT_SUBJECT}", cwd=directory)  # fmt: skip
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "client-ca.pem",
            "-CAkey", "client-ca-key.pem", "-CAcreateserial", "-out", "client.pem",
            "-days", "1", "-extfile", "client.ext", cwd=directory)  # fmt: skip


@pytest.fixture
def mtls_gateway(tmp_path: pathlib.Path) -> Iterator[Gateway]:
    """A gateway that accepts client certificates chaining to a fresh client CA."""
    issue_client_pki(tmp_path)
    running = Gateway(tmp_path, client_ca=tmp_path / "client-ca.pem")
    running.start()
    try:
        yield running
    finally:
        running.stop()


async def test_a_client_certificate_authenticates_the_worker_and_the_producer(
    mtls_gateway: Gateway, tmp_path: pathlib.Path
) -> None:
    certified = Connection(
        endpoint=mtls_gateway.endpoint,
        ca=mtls_gateway.ca,
        client_cert=tmp_path / "client.pem",
        client_key=tmp_path / "client-key.pem",
    )
    worker = Worker(namespaces=[NS], connection=certified, handle_signals=False)
    worker.register("echo", lambda context, data: data)
    async with worker.serving(), Producer(certified) as producer:
        listed = await producer.list_workers(namespace=NS)
        assert [(w.worker_id, w.principal) for w in listed] == [(worker.worker_id, "certified")]
        assert await producer.dispatch(NS, "echo", b"hi", timeout=PATIENCE) == Completed(b"hi")
    # Control: without the certificate (and without a token) the same worker is refused.
    anonymous = Worker(
        namespaces=[NS],
        connection=mtls_gateway.connection(token=None),
        handle_signals=False,
    )
    anonymous.register("echo", lambda context, data: data)
    with pytest.raises(Unauthenticated):
        await asyncio.wait_for(anonymous.run(), PATIENCE)
