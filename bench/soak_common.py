"""What the soak's parts share: a crihook started under the probe, a record of every CRI call's
outcome, and the comparison of two probe dumps (fds, tasks, threads)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from crihook.proxy.ops.state_cli import load_state
from crihook.proxy.state.directory import LOCK_FILE
from tests.lab.crihook_proc import CrihookProcess, wait_for

__all__ = [
    "Calls",
    "ProbedCrihook",
    "fd_kinds",
    "leaks_between",
    "percentiles",
    "tracebacks",
    "unclear_status",
]

T = TypeVar("T")

_PROBE = Path(__file__).with_name("probe.py")
# The default executor's worker threads (uvloop's and asyncio's names), and their bound.
_EXECUTOR_PREFIXES = ("uvloop_", "ThreadPoolExecutor-", "asyncio_")
_EXECUTOR_MAX = min(32, (os.cpu_count() or 1) + 4)

# A status a node operator cannot act on: a message that is a Python exception's text (a
# handler that crashed) rather than crihook's own words, or UNKNOWN saying nothing. UNKNOWN
# with words is let through: containerd answers it ("server is not initialized yet" while its
# CRI plugin starts), and crihook passes the runtime's status on unchanged.
_PYTHON_TEXT = re.compile(r"Traceback|Exception calling application|<class '|\w+Error\(|\w+Error: ")


def unclear_status(code: grpc.StatusCode, details: str) -> bool:
    if _PYTHON_TEXT.search(details or ""):
        return True
    return code == grpc.StatusCode.UNKNOWN and not (details or "").strip()


@dataclass
class Calls:
    """Every CRI call a client made and how it ended (thread-safe)."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    unclear: list[tuple[str, str, str]] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, method: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """fn(*args, **kw), recorded under `method`; an RpcError is recorded and raised."""
        start = time.perf_counter()
        try:
            result = fn(*args, **kw)
        except grpc.RpcError as exc:
            self.record(method, exc.code(), exc.details() or "", time.perf_counter() - start)
            raise
        self.record(method, grpc.StatusCode.OK, "", time.perf_counter() - start)
        return result

    def record(self, method: str, code: grpc.StatusCode, details: str, seconds: float) -> None:
        with self._lock:
            self.outcomes[(method, code.name)] += 1
            self.latencies.setdefault(method, []).append(seconds)
            if unclear_status(code, details):
                self.unclear.append((method, code.name, details[:300]))

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    def table(self) -> str:
        rows = [f"    {m:<26} {c:<20} {n}" for (m, c), n in sorted(self.outcomes.items())]
        return "\n".join(rows)


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 90, 99)) -> dict[int, float]:
    """Nearest-rank percentiles, in the values' unit."""
    ordered = sorted(values)
    if not ordered:
        return {p: float("nan") for p in points}
    return {p: ordered[max(0, -(-p * len(ordered) // 100) - 1)] for p in points}


class ProbedCrihook(CrihookProcess):
    """A CrihookProcess run under bench/probe.py: `dump()` returns its tasks, fds, threads
    and RSS, read from the live process."""

    @property
    def dump_path(self) -> Path:
        return self.workdir / "probe.json"

    def command(self) -> list[str]:
        cmd = super().command()
        assert cmd[1:4] == ["-m", "crihook", "serve"], cmd
        return [cmd[0], str(_PROBE), str(self.dump_path), "serve", *cmd[4:]]

    def dump(self, timeout: float = 10) -> dict[str, Any]:
        assert self.proc is not None and self.proc.poll() is None, "crihook is not running"
        self.dump_path.unlink(missing_ok=True)
        os.kill(self.proc.pid, signal.SIGUSR2)
        wait_for(self.dump_path.exists, timeout, "the probe's dump")
        doc: dict[str, Any] = json.loads(self.dump_path.read_text())
        return doc

    def settled_dump(self, seconds: float = 120) -> dict[str, Any]:
        """`dump()` once crihook is idle: no store write on its way and no state file open
        but its lock (a journal is closed once compacted, 2 s after its last line). A dump
        taken in the middle of a write would show the write as a leak; on a loaded machine
        the write takes longer, not forever."""
        state_dir = str(self.state_dir) + "/"
        lock = state_dir + LOCK_FILE
        dumps: list[dict[str, Any]] = []

        def idle() -> bool:
            doc = self.dump()
            dumps.append(doc)
            writing = any(t["coro"].startswith("Store.") for t in doc["tasks"])
            files = [f for f in doc["fds"].values() if f.startswith(state_dir) and f != lock]
            return not (writing or files)

        wait_for(idle, seconds, "crihook idle: no store write on its way, no state file open")
        return dumps[-1]

    def state(self) -> dict[str, Any]:
        """`crihook state --json`, as an operator runs it."""
        import subprocess

        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "crihook",
                "state",
                "--state-dir",
                str(self.state_dir),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        doc: dict[str, Any] = json.loads(out)
        return doc

    def hook_state(self, name: str) -> dict[str, Any]:
        """A hook's state as `crihook state` reads it: its file with the journal's newer
        lines applied (the file alone lags until the next compaction)."""
        doc: dict[str, Any] = load_state(self.state_dir)["hook_states"].get(name) or {}
        return doc


def tracebacks(name: str, log: str) -> list[str]:
    """A traceback in a log is a bug that was caught somewhere (crihook logs expected
    failures in words): each one, as a problem, with the lines that say what it was."""
    lines = log.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith(" ")), i)
            found.append(f"{name} logged a traceback: {lines[i - 1][:200]} ... {lines[end][:200]}")
    return found


def fd_kinds(fds: dict[str, str]) -> Counter[str]:
    """fd targets by kind: `socket`, `pipe`, `anon_inode:[eventpoll]`, or the file's path."""
    kinds: Counter[str] = Counter()
    for target in fds.values():
        kinds[target.split(":[", 1)[0] if target.startswith(("socket:", "pipe:")) else target] += 1
    return kinds


def leaks_between(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What `after` holds that `before` did not: fds by kind, tasks by coroutine, threads."""
    problems = []
    grown = fd_kinds(after["fds"]) - fd_kinds(before["fds"])
    if grown:
        problems.append(f"fds grew: {dict(grown)}")
    tasks_before = Counter(t["coro"] for t in before["tasks"])
    tasks_after = Counter(t["coro"] for t in after["tasks"])
    if tasks_after - tasks_before:
        problems.append(f"asyncio tasks grew: {dict(tasks_after - tasks_before)}")
    grew = Counter(after["threads"]) - Counter(before["threads"])
    # The event loop's default executor (store writes run there) starts its workers as they
    # are needed, up to its bound: growth within it is not a leak.
    workers = [t for t in after["threads"] if t.startswith(_EXECUTOR_PREFIXES)]
    if len(workers) <= _EXECUTOR_MAX:
        grew = Counter({t: n for t, n in grew.items() if not t.startswith(_EXECUTOR_PREFIXES)})
    if grew:
        problems.append(f"threads grew: {dict(grew)}")
    return problems
