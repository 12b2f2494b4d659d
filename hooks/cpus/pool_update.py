"""`PoolUpdate`: every container on one of the node's pools moved onto it, as one update.

When CPUs change hands every container on the shared pool (or the BE pool) is due the pool
as it is now. The ledger asks for that with one `PoolUpdate` (a `GroupUpdate`), whatever the
number of containers: crihook walks the members after the call's answer and asks `delta` for
each only when it sends it, so the pool a container gets is the newest.
"""

from __future__ import annotations

import functools
from typing import Any

from crihook.hooks.cpus.koordinator import BE_POOL
from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.spec import ResourceDelta

__all__ = ["PoolUpdate"]

_FIELDS = frozenset({"cpuset_cpus"})


@functools.lru_cache(maxsize=64)
def _pool_delta(cpulist: str) -> ResourceDelta:
    """One delta per cpulist (immutable), shared by every container and update of that pool:
    built and checked once, not per member; pools come and go, the recent ones are kept."""
    return ResourceDelta(cpuset_cpus=cpulist)


class PoolUpdate:
    """The containers on the node pool `name` (`shared` or `be`), each onto its pool (narrowed
    to its NUMA nodes when koord-scheduler named some)."""

    __slots__ = ("name", "pool")

    def __init__(self, pool: CpuPool, name: str) -> None:
        self.pool = pool
        self.name = name

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
        if holder.follows_qos:  # its QoS cgroup holds the pool
            return None
        if holder.pool != self.name:
            return None
        return _pool_delta(self.pool.member_text(holder))

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
