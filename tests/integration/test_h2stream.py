"""GrpcStream against a real grpc.aio server on a unix socket: messages both ways (up to
several MiB, so flow control and frame splitting are exercised), statuses, unimplemented
methods, a server that goes away, and peers that do not speak HTTP/2."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.hooks.remote.h2stream import GrpcStream, StreamEnded

SERVICE = "test.h2.Echo"
LIMIT = 16 << 20


class EchoService:
    """Echo: answers every message with itself. Fail: answers two, then a status."""

    def __init__(self) -> None:
        self.received: list[int] = []

    async def echo(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for message in requests:
            self.received.append(len(message))
            yield message

    async def fail(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        count = 0
        async for message in requests:
            yield message
            count += 1
            if count == 2:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "nicht jetzt: 100% voll")

    async def finish(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message
            return  # one answer, then OK

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Echo": grpc.stream_stream_rpc_method_handler(self.echo),
                "Fail": grpc.stream_stream_rpc_method_handler(self.fail),
                "Finish": grpc.stream_stream_rpc_method_handler(self.finish),
            },
        )


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="crh-h2-") as tmp:  # short: unix paths are limited
        yield Path(tmp)


@pytest.fixture
async def server(sock_dir: Path) -> AsyncIterator[tuple[grpc.aio.Server, EchoService, str]]:
    service = EchoService()
    server = grpc.aio.server(
        handlers=[service.handler()],
        options=[
            ("grpc.max_receive_message_length", LIMIT),
            ("grpc.max_send_message_length", LIMIT),
        ],
    )
    path = str(sock_dir / "echo.sock")
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    yield server, service, path
    await server.stop(None)


class Received:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.ended: asyncio.Future[tuple[grpc.StatusCode, str]] = (
            asyncio.get_running_loop().create_future()
        )
        self.arrived = asyncio.Event()

    def message(self, data: bytes) -> None:
        self.messages.append(data)
        self.arrived.set()

    def end(self, code: grpc.StatusCode, details: str) -> None:
        assert not self.ended.done(), "on_end called twice"
        self.ended.set_result((code, details))

    async def until(self, count: int) -> list[bytes]:
        async with asyncio.timeout(20):
            while len(self.messages) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.messages


async def open_stream(path: str, method: str) -> tuple[GrpcStream, Received]:
    received = Received()
    stream = await GrpcStream.open(path, f"/{SERVICE}/{method}", received.message, received.end)
    return stream, received


async def test_messages_of_every_size_come_back_in_order(server: Any) -> None:
    _, service, path = server
    stream, received = await open_stream(path, "Echo")
    sizes = [0, 1, 3_400, 16_384, 16_380, 100_000, 3 << 20, 7]
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    for payload in payloads:
        stream.send(payload)
    assert await received.until(len(payloads)) == payloads
    assert service.received == sizes
    stream.close()


async def test_a_burst_of_small_messages_on_one_stream(server: Any) -> None:
    _, _, path = server
    stream, received = await open_stream(path, "Echo")
    payloads = [f"message {i}".encode() * 40 for i in range(500)]
    for payload in payloads:
        stream.send(payload)
    assert await received.until(500) == payloads
    stream.close()


async def test_a_status_from_the_server_ends_the_stream_with_its_message(server: Any) -> None:
    _, _, path = server
    stream, received = await open_stream(path, "Fail")
    stream.send(b"a")
    stream.send(b"b")
    async with asyncio.timeout(20):
        code, details = await received.ended
    assert (code, details) == (grpc.StatusCode.FAILED_PRECONDITION, "nicht jetzt: 100% voll")
    assert received.messages == [b"a", b"b"]
    with pytest.raises(StreamEnded):
        stream.send(b"c")


async def test_the_server_ending_the_call_is_ok(server: Any) -> None:
    _, _, path = server
    stream, received = await open_stream(path, "Finish")
    stream.send(b"only")
    async with asyncio.timeout(20):
        assert await received.ended == (grpc.StatusCode.OK, "")
    assert received.messages == [b"only"]


async def test_an_unknown_method_is_unimplemented(server: Any) -> None:
    _, _, path = server
    stream, received = await open_stream(path, "Missing")
    stream.send(b"anyone?")
    async with asyncio.timeout(20):
        code, _ = await received.ended
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert received.messages == []


async def test_a_server_that_stops_ends_the_stream(server: Any) -> None:
    grpc_server, _, path = server
    stream, received = await open_stream(path, "Echo")
    stream.send(b"ping")
    await received.until(1)
    await grpc_server.stop(None)
    async with asyncio.timeout(20):
        code, details = await received.ended
    assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), details
    with pytest.raises(StreamEnded):
        stream.send(b"gone")


async def test_a_peer_that_does_not_speak_http2_is_refused(sock_dir: Path) -> None:
    async def not_http2(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    path = str(sock_dir / "http1.sock")
    peer = await asyncio.start_unix_server(not_http2, path)
    try:
        with pytest.raises(ConnectionError, match="speaking HTTP/2"):
            await open_stream(path, "Echo")
    finally:
        peer.close()
        await peer.wait_closed()


async def test_a_silent_peer_times_out(sock_dir: Path) -> None:
    hung_up = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads until the client hangs up, answers nothing
        writer.close()
        await writer.wait_closed()
        hung_up.set()

    path = str(sock_dir / "silent.sock")
    peer = await asyncio.start_unix_server(silent, path)
    try:
        with pytest.raises(TimeoutError):
            await GrpcStream.open(path, f"/{SERVICE}/Echo", print, print, timeout=0.3)
        async with asyncio.timeout(20):
            await hung_up.wait()  # the client closed its connection when it gave up
    finally:
        peer.close()
        await peer.wait_closed()


async def test_no_socket_is_an_os_error(sock_dir: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await open_stream(str(sock_dir / "absent.sock"), "Echo")
