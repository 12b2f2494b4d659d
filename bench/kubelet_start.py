"""Pod start as a real kubelet sees it, directly on the runtime and through crihook.

    python -m bench.run --kubelet [--containerd 1.6|2|crio] [--reps 15] [--kubelet-qos guaranteed]

One kube-apiserver on kine, and four nodes, each a real kubelet (v1.37, CPU 0 reserved) on
a lab runtime of its own of the chosen version (a kubelet stops the pods on its runtime that
it does not know of):

- ``direct``: kubelet on the runtime's socket, its CPU manager off;
- ``kubelet-static``: kubelet on the runtime's socket with its own ``static`` CPU manager:
  the same placement as crihook's cpuset hook (a Guaranteed container alone on CPU 1, its
  pod's CFS quota lifted), made by kubelet;
- ``hooks-none``: kubelet (CPU manager off) on crihook ``--hooks none``;
- ``cpuset,numa,oom``: kubelet (CPU manager off) on crihook ``--hooks cpuset,numa,oom``
  (CPU 0 reserved too).

A Guaranteed pod's container pinned to one CPU starts more slowly than one free to run on
both (runc's init and the container's first process share that CPU): ``kubelet-static``
measures what the placement itself costs, so crihook's resource hooks are compared with it
too (their ``reference``), besides with ``direct``.

Each rep starts one pod on each node, one after another in a new random order (paired
reps: the four see the same moment of the machine), each from its API object created
(``spec.nodeName`` set, no scheduler) to its container started. The end is the runtime's own
``started_at`` of the container (nanoseconds, the same clock as the start), read once the
container runs: polling does not quantize it, and nothing of kubelet's status reporting is
in it. What it leaves out is the way back of StartContainer's answer to kubelet (through
crihook: one more relay of an empty response). The pod is then deleted and gone from the
runtime before the next one starts. A warm-up pod per node comes first, untimed.

Reported per path: median and quartiles of the start, its ratio to ``direct``'s median, the
median over reps of each rep's ratio to that rep's direct start (the paired figure) with a
95% bootstrap interval of it, and the same paired figure against its reference where it has
one. The target is judged on that interval: met only if all of it is at or under 1.02x,
missed only if all of it is over, and otherwise left undecided. The issue's target: through
crihook <= 1.02x direct.

The spread of a start (tens of ms) hides a 2% difference, so for each crihook path the
report also gives crihook's own part of the pod's start, read from its call log: the sum,
over the pod's RunPodSandbox, CreateContainer and StartContainer, of each call's time less
the runtime's part of it (``elapsed_ms - runtime_ms``). A call's time runs from its request
read to its answer handed back to the transport: the HTTP/2 framing on either side is not
in it, nor are the calls crihook relays unread (PodSandboxStatus, ImageStatus, ...). It is
given per call too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import grpc

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab import peers
from tests.lab.apiserver import ApiClient, ApiServer
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.kubelet_node import KubeletNode
from tests.lab.node_bed import on_node, registered_node
from tests.node.manifests import QOS_RESOURCES, pod_manifest

__all__ = [
    "PATHS",
    "own_ms",
    "own_ms_by_call",
    "paired_interval",
    "report",
    "run_kubelet_start",
    "verdict",
]

DIRECT = "direct"
KUBELET_STATIC = "kubelet-static"
RESOURCE_HOOKS = "cpuset,numa,oom"
PATHS = (DIRECT, KUBELET_STATIC, "hooks-none", RESOURCE_HOOKS)
REFERENCE = {RESOURCE_HOOKS: KUBELET_STATIC}
"""A path's placement made by kubelet itself: what it is compared with besides ``direct``."""
CRIHOOK_CONFIG = '[hooks.cpuset]\nreserved_cpus = "0"\n'
TARGET = 1.02
_POLL = 0.05
START_CALLS = ("RunPodSandbox", "CreateContainer", "StartContainer")
"""The intercepted calls on a pod's way to running, in crihook's own part of it."""


@dataclass
class NodePath:
    """One node: its kubelet and what it talks to."""

    name: str
    node: KubeletNode
    crihook: CrihookProcess | None
    pods: list[str] = field(default_factory=list)
    """The pod of each rep, in rep order."""
    starts_ms: list[float] = field(default_factory=list)

    def own_parts(self) -> list[dict[str, float]]:
        """crihook's own part of each rep's start, per call, from its log read once."""
        assert self.crihook is not None
        log = self.crihook.log()
        return [own_ms_by_call(log, pod) for pod in self.pods]


