"""The seam through which hooks write a pod's own cgroup: the limits of the cgroup kubelet
made for the pod (the sandbox's ``cgroup_parent``). crihook hands hooks a
:class:`LinuxPodCgroups` (``SyncContext.cgroups``); tests hand them a fake cgroup tree, and
a replay records the writes without making them.

Where the pod's cgroup is (kubelet's pod cgroup manager):

- cgroupfs driver: the parent is a path such as ``/kubepods/besteffort/pod<uid>``, the same
  relative path in every cgroup v1 hierarchy and in the cgroup v2 tree;
- systemd driver: the parent is a slice name such as ``kubepods-besteffort-pod<uid>.slice``,
  which lives at ``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice``.

What is written, by cgroup version:

- cpu shares: v2 ``cpu.weight`` (kubelet's conversion), v1 ``cpu/cpu.shares``;
- CFS quota: v2 ``cpu.max`` (``<quota|max> <period>``), v1 ``cpu/cpu.cfs_period_us`` then
  ``cpu/cpu.cfs_quota_us`` (-1: unlimited);
- memory limit: v2 ``memory.max`` (bytes, ``max``), v1 ``memory/memory.limit_in_bytes`` (-1).

Files are opened for writing, never created: a pod cgroup that does not exist (yet, or any
more) is not made; a controller file missing in a pod cgroup that exists is an error.

One write goes a level up, to a QoS cgroup kubelet made (``write_qos_cpus``, cgroup v2
only): the cpuset hook's shared pool held in ``cpuset.cpus`` of ``kubepods/burstable`` and
``kubepods/besteffort`` (``crihook.hooks.node.qos``), which their pods' containers inherit;
``read_qos_cpus`` reads it back, so the hook sees when someone else reset it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from crihook.hooks.node.host import pod_cgroup_path

__all__ = ["LinuxPodCgroups", "PodCgroups", "PodLimits", "shares_to_weight"]

UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class PodLimits:
    """What to write; None: leave as it is."""

    cpu_shares: int | None = None
    cpu_quota_us: int | None = None
    """-1: unlimited."""
    cpu_period_us: int = 100_000
    """Written with the quota (kubelet's and the kernel's default period)."""
    memory_limit_bytes: int | None = None
    """-1: unlimited."""

    def to_dict(self) -> dict[str, Any]:
        """The set values (recordings note writes as JSON)."""
        names = ("cpu_shares", "cpu_quota_us", "memory_limit_bytes")
        doc = {n: getattr(self, n) for n in names if getattr(self, n) is not None}
        if self.cpu_quota_us is not None:
            doc["cpu_period_us"] = self.cpu_period_us
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PodLimits:
        return cls(**{k: int(v) for k, v in doc.items()})


class PodCgroups(Protocol):
    def write_limits(self, cgroup_parent: str, limits: PodLimits) -> list[str]:
        """Write `limits` into the pod's cgroup. Returns the files written, ``[]`` when the
        pod's cgroup does not exist. OSError naming the file when a write fails (the files
        before it are written). ValueError for a parent that is no pod cgroup. Blocking:
        call it from a thread."""
        ...

    def write_qos_cpus(self, qos_path: str, cpus: str) -> bool:
        """Write `cpus` (a non-empty cpulist) to the QoS cgroup's ``cpuset.cpus``
        (`qos_path` relative to the cgroup root, ``crihook.hooks.node.qos``). False when the
        cgroup does not exist (kubelet makes it, not crihook). OSError naming the file when
        the write fails; ValueError for an empty cpulist or a path that climbs out.
        Blocking: call it from a thread."""
        ...

    def read_qos_cpus(self, qos_path: str) -> str | None:
        """What the QoS cgroup's ``cpuset.cpus`` holds (a cpulist, stripped; empty: every
        CPU of its parent), or None when the cgroup does not exist. OSError naming the file
        when the read fails; ValueError for a path that climbs out. Blocking: call it from
        a thread."""
        ...


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu shares (2..262144) as a v2 cpu.weight (1..10000), as kubelet and runc
    convert them."""
    shares = min(max(shares, 2), 262144)
    return 1 + ((shares - 2) * 9999) // 262142


