"""gRPC's wire rules over HTTP/2 (crihook.api.h2.grpc_wire): message framing, timeouts,
metadata, status text."""

from __future__ import annotations

import struct

import grpc
import pytest

from crihook.api.h2.grpc_wire import (
    CompressedMessage,
    GrpcMessages,
    MessageSizes,
    MessageTooLarge,
    decode_grpc_message,
    encode_grpc_message,
    encode_timeout,
    headers_from_metadata,
    metadata_from_headers,
    parse_timeout,
    status_from_header,
)


def message(data: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BL", compressed, len(data)) + data


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.0, "0u"), (1.5, "1500000u"), (99.999999, "99999999u"), (100.0, "100000m"),
     (10**6, "1000000S"), (-1.0, "0u")],
    ids=["zero", "micros", "micros-max", "millis", "seconds", "negative"],
)  # fmt: skip
def test_timeouts_fit_eight_digits_and_parse_back(seconds: float, header: str) -> None:
    assert encode_timeout(seconds) == header
    assert len(header) <= 9
    assert parse_timeout(header) == pytest.approx(max(seconds, 0.0), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("value", [None, "", "S", "10", "1x", "-1S", "1.5S"])
def test_malformed_timeouts_are_none(value: str | None) -> None:
    assert parse_timeout(value) is None


def test_metadata_leaves_reserved_keys_and_decodes_binary() -> None:
    headers = [
        (":path", "/x"), ("user-agent", "grpc-go"), ("te", "trailers"), ("grpc-timeout", "1S"),
        ("x-trace", "t"), ("x-blob-bin", "AP8B"), ("x-pad-bin", "AP8="), ("x-bad-bin", "!!"),
    ]  # fmt: skip
    md = metadata_from_headers(headers)
    assert md == (("x-trace", "t"), ("x-blob-bin", b"\x00\xff\x01"), ("x-pad-bin", b"\x00\xff"))
    assert headers_from_metadata(md) == [
        ("x-trace", "t"), ("x-blob-bin", "AP8B"), ("x-pad-bin", "AP8"),
    ]  # fmt: skip
    assert metadata_from_headers([(":status", "200")]) is None


def test_status_text_round_trips_and_unknown_codes_are_unknown() -> None:
    text = 'container "a" not found: é 100%\n'
    assert decode_grpc_message(encode_grpc_message(text)) == text
    assert encode_grpc_message("a b") == "a b"
    assert status_from_header("5") is grpc.StatusCode.NOT_FOUND
    assert status_from_header("99") is grpc.StatusCode.UNKNOWN
    assert status_from_header(None) is grpc.StatusCode.UNKNOWN


def test_messages_are_cut_however_the_data_comes() -> None:
    wire = message(b"one") + message(b"") + message(b"three")
    for cut in range(len(wire) + 1):
        cutter = GrpcMessages()
        got = cutter.feed(wire[:cut]) + cutter.feed(wire[cut:])
        assert got == [b"one", b"", b"three"]
        assert not cutter.partial


def test_oversized_and_compressed_messages_are_refused_at_their_prefix() -> None:
    with pytest.raises(MessageTooLarge):
        GrpcMessages(limit=10).feed(struct.pack(">BL", 0, 11))
    with pytest.raises(CompressedMessage):
        GrpcMessages().feed(message(b"z", compressed=1))


def test_message_sizes_watch_prefixes_across_frames_without_keeping_bytes() -> None:
    sizes = MessageSizes(limit=100)
    wire = message(b"a" * 100) + message(b"b" * 7)
    for i in range(len(wire)):
        sizes.feed(wire[i : i + 1])
    big = message(b"c" * 101)
    sizes.feed(big[:3])
    with pytest.raises(MessageTooLarge):
        sizes.feed(big[3:6])
