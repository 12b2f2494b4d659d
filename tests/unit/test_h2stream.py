"""GrpcStream's HTTP/2 framing, fed by hand-made frames: what it writes, what it delivers, and
how every way of ending is reported. Against a real grpc server: tests/integration."""

from __future__ import annotations

import struct
from typing import Any

import grpc
import hpack
import pytest

from crihook.api.h2 import connection as h2
from crihook.hooks.remote.h2stream import GrpcStream, StreamEnded

PATH = "/crihook.hook.v1.Plugin/Stream"


class Transport:
    """Records what the stream writes; closing is remembered."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """(type, flags, stream id, payload) of everything written after the preface."""
        data = bytes(self.written)
        if data.startswith(h2.PREFACE):
            data = data[len(h2.PREFACE) :]
        out = []
        while data:
            length = int.from_bytes(data[:3], "big")
            kind, flags = data[3], data[4]
            stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            out.append((kind, flags, stream_id, data[9 : 9 + length]))
            data = data[9 + length :]
        return out

    def take(self) -> list[tuple[int, int, int, bytes]]:
        frames = self.frames()
        self.written.clear()
        return frames


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([kind, flags])
        + stream_id.to_bytes(4, "big")
        + payload
    )


def grpc_message(data: bytes) -> bytes:
    return struct.pack(">BL", 0, len(data)) + data


def settings(**values: int) -> bytes:
    ids = {"initial_window": 0x4, "max_frame": 0x5}
    return frame(4, 0, 0, b"".join(struct.pack(">HL", ids[k], v) for k, v in values.items()))


class Peer:
    """The plugin's side: encodes headers with its own HPACK state."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def headers(self, pairs: list[tuple[str, str]], end_stream: bool = False) -> bytes:
        flags = 0x4 | (0x1 if end_stream else 0)
        return frame(1, flags, 1, self.encoder.encode(pairs))


