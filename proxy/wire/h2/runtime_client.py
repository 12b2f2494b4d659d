"""The runtime-facing side of the `h2` data path: crihook's own HTTP/2 connections to the runtime.

`RuntimePool` keeps the connections to one endpoint (containerd's socket, or a separate image
service): it opens a connection when none can take a stream (none yet, the last one lost, or
every one at the runtime's stream limit, or going away), and forgets a connection when it is
lost, so after a containerd restart the next call connects again. Each `RuntimeConnection`
(an `H2Protocol`: the asyncio adapter of a sans-IO `crihook.api.h2.Connection`) hands a
stream's events to the `Upstream` that opened it: a relay (server.py) or a unary call
(`H2RuntimeClient.call`, the pipeline's way to the runtime).

A call is retried once, on a new connection, only when the runtime never processed its stream
(as grpc-go's transparent retry): the stream was above the last one of the runtime's GOAWAY,
or the runtime refused it with RST_STREAM REFUSED_STREAM. Safe for every method, mutating ones
too, since the runtime saw nothing of it. A stream lost any other way (the connection closed,
a reset, a deadline) fails as it would through grpc.

The control path (start-up probe, reconcile, synchronize, the hooks' runtime queries) keeps
grpc.aio: `control` is RuntimeClient's, inherited and not overridden here. It runs seldom
and costs nothing on a call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

import grpc

from crihook.api.h2.connection import CANCEL, REFUSED_STREAM, Connection, Header
from crihook.api.h2.grpc_wire import (
    GrpcMessages,
    MessageRefused,
    decode_grpc_message,
    encode_timeout,
    grpc_message_prefix,
    headers_from_metadata,
    metadata_from_headers,
    status_from_header,
)
from crihook.api.h2.protocol import H2Protocol
from crihook.proxy.config import RuntimeSettings
from crihook.proxy.cri.outcome import Metadata, Status
from crihook.proxy.cri.runtime import RuntimeCallFailed, UnaryCall
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient

__all__ = [
    "RELAY_WINDOW",
    "FlushedConnection",
    "Flusher",
    "H2RuntimeClient",
    "RuntimeConnection",
    "RuntimePool",
    "Upstream",
    "going_away_status",
    "reset_status",
]

log = logging.getLogger(__name__)

RELAY_WINDOW = 1 << 20
"""Each relayed stream's receive window, both sides: what crihook may hold for one stream
(the peer stops once it sent this much that crihook has not passed on)."""

# HTTP/2 error codes as grpc maps them to a status when a stream is reset.
_RESET_CODES = {
    0x0: grpc.StatusCode.INTERNAL,
    0x7: grpc.StatusCode.UNAVAILABLE,  # REFUSED_STREAM
    0x8: grpc.StatusCode.CANCELLED,
    0xB: grpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
}


def reset_status(error: int) -> Status:
    code = _RESET_CODES.get(error, grpc.StatusCode.INTERNAL)
    return Status(code, f"the runtime reset the stream (HTTP/2 error 0x{error:x})")


def going_away_status() -> Status:
    """A call the runtime did not process because it is going away (GOAWAY)."""
    return Status(grpc.StatusCode.UNAVAILABLE, "the runtime is going away")


class Flusher:
    """Connections that have bytes to write, written once at the end of whatever event-loop
    callback queued them (a read, a task step): a relayed request's HEADERS and DATA leave in
    one write."""

    __slots__ = ("_dirty",)

    def __init__(self) -> None:
        self._dirty: list[_Writable] = []

    def mark(self, connection: _Writable) -> None:
        if not connection.marked:
            connection.marked = True
            self._dirty.append(connection)

    def flush(self) -> None:
        dirty = self._dirty
        while dirty:
            connection = dirty.pop()
            connection.marked = False
            connection.write_out()


class _Writable(Protocol):
    marked: bool

    def write_out(self) -> None: ...


class FlushedConnection(H2Protocol):
    """A connection of the h2 data path (kubelet's or the runtime's). Its writes go through
    the shared `Flusher`: what one callback queued on several connections leaves in one write
    each, at its end. A relay gives each stream's window back itself (`auto_consume` off)."""

    def __init__(self, connection: Connection, flusher: Flusher) -> None:
        super().__init__(connection, auto_consume=False)
        self.flusher = flusher
        self.marked = False

    def flush(self) -> None:
        """This connection's bytes and those the callback queued on others, one write each."""
        self.flusher.mark(self)
        if not self._receiving:
            self.flusher.flush()


class Upstream(Protocol):
    """What a stream to the runtime is told (on the event loop; must not block)."""

    def up_headers(self, headers: list[Header], end_stream: bool) -> None: ...
    def up_data(self, data: bytes, end_stream: bool, flow: int) -> None: ...
    def up_flushed(self, sent: int) -> None: ...
    def up_reset(self, error: int) -> None: ...
    def up_refused(self, error: int | None) -> None:
        """The runtime did not process the stream: it reset it with `error`
        (REFUSED_STREAM), or (None) the stream was above the last one of its GOAWAY. The
        stream is closed; the call may be retried on another connection."""

    def up_lost(self, status: Status) -> None:
        """The connection is gone: nothing more will come."""


