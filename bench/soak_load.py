"""Load and endurance, on the stateful memory runtime (tests/lab/memory_runtime.py) behind a
crihook with the cpuset, numa and oom hooks on a sysfs fixture of a 256-CPU machine.

- load: a kubelet-restart storm. With N containers in place (in pods of 10, one pod in ten
  Guaranteed), every container gets kubelet's UpdateContainerResources while PLEG relists
  (ListPodSandbox, ListContainers) and the status of every pod and container are asked, all
  at once, at full speed. Checked: every call answered OK, the runtime got exactly one update
  per container (none lost, none doubled), every container kept the cpuset crihook gave it
  (kubelet's update carries none), and the store still matches the runtime. Reported: the
  latency percentiles per method, and calls per second.
- endurance: pod lifecycles (12 calls each: run, create, start, status, update, lists, stop,
  remove, version) on a few threads until N calls. A probe dump after a warm-up, at half-way
  and at the end: fds by kind, asyncio tasks and threads must be the same, Python objects that
  survive a collection must not grow in the second half by more than one per 20 calls, and at
  the end the store and the hooks' state hold nothing. RSS is reported, not judged: the
  allocator keeps what it once had, so RSS is a leak indicator only over long runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.soak_common import Calls, ProbedCrihook, leaks_between, percentiles, tracebacks
from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab.crihook_proc import wait_for
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import EPYC_256_8NUMA, GIB, write_sysfs

__all__ = ["EnduranceResult", "LoadResult", "run_endurance", "run_load"]

MiB = 1 << 20
NODE_MEMORY = 512 * GIB
HOOKS = "cpuset,numa,oom"
PER_POD = 10


def _node(workdir: Path) -> tuple[MemoryRuntime, ProbedCrihook]:
    root = write_sysfs(workdir / "sys", EPYC_256_8NUMA)
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    crihook = ProbedCrihook(
        runtime.endpoint,
        workdir=workdir,
        hooks=HOOKS,
        # One log line per call at INFO is crihook's normal; DEBUG would measure the disk.
        args=["--sysfs-root", str(root), "--log-level", "warning"],
    )
    return runtime, crihook


def _spec(name: str, guaranteed: bool, containers: int) -> PodSpec:
    if guaranteed:
        apps = [
            ContainerSpec(
                f"c{i}",
                cpu_request=1000,
                cpu_limit=1000,
                memory_request=64 * MiB,
                memory_limit=64 * MiB,
            )
            for i in range(containers)
        ]
    else:
        apps = [
            ContainerSpec(
                f"c{i}",
                cpu_request=100,
                cpu_limit=500,
                memory_request=32 * MiB,
                memory_limit=128 * MiB,
            )
            for i in range(containers)
        ]
    return PodSpec(name=name, containers=apps)


def _latency_table(calls: Calls) -> str:
    rows = []
    for method, values in sorted(calls.latencies.items()):
        p = percentiles(values)
        rows.append(
            f"    {method:<26} {len(values):>7} calls  p50 {p[50] * 1e3:7.2f} ms  "
            f"p90 {p[90] * 1e3:7.2f} ms  p99 {p[99] * 1e3:7.2f} ms"
        )
    return "\n".join(rows)


def _ratio_table(through: Calls, direct: Calls) -> str:
    rows = []
    for method, values in sorted(through.latencies.items()):
        if not direct.latencies.get(method):
            continue
        ours, theirs = percentiles(values), percentiles(direct.latencies[method])
        rows.append(
            f"    {method:<26} p50 {ours[50] / theirs[50]:5.2f}x  p99 {ours[99] / theirs[99]:5.2f}x"
        )
    return "\n".join(rows)


# --- load ----------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    containers: int
    relists: int
    seconds: float = 0.0
    calls: Calls = field(default_factory=Calls)
    setup_seconds: float = 0.0
    direct: Calls = field(default_factory=Calls)
    """The same storm sent straight to the runtime afterwards."""
    direct_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.calls.total / self.seconds if self.seconds else 0.0
        lines = [
            f"load: storm over {self.containers} containers, {self.relists} PLEG relists, "
            f"set up in {self.setup_seconds:.1f} s",
            f"  {self.calls.total} calls in {self.seconds:.2f} s ({rate:.0f}/s), "
            f"{len(self.calls.unclear)} with an unclear status",
            self.calls.table(),
            "  latency (client side, all calls in flight at once, 32 at a time):",
            _latency_table(self.calls),
            f"  the same storm straight to the runtime: {self.direct_seconds:.2f} s; "
            "through crihook / direct, p50 and p99:",
            _ratio_table(self.calls, self.direct),
            "  invariants: " + ("all hold" if not self.problems else "VIOLATED"),
        ]
        lines += [f"    - {p}" for p in self.problems[:20]]
        return "\n".join(lines)


def _populate(stub: api_pb2_grpc.RuntimeServiceStub, pods: int, containers: int) -> dict[str, Any]:
    """Pods of PER_POD containers through crihook; by container id, kubelet's resources."""
    made: dict[str, Any] = {}
    lock = threading.Lock()

    def one(index: int) -> None:
        count = min(PER_POD, containers - index * PER_POD)
        spec = _spec(f"load-{index}", guaranteed=index % 10 == 9, containers=count)
        sandbox = sandbox_config(spec)
        sid = stub.RunPodSandbox(
            api_pb2.RunPodSandboxRequest(config=sandbox), timeout=30
        ).pod_sandbox_id
        for app in spec.containers:
            config = container_config(spec, app, node_memory=NODE_MEMORY)
            request = api_pb2.CreateContainerRequest(
                pod_sandbox_id=sid, config=config, sandbox_config=sandbox
            )
            cid = stub.CreateContainer(request, timeout=30).container_id
            stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=30)
            with lock:
                made[cid] = config.linux.resources

    # Guaranteed pods first: each exclusive CPU taken later would update every shared
    # container (kubelet's CPU manager does the same), which is a different test.
    order = sorted(range(pods), key=lambda i: i % 10 != 9)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, order))
    return made


