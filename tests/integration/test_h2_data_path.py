"""The `h2` data path (crihook speaking HTTP/2 itself) against grpc core clients, a recording
fake runtime, and raw HTTP/2 peers: what the shared fault tests (test_proxy_faults.py, run on
both data paths) do not reach.

The runtime's headers, trailers and status as they are (trailers-only too); RST_STREAM both
ways; 16 MiB messages both ways; flow control end to end; PING and SETTINGS; the stream
limit; GOAWAY on SIGTERM; garbage and half frames closing only their own connection; many
connections at once.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.api.h2.connection import (
    Connection,
    Data,
    Event,
    Flushed,
    GoAway,
    Headers,
    PingAcked,
    Reset,
    Settled,
)
from crihook.proxy.wire.h2.runtime_client import RELAY_WINDOW
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fake_runtime import FakeRuntime, Reply

RUNTIME = "/runtime.v1.RuntimeService/"
MiB = 1 << 20


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    yield runtime
    runtime.stop()


@pytest.fixture
def proxy(fake: FakeRuntime) -> Iterator[CrihookProcess]:
    with CrihookProcess(fake.endpoint, data_path="h2") as proc:
        yield proc


def _call(endpoint: str, method: str, request: bytes = b"", timeout: float = 10) -> object:
    """(answer, initial metadata, trailing metadata) or the RpcError."""
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(endpoint, options=options) as channel:
        try:
            answer, call = channel.unary_unary(RUNTIME + method).with_call(request, timeout=timeout)
        except grpc.RpcError as err:
            return err
        return answer, call.initial_metadata(), call.trailing_metadata()


def _seen(result: object) -> tuple[object, ...]:
    """What a client can tell of a call's end: the answer or the status, and the metadata."""
    if isinstance(result, grpc.RpcError):
        call: grpc.Call = result  # type: ignore[assignment]
        return (
            call.code(),
            call.details(),
            tuple(call.initial_metadata() or ()),
            tuple(call.trailing_metadata() or ()),
        )
    assert isinstance(result, tuple)
    answer, initial, trailing = result
    return answer, tuple(initial or ()), tuple(trailing or ())


class RawPeer:
    """A raw HTTP/2 client on crihook's socket (our own sans-IO connection, a blocking socket)."""

    def __init__(self, path: str, stream_window: int = 65_535) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(10)
        self.h2 = Connection(client=True, stream_window=stream_window)
        self.events: list[Event] = []
        self.closed = False
        self.send()

    def send(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def read_until(self, done: object, timeout: float = PATIENCE) -> None:
        deadline = time.monotonic() + timeout
        while not done():  # type: ignore[operator]
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                raise AssertionError(f"timed out; events so far: {self.events}") from None
            if not data:
                self.closed = True
                return
            self.events += self.h2.receive(data)
            self.send()

    def request(self, method: str, message: bytes = b"", end: bool = True) -> int:
        sid = self.h2.open_stream()
        self.h2.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", RUNTIME + method),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        self.h2.send_data(sid, struct.pack(">BL", 0, len(message)) + message, end_stream=end)
        self.send()
        return sid

    def ended(self, sid: int) -> bool:
        return any(
            (isinstance(e, Headers) and e.end_stream and e.stream_id == sid)
            or (isinstance(e, Reset) and e.stream_id == sid)
            for e in self.events
        )

    def close(self) -> None:
        self.sock.close()


# --- what the runtime says, as it said it ---------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        Reply(response=b"\x0a\x01x", initial_metadata=(("x-init", "1"),)),
        Reply(
            response=b"ok",
            initial_metadata=(("x-init", "2"), ("x-blob-bin", b"\x00\xff\x01")),
            trailing_metadata=(("x-trail", "t"), ("x-tb-bin", b"\xfe")),
        ),
        Reply(code=grpc.StatusCode.NOT_FOUND, details='container "a" not found: é 100%'),
        Reply(
            code=grpc.StatusCode.FAILED_PRECONDITION,
            details="busy",
            initial_metadata=(("x-init", "3"),),
            trailing_metadata=(("x-why", "because"),),
        ),
    ],
    ids=["answer-with-headers", "binary-metadata", "trailers-only", "error-after-headers"],
)
def test_the_runtimes_headers_trailers_and_status_arrive_unchanged(
    fake: FakeRuntime, proxy: CrihookProcess, reply: Reply
) -> None:
    fake.script["ContainerStatus"] = reply
    direct = _seen(_call(fake.endpoint, "ContainerStatus"))
    proxied = _seen(_call(proxy.endpoint, "ContainerStatus"))
    assert proxied == direct


