"""The kubelet-facing side of the `h2` data path: crihook serves gRPC over its own HTTP/2.

Each kubelet connection is a `KubeletConnection` (an `H2Protocol`: the asyncio adapter of a
sans-IO `crihook.api.h2.Connection`); each stream on it becomes one of three kinds of call, by
path:

- `Relay` (pass-through: unary, server-streaming, and methods crihook does not know): the
  request's header block, DATA and any trailers go to a stream on a runtime connection
  (h2_runtime.py) as they arrive, and the runtime's headers, DATA, trailers (or RST_STREAM)
  come back the same way. Messages are never decoded; only their 5-byte prefixes are read,
  to refuse a request over `max_message_bytes`. `grpc-timeout` is replaced by what is left of
  it. Flow control holds end to end: a window is given back to one side only when the bytes
  it covers went out on the other, so each stream holds at most one window (RELAY_WINDOW).
  A request the runtime did not process (GOAWAY, REFUSED_STREAM) is sent once more, as grpc-go
  does, while nothing of the answer went to kubelet: its bytes are kept until the runtime's
  headers come (up to REPLAY_LIMIT; a larger request is not retried).
- `Intercept`: the request message is collected and handed to the pipeline core
  (`cri.handler.Intercept.handle`) as bytes, with the metadata and the deadline; its
  Outcome is the answer or the status.
- `Buffered` (only where the answer must be seen: RestorePod's observer, and every unary
  method while `--record-all` records): one request, one call to the runtime, the answer.

A deadline passing on an intercepted or buffered call ends it with DEADLINE_EXCEEDED, counted
from its HEADERS whether its body arrives or not; a relay
leaves deadlines to the runtime and to kubelet's own RST_STREAM, which it passes on. Stopping:
GOAWAY on every connection (new streams are refused), calls in flight get the grace period,
then whatever is left is reset on both sides.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import grpc

from crihook.api.h2.connection import CANCEL, Connection, Header
from crihook.api.h2.grpc_wire import (
    CompressedMessage,
    GrpcMessages,
    MessageSizes,
    MessageTooLarge,
    encode_grpc_message,
    encode_timeout,
    grpc_message_prefix,
    headers_from_metadata,
    metadata_from_headers,
    parse_timeout,
    status_from_header,
)
from crihook.hooks.spec import Event
from crihook.proxy.config import DEFAULT_MAX_MESSAGE_BYTES
from crihook.proxy.cri import handler
from crihook.proxy.cri.events import EVENTS, EventSpec
from crihook.proxy.cri.method_labels import OTHER_METHOD, PASSTHROUGH, method_label
from crihook.proxy.cri.methods import CRI_PACKAGE, known_methods
from crihook.proxy.cri.outcome import Status
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.wire.grpc.passthrough import Observer, PassthroughRecord
from crihook.proxy.wire.h2.runtime_client import (
    RELAY_WINDOW,
    FlushedConnection,
    Flusher,
    H2RuntimeClient,
    RuntimeConnection,
    RuntimePool,
    going_away_status,
)

__all__ = ["MAX_CONCURRENT_STREAMS", "REPLAY_LIMIT", "H2Server", "KubeletConnection"]

log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS = 1000
"""Calls one kubelet connection may have open at once (more are refused): as the grpc path."""
REPLAY_LIMIT = 256 << 10
"""The largest request a relay keeps to send again if the runtime does not process it (grpc-go's
per-call retry buffer)."""

_IMAGE_PREFIX = f"/{CRI_PACKAGE}.ImageService/"

Route = Event | RuntimePool | tuple[Observer | None, PassthroughRecord | None]
"""What a known path becomes: intercepted (its event), relayed (to this pool), or buffered
(the observer and the recorder to tell)."""
KUBELET = "kubelet"
"""The origin of a call kubelet ended (it cancelled, or its deadline passed)."""
_UNKNOWN_METHOD = (OTHER_METHOD, False)
"""A method crihook does not know is counted as `other`, and not timed (it may stream)."""
_RESPONSE_HEADERS: list[Header] = [(":status", "200"), ("content-type", "application/grpc")]
_OK_TRAILERS: list[Header] = [("grpc-status", "0")]


def status_headers(status: Status, headers_sent: bool) -> list[Header]:
    """The block that ends a call with `status`: trailers, or a trailers-only answer."""
    out = [] if headers_sent else [*_RESPONSE_HEADERS]
    out.append(("grpc-status", str(status.code.value[0])))
    if status.details:
        out.append(("grpc-message", encode_grpc_message(status.details)))
    out += headers_from_metadata(status.trailers)
    return out


class _Call:
    """One kubelet stream. Its methods run on the event loop.

    A pass-through call tells the metrics how it ended when it finishes (`measured`: its
    method label and whether it is timed; intercepted calls are counted by the pipeline)."""

    __slots__ = ("code", "conn", "done", "headers_sent", "measured", "origin", "since", "stream_id")

    def __init__(self, conn: KubeletConnection, stream_id: int) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.done = False
        self.headers_sent = False
        self.measured: tuple[str, bool] | None = None
        self.since = 0.0
        self.code = "CANCELLED"  # until the call ends otherwise: kubelet went away
        self.origin = KUBELET

    def measure(self, label: str, timed: bool) -> None:
        self.measured = (label, timed)
        self.since = time.perf_counter()

    def ended(self, code: str, origin: str) -> None:
        """How the call ends (told to the metrics when it finishes)."""
        self.code, self.origin = code, origin

    def start(self, headers: list[Header], end_stream: bool) -> None:
        raise NotImplementedError

    def down_headers(self, headers: list[Header], end_stream: bool) -> None:
        """Trailers from kubelet (gRPC clients send none; passed on where it matters)."""

    def down_data(self, data: bytes, end_stream: bool, flow: int) -> None:
        raise NotImplementedError

    def down_flushed(self, sent: int) -> None:
        """Held DATA for kubelet went out."""

    def down_reset(self, error: int) -> None:
        """kubelet reset the stream, or its connection went away."""
        self.finish()

    def answer(self, status: Status, origin: str = "") -> None:
        """End the call with `status` (kubelet's side), once. `origin`: who ended it, when
        not what the message says (crihook's messages start with `crihook:`)."""
        if self.done:
            return
        if not origin:
            origin = "crihook" if status.details.startswith("crihook:") else "runtime"
        self.ended(status.code.name, origin)
        conn = self.conn
        conn.h2.send_headers(self.stream_id, status_headers(status, self.headers_sent), True)
        conn.flusher.mark(conn)
        self.finish()

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.conn.ended(self.stream_id)
            metrics, measured = self.conn.server.metrics, self.measured
            if metrics is not None and measured is not None:
                label, timed = measured
                seconds = time.perf_counter() - self.since if timed else None
                metrics.observe_call(label, PASSTHROUGH, self.code, self.origin, seconds)


class Relay(_Call):
    """A pass-through call: frames both ways, nothing decoded."""

    __slots__ = (
        "arrived",
        "connecting",
        "headers",
        "pending",
        "pool",
        "replay",
        "replay_size",
        "request_done",
        "sizes",
        "timeout",
        "up",
        "up_id",
    )

    def __init__(self, conn: KubeletConnection, stream_id: int, pool: RuntimePool) -> None:
        super().__init__(conn, stream_id)
        self.pool = pool
        self.up: RuntimeConnection | None = None
        self.up_id = 0
        self.sizes = MessageSizes(conn.server.max_message_bytes)
        self.pending: list[tuple[bytes, bool, int]] | None = None
        self.headers: list[Header] = []
        self.timeout: float | None = None
        self.arrived = 0.0
        self.connecting: asyncio.Future[None] | None = None
        self.replay: list[bytes] | None = []
        """The request's DATA so far, to send again if the runtime does not process it; None
        once it may not be (too large, sent again already, kubelet's trailers, an answer)."""
        self.replay_size = 0
        self.request_done = False

    def start(self, headers: list[Header], end_stream: bool) -> None:
        server = self.conn.server
        if not server.readiness.ready:
            self.answer(Status(grpc.StatusCode.UNAVAILABLE, f"crihook: {server.readiness.reason}"))
            return
        timeout = None
        for name, value in headers:
            if name == "grpc-timeout":
                timeout = parse_timeout(value)
                headers = [h for h in headers if h[0] != "grpc-timeout"]
                break
        self.headers = headers
        self.timeout = timeout
        self.arrived = time.monotonic()
        self.request_done = end_stream
        self._go(end_stream)

    def _go(self, end_stream: bool) -> None:
        """Open the stream to the runtime (now, or once connected); `pending` follows it."""
        up = self.pool.ready()
        if up is not None:
            self._open(up, end_stream)
        else:
            if self.pending is None:
                self.pending = []
            self.connecting = asyncio.ensure_future(self._connect(end_stream))

    async def _connect(self, end_stream: bool) -> None:
        try:
            up = await self.pool.connection()
        except RuntimeCallFailed as exc:
            self.answer(exc.status)
            self.conn.flusher.flush()
            return
        if not self.done:
            self._open(up, end_stream)
            self.conn.flusher.flush()

    def _open(self, up: RuntimeConnection, end_stream: bool) -> None:
        headers = self.headers
        if self.timeout is not None:
            left = self.timeout - (time.monotonic() - self.arrived)
            if left <= 0:
                self.answer(Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), KUBELET)
                return
            headers = [*headers, ("grpc-timeout", encode_timeout(left))]
        self.up = up
        self.up_id = up.open(self, headers, end_stream)
        pending, self.pending = self.pending, None
        for data, end, flow in pending or ():
            self._forward(up, data, end, flow)

    def _forward(self, up: RuntimeConnection, data: bytes, end_stream: bool, flow: int) -> None:
        sent = up.h2.send_data(self.up_id, data, end_stream)
        up.flusher.mark(up)
        credit = flow - len(data) + sent  # padding, and what went out: the window it frees
        if credit:
            self.conn.h2.consumed(self.stream_id, credit)

    # --- from kubelet ------------------------------------------------------------------------
    def down_data(self, data: bytes, end_stream: bool, flow: int) -> None:
        try:
            self.sizes.feed(data)
        except MessageTooLarge as exc:
            self._give_up(Status(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)))
            return
        replay = self.replay
        if replay is not None:
            self.replay_size += len(data)
            if self.replay_size > REPLAY_LIMIT:
                self.replay = None
            else:
                replay.append(data)
        if end_stream:
            self.request_done = True
        up = self.up
        if up is None:
            if self.pending is not None:
                self.pending.append((data, end_stream, flow))
            return
        self._forward(up, data, end_stream, flow)

    def down_headers(self, headers: list[Header], end_stream: bool) -> None:
        self.replay = None  # trailers from kubelet are not kept
        if self.up is not None:
            self.up.h2.send_headers(self.up_id, headers, end_stream)
            self.up.flusher.mark(self.up)

    def down_flushed(self, sent: int) -> None:
        up = self.up
        if up is not None:
            up.h2.consumed(self.up_id, sent)
            up.flusher.mark(up)

    def down_reset(self, error: int) -> None:
        self._reset_up(error)
        self.finish()

    def _reset_up(self, error: int) -> None:
        up = self.up
        if up is not None and up.h2.is_open(self.up_id):
            up.forget(self.up_id)
            up.h2.send_reset(self.up_id, error)
            up.flusher.mark(up)

    def _give_up(self, status: Status) -> None:
        self._reset_up(CANCEL)
        self.answer(status)

    # --- from the runtime --------------------------------------------------------------------
    def up_headers(self, headers: list[Header], end_stream: bool) -> None:
        conn = self.conn
        conn.h2.send_headers(self.stream_id, headers, end_stream)
        conn.flusher.mark(conn)
        self.headers_sent = True
        self.replay = None
        if end_stream:
            if self.measured is not None:  # how it ended is only for the metrics
                self.ended(*_trailer_status(headers))
            self.finish()

    def up_data(self, data: bytes, end_stream: bool, flow: int) -> None:
        conn = self.conn
        sent = conn.h2.send_data(self.stream_id, data, end_stream)
        conn.flusher.mark(conn)
        credit = flow - len(data) + sent
        up = self.up
        if credit and up is not None:
            up.h2.consumed(self.up_id, credit)
        if end_stream:
            self.finish()

    def up_flushed(self, sent: int) -> None:
        self.conn.h2.consumed(self.stream_id, sent)
        self.conn.flusher.mark(self.conn)

    def up_reset(self, error: int) -> None:
        conn = self.conn
        conn.h2.send_reset(self.stream_id, error)
        conn.flusher.mark(conn)
        self.ended("CANCELLED" if error == CANCEL else "INTERNAL", "runtime")  # (as grpc maps it)
        self.finish()

    def up_refused(self, error: int | None) -> None:
        self.up = None  # that stream is closed
        replay = self.replay
        if replay is not None and self.request_done and not self.headers_sent and not self.done:
            self.replay = None  # once
            last = len(replay) - 1
            self.pending = [(data, i == last, 0) for i, data in enumerate(replay)]
            self._go(not replay)
        elif error is None:
            self.answer(going_away_status())
        else:
            self.up_reset(error)

    def up_lost(self, status: Status) -> None:
        self.answer(status)


