"""Pod start on a node that already holds many containers: does a pod cost more on a full
node?

    python -m bench.run --node-pods 0,100,500,1000 [--node-pods-updates after-answer]
                        [--node-pods-measure 50] [--node-pods-profile DIR]
                        [--node-pods-pool-in containers|qos-cgroups]

For each count N: crihook (`--hooks cpuset,numa,oom`) on the 256-CPU, 8-NUMA sysfs fixture
(tests.lab.sysfs.EPYC_256_8NUMA) in front of the memory runtime (tests.lab.memory_runtime),
filled with N one-container pods through crihook, every 10th Guaranteed with 1 CPU (an
exclusive CPU: every shared container is due the shrunk pool), the rest Burstable. Then
`measure` more pods are started the same way, one after another, each a RunPodSandbox +
CreateContainer + StartContainer, and reported:

- wall per pod start (the three calls, as kubelet waits for them), median and mean;
- crihook's CPU per pod start: its process's CPU over the measured pods, the updates they
  caused included (the run waits until the runtime saw the last of them);
- the update window (`crihook_container_update_window_seconds`): from a shared container
  due a new pool until the runtime applied it, over the measured pods (p50, max bucket).

`--node-pods-pool-in qos-cgroups`: the cpuset hook holds the shared pool in the QoS cgroups
of a fake cgroup v2 tree (`--cgroup-root`, tests.lab.fake_cgroup_tree) instead of every
shared container's cpuset. Its window is not an update's: for each measured Guaranteed pod
the run reads `kubepods/burstable/cpuset.cpus` when CreateContainer is answered (it must
have lost the new exclusive CPU already: "narrowed late" counts those that had not), so the
window, from the pick (the pre stage) to the write (the post stage, before the answer), is
bounded by that CreateContainer's wall time, reported as the QoS window. No update is sent
to those containers, so the update window columns read "-".

`--node-pods-profile DIR`: py-spy records crihook over the measured pods (and their
updates), raw stacks in `DIR/<pods>.txt`, the top frames printed (needs py-spy).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.hooks.node import parse_cpu_list
from tests.lab.crihook_proc import CrihookProcess
from tests.lab.fake_cgroup_tree import QOS_PATHS, write_qos_tree
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.metrics_scrape import scrape
from tests.lab.sysfs import EPYC_256_8NUMA, GIB, write_sysfs

__all__ = ["measure_node", "run_node_pods"]

MIB = 1 << 20
GUARANTEED_EVERY = 10
SETTLED_QUIET_SECONDS = 0.5
"""The updates are done once the runtime saw none for this long."""


class _CountingRuntime(MemoryRuntime):
    """The memory runtime counting the updates it applied, for the bench process to read."""

    def __init__(self, socket_path: Path, applied: Any) -> None:
        super().__init__(socket_path)
        self._applied = applied

    def _update(self, raw: bytes) -> bytes:
        answer = super()._update(raw)
        with self._applied.get_lock():
            self._applied.value += 1
        return answer


def _serve_runtime(socket_path: Path, applied: Any, stop: Any) -> None:
    """The memory runtime in a process of its own: its threads do not take the bench's
    (the client's) interpreter lock, as containerd takes none of crihook's."""
    runtime = _CountingRuntime(socket_path, applied).start()
    stop.wait()
    runtime.stop()


class _Node:
    def __init__(
        self, stub: api_pb2_grpc.RuntimeServiceStub, applied: Any, qos_file: Path | None
    ) -> None:
        self.stub = stub
        self.applied = applied
        self.started = 0
        self.qos_file = qos_file
        """The Burstable QoS cgroup's cpuset.cpus, with `qos-cgroups`."""
        self.qos_windows: list[float] = []
        """Per Guaranteed pod: its CreateContainer's wall time, which bounds the window
        when the pool was narrowed before the answer."""
        self.qos_late = 0
        """Guaranteed pods whose CreateContainer was answered before the pool narrowed."""

    def pod_start(self) -> float:
        """One pod as kubelet starts it; its wall time in seconds."""
        i = self.started
        self.started += 1
        guaranteed = i % GUARANTEED_EVERY == GUARANTEED_EVERY - 1
        container = ContainerSpec(
            name="app",
            cpu_request=1000 if guaranteed else 100,
            cpu_limit=1000 if guaranteed else None,
            memory_request=64 * MIB,
            memory_limit=64 * MIB if guaranteed else None,
        )
        spec = PodSpec(name=f"pod-{i}", containers=[container])
        config = sandbox_config(spec)
        begun = time.perf_counter()
        sandbox = self.stub.RunPodSandbox(
            api_pb2.RunPodSandboxRequest(config=config), timeout=60
        ).pod_sandbox_id
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            config=container_config(spec, container, node_memory=256 * GIB),
            sandbox_config=config,
        )
        before = self._qos_count() if guaranteed else None
        sent = time.perf_counter()
        cid = self.stub.CreateContainer(request, timeout=60).container_id
        if before is not None:
            self._check_narrowed(before, time.perf_counter() - sent)
        self.stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)
        return time.perf_counter() - begun

    def _qos_count(self) -> int | None:
        if self.qos_file is None:
            return None
        return len(parse_cpu_list(self.qos_file.read_text().strip()))

    def _check_narrowed(self, before: int, create_wall: float) -> None:
        if self._qos_count() != before - 1:  # one exclusive CPU per Guaranteed pod
            self.qos_late += 1
        self.qos_windows.append(create_wall)

    def updates_seen(self) -> int:
        return int(self.applied.value)

    def settle(self) -> None:
        """Until the runtime saw no update for SETTLED_QUIET_SECONDS."""
        seen, quiet_since = self.updates_seen(), time.monotonic()
        while time.monotonic() - quiet_since < SETTLED_QUIET_SECONDS:
            time.sleep(0.05)
            now = self.updates_seen()
            if now != seen:
                seen, quiet_since = now, time.monotonic()


