"""Which exclusive CPUs a container gets: kubelet's static CPU manager policy, choice for choice.

An operator turns kubelet's static CPU manager off, puts crihook in front, and must see the
same CPUs picked. So this module follows kubelet's ``pkg/kubelet/cm/cpumanager``
(``cpu_assignment.go`` and ``policy_static.go`` as of Kubernetes 1.35/1.36, with every CPU
manager policy option) and is checked against kubelet's own test vectors
(``tests/unit/test_cpuset_picker.py``):

- default: ``takeByTopologyNUMAPacked``. Whole NUMA nodes and whole sockets first (the
  bigger of the two levels first), then whole cores, then single threads; at every level
  the candidates with the fewest free CPUs come first, ties by id.
- ``uncore_cache``: ``prefer-align-cpus-by-uncorecache``. Between the NUMA/socket step and
  the core step, whole free uncore (L3) caches are taken while the request still needs at
  least an uncore's worth of CPUs, and then the first uncore cache (NUMA node by NUMA node,
  fewest free CPUs first) whose lowest free cores hold exactly what is still needed.
- ``spread_cores``: ``distribute-cpus-across-cores``. No whole-core step, and single
  threads are taken socket by socket in CPU id order, so siblings are taken last.
- ``spread_numa``: ``distribute-cpus-across-numa`` (``takeByTopologyNUMADistributed``): the
  request is split evenly over the fewest NUMA nodes that can hold it, remainders placed
  where they keep the nodes most balanced; with ``align_socket`` too, NUMA node sets within
  one socket win over any set spanning sockets.
- ``full_cores``: ``full-pcpus-only``: requests that are not whole cores are refused
  (kubelet's ``SMTAlignmentError``); with ``spread_numa`` CPUs move in whole cores.
- ``numa_affinity``: the NUMA nodes the topology merge chose; the CPUs of those nodes are
  taken first, the rest from anywhere (kubelet's ``allocateCPUs``). With ``align_socket``
  (``align-by-socket``) the CPUs of the sockets of those nodes are taken first instead.

``take_reserved`` is kubelet's pick of reserved CPUs by count (``NewStaticPolicy``): the same
choice over all online CPUs, without the admission checks.

Ids follow kubelet's ``CPUDetails``: cores, sockets, NUMA nodes and uncore caches are
compared by the number of free CPUs they hold, then by id, so a core's id must be unique on
the machine (``CPUInfo.core``). A CPU's uncore cache is its L3 (``CPUInfo.l3``), or its
socket when sysfs shows no L3 (kubelet's fallback). Per-topology indexes are built once and
cached while the topology lives.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import Counter
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from crihook.hooks.node.topology import Topology

__all__ = ["CPUAllocationError", "SMTAlignmentError", "take_cpus", "take_reserved"]


class CPUAllocationError(ValueError):
    """The request cannot be met from the CPUs given (the message says why, with numbers)."""


class SMTAlignmentError(CPUAllocationError):
    """``full_cores``: the request is not whole cores, or not enough whole cores are free.

    The message is kubelet's, word for word, so operators and alerts keyed on kubelet's
    admission errors keep working.
    """

    def __init__(
        self, requested: int, cpus_per_core: int, available_physical: int | None = None
    ) -> None:
        self.requested = requested
        self.cpus_per_core = cpus_per_core
        self.available_physical = available_physical
        if available_physical is None:
            message = (
                f"SMT Alignment Error: requested {requested} cpus not multiple cpus per "
                f"core = {cpus_per_core}"
            )
        else:
            message = (
                "SMT Alignment Error: not enough free physical CPUs: available physical "
                f"CPUs = {available_physical}, requested CPUs = {requested}, CPUs per core = "
                f"{cpus_per_core}"
            )
        super().__init__(message)


def take_cpus(
    topology: Topology,
    available: AbstractSet[int],
    count: int,
    *,
    spread_numa: bool = False,
    full_cores: bool = False,
    numa_affinity: AbstractSet[int] | None = None,
    uncore_cache: bool = False,
    spread_cores: bool = False,
    align_socket: bool = False,
) -> frozenset[int]:
    """Pick ``count`` CPUs out of ``available`` exactly as kubelet's static policy would.

    ``available``: the CPUs that may be handed out (free and not reserved, plus any CPUs the
    caller lets this container reuse). ``full_cores`` counts as free physical CPUs the CPUs of
    ``available`` whose whole core is in ``available`` (kubelet's ``availablePhysicalCPUs``
    when every allocation is whole cores, the norm under ``full-pcpus-only``). The other
    flags are the policy options the module docstring names; the option rules (which ones
    combine) are checked where the options are parsed, not here.

    ``count`` 0 gives the empty set, whatever is available (kubelet: "take zero cpus", its
    accumulator is satisfied before it looks). Raises ``SMTAlignmentError`` (``full_cores``)
    or ``CPUAllocationError``: a negative ``count`` (a caller's bug: kubelet never asks for
    one), CPUs in ``available`` that are not online, or fewer CPUs than asked for.
    """
    if count == 0:
        return frozenset()
    index = _index(topology)
    if count < 0:
        raise CPUAllocationError(f"invalid request for {count} cpus: a count cannot be negative")
    free = frozenset(available)
    unknown = free - index.online
    if unknown:
        raise CPUAllocationError(
            f"cpus {_cpu_list(unknown)} are not online on this node (online: "
            f"{_cpu_list(index.online)})"
        )
    group_size = 1
    if full_cores:
        group_size = index.cpus_per_core
        if count % group_size:
            raise SMTAlignmentError(count, group_size)
        physical = _whole_core_cpus(index, free)
        if count > physical:
            raise SMTAlignmentError(count, group_size, physical)
    if count > len(free):
        raise _not_enough(count, len(free))

    choice = _Choice(spread_numa, group_size, uncore_cache, spread_cores, align_socket)
    taken: frozenset[int] = frozenset()
    if numa_affinity is not None:
        aligned = _aligned_cpus(index, free, numa_affinity, align_socket)
        taken = _take_by_topology(index, aligned, min(count, len(aligned)), choice)
    rest = _take_by_topology(index, free - taken, count - len(taken), choice)
    result = taken | rest
    if len(result) != count or not result <= free:  # a bug here must not pin two containers
        raise CPUAllocationError(
            f"internal error: picked cpus {_cpu_list(result)} for {count} of {_cpu_list(free)}"
        )
    return result


def take_reserved(
    topology: Topology,
    count: int,
    *,
    spread_numa: bool = False,
    full_cores: bool = False,
    uncore_cache: bool = False,
    spread_cores: bool = False,
    align_socket: bool = False,
) -> frozenset[int]:
    """kubelet's reserved CPUs by count: its ``takeByTopology`` over every online CPU.

    The policy options steer the choice as they steer ``take_cpus`` (``full_cores`` only sets
    the group size of ``spread_numa``); there is no admission check, so an odd count under
    ``full-pcpus-only`` is fine. ``count`` 0 reserves nothing; CPUAllocationError when the
    node has fewer CPUs than ``count``.
    """
    index = _index(topology)
    if count < 0:
        raise CPUAllocationError(f"invalid count of reserved cpus: {count}")
    group_size = index.cpus_per_core if full_cores else 1
    choice = _Choice(spread_numa, group_size, uncore_cache, spread_cores, align_socket)
    return _take_by_topology(index, index.online, count, choice)


@dataclass(frozen=True, slots=True)
class _Choice:
    """The policy options that steer kubelet's ``takeByTopology``."""

    spread_numa: bool = False
    group_size: int = 1
    """CPUs moved together by the distributed pick (a core's worth under full-pcpus-only)."""
    uncore: bool = False
    spread_cores: bool = False
    align_socket: bool = False


