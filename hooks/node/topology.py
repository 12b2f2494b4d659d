"""The node's CPU and memory topology: what the resource hooks place containers on.

Built once at start from sysfs (`sysfs.read_topology(root)`, root being the sysfs mount point)
and handed to hooks; never read again on the call path, so tests, benchmarks and replays can
hand hooks the topology of a machine this one is not.

Identifiers follow kubelet's CPU manager: a core is named by the lowest CPU id among its
hardware threads, so core ids are unique on the machine (sysfs `core_id` repeats per socket).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["CPUInfo", "NUMAMemory", "Topology", "TopologyError"]


class TopologyError(ValueError):
    """The node's topology could not be read: a sysfs file is missing or says something
    unexpected. The message names the path (and the text, when it was malformed)."""


@dataclass(frozen=True, slots=True)
class CPUInfo:
    """One online logical CPU."""

    id: int
    socket: int
    """physical_package_id."""
    die: int
    core: int
    """The lowest CPU id among this CPU's thread siblings (unique on the machine)."""
    numa: int
    l3: int
    """Id of the L3 (uncore) cache this CPU uses; -1 when sysfs shows none."""


@dataclass(frozen=True, slots=True)
class NUMAMemory:
    """Memory of one NUMA node, as sysfs reports it."""

    node: int
    total_bytes: int
    hugepages: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    """Page size in KiB → number of pages configured on this node."""


@dataclass(frozen=True)
class Topology:
    """Online CPUs and NUMA memory. Frozen; the derived indexes are computed once."""

    cpus: Mapping[int, CPUInfo]
    memory: Mapping[int, NUMAMemory] = field(default_factory=lambda: MappingProxyType({}))
    offline: frozenset[int] = frozenset()
    """CPUs sysfs lists as present but not online: never handed out."""

    @classmethod
    def build(
        cls,
        cpus: Iterable[CPUInfo],
        memory: Iterable[NUMAMemory] = (),
        offline: Iterable[int] = (),
    ) -> Topology:
        return cls(
            MappingProxyType({c.id: c for c in sorted(cpus, key=lambda c: c.id)}),
            MappingProxyType({m.node: m for m in sorted(memory, key=lambda m: m.node)}),
            frozenset(offline),
        )

    def to_dict(self) -> dict[str, Any]:
        """As JSON (a recording's node facts): `from_dict` gives the same Topology back."""
        return {
            "cpus": [[c.id, c.socket, c.die, c.core, c.numa, c.l3] for c in self.cpus.values()],
            "cpu_fields": ["id", "socket", "die", "core", "numa", "l3"],
            "memory": [
                {
                    "node": m.node,
                    "total_bytes": m.total_bytes,
                    "hugepages_kb": {str(k): v for k, v in m.hugepages.items()},
                }
                for m in self.memory.values()
            ],
            "offline": sorted(self.offline),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Topology:
        """The Topology `to_dict` wrote; TopologyError when the document is not one."""
        try:
            cpus = [CPUInfo(*(int(v) for v in row)) for row in doc["cpus"]]
            memory = [
                NUMAMemory(
                    int(m["node"]),
                    int(m["total_bytes"]),
                    MappingProxyType(
                        {int(k): int(v) for k, v in dict(m.get("hugepages_kb", {})).items()}
                    ),
                )
                for m in doc.get("memory", [])
            ]
            offline = [int(c) for c in doc.get("offline", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyError(f"not a topology document: {exc!r}") from None
        if not cpus:
            raise TopologyError("not a topology document: no cpus")
        return cls.build(cpus, memory, offline)

    @functools.cached_property
    def online(self) -> frozenset[int]:
        # Cached (the dataclass is frozen, so it never changes): read on every call's path.
        return frozenset(self.cpus)

    @functools.cached_property
    def numa_nodes(self) -> tuple[int, ...]:
        """NUMA nodes with CPUs or memory, ascending."""
        return tuple(sorted({c.numa for c in self.cpus.values()} | set(self.memory)))

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({c.socket for c in self.cpus.values()}))

    @property
    def threads_per_core(self) -> int:
        """SMT width: online threads of the widest core (1 without SMT)."""
        per_core: dict[int, int] = {}
        for c in self.cpus.values():
            per_core[c.core] = per_core.get(c.core, 0) + 1
        return max(per_core.values(), default=1)

    def cpus_in_numa(self, nodes: Iterable[int]) -> frozenset[int]:
        wanted = set(nodes)
        return frozenset(c.id for c in self.cpus.values() if c.numa in wanted)

    def numa_of(self, cpus: Iterable[int]) -> frozenset[int]:
        return frozenset(self.cpus[c].numa for c in cpus)
