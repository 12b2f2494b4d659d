"""Serve a Hook as an out-of-process crihook plugin, with one call.

    from crihook.hooks import sdk
    from crihook.hooks.spec import Adjustment, Hook, HookContext

    class Pin(Hook):
        async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
            return Adjustment().set_cpuset_cpus("2-3")

    sdk.run(Pin(), "/run/crihook/plugins/pin.sock")   # blocks; SIGTERM/SIGINT stop it

The plugin answers Configure with the stages the hook implements, Synchronize by calling the
hook's optional `async synchronize(pods, containers) -> Sequence[ContainerUpdate] | None`,
and each stage (on the persistent Stream, or one unary RPC per stage) by decoding the CRI
request, calling the stage method with a HookContext and sending back its Adjustment.
`Reject` becomes the call's reject_reason; any other exception fails the call (the plugin
logs it with its traceback). Calls on the Stream run concurrently, each in its own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from crihook.grpc_tuning import CLASSIC_ENDPOINTS

# A plugin is one side of every hop: the cheaper endpoints (bench/README.md), unless the
# operator chose; before grpc loads.
os.environ.setdefault("GRPC_EXPERIMENTS", CLASSIC_ENDPOINTS)

import grpc
from google.protobuf.message import Message  # type: ignore[import-untyped, unused-ignore]

from crihook.api.cri.v1 import api_pb2
from crihook.api.hook.v1 import hook_pb2
from crihook.hooks.eager import BudgetExpired, bounded
from crihook.hooks.remote.convert import (
    adjustment_to_proto,
    container_from_proto,
    event_from_proto,
    pod_from_proto,
    stage_from_proto,
    subscriptions_to_proto,
    update_to_proto,
)
from crihook.hooks.spec.adjustment import Adjustment, ContainerUpdate
from crihook.hooks.spec.errors import Reject
from crihook.hooks.spec.events import Event, Stage, stage_method_name
from crihook.hooks.spec.hook import Hook, HookContext, subscriptions_of
from crihook.hooks.spec.views import ContainerView, PodView

__all__ = ["MemoryState", "PluginServer", "run", "serve"]

log = logging.getLogger(__name__)

SERVICE = "crihook.hook.v1.Plugin"
SOCKET_MODE = 0o660
DEFAULT_TIMEOUT = 1.0  # when crihook sent no budget (timeout_ms = 0)
# The hook is cancelled a little after crihook stops waiting, so a hung hook does not pile up
# tasks, while crihook still sees its own timeout first.
CANCEL_GRACE = 0.1
_MAX_MESSAGE = 64 << 20
_REQUESTS: dict[Event, type[Message]] = {e: getattr(api_pb2, f"{e.value}Request") for e in Event}
_RESPONSES: dict[Event, type[Message]] = {e: getattr(api_pb2, f"{e.value}Response") for e in Event}


StageMethod = Callable[[HookContext], Coroutine[Any, Any, Any]]


class MemoryState:
    """A HookState kept in memory: it lasts as long as the plugin process."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._data[key] = value

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self._data.items()))


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


class _StageFailed(Exception):
    """The hook raised (not Reject): a plugin failure, reported to crihook."""


