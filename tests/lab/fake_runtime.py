"""A recording fake runtime for fault tests (runs in-process on a thread, or as a process).

It records every call it receives (method, raw request bytes, remaining deadline, metadata)
and answers from a script: canned bytes, an error status, a delay, or a stream of messages.
Only for what a real containerd cannot show: exact bytes received, deadlines, slow answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

__all__ = ["FakeRuntime", "Received", "Reply"]


@dataclass
class Received:
    method: str
    request: bytes
    time_remaining: float | None
    metadata: tuple[tuple[str, str], ...]


@dataclass
class Reply:
    response: bytes = b""
    code: grpc.StatusCode | None = None
    details: str = ""
    delay: float = 0.0
    stream: list[bytes] = field(default_factory=list)
    initial_metadata: tuple[tuple[str, str | bytes], ...] = ()
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()


class FakeRuntime:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.received: list[Received] = []
        self.cancelled: list[str] = []
        """Methods whose caller cancelled while the reply was delayed."""
        self.script: dict[str, Reply | Callable[[bytes], Reply]] = {}
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    def calls(self, method: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.method.endswith("/" + method)]

    def _reply(self, method: str, request: bytes, context: grpc.ServicerContext) -> Reply:
        remaining = context.time_remaining()
        md = tuple((m.key, m.value) for m in context.invocation_metadata())
        with self._lock:
            self.received.append(Received(method, request, remaining, md))
        name = method.rsplit("/", 1)[-1]
        scripted = self.script.get(name, Reply())
        reply = scripted(request) if callable(scripted) else scripted
        if reply.initial_metadata:
            context.send_initial_metadata(reply.initial_metadata)
        if reply.delay:
            until = time.monotonic() + reply.delay
            while time.monotonic() < until and context.is_active():
                time.sleep(0.01)
            if not context.is_active():
                with self._lock:
                    self.cancelled.append(name)
        if reply.trailing_metadata:
            context.set_trailing_metadata(reply.trailing_metadata)
        if reply.code is not None:
            context.abort(reply.code, reply.details)
        return reply

    def start(self) -> FakeRuntime:
        runtime = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: Any) -> grpc.RpcMethodHandler:
                method = details.method
                if method.rsplit("/", 1)[-1].startswith(("Stream", "GetContainerEvents")):

                    def stream(request: bytes, context: grpc.ServicerContext) -> Any:
                        yield from runtime._reply(method, request, context).stream

                    return grpc.unary_stream_rpc_method_handler(stream)

                def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
                    return runtime._reply(method, request, context).response

                return grpc.unary_unary_rpc_method_handler(unary)

        self.socket_path.unlink(missing_ok=True)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=32),
            options=[("grpc.max_receive_message_length", -1)],  # as containerd: 16 MiB and more
        )
        self._server.add_generic_rpc_handlers([Handler()])
        self._server.add_insecure_port(f"unix:{self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