def _record(pid: int, profile: Path, pods: int) -> subprocess.Popen[bytes]:
    """py-spy recording crihook until interrupted."""
    from bench.profile import py_spy  # bench.profile imports bench.run, which imports us

    profile.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--nonblocking", "--rate", "250",
         "--format", "raw", "-o", str(profile / f"{pods}.txt")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attached
    return spy


def _top_frames(raw: Path) -> str:
    from bench.profile import top_frames

    return top_frames(raw, 30)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _window(samples: dict[Any, float]) -> tuple[dict[float, float], float]:
    """The window histogram's cumulative buckets (upper bound → count) and its count."""
    buckets: dict[float, float] = {}
    count = 0.0
    for (name, labels), value in samples.items():
        if name == "crihook_container_update_window_seconds_bucket":
            buckets[float(dict(labels)["le"])] = value
        elif name == "crihook_container_update_window_seconds_count":
            count = value
    return buckets, count


def _quantile_bound(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The bucket bound under which a fraction q of the windows observed in between fell."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    if not total:
        return float("nan")  # no update in between
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0.0) >= q * total:
            return bound
    return float("inf")


def measure_node(
    pods: int,
    measure: int,
    updates: str,
    say: Any = print,
    profile: Path | None = None,
    pool_in: str = "containers",
) -> dict[str, Any]:
    """One count: fill the node with `pods` pods, then time `measure` more (recorded by
    py-spy into `profile/<pods>.txt` when `profile` is given)."""
    with tempfile.TemporaryDirectory(prefix="np-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        root = write_sysfs(workdir / "sys", EPYC_256_8NUMA)
        extra: list[str] = []
        config = None
        qos_file = None
        if pool_in == "qos-cgroups":
            cgroups = write_qos_tree(workdir / "cgroup")
            extra = ["--cgroup-root", str(cgroups)]
            config = '[hooks.cpuset]\nshared_pool_in = "qos-cgroups"\n'
            qos_file = cgroups / QOS_PATHS["cgroupfs"][0] / "cpuset.cpus"
        spawn = multiprocessing.get_context("spawn")  # no grpc state carried over a fork
        applied, stop = spawn.Value("q", 0), spawn.Event()
        runtime = spawn.Process(
            target=_serve_runtime, args=(workdir / "rt.sock", applied, stop), name="runtime"
        )
        runtime.start()
        deadline = time.monotonic() + 60
        while not (workdir / "rt.sock").exists():
            if time.monotonic() > deadline or not runtime.is_alive():
                raise RuntimeError("the memory runtime did not start")
            time.sleep(0.05)
        metrics = f"unix://{workdir}/metrics.sock"
        proc = CrihookProcess(
            f"unix://{workdir}/rt.sock",
            workdir=workdir,
            hooks="cpuset,numa,oom",
            config=config,
            args=[
                "--sysfs-root", str(root), "--log-level", "warning",
                "--metrics-listen", metrics, "--updates", updates, *extra,
            ],
        )  # fmt: skip
        try:
            proc.start()
            with grpc.insecure_channel(proc.endpoint) as channel:
                node = _Node(api_pb2_grpc.RuntimeServiceStub(channel), applied, qos_file)
                began = time.monotonic()
                for _ in range(pods):
                    node.pod_start()
                node.settle()
                say(f"[node-pods] {pods} pods on the node in {time.monotonic() - began:.1f} s")
                before, count_before = _window(scrape(metrics))
                assert proc.proc is not None
                spy = _record(proc.proc.pid, profile, pods) if profile is not None else None
                cpu0 = _cpu_seconds(proc.proc.pid)
                node.qos_windows, node.qos_late = [], 0  # the measured pods' only
                walls = [node.pod_start() for _ in range(measure)]
                node.settle()
                cpu = _cpu_seconds(proc.proc.pid) - cpu0  # the updates included
                if spy is not None:
                    assert profile is not None
                    spy.send_signal(signal.SIGINT)  # py-spy writes what it recorded
                    spy.wait(60)
                    say(_top_frames(profile / f"{pods}.txt"))
                after, count_after = _window(scrape(metrics))
        finally:
            proc.stop()
            stop.set()
            runtime.join(30)
    return {
        "pods_on_node": pods,
        "measured_pod_starts": measure,
        "updates": updates,
        "wall_ms_p50": round(statistics.median(walls) * 1e3, 2),
        "wall_ms_mean": round(statistics.fmean(walls) * 1e3, 2),
        "crihook_cpu_ms_per_pod": round(cpu / measure * 1e3, 2),
        "updates_applied": int(count_after - count_before),
        "window_p50_le_s": _quantile_bound(before, after, 0.5),
        "window_max_le_s": _quantile_bound(before, after, 1.0),
        "shared_pool_in": pool_in,
        "qos_window_ms_p50": _ms(statistics.median(node.qos_windows)) if node.qos_windows else None,
        "qos_window_ms_max": _ms(max(node.qos_windows)) if node.qos_windows else None,
        "qos_narrowed_late": node.qos_late if qos_file is not None else None,
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def run_node_pods(
    counts: list[int],
    measure: int,
    updates: str,
    profile: Path | None = None,
    pool_in: str = "containers",
) -> str:
    """Every count, one after another; a markdown table with the ratios to the count 100."""
    rows = []
    for pods in counts:
        rows.append(measure_node(pods, measure, updates, profile=profile, pool_in=pool_in))
        print(f"[node-pods] {rows[-1]}", flush=True)
    base = next((r for r in rows if r["pods_on_node"] == 100), None)
    lines = [
        f"pod start through cpuset,numa,oom, EPYC_256_8NUMA fixture, memory runtime, "
        f"updates = {updates}, shared_pool_in = {pool_in}, {measure} pod starts measured per "
        "row, every "
        f"{GUARANTEED_EVERY}th Guaranteed (1 CPU); {time.strftime('%Y-%m-%d %H:%M')}, "
        f"load {os.getloadavg()[0]:.1f}",
        "",
        "| pods on the node | wall p50 | wall mean | crihook CPU per pod start | "
        "updates applied | window p50 (≤) | window max (≤) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    if pool_in == "qos-cgroups":
        lines[2] = lines[2].rstrip() + " QoS window p50 / max (≤) | narrowed late |"
        lines[3] += " ---: | ---: |"
    for r in rows:
        ratio = ""
        if base is not None and base is not r:
            ratio = (
                f" ({r['wall_ms_p50'] / base['wall_ms_p50']:.2f}x, "
                f"{r['crihook_cpu_ms_per_pod'] / base['crihook_cpu_ms_per_pod']:.2f}x CPU)"
            )
        lines.append(
            f"| {r['pods_on_node']}{ratio} | {r['wall_ms_p50']} ms | {r['wall_ms_mean']} ms | "
            f"{r['crihook_cpu_ms_per_pod']} ms | {r['updates_applied']} | "
            f"{_window_cell(r['window_p50_le_s'])} | {_window_cell(r['window_max_le_s'])} |"
        )
        if pool_in == "qos-cgroups":
            lines[-1] += (
                f" {r['qos_window_ms_p50']} / {r['qos_window_ms_max']} ms |"
                f" {r['qos_narrowed_late']} |"
            )
    return "\n".join(lines)


def _window_cell(seconds: float) -> str:
    """A window bound in ms; "-" when no update was observed (NaN)."""
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:g} ms"