def test_messages_of_16_mib_both_ways(fake: FakeRuntime, proxy: CrihookProcess) -> None:
    big = bytes(range(256)) * (16 * MiB // 256)
    fake.script["FutureBulk"] = lambda request: Reply(response=request[::-1])
    result = _call(proxy.endpoint, "FutureBulk", big, timeout=60)
    assert isinstance(result, tuple), result
    assert result[0] == big[::-1]
    assert fake.calls("FutureBulk")[-1].request == big


def test_a_request_over_the_limit_is_refused_unforwarded(
    fake: FakeRuntime, proxy: CrihookProcess
) -> None:
    result = _call(proxy.endpoint, "ListContainers", b"x" * (25 * MiB), timeout=30)
    assert isinstance(result, grpc.RpcError)
    assert result.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert fake.calls("ListContainers") == [] or all(
        len(c.request) < MiB for c in fake.calls("ListContainers")
    )


# --- cancellation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("ExecSync", b""),
        ("StartContainer", api_pb2.StartContainerRequest(container_id="c1").SerializeToString()),
    ],
    ids=["relayed", "intercepted"],
)
def test_kubelet_cancelling_reaches_the_runtime(
    fake: FakeRuntime, proxy: CrihookProcess, method: str, request_: bytes
) -> None:
    fake.script[method] = Reply(delay=5)
    with grpc.insecure_channel(proxy.endpoint) as channel:
        future = channel.unary_unary(RUNTIME + method).future(request_, timeout=30)
        wait_for(lambda: fake.calls(method), PATIENCE, "the call to reach the runtime")
        future.cancel()
    wait_for(lambda: method in fake.cancelled, PATIENCE, "the runtime to see the cancel")
    assert _seen(_call(proxy.endpoint, "Version"))[0] == b""  # crihook goes on


def test_a_runtime_reset_reaches_kubelet() -> None:
    runtime = RawRuntime(short_tmpdir("rr-") / "rt.sock", reset_method="ExecSync")
    try:
        with CrihookProcess(runtime.endpoint, data_path="h2") as proc:
            result = _call(proc.endpoint, "ExecSync")
            assert isinstance(result, grpc.RpcError)
            assert result.code() == grpc.StatusCode.CANCELLED  # type: ignore[attr-defined]
            assert _seen(_call(proc.endpoint, "Version"))[0] == b""  # the connection goes on
    finally:
        runtime.stop()


