"""Host cgroup access for the lab: find hierarchies, read container limits, remove pod dirs.

Works on cgroup v1 (one hierarchy per controller, the hybrid layout of the lab VM) and on
cgroup v2 (one unified hierarchy). With the cgroupfs driver a CRI ``cgroup_parent`` such as
``/kubepods/burstable/pod<uid>`` is the same relative path in every hierarchy.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tests.lab.host import mountinfo

__all__ = [
    "CgroupLimits",
    "cgroup_dirs",
    "cgroup_mounts",
    "cgroup_value",
    "container_cgroup",
    "is_cgroup_v2",
    "read_limits",
    "remove_cgroup_dir",
    "remove_cgroup_tree",
    "shares_to_weight",
]

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy on the host."""
    return sorted({Path(p) for p, fstype in mountinfo() if fstype in ("cgroup", "cgroup2")})


def is_cgroup_v2() -> bool:
    """True when /sys/fs/cgroup itself is the unified hierarchy (no v1 controllers)."""
    return (_CGROUP_ROOT / "cgroup.controllers").exists()


def cgroup_dirs(path: str) -> list[Path]:
    """The existing directories for an absolute cgroup path, one per hierarchy."""
    rel = path.strip("/")
    return [m / rel for m in cgroup_mounts() if (m / rel).is_dir()]


def cgroup_value(path: str, name: str) -> str:
    """The stripped content of control file ``name`` of the cgroup at ``path``, from the
    hierarchy that has it (``cpuset.cpus``, ``cpu.cfs_quota_us``, ...)."""
    for directory in cgroup_dirs(path):
        if (directory / name).exists():
            return (directory / name).read_text().strip()
    raise FileNotFoundError(f"no cgroup {path} with {name} in any hierarchy")


def container_cgroup(cgroup_parent: str, container_id: str) -> str:
    """The absolute cgroupfs path of a container under its pod's parent, whichever runtime
    made it: containerd names it ``<parent>/<id>``, CRI-O ``<parent>/crio-<id>``. The one
    that exists (containerd's name when neither does)."""
    parent = "/" + cgroup_parent.strip("/")
    for name in (container_id, f"crio-{container_id}"):
        if cgroup_dirs(f"{parent}/{name}"):
            return f"{parent}/{name}"
    return f"{parent}/{container_id}"


def remove_cgroup_tree(path: str) -> list[str]:
    """rmdir ``path`` and everything below it in every hierarchy, deepest first.

    Returns the problems (paths that could not be removed, with the reason); an empty list
    means nothing is left. Only directories are removed: a busy cgroup (with processes)
    fails with EBUSY and is reported rather than forced.
    """
    if not path.strip("/"):
        raise ValueError("refusing to remove the cgroup root")
    problems: list[str] = []
    deadline = time.monotonic() + RELEASE_SECONDS
    for top in cgroup_dirs(path):
        subdirs = [Path(d) for d, _, _ in os.walk(top)]
        for d in sorted(subdirs, key=lambda p: len(p.parts), reverse=True):
            _rmdir(d, problems, deadline)
    return problems


def remove_cgroup_dir(path: str) -> list[str]:
    """rmdir one cgroup (not its children) in every hierarchy; returns the problems."""
    if not path.strip("/"):
        raise ValueError("refusing to remove the cgroup root")
    problems: list[str] = []
    deadline = time.monotonic() + RELEASE_SECONDS
    for d in cgroup_dirs(path):
        _rmdir(d, problems, deadline)
    return problems


RELEASE_SECONDS = 2.0
"""How long a removal waits for a cgroup to stop being busy. A lab clean-up once saw EBUSY
on a container's cgroups after every process it knew of had died, and a later clean-up found
them empty. The cause was not found (a zombie does not hold a v1 cgroup here): waiting a
little is the cheap hedge, and a cgroup that stays busy is still reported."""


def _rmdir(d: Path, problems: list[str], deadline: float) -> None:
    """rmdir one cgroup directory, again on EBUSY until `deadline`; a failure other than
    "already gone" goes to `problems`."""
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            problem = f"{d}: {errno.errorcode.get(exc.errno or 0, exc)}"
            if exc.errno == errno.EBUSY:
                problem += f" ({_holders(d)})"
            problems.append(problem)
            return


def _holders(d: Path) -> str:
    """What keeps a busy cgroup, for the report: its processes, or cgroups below it."""
    try:
        pids = (d / "cgroup.procs").read_text().split()
        children = sorted(c.name for c in d.iterdir() if c.is_dir())
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if pids:
        return f"processes {', '.join(pids)}"
    if children:
        return f"{len(children)} cgroup(s) below it: {', '.join(c[:12] for c in children)}"
    return "no process or cgroup listed"


@dataclass(frozen=True)
class CgroupLimits:
    """cpu/memory limits as the kernel holds them.

    v1 has ``cpu_shares``; v2 has ``cpu_weight`` instead (runc converts, lossy), so compare
    a CRI ``cpu_shares`` with :meth:`has_shares`.
    """

    cpu_shares: int | None  # v1 only
    cpu_weight: int | None  # v2 only
    cpu_quota: int  # -1 when unlimited
    cpu_period: int
    memory_limit: int | None  # None when unlimited

    def has_shares(self, shares: int) -> bool:
        if self.cpu_shares is not None:
            return self.cpu_shares == shares
        return self.cpu_weight == shares_to_weight(shares)


def shares_to_weight(shares: int) -> int:
    """runc's cgroup v2 mapping of CRI cpu_shares [2, 262144] to cpu.weight [1, 10000]."""
    return 1 + ((shares - 2) * 9999) // 262142


def read_limits(path: str) -> CgroupLimits:
    """Read the cpu/memory limits of the cgroup at absolute path ``path`` (parent/id)."""
    rel = path.strip("/")
    if is_cgroup_v2():
        base = _CGROUP_ROOT / rel
        quota_s, period_s = _read(base / "cpu.max").split()
        mem = _read(base / "memory.max")
        return CgroupLimits(
            cpu_shares=None,
            cpu_weight=int(_read(base / "cpu.weight")),
            cpu_quota=-1 if quota_s == "max" else int(quota_s),
            cpu_period=int(period_s),
            memory_limit=None if mem == "max" else int(mem),
        )
    cpu = _CGROUP_ROOT / "cpu" / rel
    mem_v1 = int(_read(_CGROUP_ROOT / "memory" / rel / "memory.limit_in_bytes"))
    return CgroupLimits(
        cpu_shares=int(_read(cpu / "cpu.shares")),
        cpu_weight=None,
        cpu_quota=int(_read(cpu / "cpu.cfs_quota_us")),
        cpu_period=int(_read(cpu / "cpu.cfs_period_us")),
        # v1 reports "unlimited" as a huge page-aligned number.
        memory_limit=None if mem_v1 >= 1 << 62 else mem_v1,
    )


def _read(path: Path) -> str:
    return path.read_text().strip()
