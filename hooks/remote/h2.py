"""The HTTP/2 connection layer under crihook's plugin transport (RFC 9113), both ends.

crihook's side of a plugin Stream (h2stream.py) and the SDK's plugin server (h2server.py)
speak gRPC directly over HTTP/2 on a unix socket instead of through grpc.aio, whose every
read and write is a batch completed through grpc core's poller thread. `H2Connection` is what
both ends share: frames in (`data_received`) and out, SETTINGS and PING acknowledged, flow
control both ways (our receive windows are opened to the maximum once; the peer's are
respected, DATA is held back per stream while they are closed), header blocks with
CONTINUATION and HPACK (the `hpack` package), padding. What a frame means for a stream is the
subclass's business: `_on_headers`, `_on_data`, `_on_reset`, `_on_goaway`, `_on_settled`,
`_on_protocol_error`. `GrpcMessages` cuts DATA into gRPC's length-prefixed messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import struct
import urllib.parse
from typing import cast

import grpc
import hpack

__all__ = [
    "CANCEL",
    "MAX_MESSAGE",
    "PREFACE",
    "GrpcMessages",
    "H2Connection",
    "ProtocolError",
    "decode_grpc_message",
    "encode_grpc_message",
    "frame",
    "grpc_message_prefix",
    "status_from_header",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS parameters.
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x2, 0x4, 0x5
# Error codes.
NO_ERROR, PROTOCOL_ERROR, CANCEL = 0x0, 0x1, 0x8

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
# Our receive windows start at the maximum; they are topped up after this much was read.
REFILL_AFTER = 1 << 30
MAX_MESSAGE = 64 << 20
MAX_HEADER_BLOCK = 64 << 10

_HEADER = struct.Struct(">HBBBL")  # length as 16 + 8 bits, type, flags, stream id
_U32 = struct.Struct(">L")
_MESSAGE_PREFIX = struct.Struct(">BL")

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class ProtocolError(Exception):
    """The peer broke HTTP/2 or gRPC framing; the connection cannot go on."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEADER.pack(size >> 8, size & 0xFF, kind, flags, stream_id) + payload


def grpc_message_prefix(size: int) -> bytes:
    return _MESSAGE_PREFIX.pack(0, size)


def status_from_header(value: str | None) -> grpc.StatusCode:
    try:
        return _CODES[int(value or "")]
    except (KeyError, ValueError):
        return grpc.StatusCode.UNKNOWN


def decode_grpc_message(value: str) -> str:
    return urllib.parse.unquote(value)


def encode_grpc_message(text: str) -> str:
    # gRPC: percent-encode what is not printable ASCII, and '%' itself.
    return urllib.parse.quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


