"""A loopback TCP relay the tests can cut, to break a worker's connection without stopping
either end."""

from __future__ import annotations

import asyncio
import contextlib


class Relay:
    """Forwards 127.0.0.1:`port` to `target_port`; `cut()` drops every connection, and while
    `refusing` is set new ones are closed at once."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        #: Close new connections at once (the gateway looks unreachable).
        self.refusing = False

    async def start(self) -> None:
        """Listens on a free loopback port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.close()
            return
        self._writers += [writer, upstream_writer]
        await asyncio.gather(
            self._pipe(reader, upstream_writer),
            self._pipe(upstream_reader, writer),
            return_exceptions=True,
        )

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def cut(self) -> None:
        """Resets every relayed connection; new ones are still accepted."""
        for writer in self._writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        """Stops listening and cuts what is open."""
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
