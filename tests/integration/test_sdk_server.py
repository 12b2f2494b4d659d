"""The SDK's HTTP/2 gRPC server against grpc core's own client (grpc.aio) and against
GrpcStream: unary and bidi calls, statuses, deadlines, cancellation, flow control with big
messages, graceful and immediate stops, and a peer that does not speak HTTP/2."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.hooks.remote.h2stream import GrpcStream
from crihook.hooks.remote.sdk_server import BidiCall, GrpcServer, RpcError, parse_timeout

SERVICE = "/test.h2.Server"
LIMIT = 16 << 20
OPTIONS = [("grpc.max_receive_message_length", LIMIT), ("grpc.max_send_message_length", LIMIT)]


class Handlers:
    def __init__(self) -> None:
        self.slow_started = asyncio.Event()
        self.slow_cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.sessions: list[EchoSession] = []

    async def echo(self, data: bytes) -> bytes:
        return data

    async def fail(self, data: bytes) -> bytes:
        raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, data.decode())

    async def crash(self, data: bytes) -> bytes:
        raise KeyError("no such thing")

    async def slow(self, data: bytes) -> bytes:
        self.slow_started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.slow_cancelled.set()
            raise
        return b"released"

    def session(self, call: BidiCall) -> EchoSession:
        session = EchoSession(call)
        self.sessions.append(session)
        return session


class EchoSession:
    """Echoes each message; ends OK when the client half-closes; `stop` ends with a status."""

    def __init__(self, call: BidiCall) -> None:
        self.call = call
        self.cancelled_ = asyncio.Event()

    def message(self, data: bytes) -> None:
        if data == b"stop":
            self.call.finish(grpc.StatusCode.RESOURCE_EXHAUSTED, "enough: 100% ✓")
        else:
            self.call.send(data)

    def half_closed(self) -> None:
        self.call.finish()

    def cancelled(self) -> None:
        self.cancelled_.set()


@pytest.fixture
def sock_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="crh-h2s-") as tmp:  # short: unix paths are limited
        yield str(Path(tmp) / "server.sock")


@pytest.fixture
async def served(sock_path: str) -> AsyncIterator[tuple[GrpcServer, Handlers]]:
    handlers = Handlers()
    server = GrpcServer(
        {
            f"{SERVICE}/Echo": handlers.echo,
            f"{SERVICE}/Fail": handlers.fail,
            f"{SERVICE}/Crash": handlers.crash,
            f"{SERVICE}/Slow": handlers.slow,
        },
        {f"{SERVICE}/Chat": handlers.session},
    )
    await server.start(sock_path)
    yield server, handlers
    handlers.release.set()
    await server.stop(None)


@pytest.fixture
async def channel(sock_path: str, served: Any) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"unix://{sock_path}", options=OPTIONS) as channel:
        yield channel


def unary(channel: grpc.aio.Channel, method: str) -> Any:
    return channel.unary_unary(f"{SERVICE}/{method}")


async def test_unary_calls_of_every_size_and_many_at_once(channel: grpc.aio.Channel) -> None:
    echo = unary(channel, "Echo")
    for size in (0, 1, 16_384, 70_000, 3 << 20):
        payload = bytes([size % 251]) * size
        assert await echo(payload, timeout=20) == payload
    many = [f"call {i}".encode() * 50 for i in range(100)]
    assert await asyncio.gather(*(echo(p, timeout=20) for p in many)) == many


@pytest.mark.parametrize(
    ("method", "code", "details"),
    [
        ("Fail", grpc.StatusCode.FAILED_PRECONDITION, "zu früh: 50% fertig"),
        ("Crash", grpc.StatusCode.UNKNOWN, "KeyError: 'no such thing'"),
        ("Missing", grpc.StatusCode.UNIMPLEMENTED, f"unknown method {SERVICE}/Missing"),
    ],
)
async def test_a_failed_call_gets_its_status_and_message(
    channel: grpc.aio.Channel, method: str, code: grpc.StatusCode, details: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await unary(channel, method)("zu früh: 50% fertig".encode(), timeout=20)
    assert info.value.code() == code
    assert info.value.details() == details


async def test_the_client_deadline_cancels_the_handler(
    channel: grpc.aio.Channel, served: Any
) -> None:
    _, handlers = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await unary(channel, "Slow")(b"", timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    async with asyncio.timeout(20):
        await handlers.slow_cancelled.wait()


async def test_a_client_that_cancels_cancels_the_handler(
    channel: grpc.aio.Channel, served: Any
) -> None:
    _, handlers = served
    call = unary(channel, "Slow")(b"", timeout=20)
    async with asyncio.timeout(20):
        await handlers.slow_started.wait()
    call.cancel()
    async with asyncio.timeout(20):
        await handlers.slow_cancelled.wait()


async def test_a_bidi_call_from_grpc_core(channel: grpc.aio.Channel, served: Any) -> None:
    _, handlers = served
    call = channel.stream_stream(f"{SERVICE}/Chat")()
    for payload in (b"one", b"x" * 200_000, b""):
        await call.write(payload)
        assert await call.read() == payload
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK

    ended = channel.stream_stream(f"{SERVICE}/Chat")()
    await ended.write(b"stop")
    assert await ended.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await ended.details() == "enough: 100% ✓"

    cancelled = channel.stream_stream(f"{SERVICE}/Chat")()
    await cancelled.write(b"hello")
    assert await cancelled.read() == b"hello"
    cancelled.cancel()
    async with asyncio.timeout(20):
        await handlers.sessions[-1].cancelled_.wait()


async def test_a_bidi_call_from_grpc_stream(sock_path: str, served: Any) -> None:
    got: list[bytes] = []
    ended: asyncio.Future[tuple[grpc.StatusCode, str]] = asyncio.get_running_loop().create_future()
    stream = await GrpcStream.open(
        sock_path, f"{SERVICE}/Chat", got.append, lambda c, d: ended.set_result((c, d))
    )
    payloads = [b"a" * n for n in (1, 5_000, 100_000, 3 << 20)]
    for payload in payloads:
        stream.send(payload)
    stream.send(b"stop")
    async with asyncio.timeout(20):
        assert await ended == (grpc.StatusCode.RESOURCE_EXHAUSTED, "enough: 100% ✓")
    assert got == payloads


async def slow_call_in_flight(channel: grpc.aio.Channel, handlers: Handlers) -> Any:
    """A Slow call, once its handler is running (it waits for handlers.release)."""
    in_flight = asyncio.ensure_future(unary(channel, "Slow")(b"", timeout=20))
    async with asyncio.timeout(20):
        await handlers.slow_started.wait()
    return in_flight


async def test_graceful_stop_lets_calls_finish_and_refuses_new_ones(
    channel: grpc.aio.Channel, served: Any
) -> None:
    server, handlers = served
    in_flight = await slow_call_in_flight(channel, handlers)
    stopping = asyncio.ensure_future(server.stop(10))
    await asyncio.sleep(0.2)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await unary(channel, "Echo")(b"late", timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not stopping.done()
    handlers.release.set()
    async with asyncio.timeout(20):
        assert await in_flight == b"released"
        await stopping


@pytest.mark.parametrize("second_grace", [None, 0.2], ids=["no-grace", "shorter-grace"])
async def test_a_second_stop_with_less_grace_cancels_calls_in_flight(
    channel: grpc.aio.Channel, served: Any, second_grace: float | None
) -> None:
    server, handlers = served
    in_flight = await slow_call_in_flight(channel, handlers)
    graceful = asyncio.ensure_future(server.stop(60))
    await asyncio.sleep(0.1)
    async with asyncio.timeout(20):
        await server.stop(second_grace)
        await graceful
        await handlers.slow_cancelled.wait()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await in_flight
    assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


async def test_a_peer_without_the_preface_is_dropped(sock_path: str, served: Any) -> None:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.setblocking(False)
        await loop.sock_connect(peer, sock_path)
        await loop.sock_sendall(peer, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        async with asyncio.timeout(20):
            while chunk := await loop.sock_recv(peer, 4096):
                received += chunk
    # Its SETTINGS, then a GOAWAY (PROTOCOL_ERROR), then the connection is closed.
    assert received[3] == 0x4
    assert b"\x07\x00\x00\x00\x00\x00" in received


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2S", 2.0), ("1500m", 1.5), ("10u", 1e-5), ("3M", 180.0), ("1H", 3600.0), ("7n", 7e-9)],
)
def test_grpc_timeout_values(value: str, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [None, "", "S", "12", "1.5S", "-1S", "5x"])
def test_malformed_grpc_timeouts_are_ignored(value: str | None) -> None:
    assert parse_timeout(value) is None
