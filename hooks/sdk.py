"""Serve a Hook as an out-of-process crihook plugin, with one call.

    from crihook.hooks import sdk
    from crihook.hooks.spec import Adjustment, Hook, HookContext

    class Pin(Hook):
        async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
            return Adjustment().set_cpuset_cpus("2-3")

    sdk.run(Pin(), "/run/crihook/plugins/pin.sock")   # blocks; SIGTERM/SIGINT stop it

The plugin answers Configure with the stages the hook implements, Synchronize by calling the
hook's `async synchronize(sync: SyncContext) -> Sequence[ContainerUpdate] | None` (the pods,
containers and container states crihook knows; the plugin's in-memory state; this machine's
topology), and each stage (on the persistent Stream, or one unary RPC per stage) by decoding the CRI
request, calling the stage method with a HookContext and sending back its Adjustment.
`Reject` becomes the call's reject_reason (`InvalidRequest` with reject_invalid, `Forbidden`
with reject_forbidden); a failed stage's answer is ignored by crihook; any other exception
fails the call (the plugin logs it with its traceback). Calls on the Stream run concurrently:
a hook that answers without waiting is answered at once, one that waits continues in its own
task.

The server is crihook.hooks.remote.sdk_server: gRPC spoken directly over HTTP/2, so that a
call on the Stream costs the plugin a read and a write instead of two grpc.aio batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped, unused-ignore]

from crihook.api.cri.v1 import api_pb2
from crihook.api.hook.v1 import hook_pb2
from crihook.hooks.eager import BudgetExpired, first_step, resume
from crihook.hooks.node import LinuxHost, Topology, TopologyError, read_topology
from crihook.hooks.remote.convert import (
    adjustment_to_proto,
    container_from_proto,
    event_from_proto,
    pod_from_proto,
    stage_from_proto,
    subscriptions_to_proto,
    update_to_proto,
)
from crihook.hooks.remote.sdk_server import (
    BidiCall,
    BidiHandler,
    GrpcServer,
    RpcError,
    UnaryHandler,
)
from crihook.hooks.spec.adjustment import Adjustment
from crihook.hooks.spec.errors import Forbidden, InvalidRequest, Reject
from crihook.hooks.spec.events import PLUGIN_STAGES, Event, Stage, stage_method_name
from crihook.hooks.spec.hook import DictState, Hook, HookContext, SyncContext, subscriptions_of
from crihook.hooks.spec.views import ContainerState, ContainerView, PodView

__all__ = ["MemoryState", "PluginServer", "run", "serve"]

log = logging.getLogger(__name__)

SERVICE = "crihook.hook.v1.Plugin"
SOCKET_MODE = 0o660
DEFAULT_TIMEOUT = 1.0  # when crihook sent no budget (timeout_ms = 0)
# The hook is cancelled a little after crihook stops waiting, so a hung hook does not pile up
# tasks, while crihook still sees its own timeout first.
CANCEL_GRACE = 0.1
_REQUESTS: dict[Event, type[Message]] = {e: getattr(api_pb2, f"{e.value}Request") for e in Event}
_RESPONSES: dict[Event, type[Message]] = {e: getattr(api_pb2, f"{e.value}Response") for e in Event}


StageMethod = Callable[[HookContext], Coroutine[Any, Any, Any]]


class MemoryState(DictState):
    """A HookState kept in memory: it lasts as long as the plugin process."""


class _ViewCache:
    """Decoded pod/container views by their encoding: crihook sends the same pod with every
    call of its containers, and decoding maps into frozen views is the plugin's main cost."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._views: dict[bytes, Any] = {}

    def pod(self, msg: hook_pb2.Pod) -> PodView:
        view: PodView = self._get(msg, pod_from_proto)
        return view

    def container(self, msg: hook_pb2.Container) -> ContainerView:
        view: ContainerView = self._get(msg, container_from_proto)
        return view

    def _get(self, msg: Message, decode: Callable[[Any], Any]) -> Any:
        key = msg.SerializeToString()
        view = self._views.get(key)
        if view is None:
            view = decode(msg)
            if len(self._views) >= self._size:
                del self._views[next(iter(self._views))]  # the oldest
            self._views[key] = view
        return view


# A stage call's answer: given at once, or still to come (a coroutine to run in a task).
Answer: TypeAlias = "hook_pb2.StageResponse | Coroutine[Any, Any, hook_pb2.StageResponse]"


