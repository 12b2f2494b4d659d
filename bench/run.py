"""Side-by-side latency/CPU benchmark: kubelet-like client -> (crihook ->) runtime.

    python -m bench.run [--quick] [--reps N] [--duration S] [--json FILE]
                        [--real-containerd | --no-real-containerd] [--containerd 1.6|2]
                        [--scenario NAME ...] [--lifecycle]
    python -m bench.run --node-pods 0,100,500,1000   (bench.node_pods: pod start on a full node)

For each backend (the fake runtime, and a real containerd from tests.lab), each method
(ListContainers: pass-through; CreateContainer: intercepted) and each concurrency (1, 16) it
measures the direct path (client -> runtime) and every selected scenario (client -> crihook
-> runtime) in the same repetition, in shuffled order. Ratios and deltas are taken against
the direct cell of the same repetition, then the median over repetitions is reported.

A *scenario* is one way of running crihook: a name plus extra ``crihook serve`` flags,
environment and optional side processes (out-of-process plugins). Add one by adding an
entry to SCENARIOS. See bench/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import grpc

from bench import kubelet_start, loadgen, node_pods, payloads
from bench.procfs import descendants, rss_bytes
from crihook.api.cri.v1 import api_pb2

if TYPE_CHECKING:
    from tests.lab.kubelet import KubeletClient

REPO_ROOT = Path(__file__).resolve().parent.parent
DIRECT = "direct"
MiB = 1024 * 1024

# grpc core experiments turned off in the bench's own tools (fake runtime, load generator):
# with the EventEngine client/listener/endpoints switched off, grpcio 1.85 spends ~100 µs
# less CPU per call on each side here, so the tools stay cheap next to crihook. crihook
# itself runs with grpc's defaults unless a scenario sets GRPC_EXPERIMENTS.
TOOLS_GRPC_EXPERIMENTS = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)


# --- what is measured ------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One way to run crihook in front of the runtime.

    Every crihook runs as ``crihook serve --listen ... --runtime-endpoint ...
    --state-dir {dir}/state --config {dir}/config.toml --plugins-dir {dir}/plugins
    --log-level warning`` followed by ``args``. ``config`` is the TOML written to
    ``{dir}/config.toml`` (empty: defaults), ``files`` are extra files written under
    ``{dir}`` (e.g. ``plugins/50-noop.toml`` drop-ins), ``env`` is added to crihook's
    environment and ``sidecars`` are commands the bench starts before crihook and stops
    after it (e.g. an out-of-process plugin server). In all of these the placeholders
    ``{dir}`` (this crihook instance's private directory; short enough for sockets) and
    ``{python}`` (this interpreter) are replaced. CPU of sidecars and of crihook's child
    processes is reported as plugins CPU. ``targets``: the README budget applies to it.
    ``hooks``/``plugins``: how many in-process hooks / out-of-process plugins it chains on
    CreateContainer; its added p50 over ``hooks-none``'s, divided by that number, is checked
    against the per-hook / per-plugin budget. ``chain_budget_us``: a budget for its whole
    added p50 over ``hooks-none``'s instead.
    """

    name: str
    args: tuple[str, ...]
    about: str
    config: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    sidecars: tuple[tuple[str, ...], ...] = ()
    default: bool = True
    targets: bool = False
    hooks: int = 0
    plugins: int = 0
    chain_budget_us: float | None = None
    lifecycle: bool = False
    """Selecting it also measures the sandbox lifecycle (RunPodSandbox + StopPodSandbox of a
    pod-network pod) on the real containerd, for the direct path and every scenario."""


def _annotate_hooks(count: int) -> str:
    """Config of `count` in-process annotate hooks, each adding its own annotation."""
    order = ", ".join(f'"{10 * i}-a{i}"' for i in range(1, count + 1))
    return f"[hooks]\norder = [{order}]\n" + "".join(
        f'[hooks.a{i}]\nmodule = "crihook.hooks.examples.annotate:AnnotateHook"\n'
        f'key = "bench.crihook.io/a{i}"\nvalue = "x"\n'
        for i in range(1, count + 1)
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="hooks-none",
        args=("--hooks", "none"),
        about="crihook with no hooks, on the default (h2) data path: raw pass-through relayed "
        "frame by frame and the intercept pipeline only",
        targets=True,
    ),
    Scenario(
        name="hooks-none-grpc",
        args=("--hooks", "none", "--data-path", "grpc"),
        about="hooks-none on the grpc data path (grpc.aio's server and channels, the default "
        "before h2)",
        targets=True,
    ),
    Scenario(
        name="hooks-none-ee-on",
        args=("--hooks", "none", "--data-path", "grpc"),
        env={"GRPC_EXPERIMENTS": ""},
        about="hooks-none-grpc with grpc core's EventEngine endpoints left on (grpc's default; "
        "crihook turns them off unless GRPC_EXPERIMENTS is set). Not measured by default",
        default=False,
        targets=True,
    ),
    Scenario(
        name="hooks-none-metrics",
        args=("--hooks", "none", "--metrics-listen", "unix://{dir}/metrics.sock"),
        about="hooks-none with Prometheus metrics on (--metrics-listen; not scraped during "
        "the cell): against hooks-none, what counting every call costs. Not measured by "
        "default",
        default=False,
    ),
    Scenario(
        name="hooks-4",
        args=(),
        config=_annotate_hooks(4),
        about="4 trivial in-process hooks on CreateContainer (each adds one annotation)",
        hooks=4,
    ),
    Scenario(
        name="hooks-4-record",
        args=("--record", "{dir}/record.jsonl"),
        config=_annotate_hooks(4),
        about="hooks-4 with every intercepted call recorded (crihook serve --record): against "
        "hooks-4, what recording costs (the loop pickles a small record of the call; a renderer "
        "process at idle priority renders and writes the line, no fsync). Not measured by "
        "default",
        default=False,
    ),
    Scenario(
        name="hooks-1",
        args=(),
        config=_annotate_hooks(1),
        about="1 trivial in-process hook: with hooks-4, splits what having hooks at all costs "
        "from what each one adds. Not measured by default",
        default=False,
        hooks=1,
    ),
    Scenario(
        name="hooks-1-guard",
        args=(),
        config=_annotate_hooks(1)
        .replace("[hooks.a1]\n", '[hooks.a1]\nallow = ["annotation:bench.crihook.io/*"]\n')
        .replace('order = ["10-a1"]', 'order = ["10-a1", "90-guard"]'),
        about="hooks-1 with its grant narrowed by a glob (the permission check) and the guard "
        "example validator on the final request: against hooks-1 and hooks-none, what "
        "permissions and one in-process validator cost. Not measured by default",
        default=False,
        hooks=2,
    ),
    Scenario(
        name="resource-hooks",
        args=("--hooks", "cpuset,numa,oom"),
        about="the built-in resource hooks cpuset, numa and oom on this machine's topology "
        "(a Burstable container: shared pool, all memory nodes, kubelet's OOM score)",
        chain_budget_us=100.0,
    ),
    Scenario(
        name="koordinator",
        args=("--hooks", "koordinator"),
        about="the built-in koordinator hook placing CPUs itself (cpu_manager = none): the bench "
        "pod, Burstable and unlabelled, is an LS pod on the share pool its CPU ledger keeps. Not "
        "measured by default (with hooks-none: --scenario hooks-none --scenario koordinator)",
        default=False,
        chain_budget_us=100.0,
    ),
    Scenario(
        name="devices",
        args=("--hooks", "devices"),
        config=payloads.DEVICES_CONFIG,
        about="the built-in devices hook: a device node, a read-only host mount and a pooled "
        "device (a reservation written ahead) checked and added. Not measured by default; the "
        "fake runtime only (--no-real-containerd): against containerd a cell's containers "
        "hold the pool's 32 devices until the cell ends",
        default=False,
        chain_budget_us=100.0,
    ),
    Scenario(
        name="netdev",
        args=("--hooks", "netdev"),
        config=payloads.NETDEV_CONFIG,
        about="the built-in netdev hook: selecting it adds the sandbox lifecycle on the real "
        "containerd (RunPodSandbox then StopPodSandbox of a pod-network pod asking for one "
        "macvlan on a bridge the bench makes; crihook creates it in the pod's netns after "
        "RunPodSandbox and deletes it before StopPodSandbox), measured for every path. Not "
        "measured by default (with hooks-none: --scenario hooks-none --scenario netdev)",
        default=False,
        lifecycle=True,
    ),
    Scenario(
        name="plugin-1",
        args=("--hooks", "none"),
        files={
            "plugins/50-annotate.toml": (
                'name = "50-annotate"\nendpoint = "unix://{dir}/annotate.sock"\n'
                'failure_policy = "fail"\ntimeout_ms = 1000\n'
            )
        },
        sidecars=(
            (
                "{python}",
                "-m",
                "crihook.hooks.examples.annotate",
                "--socket",
                "{dir}/annotate.sock",
                "--key",
                "bench.crihook.io/p",
                "--value",
                "x",
            ),
        ),
        about="the example annotate plugin out of process, over its persistent stream",
        plugins=1,
    ),
)