def _say(message: str) -> None:
    print(f"[bench --kubelet] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _node(
    path: str, runtime: str, api_server: ApiServer, stack: contextlib.ExitStack
) -> Iterator[tuple[KubeletNode, CrihookProcess | None]]:
    """The runtime, crihook unless kubelet talks to it directly, and a registered kubelet
    for ``path``."""
    lab = peers.lab_runtime(
        runtime,
        tempfile.mkdtemp(prefix="crihook-lab-", dir="/tmp"),
        build_images(DEFAULT_CACHE_DIR),
    )
    stack.callback(lab.cleanup)
    lab.start()
    endpoint, crihook = None, None
    kubelet_options = {"cpu_manager_policy": "static"} if path == KUBELET_STATIC else {}
    if path not in (DIRECT, KUBELET_STATIC):
        hooks = "none" if path == "hooks-none" else path
        workdir = short_tmpdir("kb-")  # only a test's fixture removes these: the bench does
        stack.callback(shutil.rmtree, workdir, True)  # after crihook is killed (LIFO)
        crihook = CrihookProcess(
            lab.endpoint,
            workdir=workdir,
            config=CRIHOOK_CONFIG,
            hooks=hooks,
            # INFO: the call log (crihook's own part); the harness's default is debug
            args=["--log-level", "info", "--log-format", "json"],
        )
        stack.callback(crihook.kill)
        crihook.start()
        endpoint = crihook.endpoint
    with registered_node(
        peers.kubelet(), lab.endpoint, api_server, endpoint=endpoint, **kubelet_options
    ) as node:
        yield node, crihook


def own_ms(log: str, pod: str) -> float:
    """crihook's own milliseconds in pod ``pod``'s start calls, from its JSON call log."""
    return sum(own_ms_by_call(log, pod).values())


def own_ms_by_call(log: str, pod: str) -> dict[str, float]:
    """crihook's own milliseconds in each of pod ``pod``'s start calls (START_CALLS, summed
    over retries), from its JSON call log."""
    parts = dict.fromkeys(START_CALLS, 0.0)
    for line in log.splitlines():
        if '"crihook.proxy.call_log"' not in line:
            continue
        doc = json.loads(line)
        if doc.get("pod") == f"default/{pod}" and doc.get("method") in parts:
            parts[doc["method"]] += doc["elapsed_ms"] - doc.get("runtime_ms", 0.0)
    return parts


def _started_at_ns(runtime_endpoint: str, pod: str, deadline: float) -> int:
    """The runtime's started_at of pod ``pod``'s running container, once it runs."""
    selector = {"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": "default"}
    running = api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING)
    request = api_pb2.ListContainersRequest(
        filter=api_pb2.ContainerFilter(label_selector=selector, state=running)
    )
    with grpc.insecure_channel(runtime_endpoint) as channel:
        runtime = api_pb2_grpc.RuntimeServiceStub(channel)
        while True:
            found = runtime.ListContainers(request, timeout=30).containers
            if found:
                status = runtime.ContainerStatus(
                    api_pb2.ContainerStatusRequest(container_id=found[0].id), timeout=30
                ).status
                return int(status.started_at)
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {pod}'s container not running after {PATIENCE:.0f}s")
            time.sleep(_POLL)


def start_one(node: KubeletNode, api: ApiClient, name: str, qos: str) -> float:
    """Milliseconds from the pod's API object created to its container started; the pod is
    deleted and gone from the runtime on return."""
    manifest = on_node(pod_manifest(name, qos), node)
    t0 = time.time_ns()
    api.create_pod(manifest)
    try:
        started = _started_at_ns(node.view.endpoint, name, time.monotonic() + PATIENCE)
    finally:
        api.delete_pod(name)
        node.view.wait_gone(name, "default", PATIENCE)
    return (started - t0) / 1e6


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def _ratios(starts: list[float], reference: list[float]) -> list[float]:
    """Each rep's start over the reference's start in that rep."""
    return [a / b for a, b in zip(starts, reference, strict=True)]


def _paired(starts: list[float], reference: list[float]) -> float:
    """The median over reps of each rep's start over the reference's start in that rep."""
    return statistics.median(_ratios(starts, reference))


def paired_interval(
    starts: list[float], reference: list[float], resamples: int = 2000
) -> tuple[float, float]:
    """A 95% bootstrap interval of `_paired`: the reps resampled with replacement (seeded,
    so a report reads the same twice). How finely the reps resolve the ratio: on a quiet
    machine a start differs from its direct twin by 10-14% (standard deviation, measured
    2026-12-02), so 40 reps give about ±5%, too wide to show 2%."""
    ratios = _ratios(starts, reference)
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)
    )
    return medians[int(resamples * 0.025)], medians[int(resamples * 0.975) - 1]