class RawRuntime:
    """A runtime made of our own HTTP/2 layer, on a thread: answers every call with an empty
    message, resets `reset_method`'s streams, streams `flood_method` as fast as the windows
    let it (counting what it could send), and never reads `stall_method`'s requests (its
    streams' windows are 65,535 bytes and never given back; `stalled` counts what came).

    Going away (set `goaway_after` once crihook is up): the connection of the next request
    holds it and the next ones until `goaway_after` are in, unanswered (for
    `hold` seconds more), then sends GOAWAY naming the first of them its last stream (the
    others were not processed), and closes; that first one it answers (`first="answer"`),
    drops (`"drop"`), or also leaves unprocessed (`"refuse"`: the GOAWAY names stream 0).
    Refusing: the next `refuse` streams (on any connection) get RST_STREAM REFUSED_STREAM.
    `answered` lists (connection number, path) of every call answered, `refused` the paths
    refused either way.
    """

    def __init__(
        self,
        path: object,
        reset_method: str = "",
        flood_method: str = "",
        stall_method: str = "",
    ) -> None:
        self.path = str(path)
        self.reset_method = reset_method
        self.flood_method = flood_method
        self.stall_method = stall_method
        self.goaway_after = 0
        self.first = "answer"
        self.hold = 0.0
        self.refuse = 0
        self.flooded = 0
        self.stalled = 0
        self.connections = 0
        self.answered: list[tuple[int, str]] = []
        self.refused: list[str] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        self.listener.settimeout(0.2)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def endpoint(self) -> str:
        return f"unix://{self.path}"

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(PATIENCE)
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            number = self.connections
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _answer(self, h2: Connection, sid: int, number: int, path: str) -> None:
        h2.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        h2.send_data(sid, b"\0\0\0\0\0")
        h2.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        self.answered.append((number, path))

    def _serve(self, sock: socket.socket, number: int) -> None:
        h2 = Connection(client=False, stream_window=65_535)
        sock.settimeout(0.2)
        flooding: int | None = None
        stalled: set[int] = set()
        held: list[tuple[int, str]] = []
        going_away = 0
        chunk = struct.pack(">BL", 0, 16_379) + b"f" * 16_379
        with sock:
            while not self._stop.is_set():
                if flooding is not None:
                    while h2.held(flooding) == 0 and h2.is_open(flooding):
                        self.flooded += h2.send_data(flooding, chunk)
                try:
                    sock.sendall(h2.data_to_send())
                    data = sock.recv(1 << 20)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                for event in h2.receive(data):
                    if isinstance(event, Headers) and not h2.is_open(event.stream_id):
                        continue
                    if (
                        isinstance(event, Headers)
                        and event.stream_id
                        and ":path" in dict(event.headers)
                    ):
                        path = dict(event.headers)[":path"]
                        sid = event.stream_id
                        if not going_away and self.goaway_after:  # this connection goes away
                            going_away, self.goaway_after = self.goaway_after, 0
                        if going_away:
                            held.append((sid, path))
                            if len(held) < going_away:
                                continue
                            time.sleep(self.hold)
                            first, first_path = held[0]
                            kept = 0 if self.first == "refuse" else 1
                            h2.send_goaway(last_stream_id=first if kept else 0)
                            self.refused += [p for _, p in held[kept:]]
                            if self.first == "answer":
                                self._answer(h2, first, number, first_path)
                            with contextlib.suppress(OSError):
                                sock.sendall(h2.data_to_send())
                            return
                        if self.refuse:
                            self.refuse -= 1
                            h2.send_reset(sid, 0x7)
                            self.refused.append(path)
                        elif path.endswith("/" + self.reset_method):
                            h2.send_reset(sid, 0x8)
                        elif path.endswith("/" + self.stall_method):
                            stalled.add(sid)
                        elif path.endswith("/" + self.flood_method):
                            h2.send_headers(
                                sid, [(":status", "200"), ("content-type", "application/grpc")]
                            )
                            flooding = sid
                        else:
                            self._answer(h2, sid, number, path)
                    elif isinstance(event, Data) and event.stream_id in stalled:
                        self.stalled += len(event.data)
                    elif isinstance(event, Data):
                        h2.consumed(event.stream_id, event.flow_length)


# --- streams the runtime did not process are sent again, once --------------------------------

_START = api_pb2.StartContainerRequest(container_id="c1").SerializeToString()
_STOP = api_pb2.StopContainerRequest(container_id="c2").SerializeToString()
_MIXED = [  # two relayed, two intercepted
    ("ContainerStatus", b""),
    ("PodSandboxStatus", b""),
    ("StartContainer", _START),
    ("StopContainer", _STOP),
]


