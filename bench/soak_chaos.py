"""Chaos: pods created and deleted through crihook while containerd, an out-of-process plugin
and crihook itself are killed (SIGKILL) and restarted at random; then the invariants.

crihook runs the cpuset (CPU 0 reserved: on this 2-CPU node CPU 1 is the one exclusive CPU),
numa, oom and devices hooks (a pool `gpu` of three test device nodes made with mknod), and the
annotate example plugin as its own process, required with failure policy `fail`. Workers run
kubelet's calls for pods of three kinds (Guaranteed 1-CPU, Burstable with a GPU, Burstable),
keep a few alive, and remove the oldest; a call that failed is retried later, as kubelet's
sync loop would.

After the faults stop (everything running again, crihook ready):
- no exclusive CPU is held by two containers, nor in another container's cpuset, and no pooled
  device is in two containers (what containerd has: the OCI specs);
- the store (`crihook state --json`) has containerd's pods and containers, and the hooks'
  holdings name only containers containerd has, with the CPUs and devices containerd gave;
- every CRI call succeeded or failed with a clear status;
- nothing leaked: with every pod removed, a probe dump of crihook (fds by kind, asyncio tasks,
  threads) before and after a round of pods and of containerd and plugin restarts is the same,
  no temp file stays in the state dir, no socket but crihook's in its dir, and no holding or
  store entry is left.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.soak_common import Calls, ProbedCrihook, leaks_between, tracebacks
from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import wait_for
from tests.lab.kubelet import KubeletClient
from tests.lab.kubelet_encoding import (
    ContainerSpec,
    PodSpec,
    container_config,
    pod_log_directory,
    sandbox_config,
)
from tests.lab.plugin_proc import Plugin

__all__ = ["ChaosResult", "run_chaos"]

MiB = 1 << 20
GPUS = 3
HOOKS = "cpuset,numa,oom,devices"
POOL_ANNOTATION = "pools.crihook.io/container.app"
ASSIGNED = "pools.crihook.io/assigned"
VICTIMS = ("containerd", "plugin", "crihook")
CALL_TIMEOUT = 30.0


@dataclass
class ChaosResult:
    seed: int
    seconds: float
    calls: Calls = field(default_factory=Calls)
    kills: Counter[str] = field(default_factory=Counter)
    pods_created: int = 0
    pods_removed: int = 0
    max_live: int = 0
    problems: list[str] = field(default_factory=list)
    leak_check: str = ""
    checked: str = ""
    checked_full: str = ""

    def summary(self) -> str:
        lines = [
            f"chaos: seed {self.seed}, {self.seconds:.0f} s of faults, kills "
            f"{dict(self.kills)}, pods started {self.pods_created}, teardowns "
            f"{self.pods_removed}, at most {self.max_live} alive per worker",
            f"  after the faults: {self.checked}",
            f"  then every pod removed and the whole node taken: {self.checked_full}",
            f"  CRI calls: {self.calls.total} ({len(self.calls.unclear)} with an unclear status)",
            self.calls.table(),
            f"  leak check: {self.leak_check}",
            "  invariants: " + ("all hold" if not self.problems else "VIOLATED"),
        ]
        lines += [f"    - {p}" for p in self.problems]
        return "\n".join(lines)


def _config(dev: Path) -> str:
    gpus = ", ".join(f'{{ id = "{i}", path = "{dev}/gpu{i}", numa = 0 }}' for i in range(GPUS))
    return (
        '[hooks.cpuset]\nreserved_cpus = "0"\n'
        '[hooks.devices]\nnamespaces = ["default"]\n'
        f'[hooks.devices.pools.gpu]\nenv = "GPU_VISIBLE_DEVICES"\ndevices = [{gpus}]\n'
    )


def _pod(rng: random.Random, name: str) -> PodSpec:
    kind = rng.choice(("guaranteed", "gpu", "burstable"))
    if kind == "guaranteed":
        app = ContainerSpec(
            "app", cpu_request=1000, cpu_limit=1000, memory_request=32 * MiB, memory_limit=32 * MiB
        )
        return PodSpec(name=f"{name}-g", containers=[app])
    app = ContainerSpec(
        "app", cpu_request=100, cpu_limit=500, memory_request=16 * MiB, memory_limit=64 * MiB
    )
    if kind == "gpu":
        return PodSpec(
            name=f"{name}-d",
            containers=[app],
            annotations={POOL_ANNOTATION: json.dumps({"gpu": 1})},
        )
    return PodSpec(name=f"{name}-b", containers=[app])


@dataclass
class _Pod:
    spec: PodSpec
    sandbox: api_pb2.PodSandboxConfig
    sandbox_id: str = ""
    container_id: str = ""


class _Kubelet:
    """kubelet's calls through crihook, each recorded; tolerant of crihook restarting."""

    def __init__(self, endpoint: str, containerd: Containerd, calls: Calls) -> None:
        # Reconnect quickly after crihook restarts (grpc's default backoff grows to minutes).
        options = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
        ]
        self.channel = grpc.insecure_channel(endpoint, options=options)
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)
        self.log_root = str(containerd.pod_log_dir)
        self.node_memory = KubeletClient(containerd.endpoint).node_memory
        self.calls = calls
        self.image_id = ""

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, stub: Any, request: Any) -> Any:
        return self.calls.call(method, getattr(stub, method), request, timeout=CALL_TIMEOUT)

    def start(self, pod: _Pod) -> None:
        """The steps not done yet: RunPodSandbox, ImageStatus, CreateContainer, Start."""
        if not pod.sandbox_id:
            Path(pod_log_directory(pod.spec, self.log_root)).mkdir(parents=True, exist_ok=True)
            request = api_pb2.RunPodSandboxRequest(config=pod.sandbox)
            pod.sandbox_id = self._call("RunPodSandbox", self.runtime, request).pod_sandbox_id
        if not self.image_id:
            request = api_pb2.ImageStatusRequest(
                image=api_pb2.ImageSpec(image=pod.spec.containers[0].image)
            )
            self.image_id = self._call("ImageStatus", self.images, request).image.id
        if not pod.container_id:
            app = pod.spec.containers[0]
            config = container_config(
                pod.spec, app, node_memory=self.node_memory, image_ref=self.image_id
            )
            request = api_pb2.CreateContainerRequest(
                pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=pod.sandbox
            )
            pod.container_id = self._call("CreateContainer", self.runtime, request).container_id
            start = api_pb2.StartContainerRequest(container_id=pod.container_id)
            self._call("StartContainer", self.runtime, start)

    def remove(self, pod: _Pod) -> None:
        """kubelet's teardown: stop and remove the container, stop and remove the sandbox.
        NOT_FOUND is done, as kubelet takes it (a call that failed may have been carried out)."""
        if pod.container_id:
            cid = pod.container_id
            self._gone("StopContainer", api_pb2.StopContainerRequest(container_id=cid, timeout=0))
            self._gone("RemoveContainer", api_pb2.RemoveContainerRequest(container_id=cid))
            pod.container_id = ""
        if pod.sandbox_id:
            sid = pod.sandbox_id
            self._gone("StopPodSandbox", api_pb2.StopPodSandboxRequest(pod_sandbox_id=sid))
            self._gone("RemovePodSandbox", api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sid))
            pod.sandbox_id = ""

    def _gone(self, method: str, request: Any) -> None:
        try:
            self._call(method, self.runtime, request)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise

    def relist(self) -> None:
        """PLEG's relist, as kubelet runs it every second."""
        self._call("ListPodSandbox", self.runtime, api_pb2.ListPodSandboxRequest())
        self._call("ListContainers", self.runtime, api_pb2.ListContainersRequest())


