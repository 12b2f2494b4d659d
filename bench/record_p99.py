"""Where recording's tail latency comes from: the renderer's CPU, or any idle-priority CPU.

    python -m bench.record_p99 [--reps 3] [--duration 4]

CreateContainer at c=1 on the fake runtime, through the `hooks-4-record` scenario (4
in-process hooks, `--record`) and through `hooks-4` (the same chain, not recording). Each rep
measures, one after the other, in one crihook per scenario:

- ``recording``: hooks-4-record as it runs;
- ``renderer stopped``: hooks-4-record with its renderer process stopped (SIGSTOP) for the
  cell: the loop still cuts, pickles and sends every call, the lines pile up in the bounded
  backlog and are dropped past it;
- ``not recording``: hooks-4;
- ``not recording + idle burner``: hooks-4 while a process at SCHED_IDLE spins 3 ms of
  every 10 ms (about what the renderer uses at this rate), touching nothing crihook uses.

If the burner raises hooks-4's tail as recording raises hooks-4-record's, and stopping the
renderer takes recording's away, the tail is the machine's scheduler letting a woken task
wait behind an idle-priority one, not anything recording does on crihook's loop. Prints
p50/p90/p99 per row (medians over reps). Timing lives here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import loadgen
from bench.procfs import descendants
from bench.run import (
    METHODS,
    REPO_ROOT,
    SCENARIOS,
    TOOLS_GRPC_EXPERIMENTS,
    Crihook,
    FakeBackend,
    default_crihook_cmd,
)

_BURNER = """
import os, time
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while True:
    started = time.perf_counter()
    while time.perf_counter() - started < 0.003:
        pass
    time.sleep(0.007)
"""


@contextmanager
def _stopped(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@contextmanager
def _idle_burner() -> Iterator[None]:
    burner = subprocess.Popen([sys.executable, "-c", _BURNER])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def _load(
    crihook: Crihook, payload_file: Path, marker: str | None, seconds: float, start: int
) -> dict:
    method = next(m for m in METHODS if m.name == "CreateContainer").path
    # With a marker: new container names in every row, as bench.run gives each cell.
    argv = loadgen.command(
        crihook.endpoint, method, [str(payload_file)], 1, 0.5, seconds, marker=marker, start=start
    )
    env = {**os.environ, "GRPC_EXPERIMENTS": TOOLS_GRPC_EXPERIMENTS}
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, env=env, check=True)
    result: dict = json.loads(done.stdout)["latency_us"]
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.record_p99", description=__doc__.split("\n")[0]
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per row")
    args = p.parse_args(argv)
    method = next(m for m in METHODS if m.name == "CreateContainer")
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="crihook-record-p99-") as tmp:
        workdir = Path(tmp)
        backend = FakeBackend(workdir, {"GRPC_EXPERIMENTS": TOOLS_GRPC_EXPERIMENTS})
        crihooks: list[Crihook] = []
        try:
            for name in ("hooks-4-record", "hooks-4"):
                scenario = next(s for s in SCENARIOS if s.name == name)
                crihooks.append(Crihook(scenario, backend, workdir, default_crihook_cmd()))
            recording, plain = crihooks
            payload = backend.payload(method)
            payload_file = workdir / "payload.bin"
            payload_file.write_bytes(payload.data)
            renderer = descendants(recording.pid)

            def measure(row: str, crihook: Crihook) -> None:
                start = 1_000_000 * sum(len(r) for r in rows.values())
                rows.setdefault(row, []).append(
                    _load(crihook, payload_file, payload.marker, args.duration, start)
                )

            for rep in range(args.reps):
                print(f"[record_p99] rep {rep + 1}/{args.reps}", file=sys.stderr)
                measure("recording", recording)
                with _stopped(renderer):
                    measure("renderer stopped", recording)
                measure("not recording", plain)
                with _idle_burner():
                    measure("not recording + idle burner", plain)
        finally:
            for crihook in crihooks:
                backend.after_cell(crihook.endpoint, method)
                crihook.close()
            backend.close()
    print(f"CreateContainer, c=1, fake runtime, 4 hooks; medians of {args.reps} reps (µs):\n")
    print("| row | p50 | p90 | p99 |\n| --- | ---: | ---: | ---: |")
    for row, results in rows.items():
        cells = [statistics.median(r[q] for r in results) for q in ("p50", "p90", "p99")]
        print(f"| {row} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
