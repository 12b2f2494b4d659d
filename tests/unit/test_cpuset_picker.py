"""take_cpus against kubelet's own test vectors: the same machine, the same free CPUs, the
same request must give the same CPUs.

Ported from kubelet's ``pkg/kubelet/cm/cpumanager`` tests (Kubernetes 1.35/1.36):
``cpu_assignment_test.go`` (TestCPUAccumulator*, TestTakeByTopologyNUMAPacked with its
PreferAlignByUncoreCache cases, TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption,
TestTakeByTopologyNUMADistributed) and ``policy_static_test.go`` (TestStaticPolicyAdd with its
align-by-socket cases, TestStaticPolicyAddWithResvList, TestStaticPolicyAddWithUncoreAlignment,
TestTopologyAwareAllocateCPUs, TestStaticPolicyReuseCPUs, TestStaticPolicyDoNotReuseCPUs,
TestSMTAlignmentErrorText). Each case keeps kubelet's description as its id. The accumulator
and ``cpuGroupSize`` cases exercise the picker's internals (``_Accumulator``, ``_take_packed``,
``_take_distributed``) because kubelet's tests do the same to its internals; the public
``take_cpus`` is checked on every case it can express.

The machines are kubelet's (``tests/unit/kubelet_topologies.py``). The vectors kubelet has for
the option pairs come from its resize tests (not ported: crihook's picker does no resize); the
few rows for distribute-cpus-across-numa with align-by-socket follow kubelet's code by hand and
say so.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

from crihook.hooks.cpus import CPUAllocationError, SMTAlignmentError, take_cpus
from crihook.hooks.cpus.picker import (
    _Accumulator,
    _index,
    _take_distributed,
    _take_packed,
    take_reserved,
)
from crihook.hooks.node import read_topology
from crihook.hooks.node.topology import CPUInfo, Topology
from tests.lab.sysfs import OFFLINE_CPUS, write_sysfs
from tests.unit.kubelet_topologies import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT_LARGE,
    DUAL_SOCKET_MULTI_NUMA_UNCORE,
    DUAL_SOCKET_NO_HT,
    DUAL_SOCKET_SMT_UNCORE,
    DUAL_SOCKET_SUB_NUMA_MONO_UNCORE,
    LARGE_SINGLE_SOCKET_SMT_UNCORE,
    LARGE_SINGLE_SOCKET_UNCORE,
    MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT,
    PCORE_ECORE_MONO_UNCORE,
    QUAD_SOCKET_FOUR_WAY_HT,
    SINGLE_SOCKET_HT,
    SINGLE_SOCKET_MONO_UNCORE,
    SINGLE_SOCKET_NO_SMT_SMALL_UNCORE,
    SINGLE_SOCKET_SMT_SMALL_UNCORE,
    SMALL_DUAL_SOCKET_NO_SMT_UNCORE,
    SMALL_SINGLE_SOCKET_NO_SMT_UNCORE,
    TOPOLOGIES,
    TRIPLE_SOCKET_HT,
    UNCORE_DUAL_SOCKET_NO_SMT,
    UNCORE_SINGLE_SOCKET_MULTI_NUMA,
    UNCORE_SINGLE_SOCKET_NO_SMT,
    UNCORE_SINGLE_SOCKET_SMT,
    cpuset,
)

S1 = SINGLE_SOCKET_HT
S2 = DUAL_SOCKET_HT
S2NOHT = DUAL_SOCKET_NO_HT
S3 = TRIPLE_SOCKET_HT
QUAD = QUAD_SOCKET_FOUR_WAY_HT
MULTI = DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT
FAKE = MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT
LARGE = DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT_LARGE


def acc(topology: Topology, available: AbstractSet[int], count: int = 0) -> _Accumulator:
    return _Accumulator(_index(topology), available, count)


def cpus_in_socket(topology: Topology, socket: int) -> frozenset[int]:
    return frozenset(c.id for c in topology.cpus.values() if c.socket == socket)


# --- TestCPUAccumulatorFreeSockets / FreeNUMANodes / FreeSocketsAndNUMANodes ------------

FREE_SOCKETS = [
    ("single socket HT, 1 socket free", S1, cpuset("0-7"), [0]),
    ("single socket HT, 0 sockets free", S1, cpuset("1-7"), []),
    ("dual socket HT, 2 sockets free", S2, cpuset("0-11"), [0, 1]),
    ("dual socket HT, 1 socket free", S2, cpuset("0-9,11"), [1]),
    ("dual socket HT, 0 sockets free", S2, cpuset("0,2-9,11"), []),
    ("dual socket, multi numa per socket, HT, 2 sockets free", MULTI, cpuset("0-79"), [0, 1]),
    ("dual socket, multi numa per socket, HT, 1 sockets free", MULTI, cpuset("1-79"), [1]),
    ("dual socket, multi numa per socket, HT, 0 sockets free", MULTI, cpuset("1-78"), []),
    ("dual numa, multi socket per per socket, HT, 4 sockets free", FAKE, cpuset("0-79"),
     [0, 1, 2, 3]),
    ("dual numa, multi socket per per socket, HT, 3 sockets free", FAKE, cpuset("0-19,21-79"),
     [0, 1, 3]),
    ("dual numa, multi socket per per socket, HT, 2 sockets free", FAKE, cpuset("0-59,61-78"),
     [0, 1]),
    ("dual numa, multi socket per per socket, HT, 1 sockets free", FAKE,
     cpuset("1-19,21-38,41-60,61-78"), [1]),
    ("dual numa, multi socket per per socket, HT, 0 sockets free", FAKE,
     cpuset("0-40,42-49,51-68,71-79"), []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "available", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in FREE_SOCKETS],
)
def test_free_sockets(topology: Topology, available: frozenset[int], expected: list[int]) -> None:
    # kubelet sorts this one before comparing.
    assert sorted(acc(topology, available).free_sockets()) == expected


FREE_NUMA_NODES = [
    ("single socket HT, 1 NUMA node free", S1, cpuset("0-7"), [0]),
    ("single socket HT, 0 NUMA Node free", S1, cpuset("1-7"), []),
    ("dual socket HT, 2 NUMA Node free", S2, cpuset("0-11"), [0, 1]),
    ("dual socket HT, 1 NUMA Node free", S2, cpuset("0-9,11"), [1]),
    ("dual socket HT, 0 NUMA node free", S2, cpuset("0,2-9,11"), []),
    ("dual socket, multi numa per socket, HT, 4 NUMA Node free", MULTI, cpuset("0-79"),
     [0, 1, 2, 3]),
    ("dual socket, multi numa per socket, HT, 3 NUMA node free", MULTI, cpuset("1-79"),
     [1, 2, 3]),
    ("dual socket, multi numa per socket, HT, 2 NUMA node free", MULTI, cpuset("1-9,11-79"),
     [2, 3]),
    ("dual socket, multi numa per socket, HT, 1 NUMA node free", MULTI,
     cpuset("1-9,11-59,61-79"), [3]),
    ("dual socket, multi numa per socket, HT, 0 NUMA node free", MULTI,
     cpuset("1-9,11-59,61-78"), []),
    ("dual numa, multi socket per per socket, HT, 2 NUMA node free", FAKE, cpuset("0-79"),
     [0, 1]),
    ("dual numa, multi socket per per socket, HT, 1 NUMA node free", FAKE, cpuset("0-9,11-79"),
     [1]),
    ("dual numa, multi socket per per socket, HT, 0 sockets free", FAKE,
     cpuset("0-9,11-59,61-79"), []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "available", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in FREE_NUMA_NODES],
)
def test_free_numa_nodes(
    topology: Topology, available: frozenset[int], expected: list[int]
) -> None:
    assert acc(topology, available).free_numa_nodes() == expected


FREE_SOCKETS_AND_NUMA_NODES = [
    ("dual socket, multi numa per socket, HT, 2 Socket/4 NUMA Node free", cpuset("0-79"),
     [0, 1], [0, 1, 2, 3]),
    ("dual socket, multi numa per socket, HT, 1 Socket/3 NUMA node free", cpuset("1-79"),
     [1], [1, 2, 3]),
    ("dual socket, multi numa per socket, HT, 1 Socket/ 2 NUMA node free",
     cpuset("1-9,11-79"), [1], [2, 3]),
    ("dual socket, multi numa per socket, HT, 0 Socket/ 2 NUMA node free",
     cpuset("1-59,61-79"), [], [1, 3]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("available", "sockets", "numa_nodes"),
    [pytest.param(*case[1:], id=case[0]) for case in FREE_SOCKETS_AND_NUMA_NODES],
)
def test_free_sockets_and_numa_nodes(
    available: frozenset[int], sockets: list[int], numa_nodes: list[int]
) -> None:
    a = acc(MULTI, available)
    assert (a.free_numa_nodes(), a.free_sockets()) == (numa_nodes, sockets)


# --- TestCPUAccumulatorFreeCores / FreeCPUs / Take -------------------------------------

FREE_CORES = [
    ("single socket HT, 4 cores free", S1, cpuset("0-7"), [0, 1, 2, 3]),
    ("single socket HT, 3 cores free", S1, cpuset("0-2,4-6"), [0, 1, 2]),
    ("single socket HT, 3 cores free (1 partially consumed)", S1, cpuset("0-6"), [0, 1, 2]),
    ("single socket HT, 0 cores free", S1, cpuset(""), []),
    ("single socket HT, 0 cores free (4 partially consumed)", S1, cpuset("0-3"), []),
    ("dual socket HT, 6 cores free", S2, cpuset("0-11"), [0, 2, 4, 1, 3, 5]),
    ("dual socket HT, 5 cores free (1 consumed from socket 0)", S2, cpuset("1-5,7-11"),
     [2, 4, 1, 3, 5]),
    ("dual socket HT, 4 cores free (1 consumed from each socket)", S2, cpuset("2-5,8-11"),
     [2, 4, 3, 5]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "available", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in FREE_CORES],
)
def test_free_cores(topology: Topology, available: frozenset[int], expected: list[int]) -> None:
    assert acc(topology, available).free_cores() == expected


FREE_CPUS = [
    ("single socket HT, 8 cpus free", S1, cpuset("0-7"), [0, 4, 1, 5, 2, 6, 3, 7]),
    ("single socket HT, 5 cpus free", S1, cpuset("3-7"), [4, 5, 6, 3, 7]),
    ("dual socket HT, 12 cpus free", S2, cpuset("0-11"),
     [0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 11 cpus free", S2, cpuset("1-11"), [6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 10 cpus free", S2, cpuset("1-5,7-11"), [2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("triple socket HT, 12 cpus free", S3, cpuset("0-3,6-13"),
     [12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "available", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in FREE_CPUS],
)
def test_free_cpus(topology: Topology, available: frozenset[int], expected: list[int]) -> None:
    assert acc(topology, available).sort_cpus() == expected


TAKE = [
    ("take 0 cpus from a single socket HT, require 1", cpuset("0-7"), [cpuset("")], 1,
     False, False),
    ("take 0 cpus from a single socket HT, require 1, none available", cpuset(""),
     [cpuset("")], 1, False, True),
    ("take 1 cpu from a single socket HT, require 1", cpuset("0-7"), [cpuset("0")], 1,
     True, False),
    ("take 1 cpu from a single socket HT, require 2", cpuset("0-7"), [cpuset("0")], 2,
     False, False),
    ("take 2 cpu from a single socket HT, require 4, expect failed", cpuset("0-2"),
     [cpuset("0"), cpuset("1")], 4, False, True),
    ("take all cpus one at a time from a single socket HT, require 8", cpuset("0-7"),
     [cpuset(str(i)) for i in range(8)], 8, True, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("available", "takes", "count", "satisfied", "failed"),
    [pytest.param(*case[1:], id=case[0]) for case in TAKE],
)
def test_accumulator_take(
    available: frozenset[int],
    takes: list[frozenset[int]],
    count: int,
    satisfied: bool,
    failed: bool,
) -> None:
    a = acc(S1, available, count)
    for cpus in takes:
        a.take(cpus)
    assert (a.satisfied, a.failed) == (satisfied, failed)
    for cpus in takes:
        assert not cpus & a.free
        assert cpus <= a.result
    assert a.needed == count - sum(len(c) for c in takes)


# --- TestTakeByTopologyNUMAPacked -------------------------------------------------------

NOT_ENOUGH_5_OF_4 = "not enough cpus available to satisfy request: requested=5, available=4"

COMMON_TAKE_BY_TOPOLOGY = [
    ("take more cpus than are available from single socket with HT", S1, cpuset("0,2,4,6"), 5,
     NOT_ENOUGH_5_OF_4, cpuset("")),
    ("take zero cpus from single socket with HT", S1, cpuset("0-7"), 0, "", cpuset("")),
    ("take one cpu from single socket with HT", S1, cpuset("0-7"), 1, "", cpuset("0")),
    ("take one cpu from single socket with HT, some cpus are taken", S1, cpuset("1,3,5-7"), 1,
     "", cpuset("6")),
    ("take two cpus from single socket with HT", S1, cpuset("0-7"), 2, "", cpuset("0,4")),
    ("take all cpus from single socket with HT", S1, cpuset("0-7"), 8, "", cpuset("0-7")),
    ("take two cpus from single socket with HT, only one core totally free", S1,
     cpuset("0-3,6"), 2, "", cpuset("2,6")),
    ("take a socket of cpus from dual socket with HT", S2, cpuset("0-11"), 6, "",
     cpuset("0,2,4,6,8,10")),
    ("take a socket of cpus from dual socket with multi-numa-per-socket with HT", MULTI,
     cpuset("0-79"), 40, "", cpuset("0-19,40-59")),
    ("take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT", MULTI,
     cpuset("0-79"), 20, "", cpuset("0-9,40-49")),
    ("take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, "
     "with 1 NUMA node already taken", MULTI, cpuset("10-39,50-79"), 20, "",
     cpuset("10-19,50-59")),
    ("take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket "
     "with HT", MULTI, cpuset("0-79"), 60, "", cpuset("0-29,40-69")),
    ("take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket "
     "with HT, a core taken", MULTI, cpuset("1-39,41-79"), 60, "", cpuset("10-39,50-79")),
]  # fmt: skip

PACKED_ONLY = [
    ("take one cpu from dual socket with HT - core from Socket 0", S2, cpuset("1-5,7-11"), 1,
     "", cpuset("2")),
    ("allocate 4 full cores with 3 coming from the first NUMA node (filling it up) and 1 "
     "coming from the second NUMA node", S2, cpuset("0-11"), 8, "", cpuset("0,6,2,8,4,10,1,7")),
    ("allocate 32 full cores with 30 coming from the first 3 NUMA nodes (filling them up) "
     "and 2 coming from the fourth NUMA node", MULTI, cpuset("0-79"), 64, "",
     cpuset("0-29,40-69,30,31,70,71")),
]  # fmt: skip


# TestTakeByTopologyNUMAPacked's "Test cases for PreferAlignByUncoreCache".
PACKED_UNCORE = [
    ("take cpus from two full UncoreCaches and partial from a single UncoreCache",
     UNCORE_SINGLE_SOCKET_NO_SMT, cpuset("1-15"), 10, "", cpuset("1,2,4-11")),
    ("take one cpu from dual socket with HT - core from Socket 0", S2, cpuset("1-5,7-11"), 1,
     "", cpuset("1")),
    ("take first available UncoreCache from first socket", UNCORE_DUAL_SOCKET_NO_SMT,
     cpuset("0-15"), 4, "", cpuset("0-3")),
    ("take all available UncoreCache from first socket", UNCORE_DUAL_SOCKET_NO_SMT,
     cpuset("2-15"), 6, "", cpuset("2-7")),
    ("take first available UncoreCache from second socket", UNCORE_DUAL_SOCKET_NO_SMT,
     cpuset("8-15"), 4, "", cpuset("8-11")),
    ("take first available UncoreCache from available NUMA", UNCORE_SINGLE_SOCKET_MULTI_NUMA,
     cpuset("3,4-8,12"), 2, "", cpuset("4,5")),
    ("take cpus from best available UncoreCache group of multi uncore cache single socket - "
     "SMT enabled", UNCORE_SINGLE_SOCKET_SMT, cpuset("2-3,10-11,4-7,12-15"), 6, "",
     cpuset("4-6,12-14")),
    ("take cpus from multiple UncoreCache of single socket - SMT enabled",
     UNCORE_SINGLE_SOCKET_SMT, cpuset("1-7,9-15"), 10, "", cpuset("4-7,12-15,1,9")),
]  # fmt: skip

PACKED_CASES = [(*case, False) for case in COMMON_TAKE_BY_TOPOLOGY + PACKED_ONLY] + [
    (*case, True) for case in PACKED_UNCORE
]


@pytest.mark.parametrize(
    ("topology", "available", "count", "error", "expected", "uncore"),
    [pytest.param(*case[1:], id=case[0]) for case in PACKED_CASES],
)
def test_take_by_topology_numa_packed(
    topology: Topology,
    available: frozenset[int],
    count: int,
    error: str,
    expected: frozenset[int],
    uncore: bool,
) -> None:
    if error:
        with pytest.raises(CPUAllocationError) as raised:
            _take_packed(_index(topology), available, count, uncore=uncore)
        assert str(raised.value) == error
        with pytest.raises(CPUAllocationError) as raised:
            take_cpus(topology, available, count, uncore_cache=uncore)
        assert str(raised.value) == error
        return
    assert _take_packed(_index(topology), available, count, uncore=uncore) == expected
    assert take_cpus(topology, available, count, uncore_cache=uncore) == expected


# --- TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption (distribute-cpus-across-cores) -

SPREAD_CORES = [
    ("take a socket of cpus from single socket with HT, 3 cpus", S1, cpuset("0-7"), 3,
     cpuset("0-2")),
    ("take a socket of cpus from dual socket with HT, 2 cpus", S2, cpuset("0-11"), 2,
     cpuset("0,2")),
    ("take a socket of cpus from dual socket with HT, 3 cpus", S2, cpuset("0-11"), 3,
     cpuset("0,2,4")),
    ("take a socket of cpus from dual socket with HT, 6 cpus", S2, cpuset("0-11"), 6,
     cpuset("0,2,4,6,8,10")),
    ("take cpus from dual socket with HT, 8 cpus", S2, cpuset("0-11"), 8,
     cpuset("0,2,4,6,8,10,1,3")),
    ("take a socket of cpus from dual socket without HT, 2 cpus", S2NOHT, cpuset("0-7"), 2,
     cpuset("0,1")),
    # kubelet's own note: the option does not care about socket and NUMA ranking here.
    ("take a socket of cpus from dual socket with multi numa per socket and HT, 12 cpus", MULTI,
     cpuset("0-79"), 8, cpuset("0-7")),
    ("take a socket of cpus from quad socket four way with HT, 12 cpus", QUAD,
     cpuset("0-287"), 12, cpuset("0-2,9-10,13-14,21-22,25-26,33")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "available", "count", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in SPREAD_CORES],
)
def test_take_by_topology_spread_over_cores(
    topology: Topology, available: frozenset[int], count: int, expected: frozenset[int]
) -> None:
    assert _take_packed(_index(topology), available, count, spread_cores=True) == expected
    assert take_cpus(topology, available, count, spread_cores=True) == expected


def test_spread_order_is_socket_by_socket_by_cpu_id() -> None:
    a = _Accumulator(_index(S2), cpuset("1-11"), 0, spread=True)
    # Sockets by free CPUs (socket 0 has 5, socket 1 has 6), then CPU ids.
    assert a.sort_cpus() == [2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]


# --- TestTakeByTopologyNUMADistributed --------------------------------------------------

EXTENDED_TAKE_BY_TOPOLOGY = [
    ("allocate 4 full cores with 2 distributed across each NUMA node", S2, cpuset("0-11"), 8,
     1, "", cpuset("0,6,2,8,1,7,3,9")),
    ("allocate 32 full cores with 8 distributed across each NUMA node", MULTI, cpuset("0-79"),
     64, 1, "", cpuset("0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77")),
    ("allocate 24 full cores with 8 distributed across the first 3 NUMA nodes", MULTI,
     cpuset("0-79"), 48, 1, "", cpuset("0-7,10-17,20-27,40-47,50-57,60-67")),
    ("allocate 24 full cores with 8 distributed across the first 3 NUMA nodes (taking all "
     "but 2 from the first NUMA node)", MULTI, cpuset("1-29,32-39,41-69,72-79"), 48, 1, "",
     cpuset("1-8,10-17,20-27,41-48,50-57,60-67")),
    ("allocate 24 full cores with 8 distributed across the last 3 NUMA nodes (even though "
     "all 8 could be allocated from the first NUMA node)", MULTI,
     cpuset("2-29,31-39,42-69,71-79"), 48, 1, "", cpuset("10-17,20-27,31-38,50-57,60-67,71-78")),
    # kubelet lists this case twice, word for word; it runs once here.
    ("allocate 8 full cores with 2 distributed across each NUMA node", MULTI,
     cpuset("0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71"), 16, 1, "",
     cpuset("0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71")),
]  # fmt: skip

DISTRIBUTED_ONLY = [
    ("take one cpu from dual socket with HT - core from Socket 0", S2, cpuset("1-5,7-11"), 1,
     1, "", cpuset("1")),
    ("take one cpu from dual socket with HT - core from Socket 0 - cpuGroupSize 2", S2,
     cpuset("1-5,7-11"), 1, 2, "", cpuset("2")),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes", MULTI,
     cpuset("0-79"), 26, 1, "", cpuset("0-6,10-16,40-45,50-55")),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)",
     MULTI, cpuset("0-79"), 26, 2, "", cpuset("0-6,10-15,40-46,50-55")),
    ("allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU "
     "spilling over to each of NUMA 0, 1", MULTI, cpuset("0-79"), 62, 1, "",
     cpuset("0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76")),
    ("allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs "
     "spilling over to each of NUMA 0, 1, 2 (cpuGroupSize 2)", MULTI, cpuset("0-79"), 62, 2,
     "", cpuset("0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76")),
    ("allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU "
     "spilling over to each of NUMA 2, 3 (to keep balance)", MULTI,
     cpuset("0-8,10-18,20-39,40-48,50-58,60-79"), 62, 1, "",
     cpuset("0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77")),
    ("allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs "
     "spilling over to each of NUMA 0, 2, 3 (to keep balance with cpuGroupSize 2)", MULTI,
     cpuset("0-8,10-18,20-39,40-48,50-58,60-79"), 62, 2, "",
     cpuset("0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77")),
    ("ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the "
     "request", MULTI, cpuset("0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76"), 34, 1, "",
     cpuset("0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74")),
    ("ensure previous failure encountered on live machine has been fixed (1/1)", LARGE,
     cpuset("0,128,30,31,158,159,43-47,171-175,62,63,190,191,75-79,203-207,94,96,222,223,"
            "101-111,229-239,126,127,254,255"), 28, 1, "",
     cpuset("43-47,75-79,96,101-105,171-174,203-206,229-232")),
]  # fmt: skip

DISTRIBUTED_CASES = (
    [
        (name, topology, available, count, 1, error, expected)
        for name, topology, available, count, error, expected in COMMON_TAKE_BY_TOPOLOGY
    ]
    + EXTENDED_TAKE_BY_TOPOLOGY
    + DISTRIBUTED_ONLY
)


@pytest.mark.parametrize(
    ("topology", "available", "count", "group_size", "error", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in DISTRIBUTED_CASES],
)
def test_take_by_topology_numa_distributed(
    topology: Topology,
    available: frozenset[int],
    count: int,
    group_size: int,
    error: str,
    expected: frozenset[int],
) -> None:
    full_cores = group_size > 1
    if error:
        with pytest.raises(CPUAllocationError) as raised:
            _take_distributed(_index(topology), available, count, group_size)
        assert str(raised.value) == error
        with pytest.raises(CPUAllocationError) as raised:
            take_cpus(topology, available, count, spread_numa=True, full_cores=full_cores)
        assert str(raised.value) == error
        return
    assert _take_distributed(_index(topology), available, count, group_size) == expected
    # take_cpus derives the group size from full_cores, which refuses partial cores.
    if count % group_size == 0:
        picked = take_cpus(topology, available, count, spread_numa=True, full_cores=full_cores)
        assert picked == expected


# --- Reserved CPUs (NewStaticPolicy: takeByTopology over all CPUs) -----------------------

RESERVED = [
    # NewStaticPolicy's own comment: 8 CPUs with HT, 2 reserved -> {0, 4}.
    ("single socket HT, 2 reserved", S1, 2, cpuset("0,4")),
    # TestStaticPolicyAdd "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU" leaves 4 free.
    ("single socket HT, 1 reserved", S1, 1, cpuset("0")),
    # TestStaticPolicyStart: 'not all reserved cpus: "0,6" are present in defaultCpuSet'.
    ("dual socket HT, 2 reserved", S2, 2, cpuset("0,6")),
    ("dual socket HT, 1 reserved", S2, 1, cpuset("0")),
    ("dual socket no HT, 1 reserved", S2NOHT, 1, cpuset("0")),
    # TestStaticPolicyAdd "...AlignBySocket..." topologies reserve CPU 0.
    ("dual socket multi numa per socket HT, 1 reserved", MULTI, 1, cpuset("0")),
]


@pytest.mark.parametrize(
    ("topology", "count", "expected"), [pytest.param(*case[1:], id=case[0]) for case in RESERVED]
)
def test_reserved_cpus_by_count(topology: Topology, count: int, expected: frozenset[int]) -> None:
    assert take_reserved(topology, count) == expected
    assert take_cpus(topology, topology.online, count) == expected


RESERVED_WITH_OPTIONS = [
    # NewStaticPolicy reserves with takeByTopology, which follows the policy options but makes
    # no admission check: an odd count under full-pcpus-only is picked, not refused.
    pytest.param(S2, 3, {"full_cores": True}, cpuset("0,6,2"), id="full-pcpus-odd-count"),
    pytest.param(
        MULTI, 3, {"full_cores": True, "spread_numa": True}, cpuset("0,40,1"),
        id="full-pcpus-distributed-odd-count-falls-back-to-packed",
    ),
    pytest.param(
        MULTI, 4, {"full_cores": True, "spread_numa": True}, cpuset("0,40,1,41"),
        id="full-pcpus-distributed-whole-cores",
    ),
    pytest.param(S1, 2, {"spread_cores": True}, cpuset("0,1"), id="spread-cores"),
    pytest.param(
        UNCORE_SINGLE_SOCKET_SMT, 6, {"uncore_cache": True}, cpuset("0-2,8-10"), id="uncore"
    ),
    pytest.param(S1, 0, {}, cpuset(""), id="none"),
]  # fmt: skip


@pytest.mark.parametrize(("topology", "count", "flags", "expected"), RESERVED_WITH_OPTIONS)
def test_reserved_pick_follows_the_policy_options(
    topology: Topology, count: int, flags: dict[str, bool], expected: frozenset[int]
) -> None:
    assert take_reserved(topology, count, **flags) == expected


def test_reserving_more_cpus_than_the_node_has_fails() -> None:
    with pytest.raises(CPUAllocationError, match="requested=9, available=8"):
        take_reserved(S1, 9)


# --- TestStaticPolicyAdd / TestStaticPolicyAddWithResvList -------------------------------

_QUAD_ALL = QUAD.online
_QUAD_SOCK0 = cpus_in_socket(QUAD, 0)
_QUAD_SOCK1 = cpus_in_socket(QUAD, 1)
_QUAD_FEW = cpuset("1,25,13,38,2,9,11,35,23,48,12,51,53,173,113,233,54,61")
_QUAD_SOCK1_PLUS = _QUAD_SOCK1 | cpuset("10,34,22,47,53,173,61,181,108,228,115,235")

# (description, topology, reserved count, explicit reserved or None, kubelet's default
# (shared) cpuset, request, expected cpuset or error message)
OPTIONS_INSENSITIVE = [
    ("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", S1, 1, None, cpuset("0,1,4,5"),
     2, cpuset("1,5")),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket", S2, 1, None,
     cpuset("0,1,3-11"), 6, cpuset("1,3,5,7,9,11")),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores", S2, 1, None,
     cpuset("0,2-4,6-11"), 6, cpuset("2,3,4,8,9,10")),
    ("GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket", S2NOHT, 1, None,
     cpuset("0,1,3-7"), 4, cpuset("4-7")),
    ("GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores", S2NOHT, 1, None,
     cpuset("0,1,3,6,7"), 4, cpuset("1,3,6,7")),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore", S2, 1, None,
     cpuset("0,1,3-11"), 8, cpuset("1,3,4,5,7,9,10,11")),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocSock0", QUAD, 0, None,
     _QUAD_ALL - cpuset("3,11,4,5,6,7"), 72, _QUAD_SOCK0),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllFullCoresFromThreeSockets",
     QUAD, 0, None, _QUAD_FEW, 12, cpuset("1,25,13,38,11,35,23,48,53,173,113,233")),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllSock1+FullCore", QUAD, 0,
     None, _QUAD_SOCK1_PLUS, 76, _QUAD_SOCK1 | cpuset("10,34,22,47")),
]  # fmt: skip

DEFAULT_OPTIONS = [
    ("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", S1, 1, None, cpuset("0-7"), 1,
     cpuset("4")),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocCPUs", QUAD, 0, None,
     cpuset("10,11,53,67,52"), 5, cpuset("10,11,53,67,52")),
    ("GuPodSingleCore, SingleSocketHT, ExpectError", S1, 1, None, cpuset("0-7"), 8,
     "not enough cpus available to satisfy request: requested=8, available=7"),
    ("GuPodMultipleCores, DualSocketHT, NoAllocExpectError", S2, 1, None,
     cpuset("0,4-11"), 10,
     "not enough cpus available to satisfy request: requested=10, available=8"),
    ("GuPodMultipleCores, SingleSocketHT, NoAllocExpectError", S1, 1, None, cpuset("0,7"), 2,
     "not enough cpus available to satisfy request: requested=2, available=1"),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, NoAlloc", QUAD, 0, None,
     cpuset("10,11,53,37,55,67,52"), 76,
     "not enough cpus available to satisfy request: requested=76, available=7"),
    # TestStaticPolicyAddWithResvList
    ("WithResvList: GuPodSingleCore, SingleSocketHT, ExpectError", S1, 1, cpuset("0"),
     cpuset("0-7"), 8,
     "not enough cpus available to satisfy request: requested=8, available=7"),
    ("WithResvList: GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", S1, 2, cpuset("0,1"),
     cpuset("0-7"), 1, cpuset("4")),
    ("WithResvList: GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", S1, 2,
     cpuset("0,1"), cpuset("0,1,4,5"), 2, cpuset("4,5")),
]  # fmt: skip

FULL_PCPUS_ONLY = [
    ("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", S1, 1, None, cpuset("0-7"), 1,
     "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocOneCPUs", QUAD, 8, None,
     _QUAD_ALL, 15, "SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4"),
    ("GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU", S2, 2, cpuset("1,6"),
     cpuset("0,2-5,7-11"), 10,
     "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, "
     "requested CPUs = 10, CPUs per core = 2"),
    ("GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs", S2, 2, None,
     cpuset("1-5,7-11"), 10, cpuset("1-5,7-11")),
    ("GuPodManyCores, topoDualSocketHT, ExpectAllocAllCPUs", S2, 2, cpuset("0,6"),
     cpuset("1-5,7-11"), 10, cpuset("1-5,7-11")),
]  # fmt: skip

STATIC_POLICY_ADD = (
    [(f"options=nil {c[0]}", *c[1:], False) for c in OPTIONS_INSENSITIVE]
    + [(f"options=full-pcpus-only {c[0]}", *c[1:], True) for c in OPTIONS_INSENSITIVE]
    + [(c[0], *c[1:], False) for c in DEFAULT_OPTIONS]
    + [(f"full-pcpus-only {c[0]}", *c[1:], True) for c in FULL_PCPUS_ONLY]
)


@pytest.mark.parametrize(
    ("topology", "num_reserved", "reserved", "default", "count", "expected", "full_cores"),
    [pytest.param(*case[1:], id=case[0]) for case in STATIC_POLICY_ADD],
)
def test_static_policy_add(
    topology: Topology,
    num_reserved: int,
    reserved: frozenset[int] | None,
    default: frozenset[int],
    count: int,
    expected: frozenset[int] | str,
    full_cores: bool,
) -> None:
    # NewStaticPolicy: explicit reserved CPUs, else takeByTopology(all CPUs, count).
    if reserved is None:
        reserved = frozenset()
        if num_reserved:
            reserved = take_cpus(topology, topology.online, num_reserved)
    assert len(reserved) == num_reserved
    available = default - reserved  # GetAvailableCPUs: the shared pool minus the reserved
    if isinstance(expected, str):
        with pytest.raises(CPUAllocationError) as raised:
            take_cpus(topology, available, count, full_cores=full_cores)
        assert str(raised.value) == expected
        assert isinstance(raised.value, SMTAlignmentError) == expected.startswith("SMT")
    else:
        assert take_cpus(topology, available, count, full_cores=full_cores) == expected


# --- TestTopologyAwareAllocateCPUs and the align-by-socket=false hint case ---------------

TOPOLOGY_AWARE = [
    ("Request 2 CPUs, No BitMask", S2, cpuset("0-11"), 2, None, cpuset("0,6")),
    ("Request 2 CPUs, BitMask on Socket 0", S2, cpuset("0-11"), 2, {0}, cpuset("0,6")),
    ("Request 2 CPUs, BitMask on Socket 1", S2, cpuset("0-11"), 2, {1}, cpuset("1,7")),
    ("Request 8 CPUs, BitMask on Socket 0", S2, cpuset("0-11"), 8, {0},
     cpuset("0,6,2,8,4,10,1,7")),
    ("Request 8 CPUs, BitMask on Socket 1", S2, cpuset("0-11"), 8, {1},
     cpuset("1,7,3,9,5,11,0,6")),
    # TestStaticPolicyAdd "Align by socket: false, cpu's are taken strictly from NUMA nodes
    # in hint": 1 reserved (CPU 0), shared pool {2, 11, 21, 22}, hint NUMA {0, 2}.
    ("Align by socket: false, cpu's are taken strictly from NUMA nodes in hint", MULTI,
     cpuset("2,11,21,22"), 2, {0, 2}, cpuset("2,21")),
]  # fmt: skip

# TestStaticPolicyAdd's alignBySocketOptionTestCases with align-by-socket on: the hint's NUMA
# nodes widen to their sockets, and the packed pick keeps to one socket.
TOPOLOGY_AWARE_BY_SOCKET = [
    ("Align by socket: true, cpu's within same socket of numa in hint are part of allocation",
     MULTI, cpuset("2,11,21,22"), 2, {0, 2}, cpuset("2,11")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "available", "count", "numa", "expected", "align_socket"),
    [pytest.param(*case[1:], False, id=case[0]) for case in TOPOLOGY_AWARE]
    + [pytest.param(*case[1:], True, id=case[0]) for case in TOPOLOGY_AWARE_BY_SOCKET],
)
def test_topology_aware_allocate(
    topology: Topology,
    available: frozenset[int],
    count: int,
    numa: set[int] | None,
    expected: frozenset[int],
    align_socket: bool,
) -> None:
    picked = take_cpus(topology, available, count, numa_affinity=numa, align_socket=align_socket)
    assert picked == expected


# --- TestStaticPolicyAddWithUncoreAlignment ------------------------------------------------

FULL_UNCORE = {"full_cores": True, "uncore_cache": True}
UNCORE = {"uncore_cache": True}


def uncores_of(topology: Topology, cpus: AbstractSet[int]) -> frozenset[int]:
    """kubelet's getPodUncoreCacheIDs, for one container's CPUs."""
    return frozenset(topology.cpus[c].l3 for c in cpus)


def cpus_of_uncores(topology: Topology, *uncores: int) -> frozenset[int]:
    return frozenset(c.id for c in topology.cpus.values() if c.l3 in uncores)


DSMT = DUAL_SOCKET_SMT_UNCORE
SMALL_SMT = SINGLE_SOCKET_SMT_SMALL_UNCORE
MONO = DUAL_SOCKET_SUB_NUMA_MONO_UNCORE
_DSMT_RESERVED = cpuset("0,1,96,97,192,193,288,289")  # 4 CPUs of uncore 0, 4 of uncore 12
_DSMT_CLEAN = DSMT.online - cpus_of_uncores(DSMT, 0, 12)

# (description, topology, reserved, options, kubelet's default cpuset (the test removes the
# reserved CPUs from it), the pod's app containers' requests in order, the uncore caches the
# pod's CPUs are on or None, the first container's CPUs or None)
UNCORE_ALIGNMENT = [
    ("GuPodSingleContainerSaturating, DualSocketHTUncore, ExpectAllocOneUncore, "
     "FullUncoreAvail", DSMT, _DSMT_RESERVED, FULL_UNCORE, _DSMT_CLEAN, [16], {1}, None),
    ("GuPodMainAndSidecarContainer, DualSocketHTUncore, ExpectAllocOneUncore, "
     "FullUncoreAvail", DSMT, _DSMT_RESERVED, FULL_UNCORE, _DSMT_CLEAN, [12, 2], {1}, None),
    ("GuPodSidecarAndMainContainer, DualSocketHTUncore, ExpectAllocOneUncore, "
     "FullUncoreAvail", DSMT, _DSMT_RESERVED, FULL_UNCORE, _DSMT_CLEAN, [2, 12], {1}, None),
    ("GuPodMainAndManySidecarContainer, DualSocketHTUncore, ExpectAllocOneUncore, "
     "FullUncoreAvail", DSMT, _DSMT_RESERVED, FULL_UNCORE, _DSMT_CLEAN, [10, 2, 2, 2], {1},
     None),
    ("GuPodMainAndSidecarContainer, DualSocketHTUncore, ExpectAllocTwoUncore", DSMT,
     _DSMT_RESERVED, FULL_UNCORE, DSMT.online, [12, 2], {0, 1}, None),
    ("GuPodSingleContainer, SingleSocketSMTSmallUncore, ExpectAllocOneUncore", SMALL_SMT,
     cpuset("0,1,64,65"), FULL_UNCORE, SMALL_SMT.online, [8], {1}, None),
    ("GuPodSingleContainer, SingleSocketSMTSmallUncore, ExpectAllocTwoUncore", SMALL_SMT,
     cpuset("0,1,64,65"), FULL_UNCORE, SMALL_SMT.online - cpus_of_uncores(SMALL_SMT, 1), [12],
     {0, 2}, None),
    ("GuPodSingleContainer, SingleSocketNoSMTSmallUncore, FragmentedUncore, "
     "ExpectAllocThreeUncore", SINGLE_SOCKET_NO_SMT_SMALL_UNCORE, cpuset("0-3"), FULL_UNCORE,
     SINGLE_SOCKET_NO_SMT_SMALL_UNCORE.online
     - cpus_of_uncores(SINGLE_SOCKET_NO_SMT_SMALL_UNCORE, 2, 3, 5), [12], {1, 4, 6}, None),
    ("GuPodMultiContainer, DualSocketSMTUncore, FragmentedUncore, ExpectAllocOneUncore",
     SMALL_DUAL_SOCKET_NO_SMT_UNCORE, cpuset("0,1,32,33"), FULL_UNCORE,
     SMALL_DUAL_SOCKET_NO_SMT_UNCORE.online
     - cpus_of_uncores(SMALL_DUAL_SOCKET_NO_SMT_UNCORE, 1), [4, 2], {0}, None),
    ("GuPodMultiContainer, DualSocketSMTUncore, FragmentedUncore, ExpectAllocTwoUncore",
     SMALL_DUAL_SOCKET_NO_SMT_UNCORE, cpuset("0,1,32,33"), FULL_UNCORE,
     SMALL_DUAL_SOCKET_NO_SMT_UNCORE.online
     - cpus_of_uncores(SMALL_DUAL_SOCKET_NO_SMT_UNCORE, 1), [4, 4], {0, 2}, None),
    ("GuPodMultiContainer, LargeSingleSocketSMTUncore, PartialUncoreFit, ExpectAllocTwoUncore",
     LARGE_SINGLE_SOCKET_SMT_UNCORE, cpuset("0,1,128,129"), FULL_UNCORE,
     LARGE_SINGLE_SOCKET_SMT_UNCORE.online - cpuset("8,9,136,137"), [12, 12], {0, 1}, None),
    ("GuPodMultiContainer, LargeSingleSocketSMTUncore, PartialUncoreNoFit, "
     "ExpectAllocTwoUncore", LARGE_SINGLE_SOCKET_SMT_UNCORE, cpuset("0,1,128,129"),
     FULL_UNCORE, LARGE_SINGLE_SOCKET_SMT_UNCORE.online - cpuset("8,9,136,137"), [14, 14],
     {2, 3}, None),
    ("GuPodLargeSingleContainer, DualSocketNoSMTUncore, FullNUMAsAvail, ExpectAllocFullNUMA",
     DUAL_SOCKET_MULTI_NUMA_UNCORE, cpuset("0-3"), FULL_UNCORE,
     DUAL_SOCKET_MULTI_NUMA_UNCORE.online, [48], {6, 7, 8, 9, 10, 11}, None),
    # kubelet names the next two alike; "(1/2)" and "(2/2)" tell them apart here.
    ("GuPodSingleContainer, MonoUncoreCacheHT, ExpectAllocCPUSet (1/2)", MONO,
     cpuset("0,1,120,121"), FULL_UNCORE, MONO.online, [6], None, cpuset("2-4,122-124")),
    ("GuPodSingleContainer, MonoUncoreCacheHT, ExpectAllocCPUSet (2/2)",
     PCORE_ECORE_MONO_UNCORE, cpuset("0,1"), FULL_UNCORE,
     PCORE_ECORE_MONO_UNCORE.online - cpuset("4-7"), [6], None, cpuset("2,3,8,9,16,17")),
    ("GuPodSingleContainer, LargeSingleSocketUncore, ExpectAllocOneUncore",
     LARGE_SINGLE_SOCKET_UNCORE, cpuset("0-3"), FULL_UNCORE, LARGE_SINGLE_SOCKET_UNCORE.online,
     [8], {1}, None),
    ("GuPodSingleContainer, MonoUncoreCacheHT, ExpectFragmentedAllocCPUSet",
     SINGLE_SOCKET_MONO_UNCORE, cpuset("0,1"), FULL_UNCORE,
     SINGLE_SOCKET_MONO_UNCORE.online - cpuset("6-9,12-15,18,19"), [12], None,
     cpuset("2-5,10,11,16,17,20-23")),
    ("GuPodSingleContainer, SingleSocketUncore, PartialUncore, ExpectBestEffortAllocTwoUncore",
     SMALL_SINGLE_SOCKET_NO_SMT_UNCORE, cpuset("0-3"), FULL_UNCORE,
     SMALL_SINGLE_SOCKET_NO_SMT_UNCORE.online - cpuset("8-11,16-19,24-27"), [8], {0, 1},
     None),
    ("odd integer cpu required on smt-disabled", SMALL_SINGLE_SOCKET_NO_SMT_UNCORE,
     cpuset("0-3"), FULL_UNCORE, SMALL_SINGLE_SOCKET_NO_SMT_UNCORE.online, [5], None,
     cpuset("8-12")),
    ("odd integer required on smt-enabled", SMALL_SMT, cpuset("0,1,64,65"), UNCORE,
     SMALL_SMT.online, [3], None, cpuset("2,3,66")),
    ("odd integer required on odd integer partial uncore", SMALL_SMT, cpuset("0,1,64"), UNCORE,
     SMALL_SMT.online, [3], None, cpuset("2,65,66")),
    ("even integer required on odd integer partial uncore", SMALL_SMT, cpuset("0,1,64"),
     UNCORE, SMALL_SMT.online, [4], None, cpuset("4,5,68,69")),
    ("large odd integer required on smt-enabled", SMALL_SMT, cpuset("0,1,64"), UNCORE,
     SMALL_SMT.online, [11], None, cpuset("2,65,66,4-7,68-71")),
    # kubelet's default cpuset here is the CPUs of topoSingleSocketSingleNumaPerSocketSMT-
    # SmallUncore (0-127), not of the machine: kept as kubelet has it.
    ("odd integer required on HT monolithic uncore", MONO, cpuset("0,1,120"), UNCORE,
     cpuset("0-127"), [5], None, cpuset("2,3,121-123")),
    ("even integer required on HT monolithic uncore", MONO, cpuset("0,1,120"), UNCORE,
     cpuset("0-127"), [4], None, cpuset("2,3,122,123")),
    ("GuPodSingleContainer, SingleSocketSMTSmallUncore, StrictReserveCompatability",
     SMALL_SMT, cpuset("0,1,64,65"), UNCORE, SMALL_SMT.online, [2], None, cpuset("2,66")),
    ("GuPodSingleContainer, DualSocketHTMonoUncore, StrictReserveCompatability", MONO,
     cpuset("0,1,120,121"), UNCORE, MONO.online, [4], None, cpuset("2,3,122,123")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "reserved", "options", "default", "requests", "uncores", "first"),
    [pytest.param(*case[1:], id=case[0]) for case in UNCORE_ALIGNMENT],
)
def test_static_policy_add_with_uncore_alignment(
    topology: Topology,
    reserved: frozenset[int],
    options: dict[str, bool],
    default: frozenset[int],
    requests: list[int],
    uncores: set[int] | None,
    first: frozenset[int] | None,
) -> None:
    # The pod's app containers are allocated in order, each from what the earlier left
    # (kubelet's Allocate per container); strict-cpu-reservation changes nothing here, as
    # kubelet's test asserts, since the reserved CPUs are never available either way.
    free = default - reserved
    picks = []
    for count in requests:
        picked = take_cpus(topology, free, count, **options)
        assert len(picked) == count and picked <= free
        free -= picked
        picks.append(picked)
    if first is not None:
        assert picks[0] == first
    if uncores is not None:
        assert frozenset().union(*(uncores_of(topology, p) for p in picks)) == uncores


# --- distribute-cpus-across-numa with align-by-socket ---------------------------------------
# kubelet's own vectors for the pair are resize cases (not ported: crihook's picker has no
# resize); these follow takeByTopologyNUMADistributed's alignBySocket branch by hand.

# NUMA 0: 0-9,40-49 (20 free); NUMA 1: 10-15,50-55 (12); NUMA 2 and 3: all 20. Of the pairs
# that can take 24 CPUs, NUMA {0, 2} balances best, but it spans both sockets; {2, 3} is the
# best pair within one socket.
_BY_SOCKET_FREE = cpuset("0-15,20-55,60-79")
# NUMA 0: 16 free, NUMA 1: 6, NUMA 2 and 3: 10 each. An even share of 11 fits no pair; by
# socket, a node gives what it has (NUMA 1 its 6) and its partner takes the rest.
_BY_SOCKET_SHORT = cpuset("0-7,40-47,10-12,50-52,20-24,60-64,30-34,70-74")

DISTRIBUTED_BY_SOCKET = [
    ("a pair within one socket beats a better balanced pair across sockets", _BY_SOCKET_FREE,
     24, 2, False, cpuset("0-5,40-45,20-25,60-65")),
    ("a pair within one socket beats a better balanced pair across sockets (by socket)",
     _BY_SOCKET_FREE, 24, 2, True, cpuset("20-25,60-65,30-35,70-75")),
    ("a node gives what it holds and the rest of its share spills within its socket",
     _BY_SOCKET_SHORT, 22, 1, True, cpuset("0-7,40-47,10-12,50-52")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("available", "count", "group_size", "align_socket", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in DISTRIBUTED_BY_SOCKET],
)
def test_distributed_with_align_by_socket(
    available: frozenset[int],
    count: int,
    group_size: int,
    align_socket: bool,
    expected: frozenset[int],
) -> None:
    picked = _take_distributed(
        _index(MULTI), available, count, group_size, align_socket=align_socket
    )
    assert picked == expected
    full_cores = group_size > 1
    assert (
        take_cpus(
            MULTI,
            available,
            count,
            spread_numa=True,
            full_cores=full_cores,
            align_socket=align_socket,
        )
        == expected
    )


# --- TestStaticPolicyReuseCPUs / TestStaticPolicyDoNotReuseCPUs --------------------------


def test_init_container_cpus_are_reused_by_app_containers() -> None:
    """SingleSocketHT, DeAllocOneInitContainer: init 4 CPUs, then the app 2 of them."""
    init = take_cpus(S1, S1.online, 4)
    assert init == cpuset("0,1,4,5")
    shared = S1.online - init
    app = take_cpus(S1, shared | init, 2)  # allocateCPUs: available plus reusable
    assert app == cpuset("0,4")
    assert shared - app == cpuset("2,3,6,7")  # expCSetAfterAlloc


def test_restartable_init_container_cpus_are_not_reused() -> None:
    """SingleSocketHT, Don't reuse CPUs of a restartable init container."""
    sidecar = take_cpus(S1, S1.online, 4)
    assert sidecar == cpuset("0,1,4,5")
    app = take_cpus(S1, S1.online - sidecar, 2)
    assert app == cpuset("2,6")
    assert S1.online - sidecar - app == cpuset("3,7")  # expCSetAfterAlloc


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        pytest.param(
            SMTAlignmentError(15, 4),
            "SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4",
            id="base SMT alignment error",
        ),
        pytest.param(
            SMTAlignmentError(4, 2, available_physical=0),
            "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 0, "
            "requested CPUs = 4, CPUs per core = 2",
            id="base SMT alignment error, no physical CPUs, explicit flag",
        ),
    ],
)
def test_smt_alignment_error_text(error: SMTAlignmentError, expected: str) -> None:
    assert str(error) == expected
    assert isinstance(error, CPUAllocationError)
    assert isinstance(error, ValueError)


