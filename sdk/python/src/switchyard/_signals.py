"""SIGTERM and SIGINT drain every worker running in the process (finish in-flight work, then
leave); a second signal stops them at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable

log = logging.getLogger("switchyard.worker")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Registry:
    def __init__(self) -> None:
        self.members: dict[int, tuple[Callable[[], None], Callable[[], None]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.received = 0

    def on_signal(self) -> None:
        self.received += 1
        first = self.received == 1
        log.info("signal received; %s", "draining" if first else "stopping now")
        for drain, stop in list(self.members.values()):
            (drain if first else stop)()


_REGISTRY = _Registry()


def join(key: int, drain: Callable[[], None], stop: Callable[[], None]) -> None:
    """Drains (then stops) this worker on SIGTERM/SIGINT; a no-op off the main thread."""
    loop = asyncio.get_running_loop()
    if _REGISTRY.loop is not loop:
        try:
            for number in _SIGNALS:
                loop.add_signal_handler(number, _REGISTRY.on_signal)
        except (NotImplementedError, RuntimeError, ValueError):
            return
        _REGISTRY.loop = loop
        _REGISTRY.received = 0
    _REGISTRY.members[key] = (drain, stop)


def leave(key: int) -> None:
    """Stops handling signals for this worker; the last one gives them back."""
    _REGISTRY.members.pop(key, None)
    if not _REGISTRY.members and _REGISTRY.loop is not None:
        with contextlib.suppress(Exception):
            for number in _SIGNALS:
                _REGISTRY.loop.remove_signal_handler(number)
        _REGISTRY.loop = None
