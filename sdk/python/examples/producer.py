"""Dispatches to the example worker: one `greet`, then 100 `checksum`s over one stream.

python examples/producer.py --ca ~/.local/share/switchyard/tls/ca.pem
"""

from __future__ import annotations

import argparse
import asyncio

from switchyard import (
    Completed,
    Connection,
    DispatchRequest,
    Failed,
    PermissionDenied,
    Producer,
)


async def run(connection: Connection) -> None:
    async with Producer(connection) as producer:
        match await producer.dispatch("demo", "greet", b"world", timeout=10):
            case Completed(output=output):
                print(output.decode())
            case Failed(message=message, retryable=retryable):
                print(f"failed ({'retryable' if retryable else 'fatal'}): {message}")
            case other:
                print(f"ended {other.label}")

        requests = [DispatchRequest("demo", "checksum", b"%d" % i) for i in range(100)]
        completed = 0
        async for result in producer.dispatch_many(requests, max_outstanding=32):
            if isinstance(result.outcome, Completed):
                completed += 1
            elif result.error is not None:
                print(f"request {result.index} refused: {result.error.sentence}")
        print(f"{completed}/100 checksums completed")

        try:
            await producer.dispatch("not-mine", "greet", timeout=1)
        except PermissionDenied as refused:
            print(f"refused as expected: {refused.sentence}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default="127.0.0.1:7700")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    asyncio.run(run(Connection(endpoint=args.endpoint, ca=args.ca, token=args.token)))


if __name__ == "__main__":
    main()
