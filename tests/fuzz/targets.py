"""Fuzz targets for crihook's hand-written protocol code, each a function of one byte string.

Every connection crihook serves (kubelet's, the runtime's, a plugin's) goes through
`api/h2`: the frame parser and connection state machine, the HPACK decoder, and gRPC's
length-prefixed message framing. A target feeds its bytes to that code and checks what
must hold for any input: only the documented errors come out (a `Failed` event, an
`HPACKError`, a `MessageRefused`), the answer does not depend on how the bytes were cut,
and the bookkeeping stays consistent. An `AssertionError` or any other exception is a
finding.

The same functions serve two runners: `bench/fuzz.py` (atheris, coverage-guided, run by
hand) and `tests/unit/test_fuzz_corpus.py` (the corpus they grew, replayed in CI).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Final

from hpack import Decoder as ReferenceDecoder
from hpack import HPACKError as ReferenceHPACKError

from crihook.api.h2 import connection as h2
from crihook.api.h2.grpc_wire import (
    CompressedMessage,
    GrpcMessages,
    MessageSizes,
    MessageTooLarge,
)
from crihook.api.h2.hpack_codec import BlockDecoder, HPACKError

__all__ = ["TARGETS", "grpc_reader", "h2_connection", "hpack_decoder", "hpack_differential"]

MAX_HEADER_LIST: Final = 1 << 20
"""The decoders' header list limit in the HPACK targets: larger than any input, so the two
decoders of the differential do not differ on how they count a list's size."""


def _cuts(data: bytes, sizes: bytes) -> Iterator[bytes]:
    """`data` in pieces whose lengths come from `sizes` (cycled; 0 means 1 byte)."""
    offset = 0
    index = 0
    while offset < len(data):
        step = max(sizes[index % len(sizes)], 1) if sizes else len(data)
        yield data[offset : offset + step]
        offset += step
        index += 1


def _blocks(data: bytes) -> Iterator[bytes]:
    """A byte string as a sequence of header blocks: each a length byte and that many bytes
    (so one input exercises the dynamic table across blocks)."""
    offset = 0
    while offset < len(data):
        size = data[offset]
        yield data[offset + 1 : offset + 1 + size]
        offset += 1 + size


# --- api/h2/connection.py ------------------------------------------------------------------
class _Application:
    """What crihook's adapters do with a connection's events, kept small and deterministic:
    answer each stream the peer opens (headers, its DATA echoed back, trailers), give back
    the window of what was read, ping now and then. So the fuzzer reaches the sending side
    too: held DATA, windows opened by the peer, closing frames queued behind data."""

    def __init__(self, conn: h2.Connection, react: bool) -> None:
        self.conn = conn
        self.react = react
        self.log: list[object] = []

    def feed(self, chunk: bytes) -> None:
        conn = self.conn
        events = conn.receive(chunk)
        for index, event in enumerate(events):
            assert isinstance(event, h2.Event), event
            if isinstance(event, h2.Failed):
                assert index == len(events) - 1, "Failed must be the last event"
                assert conn.failed
            self.log.append(event)
            if self.react:
                self._react(event)
        out = conn.data_to_send()
        assert isinstance(out, bytes)
        self.log.append(out)
        _check_streams(conn)

    def _react(self, event: h2.Event) -> None:
        conn = self.conn
        if isinstance(event, h2.Headers):
            if conn.is_open(event.stream_id) and (event.stream_id & 1) != conn.client:
                conn.send_headers(event.stream_id, [(":status", "200")])
                if event.end_stream:
                    conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
        elif isinstance(event, h2.Data):
            conn.consumed(event.stream_id, event.flow_length)
            if conn.is_open(event.stream_id):
                conn.send_data(event.stream_id, event.data * 3, end_stream=False)
                if event.end_stream:
                    conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
        elif isinstance(event, h2.Settled):
            conn.send_ping(b"fuzzping")


