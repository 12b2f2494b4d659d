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

`--split` says what a chain's added figure is made of. Each scenario with hooks runs twice
more, with every hook in its place but its work taken out: once answering nothing at every
stage (what the chain charges for having the hooks at all), and once answering, at every
stage, what the hook answered on the last warm-up call (what carrying those answers costs:
checking, merging, auditing and encoding them). The rest of the figure is the hooks' own work.

`--cold MB` reads that many MiB of memory between two calls (outside the figure), as the
runtime and kubelet running between two calls do on a busy node: the caches are colder, and
the same Python costs more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tomllib
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench import payloads
from bench.run import SCENARIOS, Scenario
from crihook.hooks.node import read_topology
from crihook.hooks.node.host import LinuxHost
from crihook.hooks.spec import ContainerState, Event, HookContext, Stage, SyncContext
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import LocalHook, load_local_hook
from crihook.proxy.config import Settings, apply_flags, settings_from_toml
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.core.placement import Placement
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.state.store import Store

DEFAULT = ("hooks-none", "resource-hooks", "devices")

ANSWERS = ("hooks", "canned", "nothing")
"""Who answers in a chain: the hooks themselves; each hook's answers from the last warm-up
call, without its work; nobody (every stage answers nothing)."""


class _NoContainers:
    """What hooks may ask the runtime: no pod has containers yet, nor a network namespace."""

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        return {}

    async def sandbox_netns(self, pod_id: str) -> str | None:
        return None

    async def oom_score_adj(self, container_id: str) -> int | None:
        return None  # the runtime does not say: the oom hook keeps what it asked for


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


class StandIn(LocalHook):
    """A hook whose work can be taken out of the chain while it keeps its place there (its
    name, subscriptions, grants and settings). Until `answers` is set it is the hook, and
    keeps each stage's last answer in `kept`; then each stage answers what `answers` holds
    for it, or nothing."""

    def __init__(self, hook: LocalHook) -> None:
        super().__init__(hook.name, hook.impl)
        self.kept: dict[tuple[Event, Stage], Any] = {}
        self.answers: dict[tuple[Event, Stage], Any] | None = None

    async def call(self, ctx: HookContext) -> Any:
        if self.answers is not None:
            return self.answers.get((ctx.event, ctx.stage))
        answer = await super().call(ctx)
        self.kept[(ctx.event, ctx.stage)] = answer
        return answer


def take_work_out(pipeline: Pipeline, answers: str) -> None:
    """From now on every hook answers as `answers` (one of ANSWERS but "hooks") says."""
    for entry in pipeline.chain.entries:
        hook = entry.hook
        assert isinstance(hook, StandIn), "the pipeline was built with stand_ins=True"
        hook.answers = dict(hook.kept) if answers == "canned" else {}


class _NamedOnly:
    """Staging that names the staged paths and mounts nothing: pinning runs in a worker
    thread, so the event loop's share is the hop, the same either way; the mount calls' own
    cost is `bench.staging_cost`'s."""

    def pin_mount(self, key: str, name: str, path: str, readonly: bool) -> str:
        return f"/run/crihook/mounts/{key}/{name}"

    def pin_device(self, key: str, name: str, path: str, node: object) -> str:
        return f"/run/crihook/mounts/{key}/{name}"

    def release(self, key: str) -> None:
        pass

    def keys(self) -> list[str]:
        return []


async def build(
    scenario: Scenario, state_dir: Path, stand_ins: bool = False
) -> tuple[Pipeline, Store]:
    """The scenario's pipeline, its hooks synchronized as crihook does at start (no pods);
    `stand_ins`: each hook wrapped in a StandIn."""
    settings = settings_of(scenario)
    store = Store(state_dir)
    store.load()
    chain = Chain(settings.chain, store.hook_state)
    hooks = [load_local_hook(h) for h in settings.chain.hooks]
    if stand_ins:
        hooks = [StandIn(h) for h in hooks]
    entries = [Chain.entry(h, s) for h, s in zip(hooks, settings.chain.hooks, strict=True)]
    chain.set_builtin(entries)
    node = read_topology(settings.node.sysfs_root)
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
            staging=_NamedOnly(),
        )
        await entry.hook.synchronize(sync)
    readiness = Readiness()
    readiness.set(True)
    placement = Placement(settings.node.topology_policy, node.numa_nodes)
    pipeline = Pipeline(payloads.InstantRuntime(), chain, store, readiness, placement)
    return pipeline, store


