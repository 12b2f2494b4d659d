"""What the transports (wire/) and app need of the parts above them, as protocols.

wire/ serves kubelet and must not import core or ops: it is handed an `Intercept` (the
transport-free `core.pipeline.Pipeline`) for the intercepted calls and a `CallObserver`
(`ops.metrics.Metrics`) told how each forwarded call ended. app holds the server of either
data path as a `Serving`.

    Intercept.handle(event, raw, metadata, deadline) ──▶ Outcome (the answer or the status)
    CallObserver.observe_call(method, path, code, origin, seconds)
    Serving.stop(grace)
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from crihook.hooks.spec import Event
from crihook.proxy.cri.outcome import Metadata, Outcome

__all__ = ["CallObserver", "Intercept", "Serving"]


class Intercept(Protocol):
    """The core of an intercepted call: kubelet's request bytes, metadata and deadline (on
    the time.monotonic() clock) in, how the call ended out."""

    def handle(
        self,
        event: Event,
        raw: bytes,
        metadata: Metadata | None = None,
        deadline: float | None = None,
    ) -> Awaitable[Outcome]: ...


class CallObserver(Protocol):
    """Told how a call ended: `code` its status name (`OK`...), `origin` who ended it if it
    failed (`crihook`, `runtime`, `kubelet`), `seconds` its duration (None for a stream)."""

    def observe_call(
        self, method: str, path: str, code: str, origin: str, seconds: float | None
    ) -> None: ...


class Serving(Protocol):
    """A kubelet-facing server, started already: what app does with it is stop it, letting
    calls in flight finish for `grace` seconds. (Starting is not in the protocol: each data
    path starts with what only it needs, the grpc server after its port is added, the h2
    server on the listener early.py bound.)"""

    async def stop(self, grace: float | None) -> None: ...
