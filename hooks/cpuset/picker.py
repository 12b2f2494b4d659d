"""Which exclusive CPUs a container gets: kubelet's static CPU manager policy, choice for choice.

An operator turns kubelet's static CPU manager off, puts crihook in front, and must see the
same CPUs picked. So this module follows kubelet's ``pkg/kubelet/cm/cpumanager`` (the
``cpu_assignment.go`` and ``policy_static.go`` of Kubernetes 1.33 and later, with the
``packed`` CPU sorting strategy and no uncore-cache alignment) and is checked against
kubelet's own test vectors (``tests/unit/test_cpuset_picker.py``):

- default: ``takeByTopologyNUMAPacked``. Whole NUMA nodes and whole sockets first (the
  bigger of the two levels first), then whole cores, then single threads; at every level
  the candidates with the fewest free CPUs come first, ties by id.
- ``spread_numa``: the ``distribute-cpus-across-numa`` option
  (``takeByTopologyNUMADistributed``): the request is split evenly over the fewest NUMA
  nodes that can hold it, remainders placed where they keep the nodes most balanced.
- ``full_cores``: the ``full-pcpus-only`` option: requests that are not whole cores are
  refused (kubelet's ``SMTAlignmentError``); with ``spread_numa`` CPUs move in whole cores.
- ``numa_affinity``: the NUMA nodes the topology merge chose; the CPUs of those nodes are
  taken first, the rest from anywhere (kubelet's ``allocateCPUs``).

Reserved CPUs by count are kubelet's reserved pick too: ``take_cpus(topo, topo.online, n)``.

Ids follow kubelet's ``CPUDetails``: cores, sockets and NUMA nodes are compared by the
number of free CPUs they hold, then by id, so a core's id must be unique on the machine
(``CPUInfo.core``). Per-topology indexes are built once and cached while the topology lives.
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

__all__ = ["CPUAllocationError", "SMTAlignmentError", "take_cpus"]


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
) -> frozenset[int]:
    """Pick ``count`` CPUs out of ``available`` exactly as kubelet's static policy would.

    ``available``: the CPUs that may be handed out (free and not reserved, plus any CPUs the
    caller lets this container reuse). ``full_cores`` counts as free physical CPUs the CPUs of
    ``available`` whose whole core is in ``available`` (kubelet's ``availablePhysicalCPUs``
    when every allocation is whole cores, the norm under ``full-pcpus-only``).

    Raises ``SMTAlignmentError`` (``full_cores``) or ``CPUAllocationError``: ``count`` below
    1, CPUs in ``available`` that are not online, or fewer CPUs than asked for.
    """
    index = _index(topology)
    if count < 1:
        raise CPUAllocationError(f"invalid request for {count} cpus: at least 1 cpu is needed")
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

    taken: frozenset[int] = frozenset()
    if numa_affinity is not None:
        aligned = frozenset(c for c in free if index.cpu_numa[c] in numa_affinity)
        taken = _take_by_topology(
            index, aligned, min(count, len(aligned)), spread_numa=spread_numa, group_size=group_size
        )
    rest = _take_by_topology(
        index, free - taken, count - len(taken), spread_numa=spread_numa, group_size=group_size
    )
    result = taken | rest
    if len(result) != count or not result <= free:  # a bug here must not pin two containers
        raise CPUAllocationError(
            f"internal error: picked cpus {_cpu_list(result)} for {count} of {_cpu_list(free)}"
        )
    return result


# --- the per-topology index ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Index:
    """What the picker asks of a topology, precomputed (kubelet's ``CPUTopology``)."""

    online: frozenset[int]
    cpu_core: dict[int, int]
    cpu_numa: dict[int, int]
    cpu_socket: dict[int, int]
    core_cpus: dict[int, tuple[int, ...]]
    numa_cpus: dict[int, frozenset[int]]
    socket_cpus: dict[int, frozenset[int]]
    numa_nodes: tuple[int, ...]
    numa_sockets: dict[int, tuple[int, ...]]
    socket_numas: dict[int, tuple[int, ...]]
    socket_cores: dict[int, tuple[int, ...]]
    numa_cores: dict[int, tuple[int, ...]]
    cpus_per_socket: int
    cpus_per_core: int
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
        core_cpus = {core: tuple(cpus) for core, cpus in group(cpu_core).items()}
        numa_cpus = {n: frozenset(cpus) for n, cpus in group(cpu_numa).items()}
        socket_cpus = {s: frozenset(cpus) for s, cpus in group(cpu_socket).items()}
        n_cpus = len(infos)
        return cls(
            online=frozenset(cpu_core),
            cpu_core=cpu_core,
            cpu_numa=cpu_numa,
            cpu_socket=cpu_socket,
            core_cpus=core_cpus,
            numa_cpus=numa_cpus,
            socket_cpus=socket_cpus,
            numa_nodes=tuple(sorted(numa_cpus)),
            numa_sockets=pairs((c.numa, c.socket) for c in infos),
            socket_numas=pairs((c.socket, c.numa) for c in infos),
            socket_cores=pairs((c.socket, c.core) for c in infos),
            numa_cores=pairs((c.numa, c.core) for c in infos),
            # kubelet's CPUsPerSocket / CPUsPerCore: integer averages over the machine.
            cpus_per_socket=n_cpus // len(socket_cpus),
            cpus_per_core=n_cpus // len(core_cpus),
            numa_first=len(socket_cpus) >= len(numa_cpus),
        )


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
    date as CPUs are taken, so each ordering below is a sort of a few dozen ids.
    """

    __slots__ = (
        "core_free",
        "free",
        "index",
        "needed",
        "numa_free",
        "pair_free",
        "result",
        "socket_free",
    )

    def __init__(self, index: _Index, available: Iterable[int], count: int) -> None:
        self.index = index
        self.free: set[int] = set(available)
        self.needed = count
        self.result: set[int] = set()
        free = self.free
        self.core_free: dict[int, int] = Counter(map(index.cpu_core.__getitem__, free))
        self.numa_free: dict[int, int] = Counter(map(index.cpu_numa.__getitem__, free))
        self.socket_free: dict[int, int] = Counter(map(index.cpu_socket.__getitem__, free))
        self.pair_free: dict[tuple[int, int], int] = Counter(
            (index.cpu_numa[c], index.cpu_socket[c]) for c in free
        )

    def take(self, cpus: AbstractSet[int] | tuple[int, ...]) -> None:
        for cpu in cpus:
            self.result.add(cpu)
            if cpu in self.free:
                self.free.remove(cpu)
                index = self.index
                numa, socket = index.cpu_numa[cpu], index.cpu_socket[cpu]
                self.core_free[index.cpu_core[cpu]] -= 1
                self.numa_free[numa] -= 1
                self.socket_free[socket] -= 1
                self.pair_free[numa, socket] -= 1
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
        free, core_cpus = self.free, self.index.core_cpus
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
    index: _Index, available: frozenset[int], count: int, *, spread_numa: bool, group_size: int
) -> frozenset[int]:
    """kubelet's ``staticPolicy.takeByTopology``: no admission checks, just the choice."""
    if spread_numa:
        return _take_distributed(index, available, count, group_size)
    return _take_packed(index, available, count)


def _take_packed(index: _Index, available: frozenset[int], count: int) -> frozenset[int]:
    acc = _Accumulator(index, available, count)
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
    if not acc.satisfied:
        acc.take_full_cores()
    if not acc.satisfied:
        acc.take_remaining_cpus()
    if not acc.satisfied:
        raise CPUAllocationError(f"failed to allocate cpus: {acc.needed} of {count} missing")
    return frozenset(acc.result)


def _take_distributed(
    index: _Index, available: frozenset[int], count: int, group_size: int
) -> frozenset[int]:
    """``distribute-cpus-across-numa`` (KEP-2902), CPUs moving in groups of ``group_size``.

    Two places where kubelet would loop forever (remainder CPUs that cannot be handed out in
    whole groups) count here as "this NUMA node subset cannot take the remainder".
    """
    if count % group_size:
        return _take_packed(index, available, count)
    acc = _Accumulator(index, available, count)
    if acc.satisfied:
        return frozenset()
    if acc.failed:
        raise _not_enough(count, len(available))

    numas = acc.sort_numa_nodes()
    free_of = {n: acc.numa_free[n] for n in numas}
    fewest, most = acc.numa_range_needed(group_size)
    for k in range(fewest, most + 1):
        best_balance = math.inf
        best_combo: tuple[int, ...] | None = None
        best_remainder: tuple[int, ...] = ()
        for combo in itertools.combinations(numas, k):
            if best_balance == 0:
                break
            in_combo = [free_of[n] for n in combo]
            if sum(in_combo) < count:
                continue
            if sum(f // group_size for f in in_combo) * group_size < count:
                continue
            distribution = (count // k // group_size) * group_size
            if any(f < distribution for f in in_combo):
                continue
            after = dict(free_of)
            for n in combo:
                after[n] -= distribution
            remainder = count - distribution * k
            balance, spill = _best_spill(after, combo, remainder, group_size)
            if balance < best_balance:
                best_balance, best_combo, best_remainder = balance, combo, spill
        if best_combo is None:
            continue

        distribution = (count // len(best_combo) // group_size) * group_size
        for numa in best_combo:
            acc.take(_take_packed_or_nothing(index, acc.free_in_numa(numa), distribution))
        remainder = count - distribution * len(best_combo)
        while remainder > 0:
            progressed = False
            for numa in best_remainder:
                if remainder == 0:
                    break
                if acc.numa_free.get(numa, 0) < group_size:
                    continue
                acc.take(_take_packed_or_nothing(index, acc.free_in_numa(numa), group_size))
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

    return _take_packed(index, available, count)


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


def _take_packed_or_nothing(index: _Index, available: frozenset[int], count: int) -> frozenset[int]:
    # kubelet drops this error; the accounting check after the loop reports the shortfall.
    try:
        return _take_packed(index, available, count)
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