class _Servicer:
    """The Plugin service around one hook."""

    def __init__(self, hook: Hook, sysfs_root: Path = Path("/sys")) -> None:
        self._hook = hook
        self._state = MemoryState()
        self._views = _ViewCache()
        self._subscriptions = subscriptions_of(hook)
        in_process = {(e, s) for e, s in self._subscriptions if s not in PLUGIN_STAGES}
        if in_process:
            names = ", ".join(sorted(stage_method_name(e, s) for e, s in in_process))
            raise ValueError(f"{names}: hints stages run only in-process, not in a plugin")
        self._methods: dict[tuple[Event, Stage], StageMethod] = {
            (e, st): getattr(hook, stage_method_name(e, st)) for e, st in self._subscriptions
        }
        self._sysfs_root = sysfs_root
        self._node: Topology | None = None

    def routes(self) -> tuple[dict[str, UnaryHandler], dict[str, BidiHandler]]:
        """The Plugin service's methods by path: unary ones and the bidi Stream."""
        unary: dict[str, UnaryHandler] = {
            f"/{SERVICE}/Configure": self.configure,
            f"/{SERVICE}/Synchronize": self.synchronize,
        }
        for event in Event:
            for stage in PLUGIN_STAGES:
                name = stage.value.capitalize() + event.value
                unary[f"/{SERVICE}/{name}"] = self._unary_handler(event, stage)
        return unary, {f"/{SERVICE}/Stream": lambda call: _StreamSession(self, call)}

    # --- Configure / Synchronize --------------------------------------------------------------
    async def configure(self, data: bytes) -> bytes:
        request = _decode(hook_pb2.ConfigureRequest, data)
        log.info(
            "configured by crihook %s as %s (protocol %s, timeout %d ms)",
            request.crihook_version,
            request.plugin_name,
            request.protocol_version,
            request.timeout_ms,
        )
        version = self._hook.version  # declared on Hook; a plugin may still set a non-str
        return hook_pb2.ConfigureResponse(
            subscriptions=subscriptions_to_proto(self._subscriptions),
            plugin_version=version if isinstance(version, str) else "",
        ).SerializeToString()

    async def synchronize(self, data: bytes) -> bytes:
        request = _decode(hook_pb2.SynchronizeRequest, data)
        sync = SyncContext(
            state=self._state,
            node=self._topology(),
            host=LinuxHost(),
            runtime=_NoRuntime(),
            pods=[pod_from_proto(p) for p in request.pods],
            containers=[container_from_proto(c) for c in request.containers],
            container_states=_states(request.container_states),
        )
        try:
            updates = await self._hook.synchronize(sync)
        except Exception as exc:
            log.exception("synchronize failed")
            raise RpcError(grpc.StatusCode.INTERNAL, f"synchronize: {_describe(exc)}") from exc
        response = hook_pb2.SynchronizeResponse(updates=[update_to_proto(u) for u in updates or ()])
        return response.SerializeToString()

    def _topology(self) -> Topology:
        """This machine's topology, read once; an empty one (logged) where sysfs is unusable,
        so a plugin that does not need it still runs."""
        if self._node is None:
            try:
                self._node = read_topology(self._sysfs_root)
            except TopologyError as exc:
                log.warning("no node topology for synchronize: %s", exc)
                self._node = Topology.build(())
        return self._node

    # --- stages ---------------------------------------------------------------------------------
    def _unary_handler(self, event: Event, stage: Stage) -> UnaryHandler:
        async def handle(data: bytes) -> bytes:
            if (event, stage) not in self._subscriptions:
                missing = f"the hook has no {stage_method_name(event, stage)}"
                raise RpcError(grpc.StatusCode.UNIMPLEMENTED, missing)
            try:
                request = hook_pb2.StageRequest.FromString(data)
            except DecodeError as exc:
                raise RpcError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"bad StageRequest: {exc}"
                ) from exc
            answer = self._begin(event, stage, request)
            response = answer if isinstance(answer, hook_pb2.StageResponse) else await answer
            if response.error:
                raise RpcError(grpc.StatusCode.INTERNAL, response.error)
            return response.SerializeToString()

        return handle

    def answer_on_stream(self, request: hook_pb2.StageRequest) -> Answer:
        try:
            event, stage = event_from_proto(request.event), stage_from_proto(request.stage)
        except ValueError as exc:
            return hook_pb2.StageResponse(seq=request.seq, error=str(exc))
        if (event, stage) not in self._subscriptions:
            error = f"the hook has no {stage_method_name(event, stage)}"
            return hook_pb2.StageResponse(seq=request.seq, error=error)
        return self._begin(event, stage, request)

    def _begin(self, event: Event, stage: Stage, request: hook_pb2.StageRequest) -> Answer:
        """Call the stage method. Its answer, if it gives one without waiting (most do, and
        then cost no task and no timer); else a coroutine that finishes the call, to be run
        in a task: the method's budget (`timeout_ms`) applies from here."""
        timeout = request.timeout_ms / 1000 if request.timeout_ms else DEFAULT_TIMEOUT
        started = time.perf_counter()
        try:
            ctx = _PluginContext(event, stage, request, self._views, self._state, timeout)
            coro = self._methods[(event, stage)](ctx)
            done, value = first_step(coro)
            if done:
                return self._answered(event, stage, request, value)
        except Exception as exc:
            return self._failed(event, stage, request, exc)
        return self._finish(
            event, stage, request, resume(coro, value, timeout + CANCEL_GRACE, started)
        )

    async def _finish(
        self,
        event: Event,
        stage: Stage,
        request: hook_pb2.StageRequest,
        rest: Coroutine[Any, Any, Any],
    ) -> hook_pb2.StageResponse:
        try:
            result = await rest
        except Exception as exc:
            return self._failed(event, stage, request, exc)
        return self._answered(event, stage, request, result)

    def _answered(
        self, event: Event, stage: Stage, request: hook_pb2.StageRequest, result: object
    ) -> hook_pb2.StageResponse:
        if result is not None and not isinstance(result, Adjustment):
            error = TypeError(f"expected an Adjustment or None, got {type(result).__name__}")
            return self._failed(event, stage, request, error)
        response = hook_pb2.StageResponse(seq=request.seq)
        if result:
            response.adjustment.CopyFrom(adjustment_to_proto(result))
        return response

    def _failed(
        self, event: Event, stage: Stage, request: hook_pb2.StageRequest, exc: Exception
    ) -> hook_pb2.StageResponse:
        """A Reject becomes the reject reason; any other failure, the error."""
        if isinstance(exc, Reject):
            return hook_pb2.StageResponse(
                seq=request.seq,
                reject_reason=exc.reason or "rejected",
                reject_invalid=isinstance(exc, InvalidRequest),
                reject_forbidden=isinstance(exc, Forbidden),
            )
        name = stage_method_name(event, stage)
        if isinstance(exc, BudgetExpired):
            timeout = request.timeout_ms or DEFAULT_TIMEOUT * 1000
            error = f"{name} did not finish within {timeout:.0f} ms"
        else:
            log.error("%s failed", name, exc_info=exc)
            error = f"{name}: {_describe(exc)}"
        return hook_pb2.StageResponse(seq=request.seq, error=error)