def wait_plugins_connected(status_path: Path, log: Path, timeout: float = 20.0) -> None:
    """Measure a plugin only once crihook reports it connected (status.json, every 1 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            hooks = json.loads(status_path.read_text()).get("hooks", [])
        except (OSError, ValueError):
            hooks = []
        if hooks and all(h.get("connected") for h in hooks):
            return
        time.sleep(0.1)
    raise RuntimeError(f"plugins did not connect within {timeout}s; see {log}")


@dataclass(frozen=True)
class Method:
    name: str
    path: str
    kind: str  # "pass-through" or "intercepted"


METHODS: tuple[Method, ...] = (
    Method("ListContainers", payloads.LIST_CONTAINERS, "pass-through"),
    Method("CreateContainer", payloads.CREATE_CONTAINER, "intercepted"),
)
KUBELET_RUN = Method("RunPodSandbox", payloads.RUN_POD_SANDBOX, "intercepted")
"""Fake runtime with --kubelet-requests only: kubelet's captured RunPodSandbox, a pod per call."""
LIFECYCLE = Method("RunPodSandbox+StopPodSandbox", payloads.RUN_POD_SANDBOX, "lifecycle")
"""Real containerd only, one at a time: a pod sandbox made and stopped (removed untimed)."""
LIFECYCLE_MIN_COUNT = 10


@dataclass(frozen=True)
class Budget:
    """The README targets; they apply to the fake runtime at concurrency 1."""

    added_p50_us: Mapping[str, float] = field(
        default_factory=lambda: {"ListContainers": 450.0, "CreateContainer": 500.0}
    )
    cpu_us_per_call: float = 450.0
    idle_rss_mib: float = 60.0
    # CreateContainer, added p50 over the no-hook scenario, per hook in the chain.
    per_hook_us: float = 30.0
    per_plugin_us: float = 400.0


BUDGET = Budget()


@dataclass(frozen=True)
class Payload:
    data: bytes
    marker: str | None = None  # replaced by a counter per request (unique container names)
    pods: tuple[bytes, ...] = ()
    """A call made into a pod (CreateContainer): its request into pod 0, 1, ... (`data` is
    pod 0's). crihook serializes one pod's calls, as kubelet sends them: a cell at
    concurrency c gives each of its c workers a pod of its own, or it would measure that
    lock. Empty: every worker sends `data`."""

    @classmethod
    def into_pods(cls, requests: Sequence[bytes], marker: str | None = None) -> Payload:
        return cls(requests[0], marker, tuple(requests))

    def per_worker(self, concurrency: int) -> tuple[bytes, ...]:
        """The requests a cell at `concurrency` sends, worker w the (w mod n)-th."""
        if not self.pods:
            return (self.data,)
        if concurrency > len(self.pods):
            raise ValueError(f"{concurrency} workers, requests into {len(self.pods)} pods only")
        return self.pods[:concurrency]


def create_container_payload(kubelet_requests: bool, pods: int) -> Payload:
    """The fake runtime's CreateContainer: the bench pod's request (or kubelet's captured
    one) into `pods` pods, each request with its own container name."""
    make = (
        payloads.kubelet_create_container_request
        if kubelet_requests
        else payloads.fake_create_container_request
    )
    return Payload.into_pods([make(pod) for pod in range(pods)], payloads.NAME_MARKER)


# --- processes -------------------------------------------------------------------------------


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"--- last lines of {path}:\n" + "\n".join(text[-lines:])


def wait_ready(
    target: str, proc: subprocess.Popen[bytes] | None, log: Path | None, timeout: float = 60.0
) -> None:
    """Poll CRI Version (raw bytes) until it answers; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = _log_tail(log) if log else ""
            raise RuntimeError(f"process for {target} exited with {proc.returncode}\n{tail}")
        try:
            with grpc.insecure_channel(target) as channel:
                channel.unary_unary(payloads.VERSION)(b"", timeout=1.0)
            return
        except grpc.RpcError as exc:
            last = f"{exc.code()}: {exc.details()}"
        time.sleep(0.05)
    tail = _log_tail(log) if log else ""
    raise RuntimeError(f"{target} did not answer Version within {timeout}s ({last})\n{tail}")


class Managed:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        drop_env: Sequence[str] = (),
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self._log_file: IO[bytes] = open(log, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env={
                **{k: v for k, v in os.environ.items() if k not in drop_env},
                **(env or {}),
            },
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10.0)
        self._log_file.close()


def write_payloads(requests: Sequence[bytes], stem: Path) -> list[Path]:
    """Each request in its own file (`stem`-N.bin), for the load generator's --payload."""
    paths = []
    for number, request in enumerate(requests):
        path = stem.with_name(f"{stem.name}-{number}.bin")
        path.write_bytes(request)
        paths.append(path)
    return paths


# --- backends --------------------------------------------------------------------------------


class Backend(Protocol):
    name: str
    endpoint: str

    def pids(self) -> list[int]: ...
    def payload(self, method: Method) -> Payload: ...
    def after_cell(self, target: str, method: Method) -> None: ...
    def close(self) -> None: ...


class FakeBackend:
    """bench.fake_runtime in its own process. `pods`: how many pods CreateContainer is sent
    into, at most (the highest concurrency measured)."""

    name = "fake"

    def __init__(
        self,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        kubelet_requests: bool = False,
        pods: int = 1,
    ) -> None:
        sock = workdir / "fake-runtime.sock"
        self.endpoint = f"unix://{sock}"
        self._proc = Managed(
            [sys.executable, "-m", "bench.fake_runtime", "--socket", str(sock)],
            workdir / "fake-runtime.log",
            env,
        )
        wait_ready(self.endpoint, self._proc.proc, self._proc.log)
        self._payloads = {
            "ListContainers": Payload(payloads.list_containers_request()),
            "CreateContainer": create_container_payload(kubelet_requests, pods),
        }
        if kubelet_requests:
            self._payloads[KUBELET_RUN.name] = Payload(
                payloads.kubelet_run_pod_sandbox_request(marked=True), payloads.NAME_MARKER
            )

    def pids(self) -> list[int]:
        return [self._proc.pid]

    def payload(self, method: Method) -> Payload:
        return self._payloads[method.name]

    def after_cell(self, target: str, method: Method) -> None:
        pass

    def close(self) -> None:
        self._proc.stop()