class _Unary(_Call):
    """A call answered once its one request message is in: base of Intercept and Buffered."""

    __slots__ = ("deadline", "messages", "metadata", "requests", "task", "timer")

    def __init__(self, conn: KubeletConnection, stream_id: int) -> None:
        super().__init__(conn, stream_id)
        self.messages = GrpcMessages(limit=conn.server.max_message_bytes)
        self.requests: list[bytes] = []
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None
        self.metadata: Any = None

    def start(self, headers: list[Header], end_stream: bool) -> None:
        timeout = None
        for name, value in headers:
            if name == "grpc-timeout":
                timeout = parse_timeout(value)
                break
        self.metadata = metadata_from_headers(headers)
        if timeout is not None:
            # From the HEADERS, as grpc does: a body that never comes still ends the call.
            self.deadline = time.monotonic() + timeout
            self.timer = asyncio.get_running_loop().call_later(timeout, self._expired)
        if end_stream:
            self._begin()

    def down_data(self, data: bytes, end_stream: bool, flow: int) -> None:
        self.conn.h2.consumed(self.stream_id, flow)  # bounded by the message limit
        if self.done:
            return
        try:
            self.requests += self.messages.feed(data)
        except MessageTooLarge as exc:
            self.answer(Status(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)))
            return
        except CompressedMessage as exc:  # kubelet never compresses; grpc's own answer
            self.answer(Status(grpc.StatusCode.UNIMPLEMENTED, str(exc)))
            return
        if end_stream:
            self._begin()

    def down_headers(self, headers: list[Header], end_stream: bool) -> None:
        if end_stream and not self.done:
            self._begin()

    def _begin(self) -> None:
        if self.task is not None:
            return
        if len(self.requests) != 1 or self.messages.partial:
            got = len(self.requests)
            self.answer(
                Status(grpc.StatusCode.INTERNAL, f"a unary call needs one request, got {got}")
            )
            return
        self.task = asyncio.get_running_loop().create_task(self._run(self.requests[0]))

    async def _run(self, request: bytes) -> None:
        raise NotImplementedError

    def _expired(self) -> None:
        self.timer = None
        if self.task is not None:
            self.task.cancel()
        self.answer(Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), KUBELET)
        self.conn.flusher.flush()

    def respond(self, response: bytes) -> None:
        if self.done:
            return
        conn = self.conn
        h2 = conn.h2
        h2.send_headers(self.stream_id, _RESPONSE_HEADERS)
        h2.send_data(self.stream_id, grpc_message_prefix(len(response)) + response)
        h2.send_headers(self.stream_id, _OK_TRAILERS, True)
        conn.flusher.mark(conn)
        self.ended("OK", "")
        self.finish()

    def finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        super().finish()

    def down_reset(self, error: int) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.finish()