def _at_once(endpoint: str, calls: list[tuple[str, bytes]]) -> dict[str, object]:
    """Each call on its own kubelet connection, all in flight together: method → result."""
    results: dict[str, object] = {}

    def one(method: str, request: bytes) -> None:
        results[method] = _call(endpoint, method, request, timeout=30)

    threads = [threading.Thread(target=one, args=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _answered(runtime: RawRuntime) -> list[tuple[int, str]]:
    """What the runtime answered of the tests' calls (not crihook's own start-up calls)."""
    ours = {RUNTIME + method for method, _ in _MIXED}
    return [(n, path) for n, path in runtime.answered if path in ours]


def _codes(results: dict[str, object]) -> list[str]:
    return sorted(
        r.code().name if isinstance(r, grpc.RpcError) else "OK"  # type: ignore[attr-defined]
        for r in results.values()
    )


@pytest.fixture
def raw_runtime() -> Iterator[RawRuntime]:
    runtime = RawRuntime(short_tmpdir("rr-") / "rt.sock")
    yield runtime
    runtime.stop()


def test_streams_above_the_runtimes_goaway_are_sent_again(raw_runtime: RawRuntime) -> None:
    """GOAWAY names the first of four calls in flight its last stream: that one is answered
    on the old connection, the three the runtime never processed (relayed and intercepted)
    are sent once more on a new connection and succeed."""
    with CrihookProcess(raw_runtime.endpoint, data_path="h2") as proc:
        raw_runtime.goaway_after = 4
        results = _at_once(proc.endpoint, _MIXED)
    assert _codes(results) == ["OK"] * 4, results
    paths = sorted(RUNTIME + method for method, _ in _MIXED)
    assert sorted(path for _, path in _answered(raw_runtime)) == paths
    assert len(raw_runtime.refused) == 3
    connections = sorted(n for n, _ in _answered(raw_runtime))
    assert connections == [connections[0]] + [connections[0] + 1] * 3


def test_a_stream_the_runtime_took_is_not_sent_again(raw_runtime: RawRuntime) -> None:
    """The call at the GOAWAY's last stream was taken by the runtime, which then closed
    without answering: it fails UNAVAILABLE (it may have been processed); the others,
    never processed, are sent again and succeed."""
    with CrihookProcess(raw_runtime.endpoint, data_path="h2") as proc:
        raw_runtime.goaway_after, raw_runtime.first = 4, "drop"
        results = _at_once(proc.endpoint, _MIXED)
    assert _codes(results) == ["OK", "OK", "OK", "UNAVAILABLE"], results
    assert len(_answered(raw_runtime)) == 3 and len(raw_runtime.refused) == 3
    assert sorted(raw_runtime.refused) == sorted(path for _, path in _answered(raw_runtime))


@pytest.mark.parametrize(("method", "request_"), _MIXED[1:3], ids=["relayed", "intercepted"])
def test_a_refused_stream_is_sent_again_once(
    raw_runtime: RawRuntime, method: str, request_: bytes
) -> None:
    with CrihookProcess(raw_runtime.endpoint, data_path="h2") as proc:
        raw_runtime.refuse = 1
        assert isinstance(_call(proc.endpoint, method, request_), tuple)
        assert raw_runtime.refused == [RUNTIME + method]
        assert [path for _, path in _answered(raw_runtime)] == [RUNTIME + method]


def test_an_intercepted_call_refused_twice_fails_unavailable(raw_runtime: RawRuntime) -> None:
    with CrihookProcess(raw_runtime.endpoint, data_path="h2") as proc:
        raw_runtime.refuse = 3
        result = _call(proc.endpoint, "StartContainer", _START)
        assert isinstance(result, grpc.RpcError)
        assert result.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert raw_runtime.refused == [RUNTIME + "StartContainer"] * 2  # once sent again only
        assert _answered(raw_runtime) == []


def test_a_relayed_stream_refused_twice_is_refused_to_kubelet(raw_runtime: RawRuntime) -> None:
    """As the runtime said it: kubelet's grpc may send it again itself."""
    with CrihookProcess(raw_runtime.endpoint, data_path="h2") as proc:
        raw_runtime.refuse = 3
        peer = RawPeer(str(proc.socket_path))
        try:
            sid = peer.request("ContainerStatus")
            peer.read_until(lambda: peer.ended(sid))
            assert Reset(sid, 0x7) in peer.events
        finally:
            peer.close()
        assert raw_runtime.refused == [RUNTIME + "ContainerStatus"] * 2
        assert _answered(raw_runtime) == []


def test_a_refused_call_is_not_sent_again_past_its_deadline(raw_runtime: RawRuntime) -> None:
    """kubelet's deadline (0.5 s) passed while the runtime held the call (1.5 s) before its
    GOAWAY left it unprocessed: DEADLINE_EXCEEDED, and the call is not sent again."""
    with CrihookProcess(raw_runtime.endpoint, data_path="h2") as proc:
        raw_runtime.goaway_after, raw_runtime.first, raw_runtime.hold = 1, "refuse", 1.5
        peer = RawPeer(str(proc.socket_path))
        try:
            sid = peer.h2.open_stream()
            peer.h2.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", RUNTIME + "ContainerStatus"),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("grpc-timeout", "500m"),
                ],
            )
            peer.h2.send_data(sid, b"\0\0\0\0\0", end_stream=True)
            peer.send()
            peer.read_until(lambda: peer.ended(sid))
            last = [e for e in peer.events if isinstance(e, Headers) and e.stream_id == sid][-1]
            assert ("grpc-status", "4") in last.headers
        finally:
            peer.close()
        assert raw_runtime.refused == [RUNTIME + "ContainerStatus"]
        assert _answered(raw_runtime) == []


