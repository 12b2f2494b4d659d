"""A real kubelet (built by tests.lab.peers) on the lab's runtime: a node for end-to-end tests.

Not to be confused with tests/lab/kubelet.py, the Python CRI client that speaks as kubelet
would: this runs kubelet itself.

:class:`KubeletNode` runs one kubelet with its own root dir, cgroup root, static pod dir and
runtime endpoint (the runtime's socket, or crihook's in front of it); standalone (static pods)
or registered with an API server (``kubeconfig``, tests/lab/apiserver.py). kubelet changes
nothing on the host: it runs in a private mount namespace (``unshare --mount``, mounts of the
host propagate in, none of its own out) where the /proc/sys entries it would set are covered
by files of the node, and /var/log (where it links container logs) by a dir of the node.

``cleanup()`` leaves nothing: kubelet stopped, the sandboxes that appeared on the runtime
since ``start()`` removed through CRI, the cgroup root removed in every hierarchy, the node's
dir removed. kubelet, crihook and the runtime restart independently: ``restart()`` here,
``CrihookProcess`` and ``RuntimeLab.restart()`` there.

What is on the runtime is read through CRI on the runtime's own socket (:class:`NodeView`),
so a test sees what the runtime applied, whoever asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab import cgroups
from tests.lab.host import free_port
from tests.lab.kubelet_config import (
    KubeletSettings,
    command_line,
    kubelet_configuration,
)
from tests.lab.runtime_lab import LabError

__all__ = [
    "COVERED_SYSCTLS",
    "KubeletNode",
    "NodeContainer",
    "NodePod",
    "NodeView",
    "oom_score_adj_of",
]

# What kubelet's container manager sets at start (setupKernelTunables) on a node that does
# not protect its kernel defaults: covered by files in kubelet's mount namespace.
COVERED_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
NODE_DIR_PREFIX = "crihook-node-"
_POLL = 0.1


@dataclass(frozen=True)
class NodeContainer:
    id: str
    name: str
    pid: int
    cgroup: str  # absolute cgroupfs path, as the runtime made it
    attempt: int


@dataclass(frozen=True)
class NodePod:
    sandbox_id: str
    name: str
    namespace: str
    uid: str
    cgroup_parent: str  # kubelet's pod cgroup
    containers: Mapping[str, NodeContainer]


def oom_score_adj_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


class NodeView:
    """The runtime's pods as its own CRI socket shows them (kubelet's labels name them)."""

    def __init__(self, runtime_endpoint: str) -> None:
        self.endpoint = runtime_endpoint

    @contextlib.contextmanager
    def _runtime(self) -> Iterator[api_pb2_grpc.RuntimeServiceStub]:
        with grpc.insecure_channel(self.endpoint) as channel:
            yield api_pb2_grpc.RuntimeServiceStub(channel)

    def sandbox_ids(self) -> set[str]:
        with self._runtime() as rt:
            items = rt.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=30).items
        return {s.id for s in items}

    def pod(self, name: str, namespace: str) -> NodePod | None:
        """The ready sandbox of pod ``namespace/name`` with its running containers."""
        selector = {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace}
        with self._runtime() as rt:
            ready = api_pb2.PodSandboxStateValue(state=api_pb2.SANDBOX_READY)
            found = rt.ListPodSandbox(
                api_pb2.ListPodSandboxRequest(
                    filter=api_pb2.PodSandboxFilter(label_selector=selector, state=ready)
                ),
                timeout=30,
            ).items
            if not found:
                return None
            sandbox = max(found, key=lambda s: s.created_at)
            status = rt.PodSandboxStatus(
                api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id, verbose=True),
                timeout=30,
            )
            parent = _sandbox_cgroup_parent(status.info)
            running = api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING)
            listed = rt.ListContainers(
                api_pb2.ListContainersRequest(
                    filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox.id, state=running)
                ),
                timeout=30,
            ).containers
            containers = {}
            for c in listed:
                info = rt.ContainerStatus(
                    api_pb2.ContainerStatusRequest(container_id=c.id, verbose=True), timeout=30
                ).info
                pid, cgroup = _pid_and_cgroup(info)
                containers[c.metadata.name] = NodeContainer(
                    c.id, c.metadata.name, pid, cgroup, c.metadata.attempt
                )
        return NodePod(
            sandbox.id,
            name,
            namespace,
            sandbox.metadata.uid,
            parent,
            containers,
        )

    def wait_running(
        self, name: str, namespace: str, containers: int, timeout: float, what: str = ""
    ) -> NodePod:
        """Wait until the pod's sandbox is ready with ``containers`` running containers."""
        deadline = time.monotonic() + timeout
        while True:
            pod = self.pod(name, namespace)
            if pod is not None and len(pod.containers) >= containers:
                return pod
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pod {namespace}/{name} not running with {containers} containers after "
                    f"{timeout:.0f}s (seen: {pod}){what}"
                )
            time.sleep(_POLL)

    def wait_gone(self, name: str, namespace: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pod(name, namespace) is not None:
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {namespace}/{name} still ready after {timeout:.0f}s")
            time.sleep(_POLL)

    def remove_sandboxes(self, ids: set[str]) -> list[str]:
        """Stop and remove the given sandboxes and their containers; returns the problems."""
        problems: list[str] = []
        with self._runtime() as rt:
            for c in rt.ListContainers(api_pb2.ListContainersRequest(), timeout=30).containers:
                if c.pod_sandbox_id in ids and c.state == api_pb2.CONTAINER_RUNNING:
                    try:
                        rt.StopContainer(
                            api_pb2.StopContainerRequest(container_id=c.id, timeout=0), timeout=60
                        )
                    except grpc.RpcError as exc:
                        problems.append(f"stopping container {c.id[:12]}: {exc.details()}")
            for sandbox_id in sorted(ids):
                try:
                    rt.StopPodSandbox(
                        api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60
                    )
                    rt.RemovePodSandbox(
                        api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60
                    )
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        problems.append(f"removing sandbox {sandbox_id[:12]}: {exc.details()}")
        return problems


def _sandbox_cgroup_parent(info: Mapping[str, str]) -> str:
    raw = json.loads(info.get("info") or "{}")
    # containerd: config.linux.cgroup_parent; CRI-O: runtimeSpec's cgroupsPath's parent.
    parent = ((raw.get("config") or {}).get("linux") or {}).get("cgroup_parent")
    if parent:
        return str(parent)
    path = ((raw.get("runtimeSpec") or {}).get("linux") or {}).get("cgroupsPath") or ""
    return str(Path(path).parent) if path else ""


def _pid_and_cgroup(info: Mapping[str, str]) -> tuple[int, str]:
    raw = json.loads(info.get("info") or "{}")
    path = ((raw.get("runtimeSpec") or {}).get("linux") or {}).get("cgroupsPath") or ""
    return int(raw.get("pid") or 0), str(path)


class KubeletNode:
    """One real kubelet on the lab runtime. ``runtime_endpoint``: the runtime's socket;
    ``endpoint``: what kubelet talks to (that socket, or crihook's; default the runtime)."""

    def __init__(
        self,
        kubelet: Path,
        runtime_endpoint: str,
        *,
        endpoint: str | None = None,
        cpu_manager_policy: str = "none",
        reserved_cpus: str = "0",
        kubeconfig: str | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        cpu_manager_reconcile_period: str = "5s",
    ) -> None:
        self.kubelet = kubelet
        self.dir = Path(tempfile.mkdtemp(prefix=NODE_DIR_PREFIX, dir="/tmp"))
        # A DNS label (the Node's name) unique per node dir; also the cgroup root's name.
        self.name = "crihook-node-" + hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]
        self.view = NodeView(runtime_endpoint)
        self.static_pod_dir = self.dir / "manifests"
        kubeconfig_path = None
        if kubeconfig is not None:
            kubeconfig_path = self.dir / "kubeconfig"
            kubeconfig_path.write_text(kubeconfig)
        self.settings = KubeletSettings(
            node_name=self.name,
            root_dir=self.dir / "root",
            cgroup_root=f"/{self.name}",
            runtime_endpoint=endpoint or runtime_endpoint,
            static_pod_dir=self.static_pod_dir,
            pod_logs_dir=self.dir / "pods",
            healthz_port=free_port(),
            cpu_manager_policy=cpu_manager_policy,
            reserved_cpus=reserved_cpus,
            kubeconfig=kubeconfig_path,
            feature_gates=tuple(sorted((feature_gates or {}).items())),
            cpu_manager_reconcile_period=cpu_manager_reconcile_period,
        )
        self.log_path = self.dir / "kubelet.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._sandboxes_before: set[str] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def cgroup_root(self) -> str:
        return self.settings.cgroup_root

    @property
    def pid(self) -> int | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    def start(self, timeout: float = 120.0) -> KubeletNode:
        """Start kubelet and wait until its healthz answers ok."""
        if self.pid is not None:
            raise LabError(f"kubelet {self.name} is already running (pid {self.pid})")
        if self._sandboxes_before is None:
            self._sandboxes_before = self.view.sandbox_ids()
            self._prepare()
        config = self.dir / "kubelet-config.json"
        config.write_text(json.dumps(kubelet_configuration(self.settings), indent=2))
        argv = command_line(self.kubelet, self.settings, config)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process
        self._proc = subprocess.Popen(
            _in_private_mounts(argv, self._covers(), self.dir / "var-log"),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_healthy(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM kubelet and wait; its pods keep running (as on a node)."""
        self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> None:
        self._terminate(signal.SIGKILL, 30.0)

    def restart(self, timeout: float = 120.0) -> None:
        self.stop()
        self.start(timeout)

    def cleanup(self) -> None:
        """Stop kubelet, remove its pods through CRI, its cgroups and its dir."""
        problems: list[str] = []
        try:
            self.kill()
        except LabError as exc:
            problems.append(str(exc))
        if self._sandboxes_before is not None:
            try:
                mine = self.view.sandbox_ids() - self._sandboxes_before
                problems += self.view.remove_sandboxes(mine)
            except grpc.RpcError as exc:
                problems.append(f"listing the runtime's sandboxes: {exc.details()}")
            problems += cgroups.remove_cgroup_tree(self.cgroup_root)
        shutil.rmtree(self.dir, ignore_errors=True)
        if problems:
            raise LabError(
                f"kubelet node {self.name} cleanup incomplete:\n  " + "\n  ".join(problems)
            )

    def __enter__(self) -> KubeletNode:
        return self if self.pid is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def log(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no kubelet log)"
        return f"--- last lines of {self.log_path}:\n" + "\n".join(text[-lines:])

    # -- static pods -------------------------------------------------------------------

    def static_pod_name(self, name: str) -> str:
        """kubelet names a static pod ``<name>-<node>``."""
        return f"{name}-{self.name}"

    def write_static_pod(self, manifest: Mapping[str, Any]) -> str:
        """Write a pod manifest into the static pod dir by rename (kubelet never reads a
        half-written file); returns the pod's name on the node."""
        name = str(manifest["metadata"]["name"])
        staged = self.static_pod_dir / f".{name}.json.tmp"  # dot files are not read
        staged.write_text(json.dumps(manifest))
        staged.rename(self.static_pod_dir / f"{name}.json")
        return self.static_pod_name(name)

    def remove_static_pod(self, name: str) -> None:
        (self.static_pod_dir / f"{name}.json").unlink()

    def wait_running(
        self, pod_name: str, containers: int = 1, namespace: str = "default"
    ) -> NodePod:
        from tests.lab.crihook_proc import PATIENCE

        return self.view.wait_running(
            pod_name, namespace, containers, PATIENCE, what=f"\n{self.log(30)}"
        )

    # -- internals ---------------------------------------------------------------------

    def _prepare(self) -> None:
        for d in (
            self.static_pod_dir,
            self.settings.root_dir,
            self.dir / "pods",
            self.dir / "var-log",
        ):
            d.mkdir(parents=True, exist_ok=True)
        _make_cgroup_root(self.cgroup_root)

    def _covers(self) -> dict[Path, Path]:
        """/proc/sys entry -> the node's file holding the host's value (kubelet writes there)."""
        covers = {}
        sysctl_dir = self.dir / "sysctl"
        sysctl_dir.mkdir(exist_ok=True)
        for entry in COVERED_SYSCTLS:
            target = Path("/proc/sys") / entry
            if not target.exists():
                continue
            cover = sysctl_dir / entry.replace("/", ".")
            if not cover.exists():
                cover.write_text(target.read_text())
            covers[target] = cover
        return covers

    def _wait_healthy(self, timeout: float) -> None:
        url = f"http://127.0.0.1:{self.settings.healthz_port}/healthz"
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                code = self._proc.returncode
                self._close_log()
                raise LabError(f"kubelet exited {code} at start\n{self.log()}")
            left = max(deadline - time.monotonic(), 1.0)  # a slow answer on a loaded machine
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(url, timeout=left) as resp,
            ):
                if resp.read().strip() == b"ok":
                    return
            if time.monotonic() > deadline:
                raise LabError(f"kubelet healthz not ok after {timeout:.0f}s\n{self.log()}")
            time.sleep(_POLL)

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _in_private_mounts(argv: list[str], covers: Mapping[Path, Path], var_log: Path) -> list[str]:
    """``argv`` run in a new mount namespace (host mounts propagate in, none out) where each
    covered path has the node's file bind-mounted over it and /var/log is the node's."""
    binds = [(str(cover), str(target)) for target, cover in covers.items()]
    binds.append((str(var_log), "/var/log"))
    script = "set -e\n" + "".join(f'mount --bind "{s}" "{t}"\n' for s, t in binds)
    script += 'exec "$@"\n'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "slave",
        "--",
        "sh",
        "-c",
        script,
        "kubelet",
        *argv,
    ]


def _make_cgroup_root(path: str) -> None:
    """kubelet requires its cgroup root to exist in every hierarchy; a new cpuset cgroup
    starts with no CPUs or memory nodes, so it gets its parent's."""
    rel = path.strip("/")
    for mount in cgroups.cgroup_mounts():
        d = mount / rel
        d.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (d / name).exists() and not (d / name).read_text().strip():
                (d / name).write_text((mount / name).read_text())


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(_POLL)
