"""The only code that talks to the runtime: channels, raw multicallables, start-up probing.

`call` (the data path) and `control` (the control path) are `cri.runtime.Runtime`: grpc's
errors are translated here into RuntimeCallFailed. The raw multicallables (`unary`,
`unary_stream`, `stream_stream`) serve the pass-through only.

Calls are forwarded as bytes (identity serializers). The channel reconnects on its own with a
short backoff, so after a containerd restart the next call finds it again; crihook never
retries a call itself (a mutating CRI call must not be repeated blindly).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import grpc.aio
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from crihook.proxy.config import RuntimeSettings
from crihook.proxy.cri.methods import method_path
from crihook.proxy.cri.outcome import Metadata, Status, clean_metadata
from crihook.proxy.cri.runtime import RuntimeCallFailed, UnaryCall
from crihook.proxy.errors import RuntimeUnavailable

__all__ = ["CHANNEL_OPTIONS", "RuntimeClient", "status_of"]

log = logging.getLogger(__name__)

# CRI messages can be large (ListContainers on a busy node); kubelet allows 16 MiB, the
# runtime is trusted, so no limit here. Reconnect quickly: kubelet polls every second.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_http_proxy", 0),
    ("grpc.enable_retries", 0),
]

_VERSION = method_path("RuntimeService", "Version")


class RuntimeClient:
    """Raw access to the runtime (and a separate image endpoint, if configured)."""

    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        self._runtime = grpc.aio.insecure_channel(settings.endpoint, options=CHANNEL_OPTIONS)
        self._image = (
            grpc.aio.insecure_channel(settings.image_target, options=CHANNEL_OPTIONS)
            if settings.image_endpoint and settings.image_endpoint != settings.endpoint
            else self._runtime
        )
        self.last_error = "not probed yet"

    def _channel(self, image_service: bool) -> grpc.aio.Channel:
        return self._image if image_service else self._runtime

    def unary(self, path: str, image_service: bool = False) -> grpc.aio.UnaryUnaryMultiCallable:
        return self._channel(image_service).unary_unary(path, _registered_method=True)

    def call(self, path: str) -> UnaryCall:
        """A unary runtime call for the pipeline core (`cri.runtime.Runtime`): the runtime's
        error status comes as RuntimeCallFailed, not as a grpc exception."""
        return _translated(self.unary(path))

    def control(self, path: str, image_service: bool = False) -> UnaryCall:
        """A unary call on the control path (reconcile, the hooks' runtime queries,
        readiness, `crihook check`), errors as RuntimeCallFailed as `call`'s. Defined here
        only: on the h2 data path too, crihook's own questions go over grpc.aio's channels,
        whatever serves kubelet's calls."""
        return _translated(self.unary(path, image_service))

    def unary_stream(
        self, path: str, image_service: bool = False
    ) -> grpc.aio.UnaryStreamMultiCallable:
        return self._channel(image_service).unary_stream(path, _registered_method=True)

    def stream_stream(
        self, path: str, image_service: bool = False
    ) -> grpc.aio.StreamStreamMultiCallable:
        return self._channel(image_service).stream_stream(path)

    async def probe(self, timeout: float = 2.0) -> None:
        """One Version call; raises RuntimeUnavailable naming the endpoint and the cause."""
        try:
            await self.unary(_VERSION)(b"", timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            self.last_error = f"{exc.code().name}: {exc.details()}"
            raise RuntimeUnavailable(
                f"runtime {self.settings.endpoint} is not answering ({self.last_error})"
            ) from exc

    async def wait_until_ready(self) -> None:
        """Probe with exponential backoff until the runtime answers; runs at start-up while
        the server already listens (and answers UNAVAILABLE)."""
        attempt = 0
        async for try_ in AsyncRetrying(
            retry=retry_if_exception_type(RuntimeUnavailable),
            wait=wait_exponential(multiplier=0.05, max=self.settings.startup_wait_max_seconds),
            reraise=True,
        ):
            with try_:
                attempt += 1
                try:
                    await self.probe()
                except RuntimeUnavailable as exc:
                    if attempt in (1, 10) or attempt % 50 == 0:
                        log.warning("waiting for the runtime: %s", exc)
                    raise
        log.info("runtime %s is answering", self.settings.endpoint)

    async def close(self, grace: float | None = None) -> None:
        await self._runtime.close(grace)
        if self._image is not self._runtime:
            await self._image.close(grace)


def _translated(multicallable: grpc.aio.UnaryUnaryMultiCallable) -> UnaryCall:
    """`multicallable` with grpc's error translated at this edge into RuntimeCallFailed."""

    async def call(
        request: bytes, *, timeout: float | None = None, metadata: Metadata | None = None
    ) -> bytes:
        try:
            answer: bytes = await multicallable(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise RuntimeCallFailed(status_of(err)) from err
        return answer

    return call


def status_of(err: grpc.aio.AioRpcError) -> Status:
    """The runtime's status, message and trailers (grpc's own reserved keys left out)."""
    return Status(err.code(), err.details() or "", clean_metadata(err.trailing_metadata()) or ())