class _StreamSession:
    """The plugin's side of crihook's Stream: each StageRequest is answered as soon as its
    hook returns. A hook that answers without waiting is run inline, in the read callback;
    one that waits continues in a task, so calls on the stream run concurrently."""

    def __init__(self, servicer: _Servicer, call: BidiCall) -> None:
        self._servicer = servicer
        self._call = call
        self._running: set[asyncio.Task[None]] = set()
        self._half_closed = False

    def message(self, data: bytes) -> None:
        try:
            request = hook_pb2.StageRequest.FromString(data)
        except DecodeError as exc:
            self._call.finish(grpc.StatusCode.INVALID_ARGUMENT, f"bad StageRequest: {exc}")
            return
        answer = self._servicer.answer_on_stream(request)
        if isinstance(answer, hook_pb2.StageResponse):
            self._call.send(answer.SerializeToString())
            return
        task = asyncio.ensure_future(self._later(answer))
        self._running.add(task)
        task.add_done_callback(self._done)

    async def _later(self, answer: Awaitable[hook_pb2.StageResponse]) -> None:
        response = await answer
        self._call.send(response.SerializeToString())

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("answering on the stream failed: %r", task.exception())
        if self._half_closed and not self._running:
            self._call.finish()

    def half_closed(self) -> None:
        """crihook closed its side: finish what runs, then end the call."""
        self._half_closed = True
        if not self._running:
            self._call.finish()

    def cancelled(self) -> None:
        for task in list(self._running):
            task.cancel()


class _PluginContext(HookContext):
    """The HookContext of one stage call in a plugin. The views and CRI messages are decoded
    from the StageRequest on first use, so a hook pays only for what it reads; `request` is
    the call's own decoded message (no copy needed: nobody else holds it)."""

    __slots__ = ("_cache", "_msg", "_views")

    def __init__(
        self,
        event: Event,
        stage: Stage,
        msg: hook_pb2.StageRequest,
        views: _ViewCache,
        state: MemoryState,
        timeout: float,
    ) -> None:
        # The base initialiser would assign the views eagerly; these are its other slots.
        self.event, self.stage, self.state, self.timeout = event, stage, state, timeout
        self.affinity = None  # topology hints are merged in-process only
        self.failure = msg.failure
        self.owners = dict(msg.owners)
        self._msg = msg
        self._views = views
        self._cache: dict[str, Any] = {}

    def _decoded(self, name: str) -> Any:
        value = self._cache.get(name, self)
        if value is self:
            value = self._cache[name] = getattr(self, f"_decode_{name}")()
        return value

    @property
    def pod(self) -> PodView:  # type: ignore[override]
        view: PodView = self._decoded("pod")
        return view

    @property
    def container(self) -> ContainerView | None:  # type: ignore[override]
        view: ContainerView | None = self._decoded("container")
        return view

    @property
    def request(self) -> Message:
        message: Message = self._decoded("request")
        return message

    @property
    def response(self) -> Message | None:  # type: ignore[override]
        message: Message | None = self._decoded("response")
        return message

    def request_bytes(self) -> bytes:
        data: bytes = self._msg.request
        return data

    def _decode_pod(self) -> PodView:
        return self._views.pod(self._msg.pod)

    def _decode_container(self) -> ContainerView | None:
        if not self._msg.HasField("container"):
            return None
        return self._views.container(self._msg.container)

    def _decode_request(self) -> Message:
        return _REQUESTS[self.event].FromString(self._msg.request)

    def _decode_response(self) -> Message | None:
        if self.stage is not Stage.POST:
            return None
        return _RESPONSES[self.event].FromString(self._msg.response)


