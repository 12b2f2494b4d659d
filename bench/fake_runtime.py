"""A fast fake CRI runtime: every unary RuntimeService/ImageService method answers canned bytes.

    python -m bench.fake_runtime --socket /tmp/fake-runtime.sock

It never decodes a request: each method has a registered handler with identity serializers
that returns pre-encoded response bytes (see ``bench.payloads.canned_responses``: Version,
ListContainers with 10 containers, ListPodSandbox, CreateContainer with an id; every other
unary method an empty message). Methods outside the known schema get the same empty answer
through a generic handler. Server-streaming GetContainerEvents is held open without events
(as an idle runtime would); the other streaming methods answer UNIMPLEMENTED, as
containerd 1.6 does. The point is that the runtime's own cost does not hide crihook's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.payloads import canned_responses, runtime_methods

__all__ = ["main", "serve"]

Unary = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


def _answer(payload: bytes) -> Unary:
    async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return payload

    return handler


async def _hold_open(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    await asyncio.Event().wait()  # until the client cancels or the server stops
    yield b""  # pragma: no cover - makes this an async generator


async def _unimplemented(request: bytes, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented by the fake runtime")


class _Fallback(grpc.GenericRpcHandler):
    """Answers an empty message to methods the schema does not know (kept off the hot path)."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(_answer(b""))


async def serve(socket_path: str, stop: asyncio.Event) -> None:
    responses = canned_responses()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for service, method, unary in runtime_methods():
        path = f"/{service}/{method}"
        if unary:
            handler = grpc.unary_unary_rpc_method_handler(_answer(responses.get(path, b"")))
        elif method == "GetContainerEvents":
            handler = grpc.unary_stream_rpc_method_handler(_hold_open)
        else:
            handler = grpc.unary_stream_rpc_method_handler(_unimplemented)
        by_service.setdefault(service, {})[method] = handler
    for service, handlers in by_service.items():
        server.add_registered_method_handlers(service, handlers)
    server.add_generic_rpc_handlers([_Fallback()])

    Path(socket_path).unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    print(f"fake runtime pid {os.getpid()} listening on {socket_path}", file=sys.stderr, flush=True)
    await stop.wait()
    await server.stop(grace=0.5)
    Path(socket_path).unlink(missing_ok=True)


async def _main(socket_path: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(socket_path, stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fake_runtime", description=__doc__)
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(_main(args.socket))
    else:
        uvloop.run(_main(args.socket))


if __name__ == "__main__":
    main()