def _check_streams(conn: h2.Connection) -> None:
    """The stream counts the limits are enforced with agree with the streams kept."""
    if conn.failed:
        return
    streams = conn._streams
    ours = sum(1 for sid in streams if (sid & 1) == conn.client)
    assert conn._open == ours, (conn._open, ours)
    assert conn._peer_open == len(streams) - ours, (conn._peer_open, len(streams) - ours)
    for sid, stream in streams.items():
        assert not (stream.local_closed and stream.remote_closed), f"stream {sid} kept closed"
        assert stream.held_bytes >= 0
        assert stream.held is None or sid in conn._holding
        assert stream.recv_window >= 0
        assert stream.send_window <= h2.MAX_WINDOW, f"stream {sid}: a window over 2^31-1"
    assert conn._send_window <= h2.MAX_WINDOW


def _run_connection(client: bool, data: bytes, sizes: bytes, react: bool) -> list[object]:
    """The events and the bytes sent, in order, of a connection fed `data` cut by `sizes`;
    with `react`, answered by `_Application`."""
    conn = h2.Connection(client=client, max_concurrent_streams=None if client else 8)
    app = _Application(conn, react)
    if client:
        stream_id = conn.open_stream()
        conn.send_headers(stream_id, [(":method", "POST"), (":path", "/runtime.v1/Version")])
        conn.send_data(stream_id, b"\0\0\0\0\0" + b"x" * 70_000, end_stream=True)
    app.log.append(conn.data_to_send())
    for chunk in _cuts(data, sizes):
        app.feed(chunk)
        if conn.failed:
            assert conn.receive(b"\0" * 9) == [], "nothing is parsed after a failure"
            break
    return app.log


def h2_connection(data: bytes) -> None:
    """The frame parser and connection state machine, fed arbitrary bytes as the peer.

    The first byte picks the side (bit 0: we are the client) and whether the server's
    preface is given for free (bit 1, so the fuzzer need not find it); the second byte how
    to cut the rest into reads. What the connection says and answers by itself (events,
    SETTINGS and PING acks, window updates, GOAWAY, refused streams) must be the same
    whether the input arrives in one read or in pieces; then the same pieces once more with
    an application answering the streams (the sending side: held DATA, windows, closing
    frames), where only the invariants are checked (what it answers depends on the reads:
    it sees a read's events after the parser went through the whole read)."""
    if len(data) < 2:
        return
    flags, cut, body = data[0], data[1], data[2:]
    client = bool(flags & 1)
    if not client and flags & 2:
        body = h2.PREFACE + body
    sizes = bytes((cut % 17,)) if cut else body[:8]
    whole = _run_connection(client, body, b"", react=False)
    pieces = _run_connection(client, body, sizes, react=False)
    assert _joined(whole) == _joined(pieces), "the answer depends on how the bytes were cut"
    _run_connection(client, body, sizes, react=True)


def _joined(log: list[object]) -> tuple[list[object], bytes]:
    """A run's events, and every byte it sent, wherever the reads fell."""
    events = [item for item in log if not isinstance(item, bytes)]
    return events, b"".join(item for item in log if isinstance(item, bytes))


# --- api/h2/hpack_codec.py ------------------------------------------------------------------
def hpack_decoder(data: bytes) -> None:
    """The HPACK decoder fed a sequence of header blocks, each sent twice (the second time
    a block that left the dynamic table as it was comes from the decoder's cache): each
    block decodes to a list of str pairs or raises HPACKError (and the connection would end
    there), exactly as a decoder without the cache answers; the dynamic table stays within
    its size."""
    cached = BlockDecoder(MAX_HEADER_LIST)
    fresh = BlockDecoder(MAX_HEADER_LIST)
    for block in _blocks(data):
        for _ in range(2):
            try:
                got: list[tuple[str, str]] | None = cached.decode(block)
            except HPACKError:
                got = None
            try:
                want: list[tuple[str, str]] | None = fresh._decode(block)
            except (HPACKError, IndexError, UnicodeDecodeError):  # decode() makes these HPACKError
                want = None
            assert got == want, (got, want)
            if got is None:
                return
            assert all(type(n) is str and type(v) is str for n, v in got)
            _check_table(cached)


