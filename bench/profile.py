"""Profile crihook under load with py-spy: where does its CPU go?

    python -m bench.profile [--method ListContainers] [--concurrency 1] [--duration 10]
                            [--backend fake|containerd] [--scenario hooks-none] [--native]
                            [--kubelet-requests] [--out DIR]

Starts the fake runtime (or a real containerd from tests.lab) and one crihook (a scenario
from bench.run.SCENARIOS), drives it with the load generator and records it with
``py-spy record`` (raw collapsed stacks in ``--out``). Prints crihook's CPU per call by
thread (from /proc), then the top frames by self time, by file and by inclusive time, summed
over all threads. Needs py-spy (``pip install py-spy``) and ptrace rights (root).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import loadgen
from bench.procfs import CLK_TCK
from bench.run import (
    METHODS,
    REPO_ROOT,
    SCENARIOS,
    TOOLS_GRPC_EXPERIMENTS,
    Backend,
    ContainerdBackend,
    Crihook,
    FakeBackend,
    default_crihook_cmd,
    write_payloads,
)


def py_spy() -> str:
    local = Path(sys.executable).parent / "py-spy"
    found = str(local) if local.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


# Frames that mean "blocked waiting" (py-spy's --native mode samples idle threads too): a
# sample whose leaf, or any frame, is one of these is counted as idle, not as CPU.
_IDLE_LEAVES = ("epoll_wait", "epoll_pwait", "poll ", "ppoll", "select", "pselect", "nanosleep")
_IDLE_FRAMES = ("PyThread_acquire_lock_timed", "pthread_cond_wait", "pthread_cond_timedwait")


def _where(frame: str) -> str:
    """'func (path/file.py:12)' -> 'path/file.py'; '0x7f.. (lib.so)' -> 'lib.so'."""
    inside = frame.rpartition(" (")[2].rstrip(")")
    return inside.rpartition(":")[0] if inside.rpartition(":")[2].isdigit() else inside


def top_frames(collapsed: Path, limit: int) -> str:
    """Self and inclusive sample shares per frame (and self share per file) from py-spy's
    raw (collapsed) output, over all threads, leaving out samples blocked in epoll/poll."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    file_counts: Counter[str] = Counter()
    total = idle = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        # Leading elements name the process/thread ("process 123:...", "thread (0x..)").
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if frames[-1].startswith(_IDLE_LEAVES) or any(f.startswith(_IDLE_FRAMES) for f in frames):
            idle += count
            continue
        total += count
        self_counts[frames[-1]] += count
        file_counts[_where(frames[-1])] += count
        for frame in set(frames):
            incl_counts[frame] += count
    if not total:
        return "no busy samples"
    out = [
        f"{total} busy samples ({idle} more idle ones, blocked in epoll/poll/locks, left out)\n",
        "self time:",
    ]
    out += [f"  {n / total:6.1%}  {f}" for f, n in self_counts.most_common(limit)]
    out.append("self time by file/library:")
    out += [f"  {n / total:6.1%}  {f}" for f, n in file_counts.most_common(limit)]
    out.append("inclusive time:")
    out += [f"  {n / total:6.1%}  {f}" for f, n in incl_counts.most_common(limit)]
    return "\n".join(out)


