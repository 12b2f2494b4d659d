"""The soak: crihook under faults, load, a long run and bad input, bounded, with a summary.

    python -m bench.soak                          # every part, moderate sizes (~6 min here)
    python -m bench.soak --parts load,endurance --containers 1000 --calls 100000
    python -m bench.soak --parts chaos --chaos-seconds 300 --seed 7
    python -m bench.soak --data-path h2           # every crihook on that data path

Parts (see bench/README.md, "Soak"):
- chaos: pods through crihook on a real containerd (started by the soak, removed at the end)
  while containerd, an out-of-process plugin and crihook are killed at random (seeded);
- load: a kubelet-restart storm (UpdateContainerResources for every container, then PLEG
  relists) at full speed on the memory runtime, latency percentiles;
- endurance: many calls on one crihook, RSS and fds before and after;
- wire: malformed gRPC payloads and truncated HTTP/2 on crihook's socket and a plugin's.

Unix sockets only; everything started is stopped, everything made is removed. The exit code is
1 when an invariant did not hold, 0 otherwise. Progress goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.lab.crihook_proc import DATA_PATH_ENV, DATA_PATHS, default_data_path

__all__ = ["main"]

PARTS = ("chaos", "load", "endurance", "wire")


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def _chaos(args: argparse.Namespace) -> tuple[str, bool]:
    from bench.soak_chaos import run_chaos
    from tests.lab import peers
    from tests.lab.containerd import Containerd
    from tests.lab.images import DEFAULT_CACHE_DIR, build_images

    lab = Containerd(
        _workdir("crihook-lab-"),
        build_images(DEFAULT_CACHE_DIR),
        binaries=peers.containerd_binaries(args.containerd),
    )
    workdir = _workdir("soak-")
    try:
        _progress(f"chaos: starting containerd {args.containerd}")
        lab.start()
        result = run_chaos(
            lab, workdir, args.chaos_seconds, args.seed, progress=_progress, keep=args.keep_workdir
        )
        return result.summary(), not result.problems
    finally:
        lab.cleanup()
        if args.keep_workdir:
            _progress(f"chaos: kept {workdir} (crihook's log, state and probe dumps)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _load(args: argparse.Namespace) -> tuple[str, bool]:
    from bench.soak_load import run_load

    workdir = _workdir("soak-")
    try:
        result = run_load(workdir, args.containers, args.relists, progress=_progress)
        return result.summary(), not result.problems
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _endurance(args: argparse.Namespace) -> tuple[str, bool]:
    from bench.soak_load import run_endurance

    workdir = _workdir("soak-")
    try:
        result = run_endurance(workdir, args.calls, progress=_progress)
        return result.summary(), not result.problems
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wire(args: argparse.Namespace) -> tuple[str, bool]:
    from bench.soak_wire import run_wire

    workdir = _workdir("soak-")
    try:
        result = run_wire(workdir, args.wire_rounds, args.seed, progress=_progress)
        return result.summary(), not result.problems
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help="comma-separated, of: " + ", ".join(PARTS)
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed (default: a new one, printed)"
    )
    parser.add_argument(
        "--chaos-seconds", type=float, default=120, help="chaos: seconds of faults (120)"
    )
    parser.add_argument(
        "--containerd", choices=("1.6", "2"), default="1.6", help="chaos: containerd version"
    )
    parser.add_argument(
        "--containers", type=int, default=1000, help="load: containers in the storm (1000)"
    )
    parser.add_argument(
        "--relists", type=int, default=20, help="load: PLEG relists during the storm (20)"
    )
    parser.add_argument("--calls", type=int, default=100_000, help="endurance: calls (100000)")
    parser.add_argument(
        "--wire-rounds", type=int, default=200, help="wire: malformed inputs per target (200)"
    )
    parser.add_argument("--keep-workdir", action="store_true", help="chaos: keep crihook's dir")
    parser.add_argument(
        "--data-path",
        choices=DATA_PATHS,
        default=None,
        help="crihook's data path in every part (default: crihook's own default)",
    )
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {PARTS}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    if args.data_path is not None:  # every crihook the parts start reads it (tests/lab)
        os.environ[DATA_PATH_ENV] = args.data_path
    print(f"soak: seed {args.seed} (replay with --seed {args.seed})", flush=True)
    print(f"soak: data path {default_data_path()}", flush=True)
    runners = {"chaos": _chaos, "load": _load, "endurance": _endurance, "wire": _wire}
    ok = True
    for part in parts:
        start = time.monotonic()
        summary, held = runners[part](args)
        ok &= held
        print(f"{summary}\n  ({time.monotonic() - start:.0f} s)\n", flush=True)
    print("soak: " + ("every invariant held" if ok else "INVARIANTS VIOLATED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
