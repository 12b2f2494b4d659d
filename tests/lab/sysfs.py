"""Sysfs-shaped fixture trees of machines this VM is not, for tests, benchmarks and replays.

    root = write_sysfs(tmp_path / "sys", EPYC_256_8NUMA)
    topology = read_topology(root)

:func:`write_sysfs` writes what ``crihook.hooks.node.sysfs`` reads, shaped as a real kernel
shows it: cpulists end with a newline; an offline CPU keeps ``cpuN/online`` (``0``) and its
``nodeM`` link but has no ``topology/`` or ``cache/`` (the kernel removes them), and is left out
of every sibling list, node cpulist and cache ``shared_cpu_list``.

Named machines:

- :data:`DUAL_SOCKET_SMT2_2NUMA`: 2 sockets x 10 cores x 2 threads = 40 CPUs, one NUMA node
  and one L3 per socket (a common two-socket Xeon).
- :data:`DUAL_SOCKET_SMT2_4NUMA`: kubelet's ``topoDualSocketMultiNumaPerSocketHT`` (dual Xeon
  Gold 6230 with sub-NUMA clustering): 2 x 20 x 2 = 80 CPUs, 2 NUMA nodes per socket
  (node0 0-9,40-49 ... node3 30-39,70-79), one L3 per socket.
- :data:`EPYC_256_8NUMA`: 2 x 64 x 2 = 256 CPUs, 4 NUMA nodes per socket (NPS4), an L3 per
  8 cores (16 L3s, two per node), as on a dual EPYC 7763.
- :data:`OFFLINE_CPUS`: 2 x 8 x 2 = 32 CPUs, a NUMA node per socket, with CPUs 3 and 19 (all of
  core 3) and CPU 28 (one thread of core 12, leaving CPU 12 a one-thread core) offline.
- :data:`UNCORE_SMALL_L3`: 2 x 16 x 2 = 64 CPUs, 2 NUMA nodes per socket (8 cores each) and an
  L3 per 4 cores: L3 groups smaller than a NUMA node, two per node (core k is CPUs k and
  k+32; NUMA node k // 8; L3 k // 4), the shape ``prefer-align-cpus-by-uncorecache`` is for.
"""

from __future__ import annotations

import enum
import os
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from crihook.hooks.node import format_cpu_list

__all__ = [
    "DUAL_SOCKET_SMT2_2NUMA",
    "DUAL_SOCKET_SMT2_4NUMA",
    "EPYC_256_8NUMA",
    "GIB",
    "NAMED_SPECS",
    "OFFLINE_CPUS",
    "UNCORE_SMALL_L3",
    "MachineSpec",
    "Numbering",
    "SpecCPU",
    "write_sysfs",
]

GIB = 1 << 30


class Numbering(enum.Enum):
    """How Linux numbers the hardware threads."""

    SPREAD = "spread"
    """Thread 0 of every core first (across all sockets), then thread 1, ...: with N cores,
    cpu i and i+N are siblings. What Linux does on Intel and AMD x86 servers."""
    ADJACENT = "adjacent"
    """A core's threads get consecutive ids (cpu 2k and 2k+1 are siblings), as on some
    firmware and on POWER."""


@dataclass(frozen=True, slots=True)
class SpecCPU:
    """Where one logical CPU of a MachineSpec sits."""

    id: int
    socket: int
    die: int
    core: int
    """Machine-wide core index (socket-major), not the per-socket sysfs core_id."""
    thread: int
    numa: int
    l3: int
    """L3 id, -1 without an L3."""


def _default_hugepages() -> Mapping[int, int]:
    return MappingProxyType({2048: 512, 1048576: 2})