class Intercept(_Unary):
    """An intercepted call: its request bytes go through the pipeline core."""

    __slots__ = ("event",)

    def __init__(self, conn: KubeletConnection, stream_id: int, event: Event) -> None:
        super().__init__(conn, stream_id)
        self.event = event

    async def _run(self, request: bytes) -> None:
        try:
            outcome = await self.conn.server.pipeline.handle(
                self.event, request, self.metadata, self.deadline
            )
        except asyncio.CancelledError:
            raise  # kubelet gave up, or the deadline passed: answered already
        except Exception as exc:  # a bug: the call fails, crihook goes on
            log.exception("intercepted %s failed", self.event.value)
            self.answer(Status(grpc.StatusCode.UNKNOWN, f"crihook: {type(exc).__name__}: {exc}"))
        else:
            if outcome.status is not None:
                self.answer(outcome.status)
            else:
                self.respond(cast(bytes, outcome.response))
        self.conn.flusher.flush()


class Buffered(_Unary):
    """A pass-through unary call whose answer must be seen (observer, --record-all)."""

    __slots__ = ("observer", "path", "record", "started")

    def __init__(
        self,
        conn: KubeletConnection,
        stream_id: int,
        path: str,
        observer: Observer | None,
        record: PassthroughRecord | None,
    ) -> None:
        super().__init__(conn, stream_id)
        self.path = path
        self.observer = observer
        self.record = record
        self.started = time.time()

    async def _run(self, request: bytes) -> None:
        server = self.conn.server
        record = self.record
        if not server.readiness.ready:
            status = Status(grpc.StatusCode.UNAVAILABLE, f"crihook: {server.readiness.reason}")
            if record is not None:
                record(self.path, request, None, status, self.started)
            self.answer(status)
        else:
            timeout = None
            if self.deadline is not None:
                timeout = max(self.deadline - time.monotonic(), 0.0)
            call = server.runtime.call(self.path, self.path.startswith(_IMAGE_PREFIX))
            try:
                response = await call(request, timeout=timeout, metadata=self.metadata)
            except RuntimeCallFailed as exc:
                if record is not None:
                    record(self.path, request, None, exc.status, self.started)
                self.answer(exc.status)
            else:
                if record is not None:
                    record(self.path, request, response, None, self.started)
                if self.observer is not None:
                    self.observer(response)
                self.respond(response)
        self.conn.flusher.flush()