def thread_ticks(pid: int) -> dict[tuple[int, str], int]:
    """(tid, thread name) -> utime+stime ticks, for every live thread of ``pid``."""
    ticks: dict[tuple[int, str], int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            if int(task.name) == pid:
                name = f"{name} (main thread: the event loop)"
            ticks[(int(task.name), name)] = cpu_ticks_of_task(task)
        except OSError:
            continue  # the thread ended meanwhile
    return ticks


def cpu_ticks_of_task(task: Path) -> int:
    raw = (task / "stat").read_bytes()
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def thread_report(before: dict[tuple[int, str], int], after: dict[tuple[int, str], int],
                  calls: int) -> str:  # fmt: skip
    """CPU per call of each thread (by name; same-named threads summed) over the recording."""
    per_name: Counter[str] = Counter()
    for key, end in after.items():
        per_name[key[1]] += end - before.get(key, 0)
    total = sum(per_name.values())
    lines = [f"crihook CPU by thread over the recording ({calls} calls):"]
    for name, ticks in per_name.most_common():
        if ticks:
            lines.append(
                f"  {ticks / CLK_TCK * 1e6 / max(calls, 1):7.0f} µs/call  "
                f"{ticks / max(total, 1):6.1%}  {name}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--method", default="ListContainers", choices=[m.name for m in METHODS])
    p.add_argument("--concurrency", "-c", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0, help="recorded seconds")
    p.add_argument(
        "--backend", default="fake", choices=["fake", "containerd"],
        help="the runtime behind crihook: the fake one, or a real containerd from tests.lab",
    )  # fmt: skip
    p.add_argument("--scenario", default="hooks-none", choices=[s.name for s in SCENARIOS])
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--native", action="store_true", help="include C/C++ frames (grpc core)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=Path("/tmp/crihook-profile"))
    p.add_argument("--crihook-cmd", help="command that runs crihook (default: venv's crihook)")
    p.add_argument(
        "--kubelet-requests", action="store_true",
        help="fake runtime only: send kubelet's captured CreateContainer (as bench.run does)",
    )  # fmt: skip
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    method = next(m for m in METHODS if m.name == args.method)
    scenario = next(s for s in SCENARIOS if s.name == args.scenario)
    cmd = args.crihook_cmd.split() if args.crihook_cmd else default_crihook_cmd()

    with tempfile.TemporaryDirectory(prefix="crihook-profile-") as tmp:
        workdir = Path(tmp)
        tools_env = {"GRPC_EXPERIMENTS": TOOLS_GRPC_EXPERIMENTS}
        backend: Backend = (
            FakeBackend(
                workdir, tools_env, kubelet_requests=args.kubelet_requests, pods=args.concurrency
            )
            if args.backend == "fake"
            else ContainerdBackend(workdir, pods=args.concurrency)
        )
        crihook = None
        try:
            crihook = Crihook(scenario, backend, workdir, cmd)
            payload = backend.payload(method)
            # CreateContainer: a pod per worker, as bench.run sends it
            files = write_payloads(payload.per_worker(args.concurrency), workdir / "payload")
            warmup = 2.0
            loadgen_argv = loadgen.command(
                crihook.endpoint,
                method.path,
                [str(path) for path in files],
                args.concurrency,
                warmup,
                args.duration + 1.0,
                marker=payload.marker,
            )
            loadgen_argv += ["--watch", f"crihook={crihook.pid}"]
            load = subprocess.Popen(
                loadgen_argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                env={**os.environ, **tools_env},
            )  # fmt: skip
            time.sleep(warmup + 0.5)
            stem = args.out / f"{scenario.name}-{method.name}-c{args.concurrency}"
            common = ["--pid", str(crihook.pid), "--duration", str(int(args.duration)),
                      "--rate", str(args.rate)]  # fmt: skip
            # --native must pause the process to unwind C stacks; otherwise don't stop it.
            common.append("--native" if args.native else "--nonblocking")
            threads_before = thread_ticks(crihook.pid)
            started = time.monotonic()
            subprocess.run(
                [py_spy(), "record", *common, "--format", "raw", "-o", f"{stem}.txt"],
                check=False, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            threads_after = thread_ticks(crihook.pid)
            recorded_s = time.monotonic() - started
            stdout, _ = load.communicate(timeout=120)
            result = json.loads(stdout)
            print(
                f"load: {result['rps']:,.0f} req/s, p50 {result['latency_us']['p50']:,.0f} µs "
                f"while recorded (py-spy slows the process; --native pauses it per sample)"
            )
            calls = int(result["rps"] * recorded_s)
            print(thread_report(threads_before, threads_after, calls) + "\n")
            print(f"raw stacks: {stem}.txt (open in speedscope.app or feed to flamegraph.pl)\n")
            print(top_frames(Path(f"{stem}.txt"), args.top))
        finally:
            if crihook is not None:
                with contextlib.suppress(Exception):  # remove what the load created
                    backend.after_cell(crihook.endpoint, method)
                crihook.close()
            backend.close()


if __name__ == "__main__":
    main()