def test_full_cores_counts_only_whole_free_cores() -> None:
    # Every core of SingleSocketHT has one thread taken: no whole core is free.
    with pytest.raises(SMTAlignmentError) as raised:
        take_cpus(S1, cpuset("4-7"), 4, full_cores=True)
    assert raised.value.available_physical == 0
    assert str(raised.value) == (
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 0, "
        "requested CPUs = 4, CPUs per core = 2"
    )


@pytest.mark.parametrize(
    ("available", "count", "message"),
    [
        pytest.param(cpuset("0-7"), -2, "invalid request for -2 cpus", id="negative"),
        pytest.param(
            cpuset("0-9,12"), 2, "cpus 8-9,12 are not online on this node (online: 0-7)",
            id="offline cpus",
        ),
        pytest.param(
            cpuset(""), 1,
            "not enough cpus available to satisfy request: requested=1, available=0",
            id="nothing free",
        ),
    ],
)  # fmt: skip
def test_refusals(available: frozenset[int], count: int, message: str) -> None:
    for spread_numa in (False, True):
        with pytest.raises(CPUAllocationError, match=re.escape(message)):
            take_cpus(S1, available, count, spread_numa=spread_numa)


@pytest.mark.parametrize(
    "options",
    [{}, {"spread_numa": True}, {"full_cores": True}, {"spread_cores": True},
     {"uncore_cache": True}, {"align_socket": True}, {"numa_affinity": frozenset({0})}],
    ids=["packed", "spread-numa", "full-cores", "spread-cores", "uncore", "socket", "affinity"],
)  # fmt: skip
def test_take_zero_cpus_is_the_empty_set_whatever_the_options(options: dict[str, object]) -> None:
    """kubelet's "take zero cpus" (its accumulator is satisfied at once): the empty set, also
    with nothing free and with CPUs that are not online."""
    for available in (cpuset("0-7"), cpuset(""), cpuset("0-9")):
        assert take_cpus(S1, available, 0, **options) == frozenset()  # type: ignore[arg-type]


