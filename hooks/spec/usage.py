"""What a hook that keeps a node pool tells crihook's metrics about it.

A hook that hands out node resources (CPUs, memory per NUMA node, pooled devices) may
override `Hook.usage()` and return one `PoolUsage` per figure. crihook asks when its metrics
are scraped, on the event loop, so the answer reads the hook's own state without a lock; it
must be quick and must not block. Figures are counts (CPUs, devices) or bytes (memory), as
they stand now: crihook exports them as gauges.

    def usage(self) -> list[PoolUsage]:
        return [PoolUsage("cpu", "exclusive", value=len(self.pool.held()))]

Labels stay few and bounded (pool names come from the node's config, NUMA nodes from its
topology): never a pod or container name or id.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["USAGE_RESOURCES", "PoolUsage"]

USAGE_RESOURCES = ("cpu", "memory", "device")
"""`cpu`: a count of CPUs; `memory`: bytes; `device`: a count of devices."""


class PoolUsage(NamedTuple):
    """One figure of a pool a hook keeps."""

    resource: str
    """One of USAGE_RESOURCES."""
    pool: str
    """cpu: `exclusive`, `shared` or `reserved`; memory: the kind of memory (`memory`,
    `hugepages-2Mi`); device: the pool's name."""
    state: str = ""
    """memory: `allocatable`, `assigned` (given to containers) or `free`; device: `held` or
    `free`; cpu: empty."""
    numa_node: str = ""
    """memory: the NUMA node; else empty."""
    value: int = 0
