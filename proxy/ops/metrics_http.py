"""Serving the metrics: `GET /metrics` over HTTP/1.1 on a unix socket or a TCP port.

One small asyncio server for both address kinds, on crihook's event loop: no thread per
connection and no blocking I/O on the loop. Why not prometheus_client's own servers: they
cannot listen on a unix socket, and they would collect from their own thread while the loop
changes what is collected (the hooks' pools, the counters), which needs locks on the call
path. Here each scrape copies the figures on the loop (plain dicts: a fraction of a
millisecond), and the families are built from that copy and rendered as text in a worker
thread, together with the process figures (read from /proc).

Each connection carries one request and is closed after the answer (Prometheus opens a new
one per scrape anyway). A request that is not `GET`/`HEAD /metrics` gets 404 or 405; one
that does not arrive whole within `READ_TIMEOUT` seconds, or is bigger than
`MAX_REQUEST_BYTES`, is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from crihook.proxy.errors import ConfigError
from crihook.proxy.sockets import owner_only, prepare_listen_path, secure_socket

__all__ = ["MAX_REQUEST_BYTES", "READ_TIMEOUT", "MetricsServer", "split_address"]

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
MAX_REQUEST_BYTES = 16 * 1024
_PATH = "/metrics"


def split_address(address: str) -> tuple[Path | None, str, int]:
    """`unix:///p` → (Path('/p'), "", 0); `host:port` → (None, host, port) (an IPv6 host
    without its brackets). The address was validated by `config.metrics_address`."""
    if address.startswith("unix://"):
        return Path(address.removeprefix("unix://")), "", 0
    host, _, port = address.rpartition(":")
    return None, host.removeprefix("[").removesuffix("]"), int(port)


class Snapshot(Protocol):
    """The figures of one scrape, taken on the loop; `families()` may run in any thread."""

    def families(self) -> Iterable[Metric]: ...


class _Scrape(Collector):
    """A snapshot's families, then the process figures (in the worker thread)."""

    def __init__(self, snapshot: Snapshot, process: ProcessCollector) -> None:
        self._snapshot = snapshot
        self._process = process

    def collect(self) -> Iterator[Metric]:
        yield from self._snapshot.families()
        yield from self._process.collect()


class MetricsServer:
    """Serves what `snapshot()` (called on the loop, per scrape) holds on `address`."""

    def __init__(
        self,
        address: str,
        snapshot: Callable[[], Snapshot],
        socket_mode: int = 0o660,
        socket_group: str | None = None,
    ) -> None:
        self.address = address
        self._snapshot = snapshot
        self._mode = socket_mode
        self._group = socket_group
        self._server: asyncio.Server | None = None
        self._process = ProcessCollector(namespace="crihook", registry=None)
        self._path, self._host, self._port = split_address(address)
        self.bound = ""
        """Where it listens, once started (the port the kernel chose for port 0)."""

    async def start(self) -> None:
        """Listen; a ConfigError naming `metrics_listen` when the address cannot be used."""
        try:
            if self._path is not None:
                prepare_listen_path(self._path)
                with owner_only():
                    self._server = await asyncio.start_unix_server(self._serve, path=self._path)
                secure_socket(self._path, self._mode, self._group)
                self.bound = f"unix://{self._path}"
            else:
                self._server = await asyncio.start_server(
                    self._serve, host=self._host, port=self._port, reuse_address=True
                )
                sockname = self._server.sockets[0].getsockname()
                host = f"[{sockname[0]}]" if ":" in sockname[0] else sockname[0]
                self.bound = f"{host}:{sockname[1]}"
        except (OSError, socket.gaierror) as exc:
            raise ConfigError(
                "metrics_listen", f"cannot listen on {self.address}: {exc.strerror or exc}"
            ) from None
        log.info("metrics served on %s (GET %s)", self.bound, _PATH)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return  # not HTTP, too big, or too slow: dropped
            if len(head) > MAX_REQUEST_BYTES:
                return
            status, content_type, body, head_only = await self._answer(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            )
            if not head_only:
                writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass  # the scraper went away
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, head: bytes) -> tuple[str, str, bytes, bool]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", "text/plain", b"bad request\n", False
        verb, target = parts[0], parts[1].partition("?")[0]
        if target != _PATH:
            return "404 Not Found", "text/plain", b"crihook serves /metrics\n", False
        if verb not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET /metrics\n", False
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        scrape = _Scrape(self._snapshot(), self._process)  # the loop's state, copied on the loop
        body = await asyncio.to_thread(encoder, scrape)
        return "200 OK", content_type, body, verb == "HEAD"
