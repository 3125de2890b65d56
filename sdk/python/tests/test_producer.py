"""The producer against the real gateway: typed refusals, `dispatch_many` exactly once, and
the operator calls."""

from __future__ import annotations

import asyncio
import collections
import pathlib
from collections.abc import Iterator

import pytest
from conftest import ADMIN_TOKEN, BILLING_TOKEN, PATIENCE, Gateway
from test_worker import NS, eventually, new_worker

from switchyard import (
    ActivityContext,
    AlreadyExists,
    Completed,
    Connection,
    DispatchRequest,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Producer,
    Unauthenticated,
    Unavailable,
    Unserved,
    Worker,
)
from switchyard.v1 import gateway_pb2


async def test_refusals_raise_the_exception_of_their_status(
    gateway: Gateway, producer: Producer
) -> None:
    with pytest.raises(InvalidArgument) as invalid:
        await producer.dispatch("", "echo")
    assert "namespace" in invalid.value.sentence
    with pytest.raises(NotFound):
        await producer.cancel(NS, "no-such-dispatch")
    async with Producer(gateway.connection(BILLING_TOKEN)) as billing:
        with pytest.raises(PermissionDenied) as denied:
            await billing.dispatch("payroll", "echo", timeout=1)
        assert "payroll" in denied.value.sentence
        # Control: the same principal may dispatch in its own namespace.
        assert isinstance(await billing.dispatch("billing", "echo", timeout=0.2), Unserved)
    async with Producer(gateway.connection("wrong-token-0123456789")) as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.list_workers()


async def test_a_worker_refused_for_good_raises_from_run(gateway: Gateway) -> None:
    worker = Worker(
        namespaces=["payroll"],
        connection=gateway.connection(BILLING_TOKEN),
        handle_signals=False,
    )
    worker.register("echo", lambda context, data: data)
    with pytest.raises(PermissionDenied):
        await asyncio.wait_for(worker.run(), PATIENCE)
    # A bad credential is refused for good too (docs/python.md, "Refusals").
    stranger = Worker(
        namespaces=["payroll"],
        connection=gateway.connection("wrong-token-0123456789"),
        handle_signals=False,
    )
    stranger.register("echo", lambda context, data: data)
    with pytest.raises(Unauthenticated):
        await asyncio.wait_for(stranger.run(), PATIENCE)


async def test_a_duplicate_activity_id_is_already_exists(
    gateway: Gateway, producer: Producer
) -> None:
    first = asyncio.ensure_future(
        producer.dispatch(NS, "nobody", activity_id="dup", timeout=PATIENCE)
    )

    async def parked() -> bool:
        return bool(await producer.unserved())

    await eventually(parked, "the first dispatch waits")
    with pytest.raises(AlreadyExists):
        await producer.dispatch(NS, "nobody", activity_id="dup", timeout=1)
    queues = await producer.unserved()
    assert [(q.namespace, q.activity_type, q.waiting) for q in queues] == [(NS, "nobody", 1)]
    await producer.cancel(NS, "dup")
    await asyncio.wait_for(first, PATIENCE)


async def test_dispatch_many_completes_a_thousand_tasks_exactly_once(
    gateway: Gateway, producer: Producer
) -> None:
    seen: collections.Counter[bytes] = collections.Counter()
    worker = new_worker(gateway, max_concurrency=64)

    @worker.activity("count")
    async def count(context: ActivityContext, data: bytes) -> bytes:
        seen[data] += 1
        return data[::-1]

    requests = [
        DispatchRequest(NS, "count", b"task-%04d" % i, timeout=PATIENCE) for i in range(1000)
    ]
    # One refused request in the middle: it is answered on its own and the others go on.
    requests.insert(500, DispatchRequest(NS, "", b"refused"))
    results = {}
    async with worker.serving():
        async for result in producer.dispatch_many(requests, max_outstanding=100):
            assert result.index not in results, "one reply per request"
            results[result.index] = result
    assert len(results) == 1001
    refused = results.pop(500)
    assert isinstance(refused.error, InvalidArgument) and refused.outcome is None
    for index, result in results.items():
        expected = requests[index].input
        assert result.outcome == Completed(expected[::-1]), index
    assert len(seen) == 1000 and set(seen.values()) == {1}, "each task ran exactly once"


