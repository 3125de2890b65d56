"""The Python worker under core's conformance kit, driven by the Rust harness
`tests/tests/python_worker_conforms.rs`.

`conformance_worker.py ENDPOINT CA TOKEN BRIDGE_PORT REGISTRATION_JSON` registers a worker with
the registration as given (even an invalid one: the kit expects it refused), then runs every
task through the Rust harness: it sends `{"task": id, "type": ..., "input": hex}` on the bridge
connection and answers with the harness's `{"done": id, "output": hex}` or `{"done": id,
"failure": ..., "retryable": ...}`. A cancel from the gateway is forwarded as `{"cancel": id}`
and acknowledged once the harness's handler returned. Prints `registered ID`, or `refused CODE
MESSAGE` and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from switchyard import ActivityContext, ActivityError, Backoff, Connection, Worker
from switchyard.errors import ConfigError, GatewayError

#: Bound on waiting for the harness's handler after a cancel.
PATIENCE = 30.0


async def main() -> None:
    endpoint, ca, token, bridge_port, raw = sys.argv[1:6]
    spec: dict[str, Any] = json.loads(raw)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(bridge_port))
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}

    def send(message: dict[str, Any]) -> None:
        writer.write(json.dumps(message).encode() + b"\n")

    async def replies() -> None:
        while line := await reader.readline():
            message = json.loads(line)
            future = waiting.pop(message["done"], None)
            if future is not None and not future.done():
                future.set_result(message)

    async def bridge(context: ActivityContext, data: bytes) -> bytes:
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        waiting[context.task_id] = future
        send({"task": context.task_id, "type": context.activity_type, "input": data.hex()})
        try:
            message = await asyncio.shield(future)
        except asyncio.CancelledError:
            send({"cancel": context.task_id})
            # Acknowledge once the handler has let go, as a real handler would.
            await asyncio.wait({future}, timeout=PATIENCE)
            raise
        if "failure" in message:
            raise ActivityError(message["failure"], retryable=message["retryable"])
        return bytes.fromhex(message["output"])

    reading = loop.create_task(replies())
    worker = Worker(
        namespaces=spec["namespaces"],
        connection=Connection(endpoint=endpoint, ca=ca, token=token),
        task_queue=spec["task_queue"],
        node=spec["node"],
        identity=spec["identity"],
        activities={name: bridge for name in spec["activity_types"]},
        max_concurrency=spec["max_concurrency"],
        backoff=Backoff(initial=0.01, max=0.2),
        resume=spec["resumable"],
        handle_signals=False,
    )
    running = loop.create_task(worker.run())
    registered = loop.create_task(worker.wait_registered(PATIENCE))
    await asyncio.wait({running, registered}, return_when=asyncio.FIRST_COMPLETED)
    if running.done() and running.exception() is not None:
        error = running.exception()
        if isinstance(error, GatewayError):
            print(f"refused {error.code.name} {error.sentence}", flush=True)
        elif isinstance(error, ConfigError):
            print(f"refused CONFIG {error}", flush=True)
        else:
            print(f"failed {error!r}", flush=True)
        return
    print(f"registered {await registered}", flush=True)
    await running
    reading.cancel()


if __name__ == "__main__":
    asyncio.run(main())