def _check_table(decoder: BlockDecoder) -> None:
    size = sum(32 + len(n.encode()) + len(v.encode()) for n, v in decoder._table)
    assert size == decoder._size, (size, decoder._size)
    assert decoder._size <= decoder._table_max <= decoder._max_table


def hpack_differential(data: bytes) -> None:
    """Our HPACK decoder against the `hpack` package's on the same blocks: both decode a
    block to the same fields, or both refuse it (RFC 7541 leaves no room for a third
    answer). After a refusal the connection ends, so the rest is not compared."""
    ours = BlockDecoder(MAX_HEADER_LIST)
    theirs = ReferenceDecoder(max_header_list_size=MAX_HEADER_LIST)
    for block in _blocks(data):
        try:
            got: list[tuple[str, str]] | None = ours.decode(block)
        except HPACKError:
            got = None
        try:
            want: list[tuple[str, str]] | None = [(str(n), str(v)) for n, v in theirs.decode(block)]
        except ReferenceHPACKError:
            want = None
        except (IndexError, ValueError):  # hpack's own slips on cut input: a refusal still
            want = None
        assert got == want, f"ours {got!r}, hpack {want!r} for block {block.hex()}"
        if got is None:
            return


# --- api/h2/grpc_wire.py -------------------------------------------------------------------
_PREFIX = struct.Struct(">BL")


def _reference_messages(data: bytes, limit: int) -> tuple[list[bytes], type[Exception] | None]:
    """gRPC's length-prefixed messages of a whole stream, read the plain way."""
    messages = []
    offset = 0
    while len(data) - offset >= 5:
        compressed, size = _PREFIX.unpack_from(data, offset)
        if compressed:
            return messages, CompressedMessage
        if size > limit:
            return messages, MessageTooLarge
        if len(data) - offset - 5 < size:
            break
        messages.append(data[offset + 5 : offset + 5 + size])
        offset += 5 + size
    return messages, None


def _reference_sizes(data: bytes, limit: int) -> bool:
    """Whether some message prefix of the stream announces more than `limit` (compression
    flags are not MessageSizes' business)."""
    offset = 0
    while len(data) - offset >= 5:
        _, size = _PREFIX.unpack_from(data, offset)
        if size > limit:
            return True
        offset += 5 + size
    return False


def grpc_reader(data: bytes) -> None:
    """The gRPC message reader (`GrpcMessages`) and the relay's prefix watcher
    (`MessageSizes`), fed one stream's bytes in pieces: the messages, the refusal and what
    is left over are those of reading the whole stream at once.

    Bytes 0-1: the size limit; byte 2: how to cut the rest."""
    if len(data) < 3:
        return
    limit, cut, body = int.from_bytes(data[:2], "big"), data[2], data[3:]
    sizes = bytes((cut % 23,)) if cut else body[:6]
    want, refusal = _reference_messages(body, limit)
    reader = GrpcMessages(limit)
    got: list[bytes] = []
    error: type[Exception] | None = None
    for piece in _cuts(body, sizes):
        try:
            got.extend(reader.feed(piece))
        except (CompressedMessage, MessageTooLarge) as exc:
            error = type(exc)
            break
    assert error is refusal, (error, refusal)
    if error is None:
        assert got == want, (got, want)
        consumed = sum(5 + len(m) for m in want)
        assert reader.partial == (consumed < len(body)), (reader.partial, consumed, len(body))
    else:  # the messages completed in the piece that brought the refusal are not handed over
        assert got == want[: len(got)], (got, want)
    assert all(type(m) is bytes for m in got)

    watcher = MessageSizes(limit)
    too_large = False
    for piece in _cuts(body, sizes):
        try:
            watcher.feed(piece)
        except MessageTooLarge:
            too_large = True
            break
    assert too_large == _reference_sizes(body, limit), (too_large, limit)


TARGETS: Final[dict[str, Callable[[bytes], None]]] = {
    "h2_connection": h2_connection,
    "hpack_decoder": hpack_decoder,
    "hpack_differential": hpack_differential,
    "grpc_reader": grpc_reader,
}
"""Each target by the name of its corpus directory (tests/fuzz/corpus/<name>/)."""