def _stopped_flooding(runtime: RawRuntime) -> bool:
    """Nothing more sent for half a second (on a loaded machine, filling the windows and the
    socket buffers takes a while; once they are full it stays so)."""
    before = runtime.flooded
    time.sleep(0.5)
    return before > 0 and runtime.flooded == before


def test_a_slow_reader_holds_the_runtime_back() -> None:
    """Flow control end to end: kubelet reads nothing of a server stream; the runtime can send
    no more than kubelet's window plus the one window crihook holds (plus what sits in the
    socket buffers)."""
    runtime = RawRuntime(short_tmpdir("rr-") / "rt.sock", flood_method="GetContainerEvents")
    try:
        with CrihookProcess(runtime.endpoint, data_path="h2") as proc:
            peer = RawPeer(str(proc.socket_path), stream_window=65_535)
            try:
                sid = peer.request("GetContainerEvents")
                peer.read_until(lambda: any(isinstance(e, Data) for e in peer.events))
                # The runtime floods as far as the windows let it, then stops: nobody reads.
                wait_for(lambda: _stopped_flooding(runtime), PATIENCE, "the runtime to stop")
                first = runtime.flooded
                # The peer's connection window (grpc's default 65,535), crihook's own window
                # for the stream, and at most what the kernel buffers between the three.
                assert first <= 65_535 + RELAY_WINDOW + 4 * MiB
                peer.h2.consumed(sid, 10 * MiB)  # now the peer reads: the runtime goes on
                peer.send()
                peer.read_until(lambda: runtime.flooded > first)
            finally:
                peer.close()
    finally:
        runtime.stop()


def test_a_slow_runtime_holds_kubelet_back() -> None:
    """Flow control end to end, the other way: the runtime reads nothing of a big request;
    kubelet can send no more than the runtime's window plus the one window crihook holds."""
    runtime = RawRuntime(short_tmpdir("rr-") / "rt.sock", stall_method="FutureUpload")
    try:
        with CrihookProcess(runtime.endpoint, data_path="h2") as proc:
            peer = RawPeer(str(proc.socket_path))
            try:
                peer.read_until(lambda: any(isinstance(e, Settled) for e in peer.events))
                sid = peer.h2.open_stream()
                peer.h2.send_headers(
                    sid,
                    [
                        (":method", "POST"),
                        (":scheme", "http"),
                        (":path", RUNTIME + "FutureUpload"),
                        (":authority", "localhost"),
                        ("content-type", "application/grpc"),
                    ],
                )
                body = b"u" * (8 * MiB)
                sent = peer.h2.send_data(sid, struct.pack(">BL", 0, len(body)) + body)
                peer.send()

                def sent_so_far() -> int:
                    flushed = sum(e.sent for e in peer.events if isinstance(e, Flushed))
                    return sent + flushed

                def held() -> bool:
                    """crihook took what it will: nothing more for half a second, and the
                    runtime got what its window let through."""
                    before = sent_so_far()
                    with contextlib.suppress(AssertionError):
                        peer.read_until(lambda: False, timeout=0.5)
                    return sent_so_far() == before and runtime.stalled == 65_535

                wait_for(held, PATIENCE, "kubelet to be held back: nobody reads")
                first = sent_so_far()
                assert first <= 65_535 + RELAY_WINDOW
            finally:
                peer.close()
    finally:
        runtime.stop()


# --- the connection ------------------------------------------------------------------------


def test_ping_settings_and_the_stream_limit(proxy: CrihookProcess) -> None:
    peer = RawPeer(str(proxy.socket_path))
    try:
        peer.read_until(lambda: any(isinstance(e, Settled) for e in peer.events))
        assert peer.h2.peer_max_streams == 1000
        peer.h2.send_ping(b"keepaliv")
        peer.send()
        peer.read_until(lambda: PingAcked(b"keepaliv") in peer.events)
        # A new initial window and frame size mid-connection: calls go on.
        peer.sock.sendall(
            b"\x00\x00\x0c\x04\x00\x00\x00\x00\x00" + struct.pack(">HLHL", 0x4, 1000, 0x5, 20_000)
        )
        sid = peer.request("Version")
        peer.read_until(lambda: peer.ended(sid))
        assert any(
            isinstance(e, Headers) and ("grpc-status", "0") in e.headers for e in peer.events
        )
    finally:
        peer.close()


