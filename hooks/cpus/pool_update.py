"""`PoolUpdate`: every container on one of the node's pools moved onto it, as one update.

When CPUs change hands every container on the shared pool (or the BE pool) is due the pool
as it is now. The ledger asks for that with one `PoolUpdate` (a `GroupUpdate`), whatever the
number of containers: crihook walks the members after the call's answer and asks `delta` for
each only when it sends it, so the pool a container gets is the newest.
"""

from __future__ import annotations

from typing import Any

from crihook.hooks.cpus.koordinator import BE_POOL
from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.spec import ResourceDelta

__all__ = ["PoolUpdate"]

_FIELDS = frozenset({"cpuset_cpus"})


class PoolUpdate:
    """The containers on the node pool `name` (`shared` or `be`), each onto its pool (narrowed
    to its NUMA nodes when koord-scheduler named some)."""

    __slots__ = ("_deltas", "name", "pool")

    def __init__(self, pool: CpuPool, name: str) -> None:
        self.pool = pool
        self.name = name
        self._deltas: dict[str, ResourceDelta] = {}
        """cpulist → its delta: built once per pool, not per container."""

    @property
    def key(self) -> str:
        return f"{self.name} pool"

    @property
    def fields(self) -> frozenset[str]:
        return _FIELDS

    def members(self) -> list[str]:
        return self.pool.pool_members(self.name)

    def delta(self, container_id: str) -> ResourceDelta | None:
        holder = self.pool.containers.get(container_id)
        if holder is None or holder.cpus or holder.stopped or holder.in_bubble:
            return None
        if holder.pool != self.name:
            return None
        text = self.pool.member_text(holder)
        delta = self._deltas.get(text)
        if delta is None:
            if len(self._deltas) > 64:  # pools come and go: keep the recent ones
                self._deltas.clear()
            delta = self._deltas[text] = ResourceDelta(cpuset_cpus=text)
        return delta

    def describe(self) -> dict[str, Any]:
        return {"cpuset_cpus": self.pool.node_pool_text(self.name)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PoolUpdate):
            return NotImplemented
        return self.pool is other.pool and self.name == other.name

    def __hash__(self) -> int:
        return hash((id(self.pool), self.name))

    def __repr__(self) -> str:
        what = "BE" if self.name == BE_POOL else self.name
        return f"PoolUpdate({what} pool {self.pool.node_pool_text(self.name)})"