@dataclass(frozen=True)
class MachineSpec:
    """A machine's shape. Every socket is the same; NUMA nodes, dies and L3s split a socket's
    cores into equal consecutive groups (no node spans sockets)."""

    sockets: int
    cores_per_socket: int
    threads_per_core: int = 1
    dies_per_socket: int = 1
    numa_per_socket: int = 1
    l3_cores: int | None = None
    """Cores sharing one L3: None = one L3 per socket; 0 = no L3 at all."""
    memory_per_numa: int = 64 * GIB
    """MemTotal of each NUMA node, bytes (a multiple of 1024: meminfo counts kB)."""
    hugepages: Mapping[int, int] = field(default_factory=_default_hugepages)
    """Page size in KiB → pages configured, on every node."""
    offline: frozenset[int] = frozenset()
    numbering: Numbering = Numbering.SPREAD

    def __post_init__(self) -> None:
        for name in ("sockets", "cores_per_socket", "threads_per_core"):
            if getattr(self, name) < 1:
                raise ValueError(f"MachineSpec.{name} must be >= 1")
        for name in ("dies_per_socket", "numa_per_socket"):
            count = getattr(self, name)
            if count < 1 or self.cores_per_socket % count:
                raise ValueError(f"MachineSpec.{name}={count} must divide the cores of a socket")
        if self.l3_cores is not None and self.l3_cores < 0:
            raise ValueError("MachineSpec.l3_cores must be None, 0 or positive")
        if self.l3_cores and self.cores_per_socket % self.l3_cores:
            raise ValueError(f"MachineSpec.l3_cores={self.l3_cores} must divide a socket's cores")
        if self.memory_per_numa < 0 or self.memory_per_numa % 1024:
            raise ValueError("MachineSpec.memory_per_numa must be a whole number of KiB")
        stray = self.offline - set(range(self.cpu_count))
        if stray:
            raise ValueError(f"MachineSpec.offline names cpus that do not exist: {sorted(stray)}")

    @property
    def cpu_count(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    @property
    def numa_count(self) -> int:
        return self.sockets * self.numa_per_socket

    def cpu_id(self, socket: int, core_in_socket: int, thread: int) -> int:
        core = socket * self.cores_per_socket + core_in_socket
        if self.numbering is Numbering.SPREAD:
            return thread * self.sockets * self.cores_per_socket + core
        return core * self.threads_per_core + thread

    def cpus(self) -> list[SpecCPU]:
        """Every present CPU (online or not), by id."""
        per_die = self.cores_per_socket // self.dies_per_socket
        per_numa = self.cores_per_socket // self.numa_per_socket
        out = []
        for socket in range(self.sockets):
            for c in range(self.cores_per_socket):
                if self.l3_cores is None:
                    l3 = socket
                elif self.l3_cores == 0:
                    l3 = -1
                else:
                    l3 = socket * (self.cores_per_socket // self.l3_cores) + c // self.l3_cores
                for t in range(self.threads_per_core):
                    out.append(
                        SpecCPU(
                            id=self.cpu_id(socket, c, t),
                            socket=socket,
                            die=c // per_die,
                            core=socket * self.cores_per_socket + c,
                            thread=t,
                            numa=socket * self.numa_per_socket + c // per_numa,
                            l3=l3,
                        )
                    )
        return sorted(out, key=lambda cpu: cpu.id)

    def online_cpus(self) -> list[SpecCPU]:
        return [c for c in self.cpus() if c.id not in self.offline]


DUAL_SOCKET_SMT2_2NUMA = MachineSpec(
    sockets=2, cores_per_socket=10, threads_per_core=2, memory_per_numa=96 * GIB
)
DUAL_SOCKET_SMT2_4NUMA = MachineSpec(
    sockets=2, cores_per_socket=20, threads_per_core=2, numa_per_socket=2, memory_per_numa=48 * GIB
)
EPYC_256_8NUMA = MachineSpec(
    sockets=2,
    cores_per_socket=64,
    threads_per_core=2,
    numa_per_socket=4,
    l3_cores=8,
    memory_per_numa=128 * GIB,
)
OFFLINE_CPUS = MachineSpec(
    sockets=2,
    cores_per_socket=8,
    threads_per_core=2,
    memory_per_numa=32 * GIB,
    offline=frozenset({3, 19, 28}),
)
UNCORE_SMALL_L3 = MachineSpec(
    sockets=2,
    cores_per_socket=16,
    threads_per_core=2,
    numa_per_socket=2,
    l3_cores=4,
    memory_per_numa=32 * GIB,
)
NAMED_SPECS: Mapping[str, MachineSpec] = MappingProxyType(
    {
        "DUAL_SOCKET_SMT2_2NUMA": DUAL_SOCKET_SMT2_2NUMA,
        "DUAL_SOCKET_SMT2_4NUMA": DUAL_SOCKET_SMT2_4NUMA,
        "EPYC_256_8NUMA": EPYC_256_8NUMA,
        "OFFLINE_CPUS": OFFLINE_CPUS,
        "UNCORE_SMALL_L3": UNCORE_SMALL_L3,
    }
)

# (level, type) of the caches below the L3, as cache/index0..2; the L3, when the spec has one,
# is index3.
_CORE_CACHES = ((1, "Data"), (1, "Instruction"), (2, "Unified"))


def write_sysfs(root: Path, spec: MachineSpec) -> Path:
    """Write ``spec``'s ``devices/system/{cpu,node}`` under ``root``; returns ``root``, the
    sysfs root to hand to ``read_topology``."""
    cpu_dir = root / "devices" / "system" / "cpu"
    node_dir = root / "devices" / "system" / "node"
    cpus = spec.cpus()
    online = [c for c in cpus if c.id not in spec.offline]
    present = [c.id for c in cpus]

    _write(cpu_dir / "present", format_cpu_list(present))
    _write(cpu_dir / "possible", format_cpu_list(present))
    _write(cpu_dir / "online", format_cpu_list(c.id for c in online))
    _write(cpu_dir / "offline", format_cpu_list(spec.offline))

    # The cpulists of every group, built once: only online CPUs appear in them.
    def lists(key: Callable[[SpecCPU], Hashable]) -> dict[Hashable, str]:
        groups: dict[Hashable, list[int]] = defaultdict(list)
        for c in online:
            groups[key(c)].append(c.id)
        return defaultdict(str, {k: format_cpu_list(v) for k, v in groups.items()})

    by_core = lists(lambda c: c.core)
    by_l3 = lists(lambda c: c.l3)
    by_numa = lists(lambda c: c.numa)

    for cpu in cpus:
        base = cpu_dir / f"cpu{cpu.id}"
        base.mkdir(parents=True, exist_ok=True)
        if cpu.id != 0 or 0 in spec.offline:  # x86 shows no `online` for cpu0 (not hotpluggable)
            _write(base / "online", "1" if cpu.id not in spec.offline else "0")
        _symlink(base / f"node{cpu.numa}", Path("..", "..", "node", f"node{cpu.numa}"))
        if cpu.id in spec.offline:
            continue
        topo = base / "topology"
        _write(topo / "physical_package_id", str(cpu.socket))
        _write(topo / "die_id", str(cpu.die))
        _write(topo / "core_id", str(cpu.core - cpu.socket * spec.cores_per_socket))
        _write(topo / "thread_siblings_list", by_core[cpu.core])
        # L1d, L1i, L2 (level and type only: readers look for the level-3 index among them).
        for index, (level, kind) in enumerate(_CORE_CACHES):
            _write(base / "cache" / f"index{index}" / "level", str(level))
            _write(base / "cache" / f"index{index}" / "type", kind)
        if cpu.l3 >= 0:
            l3 = base / "cache" / f"index{len(_CORE_CACHES)}"
            _write(l3 / "level", "3")
            _write(l3 / "type", "Unified")
            _write(l3 / "id", str(cpu.l3))
            _write(l3 / "shared_cpu_list", by_l3[cpu.l3])

    nodes = range(spec.numa_count)
    _write(node_dir / "possible", format_cpu_list(nodes))
    _write(node_dir / "online", format_cpu_list(nodes))
    _write(node_dir / "has_cpu", format_cpu_list({c.numa for c in online}))
    _write(node_dir / "has_memory", format_cpu_list(nodes if spec.memory_per_numa else ()))
    for node in nodes:
        base = node_dir / f"node{node}"
        _write(base / "cpulist", by_numa[node])
        for cpu in cpus:
            if cpu.numa == node:
                _symlink(base / f"cpu{cpu.id}", Path("..", "..", "cpu", f"cpu{cpu.id}"))
        _write(base / "meminfo", _meminfo(node, spec))
        for size_kb, count in spec.hugepages.items():
            pages = base / "hugepages" / f"hugepages-{size_kb}kB"
            _write(pages / "nr_hugepages", str(count))
            _write(pages / "free_hugepages", str(count))
            _write(pages / "surplus_hugepages", "0")
    return root


def _meminfo(node: int, spec: MachineSpec) -> str:
    total_kb = spec.memory_per_numa // 1024
    huge_kb = sum(size * count for size, count in spec.hugepages.items())
    free_kb = max(total_kb - huge_kb - total_kb // 50, 0)
    rows = [
        ("MemTotal", total_kb),
        ("MemFree", free_kb),
        ("MemUsed", total_kb - free_kb),
        ("Active", 0),
        ("Inactive", 0),
    ]
    # The kernel's layout: "Node N Name:" padded, the value right-aligned, then " kB".
    lines = [f"Node {node} {name + ':':<15} {value:>8} kB" for name, value in rows]
    lines += [
        f"Node {node} HugePages_Total: {spec.hugepages.get(2048, 0):>5}",
        f"Node {node} HugePages_Free:  {spec.hugepages.get(2048, 0):>5}",
        f"Node {node} HugePages_Surp:  {0:>5}",
    ]
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        os.symlink(target, link)