class _Node:
    """containerd, the plugin and crihook, each of which can be killed and restarted."""

    def __init__(self, containerd: Containerd, workdir: Path) -> None:
        self.containerd = containerd
        dev = workdir / "dev"
        dev.mkdir()
        for i in range(GPUS):
            os.mknod(dev / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 7 + i))  # S_IFCHR
        self.plugin = Plugin()
        (workdir / "crihook").mkdir()
        self.crihook = ProbedCrihook(
            containerd.endpoint, workdir=workdir / "crihook", config=_config(dev), hooks=HOOKS
        )
        dropin = self.plugin.dropin("50-annotate", "fail", timeout_ms=2000)
        (self.crihook.plugins_dir / "annotate.toml").write_text(dropin)
        self.lock = threading.Lock()

    def start(self) -> None:
        self.containerd.ensure_running()
        self.plugin.start()
        self.crihook.start()

    def kill(self, victim: str) -> None:
        if victim == "containerd":
            self.containerd.kill()
        elif victim == "plugin":
            self.plugin.stop(sig=9)
        else:
            self.crihook.kill()

    def revive(self, victim: str) -> None:
        if victim == "containerd":
            self.containerd.ensure_running()
        elif victim == "plugin":
            self.plugin.start()
        else:
            self.crihook.start()

    def stop(self) -> None:
        self.crihook.kill()
        self.plugin.stop(sig=9)