class KubeletConnection(FlushedConnection):
    """One kubelet connection. Windows are given back by the calls (a relay: once its bytes
    went out to the runtime)."""

    def __init__(self, server: H2Server) -> None:
        super().__init__(
            Connection(
                client=False,
                stream_window=RELAY_WINDOW,
                max_concurrent_streams=MAX_CONCURRENT_STREAMS,
            ),
            server.flusher,
        )
        self.server = server
        self.calls: dict[int, _Call] = {}
        self.going_away = False
        self.last_stream = 0  # the last stream that became a call

    def write_out(self) -> None:
        transport = self._transport
        if transport is None:
            return
        data = self.h2.data_to_send()
        if data:
            transport.write(data)
        if self.going_away and not self.calls:
            transport.close()  # after what was written

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server.connections.add(self)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.abort()
        self.server.forget(self)

    def abort(self) -> None:
        """Reset every call (on the runtime's side too) and close."""
        for call in list(self.calls.values()):
            call.down_reset(CANCEL)
            if self._transport is not None:
                self.h2.send_reset(call.stream_id, CANCEL)
        self.flusher.mark(self)
        self.flusher.flush()
        if self._transport is not None:
            self._transport.close()

    def go_away(self) -> None:
        """Refuse new streams; close once the calls in flight are done."""
        self.going_away = True
        self.h2.send_goaway()
        self.write_out()

    def ended(self, stream_id: int) -> None:
        self.calls.pop(stream_id, None)
        if self.going_away and not self.calls:
            self.flusher.mark(self)  # written, then closed (write_out)

    # --- what kubelet sends --------------------------------------------------------------------
    def _on_data(self, stream_id: int, payload: bytes, end_stream: bool, flow: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.down_data(payload, end_stream, flow)

    def _on_headers(self, stream_id: int, headers: list[Header], end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.down_headers(headers, end_stream)
        elif stream_id > self.last_stream and not self.going_away:
            self.last_stream = stream_id
            self._new_call(stream_id, headers, end_stream)

    def _on_flushed(self, stream_id: int, sent: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.down_flushed(sent)

    def _on_reset(self, stream_id: int, error: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.down_reset(error)

    def _on_protocol_error(self, details: str) -> None:
        log.warning("dropping a kubelet connection: %s", details)
        self.abort()

    def _new_call(self, stream_id: int, headers: list[Header], end_stream: bool) -> None:
        server = self.server
        path = ""
        for name, value in headers:
            if name == ":path":
                path = value
                break
        route = server.routes.get(path)
        call: _Call
        if route is None:  # a method crihook does not know: relayed all the same
            call = Relay(self, stream_id, server.runtime.pool(path.startswith(_IMAGE_PREFIX)))
        elif isinstance(route, RuntimePool):
            call = Relay(self, stream_id, route)
        elif isinstance(route, Event):
            call = Intercept(self, stream_id, route)
        else:
            observer, record = route
            call = Buffered(self, stream_id, path, observer, record)
        self.calls[stream_id] = call
        if server.metrics is not None and not isinstance(call, Intercept):
            call.measure(*server.labels.get(path, _UNKNOWN_METHOD))
        call.start(headers, end_stream)


class H2Server:
    """Serves kubelet on a unix socket with crihook's own HTTP/2."""

    def __init__(
        self,
        runtime: H2RuntimeClient,
        pipeline: handler.Intercept,
        readiness: Readiness,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        observers: Mapping[str, Observer] | None = None,
        record: PassthroughRecord | None = None,
        metrics: handler.CallObserver | None = None,
        events: Mapping[Event, EventSpec] = EVENTS,
    ) -> None:
        """`events`: the methods given to the pipeline (crihook.proxy.cri.events); every
        other is forwarded."""
        self.runtime = runtime
        self.pipeline = pipeline
        self.readiness = readiness
        self.max_message_bytes = max_message_bytes
        self.metrics = metrics
        self.labels: dict[str, tuple[str, bool]] = {}
        """Path of a pass-through method → its metrics label and whether it is timed (unary)."""
        self.flusher: Flusher = runtime.flusher
        self.connections: set[KubeletConnection] = set()
        self.routes: dict[str, Route] = {}
        intercepted = {spec.path: event for event, spec in events.items()}
        for method in known_methods():
            if method.path in intercepted:
                self.routes[method.path] = intercepted[method.path]
                continue
            observer = (observers or {}).get(method.name)
            unary = not (method.client_streaming or method.server_streaming)
            self.labels[method.path] = (method_label(method.path), unary)
            if unary and (observer is not None or record is not None):
                self.routes[method.path] = (observer, record)
            else:
                self.routes[method.path] = runtime.pool(method.is_image_service)
        self._server: asyncio.AbstractServer | None = None
        self._idle = asyncio.Event()

    async def start(self, path: Path, listener: socket.socket | None = None) -> None:
        """Serve on `listener` (bound at `path` already, proxy/early.py), else on a socket
        made at `path`."""
        loop = asyncio.get_running_loop()
        if listener is not None:
            self._server = await loop.create_unix_server(
                lambda: KubeletConnection(self), sock=listener
            )
            return
        self._server = await loop.create_unix_server(lambda: KubeletConnection(self), str(path))

    def forget(self, connection: KubeletConnection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._idle.set()

    async def stop(self, grace: float | None) -> None:
        """GOAWAY to every connection, let calls in flight finish for `grace` seconds, then
        reset what is left (both sides) and close."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        if self.connections and grace:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                busy = len(self.connections)
                log.warning("%d connection(s) still busy after the grace period", busy)
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()


_STATUS_NAMES = {str(code.value[0]): code.name for code in grpc.StatusCode}
"""`grpc-status` as grpc writes it → the code's name (an enum's `.name` is slow to read)."""


def _trailer_status(headers: list[Header]) -> tuple[str, str]:
    """The status name and origin the runtime's trailers (or trailers-only answer) carry
    (no `grpc-status`, or one grpc does not know: UNKNOWN, as grpc clients read it)."""
    code = "UNKNOWN"
    for name, value in headers:
        if name == "grpc-status":
            code = _STATUS_NAMES.get(value) or status_from_header(value).name  # ("00", "+0")
            break
    return code, "" if code == "OK" else "runtime"