class ContainerdBackend:
    """A real containerd from tests.lab with ``pods`` host-network, Burstable pod sandboxes
    (the highest concurrency measured: a CreateContainer cell at concurrency c sends into the
    first c, a worker each).

    ``containerd``: Debian's 1.6 (``1.6``) or 2.x built by tests.lab.peers (``2``).

    The first sandbox holds ``resident`` created (not started) containers so ListContainers
    has something realistic to return. Each CreateContainer request gets a unique name (the
    load generator replaces NAME_MARKER); every container the load made carries
    payloads.LOAD_LABEL and is removed after the cell, through the path that created it, so
    crihook's view stays consistent. PullImage is never called: the lab imports its images.
    """

    name = "containerd"

    def __init__(
        self,
        workdir: Path,
        containerd: str = "1.6",
        resident: int = 10,
        lifecycle: bool = False,
        pods: int = 1,
    ) -> None:
        from tests.lab.containerd import Containerd
        from tests.lab.kubelet import KubeletClient
        from tests.lab.peers import containerd_binaries

        self._lab = Containerd(workdir / "ctrd", binaries=containerd_binaries(containerd))
        self._bridge: str | None = None
        self.sandbox_ids: list[str] = []
        try:
            self._lab.start()
            self.endpoint = self._lab.endpoint
            with KubeletClient(self.endpoint, log_root=self._lab.pod_log_dir) as kubelet:
                requests = [
                    self._start_pod(kubelet, workdir, number, resident if number == 0 else 0)
                    for number in range(pods)
                ]
                self._payloads = {
                    "ListContainers": Payload(payloads.list_containers_request()),
                    "CreateContainer": Payload.into_pods(requests, payloads.NAME_MARKER),
                }
                if lifecycle:
                    self._bridge = make_bridge()
                    net_pod = payloads.lifecycle_pod(self._bridge)
                    net_sandbox = kubelet.sandbox_config(net_pod)
                    # kubelet makes the pod's log directory first; the marker is in its path
                    Path(net_sandbox.log_directory).parent.mkdir(parents=True, exist_ok=True)
                    self._payloads[LIFECYCLE.name] = Payload(
                        api_pb2.RunPodSandboxRequest(config=net_sandbox).SerializeToString(),
                        payloads.NAME_MARKER,
                    )
        except BaseException:
            self.close()
            raise

    def _start_pod(
        self, kubelet: KubeletClient, workdir: Path, number: int, resident: int
    ) -> bytes:
        """Run the sandbox of pod `number` (pod 0: the uid's second group 0000, as before
        there were several), make its mount sources and `resident` containers; return its
        CreateContainer request (NAME_MARKER in the container's name)."""
        pod = payloads.bench_pod(
            name=f"web-{number}",
            uid=f"be4c0000-{number:04d}-4000-8000-{os.getpid():012d}",
            image=self._lab.images.busybox.ref,
            kubelet_dir=str(workdir / "kubelet"),
        )
        for path, is_dir in payloads.mount_sources(pod):
            if is_dir:
                Path(path).mkdir(parents=True, exist_ok=True)
            else:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).touch()
        sandbox = kubelet.sandbox_config(pod)
        Path(sandbox.log_directory).mkdir(parents=True, exist_ok=True)
        sandbox_id = kubelet.runtime.RunPodSandbox(
            api_pb2.RunPodSandboxRequest(config=sandbox), timeout=120
        ).pod_sandbox_id
        self.sandbox_ids.append(sandbox_id)
        image_id = kubelet.images.ImageStatus(
            api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=pod.containers[0].image)),
            timeout=60,
        ).image.id
        if not image_id:
            raise RuntimeError(f"image {pod.containers[0].image} missing in the lab")

        def request(container: Any = None) -> bytes:
            return payloads.create_container_request(
                pod, sandbox_id=sandbox_id, sandbox=sandbox, image_ref=image_id,
                node_memory=kubelet.node_memory, container=container,
            )  # fmt: skip

        template = pod.containers[0]
        for i in range(resident):
            resident_spec = dataclasses.replace(template, name=f"resident-{i}", labels={})
            kubelet.runtime.CreateContainer(
                api_pb2.CreateContainerRequest.FromString(request(resident_spec)), timeout=60
            )
        return request()

    def pids(self) -> list[int]:
        pid = self._lab.pid
        return [pid] if pid else []

    def payload(self, method: Method) -> Payload:
        return self._payloads[method.name]

    def after_cell(self, target: str, method: Method) -> None:
        if method.name == "CreateContainer":
            for sandbox_id in self.sandbox_ids:
                remove_load_containers(target, sandbox_id)
        elif method is LIFECYCLE:
            remove_lifecycle_sandboxes(target)

    def close(self) -> None:
        try:
            self._lab.cleanup()
        finally:
            if self._bridge is not None:
                subprocess.run(
                    ["ip", "link", "del", self._bridge], capture_output=True, check=False
                )


def make_bridge() -> str:
    """A bridge on the host for the lifecycle pods' macvlans (removed by the backend)."""
    name = f"{payloads.NETDEV_PARENT_PREFIX}{os.getpid() % 100_000}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True, capture_output=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True)
    return name


def remove_lifecycle_sandboxes(target: str) -> int:
    """Stop and remove every sandbox a lifecycle cell left (a call cut short)."""
    with grpc.insecure_channel(target) as channel:
        listed = channel.unary_unary(
            payloads.LIST_POD_SANDBOX,
            request_serializer=api_pb2.ListPodSandboxRequest.SerializeToString,
            response_deserializer=api_pb2.ListPodSandboxResponse.FromString,
        )(
            api_pb2.ListPodSandboxRequest(
                filter=api_pb2.PodSandboxFilter(label_selector={payloads.LIFECYCLE_LABEL: "1"})
            ),
            timeout=120,
        )
        for sandbox in listed.items:
            for verb in ("StopPodSandbox", "RemovePodSandbox"):
                request_type = getattr(api_pb2, f"{verb}Request")
                channel.unary_unary(
                    f"/{payloads.RUNTIME_SERVICE}/{verb}",
                    request_serializer=request_type.SerializeToString,
                    response_deserializer=lambda _: None,
                )(request_type(pod_sandbox_id=sandbox.id), timeout=120)
    return len(listed.items)


def remove_load_containers(target: str, sandbox_id: str, parallel: int = 8) -> int:
    """RemoveContainer every container of the sandbox that carries LOAD_LABEL."""
    with grpc.insecure_channel(target) as channel:
        list_call = channel.unary_unary(
            payloads.LIST_CONTAINERS,
            request_serializer=api_pb2.ListContainersRequest.SerializeToString,
            response_deserializer=api_pb2.ListContainersResponse.FromString,
        )
        remove = channel.unary_unary(
            "/runtime.v1.RuntimeService/RemoveContainer",
            request_serializer=api_pb2.RemoveContainerRequest.SerializeToString,
            response_deserializer=api_pb2.RemoveContainerResponse.FromString,
        )
        request = api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(
                pod_sandbox_id=sandbox_id, label_selector={payloads.LOAD_LABEL: "1"}
            )
        )
        ids = [c.id for c in list_call(request, timeout=120).containers]
        for start in range(0, len(ids), parallel):
            futures = [
                remove.future(api_pb2.RemoveContainerRequest(container_id=cid), timeout=120)
                for cid in ids[start : start + parallel]
            ]
            for fut in futures:
                fut.result()
    return len(ids)


