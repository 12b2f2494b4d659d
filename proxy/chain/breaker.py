"""A hook's circuit breaker: after consecutive failures the hook is not called for a while,
then one probe call decides. Small, with an injectable clock (a replay's is the recording's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Breaker", "BreakerRecord"]


@dataclass
class Breaker:
    """Consecutive-failure circuit breaker. Open: calls are not made. After the reset time
    exactly one probe call goes through (half-open); its outcome closes or reopens it."""

    threshold: int
    reset_seconds: float
    failures: int = 0
    open_until: float = 0.0
    probing: bool = False
    clock: Callable[[], float] = time.monotonic

    def allows(self) -> bool:
        if self.failures < self.threshold:
            return True
        if self.probing or self.clock() < self.open_until:
            return False
        self.probing = True
        return True

    def success(self) -> None:
        self.failures = 0
        self.open_until = 0.0
        self.probing = False

    def failure(self) -> None:
        self.failures += 1
        self.probing = False
        if self.failures >= self.threshold:
            self.open_until = self.clock() + self.reset_seconds

    def abandon(self) -> None:
        """The call ended without a verdict (cancelled): let another probe try."""
        self.probing = False

    @property
    def state(self) -> str:
        if self.failures < self.threshold:
            return "closed"
        return "half-open" if self.probing or self.clock() >= self.open_until else "open"

    def recorded(self, now: float) -> BreakerRecord:
        """Its state for a recording whose clock reads `now`: the failures counted, and
        when an open breaker lets a probe through, on that clock."""
        if self.failures < self.threshold:
            return BreakerRecord(self.failures, None)
        return BreakerRecord(self.failures, round(now + self.open_until - self.clock(), 6))

    def restore(self, record: BreakerRecord) -> None:
        """Take up a recorded state, on this breaker's clock (a replay's: the recorded time).
        No probe is out: a recording's snapshot is taken while no call is in flight."""
        self.failures = record.failures
        self.open_until = record.open_until or 0.0
        self.probing = False


class BreakerRecord(NamedTuple):
    """A breaker's state in a recording's snapshot (`breakers`)."""

    failures: int
    open_until: float | None
    """When an open breaker lets a probe through (the recording's clock); None: closed."""