class RuntimeConnection(FlushedConnection):
    """One HTTP/2 connection to the runtime. Windows are given back by the stream's upstream
    (a relay: once its bytes went out to kubelet)."""

    def __init__(self, pool: RuntimePool) -> None:
        super().__init__(Connection(client=True, stream_window=RELAY_WINDOW), pool.flusher)
        self.pool = pool
        self.streams: dict[int, Upstream] = {}

    # --- the pool's part ---------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return self._transport is not None and self.h2.can_open_stream

    def open(self, upstream: Upstream, headers: list[Header], end_stream: bool = False) -> int:
        stream_id = self.h2.open_stream()
        self.streams[stream_id] = upstream
        self.h2.send_headers(stream_id, headers, end_stream)
        self.flusher.mark(self)
        return stream_id

    def forget(self, stream_id: int) -> None:
        """The stream ended on our side; nothing more goes to its upstream."""
        self.streams.pop(stream_id, None)

    def close(self) -> None:
        """Close the transport (the streams are lost when asyncio reports it closed)."""
        if self._transport is not None:
            self._transport.close()

    # --- asyncio -------------------------------------------------------------------------------
    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.pool.lost(self)
        reason = f": {exc}" if exc else ""
        self._lose_all(
            Status(grpc.StatusCode.UNAVAILABLE, f"the runtime connection closed{reason}")
        )

    def _lose_all(self, status: Status) -> None:
        streams, self.streams = self.streams, {}
        for upstream in streams.values():
            upstream.up_lost(status)
        self.flusher.flush()

    # --- what the runtime sends ----------------------------------------------------------------
    def _on_data(self, stream_id: int, payload: bytes, end_stream: bool, flow: int) -> None:
        streams = self.streams
        upstream = streams.get(stream_id)
        if upstream is not None:
            if end_stream:
                del streams[stream_id]
            upstream.up_data(payload, end_stream, flow)

    def _on_headers(self, stream_id: int, headers: list[Header], end_stream: bool) -> None:
        streams = self.streams
        upstream = streams.get(stream_id)
        if upstream is not None:
            if end_stream:
                del streams[stream_id]
            upstream.up_headers(headers, end_stream)

    def _on_flushed(self, stream_id: int, sent: int) -> None:
        upstream = self.streams.get(stream_id)
        if upstream is not None:
            upstream.up_flushed(sent)

    def _on_reset(self, stream_id: int, error: int) -> None:
        upstream = self.streams.pop(stream_id, None)
        if upstream is not None:
            if error == REFUSED_STREAM:
                upstream.up_refused(error)
            else:
                upstream.up_reset(error)

    def _on_goaway(self, last_stream_id: int, error: int) -> None:
        log.info("the runtime is going away (error 0x%x, last stream %d)", error, last_stream_id)
        streams = self.streams
        for stream_id in [s for s in streams if s > last_stream_id]:
            streams.pop(stream_id).up_refused(None)

    def _on_protocol_error(self, details: str) -> None:
        # H2Protocol writes the GOAWAY and closes the transport after this.
        log.warning("runtime connection: %s", details)
        self.write_out()
        self._lose_all(Status(grpc.StatusCode.UNAVAILABLE, f"runtime connection: {details}"))


class RuntimePool:
    """The HTTP/2 connections to one runtime endpoint (a unix socket)."""

    def __init__(self, endpoint: str, flusher: Flusher) -> None:
        self.endpoint = endpoint
        self.path = endpoint.removeprefix("unix://")
        self.flusher = flusher
        self._connections: list[RuntimeConnection] = []
        self._connecting: asyncio.Future[RuntimeConnection] | None = None
        self._closed = False

    def ready(self) -> RuntimeConnection | None:
        """A connection that can take a stream now, if there is one."""
        for connection in self._connections:
            if connection.usable:
                return connection
        return None

    async def connection(self) -> RuntimeConnection:
        """A connection that can take a stream; raises RuntimeCallFailed (UNAVAILABLE) when
        the runtime cannot be reached."""
        ready = self.ready()
        if ready is not None:
            return ready
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> RuntimeConnection:
        if self._closed:
            raise RuntimeCallFailed(Status(grpc.StatusCode.UNAVAILABLE, "crihook is stopping"))
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_unix_connection(
                lambda: RuntimeConnection(self), self.path
            )
        except OSError as exc:
            raise RuntimeCallFailed(
                Status(
                    grpc.StatusCode.UNAVAILABLE, f"runtime {self.endpoint}: {exc.strerror or exc}"
                )
            ) from exc
        self._connections.append(connection)
        return connection

    def lost(self, connection: RuntimeConnection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)

    def close(self) -> None:
        self._closed = True
        for connection in list(self._connections):
            connection.close()
        self._connections.clear()


