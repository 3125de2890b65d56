"""Workers for `switchyard bench --external-workers`: W workers serving the bench's `work`
activity (echo) in namespace `bench`, each with its own connection, until SIGTERM or Ctrl-C.

    python examples/bench_worker.py --ca CA --workers 4 --capacity 64
"""

from __future__ import annotations

import argparse
import asyncio

from switchyard import ActivityContext, Connection, Worker


async def echo(context: ActivityContext, data: bytes) -> bytes:
    return data


async def run(args: argparse.Namespace) -> None:
    connection = Connection(endpoint=args.endpoint, ca=args.ca, token=args.token)
    workers = [
        Worker(
            namespaces=["bench"],
            connection=connection,
            activities={"work": echo},
            max_concurrency=args.capacity,
        )
        for _ in range(args.workers)
    ]
    await asyncio.gather(*(worker.run() for worker in workers))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default="127.0.0.1:7700")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--token", default=None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=64)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
