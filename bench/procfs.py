"""Process accounting from /proc: CPU time (utime+stime), resident memory, children.

Linux only; every function takes a pid and reads one small file, so it is cheap enough to
call at the edges of a measured window.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CLK_TCK", "cpu_seconds", "cpu_ticks", "descendants", "rss_bytes"]

CLK_TCK: int = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime of the whole process (all threads, live and exited), in clock ticks."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    # The command name (field 2) may hold spaces or parentheses: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); utime is field 14, stime field 15.
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    return cpu_ticks(pid) / CLK_TCK


def rss_bytes(pid: int) -> int:
    """VmRSS from /proc/<pid>/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children, grandchildren, ...), from /proc/*/stat."""
    parent_of: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        parent_of[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        kids = [child for child, parent in parent_of.items() if parent == current]
        found.extend(kids)
        frontier.extend(kids)
    return sorted(found)