# --- crihook instances -----------------------------------------------------------------------


def default_crihook_cmd() -> list[str]:
    script = Path(sys.executable).parent / "crihook"
    return [str(script)] if script.exists() else [sys.executable, "-m", "crihook"]


class Crihook:
    """One ``crihook serve`` (plus the scenario's sidecars) in front of one backend."""

    def __init__(
        self, scenario: Scenario, backend: Backend, workdir: Path, cmd: Sequence[str]
    ) -> None:
        self.scenario = scenario
        self.backend = backend
        self.dir = workdir / f"{backend.name}-{scenario.name}"
        self.dir.mkdir(parents=True)
        sock = self.dir / "crihook.sock"
        self.endpoint = f"unix://{sock}"
        self._sidecars: list[Managed] = []
        self.proc: Managed | None = None
        try:
            (self.dir / "plugins").mkdir()
            config = self.dir / "config.toml"
            config.write_text(self._subst(scenario.config))
            for rel, text in scenario.files.items():
                path = self.dir / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(self._subst(text))
            for i, argv in enumerate(scenario.sidecars):
                self._sidecars.append(
                    Managed([self._subst(a) for a in argv], self.dir / f"sidecar-{i}.log")
                )
            argv = [
                *cmd, "serve",
                "--listen", self.endpoint,
                "--runtime-endpoint", backend.endpoint,
                "--state-dir", str(self.dir / "state"),
                "--config", str(config),
                "--plugins-dir", str(self.dir / "plugins"),
                "--log-level", "warning",
                *(self._subst(a) for a in scenario.args),
            ]  # fmt: skip
            env = {k: self._subst(v) for k, v in scenario.env.items()}
            # crihook runs with grpc's defaults: the tools' GRPC_EXPERIMENTS (or the
            # caller's) does not leak into it; a scenario may set its own.
            self.proc = Managed(argv, self.dir / "crihook.log", env, drop_env=("GRPC_EXPERIMENTS",))
            wait_ready(self.endpoint, self.proc.proc, self.proc.log)
            if scenario.files:
                wait_plugins_connected(self.dir / "state" / "status.json", self.proc.log)
        except BaseException:
            self.close()
            raise

    def _subst(self, text: str) -> str:
        return text.replace("{dir}", str(self.dir)).replace("{python}", sys.executable)

    @property
    def label(self) -> str:
        return f"{self.backend.name}/{self.scenario.name}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def plugin_pids(self) -> list[int]:
        return sorted({s.pid for s in self._sidecars} | set(descendants(self.pid)))

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        for sidecar in reversed(self._sidecars):
            sidecar.stop()


GO_PATH = "go-raw"
"""The path through the reference Go proxy (../shared/tools/go-raw-proxy: grpc-go,
UnknownServiceHandler, raw codec, unary only), when --go-proxy is given."""


