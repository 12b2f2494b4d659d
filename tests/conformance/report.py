"""Compare critest outcomes across ways of reaching the runtime, and say why the lab fails.

Pure functions over :class:`~tests.conformance.critest.SpecResult` values: :func:`compare`
lines the runs up spec by spec, :func:`explain_lab_failures` gives each spec that failed
directly a reason (the known limits of this lab, listed in :data:`LAB_LIMITS`), and the
``render_*`` functions print the table and the closing line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from tests.conformance.critest import SpecResult

__all__ = [
    "LAB_LIMITS",
    "MIN_SPECS",
    "Comparison",
    "LabFailure",
    "LabLimit",
    "Row",
    "compare",
    "explain_lab_failures",
    "focus_on",
    "render_flaky",
    "render_lab_failures",
    "render_summary",
    "render_table",
]

MIN_SPECS = 80  # the bar: fewer specs ran means the run itself went wrong
MISSING = "missing"


@dataclass(frozen=True)
class LabLimit:
    """A spec that fails directly because of this lab, not because of crihook."""

    spec: str  # regexp searched in the spec name
    reason: str
    runtimes: tuple[str, ...] = ("1.6", "2", "crio")  # the lab runtimes it applies to


LAB_LIMITS: tuple[LabLimit, ...] = (
    LabLimit(
        r"public image with digest should be pulled and removed",
        "the digest-pinned test-image-digest@sha256:9700f9… cannot be rebuilt: only the real "
        "image has that digest, and the lab never reaches the real registry",
    ),
    LabLimit(
        r"should support port mapping with host port",
        "no portmap CNI plugin in the lab's network: it would add iptables rules to the host",
    ),
    LabLimit(
        r"runtime should support MaskedPaths",
        "Debian's static busybox runs `ls` as a built-in applet (standalone shell), so "
        "masking /bin/ls does not stop `sh -c ls`",
    ),
    LabLimit(
        r"UserNamespaces when Host idmap mount support is needed runtime should support "
        r"NamespaceMode_POD",
        "runc 1.5.3 in this VM rejects the pod's pinned user namespace that containerd 2.4 "
        "made ('user namespaces enabled, but no mapping found for uid 0'), although the OCI "
        "spec maps uid 0; with Debian's runc 1.1.5 containerd reports no user-namespace "
        "support and critest skips all six user-namespace specs instead",
        runtimes=("2",),
    ),
    LabLimit(
        r"Idempotence (StopPodSandbox|StopContainer) should not return an error if not found",
        "containerd 1.6 answers StopPodSandbox / StopContainer of an unknown id with NotFound "
        "(fixed in later containerd)",
        runtimes=("1.6",),
    ),
    LabLimit(
        r"Image Identifier Consistency should return the same image identifier",
        "CRI-O 1.34.0's PullImage answers a repository digest (registry.k8s.io/pause@sha256:"
        "<manifest>), not the image id ImageStatus reports (the config digest's hex), so it "
        "matches neither Image.id nor the other registry's answer",
        runtimes=("crio",),
    ),
    LabLimit(
        r"PodSandbox runtime should support metrics operations",
        "CRI-O 1.34.0 describes and reports cpu, memory, network and OOM metrics only; "
        "critest also wants 19 others (block I/O, file descriptors, filesystem, processes, "
        "threads, spec, start time)",
        runtimes=("crio",),
    ),
)


@dataclass(frozen=True)
class KnownFlake:
    """A spec that passes and fails at random on a runtime here, directly as through crihook
    (seen failing directly), for a reason of the runtime's own."""

    spec: str  # regexp searched in the spec name
    reason: str
    runtimes: tuple[str, ...]