def _worker(
    node: _Node,
    rng: random.Random,
    index: int,
    deadline: float,
    result: ChaosResult,
    live_counter: Callable[[int], None],
    leftovers: list[_Pod],
) -> None:
    kubelet = _Kubelet(node.crihook.endpoint, node.containerd, result.calls)
    live: list[_Pod] = []
    broken: list[_Pod] = []
    n = 0
    try:
        while time.monotonic() < deadline:
            try:
                if broken:  # kubelet retries what failed, teardown first
                    pod = broken[0]
                    if pod.container_id or not pod.sandbox_id or rng.random() < 0.5:
                        kubelet.remove(pod)
                        broken.pop(0)
                        result.pods_removed += 1
                        continue
                if len(live) >= 2 or (live and rng.random() < 0.3):
                    pod = live.pop(0)
                    broken.append(pod)  # until its removal succeeded
                    kubelet.remove(pod)
                    broken.remove(pod)
                    result.pods_removed += 1
                    continue
                n += 1
                spec = _pod(rng, f"soak-{index}-{n}")
                config = sandbox_config(spec, log_root=kubelet.log_root)
                pod = _Pod(spec, config)
                broken.append(pod)
                kubelet.start(pod)
                broken.remove(pod)
                live.append(pod)
                result.pods_created += 1
                live_counter(len(live))
                if rng.random() < 0.5:
                    kubelet.relist()
            except grpc.RpcError:
                time.sleep(rng.uniform(0.05, 0.3))
    finally:
        kubelet.close()
        leftovers.extend(live + broken)


def _chaos(node: _Node, rng: random.Random, deadline: float, result: ChaosResult) -> None:
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1.5, 5.0))
        if time.monotonic() >= deadline:
            break
        victim = rng.choice(VICTIMS)
        node.kill(victim)
        result.kills[victim] += 1
        time.sleep(rng.uniform(0.1, 1.5))
        node.revive(victim)


# --- the invariants ----------------------------------------------------------------------------


def _containerd_view(direct: KubeletClient) -> tuple[set[str], dict[str, dict[str, Any]]]:
    """Sandbox ids, and per container: state, cpuset and pooled devices from its OCI spec."""
    pods = {p.id for p in direct.list_pods()}
    listed = direct.runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=30).containers
    containers: dict[str, dict[str, Any]] = {}
    for c in listed:
        status = direct.container_status(c.id, verbose=True)
        spec = json.loads(status.info["info"])["runtimeSpec"]
        env = dict(e.split("=", 1) for e in spec["process"].get("env", []) if "=" in e)
        gpus = env.get("GPU_VISIBLE_DEVICES", "")
        containers[c.id] = {
            "running": c.state == api_pb2.CONTAINER_RUNNING,
            "cpus": spec["linux"].get("resources", {}).get("cpu", {}).get("cpus", ""),
            "gpus": sorted(gpus.split(",")) if gpus else [],
        }
    return pods, containers


def check_invariants(node: _Node, direct: KubeletClient) -> tuple[list[str], str]:
    """The problems found, and what was checked. A hook writes a holding's confirmation
    a fraction of a second after the call (written behind): what differs is looked at again
    for a few seconds before it counts."""
    deadline = time.monotonic() + 5
    while True:
        problems, checked = _check_once(node, direct)
        if not problems or time.monotonic() > deadline:
            return problems, checked
        time.sleep(0.5)