def test_take_cpus_is_public_where_the_resource_hooks_issue_pinned_it() -> None:
    import crihook.hooks.cpus as cpus
    import crihook.hooks.cpuset as cpuset_hook

    for name in ("take_cpus", "cpu_hints", "CPUAllocationError", "SMTAlignmentError"):
        assert getattr(cpuset_hook, name) is getattr(cpus, name)
        assert name in cpuset_hook.__all__
    assert cpuset_hook.take_cpus(S1, cpuset("0-7"), 2) == cpuset("0,4")


def test_available_may_be_any_set_of_ints() -> None:
    free = {0: "x", 1: "y", 4: "z", 5: "w"}
    assert take_cpus(S1, free.keys(), 2) == cpuset("0,4")
    assert take_cpus(S1, {0, 1, 4, 5}, 2) == cpuset("0,4")


# --- properties -----------------------------------------------------------------------


# Every choice the policy options can steer (full-pcpus-only refuses partial cores, so it has
# its own property below).
PICK_MODES = [
    pytest.param({}, id="packed"),
    pytest.param({"spread_numa": True}, id="spread-numa"),
    pytest.param({"uncore_cache": True}, id="uncore-cache"),
    pytest.param({"spread_cores": True}, id="spread-cores"),
    pytest.param({"spread_numa": True, "align_socket": True}, id="spread-numa-by-socket"),
]


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("flags", PICK_MODES)
def test_picks_are_subsets_of_the_right_size_and_repeatable(
    name: str, flags: dict[str, bool]
) -> None:
    topology = TOPOLOGIES[name]
    twin = Topology.build(topology.cpus.values())  # same machine, another object
    rng = random.Random(f"{name}-{sorted(flags)}")
    online = sorted(topology.online)
    numas = sorted({c.numa for c in topology.cpus.values()})
    for _ in range(25):
        free = frozenset(rng.sample(online, rng.randint(1, len(online))))
        count = rng.randint(1, len(free))
        affinity = (
            set(rng.sample(numas, rng.randint(1, len(numas)))) if rng.random() < 0.3 else None
        )
        picked = take_cpus(topology, free, count, numa_affinity=affinity, **flags)
        assert picked <= free
        assert len(picked) == count
        assert take_cpus(topology, set(free), count, numa_affinity=affinity, **flags) == picked
        assert take_cpus(twin, free, count, numa_affinity=affinity, **flags) == picked


