"""One conformance run: critest each way against one containerd, then the comparison.

:func:`run_conformance` is what ``python -m tests.conformance`` calls; it takes a
:class:`Options` and returns a :class:`ConformanceResult` with every run and the
comparison. Progress goes to ``progress`` (stderr by default), one line per step.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.conformance.bed import WAYS, ConformanceBed, Way
from tests.conformance.critest import CritestResult, run_critest
from tests.conformance.report import (
    Comparison,
    LabFailure,
    compare,
    explain_lab_failures,
    focus_on,
)
from tests.lab import peers
from tests.lab.containerd_versions import runtime_id

__all__ = ["ConformanceResult", "Options", "run_conformance", "summarize_run"]


@dataclass(frozen=True)
class Options:
    containerd: str = "1.6"  # Debian's 1.6, "2": 2.x, "crio": CRI-O (both built by peers)
    parallel: int = 1
    seed: int = field(default_factory=lambda: random.randrange(1, 1 << 31))
    ways: tuple[Way, ...] = WAYS
    focus: str | None = None  # a regexp of specs (tests); None: the whole suite
    logs: Path | None = None  # copy critest's and crihook's logs here
    rerun: bool = True  # run the specs that differ once more, every way (flaky or not?)
    timeout_minutes: int = 30  # per critest run


@dataclass(frozen=True)
class ConformanceResult:
    options: Options
    runs: dict[str, CritestResult]
    comparison: Comparison
    lab_failures: list[LabFailure]
    seconds: float


def summarize_run(name: str, result: CritestResult) -> str:
    states = [s.state for s in result.specs]
    ran = sum(s.ran for s in result.specs)
    return (
        f"{name}: {ran} ran, {states.count('passed')} passed, "
        f"{ran - states.count('passed')} failed, {len(states) - ran} skipped "
        f"in {result.seconds:.0f}s (critest exit {result.exit_code})"
    )


def run_conformance(
    options: Options, progress: Callable[[str], None] | None = None
) -> ConformanceResult:
    say = progress or (lambda line: print(f"conformance: {line}", file=sys.stderr, flush=True))
    start = time.monotonic()
    critest = peers.critest()
    ginkgo = peers.ginkgo() if options.parallel > 1 else None
    # Short: containerd's and crihook's sockets live below it (107-byte limit).
    workdir = Path(tempfile.mkdtemp(prefix="crihook-conf-", dir="/tmp"))
    try:
        with ConformanceBed(workdir / "bed", options.containerd) as bed:
            try:
                say(
                    f"{runtime_id(options.containerd)} up in {time.monotonic() - start:.0f}s; "
                    f"registry {bed.registry.url if bed.registry else '?'}; seed {options.seed}"
                    f"{f'; parallel {options.parallel}' if options.parallel > 1 else ''}"
                )
                suite = _Suite(bed, options, critest, ginkgo, workdir, say)
                runs = suite.run_ways(options.focus, "")
                comparison = compare({name: r.specs for name, r in runs.items()})
                differing = comparison.differing()
                if differing and options.rerun:
                    say(f"{len(differing)} spec(s) differ: running them again, every way")
                    reruns = suite.run_ways(focus_on(differing), "-rerun")
                    comparison = comparison.with_reruns(
                        {name.removesuffix("-rerun"): r.specs for name, r in reruns.items()}
                    )
                comparison = comparison.with_known_flakes(options.containerd)
            finally:
                if options.logs is not None:  # before the bed removes containerd's log
                    _copy_logs(workdir, options.logs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    direct = runs[options.ways[0].name]
    flaky = {row.name for row in comparison.flaky}
    failures = explain_lab_failures(direct.specs, options.containerd, flaky)
    return ConformanceResult(options, runs, comparison, failures, time.monotonic() - start)


@dataclass(frozen=True)
class _Suite:
    """Runs critest once per way on the bed, resetting containerd before each."""

    bed: ConformanceBed
    options: Options
    critest: Path
    ginkgo: Path | None
    workdir: Path
    say: Callable[[str], None]

    def run_ways(self, focus: str | None, suffix: str) -> dict[str, CritestResult]:
        runs: dict[str, CritestResult] = {}
        for way in self.options.ways:
            name = way.name + suffix
            self.bed.reset()
            rundir = self.workdir / name
            self.say(f"{name}: {way.describe()}")
            with self.bed.host_ipc_cleanup(), self.bed.endpoint(way, rundir) as endpoint:
                result = run_critest(
                    self.critest,
                    endpoint,
                    seed=self.options.seed,
                    workdir=rundir,
                    parallel=self.options.parallel,
                    ginkgo=self.ginkgo,
                    focus=focus,
                    timeout_minutes=self.options.timeout_minutes,
                )
            runs[name] = result
            self.say(summarize_run(name, result))
            for node in result.setup:
                self.say(f"{name}: suite node {node.name} {node.state}: {node.message}")
        return runs


def _copy_logs(workdir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    patterns: Sequence[str] = ("*/critest.log", "*/report.json", "*/crihook/crihook.log")
    for pattern in patterns:
        for path in workdir.glob(pattern):
            target = dest / str(path.relative_to(workdir)).replace("/", "-")
            shutil.copyfile(path, target)
    for runtime_log in (workdir / "bed" / "ctd").glob("*.log"):  # containerd.log, crio.log
        shutil.copyfile(runtime_log, dest / runtime_log.name)
