"""Jittered exponential waits between reconnection attempts."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """The wait before reconnection attempt `n` (from 0) is drawn uniformly from the upper half
    of `min(initial * 2**n, max)` seconds, so workers that lost the same gateway spread out."""

    #: Upper bound of the first wait, in seconds.
    initial: float = 0.1
    #: Upper bound of every wait, in seconds.
    max: float = 30.0

    def __post_init__(self) -> None:
        if not self.initial > 0:
            raise ConfigError("backoff.initial", f"{self.initial}: must be above 0")
        if not self.max >= self.initial:
            raise ConfigError("backoff.max", f"{self.max}: must be at least backoff.initial")

    def ceiling(self, attempt: int) -> float:
        """The upper bound of the wait before attempt `attempt`."""
        return float(min(self.initial * 2 ** min(max(attempt, 0), 62), self.max))

    def delay(self, attempt: int, rng: random.Random) -> float:
        """A jittered wait before attempt `attempt`, drawn from `rng`."""
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + rng.uniform(0, ceiling / 2)