def _uniform_smt(topology: Topology) -> bool:
    widths = Counter(info.core for info in topology.cpus.values())
    return len(set(widths.values())) == 1


# full-pcpus-only assumes every core is as wide as kubelet's average (not so on a hybrid
# P-core/E-core part, where kubelet's CPUsPerCore is 1).
UNIFORM_SMT = sorted(name for name, topo in TOPOLOGIES.items() if _uniform_smt(topo))


@pytest.mark.parametrize("name", UNIFORM_SMT)
@pytest.mark.parametrize("spread_numa", [False, True], ids=["packed", "spread"])
def test_full_cores_hands_out_whole_cores(name: str, spread_numa: bool) -> None:
    topology = TOPOLOGIES[name]
    width = topology.threads_per_core
    by_core: dict[int, set[int]] = {}
    for info in topology.cpus.values():
        by_core.setdefault(info.core, set()).add(info.id)
    rng = random.Random(f"{name}-{spread_numa}-cores")
    core_ids = sorted(by_core)
    for _ in range(30):
        chosen = rng.sample(core_ids, rng.randint(1, len(core_ids)))
        free = frozenset(cpu for core in chosen for cpu in by_core[core])
        count = width * rng.randint(1, len(chosen))
        picked = take_cpus(topology, free, count, spread_numa=spread_numa, full_cores=True)
        assert len(picked) == count
        assert all(by_core[info.core] <= picked for c in picked for info in [topology.cpus[c]])