class _Servicer:
    """The Plugin service around one hook."""

    def __init__(self, hook: Hook) -> None:
        self._hook = hook
        self._state = MemoryState()
        self._views = _ViewCache()
        self._subscriptions = subscriptions_of(hook)
        self._methods: dict[tuple[Event, Stage], StageMethod] = {
            (e, st): getattr(hook, stage_method_name(e, st)) for e, st in self._subscriptions
        }
        sync = getattr(hook, "synchronize", None)
        self._synchronize = sync if inspect.iscoroutinefunction(sync) else None

    def handler(self) -> grpc.GenericRpcHandler:
        stage_request = hook_pb2.StageRequest.FromString
        stage_response = hook_pb2.StageResponse.SerializeToString
        methods: dict[str, grpc.RpcMethodHandler] = {
            "Configure": grpc.unary_unary_rpc_method_handler(
                self.configure,
                request_deserializer=hook_pb2.ConfigureRequest.FromString,
                response_serializer=hook_pb2.ConfigureResponse.SerializeToString,
            ),
            "Synchronize": grpc.unary_unary_rpc_method_handler(
                self.synchronize,
                request_deserializer=hook_pb2.SynchronizeRequest.FromString,
                response_serializer=hook_pb2.SynchronizeResponse.SerializeToString,
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                self.stream, request_deserializer=stage_request, response_serializer=stage_response
            ),
        }
        for event in Event:
            for stage in Stage:
                name = stage.value.capitalize() + event.value
                methods[name] = grpc.unary_unary_rpc_method_handler(
                    self._unary_handler(event, stage),
                    request_deserializer=stage_request,
                    response_serializer=stage_response,
                )
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    # --- Configure / Synchronize --------------------------------------------------------------
    async def configure(
        self, request: hook_pb2.ConfigureRequest, context: grpc.aio.ServicerContext
    ) -> hook_pb2.ConfigureResponse:
        log.info(
            "configured by crihook %s as %s (protocol %s, timeout %d ms)",
            request.crihook_version,
            request.plugin_name,
            request.protocol_version,
            request.timeout_ms,
        )
        version = getattr(self._hook, "version", "")
        return hook_pb2.ConfigureResponse(
            subscriptions=subscriptions_to_proto(self._subscriptions),
            plugin_version=version if isinstance(version, str) else "",
        )

    async def synchronize(
        self, request: hook_pb2.SynchronizeRequest, context: grpc.aio.ServicerContext
    ) -> hook_pb2.SynchronizeResponse:
        if self._synchronize is None:
            return hook_pb2.SynchronizeResponse()
        pods = [pod_from_proto(p) for p in request.pods]
        containers = [container_from_proto(c) for c in request.containers]
        try:
            updates: Sequence[ContainerUpdate] | None = await self._synchronize(pods, containers)
        except Exception as exc:
            log.exception("synchronize failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"synchronize: {_describe(exc)}")
            raise  # not reached: abort raises
        return hook_pb2.SynchronizeResponse(updates=[update_to_proto(u) for u in updates or ()])

    # --- stages ---------------------------------------------------------------------------------
    def _unary_handler(
        self, event: Event, stage: Stage
    ) -> Callable[[hook_pb2.StageRequest, grpc.aio.ServicerContext], Awaitable[Any]]:
        async def handle(
            request: hook_pb2.StageRequest, context: grpc.aio.ServicerContext
        ) -> hook_pb2.StageResponse:
            if (event, stage) not in self._subscriptions:
                missing = f"the hook has no {stage_method_name(event, stage)}"
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, missing)
            try:
                return await self._answer(event, stage, request)
            except _StageFailed as exc:
                await context.abort(grpc.StatusCode.INTERNAL, str(exc))
                raise  # not reached: abort raises

        return handle

    async def stream(
        self, requests: AsyncIterator[hook_pb2.StageRequest], context: grpc.aio.ServicerContext
    ) -> None:
        write_lock = asyncio.Lock()  # grpc allows one write in flight per stream
        running: set[asyncio.Task[None]] = set()

        async def answer(request: hook_pb2.StageRequest) -> None:
            response = await self._answer_on_stream(request)
            try:
                async with write_lock:
                    await context.write(response)
            except (grpc.RpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
                log.debug("seq %d: crihook is gone, answer dropped (%s)", request.seq, exc)

        try:
            async for request in requests:
                task = asyncio.create_task(answer(request), name=f"crihook-sdk-seq-{request.seq}")
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)  # crihook closed its side: finish, then end
        finally:
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _answer_on_stream(self, request: hook_pb2.StageRequest) -> hook_pb2.StageResponse:
        try:
            event, stage = event_from_proto(request.event), stage_from_proto(request.stage)
        except ValueError as exc:
            return hook_pb2.StageResponse(seq=request.seq, error=str(exc))
        if (event, stage) not in self._subscriptions:
            error = f"the hook has no {stage_method_name(event, stage)}"
            return hook_pb2.StageResponse(seq=request.seq, error=error)
        try:
            return await self._answer(event, stage, request)
        except _StageFailed as exc:
            return hook_pb2.StageResponse(seq=request.seq, error=str(exc))

    async def _answer(
        self, event: Event, stage: Stage, request: hook_pb2.StageRequest
    ) -> hook_pb2.StageResponse:
        name = stage_method_name(event, stage)
        method = self._methods[(event, stage)]
        timeout = request.timeout_ms / 1000 if request.timeout_ms else DEFAULT_TIMEOUT
        try:
            ctx = _PluginContext(event, stage, request, self._views, self._state, timeout)
            result = await bounded(method(ctx), timeout + CANCEL_GRACE)
            if result is not None and not isinstance(result, Adjustment):
                raise TypeError(f"expected an Adjustment or None, got {type(result).__name__}")
            response = hook_pb2.StageResponse(seq=request.seq)
            if result:
                response.adjustment.CopyFrom(adjustment_to_proto(result))
            return response
        except Reject as exc:
            return hook_pb2.StageResponse(seq=request.seq, reject_reason=exc.reason or "rejected")
        except BudgetExpired:
            raise _StageFailed(f"{name} did not finish within {timeout * 1000:.0f} ms") from None
        except Exception as exc:
            log.exception("%s failed", name)
            raise _StageFailed(f"{name}: {_describe(exc)}") from exc


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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- the server ----------------------------------------------------------------------------------
class PluginServer:
    """A running plugin: `stop()` ends it (and closes the hook)."""

    def __init__(self, server: grpc.aio.Server, hook: Hook, socket_path: Path) -> None:
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
        await self._server.wait_for_termination()


async def serve(hook: Hook, socket_path: str | os.PathLike[str]) -> PluginServer:
    """Start serving `hook` on a unix socket (mode 0660) and return at once.

    A stale socket file is replaced; a socket a live process still serves, or a file that is
    not a socket, is an error (FileExistsError)."""
    path = Path(socket_path)
    await _clear_stale_socket(path)
    await hook.start()
    server = grpc.aio.server(
        handlers=[_Servicer(hook).handler()],
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ],
    )
    old_umask = os.umask(0o777 & ~SOCKET_MODE)  # the socket is created with the right mode
    try:
        server.add_insecure_port(f"unix://{path}")
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    await server.start()
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