def go_proxy_binary(given: Path, workdir: Path) -> Path:
    """The Go proxy's binary: `given` itself, or built from `given` (its source directory,
    with build.sh) into the work directory."""
    if given.is_file():
        return given
    built = subprocess.run(
        ["sh", str(given / "build.sh"), str(workdir / "gorawproxy")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        raise RuntimeError(f"building the Go proxy failed:\n{built.stdout}{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


class GoProxy:
    """The reference Go proxy in front of one backend, measured like a crihook."""

    def __init__(self, binary: Path, backend: Backend, workdir: Path) -> None:
        self.backend = backend
        self.dir = workdir / f"{backend.name}-{GO_PATH}"
        self.dir.mkdir(parents=True)
        sock = self.dir / "go.sock"
        self.endpoint = f"unix://{sock}"
        argv = [
            str(binary), "proxy",
            "-listen", str(sock),
            "-backend", backend.endpoint.removeprefix("unix://"),
            "-ready", str(self.dir / "go.pid"),
        ]  # fmt: skip
        self.proc = Managed(argv, self.dir / "go.log")
        try:
            wait_ready(self.endpoint, self.proc.proc, self.proc.log)
        except BaseException:
            self.close()
            raise

    @property
    def label(self) -> str:
        return f"{self.backend.name}/{GO_PATH}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def plugin_pids(self) -> list[int]:
        return []

    def close(self) -> None:
        self.proc.stop()


# --- cells -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    backend: str
    method: str
    concurrency: int
    path: str  # DIRECT or a scenario name

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.backend, self.method, self.concurrency, self.path)


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.backends: dict[str, Backend] = {}
        self.crihooks: dict[tuple[str, str], Crihook | GoProxy] = {}
        self.scenarios = [s for s in SCENARIOS if s.name in args.scenarios]
        self.methods = {m.name: m for m in (*METHODS, KUBELET_RUN, LIFECYCLE)}
        self.lifecycle = args.lifecycle or any(s.lifecycle for s in self.scenarios)
        self._next_index = 0
        self.tools_env = (
            {"GRPC_EXPERIMENTS": args.tools_grpc_experiments} if args.tools_grpc_experiments else {}
        )
        self._payload_files: dict[tuple[str, str], list[Path]] = {}
        self.go_binary: Path | None = None

    # set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        self._say("starting the fake runtime")
        pods = max(self.args.concurrency)  # CreateContainer: a pod per worker
        self.backends["fake"] = FakeBackend(
            self.workdir, self.tools_env, kubelet_requests=self.args.kubelet_requests, pods=pods
        )
        if self.args.real_containerd:
            self._say(
                f"starting a real containerd {self.args.containerd} (tests.lab) and a pod sandbox"
            )
            self.backends["containerd"] = ContainerdBackend(
                self.workdir, self.args.containerd, lifecycle=self.lifecycle, pods=pods
            )
        for backend in self.backends.values():
            for method in self._methods_of(backend.name):
                payload = backend.payload(method)
                self._payload_files[(backend.name, method.name)] = write_payloads(
                    payload.pods or (payload.data,),
                    self.workdir / f"payload-{backend.name}-{method.name}",
                )
            for scenario in self.scenarios:
                self._say(f"starting crihook {backend.name}/{scenario.name}")
                self.crihooks[(backend.name, scenario.name)] = Crihook(
                    scenario, backend, self.workdir, self.args.crihook_cmd
                )
            if self.args.go_proxy is not None:
                if self.go_binary is None:
                    self._say(f"building the Go reference proxy from {self.args.go_proxy}")
                    self.go_binary = go_proxy_binary(self.args.go_proxy, self.workdir)
                self._say(f"starting the Go reference proxy {backend.name}/{GO_PATH}")
                self.crihooks[(backend.name, GO_PATH)] = GoProxy(
                    self.go_binary, backend, self.workdir
                )

    def close(self) -> None:
        for crihook in self.crihooks.values():
            with contextlib.suppress(Exception):
                crihook.close()
        for backend in self.backends.values():
            try:
                backend.close()
            except Exception as exc:
                print(f"warning: closing backend {backend.name}: {exc}", file=sys.stderr)

    def _methods_of(self, backend: str) -> tuple[Method, ...]:
        if backend == "containerd" and self.lifecycle:
            return (*METHODS, LIFECYCLE)
        if backend == "fake" and self.args.kubelet_requests:
            return (*METHODS, KUBELET_RUN)
        return METHODS

    def cells(self) -> list[Cell]:
        paths = [DIRECT, *(s.name for s in self.scenarios)]
        if self.args.go_proxy is not None:
            paths.append(GO_PATH)
        return [
            Cell(b, m.name, c, p)
            for b in self.backends
            for m in self._methods_of(b)
            for c in (self.args.concurrency if m is not LIFECYCLE else [1])
            for p in paths
        ]

    def target(self, cell: Cell) -> str:
        if cell.path == DIRECT:
            return self.backends[cell.backend].endpoint
        return self.crihooks[(cell.backend, cell.path)].endpoint

    # measuring ------------------------------------------------------------------------

    def idle_rss(self) -> list[dict[str, Any]]:
        """VmRSS of each crihook after start-up and a few calls, then 1 s idle."""
        for crihook in self.crihooks.values():
            with grpc.insecure_channel(crihook.endpoint) as channel:
                for method in METHODS:
                    payload = self.backends[crihook.backend.name].payload(method)
                    call = channel.unary_unary(method.path)
                    for _ in range(5):
                        call(self._unique(payload), timeout=60)
            for method in METHODS:
                crihook.backend.after_cell(crihook.endpoint, method)
        time.sleep(1.0)
        return [
            {"crihook": c.label, "idle_rss_bytes": rss_bytes(c.pid)} for c in self.crihooks.values()
        ]

    def _unique(self, payload: Payload) -> bytes:
        if not payload.marker:
            return payload.data
        width = len(payload.marker)
        value = str(self._take_indices(1)).zfill(width)
        return payload.data.replace(payload.marker.encode(), value.encode())

    def _take_indices(self, n: int) -> int:
        first = self._next_index
        self._next_index += n
        return first

    def run_cell(self, cell: Cell, warmup: float, duration: float) -> dict[str, Any]:
        backend = self.backends[cell.backend]
        method = self.methods[cell.method]
        payload = backend.payload(method)
        target = self.target(cell)
        files = self._payload_files[(cell.backend, cell.method)]
        argv = loadgen.command(
            target,
            method.path,
            [str(path) for path in files[: len(payload.per_worker(cell.concurrency))]],
            cell.concurrency,
            warmup,
            duration,
            marker=payload.marker,
            start=self._take_indices(1_000_000) if payload.marker else 0,
        )
        if method is LIFECYCLE:
            argv += ["--lifecycle", "--min-count", str(LIFECYCLE_MIN_COUNT)]
        for pid in backend.pids():
            argv += ["--watch", f"runtime={pid}"]
        if cell.path != DIRECT:
            crihook = self.crihooks[(cell.backend, cell.path)]
            argv += ["--watch", f"crihook={crihook.pid}"]
            for pid in crihook.plugin_pids():
                argv += ["--watch", f"plugins={pid}"]
        try:
            proc = subprocess.run(
                argv, cwd=REPO_ROOT, capture_output=True, text=True,
                timeout=warmup + duration + 120, check=False,
                env={**os.environ, **self.tools_env},
            )  # fmt: skip
            if proc.returncode != 0:
                result: dict[str, Any] = {
                    "failed": f"loadgen exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
                }
            else:
                result = json.loads(proc.stdout)
        except subprocess.TimeoutExpired as exc:
            result = {"failed": f"loadgen timed out after {exc.timeout}s"}
        try:
            backend.after_cell(target, method)
        except Exception as exc:
            result["cleanup_error"] = repr(exc)
        return result

    def _say(self, text: str) -> None:
        print(f"[bench] {text}", file=sys.stderr, flush=True)


# --- aggregation -----------------------------------------------------------------------------


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def per_rep_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flatten loadgen results and compare each with the direct cell of the same rep."""
    index = {
        (r["rep"], r["backend"], r["method"], r["concurrency"], r["path"]): r
        for r in records
        if "failed" not in r["result"]
    }
    rows = []
    for (rep, backend, method, c, path), rec in index.items():
        res = rec["result"]
        row: dict[str, Any] = {
            "rep": rep, "backend": backend, "method": method, "concurrency": c, "path": path,
            "p50_us": res["latency_us"]["p50"],
            "p90_us": res["latency_us"]["p90"],
            "p99_us": res["latency_us"]["p99"],
            "rps": res["rps"],
            "count": res["count"],
            "errors": res["errors"],
            "crihook_cpu_us": res["cpu_us_per_call"].get("crihook"),
            "plugins_cpu_us": res["cpu_us_per_call"].get("plugins"),
            "runtime_cpu_us": res["cpu_us_per_call"].get("runtime"),
            "loadgen_cpu_us": res["loadgen_cpu_us_per_call"],
            "other_busy_cores": res.get("other_busy_cores"),
        }  # fmt: skip
        direct = index.get((rep, backend, method, c, DIRECT))
        if path != DIRECT and direct is not None and direct["result"]["count"]:
            d = direct["result"]
            row["added_p50_us"] = row["p50_us"] - d["latency_us"]["p50"]
            row["added_p99_us"] = row["p99_us"] - d["latency_us"]["p99"]
            row["p50_x"] = row["p50_us"] / d["latency_us"]["p50"]
            row["p99_x"] = row["p99_us"] / d["latency_us"]["p99"]
            row["rps_x"] = row["rps"] / d["rps"]
        rows.append(row)
    return rows


SUMMARY_FIELDS = (
    "p50_us", "p90_us", "p99_us", "rps", "added_p50_us", "added_p99_us", "p50_x", "p99_x",
    "rps_x", "crihook_cpu_us", "plugins_cpu_us", "runtime_cpu_us", "loadgen_cpu_us",
    "other_busy_cores",
)  # fmt: skip


def summarize(rows: list[dict[str, Any]], order: list[Cell]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["backend"], row["method"], row["concurrency"], row["path"])].append(row)
    summary = []
    for cell in order:
        reps = groups.get(cell.key, [])
        entry: dict[str, Any] = dict(
            zip(("backend", "method", "concurrency", "path"), cell.key, strict=True)
        )
        entry["reps"] = len(reps)
        entry["errors"] = sum(r["errors"] for r in reps)
        for name in SUMMARY_FIELDS:
            entry[name] = _median([r.get(name) for r in reps])
        if reps and "added_p50_us" in reps[0]:
            spread = [r["added_p50_us"] for r in reps if "added_p50_us" in r]
            entry["added_p50_us_min"] = min(spread)
            entry["added_p50_us_max"] = max(spread)
        summary.append(entry)
    return summary


TIMES = "\u00d7"  # the multiplication sign, for ratios
NONE = "\u2013"  # an en dash, for "not applicable"


def _fmt(value: float | None, kind: str = "int") -> str:
    if value is None:
        return NONE
    if kind == "x":
        return f"{value:.2f}{TIMES}"
    if kind == "signed":
        return f"{value:+,.0f}"
    return f"{value:,.0f}"


def markdown_table(summary: list[dict[str, Any]]) -> str:
    kinds = {m.name: m.kind for m in (*METHODS, KUBELET_RUN, LIFECYCLE)}
    head = (
        "| backend | method | c | path | p50 µs | p99 µs | req/s | added p50 µs (min…max) "
        f"| p50 {TIMES} | p99 {TIMES} | req/s {TIMES} | crihook CPU µs/call "
        "| runtime CPU µs/call | errors |\n"
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for e in summary:
        added = _fmt(e["added_p50_us"], "signed")
        if e["reps"] > 1 and "added_p50_us_min" in e:
            added += (
                f" ({_fmt(e['added_p50_us_min'], 'signed')}…"
                f"{_fmt(e['added_p50_us_max'], 'signed')})"
            )
        cpu = _fmt(e["crihook_cpu_us"])
        if e.get("plugins_cpu_us"):
            cpu += f" (+{_fmt(e['plugins_cpu_us'])} plugins)"
        lines.append(
            f"| {e['backend']} | {e['method']} ({kinds[e['method']]}) | {e['concurrency']} "
            f"| {e['path']} | {_fmt(e['p50_us'])} | {_fmt(e['p99_us'])} | {_fmt(e['rps'])} "
            f"| {added} | {_fmt(e['p50_x'], 'x')} "
            f"| {_fmt(e['p99_x'], 'x')} | {_fmt(e['rps_x'], 'x')} | {cpu} "
            f"| {_fmt(e['runtime_cpu_us'])} | {e['errors']} |"
        )
    return head + "\n".join(lines) + "\n"


def check_targets(
    summary: list[dict[str, Any]],
    rss: list[dict[str, Any]],
    scenarios: list[Scenario],
    rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    by_key = {(e["backend"], e["method"], e["concurrency"], e["path"]): e for e in summary}
    checks: list[dict[str, Any]] = []

    def check(
        what: str, value: float | None, limit: float, unit: str, at_least: bool = False
    ) -> None:
        met = value is not None and (value >= limit if at_least else value <= limit)
        checks.append({
            "what": what, "value": value, "limit": limit, "unit": unit,
            "bound": "≥" if at_least else "≤", "met": met,
        })  # fmt: skip

    for scenario in (s for s in scenarios if s.targets):
        for method in METHODS:
            e = by_key.get(("fake", method.name, 1, scenario.name))
            check(
                f"{scenario.name}: fake runtime, c=1, {method.name} ({method.kind}): added p50",
                e and e["added_p50_us"], BUDGET.added_p50_us[method.name], "µs",
            )  # fmt: skip
        for method in METHODS:
            e = by_key.get(("fake", method.name, 1, scenario.name))
            check(
                f"{scenario.name}: fake runtime, c=1, {method.name}: crihook CPU per call",
                e and e["crihook_cpu_us"], BUDGET.cpu_us_per_call, "µs",
            )  # fmt: skip
        c16 = by_key.get(("fake", "CreateContainer", 16, scenario.name))
        if c16 is not None:  # measured at c=16
            check(
                f"{scenario.name}: fake runtime, c=16, CreateContainer (intercepted, into 16 "
                "pods): req/s over direct",
                c16["rps_x"], GO_TARGETS.c16_intercepted_rps_x_min, TIMES, at_least=True,
            )  # fmt: skip
        for r in rss:
            if r["crihook"] == f"fake/{scenario.name}":
                check(
                    f"{scenario.name}: idle RSS (fake runtime)",
                    r["idle_rss_bytes"] / MiB, BUDGET.idle_rss_mib, "MiB",
                )  # fmt: skip
    # Per hook: paired within each rep (this scenario's p50 minus hooks-none's, measured
    # minutes apart at most), then the median over reps; drift between reps cancels out.
    p50 = {
        (r["rep"], r["path"]): r["p50_us"]
        for r in rows
        if (r["backend"], r["method"], r["concurrency"]) == ("fake", "CreateContainer", 1)
    }
    for scenario in scenarios:
        for count, kind, limit in (
            (scenario.hooks, "in-process hook", BUDGET.per_hook_us),
            (scenario.plugins, "out-of-process plugin", BUDGET.per_plugin_us),
            (1 if scenario.chain_budget_us else 0, "chain", scenario.chain_budget_us or 0.0),
        ):
            if not count:
                continue
            paired = [
                (value - p50[(rep, "hooks-none")]) / count
                for (rep, path), value in p50.items()
                if path == scenario.name and (rep, "hooks-none") in p50
            ]
            check(
                f"{scenario.name}: fake runtime, c=1, CreateContainer: added p50 per {kind} "
                f"(p50 over hooks-none's in the same rep, ÷ {count}; median of "
                f"{len(paired)} reps)",
                statistics.median(paired) if paired else None, limit, "µs",
            )  # fmt: skip
    return checks


@dataclass(frozen=True)
class GoTargets:
    """Issue 11's targets, as ratios to the Go reference proxy in the same run (fake runtime,
    c=1 unless said): they hold whatever the client and the machine do to absolute figures."""

    pass_through_x: float = 1.2  # added p50, pass-through, over Go's
    intercepted_x: float = 1.5  # added p50, intercepted with no hooks, over Go's pass-through
    cpu_x: float = 2.0  # crihook CPU per pass-through call over Go's
    c16_rps_x_min: float = 0.8  # pass-through throughput at c=16 over direct (at least)
    c16_intercepted_rps_x_min: float = 0.8
    """Issue 27's: CreateContainer throughput at c=16 into 16 pods over direct (at least).
    Also checked without the Go proxy (a ratio to direct), in the report's targets."""


GO_TARGETS = GoTargets()


def against_go(
    rows: list[dict[str, Any]], rss: list[dict[str, Any]], scenarios: list[Scenario]
) -> list[dict[str, Any]]:
    """Each scenario (and Go itself) as ratios to Go's figures, paired within each rep, then
    the median over reps: fake runtime, pass-through = ListContainers, intercepted =
    CreateContainer."""
    by = {
        (r["rep"], r["method"], r["concurrency"], r["path"]): r
        for r in rows
        if r["backend"] == "fake"
    }
    reps = sorted({r["rep"] for r in rows})

    def ratio(
        path: str, method: str, field_: str, go_method: str = "ListContainers"
    ) -> float | None:
        values = []
        for rep in reps:
            mine, go = by.get((rep, method, 1, path)), by.get((rep, go_method, 1, GO_PATH))
            if mine and go and mine.get(field_) is not None and go.get(field_):
                values.append(mine[field_] / go[field_])
        return statistics.median(values) if values else None

    def c16(path: str, method: str = "ListContainers") -> float | None:
        return _median([by[k].get("rps_x") for k in by if k[1:] == (method, 16, path)])

    out = []
    rss_by = {r["crihook"]: r["idle_rss_bytes"] / MiB for r in rss}
    for path in [s.name for s in scenarios] + [GO_PATH]:
        out.append({
            "path": path,
            "pass_through_x": ratio(path, "ListContainers", "added_p50_us"),
            "intercepted_x": ratio(path, "CreateContainer", "added_p50_us"),
            "cpu_x": ratio(path, "ListContainers", "crihook_cpu_us"),
            "c16_rps_x": c16(path),
            "c16_intercepted_rps_x": c16(path, "CreateContainer"),
            "idle_rss_mib": rss_by.get(f"fake/{path}"),
        })  # fmt: skip
    return out


def render_against_go(table: list[dict[str, Any]]) -> str:
    t = GO_TARGETS
    out = [
        "\n### Against the Go reference proxy\n",
        "Fake runtime; ratios paired within each rep, medians over reps. Added p50 and CPU at "
        "c=1; the intercepted column is CreateContainer's added p50 over Go's pass-through "
        "(ListContainers) added p50; c=16 is throughput over direct, pass-through and "
        "intercepted (CreateContainer into 16 pods, a worker each: one pod's calls are "
        f"serialized by design). Targets (issue 11): pass-through ≤ {t.pass_through_x}{TIMES}, "
        f"intercepted ≤ {t.intercepted_x}{TIMES}, CPU ≤ {t.cpu_x}{TIMES}, c=16 pass-through ≥ "
        f"{t.c16_rps_x_min}{TIMES} direct, idle RSS ≤ {BUDGET.idle_rss_mib:.0f} MiB; (issue 27) "
        f"c=16 intercepted ≥ {t.c16_intercepted_rps_x_min}{TIMES} direct.\n",
        f"| path | added p50 pass-through {TIMES}Go | added p50 intercepted {TIMES}Go "
        f"pass-through | CPU/call pass-through {TIMES}Go | c=16 req/s {TIMES}direct "
        f"| c=16 intercepted req/s {TIMES}direct | idle RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in table:
        rss = e["idle_rss_mib"]
        out.append(
            f"| {e['path']} | {_fmt(e['pass_through_x'], 'x')} | {_fmt(e['intercepted_x'], 'x')} "
            f"| {_fmt(e['cpu_x'], 'x')} | {_fmt(e['c16_rps_x'], 'x')} "
            f"| {_fmt(e['c16_intercepted_rps_x'], 'x')} | {NONE if rss is None else f'{rss:.1f}'} |"
        )
    return "\n".join(out) + "\n"


def render_report(
    meta: dict[str, Any], summary: list[dict[str, Any]], rss: list[dict[str, Any]],
    targets: list[dict[str, Any]], failures: list[str],
    go_table: list[dict[str, Any]] | None = None,
) -> str:  # fmt: skip
    out = [
        f"crihook bench, {meta['date']}, {meta['machine']}; {meta['reps']} reps {TIMES} "
        f"{meta['duration_s']} s measured (+{meta['warmup_s']} s warm-up) per cell; "
        f"medians over reps; ratios/deltas vs the direct cell of the same rep"
        f"{'; real containerd ' + meta['containerd'] if meta.get('containerd') else ''}"
        f"; CreateContainer to the fake runtime: the "
        f"{meta.get('create_container_request', 'bench pod')}'s request.\n",
        markdown_table(summary),
        "Background load (busy CPU not from the bench's own processes, per cell window): "
        f"median {meta.get('background_cores_median', 'n/a')} cores, "
        f"max {meta.get('background_cores_max', 'n/a')} cores; "
        f"load average at start {meta['loadavg_at_start']}; "
        f"{meta['reruns_for_background_load']} cell(s) re-run for background load above "
        f"{meta['max_background_cores']} cores.\n",
        "| crihook | idle RSS MiB | RSS after run MiB |\n|---|---:|---:|",
    ]
    for r in rss:
        after = r.get("end_rss_bytes")
        out.append(
            f"| {r['crihook']} | {r['idle_rss_bytes'] / MiB:.1f} | "
            f"{after / MiB if after else float('nan'):.1f} |"
        )
    out.append("\n### Targets\n")
    for t in targets:
        if t["unit"] == TIMES:  # a ratio to direct
            value = "n/a" if t["value"] is None else f"{t['value']:.2f}{TIMES}"
            limit = f"{t['limit']:.1f}{TIMES}"
        else:
            value = "n/a" if t["value"] is None else f"{t['value']:,.1f} {t['unit']}"
            limit = f"{t['limit']:,.0f} {t['unit']}"
        verdict = "met" if t["met"] else "NOT met"
        out.append(f"- {t['what']}: {value} ({t['bound']} {limit}) — **{verdict}**")
    if go_table:
        out.append(render_against_go(go_table))
    if failures:
        out.append("\n### Failures\n")
        out.extend(f"- {f}" for f in failures)
    return "\n".join(out) + "\n"


# --- main ------------------------------------------------------------------------------------


def _machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPU ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}, grpcio {grpc.__version__}"
    )