def test_index_follows_the_topology_object() -> None:
    """Two machines built one after the other never share a cached index."""
    for width in (1, 2, 4):
        topology = Topology.build(
            CPUInfo(cpu, 0, 0, cpu // width * width, 0, 0) for cpu in range(8)
        )
        assert take_cpus(topology, topology.online, width) == frozenset(range(width))


# --- machines with offline CPUs -------------------------------------------------------------


def test_offline_siblings_never_make_the_picker_take_unavailable_cpus(tmp_path: Path) -> None:
    """kubelet calls a core free when its free CPUs number the machine's average CPUs per
    core; with an offline sibling that average is 1 and kubelet would take a core's busy
    thread too. Every pick here stays within what is available."""
    topology = read_topology(write_sysfs(tmp_path / "sys", OFFLINE_CPUS))
    for busy in ({0}, {0, 12}, {1, 17, 12}, set(range(0, 32, 3)) & topology.online):
        available = topology.online - busy
        for count in range(1, len(available) + 1):
            for spread in (False, True):
                picked = take_cpus(topology, available, count, spread_numa=spread)
                assert len(picked) == count and picked <= available, (busy, count, spread)
            picked = take_cpus(topology, available, count, uncore_cache=True)
            assert len(picked) == count and picked <= available, (busy, count, "uncore")