def _check_once(node: _Node, direct: KubeletClient) -> tuple[list[str], str]:
    from crihook.hooks.node import parse_cpu_list

    problems: list[str] = []
    pods, containers = _containerd_view(direct)
    cpuset = node.crihook.hook_state("cpuset")
    exclusive = {
        k[2:]: parse_cpu_list(v["cpus"])
        for k, v in cpuset.items()
        if k.startswith("c:") and v.get("cpus") and not v.get("stopped")
    }
    owners: dict[int, str] = {}
    for cid, cpus in exclusive.items():
        if cid not in containers:
            problems.append(
                f"cpuset holds CPUs {sorted(cpus)} for {cid[:12]}, unknown to containerd"
            )
        for cpu in cpus:
            if cpu in owners:
                problems.append(f"CPU {cpu} held by {owners[cpu][:12]} and {cid[:12]}")
            owners[cpu] = cid
    for cid, c in containers.items():
        if not c["running"] or not c["cpus"]:
            continue
        actual = parse_cpu_list(c["cpus"])
        if cid in exclusive and actual != exclusive[cid]:
            problems.append(
                f"{cid[:12]} runs on CPUs {c['cpus']}, cpuset holds {sorted(exclusive[cid])}"
            )
        for cpu in actual:
            owner = owners.get(cpu)
            if owner is not None and owner != cid and containers.get(owner, {}).get("running"):
                problems.append(
                    f"CPU {cpu} is {owner[:12]}'s alone, yet in {cid[:12]}'s cpuset {c['cpus']}"
                )
    # The devices hook keeps one allocation per pod and container name (`a:<pod>/<name>`),
    # with the ids of the containers (attempts) that hold it.
    held: dict[str, list[str]] = {}
    for key, doc in node.crihook.hook_state("devices").items():
        if not key.startswith("a:"):
            continue
        gpus = sorted(doc["devices"].get("gpu", []))
        if doc["pod"] not in pods:
            problems.append(
                f"devices hook holds gpus {gpus} for pod {doc['pod'][:12]}, unknown to containerd"
            )
        if not doc.get("containers"):
            problems.append(f"devices hook holds gpus {gpus} for {key}, and no container")
        for cid in doc.get("containers", []):
            held[cid] = gpus
            if cid not in containers:
                problems.append(
                    f"devices hook holds gpus {gpus} for {cid[:12]}, unknown to containerd"
                )
    users: dict[str, str] = {}
    for cid, c in containers.items():
        for gpu in c["gpus"]:
            if gpu in users:
                problems.append(f"gpu {gpu} in containers {users[gpu][:12]} and {cid[:12]}")
            users[gpu] = cid
        if c["gpus"] and held.get(cid) != c["gpus"]:
            problems.append(
                f"{cid[:12]} has gpus {c['gpus']}, the devices hook holds {held.get(cid)}"
            )

    def store_matches() -> bool:
        doc = node.crihook.state()
        return (set(doc["pods"]), set(doc["containers"])) == (pods, set(containers))

    try:
        wait_for(store_matches, 15, "the store to match containerd")
    except AssertionError:
        doc = node.crihook.state()
        problems.append(
            f"store differs from containerd: pods +{sorted(set(doc['pods']) - pods)} "
            f"-{sorted(pods - set(doc['pods']))}, containers "
            f"+{sorted(set(doc['containers']) - set(containers))} "
            f"-{sorted(set(containers) - set(doc['containers']))}"
        )
    checked = (
        f"{len(pods)} pods, {len(containers)} containers on containerd; "
        f"exclusive CPUs held {sorted(owners)}, gpus in use {sorted(users)}"
    )
    return problems, checked


def _remove_everything(kubelet: _Kubelet, direct: KubeletClient) -> None:
    """Every pod on containerd, removed through crihook (as kubelet's GC would)."""
    for sandbox in direct.list_pods():
        containers = direct.runtime.ListContainers(
            api_pb2.ListContainersRequest(
                filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox.id)
            ),
            timeout=30,
        ).containers
        pod = _Pod(PodSpec(name="gc"), api_pb2.PodSandboxConfig(), sandbox_id=sandbox.id)
        for c in containers:
            kubelet.remove(_Pod(pod.spec, pod.sandbox, container_id=c.id))
        kubelet.remove(pod)


def _leak_round(
    node: _Node, kubelet: _Kubelet, direct: KubeletClient, rng: random.Random
) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """With no pod left: a dump, a round of pods with containerd and the plugin restarted
    under the same crihook, every pod removed, and a dump again."""
    _remove_everything(kubelet, direct)
    time.sleep(1.5)  # status.json written; idle connections settle
    before = node.crihook.settled_dump()
    for victim in ("plugin", "containerd", None):
        if victim is not None:
            node.kill(victim)
            node.revive(victim)
        wait_for(lambda: _answers(kubelet), 30, "crihook serving again")
        for i in range(3):
            pod = _Pod(
                spec := _pod(rng, f"leak-{victim}-{i}"),
                sandbox_config(spec, log_root=kubelet.log_root),
            )
            _retry(lambda pod=pod: kubelet.start(pod))
            _retry(lambda pod=pod: kubelet.remove(pod))
    time.sleep(1.5)
    after = node.crihook.settled_dump()
    problems = leaks_between(before, after)
    leftovers = [f for f in node.crihook.state_dir.rglob("*") if f.name.endswith((".tmp", "~"))]
    if leftovers:
        problems.append(f"temp files left in the state dir: {leftovers}")
    sockets = [p.name for p in node.crihook.workdir.iterdir() if p.is_socket()]
    if sockets != ["crihook.sock"]:
        problems.append(f"sockets in crihook's dir: {sockets}")
    for hook, prefix in (("cpuset", "c:"), ("devices", "a:")):  # by container id, by pod
        stale = [k for k in node.crihook.hook_state(hook) if k.startswith((prefix, "r:"))]
        if stale:
            problems.append(f"{hook} still holds {stale} with no container left")
    doc = node.crihook.state()
    if doc["pods"] or doc["containers"]:
        problems.append(f"store keeps {len(doc['pods'])} pods, {len(doc['containers'])} containers")
    return problems, before, after


