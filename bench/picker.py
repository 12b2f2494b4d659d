"""What one exclusive-CPU pick costs: take_cpus on a big, fragmenting machine.

    python -m bench.picker [--containers 1000] [--seed 1] [--reserved 4] [--reps 5]

Builds a 256-CPU machine (2 sockets x 64 cores x 2 threads, 4 NUMA nodes per socket, one L3
per 8 cores; core c is CPUs c and c+128, as Linux numbers them), reserves ``--reserved``
CPUs as kubelet would, then allocates ``--containers`` containers of 1, 2, 4, 8 or 16 CPUs
(mostly small ones) and frees random live ones as it goes, so the free CPUs fragment. Every
``take_cpus`` call is timed with ``time.perf_counter_ns``; the same request sequence is
replayed for each mode, ``--reps`` times: a pick's time is its fastest replay (the picks are
the same every time), which keeps other processes on the machine out of the figures; the
slowest replay's p50 is printed too. ``full-cores`` modes round odd requests up to whole
cores. The modes are kubelet's CPU manager policy options and the pairs of them kubelet
takes: ``uncore-cache`` is ``prefer-align-cpus-by-uncorecache`` (the machine has 16 L3s of 8
cores, 2 per NUMA node), ``spread-cores`` is ``distribute-cpus-across-cores``, ``by-socket`` is
``align-by-socket`` (which changes the distributed pick).

Prints a Markdown table (nearest-rank percentiles, µs per pick) and checks the target: p50
≤ 1000 µs per pick in every mode. The one-off cost of indexing the topology (once per
Topology object, not per pick) is printed apart. Timing lives here, never in tests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass

from bench.loadgen import percentile
from crihook.hooks.cpus import take_cpus
from crihook.hooks.cpus.picker import _index
from crihook.hooks.node.topology import CPUInfo, Topology

SIZES = (1, 2, 4, 8, 16)
WEIGHTS = (30, 30, 20, 12, 8)
FREE_CHANCE = 0.45
"""Before each allocation, the chance to free one random live container first."""
TARGET_P50_US = 1000.0


@dataclass(frozen=True)
class Mode:
    name: str
    spread_numa: bool = False
    full_cores: bool = False
    uncore_cache: bool = False
    spread_cores: bool = False
    align_socket: bool = False


MODES = (
    Mode("packed"),
    Mode("spread-numa", spread_numa=True),
    Mode("packed, full-cores", full_cores=True),
    Mode("spread-numa, full-cores", spread_numa=True, full_cores=True),
    Mode("uncore-cache", uncore_cache=True),
    Mode("uncore-cache, full-cores", uncore_cache=True, full_cores=True),
    Mode("spread-cores", spread_cores=True),
    Mode("spread-numa, by-socket", spread_numa=True, align_socket=True),
)


def bench_machine() -> Topology:
    cpus = [
        CPUInfo(id=core + thread * 128, socket=core // 64, die=core // 64, core=core,
                numa=core // 16, l3=core // 8)
        for core in range(128)
        for thread in range(2)
    ]  # fmt: skip
    return Topology.build(cpus)


@dataclass
class Run:
    mode: Mode
    picks_ns: list[int]
    free_at_pick: list[int]
    refused: int
    picked: list[frozenset[int] | None]


def run(topology: Topology, mode: Mode, containers: int, seed: int, reserved: int) -> Run:
    rng = random.Random(seed)  # the same request and free sequence for every mode
    free = set(topology.online - take_cpus(topology, topology.online, reserved))
    live: list[frozenset[int]] = []
    out = Run(mode, [], [], 0, [])
    for _ in range(containers):
        size = rng.choices(SIZES, WEIGHTS)[0]
        if mode.full_cores and size % 2:
            size += 1
        while live and (len(free) < size or rng.random() < FREE_CHANCE):
            free |= live.pop(rng.randrange(len(live)))
        out.free_at_pick.append(len(free))
        got: frozenset[int] | None = None
        start = time.perf_counter_ns()
        try:
            got = take_cpus(
                topology,
                free,
                size,
                spread_numa=mode.spread_numa,
                full_cores=mode.full_cores,
                uncore_cache=mode.uncore_cache,
                spread_cores=mode.spread_cores,
                align_socket=mode.align_socket,
            )
        except ValueError:  # full-cores: not enough whole cores free
            out.refused += 1
        out.picks_ns.append(time.perf_counter_ns() - start)
        out.picked.append(got)
        if got is not None:
            free -= got
            live.append(got)
    return out


def fastest(runs: list[Run]) -> tuple[Run, float]:
    """Each pick's fastest replay, and the p50 µs of the slowest replay."""
    first = runs[0]
    if any(r.picked != first.picked for r in runs):
        raise SystemExit("replays picked different CPUs: take_cpus is not deterministic")
    best = [min(times) for times in zip(*(r.picks_ns for r in runs), strict=True)]
    worst_p50 = max(percentile(sorted(r.picks_ns), 50) for r in runs) / 1000
    return Run(first.mode, best, first.free_at_pick, first.refused, first.picked), worst_p50


def markdown(results: list[tuple[Run, float]]) -> str:
    head = (
        "| mode | picks | refused | mean free CPUs | p50 µs | p90 µs | p99 µs | max µs "
        f"| slowest replay p50 µs | p50 ≤ {TARGET_P50_US:,.0f} µs |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    lines = []
    for r, worst_p50 in results:
        ordered = sorted(r.picks_ns)
        p50, p90, p99 = (percentile(ordered, p) / 1000 for p in (50, 90, 99))
        met = "met" if p50 <= TARGET_P50_US else "NOT met"
        lines.append(
            f"| {r.mode.name} | {len(ordered)} | {r.refused} "
            f"| {statistics.fmean(r.free_at_pick):.0f} | {p50:,.0f} | {p90:,.0f} | {p99:,.0f} "
            f"| {ordered[-1] / 1000:,.0f} | {worst_p50:,.0f} | {met} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reserved", type=int, default=4, help="kubelet reserved CPUs")
    parser.add_argument("--reps", type=int, default=5, help="replays of each mode")
    args = parser.parse_args()

    topology = bench_machine()
    start = time.perf_counter_ns()
    _index(topology)
    index_us = (time.perf_counter_ns() - start) / 1000
    results = [
        fastest(
            [run(topology, m, args.containers, args.seed, args.reserved) for _ in range(args.reps)]
        )
        for m in MODES
    ]
    print(
        f"take_cpus on {len(topology.online)} CPUs, {len(topology.sockets)} sockets, "
        f"{len(topology.numa_nodes)} NUMA nodes, {args.containers} containers per mode "
        f"(seed {args.seed}, {args.reserved} reserved, fastest of {args.reps} replays per "
        f"pick); topology index built once in {index_us:,.0f} µs\n"
    )
    print(markdown(results))


if __name__ == "__main__":
    main()