def _lab_available() -> bool:
    try:
        import tests.lab.containerd  # noqa: F401
    except ImportError:
        return False
    return os.geteuid() == 0 and shutil.which("containerd") is not None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 rep, 1 s per cell")
    p.add_argument("--reps", type=int, help="repetitions (default 5, --kubelet 15, quick 1)")
    p.add_argument("--duration", type=float, help="measured seconds per cell (2.5; quick 1)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per cell (0.5; quick 0.3)")
    p.add_argument("--concurrency", default="1,16", help="comma-separated (default 1,16)")
    p.add_argument(
        "--real-containerd", action=argparse.BooleanOptionalAction, default=None,
        help="also measure a real containerd from tests.lab (default: when available)",
    )  # fmt: skip
    p.add_argument(
        "--containerd", choices=("1.6", "2", "crio"), default="1.6",
        help="which real containerd: Debian's 1.6, or 2.x built and cached by tests.lab.peers "
        "(default: %(default)s); crio (CRI-O) with --kubelet only",
    )  # fmt: skip
    p.add_argument(
        "--scenario", action="append", dest="scenarios", metavar="NAME",
        help="crihook scenario(s) to measure (default: every default one in SCENARIOS): "
        + ", ".join(s.name for s in SCENARIOS),
    )  # fmt: skip
    p.add_argument(
        "--node-pods", metavar="N,N,...",
        help="instead of the cells: pod start on a node already holding N pods (bench.node_pods)",
    )  # fmt: skip
    p.add_argument(
        "--node-pods-updates", choices=("after-answer", "before-answer"),
        default="after-answer", help="crihook's `updates` setting for --node-pods",
    )  # fmt: skip
    p.add_argument(
        "--node-pods-pool-in", choices=("containers", "qos-cgroups"), default="containers",
        help="--node-pods: the cpuset hook's `shared_pool_in` (qos-cgroups: on a fake cgroup "
        "v2 tree, --cgroup-root)",
    )  # fmt: skip
    p.add_argument(
        "--node-pods-measure", type=int, default=50, metavar="M",
        help="pod starts measured per count for --node-pods (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--node-pods-profile", type=Path, metavar="DIR",
        help="--node-pods: py-spy records crihook over the measured pods, stacks into DIR",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="write raw results and the summary here")
    p.add_argument("--seed", type=int, default=None, help="cell-order shuffle seed")
    p.add_argument("--crihook-cmd", help="command that runs crihook (default: venv's crihook)")
    p.add_argument(
        "--tools-grpc-experiments", default=TOOLS_GRPC_EXPERIMENTS, metavar="LIST",
        help="GRPC_EXPERIMENTS for the fake runtime and the load generator (not crihook); "
        "'' for grpc's defaults (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--max-background", type=float, default=0.25, metavar="CORES",
        help="re-run a cell when other processes used more CPU than this (default 0.25)",
    )  # fmt: skip
    p.add_argument(
        "--retries", type=int, default=None,
        help="re-runs allowed per cell for background load (default 2; quick 0)",
    )  # fmt: skip
    p.add_argument(
        "--budget", type=float, default=None, metavar="SECONDS",
        help="no re-runs once they would push the run past this (default 540; quick 90)",
    )  # fmt: skip
    p.add_argument(
        "--go-proxy", type=Path, default=None, metavar="BIN_OR_DIR",
        help=f"also measure the reference Go proxy as path {GO_PATH}: its binary, or its source "
        "directory (built with its build.sh), e.g. ../shared/tools/go-raw-proxy",
    )  # fmt: skip
    p.add_argument(
        "--lifecycle", action="store_true",
        help="also measure pod start on the real containerd (RunPodSandbox + StopPodSandbox, "
        "one at a time) for the direct path and every scenario; on by itself with netdev",
    )  # fmt: skip
    p.add_argument(
        "--kubelet-requests", action="store_true",
        help="the fake runtime's CreateContainer cells send the request a real kubelet sent "
        "(bench/kubelet_captured, from the kubelet corpus) instead of the bench's own pod, and "
        "a RunPodSandbox cell sends kubelet's captured RunPodSandbox (a pod per call)",
    )  # fmt: skip
    p.add_argument(
        "--kubelet", action="store_true",
        help="instead of the cells: pod start as a real kubelet sees it, direct (CPU manager "
        "none, and static), and through crihook (hooks none; cpuset,numa,oom), paired reps on "
        "--containerd (bench.kubelet_start)",
    )  # fmt: skip
    p.add_argument(
        "--kubelet-qos", choices=("guaranteed", "burstable", "besteffort"), default="guaranteed",
        help="the QoS class of --kubelet's pod (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--keep-workdir", action="store_true", help="keep sockets and logs")
    args = p.parse_args(argv)
    if args.containerd == "crio" and not args.kubelet:
        p.error("--containerd crio: with --kubelet only")
    quick = args.quick
    args.reps = args.reps or (1 if quick else 15 if args.kubelet else 5)
    args.duration = args.duration or (1.0 if quick else 2.5)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if quick else 0.5)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.retries = args.retries if args.retries is not None else (0 if quick else 2)
    args.budget = args.budget if args.budget is not None else (90.0 if quick else 540.0)
    known = {s.name for s in SCENARIOS}
    if args.scenarios:
        unknown = set(args.scenarios) - known
        if unknown:
            p.error(f"unknown scenario(s) {sorted(unknown)}; known: {sorted(known)}")
    else:
        args.scenarios = [s.name for s in SCENARIOS if s.default]
    if args.real_containerd is None:
        args.real_containerd = _lab_available()
        if not args.real_containerd:
            print("[bench] real containerd not available here: fake runtime only",
                  file=sys.stderr)  # fmt: skip
    args.crihook_cmd = args.crihook_cmd.split() if args.crihook_cmd else default_crihook_cmd()
    args.seed = args.seed if args.seed is not None else random.randrange(2**32)
    return args


