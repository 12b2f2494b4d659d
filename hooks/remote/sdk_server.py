"""The SDK's gRPC server: unary and bidi calls spoken directly over HTTP/2 (h2.py).

A plugin answers one Stream message per hook call. Through grpc.aio's server each of them
cost a read batch and a write batch completed by grpc core's poller thread (the plugin spent
~165 µs of CPU per call in bench.plugin_rtt, ~55 µs on this server); here a message in and
its answer out are one
`data_received` and one write. Clients see an ordinary gRPC server: crihook's grpc.aio
channel (Configure, Synchronize, the unary stage RPCs) and its Stream connection, or any gRPC
client.

What it serves: unary methods (one request message, one response, a status) and bidi
methods (messages both ways, driven by callbacks on the event loop); unknown methods get
UNIMPLEMENTED; `grpc-timeout` ends a call with DEADLINE_EXCEEDED; RST_STREAM from the client
cancels its call. `stop(grace)` refuses new calls (GOAWAY), lets calls in flight finish for
`grace` seconds, then cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import grpc

from crihook.api.h2.connection import CANCEL, REFUSED_STREAM, Connection, Header
from crihook.api.h2.grpc_wire import (
    GrpcMessages,
    MessageRefused,
    encode_grpc_message,
    grpc_message_prefix,
    parse_timeout,
)
from crihook.api.h2.protocol import H2Protocol

__all__ = ["BidiCall", "BidiSession", "GrpcServer", "RpcError", "UnaryHandler", "parse_timeout"]

log = logging.getLogger(__name__)

_RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


class RpcError(Exception):
    """Ends a call with this status (a handler raises it)."""

    def __init__(self, code: grpc.StatusCode, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


UnaryHandler = Callable[[bytes], Awaitable[bytes]]


class BidiSession(Protocol):
    """A bidi call's handler, called on the event loop (must not block)."""

    def message(self, data: bytes) -> None: ...
    def half_closed(self) -> None:
        """The client sent its last message."""

    def cancelled(self) -> None:
        """The call is over (reset, deadline, shutdown): stop and send nothing more."""


BidiHandler = Callable[["BidiCall"], BidiSession]


class BidiCall:
    """One bidi call as its session sees it."""

    def __init__(self, connection: _Connection, stream_id: int) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self.done = False

    def send(self, message: bytes) -> None:
        """Send one message; a no-op once the call is over."""
        if not self.done:
            self._connection.respond(self.stream_id, message)

    def finish(self, code: grpc.StatusCode = grpc.StatusCode.OK, message: str = "") -> None:
        if not self.done:
            self._connection.finish(self.stream_id, code, message)


class _Call:
    """Server-side state of one stream."""

    __slots__ = (
        "bidi",
        "deadline",
        "handler",
        "messages",
        "replied",
        "requests",
        "session",
        "task",
    )

    def __init__(self) -> None:
        self.messages = GrpcMessages()
        self.replied = False  # response headers sent
        self.requests: list[bytes] = []
        self.handler: UnaryHandler | None = None
        self.bidi: BidiCall | None = None
        self.session: BidiSession | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None


