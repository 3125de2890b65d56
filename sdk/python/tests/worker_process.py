"""A worker in its own process for the tests: `worker_process.py ENDPOINT CA TOKEN NAME
[SLEEP [nosignals]]` serves `whoami` (returns NAME after SLEEP seconds) in namespace `tests`,
prints `registered <id>` once registered and `exited` when `run()` returns; `nosignals` builds
it with `handle_signals=False`."""

from __future__ import annotations

import asyncio
import sys

from switchyard import ActivityContext, Backoff, Connection, Worker


async def main() -> None:
    endpoint, ca, token, name = sys.argv[1:5]
    sleep = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    handle_signals = sys.argv[6:7] != ["nosignals"]
    worker = Worker(
        namespaces=["tests"],
        connection=Connection(endpoint=endpoint, ca=ca, token=token),
        backoff=Backoff(initial=0.05, max=0.5),
        handle_signals=handle_signals,
    )

    @worker.activity("whoami")
    async def whoami(context: ActivityContext, data: bytes) -> bytes:
        await asyncio.sleep(sleep)
        return name.encode()

    running = asyncio.get_running_loop().create_task(worker.run())
    worker_id = await worker.wait_registered(30)
    print(f"registered {worker_id}", flush=True)
    await running
    print("exited", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