def run_reps(
    bench: Bench,
    cells: list[Cell],
    records: list[dict[str, Any]],
    failures: list[str],
    deadline: float,
) -> int:
    """Every rep: all cells in a new random order. A cell whose window saw more than
    ``--max-background`` cores of someone else's load is run again (up to ``--retries``
    times, while the run still fits before ``deadline``); the quietest attempt is kept.
    Returns the number of re-runs."""
    args = bench.args
    rng = random.Random(args.seed)
    retried = 0
    cell_seconds: list[float] = []
    total = args.reps * len(cells)
    done = 0
    for rep in range(args.reps):
        order = cells[:]
        rng.shuffle(order)
        for i, cell in enumerate(order, 1):
            best: dict[str, Any] | None = None
            for attempt in range(1 + args.retries):
                t0 = time.monotonic()
                result = bench.run_cell(cell, args.warmup, args.duration)
                cell_seconds.append(time.monotonic() - t0)
                result["attempt"] = attempt
                background = result.get("other_busy_cores")
                best_background = None if best is None else best.get("other_busy_cores")
                if best is None or (
                    background is not None
                    and (best_background is None or background < best_background)
                ):
                    best = result
                if "failed" in result or background is None:
                    break
                if background <= args.max_background:
                    break
                remaining = (total - done) * statistics.mean(cell_seconds)
                if attempt == args.retries or time.monotonic() + remaining > deadline:
                    break
                retried += 1
                bench._say(
                    f"{cell.backend} {cell.method} c={cell.concurrency} {cell.path}: "
                    f"background load {background:.2f} cores > {args.max_background}: again"
                )
            assert best is not None
            done += 1
            fields = ("backend", "method", "concurrency", "path")
            records.append({"rep": rep, **dict(zip(fields, cell.key, strict=True)), "result": best})
            if "failed" in best:
                failures.append(f"rep {rep} {cell.key}: {best['failed']}")
                status = "FAILED"
            else:
                lat = best["latency_us"]
                status = (
                    f"p50 {lat['p50']:,.0f} µs p99 {lat['p99']:,.0f} µs "
                    f"{best['rps']:,.0f} req/s errors {best['errors']} "
                    f"background {best['other_busy_cores']:.2f} cores"
                )
                if best["errors"]:
                    failures.append(
                        f"rep {rep} {cell.key}: {best['errors']} errors, "
                        f"first: {best['first_error']}"
                    )
            bench._say(
                f"rep {rep + 1}/{args.reps} cell {i}/{len(order)} {cell.backend} "
                f"{cell.method} c={cell.concurrency} {cell.path}: {status}"
            )
    return retried


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="crihook-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"[bench] kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kubelet:
        print(
            kubelet_start.run_kubelet_start(args.containerd, args.reps, args.kubelet_qos, args.seed)
        )
        return 0
    if args.node_pods:
        counts = [int(n) for n in args.node_pods.split(",")]
        print(
            node_pods.run_node_pods(
                counts,
                args.node_pods_measure,
                args.node_pods_updates,
                args.node_pods_profile,
                pool_in=args.node_pods_pool_in,
            )
        )
        return 0
    started = time.monotonic()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    records: list[dict[str, Any]] = []
    failures: list[str] = []
    with _workdir(args.keep_workdir) as workdir:
        bench = Bench(args, workdir)
        try:
            bench.start()
            rss = bench.idle_rss()
            cells = bench.cells()
            # One untimed pass so every process has warmed its code paths and connections.
            bench._say("untimed warm-up pass")
            for cell in cells:
                if cell.concurrency == max(args.concurrency):
                    bench.run_cell(cell, warmup=0.0, duration=min(0.5, args.duration))
            retries = run_reps(bench, cells, records, failures, deadline=started + args.budget)
            for r in rss:
                crihook = next(c for c in bench.crihooks.values() if c.label == r["crihook"])
                r["end_rss_bytes"] = rss_bytes(crihook.pid)
        finally:
            bench.close()
    rows = per_rep_rows(records)
    summary = summarize(rows, bench.cells())
    targets = check_targets(summary, rss, bench.scenarios, rows)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": _machine(),
        "reps": args.reps,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "scenarios": {s.name: {"args": s.args, "about": s.about} for s in bench.scenarios},
        "backends": list(bench.backends),
        "containerd": args.containerd if args.real_containerd else None,
        "create_container_request": "kubelet" if args.kubelet_requests else "bench pod",
        "tools_grpc_experiments": args.tools_grpc_experiments,
        "max_background_cores": args.max_background,
        "reruns_for_background_load": retries,
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_at_start": load_at_start,
    }
    background = [r["other_busy_cores"] for r in rows if r.get("other_busy_cores") is not None]
    if background:
        meta["background_cores_median"] = round(statistics.median(background), 2)
        meta["background_cores_max"] = round(max(background), 2)
    go_table = against_go(rows, rss, bench.scenarios) if args.go_proxy is not None else None
    report = render_report(meta, summary, rss, targets, failures, go_table)
    print(report)
    print(f"[bench] done in {meta['wall_s']} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({
            "meta": meta, "summary": summary, "rss": rss, "targets": targets,
            "rows": rows, "records": records, "failures": failures, "against_go": go_table,
        }, indent=1) + "\n")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
