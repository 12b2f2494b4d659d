"""Reads the node's CPU and NUMA topology from sysfs into a :class:`Topology`.

``root`` is where sysfs is mounted (``/sys`` on a host; a fixture tree in tests, see
``tests/lab/sysfs.py``). Files read, relative to ``<root>/devices/system``:

- ``cpu/online``, ``cpu/present``: cpulists; offline = present - online. Only online CPUs are
  read further (the kernel removes ``topology/`` and ``cache/`` of an offline CPU).
- ``cpu/cpuN/topology/physical_package_id`` → socket; ``die_id`` → die (0 when absent: kernels
  before 5.6 have no such file); ``thread_siblings_list`` → core, the lowest *online* sibling
  id (kubelet's unique core id), so the online sibling of an offline CPU is a one-thread core.
- ``cpu/cpuN/cache/indexK/level``; for the first level-3 index its ``id``. Without an L3 (or
  without ``cache/``) the id is -1. Kernels that list an L3 but no ``id`` file (arm64 without
  firmware cache ids) get the lowest CPU of its ``shared_cpu_list`` as the id instead, which
  names each L3 instance uniquely too.
- ``node/nodeM/cpulist`` → the NUMA node of each CPU; an online CPU in no node's cpulist is
  looked up by its ``cpu/cpuN/nodeM`` link.
- ``node/nodeM/meminfo`` (``Node M MemTotal: <n> kB``) and
  ``node/nodeM/hugepages/hugepages-<size>kB/nr_hugepages`` → memory per node, for every node
  directory (a node may have memory and no CPUs).

Without ``node/`` (a kernel built without NUMA) every CPU is on node 0 and the memory map is
empty: memory per node is unknown, not zero.

A file that is missing or malformed raises :class:`TopologyError` naming the path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import MappingProxyType

from crihook.hooks.node.cpulist import format_cpu_list, parse_cpu_list
from crihook.hooks.node.topology import CPUInfo, NUMAMemory, Topology, TopologyError

__all__ = ["read_topology"]

_NODE_DIR = re.compile(r"node([0-9]+)")
_INDEX_DIR = re.compile(r"index([0-9]+)")
_HUGEPAGES_DIR = re.compile(r"hugepages-([0-9]+)kB")
_INT = re.compile(r"-?[0-9]+")
_MEMTOTAL = re.compile(r"Node\s+([0-9]+)\s+MemTotal:\s+([0-9]+)\s+kB")


def read_topology(root: str | os.PathLike[str]) -> Topology:
    """The topology sysfs at ``root`` describes; raises TopologyError naming the bad file."""
    system = Path(root) / "devices" / "system"
    cpu_dir = system / "cpu"
    node_dir = system / "node"

    online = _read_cpu_list(cpu_dir / "online")
    present = _read_cpu_list(cpu_dir / "present")
    if not online:
        raise TopologyError(f"no online cpus in {cpu_dir / 'online'}")
    if not online <= present:
        stray = format_cpu_list(online - present)
        raise TopologyError(f"cpus {stray} are online but not in {cpu_dir / 'present'}")

    has_numa = node_dir.is_dir()
    nodes = _node_ids(node_dir) if has_numa else []
    numa_of = _numa_of_cpus(cpu_dir, node_dir, nodes, online) if has_numa else {}

    cpus = []
    for cpu in sorted(online):
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        die_path = topo / "die_id"
        siblings = _read_cpu_list(topo / "thread_siblings_list") & online
        cpus.append(
            CPUInfo(
                id=cpu,
                socket=_read_int(topo / "physical_package_id"),
                die=_read_int(die_path) if die_path.exists() else 0,
                core=min(siblings | {cpu}),
                numa=numa_of.get(cpu, 0),
                l3=_l3_id(cpu_dir / f"cpu{cpu}" / "cache"),
            )
        )
    memory = [_read_node_memory(node_dir / f"node{n}", n) for n in nodes]
    return Topology.build(cpus, memory, present - online)


def _node_ids(node_dir: Path) -> list[int]:
    return sorted(
        int(m[1])
        for name in _listdir(node_dir)
        if (m := _NODE_DIR.fullmatch(name)) and (node_dir / name).is_dir()
    )


def _numa_of_cpus(
    cpu_dir: Path, node_dir: Path, nodes: list[int], online: frozenset[int]
) -> dict[int, int]:
    numa_of: dict[int, int] = {}
    for node in nodes:
        path = node_dir / f"node{node}" / "cpulist"
        for cpu in _read_cpu_list(path) & online:
            if cpu in numa_of:
                raise TopologyError(
                    f"cpu {cpu} is in two NUMA nodes: {numa_of[cpu]} and {node} ({path})"
                )
            numa_of[cpu] = node
    # A node's cpulist is the kernel's current node→cpu mask; the per-cpu link is the
    # registration. Both normally agree; the link is the fall-back for a cpu no list has.
    for cpu in sorted(online - numa_of.keys()):
        linked = _linked_node(cpu_dir / f"cpu{cpu}")
        if linked is None:
            raise TopologyError(
                f"cpu {cpu} is online but in no NUMA node: not in {node_dir}/node*/cpulist "
                f"and no {cpu_dir}/cpu{cpu}/node* entry"
            )
        numa_of[cpu] = linked
    return numa_of


def _linked_node(cpu_path: Path) -> int | None:
    found = sorted(int(m[1]) for name in _listdir(cpu_path) if (m := _NODE_DIR.fullmatch(name)))
    return found[0] if found else None


def _l3_id(cache_dir: Path) -> int:
    if not cache_dir.is_dir():
        return -1
    indexes = sorted(int(m[1]) for name in _listdir(cache_dir) if (m := _INDEX_DIR.fullmatch(name)))
    for k in indexes:
        index = cache_dir / f"index{k}"
        if _read_int(index / "level") != 3:
            continue
        id_path = index / "id"
        if id_path.exists():
            return _read_int(id_path)
        shared = _read_cpu_list(index / "shared_cpu_list")
        if not shared:
            raise TopologyError(f"empty cpu list in {index / 'shared_cpu_list'}")
        return min(shared)
    return -1


def _read_node_memory(path: Path, node: int) -> NUMAMemory:
    meminfo = path / "meminfo"
    total_kb = None
    for line in _read(meminfo).splitlines():
        m = _MEMTOTAL.fullmatch(line.strip())
        if m is not None:
            if int(m[1]) != node:
                raise TopologyError(f"{meminfo} describes node {m[1]}, not node {node}")
            total_kb = int(m[2])
            break
    if total_kb is None:
        raise TopologyError(f"no 'Node {node} MemTotal: <n> kB' line in {meminfo}")

    hugepages: dict[int, int] = {}
    hp_dir = path / "hugepages"
    if hp_dir.is_dir():  # absent on kernels without hugetlbfs
        for name in sorted(_listdir(hp_dir)):
            m = _HUGEPAGES_DIR.fullmatch(name)
            if m is not None:
                hugepages[int(m[1])] = _read_int(hp_dir / name / "nr_hugepages")
    return NUMAMemory(node, total_kb * 1024, MappingProxyType(dict(sorted(hugepages.items()))))


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as exc:
        raise TopologyError(f"cannot list {path}: {exc.strerror or exc}") from exc


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TopologyError(f"cannot read {path}: {reason}") from exc


def _read_int(path: Path) -> int:
    text = _read(path).strip()
    # Strict: int() would also take "1_000" and non-ASCII digits, which sysfs never prints.
    if _INT.fullmatch(text) is None:
        raise TopologyError(f"malformed integer {text!r} in {path}")
    return int(text)


def _read_cpu_list(path: Path) -> frozenset[int]:
    text = _read(path)
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise TopologyError(f"{exc} in {path}") from None