class Opened:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.ends: list[tuple[grpc.StatusCode, str]] = []
        self.transport = Transport()
        self.stream = GrpcStream(PATH, self.messages.append, self._ended)
        self.stream.connection_made(self.transport)  # type: ignore[arg-type]
        self.peer = Peer()

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        self.ends.append((code, details))

    def feed(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.stream.data_received(chunk)


@pytest.fixture
async def opened() -> Opened:
    return Opened()


RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


# --- what the stream writes --------------------------------------------------------------


async def test_opening_writes_preface_settings_window_and_request_headers(opened: Opened) -> None:
    assert bytes(opened.transport.written).startswith(h2.PREFACE)
    kinds = [(k, f, s) for k, f, s, _ in opened.transport.frames()]
    assert kinds == [(4, 0, 0), (8, 0, 0), (1, 0x4, 1)]
    _, _, _, settings_payload = opened.transport.frames()[0]
    assert struct.unpack(">HLHL", settings_payload) == (0x2, 0, 0x4, 2**31 - 1)
    headers = dict(hpack.Decoder().decode(opened.transport.frames()[2][3]))
    assert headers[":path"] == PATH
    assert headers["content-type"] == "application/grpc"
    assert headers["te"] == "trailers"
    assert "grpc-accept-encoding" not in headers  # the plugin must not compress


async def test_settings_and_pings_are_acknowledged(opened: Opened) -> None:
    opened.transport.take()
    opened.feed(settings(max_frame=20_000), frame(6, 0, 0, b"12345678"), frame(6, 1, 0, b"x" * 8))
    assert opened.transport.take() == [(4, 1, 0, b""), (6, 1, 0, b"12345678")]


async def test_a_message_is_one_data_frame_with_the_grpc_prefix(opened: Opened) -> None:
    opened.transport.take()
    opened.stream.send(b"hello")
    assert opened.transport.take() == [(0, 0, 1, b"\x00\x00\x00\x00\x05hello")]


async def test_sending_respects_max_frame_size_and_flow_control(opened: Opened) -> None:
    opened.feed(settings(initial_window=100, max_frame=40))
    opened.transport.take()
    opened.stream.send(b"a" * 150)  # 155 bytes with the prefix; the stream window is 100
    first = opened.transport.take()
    assert [len(p) for _, _, _, p in first] == [40, 40, 20]
    opened.feed(frame(8, 0, 1, struct.pack(">L", 30)))  # the stream window opens by 30
    second = opened.transport.take()
    assert [len(p) for _, _, _, p in second] == [30]
    opened.feed(settings(initial_window=200))  # the stream window grows by 100
    rest = opened.transport.take()
    assert rest[0] == (4, 1, 0, b"")  # the ACK comes first
    assert [len(p) for _, _, _, p in rest[1:]] == [25]
    data = b"".join(p for _, _, _, p in first + second + rest[1:])
    assert data == b"\x00\x00\x00\x00\x96" + b"a" * 150


async def test_the_connection_window_holds_sends_too(opened: Opened) -> None:
    opened.transport.take()
    opened.stream.send(b"x" * 70_000)  # over the default 65,535 connection window
    assert sum(len(p) for _, _, _, p in opened.transport.take()) == 65_535
    opened.feed(frame(8, 0, 0, struct.pack(">L", 10_000)))
    # The stream window (also 65,535 by default) is the limit now.
    assert opened.transport.take() == []
    opened.feed(frame(8, 0, 1, struct.pack(">L", 10_000)))
    assert sum(len(p) for _, _, _, p in opened.transport.take()) == 70_005 - 65_535


# --- what the stream delivers --------------------------------------------------------------


async def test_messages_are_delivered_however_the_bytes_are_cut(opened: Opened) -> None:
    wire = (
        opened.peer.headers(RESPONSE_HEADERS)
        + frame(0, 0, 1, grpc_message(b"one"))
        + frame(0, 0, 1, grpc_message(b"two") + grpc_message(b"three")[:4])
        + frame(0, 0, 1, grpc_message(b"three")[4:] + grpc_message(b""))
    )
    for i in range(len(wire)):  # one byte at a time
        opened.feed(wire[i : i + 1])
    assert opened.messages == [b"one", b"two", b"three", b""]
    assert opened.ends == []


async def test_padding_and_continuation_are_understood(opened: Opened) -> None:
    block = opened.peer.encoder.encode(RESPONSE_HEADERS)
    padded_headers = frame(1, 0x8, 1, bytes([3]) + block[:2] + b"\0\0\0")  # PADDED, no END_HEADERS
    continuation = frame(9, 0x4, 1, block[2:])
    padded_data = frame(0, 0x8, 1, bytes([4]) + grpc_message(b"msg") + b"\0" * 4)
    opened.feed(padded_headers + continuation + padded_data)
    assert opened.messages == [b"msg"]
    assert opened.ends == []


async def test_trailers_end_the_stream_with_their_status(opened: Opened) -> None:
    opened.feed(opened.peer.headers(RESPONSE_HEADERS), frame(0, 0, 1, grpc_message(b"m")))
    trailers = [("grpc-status", "9"), ("grpc-message", "not%20now%3A%20busy")]
    opened.feed(opened.peer.headers(trailers, end_stream=True))
    assert opened.messages == [b"m"]
    assert opened.ends == [(grpc.StatusCode.FAILED_PRECONDITION, "not now: busy")]
    assert opened.transport.closed
    with pytest.raises(StreamEnded):
        opened.stream.send(b"late")


@pytest.mark.parametrize(
    ("wire", "code", "text"),
    [
        (
            lambda p: p.headers([*RESPONSE_HEADERS, ("grpc-status", "12")], end_stream=True),
            grpc.StatusCode.UNIMPLEMENTED,
            "",
        ),
        (lambda p: p.headers([(":status", "404")]), grpc.StatusCode.UNAVAILABLE, "HTTP status 404"),
        (lambda p: frame(3, 0, 1, struct.pack(">L", 0x8)), grpc.StatusCode.CANCELLED, "0x8"),
        (lambda p: frame(3, 0, 1, struct.pack(">L", 0x2)), grpc.StatusCode.INTERNAL, "0x2"),
        (
            lambda p: p.headers(RESPONSE_HEADERS) + frame(0, 0x1, 1, b""),
            grpc.StatusCode.INTERNAL,
            "without a status",
        ),
        (
            lambda p: p.headers(RESPONSE_HEADERS) + frame(0, 0, 1, b"\x01\x00\x00\x00\x01z"),
            grpc.StatusCode.INTERNAL,
            "compressed",
        ),
        (lambda p: frame(5, 0x4, 1, b"\0\0\0\2"), grpc.StatusCode.INTERNAL, "PUSH_PROMISE"),
        (lambda p: b"HTTP/1.1 400 Bad Request\r\n\r\n", grpc.StatusCode.INTERNAL, "HTTP/2?"),
        (lambda p: frame(1, 0x4, 1, b"\xff\xff\xff\xff"), grpc.StatusCode.INTERNAL, "headers"),
        (
            lambda p: frame(1, 0, 1, p.encoder.encode(RESPONSE_HEADERS)) + frame(0, 0, 1, b""),
            grpc.StatusCode.INTERNAL,
            "inside a header block",
        ),
    ],
    ids=[
        "trailers-only-unimplemented",
        "http-404",
        "reset-cancel",
        "reset-internal",
        "end-without-trailers",
        "compressed-message",
        "push-promise",
        "not-http2",
        "bad-hpack",
        "data-inside-header-block",
    ],
)
async def test_each_ending_is_reported_once(
    opened: Opened, wire: Any, code: grpc.StatusCode, text: str
) -> None:
    opened.feed(wire(opened.peer))
    opened.stream.connection_lost(None)  # what follows any ending: must not report again
    assert len(opened.ends) == 1
    assert opened.ends[0][0] == code
    assert text in opened.ends[0][1]


async def test_losing_the_connection_ends_the_stream(opened: Opened) -> None:
    opened.stream.connection_lost(ConnectionResetError("reset by peer"))
    assert opened.ends == [(grpc.StatusCode.UNAVAILABLE, "connection lost: reset by peer")]


async def test_close_ends_quietly_with_a_cancel(opened: Opened) -> None:
    opened.transport.take()
    opened.stream.close()
    opened.stream.connection_lost(None)
    assert opened.transport.take() == [(3, 0, 1, struct.pack(">L", 0x8))]
    assert opened.transport.closed
    assert opened.ends == []
    with pytest.raises(StreamEnded):
        opened.stream.send(b"x")


async def test_goaway_alone_does_not_end_the_stream(opened: Opened) -> None:
    opened.feed(opened.peer.headers(RESPONSE_HEADERS))
    opened.feed(frame(7, 0, 0, struct.pack(">LL", 2**31 - 1, 0)))
    opened.feed(frame(0, 0, 1, grpc_message(b"still here")))
    assert opened.messages == [b"still here"]
    assert opened.ends == []


async def test_window_is_refilled_after_a_gigabyte(
    opened: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h2, "REFILL_AFTER", 100)
    opened.feed(opened.peer.headers(RESPONSE_HEADERS))
    opened.transport.take()
    opened.feed(frame(0, 0, 1, grpc_message(b"z" * 95)))  # 100 bytes of DATA
    updates = opened.transport.take()
    assert updates == [(8, 0, 0, struct.pack(">L", 100)), (8, 0, 1, struct.pack(">L", 100))]
    assert opened.messages == [b"z" * 95]
