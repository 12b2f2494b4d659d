"""The runtime as crihook's own code sees it: one protocol, one error, no transport.

    Runtime ── call(path) ───────────────────▶ UnaryCall(request, timeout=, metadata=) -> bytes
            ── control(path, image_service=) ─▶ UnaryCall(request, timeout=, metadata=) -> bytes
    either raises RuntimeCallFailed(Status) for the runtime's error status

`call` is the data path: the pipeline core forwards kubelet's calls and sends its updates
through it (gRPC or crihook's own HTTP/2, whichever serves kubelet). `control` is the
control path: the start-up reconcile, the periodic one, the hooks' runtime queries and
`crihook check` ask the runtime with it, always over grpc.aio's channels
(proxy/wire/grpc/runtime_client.py). Transport errors are translated into RuntimeCallFailed
at the wire, so nothing above it catches a grpc exception.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from crihook.proxy.cri.outcome import Metadata, Status

__all__ = ["Runtime", "RuntimeCallFailed", "UnaryCall"]


class RuntimeCallFailed(Exception):
    """The runtime answered a call with an error status (or could not be reached)."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"{status.code.name}: {status.details}")
        self.status = status


class UnaryCall(Protocol):
    def __call__(
        self, request: bytes, *, timeout: float | None = None, metadata: Metadata | None = None
    ) -> Awaitable[bytes]: ...


class Runtime(Protocol):
    """Raw unary calls by method path (`/runtime.v1.RuntimeService/CreateContainer`)."""

    def call(self, path: str) -> UnaryCall:
        """The data path: a call kubelet made, or an update the core sends."""
        ...

    def control(self, path: str, image_service: bool = False) -> UnaryCall:
        """The control path: what crihook asks the runtime for itself (lists, statuses,
        Version), on the image endpoint with `image_service`."""
        ...
