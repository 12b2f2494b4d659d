"""What a pod start costs the event loop as the node fills up, in one process (no sockets, no
runtime process), so the figure is crihook's own and a profile of it is exact:

    python -m bench.pod_start_cost [--pods 100,1000] [--starts 200] [--guaranteed 10]
                                   [--reps 3] [--cprofile DIR]

The pipeline is built as bench.pipeline_cost builds it (`--hooks cpuset,numa,oom`, the
store in a temporary state directory), on the 256-CPU, 8-NUMA sysfs fixture, in front of a
runtime that answers at once with a new id per sandbox and container. The node is filled
with one-container pods (RunPodSandbox, CreateContainer, StartContainer; every
`--guaranteed`th Guaranteed with 1 CPU, 0: none), then `--starts` more are timed: the event
loop's thread CPU per pod start (the client's request building included: the same at every
size), the fastest of `--reps` (interleaved across sizes); of it, the calls' own path (the
CPU inside `Pipeline.handle`: the fake runtime answers without suspending, so the updates'
workers run outside it), and the median of the Guaranteed pods' CreateContainer alone;
the updates sent to other containers per pod start, and the loop's CPU outside the calls
divided by them (the updater's cost per update, with the store's write-behind and the
client's request building: an upper bound). The updater sends through UnsettledRuntime, as
crihook's does (the mark and its file included).
`--cprofile DIR` writes `<pods>.prof` for each size (compare two with pstats).
Timing lives here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench import pipeline_cost
from bench.run import Scenario
from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Event
from crihook.proxy.core.updates import ContainerUpdater
from crihook.proxy.cri.events import INTERCEPTED
from crihook.proxy.state.unsettled import UnsettledRuntime
from tests.lab.kubelet_encoding import container_config, one_container_pod, sandbox_config
from tests.lab.sysfs import EPYC_256_8NUMA, GIB, write_sysfs

MiB = 1 << 20


class NewIds:
    """The runtime as the pipeline sees it: RunPodSandbox and CreateContainer answered with a
    new id each, anything else with an empty message."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def call(self, path: str) -> Callable[..., Awaitable[bytes]]:
        async def unary(request: bytes, *, timeout: Any = None, metadata: Any = None) -> bytes:
            if path.endswith("/RunPodSandbox"):
                answer = api_pb2.RunPodSandboxResponse(pod_sandbox_id=f"{next(self._ids):064x}")
                return answer.SerializeToString()
            if path.endswith("/CreateContainer"):
                created = api_pb2.CreateContainerResponse(container_id=f"{next(self._ids):064x}")
                return created.SerializeToString()
            return b""

        return unary


class Figures(NamedTuple):
    """ms of event-loop CPU: per pod start, of it in the calls, a Guaranteed create's."""

    loop: float
    calls: float
    guaranteed_create: float
    updates: float
    """Per pod start (not ms)."""
    per_update_us: float
    """µs: (loop - calls) / updates."""