def _aligned_cpus(
    index: _Index, free: frozenset[int], numa_affinity: AbstractSet[int], align_socket: bool
) -> frozenset[int]:
    """kubelet's ``getAlignedCPUs``: the free CPUs of the hinted NUMA nodes, or with
    align-by-socket of the sockets those NUMA nodes are on."""
    if align_socket:
        sockets = {s for n in numa_affinity for s in index.numa_sockets.get(n, ())}
        return frozenset(c for c in free if index.cpu_socket[c] in sockets)
    return frozenset(c for c in free if index.cpu_numa[c] in numa_affinity)


# --- the per-topology index ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Index:
    """What the picker asks of a topology, precomputed (kubelet's ``CPUTopology``)."""

    online: frozenset[int]
    cpu_core: dict[int, int]
    cpu_numa: dict[int, int]
    cpu_socket: dict[int, int]
    cpu_uncore: dict[int, int]
    core_cpus: dict[int, tuple[int, ...]]
    numa_cpus: dict[int, frozenset[int]]
    socket_cpus: dict[int, frozenset[int]]
    uncore_cpus: dict[int, frozenset[int]]
    socket_order: dict[int, tuple[int, ...]]
    """A socket's CPUs by id (the spread order of distribute-cpus-across-cores)."""
    numa_nodes: tuple[int, ...]
    numa_sockets: dict[int, tuple[int, ...]]
    socket_numas: dict[int, tuple[int, ...]]
    socket_cores: dict[int, tuple[int, ...]]
    numa_cores: dict[int, tuple[int, ...]]
    numa_uncores: dict[int, tuple[int, ...]]
    uncore_cores: dict[int, tuple[int, ...]]
    cpus_per_socket: int
    cpus_per_core: int
    cpus_per_uncore: int
    numa_first: bool
    """NUMA nodes at least as big as sockets: whole NUMA nodes are taken before sockets."""

    @classmethod
    def build(cls, topology: Topology) -> _Index:
        infos = sorted(topology.cpus.values(), key=lambda c: c.id)
        if not infos:
            raise CPUAllocationError("the topology has no online cpus")

        def group(key_of: dict[int, int]) -> dict[int, list[int]]:
            out: dict[int, list[int]] = {}
            for cpu in sorted(key_of):
                out.setdefault(key_of[cpu], []).append(cpu)
            return out

        def pairs(pair_list: Iterable[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
            out: dict[int, set[int]] = {}
            for a, b in pair_list:
                out.setdefault(a, set()).add(b)
            return {a: tuple(sorted(bs)) for a, bs in out.items()}

        cpu_core = {c.id: c.core for c in infos}
        cpu_numa = {c.id: c.numa for c in infos}
        cpu_socket = {c.id: c.socket for c in infos}
        # kubelet's getUncoreCacheID: the L3's id, the socket's without an L3.
        cpu_uncore = {c.id: c.l3 if c.l3 >= 0 else c.socket for c in infos}
        core_cpus = {core: tuple(cpus) for core, cpus in group(cpu_core).items()}
        numa_cpus = {n: frozenset(cpus) for n, cpus in group(cpu_numa).items()}
        sockets = group(cpu_socket)
        uncore_cpus = {u: frozenset(cpus) for u, cpus in group(cpu_uncore).items()}
        n_cpus = len(infos)
        return cls(
            online=frozenset(cpu_core),
            cpu_core=cpu_core,
            cpu_numa=cpu_numa,
            cpu_socket=cpu_socket,
            cpu_uncore=cpu_uncore,
            core_cpus=core_cpus,
            numa_cpus=numa_cpus,
            socket_cpus={s: frozenset(cpus) for s, cpus in sockets.items()},
            uncore_cpus=uncore_cpus,
            socket_order={s: tuple(cpus) for s, cpus in sockets.items()},
            numa_nodes=tuple(sorted(numa_cpus)),
            numa_sockets=pairs((c.numa, c.socket) for c in infos),
            socket_numas=pairs((c.socket, c.numa) for c in infos),
            socket_cores=pairs((c.socket, c.core) for c in infos),
            numa_cores=pairs((c.numa, c.core) for c in infos),
            numa_uncores=pairs((c.numa, cpu_uncore[c.id]) for c in infos),
            uncore_cores=pairs((cpu_uncore[c.id], c.core) for c in infos),
            # kubelet's CPUsPerSocket / CPUsPerCore / CPUsPerUncore: integer averages over
            # the machine.
            cpus_per_socket=n_cpus // len(sockets),
            cpus_per_core=n_cpus // len(core_cpus),
            cpus_per_uncore=n_cpus // len(uncore_cpus),
            numa_first=len(sockets) >= len(numa_cpus),
        )

    def same_socket(self, numas: Iterable[int]) -> bool:
        """kubelet's ``AreNUMANodesInSameSocket``."""
        return len({s for n in numas for s in self.numa_sockets[n]}) == 1


_INDEXES: dict[int, tuple[weakref.ref[Topology], _Index]] = {}
"""id(topology) -> (a weak reference to it, its index); an entry leaves with its topology."""


def _index(topology: Topology) -> _Index:
    key = id(topology)
    entry = _INDEXES.get(key)
    if entry is not None and entry[0]() is topology:
        return entry[1]
    index = _Index.build(topology)

    def forget(_ref: weakref.ref[Topology], key: int = key) -> None:
        _INDEXES.pop(key, None)

    _INDEXES[key] = (weakref.ref(topology, forget), index)
    return index


def _whole_core_cpus(index: _Index, free: AbstractSet[int]) -> int:
    per_core: dict[int, int] = {}
    for cpu in free:
        core = index.cpu_core[cpu]
        per_core[core] = per_core.get(core, 0) + 1
    return sum(n for core, n in per_core.items() if n == len(index.core_cpus[core]))


def _not_enough(requested: int, available: int) -> CPUAllocationError:
    return CPUAllocationError(
        "not enough cpus available to satisfy request: "
        f"requested={requested}, available={available}"
    )


def _cpu_list(cpus: Iterable[int]) -> str:
    """Kernel cpulist form ("0-3,8"), for messages."""
    ordered = sorted(cpus)
    ranges: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[start], ordered[end]
        ranges.append(str(first) if first == last else f"{first}-{last}")
        start = end + 1
    return ",".join(ranges)


# --- kubelet's cpuAccumulator ----------------------------------------------------------


class _Accumulator:
    """The free CPUs, what was taken so far and how many are still needed.

    Free-CPU counts per core, NUMA node, socket and (NUMA node, socket) pair are kept up to
    date as CPUs are taken, so each ordering below is a sort of a few dozen ids; per uncore
    cache and (NUMA node, uncore cache) pair too when the uncore option asks for them.
    ``spread``: distribute-cpus-across-cores, kubelet's ``CPUSortingStrategySpread``.
    """

    __slots__ = (
        "core_free",
        "free",
        "index",
        "needed",
        "numa_free",
        "numa_uncore_free",
        "pair_free",
        "result",
        "socket_free",
        "spread",
        "uncore",
        "uncore_free",
    )

    def __init__(
        self,
        index: _Index,
        available: Iterable[int],
        count: int,
        *,
        uncore: bool = False,
        spread: bool = False,
    ) -> None:
        self.index = index
        self.free: set[int] = set(available)
        self.needed = count
        self.result: set[int] = set()
        self.uncore = uncore
        self.spread = spread
        free = self.free
        self.core_free: dict[int, int] = Counter(map(index.cpu_core.__getitem__, free))
        self.numa_free: dict[int, int] = Counter(map(index.cpu_numa.__getitem__, free))
        self.socket_free: dict[int, int] = Counter(map(index.cpu_socket.__getitem__, free))
        self.pair_free: dict[tuple[int, int], int] = Counter(
            (index.cpu_numa[c], index.cpu_socket[c]) for c in free
        )
        self.uncore_free: dict[int, int] = {}
        self.numa_uncore_free: dict[tuple[int, int], int] = {}
        if uncore:
            self.uncore_free = Counter(map(index.cpu_uncore.__getitem__, free))
            self.numa_uncore_free = Counter((index.cpu_numa[c], index.cpu_uncore[c]) for c in free)

    def take(self, cpus: AbstractSet[int] | tuple[int, ...] | list[int]) -> None:
        index = self.index
        for cpu in cpus:
            self.result.add(cpu)
            if cpu in self.free:
                self.free.remove(cpu)
                numa, socket = index.cpu_numa[cpu], index.cpu_socket[cpu]
                self.core_free[index.cpu_core[cpu]] -= 1
                self.numa_free[numa] -= 1
                self.socket_free[socket] -= 1
                self.pair_free[numa, socket] -= 1
                if self.uncore:
                    uncore = index.cpu_uncore[cpu]
                    self.uncore_free[uncore] -= 1
                    self.numa_uncore_free[numa, uncore] -= 1
        self.needed -= len(cpus)

    @property
    def satisfied(self) -> bool:
        return self.needed < 1

    @property
    def failed(self) -> bool:
        return self.needed > len(self.free)

    # Orderings. Everything with a free CPU, fewest free CPUs first, ties by id; the lower
    # levels grouped under the sorted upper ones (NUMA > socket > core when NUMA nodes are
    # the bigger level, socket > NUMA > core otherwise).

    def sort_numa_nodes(self) -> list[int]:
        if self.index.numa_first:
            return _by_free((n for n, k in self.numa_free.items() if k > 0), self.numa_free)
        out: list[int] = []
        for socket in self.sort_sockets():
            numas = (
                n for n in self.index.socket_numas[socket] if self.pair_free.get((n, socket), 0) > 0
            )
            out.extend(_by_free(numas, self.numa_free))
        return out

    def sort_sockets(self) -> list[int]:
        if not self.index.numa_first:
            return _by_free((s for s, k in self.socket_free.items() if k > 0), self.socket_free)
        out: list[int] = []
        for numa in self.sort_numa_nodes():
            sockets = (
                s for s in self.index.numa_sockets[numa] if self.pair_free.get((numa, s), 0) > 0
            )
            out.extend(_by_free(sockets, self.socket_free))
        return out

    def sort_uncores(self) -> list[int]:
        """kubelet's ``sortAvailableUncoreCaches``: NUMA node by NUMA node (in their order),
        the uncore caches with a free CPU on that node, by free CPUs in the whole cache. An
        uncore cache spanning NUMA nodes is listed once per node, as kubelet lists it."""
        out: list[int] = []
        pair_free = self.numa_uncore_free
        for numa in self.sort_numa_nodes():
            uncores = (u for u in self.index.numa_uncores[numa] if pair_free.get((numa, u), 0))
            out.extend(_by_free(uncores, self.uncore_free))
        return out

    def sort_cores(self) -> list[int]:
        index, core_free = self.index, self.core_free
        if index.numa_first:
            groups = [index.socket_cores[s] for s in self.sort_sockets()]
        else:
            groups = [index.numa_cores[n] for n in self.sort_numa_nodes()]
        out: list[int] = []
        for cores in groups:
            out.extend(_by_free((c for c in cores if core_free.get(c, 0) > 0), core_free))
        return out

    def sort_cpus(self) -> list[int]:
        """kubelet's availableCPUSorter: packed (core by core) or spread (socket by socket,
        by CPU id, so a core's siblings come last)."""
        free = self.free
        if self.spread:
            order = self.index.socket_order
            return [cpu for socket in self.sort_sockets() for cpu in order[socket] if cpu in free]
        core_cpus = self.index.core_cpus
        return [cpu for core in self.sort_cores() for cpu in core_cpus[core] if cpu in free]

    def free_numa_nodes(self) -> list[int]:
        numa_cpus = self.index.numa_cpus
        return [n for n in self.sort_numa_nodes() if self.numa_free[n] == len(numa_cpus[n])]

    # kubelet calls a socket or core free when its free CPUs number CPUsPerSocket or
    # CPUsPerCore, machine-wide averages, and then takes all of its CPUs. With offline CPUs
    # the averages are not every element's size, and kubelet would hand out CPUs that are
    # not available (a reserved CPU, another container's). Here an element is free when all
    # of its own CPUs are: the same on every machine whose cores and sockets are alike.
    def free_sockets(self) -> list[int]:
        socket_cpus = self.index.socket_cpus
        return [s for s in self.sort_sockets() if self.socket_free[s] == len(socket_cpus[s])]

    def free_cores(self) -> list[int]:
        core_cpus = self.index.core_cpus
        return [c for c in self.sort_cores() if self.core_free[c] == len(core_cpus[c])]

    def free_uncores(self) -> list[int]:
        uncore_cpus = self.index.uncore_cpus
        return [u for u in self.sort_uncores() if self.uncore_free[u] == len(uncore_cpus[u])]

    # Taking whole topology elements. Each list is computed once, then walked.

    def take_full_numa_nodes(self) -> None:
        for numa in self.free_numa_nodes():
            cpus = self.index.numa_cpus[numa]
            if self.needed >= len(cpus):
                self.take(cpus)

    def take_full_sockets(self) -> None:
        for socket in self.free_sockets():
            cpus = self.index.socket_cpus[socket]
            if self.needed >= len(cpus):
                self.take(cpus)

    def take_full_uncores(self) -> None:
        uncore_cpus, uncore_free = self.index.uncore_cpus, self.uncore_free
        for uncore in self.free_uncores():
            cpus = uncore_cpus[uncore]
            # A cache listed twice (it spans NUMA nodes) is taken once: kubelet would count
            # its CPUs twice and come out short.
            if self.needed >= len(cpus) and uncore_free[uncore] == len(cpus):
                self.take(cpus)

    def take_partial_uncore(self, uncore: int) -> None:
        """kubelet's ``takePartialUncore``: the cache's lowest cores with a free CPU, as many
        as the rest of the request needs in whole cores; taken only when their free CPUs are
        exactly what is needed (one CPU fewer for an odd request on SMT machines)."""
        index, free = self.index, self.free
        per_core = index.cpus_per_core
        cores_needed = (self.needed + per_core - 1) // per_core
        cores = [
            core
            for core in index.uncore_cores[uncore]
            if any(c in free and index.cpu_uncore[c] == uncore for c in index.core_cpus[core])
        ][:cores_needed]
        cpus = sorted(c for core in cores for c in index.core_cpus[core] if c in free)
        if self.needed % 2 and per_core > 1 and len(cpus) > self.needed:
            cpus.pop()
        if len(cpus) == self.needed:
            self.take(cpus)

    def take_uncore_caches(self) -> None:
        """kubelet's ``takeUncoreCache``."""
        per_uncore = self.index.cpus_per_uncore
        for uncore in self.sort_uncores():
            if self.needed >= per_uncore:
                self.take_full_uncores()
            if self.satisfied:
                return
            self.take_partial_uncore(uncore)
            if self.satisfied:
                return

    def take_full_cores(self) -> None:
        for core in self.free_cores():
            cpus = self.index.core_cpus[core]
            if self.needed >= len(cpus):
                self.take(cpus)

    def take_remaining_cpus(self) -> None:
        for cpu in self.sort_cpus():
            self.take((cpu,))
            if self.satisfied:
                return

    def free_in_numa(self, numa: int) -> frozenset[int]:
        return frozenset(c for c in self.index.numa_cpus[numa] if c in self.free)

    def numa_range_needed(self, group_size: int) -> tuple[int, int]:
        """Fewest and most NUMA nodes the rest of the request could be spread over."""
        index = self.index
        groups = (len(index.online) - 1) // group_size + 1
        groups_per_numa = (groups - 1) // len(index.numa_nodes) + 1
        groups_needed = (self.needed - 1) // group_size + 1
        numas_with_free = sum(1 for k in self.numa_free.values() if k > 0)
        return (groups_needed - 1) // groups_per_numa + 1, min(groups_needed, numas_with_free)


def _by_free(ids: Iterable[int], free: dict[int, int]) -> list[int]:
    return sorted(ids, key=lambda i: (free[i], i))


# --- kubelet's takeByTopology* ---------------------------------------------------------


def _take_by_topology(
    index: _Index, available: frozenset[int], count: int, choice: _Choice
) -> frozenset[int]:
    """kubelet's ``staticPolicy.takeByTopology``: no admission checks, just the choice."""
    if choice.spread_numa:
        return _take_distributed(
            index,
            available,
            count,
            choice.group_size,
            spread_cores=choice.spread_cores,
            align_socket=choice.align_socket,
        )
    return _take_packed(
        index, available, count, uncore=choice.uncore, spread_cores=choice.spread_cores
    )


def _take_packed(
    index: _Index,
    available: frozenset[int],
    count: int,
    *,
    uncore: bool = False,
    spread_cores: bool = False,
) -> frozenset[int]:
    acc = _Accumulator(index, available, count, uncore=uncore, spread=spread_cores)
    if acc.satisfied:
        return frozenset()
    if acc.failed:
        raise _not_enough(count, len(available))
    if index.numa_first:
        acc.take_full_numa_nodes()
        if not acc.satisfied:
            acc.take_full_sockets()
    else:
        acc.take_full_sockets()
        if not acc.satisfied:
            acc.take_full_numa_nodes()
    if uncore and not acc.satisfied:
        acc.take_uncore_caches()
    if not spread_cores and not acc.satisfied:
        acc.take_full_cores()
    if not acc.satisfied:
        acc.take_remaining_cpus()
    if not acc.satisfied:
        raise CPUAllocationError(f"failed to allocate cpus: {acc.needed} of {count} missing")
    return frozenset(acc.result)


def _take_distributed(
    index: _Index,
    available: frozenset[int],
    count: int,
    group_size: int,
    *,
    spread_cores: bool = False,
    align_socket: bool = False,
) -> frozenset[int]:
    """``distribute-cpus-across-numa`` (KEP-2902), CPUs moving in groups of ``group_size``.

    ``align_socket`` (align-by-socket too): a NUMA node set within one socket beats any set
    spanning sockets whatever their balance, and a node gives at most what it holds in whole
    groups (the rest of the even share goes to the remainder).

    Two places where kubelet would loop forever (remainder CPUs that cannot be handed out in
    whole groups) count here as "this NUMA node subset cannot take the remainder"; a set
    chosen for its socket that then cannot take its remainder fails with kubelet's
    accounting error.
    """
    if count % group_size:
        return _take_packed(index, available, count, spread_cores=spread_cores)
    acc = _Accumulator(index, available, count, spread=spread_cores)
    if acc.satisfied:
        return frozenset()
    if acc.failed:
        raise _not_enough(count, len(available))

    numas = acc.sort_numa_nodes()
    free_of = {n: acc.numa_free[n] for n in numas}
    fewest, most = acc.numa_range_needed(group_size)
    for k in range(fewest, most + 1):
        best_balance = math.inf
        best_in_socket = False
        best_combo: tuple[int, ...] | None = None
        best_remainder: tuple[int, ...] = ()
        for combo in itertools.combinations(numas, k):
            if best_balance == 0 and (not align_socket or best_in_socket):
                break
            in_combo = [free_of[n] for n in combo]
            if sum(in_combo) < count:
                continue
            if sum(f // group_size for f in in_combo) * group_size < count:
                continue
            distribution = (count // k // group_size) * group_size
            if align_socket:
                distribution = min(distribution, *(f // group_size * group_size for f in in_combo))
            if any(f < distribution for f in in_combo):
                continue
            after = dict(free_of)
            for n in combo:
                after[n] -= distribution
            remainder = count - distribution * k
            balance, spill = _best_spill(after, combo, remainder, group_size)
            in_socket = align_socket and index.same_socket(combo)
            better = balance < best_balance
            if align_socket and in_socket != best_in_socket:
                better = in_socket
            if better:
                best_balance, best_combo, best_remainder = balance, combo, spill
                best_in_socket = in_socket
        if best_combo is None:
            continue

        distribution = (count // len(best_combo) // group_size) * group_size
        for numa in best_combo:  # no node gives more than it holds in whole groups
            distribution = min(distribution, acc.numa_free[numa] // group_size * group_size)
        for numa in best_combo:
            acc.take(
                _take_packed_or_nothing(
                    index, acc.free_in_numa(numa), distribution, spread_cores=spread_cores
                )
            )
        remainder = count - distribution * len(best_combo)
        while remainder > 0:
            progressed = False
            for numa in best_remainder:
                if remainder == 0:
                    break
                if acc.numa_free.get(numa, 0) < group_size:
                    continue
                acc.take(
                    _take_packed_or_nothing(
                        index, acc.free_in_numa(numa), group_size, spread_cores=spread_cores
                    )
                )
                remainder -= group_size
                progressed = True
            if not progressed:
                break
        if acc.needed > 0:
            raise CPUAllocationError(
                f"accounting error, not enough CPUs allocated, remaining: {acc.needed}"
            )
        if acc.needed < 0:
            raise CPUAllocationError(
                f"accounting error, too many CPUs allocated, remaining: {acc.needed}"
            )
        return frozenset(acc.result)

    return _take_packed(index, available, count, spread_cores=spread_cores)


def _best_spill(
    after: dict[int, int], combo: tuple[int, ...], remainder: int, group_size: int
) -> tuple[float, tuple[int, ...]]:
    """The balance score of ``combo`` and the NUMA nodes its remainder CPUs go to.

    The score is the standard deviation of the free CPUs per NUMA node once the combo's
    even share and the remainder are taken; among the subsets that can take the remainder
    (biggest subsets first), the lowest score wins, the first one on ties.
    """
    nodes = sorted(after)
    base = [after[n] for n in nodes]
    if remainder == 0:
        return _std(base), ()
    where = {n: i for i, n in enumerate(nodes)}
    best = math.inf
    best_subset: tuple[int, ...] = ()
    spill_to = [n for n in combo if after[n] >= group_size]
    for size in range(len(spill_to), 0, -1):
        for subset in itertools.combinations(spill_to, size):
            if sum(after[n] for n in subset) < remainder:
                continue
            local = base.copy()
            slots = [where[n] for n in subset]
            left = remainder
            while left > 0:
                progressed = False
                for i in slots:
                    if left == 0:
                        break
                    if local[i] < group_size:
                        continue
                    local[i] -= group_size
                    left -= group_size
                    progressed = True
                if not progressed:
                    break
            if left > 0:
                continue
            balance = _std(local)
            if balance < best:
                best, best_subset = balance, subset
                if best == 0:  # nothing scores lower, and ties keep the first
                    return best, best_subset
    return best, best_subset


def _take_packed_or_nothing(
    index: _Index, available: frozenset[int], count: int, *, spread_cores: bool
) -> frozenset[int]:
    # kubelet drops this error; the accounting check after the loop reports the shortfall.
    try:
        return _take_packed(index, available, count, spread_cores=spread_cores)
    except CPUAllocationError:
        return frozenset()


def _std(values: list[int]) -> float:
    """kubelet's standardDeviation: mean and result rounded to 3 decimals, half away from 0."""
    mean = _round3(sum(values) / len(values))
    return _round3(math.sqrt(sum((v - mean) * (v - mean) for v in values) / len(values)))


def _round3(x: float) -> float:
    scaled = x * 1000
    whole = math.trunc(scaled)
    if abs(scaled - whole) >= 0.5:
        whole += 1 if scaled > 0 else -1
    return whole / 1000