class GrpcMessages:
    """Cuts one stream's DATA payloads into whole gRPC messages (uncompressed only)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, payload: bytes) -> list[bytes]:
        """The messages completed by `payload`; raises ProtocolError for a compressed or
        oversized one."""
        buffer = self._buffer
        if not buffer and len(payload) >= 5:
            # The usual case: the frame holds exactly one whole message.
            compressed, size = _MESSAGE_PREFIX.unpack_from(payload)
            if size + 5 == len(payload) and not compressed:
                return [payload[5:]]
        buffer += payload
        messages = []
        offset = 0
        while len(buffer) - offset >= 5:
            compressed, size = _MESSAGE_PREFIX.unpack_from(buffer, offset)
            if compressed:
                raise ProtocolError("a compressed message, although none was offered")
            if size > MAX_MESSAGE:
                raise ProtocolError(f"a message of {size} bytes (limit {MAX_MESSAGE})")
            if len(buffer) - offset - 5 < size:
                break
            messages.append(bytes(buffer[offset + 5 : offset + 5 + size]))
            offset += 5 + size
        del buffer[:offset]
        return messages

    @property
    def partial(self) -> bool:
        return bool(self._buffer)


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection, either end (`server`): framing, SETTINGS, PING, flow control,
    header blocks. Subclasses give streams their meaning."""

    def __init__(self, *, server: bool) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._inbox = bytearray()  # unparsed bytes from the peer
        self._awaiting_preface = server
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_BLOCK
        self._encoder = hpack.Encoder()
        self._header_block = bytearray()
        self._header_stream = 0
        self._header_end_stream = False
        self._received = 0
        self._send_window = DEFAULT_WINDOW  # the connection's
        self._stream_windows: dict[int, int] = {}
        self._peer_initial_window = DEFAULT_WINDOW
        self._max_frame = DEFAULT_MAX_FRAME
        # Per stream, what waits for its window: DATA payloads and, last, its closing frame.
        self._held: dict[int, collections.deque[bytes | tuple[bytes]]] = {}
        self._settled = False
        self._broken = False

    # --- the subclass's part ----------------------------------------------------------------
    def _on_settled(self) -> None:
        """The peer's first SETTINGS arrived: it speaks HTTP/2."""

    def _on_headers(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> None:
        raise NotImplementedError

    def _on_data(self, stream_id: int, payload: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def _on_reset(self, stream_id: int, error: int) -> None:
        """RST_STREAM from the peer."""

    def _on_goaway(self, last_stream_id: int, error: int) -> None:
        """GOAWAY from the peer."""

    def _on_protocol_error(self, details: str) -> None:
        """The connection is being dropped for `details`."""

    # --- life cycle ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        settings = struct.pack(
            ">HLHL", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW
        )
        self._transport.write(
            (b"" if self._server else PREFACE)
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - DEFAULT_WINDOW))
        )

    def close_transport(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    @property
    def alive(self) -> bool:
        return self._transport is not None and not self._broken

    # --- sending ---------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def send_headers(
        self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool = False
    ) -> None:
        """A header block (in one frame: ours are small). With end_stream it closes the
        stream after any DATA still held for it."""
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        block = frame(HEADERS, flags, stream_id, self._encoder.encode(headers, huffman=False))
        held = self._held.get(stream_id)
        if held:  # trailers go after the data they close
            held.append((block,))
            return
        self.write(block)
        if end_stream:
            self._stream_windows.pop(stream_id, None)

    def send_message(self, stream_id: int, message: bytes) -> None:
        """One gRPC message as DATA, now or when the windows let it go."""
        held = self._held.setdefault(stream_id, collections.deque())
        held.append(grpc_message_prefix(len(message)) + message)
        self._flush(stream_id)

    def send_reset(self, stream_id: int, error: int = CANCEL) -> None:
        self._held.pop(stream_id, None)
        self.write(frame(RST_STREAM, 0, stream_id, _U32.pack(error)))

    def send_goaway(self, last_stream_id: int, error: int = NO_ERROR) -> None:
        self.write(frame(GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, error)))

    def track_stream(self, stream_id: int) -> None:
        """Keep a send window for a stream from now on (until forget_stream)."""
        self._stream_windows.setdefault(stream_id, self._peer_initial_window)

    def forget_stream(self, stream_id: int) -> None:
        self._stream_windows.pop(stream_id, None)
        self._held.pop(stream_id, None)

    def _flush(self, stream_id: int) -> None:
        held = self._held.get(stream_id)
        if not held or self._transport is None or stream_id not in self._stream_windows:
            return
        window = self._stream_windows[stream_id]
        frames = []
        closed = False
        while held:
            data = held[0]
            if isinstance(data, tuple):  # the closing header block, once all data went
                held.popleft()
                frames.append(data[0])
                closed = True  # the stream is done: no window to keep
                break
            room = min(self._send_window, window, self._max_frame)
            if room <= 0:
                break
            chunk = data[:room]
            if len(chunk) < len(data):
                held[0] = data[room:]
            else:
                held.popleft()
            self._send_window -= len(chunk)
            window -= len(chunk)
            frames.append(frame(DATA, 0, stream_id, chunk))
        if closed:
            del self._stream_windows[stream_id]
        else:
            self._stream_windows[stream_id] = window
        if not held:
            del self._held[stream_id]
        if frames:
            self._transport.write(b"".join(frames) if len(frames) > 1 else frames[0])

    def _flush_all(self) -> None:
        for stream_id in list(self._held):
            self._flush(stream_id)

    # --- receiving -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        inbox = self._inbox
        inbox += data
        offset, size = 0, len(inbox)
        if self._awaiting_preface:
            if size < len(PREFACE):
                return
            if not inbox.startswith(PREFACE):
                return self._fail("no HTTP/2 client preface")
            offset = len(PREFACE)
            self._awaiting_preface = False
        while size - offset >= 9 and not self._broken:
            high, low, kind, flags, stream_id = _HEADER.unpack_from(inbox, offset)
            length = high << 8 | low
            if length > DEFAULT_MAX_FRAME:  # ours: we never raise SETTINGS_MAX_FRAME_SIZE
                return self._fail(f"a frame of {length} bytes (is the peer speaking HTTP/2?)")
            end = offset + 9 + length
            if end > size:
                break
            payload = bytes(inbox[offset + 9 : end])
            offset = end
            try:
                self._frame_received(kind, flags, stream_id & MAX_WINDOW, payload)
            except ProtocolError as exc:
                return self._fail(str(exc))
        del inbox[:offset]
        return None

    def _fail(self, details: str) -> None:
        if self._broken:
            return
        self._broken = True
        self._on_protocol_error(details)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self.send_goaway(0, PROTOCOL_ERROR)
        self.close_transport()

    def _frame_received(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_stream and kind != CONTINUATION:
            raise ProtocolError(f"frame type {kind} inside a header block")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind in (HEADERS, CONTINUATION):
            self._headers(kind, flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == PING:
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == RST_STREAM:
            error = _U32.unpack(payload)[0] if len(payload) == 4 else PROTOCOL_ERROR
            self.forget_stream(stream_id)
            self._on_reset(stream_id, error)
        elif kind == GOAWAY:
            if len(payload) < 8:
                raise ProtocolError("a GOAWAY frame too short")
            last, error = struct.unpack_from(">LL", payload)
            self._on_goaway(last & MAX_WINDOW, error)
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types carry nothing for us (RFC 9113 §4.1, §5.5).

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._received += len(payload)
        if self._received >= REFILL_AFTER:
            refill = _U32.pack(self._received)
            self.write(
                frame(WINDOW_UPDATE, 0, 0, refill) + frame(WINDOW_UPDATE, 0, stream_id, refill)
            )
            self._received = 0
        if flags & PADDED:
            payload = _unpad(payload)
        self._on_data(stream_id, payload, bool(flags & END_STREAM))

    def _headers(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == HEADERS:
            if stream_id == 0:
                raise ProtocolError("headers on stream 0")
            if flags & PADDED:
                payload = _unpad(payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._header_stream = stream_id
            self._header_end_stream = bool(flags & END_STREAM)
        elif stream_id != self._header_stream:
            raise ProtocolError("CONTINUATION without its HEADERS")
        self._header_block += payload
        if len(self._header_block) > MAX_HEADER_BLOCK:
            raise ProtocolError("a header block over 64 KiB")
        if not flags & END_HEADERS:
            return
        block, self._header_block = bytes(self._header_block), bytearray()
        self._header_stream = 0
        try:
            # raw=False: names and values come back as str (hpack's stubs say bytes).
            headers = cast(dict[str, str], dict(self._decoder.decode(block, raw=False)))
        except hpack.HPACKError as exc:
            raise ProtocolError(f"undecodable headers: {exc}") from exc
        self._on_headers(stream_id, headers, self._header_end_stream)

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ProtocolError("a SETTINGS frame of the wrong length")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError("an initial window over 2^31-1")
                delta = value - self._peer_initial_window
                for stream_id in self._stream_windows:
                    self._stream_windows[stream_id] += delta
                self._peer_initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value
        self.write(frame(SETTINGS, ACK, 0))
        if not self._settled:
            self._settled = True
            self._on_settled()
        self._flush_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError("a WINDOW_UPDATE of the wrong length")
        increment = _U32.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            self._send_window += increment
            self._flush_all()
        elif stream_id in self._stream_windows:  # a stream that ended has none
            self._stream_windows[stream_id] += increment
            self._flush(stream_id)


def _unpad(payload: bytes) -> bytes:
    pad = payload[0] if payload else 0
    return payload[1 : len(payload) - pad]
