"""HPACK (RFC 7541) for crihook's connections: a stateless encoder and a caching decoder.

Header blocks are most of what an HTTP/2 relay of small gRPC calls costs in Python (the
`hpack` package spends ~10-30 µs per block here), and they repeat: the same response headers
and `grpc-status: 0` trailers on every call.

- `BlockEncoder` never adds to the peer's dynamic table (every field is an indexed static
  entry or a literal "without indexing"), so a block depends only on its fields and
  repeated blocks come from a cache. It opens with a table size update to 0, so whatever
  table size the peer allows, ours is consistent. The blocks are a little larger; over a
  unix socket that costs less than keeping a table. A field whose value is new on every
  call (`grpc-timeout`: what is left of kubelet's deadline) is encoded afresh and its block
  is not cached: cached, each would evict the blocks and fields that do repeat.
- `BlockDecoder` is a plain decoder (the `hpack` package's Huffman table, our own loop,
  without its per-field logging and bytes/str round trips) plus a cache of the blocks that
  did not change the dynamic table, valid while the table stays as it was (a generation
  count bumped by each change).
"""

from __future__ import annotations

import collections

from hpack import HPACKError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

__all__ = ["BlockDecoder", "BlockEncoder", "HPACKError"]


_CACHE_LIMIT = 512
_STATIC_EXACT: dict[tuple[str, str], int] = {}
_STATIC_NAME: dict[str, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, 1):
    _STATIC_EXACT.setdefault((_name.decode(), _value.decode()), _index)
    _STATIC_NAME.setdefault(_name.decode(), _index)


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return _integer(len(data), 7, 0) + data  # not Huffman-coded: cheaper to make


_VOLATILE = {"grpc-timeout": b"\x00" + _string("grpc-timeout")}
"""Names whose values change on every call → their literal's name part (not in the static
table: a literal without indexing, new name)."""


def _field(name: str, value: str) -> bytes:
    index = _STATIC_EXACT.get((name, value))
    if index is not None:
        return _integer(index, 7, 0x80)
    index = _STATIC_NAME.get(name)
    if index is not None:
        return _integer(index, 4, 0x00) + _string(value)
    return b"\x00" + _string(name) + _string(value)


class BlockEncoder:
    __slots__ = ("_cache", "_fields", "_started")

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[str, str], ...], bytes] = {}
        self._fields: dict[tuple[str, str], bytes] = {}
        self._started = False

    def encode(self, headers: list[tuple[str, str]]) -> bytes:
        key = tuple(headers)
        block = self._cache.get(key)
        if block is None:
            fields = self._fields
            if len(fields) >= _CACHE_LIMIT:
                fields.clear()
            parts = []
            volatile = False
            for field in headers:
                part = fields.get(field)
                if part is None:
                    name, value = field
                    prefix = _VOLATILE.get(name)
                    if prefix is not None:
                        volatile = True
                        parts.append(prefix + _string(value))
                        continue
                    part = fields[field] = _field(name, value)
                parts.append(part)
            block = b"".join(parts)
            if not volatile:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[key] = block
        if not self._started:
            self._started = True
            return b"\x20" + block  # dynamic table size update: 0
        return block


class BlockDecoder:
    """Decodes header blocks to (name, value) str pairs. The lists it returns may be shared
    between calls: do not change them."""

    __slots__ = (
        "_cache",
        "_generation",
        "_max_list",
        "_max_table",
        "_size",
        "_table",
        "_table_max",
    )

    def __init__(self, max_header_list_size: int, max_table_size: int = 4096) -> None:
        self._max_list = max_header_list_size
        self._max_table = max_table_size  # what our SETTINGS allow (the default)
        self._table_max = max_table_size  # what the peer's encoder chose
        self._table: collections.deque[tuple[str, str]] = collections.deque()
        self._size = 0
        self._generation = 0  # bumped by every change to the dynamic table
        self._cache: dict[bytes, tuple[int, list[tuple[str, str]]]] = {}

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """Raises HPACKError for a block that cannot be decoded."""
        cached = self._cache.get(block)
        generation = self._generation
        if cached is not None and cached[0] == generation:
            return cached[1]
        try:
            headers = self._decode(block)
        except (IndexError, UnicodeDecodeError) as exc:
            raise HPACKError(f"a malformed header block ({exc})") from exc
        if self._generation == generation:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[block] = (generation, headers)
        return headers

    def _entry(self, index: int) -> tuple[str, str]:
        if 0 < index <= _STATIC_COUNT:
            return _STATIC[index - 1]
        dynamic = index - _STATIC_COUNT - 1
        if index <= 0 or dynamic >= len(self._table):
            raise HPACKError(f"header table index {index} out of range")
        return self._table[dynamic]

    def _add(self, name: str, value: str) -> None:
        self._generation += 1
        size = 32 + _octets(name) + _octets(value)
        table = self._table
        if size > self._table_max:
            table.clear()
            self._size = 0
            return
        table.appendleft((name, value))
        self._size += size
        self._shrink()

    def _shrink(self) -> None:
        table = self._table
        while self._size > self._table_max:
            name, value = table.pop()
            self._size -= 32 + _octets(name) + _octets(value)

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        offset, end, total = 0, len(block), 0
        while offset < end:
            first = block[offset]
            if first & 0x80:  # indexed field (most of a block once the peer's table is warm)
                index = first & 0x7F
                if index < 0x7F:
                    offset += 1
                else:
                    index, offset = _read_integer(block, offset, 7)
                field = _STATIC[index - 1] if 0 < index <= _STATIC_COUNT else self._entry(index)
            elif first & 0x40:  # literal, added to the table
                index, offset = _read_integer(block, offset, 6)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, offset = _read_string(block, offset)
                value, offset = _read_string(block, offset)
                field = (name, value)
                self._add(name, value)
            elif first & 0x20:  # dynamic table size update
                size, offset = _read_integer(block, offset, 5)
                if size > self._max_table:
                    raise HPACKError(f"a table size of {size} over {self._max_table}")
                self._generation += 1
                self._table_max = size
                self._shrink()
                continue
            else:  # literal, not added (0000 without indexing, 0001 never indexed)
                index, offset = _read_integer(block, offset, 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, offset = _read_string(block, offset)
                value, offset = _read_string(block, offset)
                field = (name, value)
            total += 32 + len(field[0]) + len(field[1])
            if total > self._max_list:
                raise HPACKError(f"a header list over {self._max_list} bytes")
            headers.append(field)
        return headers


_STATIC = tuple((n.decode(), v.decode()) for n, v in HeaderTable.STATIC_TABLE)
_STATIC_COUNT = len(_STATIC)


def _octets(text: str) -> int:
    """Its length in UTF-8 (what a table entry's size counts), without encoding ASCII."""
    return len(text) if text.isascii() else len(text.encode())


def _read_integer(block: bytes, offset: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    value = block[offset] & limit
    offset += 1
    if value < limit:
        return value, offset
    shift = 0
    while True:
        byte = block[offset]
        offset += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 28:
            raise HPACKError("an HPACK integer too large")


def _read_string(block: bytes, offset: int) -> tuple[str, int]:
    huffman = block[offset] & 0x80
    length, offset = _read_integer(block, offset, 7)
    end = offset + length
    if end > len(block):
        raise HPACKError("a string past the end of the header block")
    data = block[offset:end]
    if huffman:
        data = decode_huffman(data)
    return data.decode(), end
