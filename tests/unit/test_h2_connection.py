"""The sans-IO HTTP/2 connection (crihook.api.h2), frame by frame: hand-made frames in, events
and frames out. No socket, no loop."""

from __future__ import annotations

import struct

import hpack
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from crihook.api.h2 import connection as h2c
from crihook.api.h2.connection import (
    Connection,
    Data,
    Failed,
    Flushed,
    GoAway,
    Headers,
    PingAcked,
    Reset,
    Settled,
)
from crihook.api.h2.hpack_codec import BlockDecoder, BlockEncoder

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/runtime.v1.RuntimeService/Version"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([kind, flags])
        + stream_id.to_bytes(4, "big")
        + payload
    )


def parse(data: bytes) -> list[tuple[int, int, int, bytes]]:
    if data.startswith(h2c.PREFACE):
        data = data[len(h2c.PREFACE) :]
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9 : 9 + length]))
        data = data[9 + length :]
    return out


def settings(**values: int) -> bytes:
    ids = {"table": 0x1, "window": 0x4, "max_frame": 0x5, "max_streams": 0x3}
    return frame(4, 0, 0, b"".join(struct.pack(">HL", ids[k], v) for k, v in values.items()))


class Peer:
    """The other end's HPACK state."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    def headers(self, stream_id: int, pairs: list[tuple[str, str]], end: bool = False) -> bytes:
        return frame(1, 0x4 | (0x1 if end else 0), stream_id, self.encoder.encode(pairs))


def server() -> tuple[Connection, Peer]:
    conn = Connection(client=False, max_concurrent_streams=2)
    conn.receive(h2c.PREFACE + settings())
    conn.data_to_send()
    return conn, Peer()


def client(window: int = h2c.MAX_WINDOW) -> Connection:
    conn = Connection(client=True, stream_window=window)
    conn.receive(settings())
    conn.data_to_send()
    return conn


def test_a_client_starts_with_preface_settings_and_a_window() -> None:
    conn = Connection(client=True, stream_window=1 << 20)
    data = conn.data_to_send()
    assert data.startswith(h2c.PREFACE)
    frames = parse(data)
    assert [(k, f, s) for k, f, s, _ in frames] == [(4, 0, 0), (8, 0, 0)]
    assert struct.unpack(">HLHL", frames[0][3]) == (0x2, 0, 0x4, 1 << 20)
    assert struct.unpack(">L", frames[1][3]) == (h2c.MAX_WINDOW - 65_535,)
    assert conn.data_to_send() == b""


def test_a_server_says_its_stream_limit_and_waits_for_the_preface() -> None:
    conn = Connection(client=False, max_concurrent_streams=7)
    frames = parse(conn.data_to_send())
    assert struct.unpack(">HLHLHL", frames[0][3]) == (0x2, 0, 0x3, 7, 0x4, h2c.MAX_WINDOW)
    assert conn.receive(h2c.PREFACE[:10]) == []  # a preface cut short: wait for the rest
    assert conn.receive(h2c.PREFACE[10:] + settings()) == [Settled()]
    assert parse(conn.data_to_send()) == [(4, 1, 0, b"")]


def test_garbage_instead_of_a_preface_fails_with_goaway() -> None:
    conn = Connection(client=False)
    conn.data_to_send()
    events = conn.receive(b"GET / HTTP/1.1\r\n\r\n")
    assert events == [Failed("no HTTP/2 client preface")]
    assert parse(conn.data_to_send()) == [(7, 0, 0, struct.pack(">LL", 0, 1))]
    assert conn.receive(h2c.PREFACE) == []  # nothing is parsed after a failure


def test_a_request_arrives_as_headers_then_data() -> None:
    conn, peer = server()
    wire = peer.headers(1, REQUEST) + frame(0, 0x1, 1, b"\0\0\0\0\2hi")
    events = conn.receive(wire)
    assert events == [Headers(1, REQUEST, False), Data(1, b"\0\0\0\0\2hi", True, 7)]
    assert conn.last_peer_stream == 1


def test_frames_cut_anywhere_give_the_same_events() -> None:
    conn, peer = server()
    wire = peer.headers(1, REQUEST) + frame(0, 0, 1, b"abc") + frame(0, 0x1, 1, b"def")
    events = []
    for i in range(len(wire)):
        events += conn.receive(wire[i : i + 1])
    assert events == [
        Headers(1, REQUEST, False),
        Data(1, b"abc", False, 3),
        Data(1, b"def", True, 3),
    ]


def test_padding_priority_and_continuation() -> None:
    conn, peer = server()
    block = peer.encoder.encode(REQUEST)
    headers = frame(1, 0x8 | 0x20, 1, bytes([2]) + b"\0\0\0\0\x10" + block[:3] + b"\0\0")
    wire = headers + frame(9, 0x4, 1, block[3:]) + frame(0, 0x9, 1, bytes([3]) + b"xy" + b"\0" * 3)
    assert conn.receive(wire) == [Headers(1, REQUEST, False), Data(1, b"xy", True, 6)]


def test_settings_and_pings_are_acknowledged_and_ping_acks_reported() -> None:
    conn, _ = server()
    events = conn.receive(frame(6, 0, 0, b"12345678") + frame(6, 1, 0, b"abcdefgh"))
    assert events == [PingAcked(b"abcdefgh")]
    assert parse(conn.data_to_send()) == [(6, 1, 0, b"12345678")]
    assert conn.receive(settings(max_frame=20_000)) == []
    assert parse(conn.data_to_send()) == [(4, 1, 0, b"")]


def test_send_respects_max_frame_and_both_windows_and_reports_flushes() -> None:
    conn = client()
    conn.receive(settings(window=100, max_frame=16_384))
    conn.data_to_send()
    sid = conn.open_stream()
    assert sid == 1
    conn.send_headers(sid, REQUEST)
    assert conn.send_data(sid, b"a" * 150, end_stream=True) == 100
    frames = parse(conn.data_to_send())
    assert [(k, f, len(p)) for k, f, _, p in frames] == [(1, 4, len(frames[0][3])), (0, 0, 100)]
    assert conn.held(sid) == 50
    events = conn.receive(frame(8, 0, 1, struct.pack(">L", 30)))
    assert events == [Flushed(1, 30)]
    assert [(k, f, len(p)) for k, f, _, p in parse(conn.data_to_send())] == [(0, 0, 30)]
    events = conn.receive(settings(window=200))  # +100 on every open stream
    assert events == [Flushed(1, 20)]
    assert [(k, f, len(p)) for k, f, _, p in parse(conn.data_to_send())] == [(4, 1, 0), (0, 1, 20)]


def test_the_connection_window_holds_every_stream() -> None:
    conn = client()
    a, b = conn.open_stream(), conn.open_stream()
    assert conn.send_data(a, b"x" * 60_000) == 60_000
    assert conn.send_data(b, b"y" * 10_000) == 5_535
    conn.data_to_send()
    assert conn.receive(frame(8, 0, 0, struct.pack(">L", 1000))) == [Flushed(b, 1000)]


def test_a_connection_window_update_serves_only_the_streams_still_holding_data() -> None:
    conn = client()
    idle = [conn.open_stream() for _ in range(10)]
    a, b, c = conn.open_stream(), conn.open_stream(), conn.open_stream()
    assert conn.send_data(a, b"x" * 60_000) == 60_000
    assert conn.send_data(b, b"y" * 3_000) == 3_000
    assert conn.send_data(c, b"z" * 4_000) == 2_535  # the connection window is spent
    assert conn.send_data(b, b"y" * 2_000) == 0
    conn.send_reset(c)  # what it held is dropped with it
    conn.data_to_send()
    assert conn.receive(frame(8, 0, 0, struct.pack(">L", 5_000))) == [Flushed(b, 2_000)]
    assert conn.receive(frame(8, 0, 0, struct.pack(">L", 5_000))) == []
    assert all(conn.held(s) == 0 for s in (*idle, a, b, c))


def test_trailers_wait_behind_held_data() -> None:
    conn = client()
    conn.receive(settings(window=10))
    conn.data_to_send()
    sid = conn.open_stream()
    conn.send_data(sid, b"z" * 15)
    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    assert [(k, f) for k, f, _, _ in parse(conn.data_to_send())] == [(0, 0)]
    conn.receive(frame(8, 0, sid, struct.pack(">L", 10)))
    assert [(k, f) for k, f, _, _ in parse(conn.data_to_send())] == [(0, 0), (1, 5)]


def test_a_slow_reader_stops_the_peer_after_one_window() -> None:
    conn = client(window=100)
    sid = conn.open_stream()
    conn.send_headers(sid, REQUEST, end_stream=True)
    peer = Peer()
    conn.receive(peer.headers(sid, [(":status", "200")]) + frame(0, 0, sid, b"q" * 60))
    conn.data_to_send()
    conn.consumed(sid, 40)  # under half the window: no update yet
    assert conn.data_to_send() == b""
    conn.consumed(sid, 20)
    assert parse(conn.data_to_send()) == [(8, 0, sid, struct.pack(">L", 60))]
    # The peer may now send 100 more; 101 breaks flow control.
    events = conn.receive(frame(0, 0, sid, b"q" * 101))
    assert isinstance(events[-1], Failed) and "window" in events[-1].details
    assert parse(conn.data_to_send())[-1][0] == 7  # GOAWAY


def test_resets_both_ways_forget_the_stream() -> None:
    conn, peer = server()
    conn.receive(peer.headers(1, REQUEST) + peer.headers(3, REQUEST))
    conn.send_reset(1, h2c.CANCEL)
    assert parse(conn.data_to_send()) == [(3, 0, 1, struct.pack(">L", 8))]
    assert not conn.is_open(1)
    assert conn.receive(frame(0, 0, 1, b"late")) == []  # crossing data is dropped
    assert conn.receive(frame(3, 0, 3, struct.pack(">L", 8))) == [Reset(3, 8)]
    assert not conn.is_open(3)


def test_streams_over_the_limit_are_refused() -> None:
    conn, peer = server()  # max 2
    events = conn.receive(
        peer.headers(1, REQUEST) + peer.headers(3, REQUEST) + peer.headers(5, REQUEST)
    )
    assert [e.stream_id for e in events] == [1, 3]  # type: ignore[attr-defined]
    assert parse(conn.data_to_send()) == [(3, 0, 5, struct.pack(">L", 7))]
    conn.send_headers(1, [(":status", "200"), ("grpc-status", "0")], end_stream=True)
    conn.receive(frame(0, 1, 1, b""))  # stream 1 is closed both ways now
    assert conn.receive(peer.headers(7, REQUEST)) == [Headers(7, REQUEST, False)]


def test_goaway_both_ways() -> None:
    conn, peer = server()
    conn.receive(peer.headers(1, REQUEST))
    conn.send_goaway()
    assert parse(conn.data_to_send()) == [(7, 0, 0, struct.pack(">LL", 1, 0))]
    assert conn.receive(peer.headers(3, REQUEST)) == []  # after our GOAWAY: refused
    assert parse(conn.data_to_send()) == [(3, 0, 3, struct.pack(">L", 7))]
    up = client()
    assert [up.open_stream(), up.open_stream()] == [1, 3]
    assert up.can_open_stream
    assert up.receive(frame(7, 0, 0, struct.pack(">LL", 1, 0) + b"bye")) == [GoAway(1, 0, b"bye")]
    assert not up.can_open_stream
    # Stream 3 was never processed: closed (as if never opened); stream 1 goes on.
    assert (up.is_open(1), up.is_open(3), up.open_streams) == (True, False, 1)
    assert up.receive(frame(0, 1, 3, b"late")) == []  # nothing for a closed stream


def test_the_peer_stream_limit_is_kept_by_the_opener() -> None:
    up = client()
    up.receive(settings(max_streams=1))
    sid = up.open_stream()
    assert not up.can_open_stream
    up.send_headers(sid, REQUEST, end_stream=True)
    up.receive(Peer().headers(sid, [(":status", "200"), ("grpc-status", "0")], end=True))
    assert up.can_open_stream


@pytest.mark.parametrize(
    ("wire", "text"),
    [
        (frame(5, 4, 1, b"\0\0\0\2"), "PUSH_PROMISE"),
        (b"\x00\x50\x00" + b"\0" * 6, "HTTP/2?"),
        (frame(1, 0x4, 1, b"\xff\xff\xff\xff"), "headers"),
        (frame(1, 0, 1, b"\x82") + frame(0, 0, 1, b""), "inside a header block"),
        (frame(9, 4, 1, b"\x82"), "CONTINUATION without"),
        (frame(0, 0, 0, b"x"), "stream 0"),
        (frame(0, 0, 9, b"x"), "never opened"),
        (frame(4, 0, 0, b"\0\0\0"), "wrong length"),
        (frame(8, 0, 0, b"\0\0\0\0"), "WINDOW_UPDATE of 0"),
        (frame(6, 0, 0, b"short"), "PING"),
        (frame(0, 0x8, 1, b"\x09abc"), "padding"),
        (frame(1, 0x24, 1, b"\0\0\0"), "too short for its priority"),
        (frame(8, 0, 1, struct.pack(">L", 10)) + settings(window=h2c.MAX_WINDOW),
         "window over 2^31-1"),
    ],
    ids=[
        "push-promise", "oversized-frame", "bad-hpack", "data-in-header-block",
        "stray-continuation", "data-on-stream-0", "data-on-unopened", "bad-settings",
        "zero-window-update", "bad-ping", "bad-padding", "short-priority",
        "settings-overflow-a-stream-window",
    ],
)  # fmt: skip
def test_protocol_errors_fail_the_connection(wire: bytes, text: str) -> None:
    conn = client()
    conn.open_stream()
    events = conn.receive(wire)
    assert isinstance(events[-1], Failed)
    assert text in events[-1].details
    assert conn.failed
    assert parse(conn.data_to_send())[-1][0] == 7


def test_large_data_is_cut_to_the_peers_frame_size_without_copies_growing() -> None:
    conn = client()
    conn.receive(settings(window=h2c.MAX_WINDOW) + frame(8, 0, 0, struct.pack(">L", 1 << 26)))
    conn.data_to_send()
    sid = conn.open_stream()
    message = bytes(range(256)) * (16 << 12)  # 16 MiB
    assert conn.send_data(sid, message, end_stream=True) == len(message)
    frames = parse(conn.data_to_send())
    assert {len(p) for _, _, _, p in frames} == {16_384}
    assert frames[-1][1] == 1 and all(f == 0 for _, f, _, _ in frames[:-1])
    assert b"".join(p for _, _, _, p in frames) == message


def test_large_header_blocks_go_out_with_continuation() -> None:
    conn = client()
    sid = conn.open_stream()
    big = [("x-big", "v" * 40_000)]
    conn.send_headers(sid, REQUEST + big)
    frames = parse(conn.data_to_send())
    assert [(k, f) for k, f, _, _ in frames] == [(1, 0), (9, 0), (9, 4)]
    assert hpack.Decoder().decode(b"".join(p for _, _, _, p in frames), raw=False) == REQUEST + big


# --- HPACK ------------------------------------------------------------------------------


@pytest.mark.parametrize("huffman", [True, False], ids=["huffman", "plain"])
def test_the_decoder_reads_what_hpack_writes_and_caches_only_stable_blocks(huffman: bool) -> None:
    encoder = hpack.Encoder()
    decoder = BlockDecoder(1 << 20)
    for i in range(300):
        pairs = [*REQUEST, ("grpc-timeout", f"{i % 7}S"), ("x-meta", "é" * (i % 3)), ("k", "")]
        block = encoder.encode(pairs, huffman=huffman)
        assert decoder.decode(block) == pairs
    stable = encoder.encode([(":status", "200")], huffman=huffman)
    assert decoder.decode(stable) is decoder.decode(stable)  # cached
    encoder.header_table_size = 100  # a size update: the table changes
    assert decoder.decode(encoder.encode([("a", "b")])) == [("a", "b")]


def test_the_encoder_indexes_the_fields_that_repeat_and_hpack_reads_every_block() -> None:
    encoder = BlockEncoder()
    decoder = hpack.Decoder()
    pairs = [
        *REQUEST,
        ("user-agent", "grpc-go/1.59.0"),
        ("x-long", "z" * 300),
        ("grpc-status", "0"),
    ]
    first, second = encoder.encode(pairs), encoder.encode(pairs)
    assert decoder.decode(first, raw=False) == pairs
    assert decoder.decode(second, raw=False) == pairs
    table = {(n.decode(), v.decode()) for n, v in decoder.header_table.dynamic_entries}
    assert table == {  # :method and :scheme are static entries; x-long's value is not kept
        (":path", REQUEST[2][1]),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "grpc-go/1.59.0"),
        ("grpc-status", "0"),
    }
    literal = len(b"\x00\x06x-long\x7f\xad\x01") + 300  # new name, 300 in a 7-bit prefix
    assert len(second) == len(pairs) - 1 + literal  # one byte per field but x-long's
    assert encoder.encode(pairs) is second  # a block that adds nothing is cached


def test_the_encoder_fills_the_table_without_evicting_then_sends_literals() -> None:
    encoder = BlockEncoder()
    decoder = hpack.Decoder()
    paths = [[*REQUEST[:2], (":path", f"/svc/Method{i:04d}")] for i in range(200)]
    for pairs in paths * 2:
        assert decoder.decode(encoder.encode(pairs), raw=False) == pairs
    entries = decoder.header_table.dynamic_entries
    assert len(entries) == 4096 // (32 + len(":path") + len("/svc/Method0000"))
    assert entries[-1] == (b":path", b"/svc/Method0000")  # the oldest is still there
    last = encoder.encode(paths[-1])  # past the table: a literal, the same every time
    assert b"/svc/Method0199" in last and encoder.encode(paths[-1]) is last


@pytest.mark.parametrize("size", [0, 100, 8192])
def test_the_encoder_follows_the_peers_table_size(size: int) -> None:
    encoder = BlockEncoder()
    decoder = hpack.Decoder()
    pairs = [*REQUEST, ("user-agent", "u" * 40)]
    assert decoder.decode(encoder.encode(pairs), raw=False) == pairs
    decoder.max_allowed_table_size = size  # what the peer's SETTINGS_HEADER_TABLE_SIZE says
    encoder.table_size(size)
    for _ in range(3):  # hpack checks at each block's end that the table fits the limit
        assert decoder.decode(encoder.encode(pairs), raw=False) == pairs
    entries = decoder.header_table.dynamic_entries
    assert sum(32 + len(n) + len(v) for n, v in entries) <= min(size, 4096)
    if size < 4096:
        assert encoder.encode(pairs)[:1] != b"\x20"  # the update went out once, first


@examples(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(
                st.tuples(
                    st.sampled_from([":path", ":authority", "user-agent", "grpc-status", "x-m"]),
                    st.text(alphabet="abé/", max_size=40),
                ),
                max_size=6,
            ),
            st.integers(min_value=0, max_value=5000),  # a SETTINGS_HEADER_TABLE_SIZE
        ),
        max_size=40,
    )
)
def test_every_block_decodes_to_its_fields_whatever_the_table_went_through(
    steps: list[list[tuple[str, str]] | int],
) -> None:
    encoder = BlockEncoder()
    reference = hpack.Decoder()
    ours = BlockDecoder(1 << 20)
    for step in steps:
        if isinstance(step, int):
            reference.max_allowed_table_size = step
            encoder.table_size(step)
            continue
        block = encoder.encode(step)
        assert reference.decode(block, raw=False) == step
        assert ours.decode(block) == step


def test_a_new_timeout_on_every_call_neither_fills_nor_evicts_the_encoders_caches() -> None:
    encoder = BlockEncoder()
    decoder = hpack.Decoder()
    decoder.decode(encoder.encode(REQUEST), raw=False)  # the table's entries go out first
    cached = encoder.encode(REQUEST)
    for micros in range(100_000, 100_000 + 3 * 512):
        pairs = [*REQUEST[:2], ("grpc-timeout", f"{micros}u"), *REQUEST[2:]]
        assert decoder.decode(encoder.encode(pairs), raw=False) == pairs
    assert len(encoder._cache) == 1 and len(encoder._fields) == len(REQUEST)
    assert len(decoder.header_table.dynamic_entries) == 4  # no timeout was added
    assert encoder.encode(REQUEST) is cached


def test_the_peers_table_size_setting_reaches_the_next_header_block() -> None:
    conn = client()
    decoder = hpack.Decoder()
    blocks = []
    for table in (None, 0, None):
        if table is not None:
            conn.receive(settings(table=table))
            decoder.max_allowed_table_size = table
        stream = conn.open_stream()
        conn.send_headers(stream, REQUEST, True)
        (_, _, _, block), *_ = [f for f in parse(conn.data_to_send()) if f[0] == 1]
        assert decoder.decode(block, raw=False) == REQUEST
        blocks.append(block)
    assert blocks[0][:1] != b"\x20"  # the peer's default table: no update at first
    assert blocks[1][:1] == b"\x20"  # a table size update first: the table emptied
    assert len(decoder.header_table.dynamic_entries) == 0  # and nothing added since
    assert blocks[2] == blocks[1][1:]  # then no table: the same block, cached


def test_the_decoder_refuses_bad_indexes_and_oversized_lists() -> None:
    with pytest.raises(hpack.HPACKError):
        BlockDecoder(1 << 20).decode(b"\xff\x70")  # an index far past both tables
    with pytest.raises(hpack.HPACKError):
        BlockDecoder(100).decode(hpack.Encoder().encode([("a", "b" * 200)]))


def test_the_decoder_refuses_a_table_size_update_after_a_field() -> None:
    """RFC 7541 §4.2: a size update comes first in its block (found by the differential
    fuzz target, tests/fuzz: crihook decoded the block, the `hpack` package refused it)."""
    indexed_method = b"\x83"  # :method POST
    update = b"\x25"  # a dynamic table size update to 5
    with pytest.raises(hpack.HPACKError):
        BlockDecoder(1 << 20).decode(indexed_method + update)
    assert BlockDecoder(1 << 20).decode(update + update + indexed_method) == [(":method", "POST")]


def test_a_window_update_past_2_31_resets_only_its_stream() -> None:
    """RFC 9113 §6.9.1: a stream's window over 2^31-1 ends that stream (RST_STREAM
    FLOW_CONTROL_ERROR), the connection goes on (found by the h2_connection fuzz target:
    the window grew past the maximum)."""
    conn = client()
    first, second = conn.open_stream(), conn.open_stream()
    conn.data_to_send()
    events = conn.receive(frame(8, 0, first, struct.pack(">L", h2c.MAX_WINDOW)))
    assert events == [Reset(first, h2c.FLOW_CONTROL_ERROR)]
    assert parse(conn.data_to_send()) == [(3, 0, first, struct.pack(">L", h2c.FLOW_CONTROL_ERROR))]
    assert not conn.is_open(first) and conn.is_open(second) and not conn.failed
    assert conn.open_streams == 1
