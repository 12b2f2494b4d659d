"""RemoteHook against real plugins over unix sockets: the annotate example as a subprocess,
small plugins served in-process with the SDK, and a hand-made server without Stream."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket as socket_module
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.api.hook.v1 import hook_pb2
from crihook.hooks import sdk
from crihook.hooks.examples.annotate import AnnotateHook, parse_options
from crihook.hooks.remote.client import RemoteHook
from crihook.hooks.remote.convert import adjustment_to_proto, subscriptions_to_proto
from crihook.hooks.spec import (
    Adjustment,
    ContainerState,
    ContainerUpdate,
    ContainerView,
    Event,
    Forbidden,
    Hook,
    HookContext,
    InvalidRequest,
    PodView,
    Reject,
    ResourceDelta,
    Stage,
    SyncContext,
)
from crihook.hooks.spec.views import container_view_from_config, pod_view_from_config
from crihook.proxy.config import HookSettings

KEY, VALUE = "example.com/annotated", "yes"
WAIT = 15.0  # generous upper bound for "eventually" on a loaded 2-CPU machine

Snapshot = tuple[Sequence[PodView], Sequence[ContainerView], Mapping[str, ContainerState]]


# --- helpers -------------------------------------------------------------------------------------
async def eventually(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)
    assert predicate(), what


def create_request(name: str = "app") -> api_pb2.CreateContainerRequest:
    sandbox = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="web", uid="u-1", namespace="prod"),
        labels={"app": "web"},
        linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/podu-1"),
    )
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=name),
        image=api_pb2.ImageSpec(image="busybox:1.36"),
        labels={"io.kubernetes.container.name": name},
        annotations={"io.kubernetes.container.restartCount": "0"},
        envs=[api_pb2.KeyValue(key="LANG", value=b"C.UTF-8")],
        linux=api_pb2.LinuxContainerConfig(
            resources=api_pb2.LinuxContainerResources(
                cpu_shares=256, cpu_quota=50_000, cpu_period=100_000, memory_limit_in_bytes=1 << 28
            )
        ),
    )
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id="sandbox1", config=config, sandbox_config=sandbox
    )


def create_ctx(name: str = "app", timeout: float = 2.0) -> HookContext:
    request = create_request(name)
    pod = pod_view_from_config("sandbox1", request.sandbox_config)
    container = container_view_from_config("", pod, request.config)
    return HookContext(
        Event.CREATE_CONTAINER,
        Stage.PRE,
        pod,
        container,
        request,
        None,
        sdk.MemoryState(),
        timeout,
    )


def post_create_ctx(container_id: str) -> HookContext:
    ctx = create_ctx()
    return HookContext(
        Event.CREATE_CONTAINER,
        Stage.POST,
        ctx.pod,
        ctx.container,
        ctx.request,
        api_pb2.CreateContainerResponse(container_id=container_id),
        sdk.MemoryState(),
        2.0,
    )


def annotated(key: str = KEY, value: str = VALUE) -> Adjustment:
    return Adjustment().set_annotation(key, value)


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Autouse, so set up first and torn down last: after every other fixture has stopped
    what it started, no task of the test may be left running."""
    before = asyncio.all_tasks()
    yield

    def leaked() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]

    # grpc's own bookkeeping tasks of a finished call need a few loop iterations to end.
    for _ in range(100):
        if not leaked():
            break
        await asyncio.sleep(0.01)
    assert leaked() == [], f"leaked tasks: {[t.get_name() for t in leaked()]}"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # tmp_path is too long for a unix socket path (108 bytes); a short private dir instead.
    path = Path(tempfile.mkdtemp(prefix="crh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _accepting(path: Path) -> bool:
    """Someone listens on this socket (a stale socket file refuses connections)."""
    with socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


class Plugins:
    """Starts the annotate example as real processes; stops every one it started."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    async def start(self, socket: Path, *extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "crihook.hooks.examples.annotate",
                "--socket",
                str(socket),
                "--key",
                KEY,
                "--value",
                VALUE,
                "--log-level",
                "warning",
                *extra,
            ]
        )
        self.procs.append(proc)
        await eventually(lambda: proc.poll() is not None or _accepting(socket), "served")
        assert proc.poll() is None, f"plugin exited with {proc.returncode}"
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def plugins() -> Iterator[Plugins]:
    started = Plugins()
    yield started
    started.stop_all()


RemoteFactory = Callable[..., Awaitable[RemoteHook]]


@pytest.fixture
async def remote() -> AsyncIterator[RemoteFactory]:
    """Builds started RemoteHooks; closes them all at the end."""
    hooks: list[RemoteHook] = []

    async def make(
        socket: Path,
        snapshot: Callable[[], Snapshot] = lambda: ([], [], {}),
        **kwargs: Any,
    ) -> RemoteHook:
        hook = RemoteHook(
            HookSettings(name="50-annotate", endpoint=f"unix://{socket}", timeout_ms=500),
            snapshot,
            **kwargs,
        )
        hooks.append(hook)
        await hook.start()
        return hook

    yield make
    for hook in hooks:
        await hook.close()


@pytest.fixture
async def served() -> AsyncIterator[Callable[[Hook, Path], Awaitable[sdk.PluginServer]]]:
    """Serves hooks in-process with the SDK; stops them all at the end."""
    servers: list[sdk.PluginServer] = []

    async def serve(hook: Hook, socket: Path) -> sdk.PluginServer:
        server = await sdk.serve(hook, socket)
        servers.append(server)
        return server

    yield serve
    for server in servers:
        await server.stop(grace=None)


# --- in-process plugins --------------------------------------------------------------------------
class ScriptedHook(Hook):
    """Answers by container name: `reject-*` rejects (`forbid-*`: Forbidden, `invalid-*`:
    InvalidRequest), `boom` raises, `slow-N` sleeps N ms and
    names itself; post-create updates the container crihook just created."""

    def __init__(self) -> None:
        super().__init__()
        self.synchronized: list[Snapshot] = []

    async def synchronize(self, sync: SyncContext) -> list[ContainerUpdate]:
        self.synchronized.append(
            (list(sync.pods), list(sync.containers), dict(sync.container_states))
        )
        return [ContainerUpdate(c.id, ResourceDelta(cpu_shares=2)) for c in sync.containers]

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        assert ctx.container is not None
        name = ctx.container.name
        if name.startswith("reject-"):
            raise Reject(f"{name} is not welcome here")
        if name.startswith("forbid-"):
            raise Forbidden(f"{name} is not allowed on this node")
        if name.startswith("invalid-"):
            raise InvalidRequest(f"{name} does not parse")
        if name == "boom":
            raise KeyError("no such thing")
        if name.startswith("slow-"):
            await asyncio.sleep(int(name.removeprefix("slow-")) / 1000)
        request = ctx.request
        assert isinstance(request, api_pb2.CreateContainerRequest)
        return Adjustment().set_annotation("example.com/name", request.config.metadata.name)

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        assert isinstance(ctx.response, api_pb2.CreateContainerResponse)
        return Adjustment().update_container(ctx.response.container_id, ResourceDelta(cpu_quota=0))


# --- the annotate example as a process -----------------------------------------------------------
async def test_annotate_plugin_subscribes_and_adjusts(
    sock_dir: Path, plugins: Plugins, remote: RemoteFactory
) -> None:
    socket = sock_dir / "annotate.sock"
    await plugins.start(socket)
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")

    assert hook.subscriptions() == frozenset({(Event.CREATE_CONTAINER, Stage.PRE)})
    assert hook.streaming
    assert await hook.call(create_ctx()) == annotated()
    assert oct(socket.stat().st_mode & 0o777) == oct(0o660)


async def test_hung_plugin_times_out_and_the_stream_survives(
    sock_dir: Path, plugins: Plugins, remote: RemoteFactory
) -> None:
    socket = sock_dir / "hung.sock"
    await plugins.start(socket, "--delay-ms", "5000")
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")

    async with asyncio.timeout(3):  # far less than the plugin's 5 s
        with pytest.raises(TimeoutError, match="did not answer within 200 ms"):
            await hook.call(create_ctx(timeout=0.2))
    assert hook.connected and hook.streaming


async def test_killed_plugin_fails_calls_then_reconnects_when_restarted(
    sock_dir: Path, plugins: Plugins, remote: RemoteFactory
) -> None:
    socket = sock_dir / "annotate.sock"
    proc = await plugins.start(socket, "--delay-ms", "3000")
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")

    # A call in flight when the plugin dies fails at once, not at its timeout.
    in_flight = asyncio.create_task(hook.call(create_ctx(timeout=60)))
    await asyncio.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    async with asyncio.timeout(5):
        with pytest.raises(ConnectionError, match="connection lost"):
            await in_flight

    await eventually(lambda: not hook.connected, "disconnected")
    with pytest.raises(ConnectionError, match="plugin not connected"):
        await hook.call(create_ctx())
    assert hook.subscriptions() == frozenset({(Event.CREATE_CONTAINER, Stage.PRE)})  # kept

    await plugins.start(socket)  # on the killed plugin's stale socket file
    await eventually(lambda: hook.connected, "reconnected")
    assert await hook.call(create_ctx()) == annotated()


async def test_annotate_cli_errors_are_clear(sock_dir: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "crihook.hooks.examples.annotate",
            "--socket",
            str(sock_dir / "x.sock"),
            "--key",
            "not a key",
            "--value",
            "v",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "option 'key' 'not a key' is not an annotation key" in result.stderr


# --- SDK plugins served in-process ---------------------------------------------------------------
async def test_reject_failure_and_post_stage(
    sock_dir: Path, served: Any, remote: RemoteFactory
) -> None:
    socket = sock_dir / "scripted.sock"
    await served(ScriptedHook(), socket)
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")
    assert hook.subscriptions() == {
        (Event.CREATE_CONTAINER, Stage.PRE),
        (Event.CREATE_CONTAINER, Stage.POST),
    }

    with pytest.raises(Reject, match="reject-me is not welcome here") as refused:
        await hook.call(create_ctx("reject-me"))
    assert type(refused.value) is Reject
    # The kind of refusal crosses the plugin boundary: it decides the CRI status.
    with pytest.raises(Forbidden, match="forbid-me is not allowed on this node"):
        await hook.call(create_ctx("forbid-me"))
    with pytest.raises(InvalidRequest, match="invalid-me does not parse"):
        await hook.call(create_ctx("invalid-me"))
    with pytest.raises(RuntimeError, match="pre_create_container: KeyError: 'no such thing'"):
        await hook.call(create_ctx("boom"))
    # Neither a refusal nor a plugin failure breaks the stream.
    assert hook.connected and hook.streaming
    assert await hook.call(create_ctx("fine")) == Adjustment().set_annotation(
        "example.com/name", "fine"
    )
    assert await hook.call(post_create_ctx("c0ffee")) == Adjustment().update_container(
        "c0ffee", ResourceDelta(cpu_quota=0)
    )


class Recorder(Hook):
    """Keeps what its pre- and post-CreateContainer calls saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    async def pre_create_container(self, ctx: HookContext) -> None:
        self._keep(ctx)

    async def post_create_container(self, ctx: HookContext) -> None:
        self._keep(ctx)

    def _keep(self, ctx: HookContext) -> None:
        self.seen.append(
            {
                "event": ctx.event,
                "stage": ctx.stage,
                "pod": ctx.pod,
                "container": ctx.container,
                "request": ctx.request,
                "same request": ctx.request is ctx.request,  # decoded once
                "request bytes": ctx.request_bytes(),
                "response": ctx.response,
                "timeout": ctx.timeout,
            }
        )


async def test_a_plugin_hook_sees_what_crihook_sent(
    sock_dir: Path, served: Any, remote: RemoteFactory
) -> None:
    recorder = Recorder()
    socket = sock_dir / "recorder.sock"
    await served(recorder, socket)
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")
    pre, post = create_ctx("seen", timeout=1.5), post_create_ctx("c0ffee")
    assert await hook.call(pre) is None
    assert await hook.call(post) is None
    assert recorder.seen == [
        {
            "event": Event.CREATE_CONTAINER,
            "stage": Stage.PRE,
            "pod": pre.pod,
            "container": pre.container,
            "request": pre.request,
            "same request": True,
            "request bytes": pre.request_bytes(),
            "response": None,
            "timeout": 1.5,
        },
        {
            "event": Event.CREATE_CONTAINER,
            "stage": Stage.POST,
            "pod": post.pod,
            "container": post.container,
            "request": post.request,
            "same request": True,
            "request bytes": post.request_bytes(),
            "response": api_pb2.CreateContainerResponse(container_id="c0ffee"),
            "timeout": 2.0,
        },
    ]


class HostPathValidator(Hook):
    """Refuses a mount set by another hook; keeps the owners it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.owners: list[dict[str, str]] = []

    async def validate_create_container(self, ctx: HookContext) -> None:
        self.owners.append(dict(ctx.owners))
        for mount in ctx.request.config.mounts:  # type: ignore[attr-defined]
            who = ctx.owners.get(f"mount {mount.container_path!r}", "kubelet")
            raise Forbidden(f"host path {mount.host_path} asked by {who}")


async def test_a_plugin_validator_sees_the_owners_and_may_refuse(
    sock_dir: Path, served: Any, remote: RemoteFactory
) -> None:
    validator = HostPathValidator()
    socket = sock_dir / "validator.sock"
    await served(validator, socket)
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")
    assert hook.subscriptions() == {(Event.CREATE_CONTAINER, Stage.VALIDATE)}

    def validate(mount: bool) -> HookContext:
        ctx = create_ctx()
        if mount:
            ctx.request.config.mounts.add(container_path="/x", host_path="/etc")  # type: ignore[attr-defined]
        out = HookContext(
            Event.CREATE_CONTAINER, Stage.VALIDATE, ctx.pod, ctx.container, ctx.request, None,
            sdk.MemoryState(), 2.0,
        )  # fmt: skip
        if mount:
            out.owners = {"mount '/x'": "40-mounter", "cpuset_cpus": "20-cpuset"}
        return out

    assert await hook.call(validate(mount=False)) is None  # no mount: accepted
    with pytest.raises(Forbidden, match="host path /etc asked by 40-mounter"):
        await hook.call(validate(mount=True))
    assert validator.owners == [{}, {"mount '/x'": "40-mounter", "cpuset_cpus": "20-cpuset"}]


async def test_synchronize_receives_the_snapshot(
    sock_dir: Path, served: Any, remote: RemoteFactory
) -> None:
    ctx = create_ctx()
    assert ctx.container is not None
    container = ContainerView(id="c0ffee", pod_id=ctx.pod.id, name="app", image="busybox:1.36")
    scripted = ScriptedHook()
    received: list[tuple[str, tuple[ContainerUpdate, ...]]] = []

    async def on_sync_updates(name: str, updates: tuple[ContainerUpdate, ...]) -> None:
        received.append((name, updates))

    socket = sock_dir / "sync.sock"
    await served(scripted, socket)
    states = {"c0ffee": ContainerState.RUNNING}
    hook = await remote(
        socket, lambda: ([ctx.pod], [container], states), on_sync_updates=on_sync_updates
    )
    await eventually(lambda: hook.connected, "connected")

    assert scripted.synchronized == [([ctx.pod], [container], states)]
    assert received == [("50-annotate", (ContainerUpdate("c0ffee", ResourceDelta(cpu_shares=2)),))]


async def test_concurrent_calls_on_the_stream_get_their_own_answers(
    sock_dir: Path, served: Any, remote: RemoteFactory
) -> None:
    socket = sock_dir / "concurrent.sock"
    await served(ScriptedHook(), socket)
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")

    # Later calls sleep less, so the answers come back in the reverse order.
    names = [f"slow-{200 - 10 * i}" for i in range(20)]
    results = await asyncio.gather(*(hook.call(create_ctx(n)) for n in names))

    assert results == [Adjustment().set_annotation("example.com/name", n) for n in names]
    assert hook.streaming


@pytest.mark.parametrize("insecure", ["world-writable", "not-root"])
async def test_insecure_socket_is_never_connected(
    insecure: str, fake_plugin: tuple[FakePlugin, Path], remote: RemoteFactory
) -> None:
    fake, socket = fake_plugin
    if insecure == "world-writable":
        socket.chmod(0o666)
        expected = "world-writable (mode 0666)"
    else:
        os.chown(socket, 65534, -1)
        expected = "owned by uid 65534, not uid 0"
    hook = await remote(socket)
    await eventually(lambda: expected in hook.last_error, "refused")
    await asyncio.sleep(0.5)  # several attempts of the backoff

    assert not hook.connected
    assert fake.configured == 0  # refused before any RPC
    with pytest.raises(
        ConnectionError, match=f"plugin not connected: refusing.*{re.escape(expected)}"
    ):
        await hook.call(create_ctx())

    # Fixed by the operator: connects by itself.
    socket.chmod(0o660)
    os.chown(socket, 0, -1)
    await eventually(lambda: hook.connected, "connected once fixed")
    assert fake.configured == 1


async def test_missing_socket_is_reported(sock_dir: Path, remote: RemoteFactory) -> None:
    hook = await remote(sock_dir / "absent.sock")
    await eventually(lambda: "does not exist" in hook.last_error, "reported")
    assert not hook.connected
    assert hook.subscriptions() == frozenset()


# --- a plugin without Stream: unary fallback -----------------------------------------------------
class FakePlugin:
    """A hand-made Plugin server with Configure, Synchronize and PreCreateContainer only."""

    def __init__(self) -> None:
        self.configured = 0
        self.unary_calls = 0
        self._server: grpc.aio.Server | None = None

    async def configure(
        self, request: hook_pb2.ConfigureRequest, context: grpc.aio.ServicerContext
    ) -> hook_pb2.ConfigureResponse:
        self.configured += 1
        subs = subscriptions_to_proto({(Event.CREATE_CONTAINER, Stage.PRE)})
        return hook_pb2.ConfigureResponse(subscriptions=subs)

    async def synchronize(
        self, request: hook_pb2.SynchronizeRequest, context: grpc.aio.ServicerContext
    ) -> hook_pb2.SynchronizeResponse:
        return hook_pb2.SynchronizeResponse()

    async def pre_create_container(
        self, request: hook_pb2.StageRequest, context: grpc.aio.ServicerContext
    ) -> hook_pb2.StageResponse:
        self.unary_calls += 1
        cri = api_pb2.CreateContainerRequest.FromString(request.request)
        adj = Adjustment().set_annotation("example.com/name", cri.config.metadata.name)
        return hook_pb2.StageResponse(adjustment=adjustment_to_proto(adj))

    async def start(self, socket: Path) -> None:
        def unary(fn: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        handler = grpc.method_handlers_generic_handler(
            "crihook.hook.v1.Plugin",
            {
                "Configure": unary(
                    self.configure, hook_pb2.ConfigureRequest, hook_pb2.ConfigureResponse
                ),
                "Synchronize": unary(
                    self.synchronize, hook_pb2.SynchronizeRequest, hook_pb2.SynchronizeResponse
                ),
                "PreCreateContainer": unary(
                    self.pre_create_container, hook_pb2.StageRequest, hook_pb2.StageResponse
                ),
            },
        )
        self._server = grpc.aio.server(handlers=[handler])
        self._server.add_insecure_port(f"unix://{socket}")
        socket.chmod(0o660)
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)


@pytest.fixture
async def fake_plugin(sock_dir: Path) -> AsyncIterator[tuple[FakePlugin, Path]]:
    """A started FakePlugin (no Stream) and its socket; stopped at the end."""
    fake = FakePlugin()
    socket = sock_dir / "fake.sock"
    await fake.start(socket)
    yield fake, socket
    await fake.stop()


async def test_unary_fallback_when_the_plugin_has_no_stream(
    fake_plugin: tuple[FakePlugin, Path], remote: RemoteFactory
) -> None:
    fake, socket = fake_plugin
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")
    await eventually(lambda: not hook.streaming, "stream refused")  # UNIMPLEMENTED seen

    names = [f"c{i}" for i in range(20)]
    results = await asyncio.gather(*(hook.call(create_ctx(n)) for n in names))
    assert results == [Adjustment().set_annotation("example.com/name", n) for n in names]
    assert fake.unary_calls == 20

    await fake.stop()  # a dead plugin is noticed without a stream, too
    await eventually(lambda: not hook.connected, "disconnected")
    with pytest.raises(ConnectionError):
        await hook.call(create_ctx())


async def test_first_calls_are_resent_unary_when_stream_turns_out_unimplemented(
    fake_plugin: tuple[FakePlugin, Path], remote: RemoteFactory
) -> None:
    _, socket = fake_plugin
    hook = await remote(socket)
    await eventually(lambda: hook.connected, "connected")
    # Whether or not the UNIMPLEMENTED answer has arrived yet, every call gets its answer.
    results = await asyncio.gather(*(hook.call(create_ctx(f"c{i}")) for i in range(5)))
    assert results == [Adjustment().set_annotation("example.com/name", f"c{i}") for i in range(5)]


# --- the annotate example's options (in-process use) ---------------------------------------------
OPTIONS_ERRORS = [
    ("missing-key", {"value": "v"}, "option 'key' is required"),
    ("missing-value", {"key": "a/b"}, "option 'value' is required"),
    ("bad-key", {"key": "a b", "value": "v"}, "is not an annotation key"),
    ("value-not-string", {"key": "a/b", "value": 1}, "'value' must be a string"),
    ("negative-delay", {"key": "a/b", "value": "v", "delay_ms": -1}, "'delay_ms' must be"),
    ("unknown", {"key": "a/b", "value": "v", "colour": "red"}, "unknown option(s) colour"),
]


@pytest.mark.parametrize(
    ("options", "message"), [o[1:] for o in OPTIONS_ERRORS], ids=[o[0] for o in OPTIONS_ERRORS]
)
def test_annotate_options_are_validated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        AnnotateHook(options)


def test_annotate_options_defaults() -> None:
    assert parse_options({"key": "a/b", "value": ""}).delay_ms == 0
