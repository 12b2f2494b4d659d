"""One HTTP/2 connection (RFC 9113), either end, sans-IO: bytes in, events out, bytes to send.

`Connection.receive(data)` parses what the peer sent and returns what it meant, as events
(`Headers`, `Data`, `Reset`, `GoAway`, `Settled`, `Flushed`, `PingAcked`, and `Failed` when
the peer broke the protocol); the `send_*` methods queue frames; `data_to_send()` hands over
the bytes to write. No socket, no event loop, no clock: an adapter (`protocol.H2Protocol`,
or the proxy's) moves the bytes, and tests feed frames by hand.

What it does itself: the preface, SETTINGS (and their ACK), PING answers, HPACK (the `hpack`
package) with CONTINUATION and padding, stream ids and the peer's stream limit, and flow
control both ways:

- sending: DATA waits per stream while the peer's windows are closed; `send_data` returns
  what went out at once, and a `Flushed` event tells what went out later, when a window
  opened. A closing frame (trailers, or END_STREAM) waits behind the data it closes.
- receiving: the connection window is topped up as DATA arrives; a stream's window only when
  its reader says it is done with the bytes (`consumed`). So a slow reader stops its peer's
  stream after `stream_window` bytes, whatever happens on the other streams.
"""

from __future__ import annotations

import collections
import struct
from typing import Final

from crihook.api.h2.hpack_codec import BlockDecoder, BlockEncoder, HPACKError

__all__ = [
    "CANCEL",
    "DEFAULT_WINDOW",
    "ENHANCE_YOUR_CALM",
    "FLOW_CONTROL_ERROR",
    "INTERNAL_ERROR",
    "MAX_WINDOW",
    "NO_ERROR",
    "PREFACE",
    "PROTOCOL_ERROR",
    "REFUSED_STREAM",
    "Connection",
    "Data",
    "Event",
    "Failed",
    "Flushed",
    "GoAway",
    "Header",
    "Headers",
    "PingAcked",
    "Reset",
    "Settled",
    "frame",
]

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS parameters (§6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
# Error codes (§7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

MAX_WINDOW: Final = 2**31 - 1
DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_FRAME_LIMIT: Final = 2**24 - 1
# A window at the maximum is topped up once this much of it was used (a stream window set
# lower is topped up when half of it was used).
REFILL_AFTER = 1 << 30
# A header block (compressed, or its decoded list) larger than this ends the connection.
MAX_HEADER_BLOCK = 1 << 20

_HEADER = struct.Struct(">HBBBL")  # length as 16 + 8 bits, type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")

Header = tuple[str, str]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEADER.pack(size >> 8, size & 0xFF, kind, flags, stream_id) + payload


def _frame_header(kind: int, flags: int, stream_id: int, size: int) -> bytes:
    return _HEADER.pack(size >> 8, size & 0xFF, kind, flags, stream_id)


# --- events ------------------------------------------------------------------------------
class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__
        )

    __hash__ = None  # type: ignore[assignment]


class Settled(Event):
    """The peer's first SETTINGS arrived: it speaks HTTP/2."""

    __slots__ = ()


class Headers(Event):
    """A header block: a new stream's request, a response's headers, or trailers
    (`end_stream`). Names and values as the peer sent them, in order."""

    __slots__ = ("end_stream", "headers", "stream_id")

    def __init__(self, stream_id: int, headers: list[Header], end_stream: bool) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.end_stream = end_stream


class Data(Event):
    """DATA on a stream; `flow_length` (padding included) is what `consumed` gives back."""

    __slots__ = ("data", "end_stream", "flow_length", "stream_id")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool, flow_length: int) -> None:
        self.stream_id = stream_id
        self.data = data
        self.end_stream = end_stream
        self.flow_length = flow_length


class Reset(Event):
    """RST_STREAM from the peer; the stream is gone."""

    __slots__ = ("error", "stream_id")

    def __init__(self, stream_id: int, error: int) -> None:
        self.stream_id = stream_id
        self.error = error


class GoAway(Event):
    """GOAWAY from the peer: streams above `last_stream_id` were not and will not be
    processed (ours are closed: `is_open` is False for them); no new stream may be opened."""

    __slots__ = ("debug", "error", "last_stream_id")

    def __init__(self, last_stream_id: int, error: int, debug: bytes) -> None:
        self.last_stream_id = last_stream_id
        self.error = error
        self.debug = debug