class LinuxPodCgroups:
    """The real host's cgroupfs under `cgroup_root`."""

    def __init__(self, cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
        self.cgroup_root = cgroup_root
        self._v2: bool | None = None

    def write_limits(self, cgroup_parent: str, limits: PodLimits) -> list[str]:
        relative = pod_cgroup_path(cgroup_parent)
        if self._v2 is None:  # the host's cgroup mode does not change while crihook runs
            self._v2 = (self.cgroup_root / "cgroup.controllers").is_file()
        plan = _v2_files(limits) if self._v2 else _v1_files(limits)
        written: list[str] = []
        for directory, name, value in plan:
            if directory is None:
                cgroup = self.cgroup_root / relative
            else:
                cgroup = _v1_hierarchy(self.cgroup_root, directory) / relative
            if not cgroup.is_dir():
                continue  # no pod cgroup in this hierarchy (yet, or any more)
            path = cgroup / name
            _write(path, value)
            written.append(str(path))
        return written

    def write_qos_cpus(self, qos_path: str, cpus: str) -> bool:
        # An empty cpuset.cpus on cgroup v2 means "inherit every CPU": never written.
        if not cpus.strip():
            raise ValueError(f"an empty cpuset for {qos_path!r} would hand it every CPU")
        cgroup = self._qos_cgroup(qos_path)
        if not cgroup.is_dir():
            return False
        _write(cgroup / "cpuset.cpus", cpus)
        return True

    def read_qos_cpus(self, qos_path: str) -> str | None:
        cgroup = self._qos_cgroup(qos_path)
        if not cgroup.is_dir():
            return None
        path = cgroup / "cpuset.cpus"
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot read {path}: {exc.strerror or exc}") from None

    def _qos_cgroup(self, qos_path: str) -> Path:
        parts = qos_path.strip("/").split("/")
        if not all(parts) or ".." in parts:
            raise ValueError(f"not a QoS cgroup path: {qos_path!r}")
        return self.cgroup_root.joinpath(*parts)


_Plan = list[tuple[str | None, str, str]]
"""(v1 hierarchy or None for v2's tree, file, value)."""


def _v2_files(limits: PodLimits) -> _Plan:
    plan: _Plan = []
    if limits.cpu_shares is not None:
        plan.append((None, "cpu.weight", str(shares_to_weight(limits.cpu_shares))))
    if limits.cpu_quota_us is not None:
        quota = "max" if limits.cpu_quota_us < 0 else str(limits.cpu_quota_us)
        plan.append((None, "cpu.max", f"{quota} {limits.cpu_period_us}"))
    if limits.memory_limit_bytes is not None:
        memory = limits.memory_limit_bytes
        plan.append((None, "memory.max", "max" if memory < 0 else str(memory)))
    return plan


def _v1_files(limits: PodLimits) -> _Plan:
    plan: _Plan = []
    if limits.cpu_shares is not None:
        plan.append(("cpu", "cpu.shares", str(limits.cpu_shares)))
    if limits.cpu_quota_us is not None:
        # The period first: the kernel checks the quota against the period it is for.
        plan.append(("cpu", "cpu.cfs_period_us", str(limits.cpu_period_us)))
        plan.append(("cpu", "cpu.cfs_quota_us", str(max(limits.cpu_quota_us, UNLIMITED))))
    if limits.memory_limit_bytes is not None:
        memory = max(limits.memory_limit_bytes, UNLIMITED)
        plan.append(("memory", "memory.limit_in_bytes", str(memory)))
    return plan


def _v1_hierarchy(root: Path, controller: str) -> Path:
    """The v1 hierarchy holding `controller` (`cpu` is often co-mounted as `cpu,cpuacct`)."""
    if controller == "cpu" and not (root / "cpu").is_dir():
        return root / "cpu,cpuacct"
    return root / controller


def _write(path: Path, value: str) -> None:
    try:
        # Never create: cgroupfs files exist or not. O_TRUNC: a no-op there, exact on fakes.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {value!r} to {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
