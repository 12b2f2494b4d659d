"""Command line of the conformance runner: ``python -m tests.conformance --help``."""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.conformance.bed import EXTRA_WAYS, WAYS
from tests.conformance.critest import CritestError
from tests.conformance.report import (
    MIN_SPECS,
    render_flaky,
    render_lab_failures,
    render_summary,
    render_table,
)
from tests.conformance.runner import Options, run_conformance, summarize_run
from tests.lab.containerd import LabError
from tests.lab.containerd_versions import runtime_id
from tests.lab.peers import RUNTIME_CHOICES, PeerError
from tests.lab.registry import RegistryError
from tests.lab.standins import StandInError


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance",
        description="critest against a lab runtime: directly, through crihook with no "
        "hooks, and through crihook with an in-process hook chain; same seed each way.",
    )
    parser.add_argument(
        "--containerd",
        "--runtime",
        choices=RUNTIME_CHOICES,
        default="1.6",
        help="Debian's containerd 1.6 (default), containerd 2.x or CRI-O (crio), both built "
        "by tests.lab.peers",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="critest -parallel N (Ginkgo processes; default 1: serial)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="Ginkgo's random seed, the same for every way (default: random)",
    )
    parser.add_argument(
        "--focus",
        default=None,
        metavar="REGEXP",
        help=f"run only the specs matching REGEXP (the exit code still needs {MIN_SPECS} specs)",
    )
    parser.add_argument(
        "--ways",
        default=",".join(w.name for w in WAYS),
        help="comma-separated ways, first is the reference "
        f"(default: {','.join(w.name for w in WAYS)}; "
        f"also: {','.join(w.name for w in EXTRA_WAYS)})",
    )
    parser.add_argument(
        "--no-rerun",
        action="store_true",
        help="do not run the specs that differ a second time (by default they are, every "
        "way; one that then agrees is reported as flaky, not as a difference)",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy critest's, crihook's and containerd's logs to DIR",
    )
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    known = {w.name: w for w in (*WAYS, *EXTRA_WAYS)}
    names = [n.strip() for n in args.ways.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(
            f"unknown way {unknown[0] if unknown else '(none)'}; known: {', '.join(known)}"
        )
    return Options(
        containerd=args.containerd,
        parallel=args.parallel,
        seed=args.seed if args.seed is not None else random.randrange(1, 1 << 31),
        ways=tuple(known[n] for n in names),
        focus=args.focus,
        logs=args.logs,
        rerun=not args.no_rerun,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        result = run_conformance(options)
    except (CritestError, LabError, PeerError, RegistryError, StandInError) as exc:
        print(f"conformance: could not run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("conformance: interrupted (everything it started was removed)", file=sys.stderr)
        return 130
    print(
        f"# critest through crihook: {runtime_id(options.containerd)}, seed {options.seed}"
        f"{f', parallel {options.parallel}' if options.parallel > 1 else ''}\n"
    )
    for name, run in result.runs.items():
        print(f"- {summarize_run(name, run)}")
    print()
    print(render_table(result.comparison))
    print()
    print(render_lab_failures(result.lab_failures))
    print()
    print(render_flaky(result.comparison))
    print(f"\nWall time: {result.seconds:.0f}s")
    print(render_summary(result.comparison))
    return 0 if result.comparison.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