async def _storm(
    endpoint: str,
    made: dict[str, Any],
    pod_ids: list[str],
    relists: int,
    calls: Calls,
    concurrency: int = 32,
) -> None:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = api_pb2_grpc.RuntimeServiceStub(channel)
        gate = asyncio.Semaphore(concurrency)

        async def call(method: str, request: Any) -> None:
            async with gate:
                start = time.perf_counter()
                try:
                    await getattr(stub, method)(request, timeout=60)
                except grpc.aio.AioRpcError as exc:
                    calls.record(
                        method, exc.code(), exc.details() or "", time.perf_counter() - start
                    )
                else:
                    calls.record(method, grpc.StatusCode.OK, "", time.perf_counter() - start)

        jobs = []
        for cid, resources in made.items():
            request = api_pb2.UpdateContainerResourcesRequest(container_id=cid, linux=resources)
            jobs.append(call("UpdateContainerResources", request))
            jobs.append(call("ContainerStatus", api_pb2.ContainerStatusRequest(container_id=cid)))
        jobs += [
            call("PodSandboxStatus", api_pb2.PodSandboxStatusRequest(pod_sandbox_id=p))
            for p in pod_ids
        ]
        # PLEG's relists spread through the storm, as its one-second timer would be.
        step = max(1, len(jobs) // max(1, relists))
        for i in range(relists):
            at = min(len(jobs), (i + 1) * step)
            jobs.insert(at, call("ListContainers", api_pb2.ListContainersRequest()))
            jobs.insert(at, call("ListPodSandbox", api_pb2.ListPodSandboxRequest()))
        await asyncio.gather(*jobs)


def run_load(
    workdir: Path, containers: int, relists: int, progress: Callable[[str], None] = lambda _: None
) -> LoadResult:
    result = LoadResult(containers, relists)
    runtime, crihook = _node(workdir)
    try:
        crihook.start()
        progress(f"load: creating {containers} containers through crihook")
        start = time.monotonic()
        with grpc.insecure_channel(crihook.endpoint) as channel:
            made = _populate(
                api_pb2_grpc.RuntimeServiceStub(channel), -(-containers // PER_POD), containers
            )
        result.setup_seconds = time.monotonic() - start
        wait_for(lambda: _store_matches(crihook, runtime), 30, "the store to hold every container")
        cpusets = {cid: runtime.cpuset_of(cid) for cid in made}
        updates = {cid: len(runtime.containers[cid].updates) for cid in made}
        progress(f"load: storm ({containers} updates, {relists} relists)")
        start = time.monotonic()
        asyncio.run(_storm(crihook.endpoint, made, list(runtime.pods), relists, result.calls))
        result.seconds = time.monotonic() - start
        expected = 2 * containers + len(runtime.pods) + 2 * relists
        answered = sum(result.calls.outcomes.values())
        failed = {k: n for k, n in result.calls.outcomes.items() if k[1] != "OK"}
        if answered != expected or failed:
            result.problems.append(f"{answered} of {expected} calls answered; failed: {failed}")
        for cid in made:
            got = len(runtime.containers[cid].updates) - updates[cid]
            if got != 1:
                result.problems.append(f"{cid[:12]} got {got} updates from the storm, not 1")
            if runtime.cpuset_of(cid) != cpusets[cid]:
                result.problems.append(
                    f"{cid[:12]}'s cpuset went from {cpusets[cid]} to {runtime.cpuset_of(cid)}"
                )
        if not _store_matches(crihook, runtime):
            result.problems.append("the store no longer matches the runtime")
        result.problems += tracebacks("crihook", crihook.log())
        # The same storm straight to the runtime, for the ratios (same run, same machine).
        start = time.monotonic()
        asyncio.run(_storm(runtime.endpoint, made, list(runtime.pods), relists, result.direct))
        result.direct_seconds = time.monotonic() - start
        result.problems += [f"unclear status: {m} {c}: {d}" for m, c, d in result.calls.unclear]
        return result
    finally:
        crihook.kill()
        runtime.stop()


def _store_matches(crihook: ProbedCrihook, runtime: MemoryRuntime) -> bool:
    doc = crihook.state()
    return (set(doc["pods"]), set(doc["containers"])) == (
        set(runtime.pods),
        set(runtime.containers),
    )


# --- endurance -----------------------------------------------------------------------------------


@dataclass
class EnduranceResult:
    calls_asked: int
    seconds: float = 0.0
    calls: Calls = field(default_factory=Calls)
    dumps: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.calls.total / self.seconds if self.seconds else 0.0
        mib = {k: d["rss"] / MiB for k, d in self.dumps.items()}
        lines = [
            f"endurance: {self.calls.total} calls in {self.seconds:.0f} s ({rate:.0f}/s), "
            f"{len(self.calls.unclear)} with an unclear status",
            "  "
            + ", ".join(
                f"{k}: RSS {mib[k]:.1f} MiB, {len(d['fds'])} fds, "
                f"{len(d['tasks'])} tasks, {d['objects']} objects"
                for k, d in self.dumps.items()
            ),
            self.calls.table(),
            _latency_table(self.calls),
            "  invariants: " + ("all hold" if not self.problems else "VIOLATED"),
        ]
        lines += [f"    - {p}" for p in self.problems[:20]]
        return "\n".join(lines)


CYCLE = 12  # calls per pod lifecycle in _cycle


def _cycle(
    stub: api_pb2_grpc.RuntimeServiceStub, calls: Calls, name: str, guaranteed: bool
) -> None:
    spec = _spec(name, guaranteed, 1)
    sandbox = sandbox_config(spec)
    config = container_config(spec, spec.containers[0], node_memory=NODE_MEMORY)
    t = {"timeout": 30}
    sid = calls.call(
        "RunPodSandbox", stub.RunPodSandbox, api_pb2.RunPodSandboxRequest(config=sandbox), **t
    ).pod_sandbox_id
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sid, config=config, sandbox_config=sandbox
    )
    cid = calls.call("CreateContainer", stub.CreateContainer, request, **t).container_id
    calls.call(
        "StartContainer", stub.StartContainer, api_pb2.StartContainerRequest(container_id=cid), **t
    )
    calls.call(
        "ContainerStatus",
        stub.ContainerStatus,
        api_pb2.ContainerStatusRequest(container_id=cid),
        **t,
    )
    update = api_pb2.UpdateContainerResourcesRequest(container_id=cid, linux=config.linux.resources)
    calls.call("UpdateContainerResources", stub.UpdateContainerResources, update, **t)
    calls.call("ListContainers", stub.ListContainers, api_pb2.ListContainersRequest(), **t)
    calls.call("ListPodSandbox", stub.ListPodSandbox, api_pb2.ListPodSandboxRequest(), **t)
    calls.call(
        "StopContainer", stub.StopContainer, api_pb2.StopContainerRequest(container_id=cid), **t
    )
    calls.call(
        "RemoveContainer",
        stub.RemoveContainer,
        api_pb2.RemoveContainerRequest(container_id=cid),
        **t,
    )
    calls.call(
        "StopPodSandbox",
        stub.StopPodSandbox,
        api_pb2.StopPodSandboxRequest(pod_sandbox_id=sid),
        **t,
    )
    calls.call(
        "RemovePodSandbox",
        stub.RemovePodSandbox,
        api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sid),
        **t,
    )
    calls.call("Version", stub.Version, api_pb2.VersionRequest(), **t)