KNOWN_FLAKES: tuple[KnownFlake, ...] = (
    KnownFlake(
        r"should support execSync with timeout",
        "CRI-O 1.34.0 answers the timed-out ExecSync before the exec'd `sleep` is gone, so "
        "the spec's next exec still finds it (seen directly in 2 of 4 runs)",
        ("crio",),
    ),
    KnownFlake(
        r"should not fail on simultaneous RemoveImage calls",
        "CRI-O 1.34.0 answers some of five concurrent RemoveImage calls of one image "
        "'delete image: identifier is not an image' when another removal won the race "
        "(seen directly in 1 of 3 runs)",
        ("crio",),
    ),
    KnownFlake(
        r"should support exec with tty=true and stdin=true",
        "CRI-O 1.34.0 sometimes closes a tty exec's stream before its output is sent: "
        "'The stdout of exec should contain hello' (seen directly in 1 of 4 runs)",
        ("crio",),
    ),
    KnownFlake(
        r"should return the same image identifier across all APIs",
        "critest 1.37's spec removes its container without stopping it, trusting the image's "
        "`sh` to have exited by then; under load containerd still has it running: 'container "
        "is still running, to stop first' (seen directly in 1 of 15 runs at load 6; 1.6 "
        "skips the spec before its clean-up decides the outcome)",
        ("2",),
    ),
)


@dataclass(frozen=True)
class Row:
    """One spec: its outcome each way and, when those differed, each way's outcome on a
    focused re-run (``rerun``). A spec that agrees on the re-run is *flaky*, not different:
    it is listed as such, and the first outcomes stay in the table."""

    name: str
    outcomes: tuple[str, ...]  # one per way, in Comparison.ways order
    rerun: tuple[str, ...] | None = None
    known_flake: str = ""
    """Why this spec passes and fails at random on this runtime, directly too (KNOWN_FLAKES):
    then a mix of passes and failures is no difference."""

    @property
    def ran(self) -> bool:
        return any(o not in ("skipped", "pending", MISSING) for o in self.outcomes)

    @property
    def same(self) -> bool:
        final = self.rerun if self.rerun is not None else self.outcomes
        if self.known_flake and {*self.outcomes, *final} <= {"passed", "failed"}:
            return True
        return MISSING not in final and len(set(final)) == 1

    @property
    def flaky(self) -> bool:
        mixed = bool(self.known_flake) and len(set(self.outcomes)) > 1
        return self.same and (self.rerun is not None or mixed)


@dataclass(frozen=True)
class Comparison:
    ways: tuple[str, ...]
    rows: tuple[Row, ...]

    @property
    def ran(self) -> int:
        return sum(r.ran for r in self.rows)

    @property
    def same(self) -> int:
        return sum(r.ran and r.same for r in self.rows)

    @property
    def differ(self) -> int:
        return sum(r.ran and not r.same for r in self.rows)

    @property
    def flaky(self) -> list[Row]:
        return [r for r in self.rows if r.ran and r.flaky]

    def differing(self) -> list[str]:
        """Specs whose outcomes differ (before any re-run)."""
        return [r.name for r in self.rows if r.ran and len(set(r.outcomes)) != 1]

    def with_reruns(self, reruns: Mapping[str, Sequence[SpecResult]]) -> Comparison:
        """The comparison after a focused re-run (way -> results) of the differing specs."""
        by_way = {way: {s.name: s.state for s in reruns.get(way, ())} for way in self.ways}
        wanted = set(self.differing())
        rows = tuple(
            dataclasses.replace(
                row, rerun=tuple(by_way[way].get(row.name, MISSING) for way in self.ways)
            )
            if row.name in wanted
            else row
            for row in self.rows
        )
        return Comparison(self.ways, rows)

    def with_known_flakes(self, runtime: str) -> Comparison:
        """The comparison with each spec of KNOWN_FLAKES on ``runtime`` marked."""
        rows = []
        for row in self.rows:
            reason = next(
                (
                    f.reason
                    for f in KNOWN_FLAKES
                    if runtime in f.runtimes and re.search(f.spec, row.name)
                ),
                "",
            )
            rows.append(dataclasses.replace(row, known_flake=reason) if reason else row)
        return Comparison(self.ways, tuple(rows))

    def ok(self, min_specs: int = MIN_SPECS) -> bool:
        return self.differ == 0 and self.ran >= min_specs


