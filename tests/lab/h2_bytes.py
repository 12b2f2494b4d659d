"""HTTP/2 and gRPC bytes made by hand, to send what no client library would: cut, flipped or
inconsistent frames (tests/integration/test_wire.py, bench/soak_wire.py)."""

from __future__ import annotations

import struct

__all__ = [
    "DATA",
    "END_HEADERS",
    "END_STREAM",
    "HEADERS",
    "PREFACE",
    "SETTINGS",
    "frame",
    "headers_block",
    "request",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS = 0x0, 0x1, 0x4
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBL", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def headers_block(path: bytes | str) -> bytes:
    """A gRPC request's headers as HPACK literals without indexing (no table, no Huffman):
    what any decoder accepts. `path` as bytes may be anything, valid UTF-8 or not."""
    raw = path if isinstance(path, bytes) else path.encode()
    fields = (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", raw),
        (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
    )  # fmt: skip
    block = b""
    for name, value in fields:
        block += b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value
    return block


def request(
    path: bytes | str,
    message: bytes,
    stream: int = 1,
    compressed: int = 0,
    announced: int | None = None,
) -> bytes:
    """HEADERS and one DATA frame (END_STREAM) carrying `message` with its gRPC prefix;
    `announced`: the length the prefix claims, if not the message's."""
    size = len(message) if announced is None else announced
    body = struct.pack(">BL", compressed, size) + message
    return frame(HEADERS, END_HEADERS, stream, headers_block(path)) + frame(
        DATA, END_STREAM, stream, body
    )
