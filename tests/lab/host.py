"""Small host primitives for the lab: /proc/self/mountinfo, mount(2)/umount2(2), /proc walks,
a free loopback port."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from pathlib import Path

__all__ = [
    "alive",
    "descendants",
    "free_port",
    "mount",
    "mountinfo",
    "mounts_under",
    "proc_table",
    "umount",
    "unmount_under",
]

MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def mountinfo() -> list[tuple[str, str]]:
    """(mount point, fstype) for every mount in our mount namespace, in mount order."""
    mounts: list[tuple[str, str]] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mounts.append((_unescape(left.split(" ")[4]), right.split(" ", 1)[0]))
    return mounts


def mounts_under(root: Path | str) -> list[str]:
    """Mount points at or below ``root``."""
    top = str(root).rstrip("/")
    return [p for p, _ in mountinfo() if p == top or p.startswith(top + "/")]


def unmount_under(root: Path | str) -> list[str]:
    """Unmount everything at or below root, deepest first; returns what is still mounted.

    Repeats because mounts can be stacked on one point; falls back to a lazy (detached)
    unmount for a busy one, which is fine for teardown.
    """
    for _ in range(10):
        points = mounts_under(root)
        if not points:
            return []
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            try:
                umount(point)
            except OSError:
                with contextlib.suppress(OSError):
                    umount(point, MNT_DETACH)
    return mounts_under(root)


def mount(source: str, target: str, fstype: str, options: str = "") -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), 0, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def umount(target: str, flags: int = 0) -> None:
    if _libc.umount2(target.encode(), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def proc_table() -> dict[int, tuple[int, list[str]]]:
    """pid -> (ppid, argv) for every process we can read."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # comm may contain spaces and parentheses: the fields after the last ")" are safe.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        table[int(entry)] = (ppid, [a.decode(errors="replace") for a in argv if a])
    return table


def descendants(roots: set[int]) -> set[int]:
    """roots plus all their (transitive) children."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in proc_table().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server started next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