class _UnaryCall:
    """One unary call for the pipeline: the answer, or the status it ended with."""

    __slots__ = (
        "answer",
        "connection",
        "future",
        "headers_seen",
        "messages",
        "refused",
        "stream_id",
    )

    def __init__(self, future: asyncio.Future[bytes]) -> None:
        self.future = future
        self.messages = GrpcMessages(limit=1 << 31)  # the runtime is trusted
        self.answer: bytes | None = None
        self.headers_seen = False
        self.connection: RuntimeConnection | None = None
        self.stream_id = 0
        self.refused = False
        """The runtime did not process the stream (it may be sent again)."""

    def fail(self, status: Status) -> None:
        if not self.future.done():
            self.future.set_exception(RuntimeCallFailed(status))

    def up_headers(self, headers: list[Header], end_stream: bool) -> None:
        first, self.headers_seen = not self.headers_seen, True
        fields = dict(headers)
        if first and fields.get(":status", "200") != "200":
            self.fail(Status(grpc.StatusCode.UNKNOWN, f"HTTP status {fields.get(':status')}"))
            return
        if not end_stream:
            return
        if "grpc-status" not in fields:
            self.fail(Status(grpc.StatusCode.UNKNOWN, "the runtime ended without a status"))
            return
        code = status_from_header(fields["grpc-status"])
        if code is not grpc.StatusCode.OK:
            details = decode_grpc_message(fields.get("grpc-message", ""))
            self.fail(Status(code, details, metadata_from_headers(headers) or ()))
        elif self.answer is None:
            self.fail(Status(grpc.StatusCode.INTERNAL, "the runtime answered no message"))
        elif not self.future.done():
            self.future.set_result(self.answer)

    def up_data(self, data: bytes, end_stream: bool, flow: int) -> None:
        connection = self.connection
        if connection is not None:
            connection.h2.consumed(self.stream_id, flow)
        try:
            messages = self.messages.feed(data)
        except MessageRefused as exc:
            self.fail(Status(grpc.StatusCode.INTERNAL, str(exc)))
            return
        if messages and self.answer is None:
            self.answer = messages[0]
        if end_stream:
            self.fail(Status(grpc.StatusCode.INTERNAL, "the runtime ended without a status"))

    def up_flushed(self, sent: int) -> None:
        pass

    def up_reset(self, error: int) -> None:
        self.fail(reset_status(error))

    def up_refused(self, error: int | None) -> None:
        self.refused = not self.headers_seen and not self.future.done()
        self.fail(going_away_status() if error is None else reset_status(error))

    def up_lost(self, status: Status) -> None:
        self.fail(status)


class H2RuntimeClient(RuntimeClient):
    """RuntimeClient whose calls for the pipeline (`call`) and relays go over crihook's own
    HTTP/2 connections; the control path keeps grpc.aio."""

    def __init__(self, settings: RuntimeSettings, flusher: Flusher) -> None:
        super().__init__(settings)
        self.flusher = flusher
        self.runtime_pool = RuntimePool(settings.endpoint, flusher)
        self.image_pool = (
            RuntimePool(settings.image_target, flusher)
            if settings.image_endpoint and settings.image_endpoint != settings.endpoint
            else self.runtime_pool
        )

    def pool(self, image_service: bool) -> RuntimePool:
        return self.image_pool if image_service else self.runtime_pool

    def call(self, path: str, image_service: bool = False) -> UnaryCall:
        pool = self.pool(image_service)
        flusher = self.flusher
        base: list[Header] = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]

        async def call(
            request: bytes, *, timeout: float | None = None, metadata: Metadata | None = None
        ) -> bytes:
            loop = asyncio.get_running_loop()
            started = time.monotonic()
            pending = _UnaryCall(loop.create_future())
            try:
                return await attempt(pending, request, timeout, metadata)
            except RuntimeCallFailed:
                if not pending.refused:
                    raise
            # Not processed by the runtime: once more, on another connection, in the time left.
            left = None
            if timeout is not None:
                left = timeout - (time.monotonic() - started)
                if left <= 0:
                    raise RuntimeCallFailed(
                        Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                    ) from None
            return await attempt(_UnaryCall(loop.create_future()), request, left, metadata)

        async def attempt(
            pending: _UnaryCall, request: bytes, timeout: float | None, metadata: Metadata | None
        ) -> bytes:
            connection = pool.ready() or await pool.connection()
            loop = asyncio.get_running_loop()
            headers = base
            if timeout is not None or metadata:
                headers = [*base]
                if timeout is not None:
                    headers.append(("grpc-timeout", encode_timeout(timeout)))
                headers += headers_from_metadata(metadata)
            stream_id = connection.open(pending, headers)
            pending.connection, pending.stream_id = connection, stream_id
            connection.h2.send_data(stream_id, grpc_message_prefix(len(request)) + request, True)
            flusher.flush()
            timer = None
            if timeout is not None:
                status = Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                timer = loop.call_later(max(timeout, 0.0), pending.fail, status)
            try:
                return await pending.future
            finally:
                if timer is not None:
                    timer.cancel()
                if connection.h2.is_open(stream_id):  # cancelled, timed out, or failed early
                    connection.forget(stream_id)
                    connection.h2.send_reset(stream_id, CANCEL)
                    connection.write_out()

        return call

    async def close(self, grace: float | None = None) -> None:
        self.runtime_pool.close()
        if self.image_pool is not self.runtime_pool:
            self.image_pool.close()
        await super().close(grace)