def test_garbage_and_half_frames_close_only_their_connection(
    fake: FakeRuntime, proxy: CrihookProcess
) -> None:
    garbage = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    garbage.connect(str(proxy.socket_path))
    half = RawPeer(str(proxy.socket_path))
    try:
        half.sock.sendall(b"\x00\x40\x00\x00")  # a frame header, cut short, and silence
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        garbage.settimeout(10)
        rest = b""
        while chunk := garbage.recv(4096):
            rest += chunk
        assert rest.endswith(struct.pack(">LL", 0, 1))  # GOAWAY, PROTOCOL_ERROR, then closed
        assert _seen(_call(proxy.endpoint, "Version"))[0] == b""
    finally:
        garbage.close()
        half.close()
    assert proxy.proc is not None and proxy.proc.poll() is None


def test_many_connections_at_once(fake: FakeRuntime, proxy: CrihookProcess) -> None:
    fake.script["ContainerStatus"] = Reply(response=b"\x0a\x00", delay=0.2)
    results: list[object] = []

    def one(i: int) -> None:
        results.append(_call(proxy.endpoint, "ContainerStatus", b"%d" % i, timeout=30))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r if isinstance(r, grpc.RpcError) else r[0] for r in results] == [b"\x0a\x00"] * 40  # type: ignore[index]
    assert sorted(c.request for c in fake.calls("ContainerStatus")) == sorted(
        b"%d" % i for i in range(40)
    )


def test_sigterm_sends_goaway_and_drains(fake: FakeRuntime) -> None:
    fake.script["ExecSync"] = Reply(response=b"\x0a\x02ok", delay=1.0)
    proc = CrihookProcess(fake.endpoint, data_path="h2").start()
    peer = RawPeer(str(proc.socket_path))
    try:
        sid = peer.request("ExecSync")
        wait_for(lambda: fake.calls("ExecSync"), PATIENCE, "the call to reach the runtime")
        proc.signal(signal.SIGTERM)
        peer.read_until(lambda: any(isinstance(e, GoAway) for e in peer.events))
        goaway = next(e for e in peer.events if isinstance(e, GoAway))
        assert (goaway.last_stream_id, goaway.error) == (sid, 0)
        peer.read_until(lambda: peer.ended(sid))  # the call in flight still finishes
        assert any(isinstance(e, Data) and e.data.endswith(b"ok") for e in peer.events)
        peer.read_until(lambda: peer.closed)
    finally:
        peer.close()
    assert proc.stop() == 0


def test_a_compressed_intercepted_request_is_unimplemented(proxy: CrihookProcess) -> None:
    peer = RawPeer(str(proxy.socket_path))
    try:
        sid = peer.h2.open_stream()
        peer.h2.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", RUNTIME + "CreateContainer"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("grpc-encoding", "gzip"),
            ],
        )
        peer.h2.send_data(sid, struct.pack(">BL", 1, 3) + b"zzz", end_stream=True)
        peer.send()
        peer.read_until(lambda: peer.ended(sid))
        last = [e for e in peer.events if isinstance(e, Headers) and e.stream_id == sid][-1]
        assert ("grpc-status", "12") in last.headers
    finally:
        peer.close()


@pytest.mark.parametrize("data_path", ["h2", "grpc"])
@pytest.mark.parametrize(
    "method", ["CreateContainer", "ListContainers"], ids=["intercepted", "relayed"]
)
def test_a_deadline_runs_from_the_headers_whether_the_body_comes_or_not(
    fake: FakeRuntime, method: str, data_path: str
) -> None:
    """HEADERS with `grpc-timeout: 1S` and no DATA, ever: DEADLINE_EXCEEDED once the second
    is over, as grpc answers it (issue 28: an intercepted call's timer started only once its
    body was complete, so this stream got no answer at all). Nothing reaches the runtime."""
    proxy = CrihookProcess(fake.endpoint, data_path=data_path).start()
    seen = len(fake.received)
    peer = RawPeer(str(proxy.socket_path))
    try:
        sid = peer.h2.open_stream()
        peer.h2.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", RUNTIME + method),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", "1S"),
            ],
        )
        peer.send()
        peer.read_until(lambda: peer.ended(sid), timeout=120)  # a loaded machine is slow
        ends = [e for e in peer.events if isinstance(e, Headers) and e.stream_id == sid]
        assert ends and ("grpc-status", str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])) in (
            ends[-1].headers
        )
    finally:
        peer.close()
    if method == "CreateContainer":
        assert [r.method for r in fake.received[seen:]] == []
    assert proxy.stop() == 0
