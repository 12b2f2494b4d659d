"""Which NUMA nodes could hold a container's exclusive CPUs: kubelet's CPU topology hints.

A port of kubelet's ``staticPolicy.generateCPUTopologyHints`` (Kubernetes 1.33 and later):
every combination of the machine's NUMA nodes (those with CPUs; one node, then pairs, ... in
ascending order) is a hint when its free CPUs, plus the CPUs the container may reuse, cover
the request, and a reusable CPU outside it rules it out. A hint is preferred when it has as
few nodes as the narrowest combination whose CPUs (all of them, free or not) could hold the
request. kubelet's hints do not depend on ``full-pcpus-only``, so neither do these.
"""

from __future__ import annotations

import itertools
from collections.abc import Set as AbstractSet

from crihook.hooks.cpus.picker import CPUAllocationError
from crihook.hooks.node.topology import Topology
from crihook.hooks.spec.hints import TopologyHint

__all__ = ["cpu_hints"]


def cpu_hints(
    topology: Topology,
    available: AbstractSet[int],
    reusable: AbstractSet[int],
    count: int,
    *,
    align_socket: bool = False,
) -> list[TopologyHint]:
    """kubelet's hints for ``count`` exclusive CPUs; empty when no NUMA node set can hold them.

    ``available``: the free, unreserved CPUs. ``reusable``: CPUs this container may take over
    (an init container's in the same pod); kubelet also regenerates the hints of a container
    that already holds CPUs by passing those as ``available`` and nothing as ``reusable``.
    ``align_socket``: the ``align-by-socket`` policy option. An empty list means the request
    cannot be placed (kubelet's semantics).
    """
    if count < 1:
        raise CPUAllocationError(f"invalid request for {count} cpus: at least 1 cpu is needed")
    cpus = topology.cpus
    unknown = sorted((set(available) | set(reusable)) - cpus.keys())
    if unknown:
        raise CPUAllocationError(f"cpus {','.join(map(str, unknown))} are not online on this node")

    total: dict[int, int] = {}
    sockets_of: dict[int, set[int]] = {}
    for info in cpus.values():
        total[info.numa] = total.get(info.numa, 0) + 1
        sockets_of.setdefault(info.numa, set()).add(info.socket)
    free: dict[int, int] = dict.fromkeys(total, 0)
    for cpu in available:
        free[cpus[cpu].numa] += 1
    reused_numas = {cpus[cpu].numa for cpu in reusable}
    nodes = sorted(total)

    narrowest = len(nodes)
    fitting: list[tuple[int, ...]] = []
    for size in range(1, len(nodes) + 1):
        for mask in itertools.combinations(nodes, size):
            if size < narrowest and sum(total[n] for n in mask) >= count:
                narrowest = size
            if not reused_numas.issubset(mask):
                continue
            if len(reusable) + sum(free[n] for n in mask) >= count:
                fitting.append(mask)
    if not align_socket:
        return [TopologyHint(frozenset(mask), len(mask) == narrowest) for mask in fitting]
    # kubelet's NumNUMANodes / NumSockets; 0 (more sockets than NUMA nodes, a topology
    # align-by-socket refuses) aligns nothing.
    numa_per_socket = len(nodes) // len({s for ss in sockets_of.values() for s in ss})
    min_sockets = (narrowest + numa_per_socket - 1) // numa_per_socket if numa_per_socket else 0

    def preferred(mask: tuple[int, ...]) -> bool:
        spanned = {s for n in mask for s in sockets_of[n]}
        return (numa_per_socket > 0 and len(spanned) == min_sockets) or len(mask) == narrowest

    return [TopologyHint(frozenset(mask), preferred(mask)) for mask in fitting]
