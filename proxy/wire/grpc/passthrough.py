"""Raw-bytes forwarding of every call no hook wants: unary, server-streaming and unknown.

Requests and responses are never decoded here; the bytes kubelet sent are the bytes the
runtime gets, and the runtime's answer (or its status code, message and trailers) is what
kubelet gets. kubelet's deadline and metadata travel with the call.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NoReturn

import grpc
import grpc.aio

from crihook.proxy.cri.outcome import Status, clean_metadata
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient, status_of

__all__ = [
    "Observer",
    "PassthroughRecord",
    "abort_with",
    "call_options",
    "stream_stream_handler",
    "unary_handler",
    "unary_stream_handler",
]

# More than this many seconds means "no deadline": grpc reports a huge remaining time then.
_NO_DEADLINE = 1e8


_metadata = clean_metadata


def call_options(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, Any]:
    """kubelet's remaining deadline and its metadata, for the call to the runtime."""
    remaining = context.time_remaining()
    timeout = None if remaining is None or remaining > _NO_DEADLINE else max(remaining, 0.0)
    return {"timeout": timeout, "metadata": _metadata(context.invocation_metadata())}


async def abort_with(
    context: grpc.aio.ServicerContext[Any, Any], err: grpc.aio.AioRpcError
) -> NoReturn:
    """End kubelet's call with the runtime's own status, message and trailers."""
    await context.abort(err.code(), err.details() or "", _metadata(err.trailing_metadata()) or ())
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


async def _not_ready(context: grpc.aio.ServicerContext[Any, Any], readiness: Readiness) -> NoReturn:
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"crihook: {readiness.reason}")
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


Behaviour = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Coroutine[Any, Any, bytes]]


Observer = Callable[[bytes], None]
"""Told the runtime's answer (bytes) to a forwarded call that succeeded."""

PassthroughRecord = Callable[[str, bytes, bytes | None, Status | None, float], None]
"""Told each forwarded unary call (`--record-all`): path, request, answer or status, and
when it arrived (epoch seconds)."""


def unary_handler(
    client: RuntimeClient,
    path: str,
    image_service: bool,
    readiness: Readiness,
    observer: Observer | None = None,
    record: PassthroughRecord | None = None,
) -> grpc.RpcMethodHandler:
    call = client.unary(path, image_service)
    if record is not None:
        return _recorded_unary_handler(call, path, readiness, observer, record)

    async def forward(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        if not readiness.ready:
            await _not_ready(context, readiness)
        try:
            response: bytes = await call(request, **call_options(context))
        except grpc.aio.AioRpcError as err:
            await abort_with(context, err)
        if observer is not None:
            observer(response)
        return response

    return grpc.unary_unary_rpc_method_handler(forward)


def _recorded_unary_handler(
    call: Any,
    path: str,
    readiness: Readiness,
    observer: Observer | None,
    record: PassthroughRecord,
) -> grpc.RpcMethodHandler:
    """`unary_handler`, telling `record` each call (kept apart: the unrecorded path stays as
    lean as it is)."""

    async def forward(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        started = time.time()
        if not readiness.ready:
            unavailable = Status(grpc.StatusCode.UNAVAILABLE, f"crihook: {readiness.reason}")
            record(path, request, None, unavailable, started)
            await _not_ready(context, readiness)
        try:
            response: bytes = await call(request, **call_options(context))
        except grpc.aio.AioRpcError as err:
            record(path, request, None, status_of(err), started)
            await abort_with(context, err)
        record(path, request, response, None, started)
        if observer is not None:
            observer(response)
        return response

    return grpc.unary_unary_rpc_method_handler(forward)


async def _relay(
    upstream: Any, context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    """Yield the runtime's stream to kubelet; end it with the runtime's status on error."""
    try:
        async for message in upstream:
            yield message
    except grpc.aio.AioRpcError as err:
        await abort_with(context, err)
    finally:
        upstream.cancel()


def unary_stream_handler(
    client: RuntimeClient, path: str, image_service: bool, readiness: Readiness
) -> grpc.RpcMethodHandler:
    call = client.unary_stream(path, image_service)

    async def forward(
        request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        if not readiness.ready:
            await _not_ready(context, readiness)
        async for message in _relay(call(request, **call_options(context)), context):
            yield message

    return grpc.unary_stream_rpc_method_handler(forward)


def stream_stream_handler(
    client: RuntimeClient, path: str, image_service: bool, readiness: Readiness
) -> grpc.RpcMethodHandler:
    """For methods crihook does not know: a stream-stream handler carries any cardinality."""
    call = client.stream_stream(path, image_service)

    async def forward(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        if not readiness.ready:
            await _not_ready(context, readiness)
        async for message in _relay(call(requests, **call_options(context)), context):
            yield message

    return grpc.stream_stream_rpc_method_handler(forward)
