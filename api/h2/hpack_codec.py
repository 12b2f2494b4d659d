"""HPACK (RFC 7541) for crihook's connections: a stateless encoder and a caching decoder.

Header blocks are most of what an HTTP/2 relay of small gRPC calls costs in Python (the
`hpack` package spends ~10-30 µs per block here), and they repeat: the same response headers
and `grpc-status: 0` trailers on every call.

- `BlockEncoder` adds to the peer's dynamic table only the fields that repeat call after
  call (`:path`, `:authority`, `content-type`, `user-agent`, `te`, `grpc-status`, the
  `grpc-*-encoding` fields), while they fit, and never evicts: once a connection is warm a
  block is a few one-byte references, cheap for the peer to read (grpc's C core parses a
  literal field afresh every time, and at saturation the peers share crihook's cores). With
  no eviction an entry's index changes only when one is added, so a block that adds nothing
  comes from a cache that each addition empties. Every other field is an indexed static
  entry or a literal "without indexing". A field whose value is new on every call
  (`grpc-timeout`: what is left of kubelet's deadline) is encoded afresh and its block is not
  cached: cached, each would evict the blocks and fields that do repeat.
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


_INDEXED_NAMES = frozenset(
    {
        ":authority",
        ":path",
        "content-type",
        "grpc-accept-encoding",
        "grpc-encoding",
        "grpc-status",
        "te",
        "user-agent",
    }
)
"""Names whose fields go into the peer's dynamic table: their values repeat across calls."""
TABLE_LIMIT = 4096
"""The most of the peer's dynamic table the encoder uses, whatever the peer allows."""


class BlockEncoder:
    """Encodes header blocks for one connection; blocks must reach the peer in the order they
    were encoded (the dynamic table changes with them)."""

    __slots__ = ("_cache", "_capacity", "_fields", "_lowest", "_table", "_used")

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[str, str], ...], bytes] = {}
        self._fields: dict[tuple[str, str], bytes] = {}  # how each field goes, for this table
        self._table: dict[tuple[str, str], int] = {}  # field → its number, in order added
        self._used = 0  # the table's size (RFC 7541 §4.1)
        self._capacity = TABLE_LIMIT  # the peer's default SETTINGS_HEADER_TABLE_SIZE
        self._lowest: int | None = None  # the smallest size since the last block, if changed

    def table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: the table is kept within it, and the next
        block starts with the size updates the peer's decoder expects (§4.2: the smallest
        size since the last block, then the final one)."""
        capacity = min(size, TABLE_LIMIT)
        if capacity == self._capacity:
            return
        if capacity < self._used:  # emptied rather than evicted: indices stay simple
            self._table.clear()
            self._used = 0
            self._cache.clear()
            self._fields.clear()
            self._lowest = 0
        elif self._lowest is None or capacity < self._lowest:
            self._lowest = capacity
        self._capacity = capacity

    def encode(self, headers: list[tuple[str, str]]) -> bytes:
        key = tuple(headers)
        block = self._cache.get(key)
        if block is None:
            block, stable = self._build(headers)
            if stable:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[key] = block
        lowest = self._lowest
        if lowest is not None:
            self._lowest = None
            update = _integer(lowest, 5, 0x20)
            if self._capacity != lowest:
                update += _integer(self._capacity, 5, 0x20)
            return update + block
        return block

    def _build(self, headers: list[tuple[str, str]]) -> tuple[bytes, bool]:
        """The block, and whether it may be sent again as it is (it adds nothing to the
        table, and has no volatile field)."""
        fields = self._fields
        if len(fields) >= _CACHE_LIMIT:
            fields.clear()
        parts = []
        stable = True
        for field in headers:
            part = fields.get(field)
            if part is None:
                name, value = field
                prefix = _VOLATILE.get(name)
                if prefix is not None:
                    stable = False
                    parts.append(prefix + _string(value))
                    continue
                part = self._part(field)
                if part is None:  # added to the table: every entry's index moved
                    parts.append(_indexed_literal(name, value))
                    fields.clear()
                    self._cache.clear()
                    stable = False
                    continue
                fields[field] = part
            parts.append(part)
        return b"".join(parts), stable

    def _part(self, field: tuple[str, str]) -> bytes | None:
        """How `field` is sent while the table stays as it is; None once it was added to it
        (sent as a literal with indexing, this once)."""
        table = self._table
        number = table.get(field)
        if number is not None:  # the newest entry is index 62 (§2.3.3)
            return _integer(_STATIC_COUNT + len(table) - number, 7, 0x80)
        name, value = field
        if name in _INDEXED_NAMES and field not in _STATIC_EXACT:
            size = 32 + _octets(name) + _octets(value)
            if size <= self._capacity - self._used:
                table[field] = len(table)
                self._used += size
                return None
        return _field(name, value)


def _indexed_literal(name: str, value: str) -> bytes:
    """A literal field added to the table (§6.2.1)."""
    index = _STATIC_NAME.get(name)
    head = _integer(index, 6, 0x40) if index is not None else b"\x40" + _string(name)
    return head + _string(value)


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
                if headers:  # §4.2: only at the beginning of a block
                    raise HPACKError("a table size update after the first field of a block")
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