def _run_cycles(
    endpoint: str, cycles: int, calls: Calls, workers: int, counter: itertools.count[int]
) -> None:
    with grpc.insecure_channel(endpoint) as channel:  # one connection, as kubelet has
        stub = api_pb2_grpc.RuntimeServiceStub(channel)

        def work() -> None:
            while (n := next(counter)) < cycles:
                with contextlib.suppress(grpc.RpcError):  # recorded; the invariants report it
                    _cycle(stub, calls, f"end-{n}", guaranteed=n % 4 == 0)

        threads = [threading.Thread(target=work, name=f"endurance-{i}") for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def run_endurance(
    workdir: Path, calls: int, workers: int = 4, progress: Callable[[str], None] = lambda _: None
) -> EnduranceResult:
    result = EnduranceResult(calls)
    runtime, crihook = _node(workdir)
    cycles = max(2, calls // CYCLE)
    warmup = max(20, cycles // 20)
    half = warmup + (cycles - warmup) // 2
    try:
        crihook.start()
        counter = itertools.count()
        start = time.monotonic()
        for label, upto in (("warm-up", warmup), ("half-way", half), ("end", cycles)):
            _run_cycles(crihook.endpoint, upto, result.calls, workers, counter)
            counter = itertools.count(upto)
            time.sleep(1.5)  # the status writer's second
            result.dumps[label] = crihook.settled_dump()
            progress(
                f"endurance: {label}, {result.calls.total} calls, RSS "
                f"{result.dumps[label]['rss'] / MiB:.1f} MiB"
            )
        result.seconds = time.monotonic() - start
        failed = {k: n for k, n in result.calls.outcomes.items() if k[1] != "OK"}
        if failed:
            result.problems.append(f"calls failed: {failed}")
        first, middle, last = (result.dumps[k] for k in ("warm-up", "half-way", "end"))
        result.problems += leaks_between(first, last)
        grown = last["objects"] - middle["objects"]
        second_half = (cycles - half) * CYCLE
        if grown > max(2000, second_half // 20):
            result.problems.append(
                f"Python objects grew by {grown} over the last {second_half} calls"
            )
        doc = crihook.state()
        if doc["pods"] or doc["containers"]:
            result.problems.append(
                f"store keeps {len(doc['pods'])} pods, {len(doc['containers'])} containers"
            )
        held = [k for k in crihook.hook_state("cpuset") if k.startswith(("c:", "r:"))]
        if held:
            result.problems.append(f"cpuset still holds {held[:5]}")
        if runtime.pods or runtime.containers:
            result.problems.append("the runtime still has pods or containers")
        result.problems += tracebacks("crihook", crihook.log())
        result.problems += [f"unclear status: {m} {c}: {d}" for m, c, d in result.calls.unclear]
        return result
    finally:
        crihook.kill()
        runtime.stop()
