"""crihook's end of a plugin's persistent Stream: one gRPC bidi call on its own connection.

grpc.aio cost crihook ~270 µs of CPU per plugin call here (bench.plugin_rtt; ~125 µs with
this module, views included): every read and write is a batch handed to grpc core and
completed through its poller thread, which then wakes the event loop. A stream that lives
for the whole connection needs none of that: after the headers, each message is one HTTP/2
DATA frame each way. `GrpcStream` writes those frames on an asyncio transport and parses the
plugin's in `data_received` (crihook.api.h2), so a message costs one write, one read and no
thread hop.

The call: request HEADERS on stream 1 (no grpc-accept-encoding is offered, so the plugin
never compresses), messages both ways, and the end: the trailers (or a trailers-only answer,
e.g. UNIMPLEMENTED) with grpc-status and grpc-message, RST_STREAM, a protocol error or the
connection closing. GOAWAY is logged; the stream runs on until the plugin ends it. Every way
the stream can end is reported once through `on_end(code, details)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from crihook.api.h2.connection import CANCEL, Connection, Header
from crihook.api.h2.grpc_wire import (
    GrpcMessages,
    MessageRefused,
    decode_grpc_message,
    grpc_message_prefix,
    status_from_header,
)
from crihook.api.h2.protocol import H2Protocol

__all__ = ["GrpcStream", "StreamEnded"]

log = logging.getLogger(__name__)

STREAM_ID = 1

OnMessage = Callable[[bytes], None]
OnEnd = Callable[[grpc.StatusCode, str], None]

# HTTP/2 error codes a plugin may reset the stream with, as gRPC maps them.
_RESET_CODES = {
    0x0: grpc.StatusCode.INTERNAL,  # NO_ERROR before the trailers
    0x7: grpc.StatusCode.UNAVAILABLE,  # REFUSED_STREAM
    0x8: grpc.StatusCode.CANCELLED,  # CANCEL
    0xB: grpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
}


class StreamEnded(ConnectionError):
    """A message was sent on a stream that has already ended."""


class GrpcStream(H2Protocol):
    """The client end of one gRPC stream on its own HTTP/2 connection.

    `send(message)` never blocks: the frame is written at once, or queued until the peer's
    flow-control window opens. `on_message` gets every message the peer sends, in order;
    `on_end` is called exactly once, when the stream ends for whatever reason. Both run on the
    event loop, inside `data_received`: they must not block."""

    def __init__(self, path: str, on_message: OnMessage, on_end: OnEnd) -> None:
        super().__init__(Connection(client=True))
        self._path = path
        self._on_message = on_message
        self._on_end: OnEnd | None = on_end
        self._messages = GrpcMessages()
        self._got_headers = False
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(
        cls,
        socket_path: str,
        path: str,
        on_message: OnMessage,
        on_end: OnEnd,
        timeout: float = 2.0,
    ) -> GrpcStream:
        """Connect, exchange SETTINGS, open the stream. Raises ConnectionError (or OSError)
        when the peer is not there or does not speak HTTP/2 within `timeout`."""
        loop = asyncio.get_running_loop()
        stream = cls(path, on_message, on_end)
        async with asyncio.timeout(timeout):
            await loop.create_unix_connection(lambda: stream, socket_path)
            try:
                await stream._ready  # the peer's SETTINGS: it speaks HTTP/2
            except BaseException:
                stream.close()
                raise
        return stream

    @property
    def ended(self) -> bool:
        return self._on_end is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.h2.open_stream()  # STREAM_ID, the first of ours
        self.send_headers(
            STREAM_ID,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", self._path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("user-agent", "crihook-h2stream"),
            ],
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        reason = f"connection lost: {exc}" if exc else "the plugin closed the connection"
        self._not_ready(reason)
        self._end(grpc.StatusCode.UNAVAILABLE, reason)

    def close(self) -> None:
        """Cancel the stream and close the connection (no on_end for a close we asked for)."""
        self._on_end = None
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self.send_reset(STREAM_ID, CANCEL)
        self.close_transport()

    def send(self, message: bytes) -> None:
        """Send one message (already serialized)."""
        if self._on_end is None or not self.alive:
            raise StreamEnded("the plugin stream has ended")
        self.send_data(STREAM_ID, grpc_message_prefix(len(message)) + message)

    # --- endings ------------------------------------------------------------------------
    def _end(self, code: grpc.StatusCode, details: str) -> None:
        on_end, self._on_end = self._on_end, None
        self.close_transport()
        if on_end is not None:
            on_end(code, details)

    def _not_ready(self, reason: str) -> None:
        """Fail open() if it is still waiting for the peer's SETTINGS."""
        if not self._ready.done():
            self._ready.set_exception(ConnectionError(reason))
            self._ready.exception()  # open() may not be waiting: not an unhandled error

    # --- what the connection reports ----------------------------------------------------------
    def _on_settled(self) -> None:
        if not self._ready.done():
            self._ready.set_result(None)

    def _on_protocol_error(self, details: str) -> None:
        log.warning("plugin stream %s: %s", self._path, details)
        self._not_ready(details)
        self._end(grpc.StatusCode.INTERNAL, details)

    def _on_data(self, stream_id: int, payload: bytes, end_stream: bool, flow: int) -> None:
        if stream_id != STREAM_ID or self._on_end is None:
            return
        try:
            messages = self._messages.feed(payload)
        except MessageRefused as exc:
            self._on_protocol_error(str(exc))
            return
        for message in messages:
            self._on_message(message)
            if self._on_end is None:  # the callback ended it
                return
        if end_stream:
            self._end(grpc.StatusCode.INTERNAL, "the plugin ended the stream without a status")

    def _on_headers(self, stream_id: int, fields: list[Header], end_stream: bool) -> None:
        if stream_id != STREAM_ID or self._on_end is None:
            return
        headers = dict(fields)
        first, self._got_headers = not self._got_headers, True
        if first and headers.get(":status") != "200":
            self._end(
                grpc.StatusCode.UNAVAILABLE,
                f"the plugin answered HTTP status {headers.get(':status')}",
            )
        elif end_stream:  # the trailers, or a trailers-only answer
            message = decode_grpc_message(headers.get("grpc-message", ""))
            self._end(status_from_header(headers.get("grpc-status")), message)

    def _on_reset(self, stream_id: int, error: int) -> None:
        if stream_id == STREAM_ID:
            code = _RESET_CODES.get(error, grpc.StatusCode.INTERNAL)
            self._end(code, f"the plugin reset the stream (HTTP/2 error 0x{error:x})")

    def _on_goaway(self, last_stream_id: int, error: int) -> None:
        log.info("plugin stream %s: the plugin is going away (error 0x%x)", self._path, error)
