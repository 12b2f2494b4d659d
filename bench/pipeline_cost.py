"""What each in-process chain costs the event loop per CreateContainer, in one process with no
sockets, so the figure is the pipeline's own and is not lost in the noise of three processes
sharing two cores:

    python -m bench.pipeline_cost [--scenario devices ...] [--calls 3000] [--reps 5]

Each scenario is one of bench.run's that chains in-process hooks only (`CHOICES`: no
plugins, sidecars or extra files), built from the same configuration and `--hooks` flag:
the store in a temporary state directory (journal lines written ahead for real), the hooks
synchronized on this machine's topology, and a runtime that answers at once with the same
container id (as bench.run's fake runtime does). Every call is the bench's kubelet-shaped
CreateContainerRequest with a container name of its own, decoded, run through the whole
pipeline (views, hints, pre stage, write-ahead, merge, store, post stage) and answered. The
loop yields after each call, so the store's checkpoints run as they do in crihook (their
file writes happen in a worker thread, outside the figure).

A scenario's figure is the event loop's CPU (thread time) per call, the fastest of the reps,
which are interleaved across scenarios; "added" is over hooks-none. bench.run's added p50
for a chain is this figure times the cost of running among other processes (caches, context
switches): 1.2 to 2 on this machine on 2026-11-30, as its state moved. Timing lives here,
never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path

from bench import payloads
from bench.run import SCENARIOS, Scenario
from crihook.hooks.node.host import LinuxHost
from crihook.hooks.node.topology import Topology
from crihook.hooks.spec import ContainerState, Event, SyncContext
from crihook.proxy.chain import Chain
from crihook.proxy.config import Settings, apply_flags, settings_from_toml
from crihook.proxy.local_hooks import load_local_hook
from crihook.proxy.passthrough import Readiness
from crihook.proxy.pipeline import Pipeline
from crihook.proxy.placement import Placement
from crihook.proxy.store import Store

DEFAULT = ("hooks-none", "resource-hooks", "devices")


class _NoContainers:
    """What hooks may ask the runtime: no pod has containers yet, nor a network namespace."""

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        return {}

    async def sandbox_netns(self, pod_id: str) -> str | None:
        return None


def in_process(scenario: Scenario) -> bool:
    """Whether the scenario chains in-process hooks only, so it can be run here."""
    flags = scenario.args
    return (
        not scenario.files
        and not scenario.sidecars
        and not scenario.env
        and (flags == () or (len(flags) == 2 and flags[0] == "--hooks"))
    )


CHOICES = tuple(s.name for s in SCENARIOS if in_process(s))


def settings_of(scenario: Scenario) -> Settings:
    settings = settings_from_toml(tomllib.loads(scenario.config))
    if scenario.args:
        settings = apply_flags(settings, {"hooks": scenario.args[1]})
    return settings


async def build(scenario: Scenario, state_dir: Path) -> tuple[Pipeline, Store]:
    """The scenario's pipeline, its hooks synchronized as crihook does at start (no pods)."""
    settings = settings_of(scenario)
    store = Store(state_dir)
    store.load()
    chain = Chain(settings.chain, store.hook_state)
    entries = [Chain.entry(load_local_hook(h), h) for h in settings.chain.hooks]
    chain.set_builtin(entries)
    node = Topology.from_sysfs(settings.node.sysfs_root)
    for entry in entries:
        sync = SyncContext(
            state=store.hook_state(entry.base_name),
            node=node,
            host=LinuxHost(),
            runtime=_NoContainers(),
            pods=(),
            containers=(),
            container_states={},
            topology_policy=settings.node.topology_policy,
            topology_scope=settings.node.topology_scope,
        )
        await entry.hook.synchronize(sync)
    readiness = Readiness()
    readiness.set(True)
    placement = Placement(settings.node.topology_policy, node.numa_nodes)
    pipeline = Pipeline(payloads.InstantRuntime(), chain, store, readiness, placement)
    return pipeline, store


async def loop_cpu(scenario: Scenario, requests: list[bytes]) -> float:
    """µs of event-loop CPU per CreateContainer through the scenario's pipeline."""
    with tempfile.TemporaryDirectory(prefix="crihook-bench-") as tmp:
        pipeline, store = await build(scenario, Path(tmp))
        try:
            warm = len(requests) // 10
            for raw in requests[:warm]:
                await pipeline.handle(Event.CREATE_CONTAINER, raw, None, time.monotonic() + 2)
            spent = 0.0
            for raw in requests[warm:]:
                started = time.thread_time()
                outcome = await pipeline.handle(
                    Event.CREATE_CONTAINER, raw, None, time.monotonic() + 2
                )
                spent += time.thread_time() - started
                if outcome.status is not None:
                    raise RuntimeError(f"{scenario.name}: the call failed: {outcome.status}")
                await asyncio.sleep(0)  # the loop's turn: the store's checkpoints
            return spent / (len(requests) - warm) * 1e6
        finally:
            await store.close()


async def main(names: list[str], calls: int, reps: int) -> None:
    chosen = [s for s in SCENARIOS if s.name in names]
    base = payloads.fake_create_container_request()
    marker = payloads.NAME_MARKER.encode()
    figures: dict[str, list[float]] = {s.name: [] for s in chosen}
    for rep in range(reps):
        for scenario in chosen:
            first = (rep * len(chosen) + len(figures[scenario.name])) * calls
            requests = [base.replace(marker, f"{first + i:010d}".encode()) for i in range(calls)]
            figures[scenario.name].append(await loop_cpu(scenario, requests))
    best = {name: min(values) for name, values in figures.items()}
    print(f"event-loop CPU per CreateContainer, in one process (fastest of {reps} reps):")
    none = best.get("hooks-none")
    for name, value in best.items():
        added = "" if none is None or name == "hooks-none" else f"  added {value - none:+7.1f}"
        print(f"  {name:16s} {value:7.1f} µs{added}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario",
        action="append",
        choices=CHOICES,
        help=f"scenario(s) to run (default: {', '.join(DEFAULT)})",
    )
    parser.add_argument("--calls", type=int, default=3000, help="calls per rep (default 3000)")
    parser.add_argument("--reps", type=int, default=5, help="reps (default 5)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.scenario or list(DEFAULT), args.calls, args.reps))
