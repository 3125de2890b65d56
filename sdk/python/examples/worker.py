"""A worker serving `greet` (async) and `checksum` (blocking, run in a thread) in namespace
`demo`. Stop it with SIGTERM or Ctrl-C: it finishes the tasks in flight, then leaves.

    python examples/worker.py --ca ~/.local/share/switchyard/tls/ca.pem
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging

from switchyard import ActivityContext, Connection, RetryableError, Worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default="127.0.0.1:7700")
    parser.add_argument("--ca", required=True, help="the gateway's CA (<data_dir>/tls/ca.pem)")
    parser.add_argument("--token", default=None)
    parser.add_argument("--max-concurrency", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    worker = Worker(
        namespaces=["demo"],
        connection=Connection(endpoint=args.endpoint, ca=args.ca, token=args.token),
        max_concurrency=args.max_concurrency,
    )

    @worker.activity("greet")
    async def greet(context: ActivityContext, data: bytes) -> bytes:
        if not data:
            raise RetryableError("nobody to greet yet")
        return b"hello, " + data

    @worker.activity("checksum")
    def checksum(context: ActivityContext, data: bytes) -> bytes:
        return hashlib.sha256(data).hexdigest().encode()

    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