class Flushed(Event):
    """`sent` bytes of a stream's held DATA went out (a window opened)."""

    __slots__ = ("sent", "stream_id")

    def __init__(self, stream_id: int, sent: int) -> None:
        self.stream_id = stream_id
        self.sent = sent


class PingAcked(Event):
    __slots__ = ("opaque",)

    def __init__(self, opaque: bytes) -> None:
        self.opaque = opaque


class Failed(Event):
    """The peer broke HTTP/2: a GOAWAY is queued, the connection cannot go on (write what
    is to send, then close). Always the last event."""

    __slots__ = ("details",)

    def __init__(self, details: str) -> None:
        self.details = details


class _ProtocolError(Exception):
    def __init__(self, details: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(details)
        self.code = code


# The closing item of a stream's held queue: trailers, or END_STREAM on an empty DATA frame.
_END = b""


class _Stream:
    __slots__ = (
        "closing",
        "held",
        "held_bytes",
        "local_closed",
        "recv_window",
        "remote_closed",
        "send_window",
        "unacked",
    )

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.unacked = 0
        self.held: collections.deque[bytes | memoryview] | None = None
        self.held_bytes = 0
        self.closing: list[Header] | bytes | None = None  # trailers or _END, after `held`
        self.local_closed = False
        self.remote_closed = False


class Connection:
    """One HTTP/2 connection. `client`: we send the preface and open odd streams.

    `stream_window`: each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE); the
    default, the maximum, means "never stop the peer" (`consumed` still tops it up).
    `max_concurrent_streams`: how many streams the peer may open at once (refused above).
    """

    def __init__(
        self,
        *,
        client: bool,
        stream_window: int = MAX_WINDOW,
        max_concurrent_streams: int | None = None,
    ) -> None:
        self.client = client
        self._stream_window = stream_window
        self._max_streams = max_concurrent_streams
        self._streams: dict[int, _Stream] = {}
        # Streams with DATA waiting for a window: what a connection WINDOW_UPDATE may send.
        self._holding: dict[int, _Stream] = {}
        self._out: list[bytes | memoryview] = []
        self._inbox = bytearray()
        self._awaiting_preface = not client
        self._decoder = BlockDecoder(MAX_HEADER_BLOCK)
        self._encoder = BlockEncoder()
        self._block = bytearray()
        self._block_stream = 0
        self._block_end_stream = False
        self._conn_unacked = 0  # DATA received since the connection window was last topped up
        self._send_window = DEFAULT_WINDOW  # the peer's, for the connection
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self.peer_max_streams: int | None = None
        """The peer's SETTINGS_MAX_CONCURRENT_STREAMS (None: no limit said)."""
        self._next_stream = 1 if client else 2
        self.last_peer_stream = 0
        self._peer_open = 0  # streams the peer opened that are not closed
        self._open = 0  # streams we opened that are not closed
        self.settled = False
        self.failed = False
        self.sent_goaway: int | None = None  # the last stream id we said we would process
        self.received_goaway: int | None = None
        settings = [(ENABLE_PUSH, 0), (INITIAL_WINDOW_SIZE, stream_window)]
        if max_concurrent_streams is not None:
            settings.insert(1, (MAX_CONCURRENT_STREAMS, max_concurrent_streams))
        payload = b"".join(_SETTING.pack(k, v) for k, v in settings)
        self._out.append(
            (PREFACE if client else b"")
            + frame(SETTINGS, 0, 0, payload)
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - DEFAULT_WINDOW))
        )

    # --- state -------------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        """Streams we opened that are still open (for the peer's limit)."""
        return self._open

    @property
    def can_open_stream(self) -> bool:
        limit = self.peer_max_streams
        return (
            not self.failed
            and self.received_goaway is None
            and (limit is None or self._open < limit)
            and self._next_stream <= MAX_WINDOW
        )

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def held(self, stream_id: int) -> int:
        """Bytes of DATA waiting for the peer's window on this stream."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.held_bytes

    # --- sending -----------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 and type(out[0]) is bytes else b"".join(out)
        out.clear()
        return data  # type: ignore[return-value]  # bytes either way

    def open_stream(self) -> int:
        """A new stream id of ours (send its headers next)."""
        stream_id = self._next_stream
        self._next_stream += 2
        self._streams[stream_id] = _Stream(self._peer_initial_window, self._stream_window)
        self._open += 1
        return stream_id

    def send_headers(self, stream_id: int, headers: list[Header], end_stream: bool = False) -> None:
        """A header block. With `end_stream` it closes our side of the stream, after any
        DATA still held for it. A stream that is gone takes nothing."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.local_closed or stream.closing is not None:
            return
        if end_stream and stream.held:
            stream.closing = headers
            return
        self._write_headers(stream_id, headers, end_stream)
        if end_stream:
            self._local_close(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> int:
        """DATA, now or when the windows let it; returns how many bytes went out now (the
        rest is reported by `Flushed` events)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.local_closed or stream.closing is not None:
            return 0
        size = len(data)
        if (
            stream.held is None
            and size <= self._peer_max_frame
            and size <= stream.send_window
            and size <= self._send_window
        ):
            # The usual case: one frame that fits the windows goes out at once.
            stream.send_window -= size
            self._send_window -= size
            flags = END_STREAM if end_stream else 0
            self._out.append(_frame_header(DATA, flags, stream_id, size))
            if size:
                self._out.append(data)
            if end_stream:
                self._local_close(stream_id, stream)
            return size
        if size:
            if stream.held is None:
                stream.held = collections.deque()
                self._holding[stream_id] = stream
            stream.held.append(memoryview(data) if size > self._peer_max_frame else data)
            stream.held_bytes += size
        if end_stream:
            stream.closing = _END
        return self._flush(stream_id, stream)

    def send_reset(self, stream_id: int, error: int = CANCEL) -> None:
        """RST_STREAM; the stream is forgotten (anything held for it is dropped)."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._remove(stream_id)
        self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(error)))

    def send_goaway(self, error: int = NO_ERROR, last_stream_id: int | None = None) -> None:
        """GOAWAY: the peer's streams above `last_stream_id` (default: the last it opened)
        will not be processed; later ones are refused."""
        last = self.last_peer_stream if last_stream_id is None else last_stream_id
        self.sent_goaway = last
        self._out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", last, error)))

    def send_ping(self, opaque: bytes = b"\0" * 8) -> None:
        self._out.append(frame(PING, 0, 0, opaque))

    def consumed(self, stream_id: int, size: int) -> None:
        """The reader is done with `size` bytes of this stream's DATA (its `flow_length`):
        the peer may send that much more."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed or size <= 0:
            return
        stream.unacked += size
        if stream.unacked >= min(self._stream_window // 2, REFILL_AFTER):
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked)))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _write_headers(self, stream_id: int, headers: list[Header], end_stream: bool) -> None:
        # Encoded when written: HPACK's table changes in the order blocks reach the peer.
        block = self._encoder.encode(headers)
        flags = END_STREAM if end_stream else 0
        limit = self._peer_max_frame
        if len(block) <= limit:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
            return
        parts = [block[i : i + limit] for i in range(0, len(block), limit)]
        self._out.append(frame(HEADERS, flags, stream_id, parts[0]))
        for i, part in enumerate(parts[1:], 2):
            last = END_HEADERS if i == len(parts) else 0
            self._out.append(frame(CONTINUATION, last, stream_id, part))

    def _flush(self, stream_id: int, stream: _Stream) -> int:
        """Send what the windows allow of the stream's held DATA (then its closing frame)."""
        held = stream.held
        sent = 0
        out = self._out
        if held:
            limit = self._peer_max_frame
            while held:
                room = min(self._send_window, stream.send_window, limit)
                if room <= 0:
                    break
                chunk = held[0]
                if len(chunk) > room:
                    held[0] = chunk[room:]
                    chunk = chunk[:room]
                else:
                    held.popleft()
                size = len(chunk)
                flags = 0
                if not held and stream.closing is _END:
                    flags = END_STREAM
                    stream.closing = None
                self._send_window -= size
                stream.send_window -= size
                stream.held_bytes -= size
                sent += size
                out.append(_frame_header(DATA, flags, stream_id, size))
                out.append(chunk)
                if flags:
                    self._local_close(stream_id, stream)
                    return sent
        if not held:
            stream.held = None
            self._holding.pop(stream_id, None)
            closing, stream.closing = stream.closing, None
            if closing is _END:
                out.append(_frame_header(DATA, END_STREAM, stream_id, 0))
                self._local_close(stream_id, stream)
            elif closing is not None:
                self._write_headers(stream_id, closing, True)  # type: ignore[arg-type]
                self._local_close(stream_id, stream)
        return sent

    def _flush_all(self, events: list[Event]) -> None:
        for stream_id, stream in list(self._holding.items()):
            if stream.held is not None:
                sent = self._flush(stream_id, stream)
                if sent:
                    events.append(Flushed(stream_id, sent))

    def _local_close(self, stream_id: int, stream: _Stream) -> None:
        stream.local_closed = True
        if stream.remote_closed:
            self._remove(stream_id)

    def _remove(self, stream_id: int) -> None:
        del self._streams[stream_id]
        self._holding.pop(stream_id, None)
        if (stream_id & 1) == self.client:
            self._open -= 1
        else:
            self._peer_open -= 1

    # --- receiving ---------------------------------------------------------------------
    def receive(self, data: bytes) -> list[Event]:
        """What the peer's bytes meant. After a `Failed` event nothing more is parsed."""
        events: list[Event] = []
        if self.failed:
            return events
        inbox = self._inbox
        if inbox:
            inbox += data
            buffer: bytes | bytearray = inbox
        else:
            buffer = data
        size = len(buffer)
        offset = 0
        try:
            if self._awaiting_preface:
                if size < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise _ProtocolError("no HTTP/2 client preface")
                    self._keep(buffer, 0)
                    return events
                if not buffer.startswith(PREFACE):
                    raise _ProtocolError("no HTTP/2 client preface")
                offset = len(PREFACE)
                self._awaiting_preface = False
            while size - offset >= 9:
                high, low, kind, flags, stream_id = _HEADER.unpack_from(buffer, offset)
                length = high << 8 | low
                if length > DEFAULT_MAX_FRAME:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise _ProtocolError(
                        f"a frame of {length} bytes (is the peer speaking HTTP/2?)",
                        FRAME_SIZE_ERROR,
                    )
                end = offset + 9 + length
                if end > size:
                    break
                payload = buffer[offset + 9 : end]
                offset = end
                self._frame(kind, flags, stream_id & MAX_WINDOW, payload, events)  # type: ignore[arg-type]
        except _ProtocolError as exc:
            self.failed = True
            self._inbox = bytearray()
            self._out.append(
                frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_peer_stream, exc.code))
            )
            events.append(Failed(str(exc)))
            return events
        self._keep(buffer, offset)
        return events

    def _keep(self, buffer: bytes | bytearray, offset: int) -> None:
        if buffer is self._inbox:
            del self._inbox[:offset]
        elif offset < len(buffer):
            self._inbox = bytearray(buffer[offset:])

    def _frame(
        self, kind: int, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        if self._block_stream and kind != CONTINUATION:
            raise _ProtocolError(f"frame type {kind} inside a header block")
        if kind == DATA:
            self._data(flags, stream_id, payload, events)
        elif kind in (HEADERS, CONTINUATION):
            self._headers(kind, flags, stream_id, payload, events)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload, events)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload, events)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                raise _ProtocolError("a malformed PING", FRAME_SIZE_ERROR)
            if flags & ACK:
                events.append(PingAcked(bytes(payload)))
            else:
                self._out.append(frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise _ProtocolError("a malformed RST_STREAM", FRAME_SIZE_ERROR)
            if stream_id in self._streams:
                self._remove(stream_id)
                events.append(Reset(stream_id, _U32.unpack(payload)[0]))
        elif kind == GOAWAY:
            if len(payload) < 8 or stream_id:
                raise _ProtocolError("a malformed GOAWAY", FRAME_SIZE_ERROR)
            last, error = struct.unpack_from(">LL", payload)
            last &= MAX_WINDOW
            self.received_goaway = last
            # Our streams above `last` were never processed: closed, as if never opened (§6.8).
            for sid in [s for s in self._streams if s > last and (s & 1) == self.client]:
                self._remove(sid)
            events.append(GoAway(last, error, bytes(payload[8:])))
        elif kind == PUSH_PROMISE:
            raise _ProtocolError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types carry nothing for us (§5.5, §6.3).

    def _data(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if not stream_id:
            raise _ProtocolError("DATA on stream 0")
        flow = len(payload)
        self._conn_unacked += flow
        if self._conn_unacked >= REFILL_AFTER:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._conn_unacked)))
            self._conn_unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream is None and self._unopened(stream_id):
                raise _ProtocolError(f"DATA on stream {stream_id}, never opened")
            return  # a stream that ended (a reset crossing the peer's DATA): dropped
        stream.recv_window -= flow
        if stream.recv_window < 0:
            raise _ProtocolError(f"stream {stream_id} sent past its window", FLOW_CONTROL_ERROR)
        if flags & PADDED:
            payload = _unpad(payload)
        end = bool(flags & END_STREAM)
        if end:
            stream.remote_closed = True
            if stream.local_closed:
                self._remove(stream_id)
        events.append(Data(stream_id, bytes(payload), end, flow))

    def _unopened(self, stream_id: int) -> bool:
        if (stream_id & 1) == self.client:  # ours
            return stream_id >= self._next_stream
        return stream_id > self.last_peer_stream

    def _headers(
        self, kind: int, flags: int, stream_id: int, payload: bytes, events: list[Event]
    ) -> None:
        if kind == HEADERS:
            if not stream_id:
                raise _ProtocolError("headers on stream 0")
            if flags & PADDED:
                payload = _unpad(payload)
            if flags & PRIORITY_FLAG:
                if len(payload) < 5:
                    raise _ProtocolError("HEADERS too short for its priority", FRAME_SIZE_ERROR)
                payload = payload[5:]
            self._block_stream = stream_id
            self._block_end_stream = bool(flags & END_STREAM)
        elif stream_id != self._block_stream:
            raise _ProtocolError("CONTINUATION without its HEADERS")
        if not flags & END_HEADERS:
            self._block += payload
            if len(self._block) > MAX_HEADER_BLOCK:
                raise _ProtocolError("a header block over 1 MiB")
            return
        if self._block:
            self._block += payload
            block = bytes(self._block)
            self._block.clear()
        else:
            block = bytes(payload)
        self._block_stream = 0
        try:
            headers = self._decoder.decode(block)
        except HPACKError as exc:
            raise _ProtocolError(f"undecodable headers: {exc}", COMPRESSION_ERROR) from exc
        end = self._block_end_stream
        stream = self._streams.get(stream_id)
        if stream is None:
            if self.client and not stream_id & 1:
                raise _ProtocolError(f"a stream opened by the server ({stream_id})")
            if (stream_id & 1) == self.client or stream_id <= self.last_peer_stream:
                if self._unopened(stream_id):
                    raise _ProtocolError(f"headers on stream {stream_id}, never opened")
                return  # a stream that ended already: its table changes are applied above
            self.last_peer_stream = stream_id
            if (self.sent_goaway is not None and stream_id > self.sent_goaway) or (
                self._max_streams is not None and self._peer_open >= self._max_streams
            ):
                self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
                return
            stream = _Stream(self._peer_initial_window, self._stream_window)
            self._streams[stream_id] = stream
            self._peer_open += 1
        elif stream.remote_closed:
            return
        if end:
            stream.remote_closed = True
            if stream.local_closed:
                self._remove(stream_id)
        events.append(Headers(stream_id, headers, end))

    def _settings(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id:
            raise _ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ProtocolError("a SETTINGS frame of the wrong length", FRAME_SIZE_ERROR)
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolError("an initial window over 2^31-1", FLOW_CONTROL_ERROR)
                delta = value - self._peer_initial_window
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:  # §6.9.2
                        raise _ProtocolError("a stream window over 2^31-1", FLOW_CONTROL_ERROR)
                self._peer_initial_window = value
            elif key == MAX_FRAME_SIZE:
                # Below 16,384 is against the RFC but harmless to honour: smaller frames.
                if not 0 < value <= MAX_FRAME_LIMIT:
                    raise _ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {value}")
                self._peer_max_frame = value
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == HEADER_TABLE_SIZE:
                self._encoder.table_size(value)
        self._out.append(frame(SETTINGS, ACK, 0))
        if not self.settled:
            self.settled = True
            events.append(Settled())
        self._flush_all(events)

    def _window_update(self, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise _ProtocolError("a WINDOW_UPDATE of the wrong length", FRAME_SIZE_ERROR)
        increment = _U32.unpack(payload)[0] & MAX_WINDOW
        if not increment:
            raise _ProtocolError("a WINDOW_UPDATE of 0")
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise _ProtocolError("the connection window over 2^31-1", FLOW_CONTROL_ERROR)
            self._flush_all(events)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream that ended has no window
        if stream.send_window + increment > MAX_WINDOW:  # §6.9.1: the stream ends, not all
            self._remove(stream_id)
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(FLOW_CONTROL_ERROR)))
            events.append(Reset(stream_id, FLOW_CONTROL_ERROR))
            return
        stream.send_window += increment
        if stream.held is not None:
            sent = self._flush(stream_id, stream)
            if sent:
                events.append(Flushed(stream_id, sent))


def _unpad(payload: bytes) -> bytes:
    if not payload or payload[0] >= len(payload):
        raise _ProtocolError("padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]
