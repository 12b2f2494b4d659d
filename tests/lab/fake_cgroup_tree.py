"""A fake cgroup v2 tree shaped as kubelet leaves /sys/fs/cgroup: `kubepods` with its QoS
cgroups, for crihook's `--cgroup-root` in tests and benchmarks (the memory runtime makes no
cgroups). Only the files crihook writes are there."""

from __future__ import annotations

from pathlib import Path

from crihook.hooks.node import parse_cpu_list

__all__ = ["QOS_PATHS", "qos_cpus", "write_qos_tree", "write_v1_tree"]

QOS_PATHS = {
    "cgroupfs": ("kubepods/burstable", "kubepods/besteffort"),
    "systemd": (
        "kubepods.slice/kubepods-burstable.slice",
        "kubepods.slice/kubepods-besteffort.slice",
    ),
}
"""Burstable's, then BestEffort's, per cgroup driver (kubelet's default cgroup root)."""


def write_qos_tree(root: Path, driver: str = "cgroupfs") -> Path:
    """A v2 root whose QoS cgroups kubelet made (empty `cpuset.cpus`: every CPU)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for path in QOS_PATHS[driver]:
        cgroup = root / path
        cgroup.mkdir(parents=True, exist_ok=True)
        (cgroup / "cpuset.cpus").write_text("")
    return root


def write_v1_tree(root: Path) -> Path:
    """A v1 root (controllers mounted apart, no unified hierarchy)."""
    for controller in ("cpuset", "cpu,cpuacct", "memory", "pids"):
        (root / controller / "kubepods").mkdir(parents=True, exist_ok=True)
    return root


def qos_cpus(root: Path, path: str) -> frozenset[int]:
    """What a QoS cgroup's `cpuset.cpus` holds (empty: nothing written)."""
    return parse_cpu_list((root / path / "cpuset.cpus").read_text().strip())
