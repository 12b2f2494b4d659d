"""What pinning a checked host path costs (issue 28): `LinuxStaging.pin_mount` (open without
following symlinks, bind, read-only remount), `pin_device` (open, mknod) and `release`
(unmount, remove), each in µs of wall time per call, on this host's kernel, in a temp dir.
The devices hook makes these calls in a worker thread, once per mount or device a
CreateContainer asks for by path, and releases them at RemoveContainer.

    sudo .venv/bin/python -m bench.staging_cost [--calls 500] [--depth 6]

`--depth`: components of the pinned path (each one an openat). Needs root (mount, mknod).
"""

from __future__ import annotations

import argparse
import os
import stat
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from crihook.hooks.node import DeviceNode
from crihook.hooks.node.staging import LinuxStaging

__all__ = ["main", "measure"]


def measure(calls: int, depth: int, root: Path) -> dict[str, list[float]]:
    """µs per call of each operation, `calls` times."""
    source = root / "src" / "/".join(f"d{i}" for i in range(depth - 2))
    source.mkdir(parents=True)
    (source / "f").write_text("x")
    os.mknod(root / "src" / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    staging = LinuxStaging(str(root / "staging"))
    null = DeviceNode("c", 1, 3)
    times: dict[str, list[float]] = {"pin_mount ro": [], "pin_device": [], "release": []}

    def timed(what: str, call: Callable[[], object]) -> None:
        started = time.perf_counter()
        call()
        times[what].append((time.perf_counter() - started) * 1e6)

    try:
        for i in range(calls):
            pod, key = f"pod{i}", f"pod{i}/app.0"
            timed("pin_mount ro", lambda k=key: staging.pin_mount(k, "m0", str(source), True))
            timed("pin_device", lambda k=key: staging.pin_device(k, "d0", f"{root}/src/null", null))
            timed("release", lambda p=pod: staging.release(p))
    finally:
        for left in staging.keys():  # noqa: SIM118 - a method, not a dict
            staging.release(left.split("/")[0])
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.staging_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.staging_cost: needs root (mount, mknod)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="crihook-staging-bench-") as tmp:
        times = measure(args.calls, args.depth, Path(tmp))
    print(f"{'operation':<14} {'p50 µs':>8} {'p90 µs':>8} {'mean µs':>8}  ({args.calls} calls)")
    for what, values in times.items():
        deciles = statistics.quantiles(values, n=10)
        print(f"{what:<14} {deciles[4]:>8.1f} {deciles[8]:>8.1f} {statistics.fmean(values):>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