async def measure(pods: int, starts: int, every: int, profile: Path | None) -> Figures:
    """Event-loop CPU per pod start with `pods` pods on the node."""
    with tempfile.TemporaryDirectory(prefix="crihook-podstart-") as tmp:
        root = write_sysfs(Path(tmp) / "sys", EPYC_256_8NUMA)
        scenario = Scenario(
            name="resource-hooks",
            args=("--hooks", "cpuset,numa,oom"),
            config=f'[node]\nsysfs_root = "{root}"\n',
            about="",
        )
        pipeline, store = await pipeline_cost.build(scenario, Path(tmp) / "state")
        pipeline.describe_updates = False  # as crihook runs without a recording
        runtime = NewIds()
        pipeline._forward = {e: runtime.call(spec.path) for e, spec in INTERCEPTED.items()}
        pipeline.updater = ContainerUpdater(  # as app.py's: the updates marked in the files
            UnsettledRuntime(runtime, store.unsettled), store, calls_idle=pipeline._gate.idle
        )
        count = 0
        in_calls = [0.0]
        guaranteed_creates: list[float] = []

        async def call(event: Event, request: Any, guaranteed: bool = False) -> bytes:
            deadline = time.monotonic() + 30
            began = time.thread_time()
            outcome = await pipeline.handle(event, request.SerializeToString(), None, deadline)
            spent = time.thread_time() - began
            in_calls[0] += spent
            if guaranteed and event is Event.CREATE_CONTAINER:
                guaranteed_creates.append(spent)
            if outcome.status is not None:
                raise RuntimeError(f"{event.value} failed: {outcome.status}")
            return outcome.response or b""

        async def pod(guaranteed: bool) -> None:
            nonlocal count
            count += 1
            spec, container = one_container_pod(f"p{count}", guaranteed)
            sandbox = sandbox_config(spec)
            run = api_pb2.RunPodSandboxRequest(config=sandbox)
            sid = api_pb2.RunPodSandboxResponse.FromString(
                await call(Event.RUN_POD_SANDBOX, run)
            ).pod_sandbox_id
            config = container_config(spec, container, node_memory=1024 * GIB)
            create = api_pb2.CreateContainerRequest(
                pod_sandbox_id=sid, config=config, sandbox_config=sandbox
            )
            cid = api_pb2.CreateContainerResponse.FromString(
                await call(Event.CREATE_CONTAINER, create, guaranteed)
            ).container_id
            await call(Event.START_CONTAINER, api_pb2.StartContainerRequest(container_id=cid))
            await asyncio.sleep(0)  # the loop's turn: the store's writes

        try:
            while count < pods:
                await pod(bool(every) and (count + 1) % every == 0)
            await asyncio.sleep(0.5)
            profiler = cProfile.Profile() if profile is not None else None
            in_calls[0] = 0.0
            guaranteed_creates.clear()
            applied = sum(pipeline.updater.window.counts)
            started = time.thread_time()
            if profiler is not None:
                profiler.enable()
            for i in range(starts):
                await pod(bool(every) and (i + 1) % every == 0)
            if profiler is not None:
                profiler.disable()
                assert profile is not None
                profile.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(profile / f"{pods}.prof")
            loop = (time.thread_time() - started) / starts * 1e3
            calls = in_calls[0] / starts * 1e3
            creates = statistics.median(guaranteed_creates) * 1e3 if guaranteed_creates else 0.0
            updates = (sum(pipeline.updater.window.counts) - applied) / starts
            per_update = (loop - calls) / updates * 1e3 if updates else 0.0
            return Figures(loop, calls, creates, updates, per_update)
        finally:
            await store.close()


async def main(sizes: list[int], starts: int, every: int, reps: int, profile: Path | None) -> None:
    print(f"event-loop CPU per pod start, in one process ({starts} starts, fastest of {reps} "
          f"reps; every {every or 'no'}th Guaranteed)\n")  # fmt: skip
    figures: dict[int, Figures] = {}
    for _ in range(reps):
        for size in sizes:
            figure = await measure(size, starts, every, profile)
            best = figures.get(size, figure)
            figures[size] = Figures(*(min(a, b) for a, b in zip(best, figure, strict=True)))
    print(
        "| pods on the node | loop CPU per pod start | of it in the calls "
        "| a Guaranteed CreateContainer | updates per pod start | CPU per update |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for size in sizes:
        f = figures[size]
        print(
            f"| {size:,} | {f.loop:.2f} ms | {f.calls:.2f} ms | {f.guaranteed_create:.2f} ms "
            f"| {f.updates:.1f} | {f.per_update_us:.0f} µs |"
        )
    if 100 in figures and 1000 in figures:
        big, base = figures[1000], figures[100]
        ratios = [a / b if b else float("nan") for a, b in zip(big, base, strict=True)]
        print("\n1,000 vs 100: " + ", ".join(f"{r:.2f}x" for r in ratios))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", default="100,1000")
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--guaranteed", type=int, default=10, metavar="N")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cprofile", type=Path, metavar="DIR")
    args = parser.parse_args()
    sizes = [int(s) for s in args.pods.split(",")]
    asyncio.run(main(sizes, args.starts, args.guaranteed, args.reps, args.cprofile))
