"""RemoteHook: the chain's side of one out-of-process plugin (a gRPC server on a unix socket).

    start() ─► connect loop (background task, backoff 0.1 s → 5 s):
                 check the socket (owned by root, not world-writable)
                 → Configure → subscriptions → Synchronize(snapshot()) → open the Stream
               ─► wait until the connection is lost ─► reconnect
    call(ctx) ─► one StageRequest on the Stream (matched by seq), or the stage's unary RPC
                 when the plugin does not implement Stream

Configure, Synchronize and the unary stage RPCs go through a grpc.aio channel. The Stream,
the hot path, has its own connection spoken directly in HTTP/2 (h2stream.py): a message
each way costs a write and a read on the event loop instead of two grpc.aio batches.

Errors are built-in exceptions, for the chain to map to gRPC statuses naming the hook:
ConnectionError (not connected, the stream broke), TimeoutError (no answer within
ctx.timeout), Reject (the plugin refused), RuntimeError (the plugin failed: an exception in
it), ValueError (its adjustment is invalid).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import grpc
import tenacity
from google.protobuf.message import DecodeError

from crihook import __version__
from crihook.api.hook.v1 import hook_pb2
from crihook.hooks.remote.convert import (
    adjustment_from_proto,
    container_to_proto,
    event_to_proto,
    pod_to_proto,
    stage_to_proto,
    subscriptions_from_proto,
    update_from_proto,
)
from crihook.hooks.remote.h2stream import GrpcStream, StreamEnded
from crihook.hooks.spec.adjustment import Adjustment, ContainerUpdate
from crihook.hooks.spec.errors import Forbidden, InvalidRequest, Reject
from crihook.hooks.spec.events import PLUGIN_STAGES, Event, Stage
from crihook.hooks.spec.hook import HookContext, SyncContext
from crihook.hooks.spec.views import ContainerState, ContainerView, PodView

__all__ = [
    "PROTOCOL_VERSION",
    "PluginSettings",
    "RemoteHook",
    "Snapshot",
    "StageRequestEncoder",
    "SyncUpdatesHandler",
    "check_socket",
    "stage_rpc_name",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "v1"
SERVICE = "crihook.hook.v1.Plugin"
CONFIGURE_TIMEOUT = 2.0
SYNCHRONIZE_TIMEOUT = 10.0
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0
TRUSTED_UID = 0
# A connection lost sooner than this counts as a flap: the next reconnect waits (backoff),
# so a plugin whose stream dies at once is not hammered with Configure/Synchronize.
FLAP_SECONDS = 1.0

_MAX_MESSAGE = 64 << 20  # a Synchronize of a busy node can exceed gRPC's 4 MiB default
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    # Our own connection per plugin: never share a subchannel with another RemoteHook.
    ("grpc.use_local_subchannel_pool", 1),
    # An idle channel would go IDLE and reconnect silently, skipping the socket check.
    ("grpc.client_idle_timeout_ms", 2**31 - 1),
)


class PluginSettings(Protocol):
    """What the client needs of a plugin's settings (crihook's HookSettings has it)."""

    @property
    def name(self) -> str: ...
    @property
    def endpoint(self) -> str | None: ...
    @property
    def timeout_ms(self) -> int: ...


Snapshot = Callable[
    [], tuple[Sequence[PodView], Sequence[ContainerView], Mapping[str, ContainerState]]
]
"""What crihook knows (pods, containers, container states), sent to the plugin on every
(re)connect."""
SyncUpdatesHandler = Callable[[str, tuple[ContainerUpdate, ...]], Awaitable[None]]
"""Receives (hook name, updates) a plugin asked for in its Synchronize answer."""


def stage_rpc_name(event: Event, stage: Stage) -> str:
    """The unary RPC of a stage: `PreCreateContainer`, ..."""
    return stage.value.capitalize() + event.value


def check_socket(path: str, trusted_uid: int = TRUSTED_UID) -> str | None:
    """Why crihook must not connect to this socket, or None if it may.

    A plugin adjusts containers as root sees fit; a socket someone else could have created
    or could replace would let them do the same."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"socket {path} does not exist (is the plugin running?)"
    except OSError as exc:
        return f"cannot stat socket {path}: {exc.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a unix socket"
    if st.st_uid != trusted_uid:
        return f"refusing socket {path}: owned by uid {st.st_uid}, not uid {trusted_uid}"
    if st.st_mode & 0o002:
        return f"refusing socket {path}: world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    # Whoever can write the directory can swap the socket between this check and connect():
    # the endpoint's directory, and the socket's own when the endpoint is a symlink to it.
    parents = dict.fromkeys([os.path.dirname(path) or ".", os.path.dirname(os.path.realpath(path))])
    for parent in parents:
        dst = os.stat(parent)
        if dst.st_uid != trusted_uid or dst.st_mode & 0o002:
            return (
                f"refusing socket {path}: its directory {parent} is owned by uid {dst.st_uid} "
                f"with mode {stat.S_IMODE(dst.st_mode):04o} (needs uid {trusted_uid}, "
                "not world-writable)"
            )
    return None


