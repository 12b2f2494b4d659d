"""What the kernel and runc accept in a container's resources (CRI `LinuxContainerResources`),
field by field: pure, one rule for each field, shared by crihook's door for kubelet's requests
(`proxy/core/validate.py`) and the `Adjustment` setters a hook uses.

A value outside these fails later and far from its cause (runc at StartContainer: "write
cpu.cfs_period_us: invalid argument", "can't get final child's PID from pipe: EOF"), after
the hooks have acted on it. Each rule says where it comes from:

- `cpu_period` (µs): the kernel's `min_cfs_quota_period` 1 ms to `max_cfs_quota_period` 1 s
  (`tg_set_cfs_bandwidth`, EINVAL outside). 0: unset (containerd sets no period).
- `cpu_quota` (µs): at least 1 ms (`quota < min_cfs_quota_period`: EINVAL) and at most
  `max_cfs_runtime`, 2^44 - 1 µs (`MAX_BW`); any negative value means no limit (cgroup v1:
  `tg_set_cfs_quota` takes a negative quota as RUNTIME_INF; runc writes `max` on v2). 0: unset.
- `cpu_shares`: 2 to 262144 (the kernel's MIN_SHARES and MAX_SHARES; it clamps, and runc
  reads the value back and fails "the minimum/maximum allowed cpu-shares is ..."; on v2 runc
  maps the same range onto cpu.weight 1..10000). 0: unset.
- `memory_limit_in_bytes`: positive, or -1 for no limit (`page_counter_memparse` takes "-1"
  and digits only; runc writes `max` on v2). 0: unset.
- `memory_swap_limit_in_bytes`: -1 (no limit) or, with a memory limit, at least that limit
  (runc: "memory+swap limit should be >= memory limit", and "unable to set swap limit
  without memory limit"; the kernel refuses memsw below memory). 0: unset.
- `oom_score_adj`: -1000 to 1000 (OOM_SCORE_ADJ_MIN/MAX: runc's write to
  /proc/self/oom_score_adj fails, and the container with it).
- `cpuset_cpus`, `cpuset_mems`: a cpulist (`0-3,8`) that crihook's hooks read
  (`hooks.node.parse_cpu_list`); "" is unset.
- `hugepage_limits`: a page size as runc names the kernel's hugetlb files (`2MB`, `1GB`:
  digits and KB, MB, GB, TB or PB), one the node has when its sizes are known.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node.cpulist import parse_cpu_list
from crihook.hooks.node.topology import Topology

__all__ = [
    "CFS_PERIOD_MAX_US",
    "CFS_PERIOD_MIN_US",
    "CFS_QUOTA_MAX_US",
    "CFS_QUOTA_MIN_US",
    "CPU_SHARES_MAX",
    "CPU_SHARES_MIN",
    "OOM_SCORE_ADJ_MAX",
    "OOM_SCORE_ADJ_MIN",
    "hugepage_size_name",
    "node_hugepage_sizes",
    "resources_problem",
    "value_problem",
]

CFS_PERIOD_MIN_US = 1_000
CFS_PERIOD_MAX_US = 1_000_000
CFS_QUOTA_MIN_US = 1_000
CFS_QUOTA_MAX_US = (1 << 44) - 1
CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 1 << 18
OOM_SCORE_ADJ_MIN = -1000
OOM_SCORE_ADJ_MAX = 1000
_PAGE_SIZE = re.compile(r"[1-9][0-9]*(KB|MB|GB|TB|PB)")
_UNITS = ("KB", "MB", "GB", "TB", "PB")


def _cpu_period(value: int) -> str | None:
    if value == 0 or CFS_PERIOD_MIN_US <= value <= CFS_PERIOD_MAX_US:
        return None
    return (
        f"the kernel takes a CFS period of {CFS_PERIOD_MIN_US} to {CFS_PERIOD_MAX_US} µs "
        "(1 ms to 1 s); 0 leaves it unset"
    )


def _cpu_quota(value: int) -> str | None:
    if value <= 0 or CFS_QUOTA_MIN_US <= value <= CFS_QUOTA_MAX_US:
        return None
    return (
        f"the kernel takes a CFS quota of {CFS_QUOTA_MIN_US} to {CFS_QUOTA_MAX_US} µs, or -1 "
        "for no limit; 0 leaves it unset"
    )


def _cpu_shares(value: int) -> str | None:
    if value == 0 or CPU_SHARES_MIN <= value <= CPU_SHARES_MAX:
        return None
    return (
        f"cpu shares are {CPU_SHARES_MIN} to {CPU_SHARES_MAX} (runc refuses others); "
        "0 leaves them unset"
    )


def _memory(value: int) -> str | None:
    if value >= -1:
        return None
    return "a memory limit is a number of bytes, or -1 for no limit; 0 leaves it unset"


def _oom_score_adj(value: int) -> str | None:
    if OOM_SCORE_ADJ_MIN <= value <= OOM_SCORE_ADJ_MAX:
        return None
    return f"the kernel takes {OOM_SCORE_ADJ_MIN} to {OOM_SCORE_ADJ_MAX}"


_INT_RULES = {
    "cpu_period": _cpu_period,
    "cpu_quota": _cpu_quota,
    "cpu_shares": _cpu_shares,
    "memory_limit_in_bytes": _memory,
    "memory_swap_limit_in_bytes": _memory,
    "oom_score_adj": _oom_score_adj,
}


def value_problem(name: str, value: int) -> str | None:
    """Why `value` of the LinuxContainerResources field `name` is one the kernel or runc
    refuses; None when it is accepted (or the field has no rule here)."""
    rule = _INT_RULES.get(name)
    return None if rule is None else rule(value)


def hugepage_size_name(kib: int) -> str:
    """A page size as runc and kubelet name it: 2048 KiB → "2MB", 1048576 KiB → "1GB"."""
    size, unit = kib, 0
    while size % 1024 == 0 and unit < len(_UNITS) - 1:
        size //= 1024
        unit += 1
    return f"{size}{_UNITS[unit]}"


def resources_problem(
    resources: api_pb2.LinuxContainerResources,
    where: str,
    hugepage_sizes: Collection[str] = (),
) -> str | None:
    """The first field of `resources` (at `where` in its request, e.g.
    "config.linux.resources") with a value the kernel or runc refuses, named with its value
    and what is accepted; None when every field is fine. `hugepage_sizes`: the node's page
    sizes ("2MB", ...), when known."""
    for name, rule in _INT_RULES.items():
        value = getattr(resources, name)
        problem = rule(value)
        if problem is not None:
            return f"{where}.{name} = {value}: {problem}"
    memory, swap = resources.memory_limit_in_bytes, resources.memory_swap_limit_in_bytes
    if swap > 0 and (memory <= 0 or swap < memory):
        why = (
            "a swap limit needs a memory limit (runc refuses it without one)"
            if memory <= 0
            else f"memory+swap must be at least the memory limit ({memory})"
        )
        return f"{where}.memory_swap_limit_in_bytes = {swap}: {why}; -1 for no limit"
    for name in ("cpuset_cpus", "cpuset_mems"):
        text = getattr(resources, name)
        try:
            parse_cpu_list(text)
        except ValueError as exc:
            return f"{where}.{name} = {text!r}: {exc}"
    return _hugepages_problem(resources.hugepage_limits, where, hugepage_sizes)


def _hugepages_problem(
    limits: Collection[api_pb2.HugepageLimit], where: str, sizes: Collection[str]
) -> str | None:
    for limit in limits:
        size = limit.page_size
        if not _PAGE_SIZE.fullmatch(size):
            return (
                f"{where}.hugepage_limits page_size = {size!r}: a page size as runc names "
                "it, like 2MB or 1GB"
            )
        if sizes and size not in sizes:
            have = ", ".join(sorted(sizes, key=_page_bytes))
            return f"{where}.hugepage_limits page_size = {size!r}: this node has {have}"
    return None


def _page_bytes(size: str) -> int:
    match = _PAGE_SIZE.fullmatch(size)
    if match is None:
        return 0
    return int(size[: -len(match[1])]) << (10 * (_UNITS.index(match[1]) + 1))


def node_hugepage_sizes(topology: Topology) -> frozenset[str]:
    """Every hugepage size the node's NUMA nodes show, named as runc names them (empty when
    the topology knows none: then any well-formed size passes)."""
    return frozenset(
        hugepage_size_name(kib) for memory in topology.memory.values() for kib in memory.hugepages
    )
