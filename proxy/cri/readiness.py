"""Whether crihook may forward yet: set by app, read by the pipeline, both data paths and
metrics, so it sits below all of them (it was in wire/grpc/passthrough)."""

from __future__ import annotations

__all__ = ["Readiness"]


class Readiness:
    """Whether crihook may forward yet (the runtime answered once, the store is loaded)."""

    def __init__(self) -> None:
        self.ready = False
        self.reason = "crihook is starting"

    def set(self, ready: bool, reason: str = "") -> None:
        self.ready = ready
        self.reason = reason