def _full_house(kubelet: _Kubelet, direct: KubeletClient) -> list[str]:
    """Every pod removed through crihook, then a Guaranteed pod on the one exclusive CPU and
    one pod per pooled device: each must be created (a CPU or device a leaked holding kept
    would refuse one)."""
    _remove_everything(kubelet, direct)
    app = ContainerSpec(
        "app", cpu_request=1000, cpu_limit=1000, memory_request=32 * MiB, memory_limit=32 * MiB
    )
    specs = [PodSpec(name="full-g", containers=[app])]
    for i in range(GPUS):
        gpu = ContainerSpec("app", cpu_request=100, memory_request=16 * MiB)
        specs.append(
            PodSpec(
                name=f"full-d{i}",
                containers=[gpu],
                annotations={POOL_ANNOTATION: json.dumps({"gpu": 1})},
            )
        )
    problems = []
    for spec in specs:
        pod = _Pod(spec, sandbox_config(spec, log_root=kubelet.log_root))
        try:
            _retry(lambda pod=pod: kubelet.start(pod))
        except grpc.RpcError as exc:
            problems.append(
                f"after the faults, {spec.name} was refused: {exc.code().name}: {exc.details()}"
            )
    return problems


def _answers(kubelet: _Kubelet) -> bool:
    try:
        kubelet.runtime.Version(api_pb2.VersionRequest(), timeout=2)
        return True
    except grpc.RpcError:
        return False


def _retry(step: Callable[[], None], seconds: float = 60) -> None:
    """A step of the leak round: right after a restart a call can still find the plugin or
    containerd reconnecting, or the plugin's breaker open (30 s): a clear UNAVAILABLE that
    kubelet would retry."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            step()
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(1)


def run_chaos(
    containerd: Containerd,
    workdir: Path,
    seconds: float,
    seed: int,
    workers: int = 2,
    progress: Callable[[str], None] = lambda _: None,
    keep: bool = False,
) -> ChaosResult:
    """The chaos part; `workdir` (short: sockets live there) is the caller's to remove."""
    result = ChaosResult(seed=seed, seconds=seconds)
    rng = random.Random(seed)
    node = _Node(containerd, workdir)
    progress(f"chaos: seed {seed}, {seconds:.0f} s, {workers} workers")
    direct = KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir)
    leftovers: list[_Pod] = []
    try:
        node.start()
        deadline = time.monotonic() + seconds

        def note_live(n: int) -> None:
            result.max_live = max(result.max_live, n)

        threads = [
            threading.Thread(
                target=_worker,
                name=f"soak-worker-{i}",
                args=(node, random.Random(rng.random()), i, deadline, result, note_live, leftovers),
            )
            for i in range(workers)
        ]
        for t in threads:
            t.start()
        _chaos(node, rng, deadline, result)
        for t in threads:
            t.join()
        progress(f"chaos: faults over ({dict(result.kills)}); checking")
        node.containerd.ensure_running()
        if node.plugin.proc is None:
            node.plugin.start()
        kubelet = _Kubelet(node.crihook.endpoint, containerd, result.calls)
        try:
            wait_for(lambda: _answers(kubelet), 30, "crihook serving")
            time.sleep(2)  # post-stage updates and status written
            problems, result.checked = check_invariants(node, direct)
            result.problems += problems
            # Whatever the faults left, the whole node can be taken again: nothing leaked
            # holds a CPU or a device, and the invariants hold with everything in use.
            result.problems += _full_house(kubelet, direct)
            problems, result.checked_full = check_invariants(node, direct)
            result.problems += problems
            problems, before, after = _leak_round(node, kubelet, direct, rng)
            result.problems += problems
            result.leak_check = (
                f"fds {len(before['fds'])} -> {len(after['fds'])}, tasks "
                f"{len(before['tasks'])} -> {len(after['tasks'])}, threads "
                f"{len(before['threads'])} -> {len(after['threads'])}"
            )
        finally:
            kubelet.close()
        result.problems += [f"unclear status: {m} {c}: {d}" for m, c, d in result.calls.unclear]
        result.problems += tracebacks("crihook", node.crihook.log())
        return result
    finally:
        node.stop()
        direct.close()
        if not keep:
            node.plugin.close()
