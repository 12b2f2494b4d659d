"""Starting inputs for the fuzz targets: ordinary traffic in each target's input format, so
the fuzzer begins from what a real peer sends and mutates from there (bench/fuzz.py adds
them to the working corpus; only what adds coverage reaches tests/fuzz/corpus/)."""

from __future__ import annotations

import struct

from hpack import Encoder as ReferenceEncoder

from crihook.api.h2 import connection as h2
from crihook.api.h2.grpc_wire import grpc_message_prefix
from crihook.api.h2.hpack_codec import BlockEncoder
from tests.lab.h2_bytes import request

__all__ = ["seeds"]

_REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/runtime.v1.RuntimeService/CreateContainer"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-timeout", "119999m"),
    ("user-agent", "grpc-go/1.72.0"),
]
_RESPONSE = [(":status", "200"), ("content-type", "application/grpc")]
_TRAILERS = [("grpc-status", "0"), ("grpc-message", "")]


def _settings(*pairs: tuple[int, int]) -> bytes:
    return h2.frame(h2.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in pairs))


def _h2_seeds() -> list[bytes]:
    """Flag byte (bit 0 client, bit 1 preface given), cut byte, then the peer's bytes."""
    message = grpc_message_prefix(3) + b"\x0a\x01x"
    encoder = BlockEncoder()
    client_side = (
        _settings((h2.INITIAL_WINDOW_SIZE, 1 << 20), (h2.MAX_FRAME_SIZE, 16384))
        + h2.frame(h2.SETTINGS, h2.ACK, 0)
        + request("/runtime.v1.RuntimeService/Version", b"\x0a\x01x")
        + h2.frame(h2.HEADERS, h2.END_HEADERS, 3, encoder.encode(_REQUEST))
        + h2.frame(h2.DATA, h2.PADDED, 3, b"\x02" + message + b"\0\0")
        + h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">L", 1000))
        + h2.frame(h2.PING, 0, 0, b"12345678")
        + h2.frame(h2.RST_STREAM, 0, 3, struct.pack(">L", h2.CANCEL))
        + h2.frame(h2.GOAWAY, 0, 0, struct.pack(">LL", 3, 0))
    )
    block = encoder.encode(_REQUEST)
    continued = (
        h2.frame(h2.HEADERS, h2.PRIORITY_FLAG, 5, b"\0\0\0\0\x10" + block[:4])
        + h2.frame(h2.CONTINUATION, h2.END_HEADERS, 5, block[4:])
        + h2.frame(h2.DATA, h2.END_STREAM, 5, message)
    )
    server = BlockEncoder()
    server_side = (
        _settings((h2.MAX_CONCURRENT_STREAMS, 100), (h2.INITIAL_WINDOW_SIZE, 10))
        + h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">L", 70_000))
        + h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">L", 70_000))
        + h2.frame(h2.HEADERS, h2.END_HEADERS, 1, server.encode(_RESPONSE))
        + h2.frame(h2.DATA, 0, 1, message)
        + h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, server.encode(_TRAILERS))
        + h2.frame(h2.PING, h2.ACK, 0, b"fuzzping")
    )
    return [
        b"\x02\x00" + client_side,
        b"\x02\x05" + client_side + continued,
        b"\x00\x00" + h2.PREFACE + client_side,
        b"\x01\x00" + server_side,
        b"\x01\x03" + server_side,
    ]


def _blocks(blocks: list[bytes]) -> bytes:
    """Blocks in the HPACK targets' format: each a length byte and its bytes."""
    return b"".join(bytes((len(b),)) + b for b in blocks if len(b) < 256)


def _hpack_seeds() -> list[bytes]:
    ours = BlockEncoder()
    theirs = ReferenceEncoder()
    huffman = ReferenceEncoder()
    return [
        _blocks([ours.encode(_REQUEST), ours.encode(_REQUEST), ours.encode(_RESPONSE)]),
        _blocks([theirs.encode(_REQUEST, huffman=False), theirs.encode(_TRAILERS)]),
        _blocks([huffman.encode(_REQUEST), huffman.encode(_REQUEST), huffman.encode(_TRAILERS)]),
        _blocks([b"\x3f\xe1\x1f" + ReferenceEncoder().encode(_RESPONSE)]),  # a table size update
    ]


def _grpc_seeds() -> list[bytes]:
    two = grpc_message_prefix(3) + b"abc" + grpc_message_prefix(0) + grpc_message_prefix(2) + b"z"
    return [
        b"\x01\x00\x00" + two,
        b"\x00\x02\x01" + two,
        b"\x40\x00\x07" + grpc_message_prefix(20) + bytes(20) + b"\x01\0\0\0\x01x",
    ]


def seeds() -> dict[str, list[bytes]]:
    """Each target's starting inputs, by target name."""
    hpack_seeds = _hpack_seeds()
    return {
        "h2_connection": _h2_seeds(),
        "hpack_decoder": hpack_seeds,
        "hpack_differential": hpack_seeds,
        "grpc_reader": _grpc_seeds(),
    }