async def test_dispatch_many_keeps_at_most_max_outstanding_unanswered(
    gateway: Gateway, producer: Producer
) -> None:
    """`docs/python.md`: at most N unanswered, though the worker could run more at once."""
    running = 0
    peak = 0
    worker = new_worker(gateway, max_concurrency=10)

    @worker.activity("slow")
    async def slow(context: ActivityContext, data: bytes) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return data

    requests = [DispatchRequest(NS, "slow", b"%d" % i, timeout=PATIENCE) for i in range(20)]
    async with worker.serving():
        for limit in (2, 10):
            peak = 0
            done = [r async for r in producer.dispatch_many(requests, max_outstanding=limit)]
            assert all(isinstance(r.outcome, Completed) for r in done)
            if limit == 2:
                assert peak == 2, peak
            else:
                # Control: with room for ten, more than two run at once.
                assert peak > 2, peak


async def test_operator_calls_describe_the_pool_and_watch_events(
    gateway: Gateway, producer: Producer
) -> None:
    events = producer.watch_events()
    watching = asyncio.ensure_future(events.__anext__())
    pool = await producer.describe_pool(NS, "echo")
    assert not pool.served and pool.reason == gateway_pb2.UNSERVED_REASON_NO_WORKERS
    worker = new_worker(gateway)
    worker.register("echo", lambda context, data: data)
    async with worker.serving():
        event = await asyncio.wait_for(watching, PATIENCE)
        assert event.worker_id == worker.worker_id and event.HasField("connected")

        async def served() -> bool:
            return (await producer.describe_pool(NS, "echo")).served

        await eventually(served, "the pool is served")
        explained = await producer.explain_pool(NS, "echo")
        assert [e.worker.worker_id for e in explained] == [worker.worker_id]
        assert explained[0].eligibility == gateway_pb2.ELIGIBILITY_ELIGIBLE
        other = await producer.explain_pool(NS, "other")
        assert other[0].eligibility == gateway_pb2.ELIGIBILITY_SERVES_OTHER_ACTIVITY
    await events.aclose()


async def test_dispatch_many_raises_a_failing_iterable_after_what_was_sent(
    gateway: Gateway, producer: Producer
) -> None:
    worker = new_worker(gateway)
    worker.register("echo", lambda context, data: data)

    def requests() -> Iterator[DispatchRequest]:
        yield DispatchRequest(NS, "echo", b"first", timeout=PATIENCE)
        raise RuntimeError("the request source broke")

    seen = []
    async with worker.serving():
        with pytest.raises(RuntimeError, match="request source"):
            async for result in producer.dispatch_many(requests()):
                seen.append(result.outcome)
    # Control: the request sent before the failure still completed.
    assert seen == [Completed(b"first")]


async def test_server_name_verifies_the_certificate_under_another_name(gateway: Gateway) -> None:
    """docs/python.md, Credentials: `server_name` is the name the gateway's certificate is
    checked against when the endpoint names the host otherwise (the development certificate
    names `localhost`; the endpoint here is `127.0.0.1`)."""

    def connection(server_name: str) -> Connection:
        return Connection(
            endpoint=gateway.endpoint, ca=gateway.ca, token=ADMIN_TOKEN, server_name=server_name
        )

    async with Producer(connection("localhost")) as producer:
        assert await producer.list_workers(namespace=NS) == []
    # Control: a name the certificate does not carry fails the handshake.
    async with Producer(connection("elsewhere.invalid")) as producer:
        with pytest.raises(Unavailable):
            await asyncio.wait_for(producer.list_workers(namespace=NS), PATIENCE)


async def test_an_http_endpoint_speaks_plaintext_to_a_plaintext_gateway(
    tmp_path: pathlib.Path,
) -> None:
    """docs/python.md, Credentials: `http://host:port` is plaintext, for a loopback gateway
    with `grpc.tls = false`; worker and producer both work over it."""
    gateway = Gateway(tmp_path, plaintext=True)
    gateway.start()
    try:
        plain = Connection(endpoint=f"http://{gateway.endpoint}", token=ADMIN_TOKEN)
        worker = Worker(namespaces=[NS], connection=plain, handle_signals=False)
        worker.register("echo", lambda context, data: data)
        async with worker.serving(), Producer(plain) as producer:
            assert await producer.dispatch(NS, "echo", b"clear", timeout=PATIENCE) == Completed(
                b"clear"
            )
        # Control: a TLS client gets nowhere with the plaintext listener.
        tls = Connection(endpoint=gateway.endpoint, token=ADMIN_TOKEN)
        async with Producer(tls) as producer:
            with pytest.raises(Unavailable):
                await asyncio.wait_for(producer.list_workers(namespace=NS), PATIENCE)
    finally:
        gateway.stop()