class _NoRuntime:
    """A plugin has no seam to the runtime: it asks crihook nothing on the call path."""

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        raise RuntimeError("plugins cannot query the runtime; use the Synchronize snapshot")

    async def sandbox_netns(self, pod_id: str) -> str | None:
        raise RuntimeError("plugins cannot query the runtime; use the Synchronize snapshot")

    async def oom_score_adj(self, container_id: str) -> int | None:
        raise RuntimeError("plugins cannot query the runtime; use the Synchronize snapshot")


def _states(raw: Mapping[str, str]) -> dict[str, ContainerState]:
    known = {s.value for s in ContainerState}
    return {
        cid: ContainerState(v) if v in known else ContainerState.UNKNOWN for cid, v in raw.items()
    }


def _decode(kind: Any, data: bytes) -> Any:
    """`kind` parsed from `data`; INVALID_ARGUMENT naming the message when it is not one."""
    try:
        return kind.FromString(data)
    except DecodeError as exc:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"bad {kind.__name__}: {exc}") from exc


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- the server ----------------------------------------------------------------------------------
class PluginServer:
    """A running plugin: `stop()` ends it (and closes the hook)."""

    def __init__(self, server: GrpcServer, hook: Hook, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._server = server
        self._hook = hook
        self._stopping = False

    async def stop(self, grace: float | None = 1.0) -> None:
        """Refuse new calls, let calls in flight finish for `grace` seconds, then cancel them
        and close the hook. A second stop with a shorter grace (None: none) cuts it short."""
        first = not self._stopping
        self._stopping = True
        await self._server.stop(grace)
        if not first:
            return
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                self.socket_path.unlink()
        await self._hook.close()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


async def serve(hook: Hook, socket_path: str | os.PathLike[str]) -> PluginServer:
    """Start serving `hook` on a unix socket (mode 0660) and return at once.

    A stale socket file is replaced; a socket a live process still serves, or a file that is
    not a socket, is an error (FileExistsError)."""
    path = Path(socket_path)
    await _clear_stale_socket(path)
    await hook.start()
    unary, bidi = _Servicer(hook).routes()
    server = GrpcServer(unary, bidi)
    old_umask = os.umask(0o777 & ~SOCKET_MODE)  # the socket is created with the right mode
    try:
        await server.start(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    log.info("serving %s on %s", type(hook).__name__, path)
    return PluginServer(server, hook, path)


async def _clear_stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(probe, str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # nobody listens: a leftover of a dead plugin
        return
    finally:
        probe.close()
    raise FileExistsError(f"{path} is served by a running process")


def run(hook: Hook, socket_path: str | os.PathLike[str], *, grace: float = 5.0) -> None:
    """Serve `hook` until SIGTERM or SIGINT (blocking; uvloop when installed).

    The first signal stops accepting calls and lets those in flight finish for `grace`
    seconds; a second one stops at once."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but optional here
        asyncio.run(_serve_until_signal(hook, socket_path, grace))
    else:
        uvloop.run(_serve_until_signal(hook, socket_path, grace))


async def _serve_until_signal(
    hook: Hook, socket_path: str | os.PathLike[str], grace: float
) -> None:
    loop = asyncio.get_running_loop()
    first, second = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (second if first.is_set() else first).set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    server = await serve(hook, socket_path)
    await first.wait()
    log.info("stopping; calls in flight may finish for %.1f s", grace)
    graceful = asyncio.create_task(server.stop(grace), name="crihook-sdk-stop")
    interrupt = asyncio.create_task(second.wait(), name="crihook-sdk-second-signal")
    done, _ = await asyncio.wait({graceful, interrupt}, return_when=asyncio.FIRST_COMPLETED)
    if graceful not in done:
        log.info("second signal: cancelling calls in flight")
        await server.stop(None)
    interrupt.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await interrupt
    await graceful