# --- StageRequest encoding ---------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _bytes_field(tag: bytes, data: bytes) -> bytes:
    return tag + _varint(len(data)) + data


def _tag(field_number: int) -> bytes:
    return _varint(field_number << 3 | 2)  # wire type 2: length-delimited


_POD_TAG = _tag(hook_pb2.StageRequest.POD_FIELD_NUMBER)
_CONTAINER_TAG = _tag(hook_pb2.StageRequest.CONTAINER_FIELD_NUMBER)
_REQUEST_TAG = _tag(hook_pb2.StageRequest.REQUEST_FIELD_NUMBER)
_RESPONSE_TAG = _tag(hook_pb2.StageRequest.RESPONSE_FIELD_NUMBER)
_EVENTS = {e: event_to_proto(e) for e in Event}
_STAGES = {s: stage_to_proto(s) for s in PLUGIN_STAGES}
_CACHE_SIZE = 256


class StageRequestEncoder:
    """Builds serialized StageRequests by concatenating encoded fields (a message is the
    concatenation of its fields): the CRI request and response are appended as bytes, and
    pod and container are encoded once per view object (views are frozen, and one view is
    sent to every plugin of a call and for every call of a pod)."""

    def __init__(self) -> None:
        self._views: dict[int, tuple[object, bytes]] = {}

    def encode(self, seq: int, ctx: HookContext) -> bytes:
        head = hook_pb2.StageRequest(
            seq=seq,
            event=_EVENTS[ctx.event],
            stage=_STAGES[ctx.stage],
            timeout_ms=min(max(1, int(ctx.timeout * 1000)), 2**32 - 1),
            failure=ctx.failure,
            owners=ctx.owners,
        )
        parts = [head.SerializeToString(), self._view(_POD_TAG, ctx.pod)]
        if ctx.container is not None:
            parts.append(self._view(_CONTAINER_TAG, ctx.container))
        parts.append(_bytes_field(_REQUEST_TAG, ctx.request_bytes()))
        if ctx.response is not None:
            parts.append(_bytes_field(_RESPONSE_TAG, ctx.response.SerializeToString()))
        return b"".join(parts)

    def _view(self, tag: bytes, view: PodView | ContainerView) -> bytes:
        hit = self._views.get(id(view))
        if hit is not None and hit[0] is view:  # the view is kept alive, so its id is its own
            return hit[1]
        msg = pod_to_proto(view) if isinstance(view, PodView) else container_to_proto(view)
        data = _bytes_field(tag, msg.SerializeToString())
        if len(self._views) >= _CACHE_SIZE:
            del self._views[next(iter(self._views))]  # the oldest
        self._views[id(view)] = (view, data)
        return data


def _result(response: hook_pb2.StageResponse) -> Adjustment | None:
    if response.reject_reason:
        if response.reject_invalid:
            raise InvalidRequest(response.reject_reason)
        if response.reject_forbidden:
            raise Forbidden(response.reject_reason)
        raise Reject(response.reject_reason)
    if response.error:
        raise RuntimeError(f"plugin failed: {response.error}")
    if not response.HasField("adjustment"):
        return None
    try:
        adjustment = adjustment_from_proto(response.adjustment)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"plugin returned an invalid adjustment: {exc}") from exc
    return adjustment or None


# --- one live connection -----------------------------------------------------------------------
class _UseUnary(Exception):
    """The plugin has no Stream: the call never reached a handler, send it unary."""