def compare(runs: Mapping[str, Sequence[SpecResult]]) -> Comparison:
    """One row per spec seen in any run (sorted by name); a spec absent from a run is
    ``missing`` there, and a difference."""
    ways = tuple(runs)
    by_way = {way: {s.name: s.state for s in specs} for way, specs in runs.items()}
    names = sorted({name for states in by_way.values() for name in states})
    rows = tuple(Row(name, tuple(by_way[way].get(name, MISSING) for way in ways)) for name in names)
    return Comparison(ways, rows)


def focus_on(names: Sequence[str]) -> str:
    """A Ginkgo focus regexp matching exactly these specs. Ginkgo matches it against the
    spec's full text, which has more in front of the container texts: no ``^``."""
    bare = sorted({re.sub(r" \(#\d+\)$", "", name) for name in names})
    return "|".join(f"(^|\\s){re.escape(name)}$" for name in bare)


@dataclass(frozen=True)
class LabFailure:
    spec: str
    reason: str  # "" when no known lab limit explains it
    message: str


def explain_lab_failures(
    direct: Sequence[SpecResult], runtime: str, flaky: Collection[str] = ()
) -> list[LabFailure]:
    """Every spec that did not pass directly (skips excluded), with the lab's reason (or,
    for a known flake of the runtime, why it fails at random here; or, for a spec in
    ``flaky``, that every way agreed on the re-run)."""
    failures = []
    for spec in direct:
        if not spec.ran or spec.state == "passed":
            continue
        if spec.name in flaky and not any(re.search(f.spec, spec.name) for f in KNOWN_FLAKES):
            reason = "flaky here: every way agreed on the re-run (see below)"
            failures.append(LabFailure(spec.name, reason, spec.message))
            continue
        reason = next(
            (
                limit.reason
                for limit in LAB_LIMITS
                if runtime in limit.runtimes and re.search(limit.spec, spec.name)
            ),
            "",
        ) or next(
            (
                f"flaky here: {flake.reason}"
                for flake in KNOWN_FLAKES
                if runtime in flake.runtimes and re.search(flake.spec, spec.name)
            ),
            "",
        )
        failures.append(LabFailure(spec.name, reason, spec.message))
    return failures


def _cell(outcome: str) -> str:
    return {"passed": "pass", "failed": "FAIL", "skipped": "skip"}.get(outcome, outcome)


def render_table(comparison: Comparison) -> str:
    """A Markdown table: every spec, its outcome each way, and whether they agree."""
    head = ["spec", *comparison.ways, "same"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * len(head)) + "|",
    ]
    for row in comparison.rows:
        name = row.name.replace("|", "\\|")
        if row.rerun is None:
            verdict = "yes" if row.same else "**NO**"
        else:
            again = "/".join(_cell(o) for o in row.rerun)
            verdict = f"yes on re-run ({again})" if row.same else f"**NO**, re-run: {again}"
        lines.append("| " + " | ".join([name, *(_cell(o) for o in row.outcomes), verdict]) + " |")
    return "\n".join(lines)


def render_lab_failures(failures: Sequence[LabFailure]) -> str:
    if not failures:
        return "Specs that failed directly: none."
    lines = [f"Specs that failed directly ({len(failures)}), and why:"]
    for f in sorted(failures, key=lambda f: f.spec):
        why = f.reason or f"NOT A KNOWN LAB LIMIT: {f.message or '(no message)'}"
        lines.append(f"- {f.spec}\n    {why}")
    return "\n".join(lines)


def render_flaky(comparison: Comparison) -> str:
    flaky = comparison.flaky
    if not flaky:
        return "Specs that differed once and agreed on a re-run: none."
    lines = [f"Specs that differed once and agreed on a re-run ({len(flaky)}): flaky here"]
    for row in flaky:
        first = ", ".join(
            f"{w} {_cell(o)}" for w, o in zip(comparison.ways, row.outcomes, strict=True)
        )
        lines.append(f"- {row.name}\n    first run: {first}")
        if row.known_flake:
            lines.append(f"    known flaky here: {row.known_flake}")
    return "\n".join(lines)


def render_summary(comparison: Comparison) -> str:
    return (
        f"conformance: {comparison.ran} specs ran, {comparison.same} same both ways, "
        f"{comparison.differ} differ"
    )