class _Connection(H2Protocol):
    def __init__(self, server: GrpcServer) -> None:
        super().__init__(Connection(client=False))
        self._owner = server
        self._calls: dict[int, _Call] = {}
        self._going_away = False
        self.idle = asyncio.Event()
        self.idle.set()

    # --- life cycle ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._owner.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.cancel_all()
        self._owner.connections.discard(self)

    def go_away(self) -> None:
        """Refuse new calls; close once the calls in flight are done."""
        self._going_away = True
        self.send_goaway()
        if not self._calls:
            self.close_transport()

    def cancel_all(self) -> None:
        for stream_id in list(self._calls):
            self._end(stream_id, reset=True)
        self.close_transport()

    def _on_protocol_error(self, details: str) -> None:
        log.warning("plugin server: dropping a connection: %s", details)
        for stream_id in list(self._calls):
            self._end(stream_id)

    # --- replies -------------------------------------------------------------------------
    def respond(self, stream_id: int, message: bytes) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        if not call.replied:
            call.replied = True
            self.send_headers(stream_id, _RESPONSE_HEADERS)
        self.send_data(stream_id, grpc_message_prefix(len(message)) + message)

    def finish(self, stream_id: int, code: grpc.StatusCode, message: str = "") -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        trailers = [("grpc-status", str(code.value[0]))]
        if message:
            trailers.append(("grpc-message", encode_grpc_message(message)))
        if not call.replied:  # trailers-only
            trailers = _RESPONSE_HEADERS + trailers
        self.send_headers(stream_id, trailers, end_stream=True)
        self._end(stream_id)

    def _end(self, stream_id: int, reset: bool = False) -> None:
        """Forget a call; cancel what still runs for it. `reset`: tell the client."""
        call = self._calls.pop(stream_id, None)
        if call is None:
            return
        if call.deadline is not None:
            call.deadline.cancel()
        if call.bidi is not None:
            call.bidi.done = True
        if call.task is not None and not call.task.done():
            call.task.cancel()
        if call.session is not None:
            call.session.cancelled()
        if reset and self.alive:
            self.send_reset(stream_id, CANCEL)
        if not self._calls:
            self.idle.set()
            if self._going_away:
                self.close_transport()

    # --- requests ------------------------------------------------------------------------
    def _on_headers(self, stream_id: int, fields: list[Header], end_stream: bool) -> None:
        if stream_id in self._calls:  # a client's trailers: not part of gRPC requests
            if end_stream:
                self._on_data(stream_id, b"", True, 0)
            return
        headers = dict(fields)
        if self._going_away:
            self.send_reset(stream_id, REFUSED_STREAM)
            return
        path = headers.get(":path", "")
        call = _Call()
        unary = self._owner.unary.get(path)
        bidi = self._owner.bidi.get(path)
        if unary is None and bidi is None:
            self.send_headers(
                stream_id,
                [
                    *_RESPONSE_HEADERS,
                    ("grpc-status", str(grpc.StatusCode.UNIMPLEMENTED.value[0])),
                    ("grpc-message", encode_grpc_message(f"unknown method {path}")),
                ],
                end_stream=True,
            )
            return
        self._calls[stream_id] = call
        self.idle.clear()
        timeout = parse_timeout(headers.get("grpc-timeout"))
        if timeout is not None:
            call.deadline = asyncio.get_running_loop().call_later(
                timeout,
                self.finish,
                stream_id,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "deadline exceeded",
            )
        if unary is not None:
            call.handler = unary
        else:
            assert bidi is not None
            call.bidi = BidiCall(self, stream_id)
            call.session = bidi(call.bidi)
        if end_stream:
            self._on_data(stream_id, b"", True, 0)

    def _on_data(self, stream_id: int, payload: bytes, end_stream: bool, flow: int) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return  # a call that ended already
        try:
            messages = call.messages.feed(payload) if payload else []
        except MessageRefused as exc:
            self.finish(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            self.send_reset(stream_id, CANCEL)
            return
        if call.session is not None:
            for message in messages:
                call.session.message(message)
                if stream_id not in self._calls:
                    return
            if end_stream:
                call.session.half_closed()
            return
        call.requests.extend(messages)
        if end_stream:
            if len(call.requests) != 1:
                self.finish(
                    stream_id,
                    grpc.StatusCode.INTERNAL,
                    f"a unary call needs one request message, got {len(call.requests)}",
                )
                return
            assert call.handler is not None
            call.task = asyncio.ensure_future(
                self._unary(stream_id, call.handler, call.requests[0])
            )

    async def _unary(self, stream_id: int, handler: UnaryHandler, request: bytes) -> None:
        try:
            response = await handler(request)
        except RpcError as exc:
            self.finish(stream_id, exc.code, exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("a unary call failed")
            self.finish(stream_id, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
        else:
            self.respond(stream_id, response)
            self.finish(stream_id, grpc.StatusCode.OK)

    def _on_reset(self, stream_id: int, error: int) -> None:
        self._end(stream_id)


class GrpcServer:
    """Serves `unary` and `bidi` methods (by full path, `/package.Service/Method`) on a
    unix socket."""

    def __init__(self, unary: Mapping[str, UnaryHandler], bidi: Mapping[str, BidiHandler]) -> None:
        self.unary = dict(unary)
        self.bidi = dict(bidi)
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._abort = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False

    async def start(self, socket_path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), socket_path)

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, let those in flight finish for `grace` seconds (None: not at
        all), then cancel them. A second stop with a shorter grace cuts the first short."""
        if grace is None or grace <= 0:
            self._abort.set()
        if self._stopping:
            if not self._abort.is_set():  # the first stop's grace may be longer: cut it
                asyncio.get_running_loop().call_later(grace or 0, self._abort.set)
            await self._stopped.wait()
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        idle: asyncio.Future[list[bool]] = asyncio.gather(
            *(c.idle.wait() for c in list(self.connections))
        )
        aborted: asyncio.Future[bool] = asyncio.ensure_future(self._abort.wait())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace if grace and grace > 0 else 0):
                waiting: list[asyncio.Future[Any]] = [idle, aborted]
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        idle.cancel()
        aborted.cancel()
        await asyncio.gather(idle, aborted, return_exceptions=True)
        for connection in list(self.connections):
            connection.cancel_all()
        if self._server is not None:
            await self._server.wait_closed()
        self._stopped.set()

    async def wait_closed(self) -> None:
        await self._stopped.wait()