def verdict(low: float, high: float) -> str:
    """The target against a paired ratio's 95% interval: met only if all of it is at or
    under TARGET, missed only if all of it is over; otherwise the reps cannot tell."""
    if high <= TARGET:
        return f"met (95% interval {low:.3f}-{high:.3f})"
    if low > TARGET:
        return f"NOT met (95% interval {low:.3f}-{high:.3f})"
    return f"not resolved by these reps (95% interval {low:.3f}-{high:.3f} holds {TARGET})"


def report(
    runtime: str,
    qos: str,
    starts_ms: Mapping[str, list[float]],
    load: str = "",
    own: Mapping[str, list[dict[str, float]]] | None = None,
) -> str:
    """The table: per path (``starts_ms[path]``, one start per rep, in rep order); then
    crihook's own part of a start per crihook path (``own[path]``, per rep: ms per call)."""
    direct = starts_ms[DIRECT]
    base = statistics.median(direct)
    lines = [
        f"kubelet pod start ({qos} pod, API object created -> container started), "
        f"runtime {runtime}, {len(direct)} paired reps:",
        "",
        "| path | p25 ms | median ms | p75 ms | median / direct | paired ratio (median) "
        "| its 95% interval | reference | paired ratio to it (median) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    # 2,000 resamples each: made once, for the table and for the verdict
    intervals = {
        name: paired_interval(starts, direct)
        for name, starts in starts_ms.items()
        if name != DIRECT and len(starts) > 1
    }
    for name, starts in starts_ms.items():
        q1, q2, q3 = _quartiles(starts)
        reference = REFERENCE.get(name)
        against = (
            f"| {reference} | {_paired(starts, starts_ms[reference]):.3f} |"
            if reference in starts_ms
            else "| - | - |"
        )
        interval = "{:.3f}-{:.3f}".format(*intervals[name]) if name in intervals else "-"
        lines.append(
            f"| {name} | {q1:.1f} | {q2:.1f} | {q3:.1f} | {q2 / base:.3f} "
            f"| {_paired(starts, direct):.3f} | {interval} {against}"
        )
    for name, reps in (own or {}).items():
        q1, q2, q3 = _quartiles([sum(rep.values()) for rep in reps])
        by_call = ", ".join(
            f"{call} {statistics.median(rep[call] for rep in reps):.2f}" for call in START_CALLS
        )
        lines.append("")
        lines.append(
            f"{name}: crihook's own part of a start ({', '.join(START_CALLS)}: each call's "
            f"time less the runtime's), median {q2:.2f} ms (p25-p75 {q1:.2f}-{q3:.2f}), "
            f"{q2 / base:.2%} of direct's median start; median per call: {by_call} ms"
        )
    lines.append("")
    lines.append(f"target: through crihook <= {TARGET}x direct{load}")
    for name, interval_of_path in intervals.items():
        if name != KUBELET_STATIC:  # not a crihook path: no target of its own
            lines.append(f"- {name}: {verdict(*interval_of_path)}")
    return "\n".join(lines)


def run_kubelet_start(runtime: str, reps: int, qos: str = "guaranteed", seed: int = 0) -> str:
    """Set up the four nodes, run ``reps`` paired reps, return the report (markdown)."""
    if qos not in QOS_RESOURCES:
        raise ValueError(f"qos {qos!r}: one of {', '.join(QOS_RESOURCES)}")
    rng = random.Random(seed)
    load_at_start = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        _say("starting kine and kube-apiserver")
        api_server = stack.enter_context(ApiServer(peers.kube_apiserver(), peers.kine()))
        api = api_server.client()
        paths = []
        for name in PATHS:
            _say(f"starting {name}: runtime {runtime}, kubelet")
            node, crihook = stack.enter_context(_node(name, runtime, api_server, stack))
            paths.append(NodePath(name, node, crihook))
        for i, p in enumerate(paths):
            start_one(p.node, api, f"warm-up-{i}", qos)
        for rep in range(reps):
            order = paths[:]
            rng.shuffle(order)
            for p in order:  # pod names are the API server's: one per node and rep
                name = f"start-{rep}-{paths.index(p)}"
                p.pods.append(name)
                p.starts_ms.append(start_one(p.node, api, name, qos))
            _say(
                f"rep {rep + 1}/{reps}: "
                + ", ".join(f"{p.name} {p.starts_ms[-1]:.1f} ms" for p in paths)
            )
        load = f"; load average {load_at_start:.1f} at start, {os.getloadavg()[0]:.1f} at the end"
        own = {p.name: p.own_parts() for p in paths if p.crihook is not None}
        return report(runtime, qos, {p.name: p.starts_ms for p in paths}, load, own)
