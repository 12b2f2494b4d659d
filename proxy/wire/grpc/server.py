"""The kubelet-facing gRPC server: a table from method to handler.

Intercepted methods go to the pipeline core, through `intercepted_handler`, the thin adapter
that hands it kubelet's bytes, metadata and deadline and turns its outcome into the answer or
the status; every other known method is forwarded as raw bytes (unary or server-streaming); a
method crihook does not know (a newer kubelet) is caught by a generic handler and forwarded
too, never answered UNIMPLEMENTED by crihook itself. With metrics on, each forwarded call is
wrapped by `measured_handler`, which tells the `CallObserver` how it ended.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from time import perf_counter
from typing import Any

import grpc
import grpc.aio

from crihook.hooks.spec import Event
from crihook.proxy.config import DEFAULT_MAX_MESSAGE_BYTES
from crihook.proxy.cri.events import EVENTS, EventSpec
from crihook.proxy.cri.handler import CallObserver, Intercept
from crihook.proxy.cri.method_labels import OTHER_METHOD, PASSTHROUGH
from crihook.proxy.cri.methods import CRI_PACKAGE, known_methods
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.wire.grpc.passthrough import (
    Observer,
    PassthroughRecord,
    call_options,
    stream_stream_handler,
    unary_handler,
    unary_stream_handler,
)
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient

__all__ = [
    "MAX_CONCURRENT_STREAMS",
    "build_server",
    "intercepted_handler",
    "measured_handler",
    "server_options",
]

MAX_CONCURRENT_STREAMS = 1000
"""Calls one kubelet connection may have open at once. kubelet keeps far fewer in flight
(one per pod worker plus its pollers and streams); the bound only stops a runaway or hostile
client from opening streams without end."""


def server_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """A request bigger than `max_message_bytes` is refused by grpc itself, with
    RESOURCE_EXHAUSTED ("Received message larger than max"), as it is read: no byte of it is
    forwarded. (The catch-all for unknown methods opens its call to the runtime before it
    reads: there the runtime sees a call that ends without a message, then is cancelled.)
    Answers are not limited: they come from the runtime, and kubelet applies its own limit
    to them."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.so_reuseport", 0),
    ]


def intercepted_handler(pipeline: Intercept, event: Event) -> grpc.RpcMethodHandler:
    """The gRPC face of the pipeline core for one intercepted method."""
    handle = pipeline.handle

    async def rpc(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        options = call_options(context)
        timeout = options["timeout"]
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = await handle(event, raw, options["metadata"], deadline)
        status = outcome.status
        if status is not None:
            await context.abort(status.code, status.details, status.trailers)
        response: bytes = outcome.response  # type: ignore[assignment]  # set on success
        return response

    return grpc.unary_unary_rpc_method_handler(rpc)


MAX_CACHED_METHODS = 256
"""Handlers kept for methods the compiled API does not have: a runtime's real extra methods
are a handful; a client sending ever new names gets a handler per call, not a growing map."""


class _UnknownMethods(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Forwards any method the compiled API does not have, whatever its cardinality."""

    def __init__(
        self, runtime: RuntimeClient, readiness: Readiness, metrics: CallObserver | None = None
    ) -> None:
        self._runtime = runtime
        self._readiness = readiness
        self._metrics = metrics
        self._cache: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        handler = self._cache.get(method)
        if handler is None:
            image = method.startswith(f"/{CRI_PACKAGE}.ImageService/")
            handler = stream_stream_handler(self._runtime, method, image, self._readiness)
            if self._metrics is not None:
                handler = measured_handler(handler, OTHER_METHOD, self._metrics)
            if len(self._cache) < MAX_CACHED_METHODS:  # names a client makes up are not kept
                self._cache[method] = handler
        return handler


def build_server(
    runtime: RuntimeClient,
    pipeline: Intercept,
    readiness: Readiness,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    observers: Mapping[str, Observer] | None = None,
    recorder: Any = None,
    metrics: CallObserver | None = None,
    events: Mapping[Event, EventSpec] = EVENTS,
) -> grpc.aio.Server:
    """`observers`: method name (`RestorePod`) → told the runtime's answer to a forwarded
    call that succeeded; the bytes pass unchanged. `recorder` (`--record-all`): its
    `passthrough` is told every unary call forwarded as bytes. `metrics`: told how every
    forwarded call ended (intercepted ones are counted from their outcome). `events`: the
    methods given to the pipeline (crihook.proxy.cri.events); every other is forwarded."""
    record: PassthroughRecord | None = recorder.passthrough if recorder is not None else None
    server = grpc.aio.server(options=server_options(max_message_bytes))
    intercepted = {spec.path: event for event, spec in events.items()}
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for method in known_methods():
        image = method.is_image_service
        if method.path in intercepted:
            handler = intercepted_handler(pipeline, intercepted[method.path])
        elif method.client_streaming:
            handler = stream_stream_handler(runtime, method.path, image, readiness)
        elif method.server_streaming:
            handler = unary_stream_handler(runtime, method.path, image, readiness)
        else:
            observer = (observers or {}).get(method.name)
            handler = unary_handler(runtime, method.path, image, readiness, observer, record)
        if metrics is not None and method.path not in intercepted:
            handler = measured_handler(handler, method.name, metrics)
        by_service.setdefault(method.service, {})[method.name] = handler
    for service, handlers in by_service.items():
        server.add_registered_method_handlers(service, handlers)
    server.add_generic_rpc_handlers([_UnknownMethods(runtime, readiness, metrics)])
    return server


def measured_handler(
    handler: grpc.RpcMethodHandler, method: str, metrics: CallObserver
) -> grpc.RpcMethodHandler:
    """The same handler, telling `metrics` how each call ended (unary calls timed)."""
    observe = metrics.observe_call
    if handler.unary_unary is not None:
        behaviour = handler.unary_unary

        async def unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            started = perf_counter()
            try:
                response: bytes = await behaviour(request, context)
            except BaseException as exc:
                code, origin = _ended(exc, context)
                observe(method, PASSTHROUGH, code, origin, perf_counter() - started)
                raise
            observe(method, PASSTHROUGH, "OK", "", perf_counter() - started)
            return response

        return grpc.unary_unary_rpc_method_handler(unary)
    streaming = handler.unary_stream or handler.stream_stream

    async def stream(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        try:
            async for message in streaming(request, context):
                yield message
        except BaseException as exc:
            code, origin = _ended(exc, context)
            observe(method, PASSTHROUGH, code, origin, None)
            raise
        observe(method, PASSTHROUGH, "OK", "", None)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream)
    return grpc.stream_stream_rpc_method_handler(stream)


def _ended(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[str, str]:
    """The status name and origin of a call the handler ended with an exception."""
    if isinstance(exc, grpc.aio.AbortError):
        code = context.code()
        name = code.name if isinstance(code, grpc.StatusCode) else _CODE_NAMES.get(code, "UNKNOWN")
        details = context.details() or ""
        crihook = details.startswith("crihook:")
        return name, "crihook" if crihook else "runtime"
    if isinstance(exc, Exception):
        return "UNKNOWN", "crihook"  # a bug: grpc answers UNKNOWN
    return "CANCELLED", "kubelet"


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
