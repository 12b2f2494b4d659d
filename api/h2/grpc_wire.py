"""gRPC over HTTP/2, the parts both ends need: message framing, status, timeouts, metadata.

The wire format is gRPC's PROTOCOL-HTTP2: each message is a 5-byte prefix (compressed flag,
32-bit length) and its bytes, cut into DATA frames however the sender likes; the call ends
with trailers carrying `grpc-status` and a percent-encoded `grpc-message`; `grpc-timeout` is
at most 8 digits and a unit; binary metadata (`-bin` keys) travels base64-encoded.
"""

from __future__ import annotations

import base64
import binascii
import struct
import urllib.parse

import grpc

__all__ = [
    "MAX_MESSAGE",
    "CompressedMessage",
    "GrpcMessages",
    "MessageRefused",
    "MessageSizes",
    "MessageTooLarge",
    "decode_grpc_message",
    "encode_grpc_message",
    "encode_timeout",
    "grpc_message_prefix",
    "headers_from_metadata",
    "metadata_from_headers",
    "parse_timeout",
    "status_from_header",
]

MAX_MESSAGE = 64 << 20

_MESSAGE_PREFIX = struct.Struct(">BL")
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_RESERVED_PREFIXES = ("grpc-", ":")
_HOP_BY_HOP = frozenset({"user-agent", "content-type", "te", "host"})

Metadata = tuple[tuple[str, str | bytes], ...]


class MessageRefused(Exception):
    """A message that cannot be taken."""


class MessageTooLarge(MessageRefused):
    """A message over the size limit."""


class CompressedMessage(MessageRefused):
    """A compressed message, where no compression was offered or is known."""


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


def parse_timeout(value: str | None) -> float | None:
    """`grpc-timeout` (digits and a unit) in seconds; None if absent or malformed."""
    if not value or len(value) < 2 or value[-1] not in _TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


def encode_timeout(seconds: float) -> str:
    """`grpc-timeout` for `seconds` (at most 8 digits: the finest unit that fits)."""
    micros = max(int(seconds * 1e6), 0)
    if micros < 100_000_000:
        return f"{micros}u"
    millis = micros // 1000
    if millis < 100_000_000:
        return f"{millis}m"
    return f"{min(micros // 1_000_000, 99_999_999)}S"


def metadata_from_headers(headers: list[tuple[str, str]]) -> Metadata | None:
    """The call's metadata in a header block: gRPC's reserved and hop-by-hop keys left out,
    `-bin` values decoded; None when nothing is left."""
    kept: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key.startswith(_RESERVED_PREFIXES) or key in _HOP_BY_HOP:
            continue
        if key.endswith("-bin"):
            try:
                kept.append((key, base64.b64decode(value + "=" * (-len(value) % 4), validate=True)))
            except (binascii.Error, ValueError):
                continue  # what grpc itself drops
        else:
            kept.append((key, value))
    return tuple(kept) or None


def headers_from_metadata(metadata: Metadata | None) -> list[tuple[str, str]]:
    """Metadata as header fields (`-bin` values base64-encoded, unpadded as grpc-go does)."""
    out = []
    for key, value in metadata or ():
        if isinstance(value, bytes):
            out.append((key, base64.b64encode(value).decode().rstrip("=")))
        else:
            out.append((key, value))
    return out


class GrpcMessages:
    """Cuts one stream's DATA payloads into whole gRPC messages (uncompressed only)."""

    __slots__ = ("_buffer", "limit")

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self._buffer = bytearray()
        self.limit = limit

    def feed(self, payload: bytes) -> list[bytes]:
        """The messages completed by `payload`; raises MessageTooLarge for an oversized one
        (as soon as its prefix is read), CompressedMessage for a compressed one."""
        buffer = self._buffer
        if not buffer and len(payload) >= 5:
            # The usual case: the frame holds exactly one whole message.
            compressed, size = _MESSAGE_PREFIX.unpack_from(payload)
            if size + 5 == len(payload) and not compressed and size <= self.limit:
                return [payload[5:]]
        buffer += payload
        messages = []
        offset = 0
        while len(buffer) - offset >= 5:
            compressed, size = _MESSAGE_PREFIX.unpack_from(buffer, offset)
            if compressed:
                raise CompressedMessage("a compressed message, although none was offered")
            if size > self.limit:
                raise MessageTooLarge(f"Received message larger than max ({size} vs. {self.limit})")
            if len(buffer) - offset - 5 < size:
                break
            messages.append(bytes(buffer[offset + 5 : offset + 5 + size]))
            offset += 5 + size
        del buffer[:offset]
        return messages

    @property
    def partial(self) -> bool:
        return bool(self._buffer)


class MessageSizes:
    """Watches the message prefixes in a relayed stream without keeping its bytes: raises
    MessageTooLarge when one announces more than `limit` bytes."""

    __slots__ = ("_prefix", "_skip", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._skip = 0  # bytes of the current message still to come
        self._prefix = b""  # a prefix cut by a frame boundary

    def feed(self, payload: bytes) -> None:
        offset, size = 0, len(payload)
        while offset < size:
            if self._skip:
                step = min(self._skip, size - offset)
                self._skip -= step
                offset += step
                continue
            need = 5 - len(self._prefix)
            piece = payload[offset : offset + need]
            offset += len(piece)
            if len(piece) < need:
                self._prefix += piece
                return
            prefix = self._prefix + piece if self._prefix else piece
            self._prefix = b""
            length = int.from_bytes(prefix[1:5], "big")
            if length > self.limit:
                raise MessageTooLarge(
                    f"Received message larger than max ({length} vs. {self.limit})"
                )
            self._skip = length