class _Connection:
    """A configured, synchronized channel; lost for good once `lost` is set."""

    def __init__(
        self,
        name: str,
        channel: grpc.aio.Channel,
        encoder: StageRequestEncoder,
        socket_path: str,
    ) -> None:
        self.name = name
        self.channel = channel
        self._socket_path = socket_path
        self._encode = encoder.encode
        self.lost = asyncio.Event()
        self.reason = ""
        self.since = time.monotonic()
        self.streaming = True
        self._seq = itertools.count(1)
        self._pending: dict[int, asyncio.Future[hook_pb2.StageResponse]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stream: GrpcStream | None = None
        # Multicallables built once: a call only serializes and sends.
        self._unary = {
            (e, s): channel.unary_unary(
                f"/{SERVICE}/{stage_rpc_name(e, s)}",
                response_deserializer=hook_pb2.StageResponse.FromString,
            )
            for e in Event
            for s in PLUGIN_STAGES
        }

    async def open_stream(self) -> None:
        self._stream = await GrpcStream.open(
            self._socket_path, f"/{SERVICE}/Stream", self._on_message, self._on_end
        )

    def _spawn(self, coro: Awaitable[None], role: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"crihook-plugin-{self.name}-{role}")
        self._tasks.append(task)

    def lose(self, reason: str) -> None:
        """Mark the connection dead and fail every call waiting on it."""
        if self.lost.is_set():
            return
        self.reason = reason
        self.lost.set()
        self._fail_pending(lambda: ConnectionError(f"plugin connection lost: {reason}"))

    def _fail_pending(self, error: Callable[[], BaseException]) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error())  # one exception per caller: each gets a traceback

    async def close(self) -> None:
        self.lose("closed")
        if self._stream is not None:
            self._stream.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.channel.close()

    # --- the stream (callbacks from GrpcStream, on the event loop) -----------------------------
    def _on_message(self, data: bytes) -> None:
        try:
            response = hook_pb2.StageResponse.FromString(data)
        except DecodeError as exc:
            self.lose(f"the plugin sent an undecodable StageResponse: {exc}")
            return
        future = self._pending.pop(response.seq, None)
        if future is not None and not future.done():
            future.set_result(response)
        # else: the caller gave up (timeout) before the answer came

    def _on_end(self, code: grpc.StatusCode, details: str) -> None:
        if self.lost.is_set():
            return
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self._use_unary()
        elif code == grpc.StatusCode.OK:
            self.lose("the plugin ended the stream")
        else:
            self.lose(f"stream broke: {code.name}: {details}")

    def _use_unary(self) -> None:
        log.info("plugin %s does not implement Stream; calling it per stage (unary)", self.name)
        self.streaming = False
        self._fail_pending(_UseUnary)
        # No stream left to notice a dead plugin: watch the channel instead.
        self._spawn(self._watch_channel(), "watch")

    async def _watch_channel(self) -> None:
        state = self.channel.get_state(try_to_connect=False)
        while state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.CONNECTING):
            await self.channel.wait_for_state_change(state)
            state = self.channel.get_state(try_to_connect=False)
        self.lose(f"channel {state.name.lower()}")

    # --- calls ----------------------------------------------------------------------------------
    async def call(self, ctx: HookContext) -> Adjustment | None:
        budget = ctx.timeout
        if self.streaming:
            started = time.monotonic()
            try:
                return await self._call_stream(ctx)
            except _UseUnary:
                # Resent unary, within what is left: the call as a whole keeps ctx.timeout.
                budget = max(ctx.timeout - (time.monotonic() - started), 0.001)
        return await self._call_unary(ctx, budget)

    async def _call_stream(self, ctx: HookContext) -> Adjustment | None:
        assert self._stream is not None, "calls start after open_stream()"
        seq = next(self._seq)
        data = self._encode(seq, ctx)
        future: asyncio.Future[hook_pb2.StageResponse] = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        try:
            self._stream.send(data)
            async with asyncio.timeout(ctx.timeout):
                response = await future
        except TimeoutError:
            raise TimeoutError(f"plugin did not answer within {_ms(ctx.timeout)}") from None
        except StreamEnded:
            reason = self.reason or "the stream ended"
            raise ConnectionError(f"plugin connection lost: {reason}") from None
        finally:
            self._pending.pop(seq, None)
        return _result(response)

    async def _call_unary(self, ctx: HookContext, budget: float) -> Adjustment | None:
        method = self._unary[(ctx.event, ctx.stage)]
        try:
            response = await method(self._encode(0, ctx), timeout=budget)
        except grpc.aio.AioRpcError as exc:
            raise self._unary_error(exc, ctx) from None
        return _result(response)

    def _unary_error(self, exc: grpc.aio.AioRpcError, ctx: HookContext) -> Exception:
        code, details = exc.code(), exc.details()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return TimeoutError(f"plugin did not answer within {_ms(ctx.timeout)}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            self.lose(f"{code.name}: {details}")
            return ConnectionError(f"plugin connection lost: {code.name}: {details}")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return RuntimeError(f"plugin does not implement {stage_rpc_name(ctx.event, ctx.stage)}")
        return RuntimeError(f"plugin failed: {code.name}: {details}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


class _ConnectFailed(Exception):
    pass


# --- the hook ----------------------------------------------------------------------------------
class RemoteHook:
    """One out-of-process plugin as a ChainHook. Connection problems never raise from
    start(); they show in `connected`/`last_error` and fail calls with ConnectionError."""

    bounds_own_calls = True  # every call ends by ctx.timeout: the chain adds no timer of its own
    honours_exemption = True  # a plugin's own pods must never wait on that plugin
    sets = None  # a plugin declares nothing: the defaults, narrowed by its drop-in's allow

    def __init__(
        self,
        settings: PluginSettings,
        snapshot: Snapshot,
        *,
        on_sync_updates: SyncUpdatesHandler | None = None,
    ) -> None:
        if not settings.endpoint:
            raise ValueError(f"hook {settings.name!r} has no endpoint (unix:///path)")
        self.name = settings.name
        self.endpoint = settings.endpoint
        self.socket_path = settings.endpoint.removeprefix("unix://")
        self.last_error = "not started"
        self._settings = settings
        self._snapshot = snapshot
        self._on_sync_updates = on_sync_updates
        self._subscriptions: frozenset[tuple[Event, Stage]] = frozenset()
        self._conn: _Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._flaps = 0
        self._encoder = StageRequestEncoder()

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.lost.is_set()

    @property
    def streaming(self) -> bool:
        """True while calls go over the Stream (False: unary fallback, or not connected)."""
        return self.connected and self._conn is not None and self._conn.streaming

    def subscriptions(self) -> frozenset[tuple[Event, Stage]]:
        """The last Configure answer: kept while the plugin is down, so the chain still
        routes its stages here and applies the failure policy."""
        return self._subscriptions

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"crihook-plugin-{self.name}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.last_error = "closed"

    async def call(self, ctx: HookContext) -> Adjustment | None:
        conn = self._conn
        if conn is None or conn.lost.is_set():
            raise ConnectionError(f"plugin not connected: {self.last_error}")
        return await conn.call(ctx)

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        """Tell a connected plugin what crihook learnt (a reconcile); returns the updates it
        asks for. A plugin that is not connected is synchronized when it connects."""
        conn = self._conn
        if conn is None or conn.lost.is_set():
            return ()
        request = _sync_request(sync.pods, sync.containers, sync.container_states)
        try:
            return await _call_synchronize(conn.channel, request)
        except grpc.aio.AioRpcError as exc:
            msg = f"Synchronize failed: {exc.code().name}: {exc.details()}"
            raise ConnectionError(msg) from None

    # --- connect loop ----------------------------------------------------------------------
    async def _run(self) -> None:
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(
                multiplier=BACKOFF_MIN, min=BACKOFF_MIN, max=BACKOFF_MAX
            ),
            retry=tenacity.retry_if_exception_type(_ConnectFailed),
        )
        conn: _Connection | None = None  # the live connection, for the finally
        try:
            while True:
                live: _Connection = await retrying(self._connect)
                conn = self._conn = live
                self.last_error = ""
                log.info("plugin %s connected on %s", self.name, self.endpoint)
                await live.lost.wait()
                self._conn = None
                self.last_error = live.reason
                log.warning("plugin %s disconnected: %s; reconnecting", self.name, live.reason)
                await live.close()
                conn = None
                await asyncio.sleep(self._flap_delay(live))
        finally:
            self._conn = None
            if conn is not None:  # close() is idempotent: also after an interrupted close
                await conn.close()

    def _flap_delay(self, conn: _Connection) -> float:
        if time.monotonic() - conn.since >= FLAP_SECONDS:
            self._flaps = 0
            return 0.0
        self._flaps += 1
        return float(min(BACKOFF_MAX, BACKOFF_MIN * 2**self._flaps))

    def _fail(self, message: str, level: int) -> _ConnectFailed:
        # Log a problem when it changes, not on every retry of the backoff.
        if message != self.last_error:
            log.log(level, "plugin %s: %s", self.name, message)
        self.last_error = message
        return _ConnectFailed(message)

    async def _connect(self) -> _Connection:
        problem = check_socket(self.socket_path)
        if problem is not None:
            refused = problem.startswith("refusing")
            raise self._fail(problem, logging.ERROR if refused else logging.WARNING)
        channel = grpc.aio.insecure_channel(self.endpoint, options=_CHANNEL_OPTIONS)
        try:
            conn = _Connection(self.name, channel, self._encoder, self.socket_path)
            await self._configure(channel)
            await self._synchronize(channel)
            await conn.open_stream()
            return conn
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            raise self._fail(f"{exc.code().name}: {exc.details()}", logging.WARNING) from None
        except (OSError, TimeoutError) as exc:  # the Stream's own connection
            await channel.close()
            raise self._fail(f"opening the stream failed: {exc!r}", logging.WARNING) from None
        except BaseException:
            await channel.close()
            raise

    async def _configure(self, channel: grpc.aio.Channel) -> None:
        configure = channel.unary_unary(
            f"/{SERVICE}/Configure",
            request_serializer=hook_pb2.ConfigureRequest.SerializeToString,
            response_deserializer=hook_pb2.ConfigureResponse.FromString,
        )
        request = hook_pb2.ConfigureRequest(
            protocol_version=PROTOCOL_VERSION,
            crihook_version=__version__,
            plugin_name=self.name,
            timeout_ms=self._settings.timeout_ms,
        )
        answer = await configure(request, timeout=CONFIGURE_TIMEOUT)
        subs, unknown = subscriptions_from_proto(answer.subscriptions)
        if unknown:
            log.warning(
                "plugin %s subscribed to %d stage(s) this crihook does not know; ignored",
                self.name,
                len(unknown),
            )
        self._subscriptions = subs

    async def _synchronize(self, channel: grpc.aio.Channel) -> None:
        try:
            request = _sync_request(*self._snapshot())
        except Exception as exc:  # a bug in the snapshot must not kill the connect loop
            log.exception("plugin %s: building the Synchronize snapshot failed", self.name)
            raise self._fail(f"snapshot failed: {exc!r}", logging.ERROR) from exc
        updates = await _call_synchronize(channel, request)
        if not updates:
            return
        if self._on_sync_updates is None:
            log.warning(
                "plugin %s asked for %d container update(s) at Synchronize; "
                "nothing applies them here",
                self.name,
                len(updates),
            )
            return
        await self._on_sync_updates(self.name, updates)


async def _call_synchronize(
    channel: grpc.aio.Channel, request: hook_pb2.SynchronizeRequest
) -> tuple[ContainerUpdate, ...]:
    synchronize = channel.unary_unary(
        f"/{SERVICE}/Synchronize",
        request_serializer=hook_pb2.SynchronizeRequest.SerializeToString,
        response_deserializer=hook_pb2.SynchronizeResponse.FromString,
    )
    answer = await synchronize(request, timeout=SYNCHRONIZE_TIMEOUT)
    return tuple(update_from_proto(u) for u in answer.updates)


def _sync_request(
    pods: Sequence[PodView],
    containers: Sequence[ContainerView],
    states: Mapping[str, ContainerState],
) -> hook_pb2.SynchronizeRequest:
    return hook_pb2.SynchronizeRequest(
        pods=[pod_to_proto(p) for p in pods],
        containers=[container_to_proto(c) for c in containers],
        container_states={cid: state.value for cid, state in states.items()},
    )