async def loop_cpu(
    scenario: Scenario, requests: list[bytes], answers: str = "hooks", cold_mib: int = 0
) -> float:
    """µs of event-loop CPU per CreateContainer through the scenario's pipeline, with the hooks
    answering as `answers` says (ANSWERS), reading `cold_mib` MiB between calls."""
    if answers not in ANSWERS:
        raise ValueError(f"answers: {answers!r}, not one of {', '.join(ANSWERS)}")
    cold = os.urandom(cold_mib << 20)  # not zeros: those all read one page the kernel shares
    with tempfile.TemporaryDirectory(prefix="crihook-bench-") as tmp:
        pipeline, store = await build(scenario, Path(tmp), stand_ins=answers != "hooks")
        try:
            warm = len(requests) // 10
            for raw in requests[:warm]:
                await pipeline.handle(Event.CREATE_CONTAINER, raw, None, time.monotonic() + 2)
            if answers != "hooks":
                take_work_out(pipeline, answers)
            spent = 0.0
            for raw in requests[warm:]:
                if cold:
                    zlib.crc32(cold)  # reads it all: what the caches held is gone
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


async def main(names: list[str], calls: int, reps: int, split: bool, cold_mib: int) -> None:
    chosen = [s for s in SCENARIOS if s.name in names]
    runs = [
        (s, answers)
        for s in chosen
        for answers in (ANSWERS if split and s.name != "hooks-none" else ANSWERS[:1])
    ]
    base = payloads.fake_create_container_request()
    marker = payloads.NAME_MARKER.encode()
    figures: dict[tuple[str, str], list[float]] = {(s.name, a): [] for s, a in runs}
    for rep in range(reps):
        for index, (scenario, answers) in enumerate(runs):
            first = (rep * len(runs) + index) * calls
            requests = [base.replace(marker, f"{first + i:010d}".encode()) for i in range(calls)]
            figures[(scenario.name, answers)].append(
                await loop_cpu(scenario, requests, answers, cold_mib)
            )
    best = {key: min(values) for key, values in figures.items()}
    cold = f", {cold_mib} MiB read between calls" if cold_mib else ""
    print(f"event-loop CPU per CreateContainer, in one process (fastest of {reps} reps{cold}):")
    none = best.get(("hooks-none", "hooks"))
    for (name, answers), value in best.items():
        if answers != "hooks":
            continue
        added = "" if none is None or name == "hooks-none" else f"  added {value - none:+7.1f}"
        print(f"  {name:16s} {value:7.1f} µs{added}")
    if not split:
        return
    if none is None:
        print("--split: nothing to split without hooks-none (the figures are added over it)")
        return
    print("of what each chain adds (µs):")
    print(f"  {'':16s} {'having hooks':>12s} {'their answers':>13s} {'their work':>10s}")
    for scenario in chosen:
        name = scenario.name
        if name == "hooks-none":
            continue
        nothing = best[(name, "nothing")] - none
        canned = best[(name, "canned")] - none
        whole = best[(name, "hooks")] - none
        print(f"  {name:16s} {nothing:+12.1f} {canned - nothing:+13.1f} {whole - canned:+10.1f}")


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
    parser.add_argument(
        "--split",
        action="store_true",
        help="also run each chain with its hooks' work taken out (module docstring)",
    )
    parser.add_argument(
        "--cold", type=int, default=0, metavar="MB", help="MiB of memory read between calls"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.scenario or list(DEFAULT), args.calls, args.reps, args.split, args.cold))
