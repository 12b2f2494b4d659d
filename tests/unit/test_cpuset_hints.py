"""cpu_hints against kubelet's hint vectors (``topology_hints_test.go``: returnTestCases,
TestGetPodTopologyHintsWithPolicyOptions with align-by-socket off and on).

kubelet sorts hints before comparing; here the order is asserted as kubelet generates it
(one NUMA node, then pairs, ... each in ascending order).
"""

from __future__ import annotations

import pytest

from crihook.hooks.cpus import CPUAllocationError, cpu_hints
from crihook.hooks.node.topology import CPUInfo, Topology
from crihook.hooks.spec.hints import TopologyHint
from tests.unit.kubelet_topologies import (
    DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT,
    HINTS_MACHINE,
    cpuset,
)


def hint(*numa: int, preferred: bool = False) -> TopologyHint:
    return TopologyHint(frozenset(numa), preferred)


N0, N1, BOTH = hint(0), hint(1), hint(0, 1)
N0_P, N1_P, BOTH_P = hint(0, preferred=True), hint(1, preferred=True), hint(0, 1, preferred=True)

# (kubelet's name, available, reusable, request, expected hints). The "Regenerate" cases
# are kubelet's hints for a container that already holds CPUs: the CPUs it holds are the
# available ones, nothing is reusable.
RETURN_TEST_CASES = [
    ("Request 2 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", cpuset("2-11"), cpuset(""),
     2, [N0_P, N1_P, BOTH]),
    ("Request 5 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", cpuset("2-11"), cpuset(""),
     5, [N1_P, BOTH]),
    ("Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", cpuset("2-11"), cpuset(""),
     7, [BOTH_P]),
    ("Request 11 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", cpuset("2-11"),
     cpuset(""), 11, []),
    ("Request 2 CPUs, 1 available on NUMA 0, 1 available on NUMA 1", cpuset("0,3"), cpuset(""),
     2, [BOTH]),
    ("Request more CPUs than available", cpuset("0-3"), cpuset(""), 5, []),
    ("Regenerate Single-Node NUMA Hints if already allocated 1/2", cpuset("0,6"), cpuset(""),
     2, [N0_P, BOTH]),
    # kubelet names this one "... 1/2" as well.
    ("Regenerate Single-Node NUMA Hints if already allocated 2/2", cpuset("3,9"), cpuset(""),
     2, [N1_P, BOTH]),
    ("Regenerate Cross-NUMA Hints if already allocated", cpuset("0-10"), cpuset(""), 11,
     [BOTH_P]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("available", "reusable", "count", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in RETURN_TEST_CASES],
)
def test_kubelet_hints(
    available: frozenset[int], reusable: frozenset[int], count: int, expected: list[TopologyHint]
) -> None:
    assert cpu_hints(HINTS_MACHINE, available, reusable, count) == expected


def test_kubelet_hints_four_numa_nodes_without_align_by_socket() -> None:
    """AlignBySocket:false, Preferred hints does not contains socket aligned hints."""
    expected = [
        hint(0, preferred=True),
        hint(0, 1),
        hint(0, 2),
        hint(0, 3),
        hint(0, 1, 2),
        hint(0, 1, 3),
        hint(0, 2, 3),
        hint(0, 1, 2, 3),
    ]
    assert cpu_hints(DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT, cpuset("2,3,11"), set(), 2) == expected


ALL_FOUR = [(0, 1), (0, 2), (0, 3), (0, 1, 2), (0, 1, 3), (0, 2, 3), (0, 1, 2, 3)]

# TestGetPodTopologyHintsWithPolicyOptions with AlignBySocketOption "true", on
# topoDualSocketMultiNumaPerSocketHT (NUMA 0-1 on socket 0, 2-3 on socket 1).
BY_SOCKET = [
    # CPUs free on NUMA 0 and 1; NUMA 0 alone holds 2 CPUs, so do NUMA 0 and 1 together
    # without leaving socket 0: both preferred.
    ("AlignBySocket:true Preferred hints contains socket aligned hints", cpuset("2,3,11"), 2,
     [hint(0, preferred=True), hint(0, 1, preferred=True)]
     + [hint(*m) for m in ALL_FOUR if m != (0, 1)]),
    # 41 CPUs need three NUMA nodes, hence two sockets: every hint spanning two is preferred.
    ("AlignBySocket:true Preferred hints are spread across socket since 2 sockets are required",
     cpuset("0-28,40-57"), 41, [hint(0, 1, 2, preferred=True), hint(0, 1, 2, 3, preferred=True)]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("available", "count", "expected"), [pytest.param(*case[1:], id=case[0]) for case in BY_SOCKET]
)
def test_kubelet_hints_align_by_socket(
    available: frozenset[int], count: int, expected: list[TopologyHint]
) -> None:
    hints = cpu_hints(
        DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT, available, set(), count, align_socket=True
    )
    assert hints == expected


def test_align_by_socket_changes_nothing_where_sockets_are_numa_nodes() -> None:
    for count in (2, 5, 7):
        assert cpu_hints(HINTS_MACHINE, cpuset("2-11"), set(), count, align_socket=True) == (
            cpu_hints(HINTS_MACHINE, cpuset("2-11"), set(), count)
        )


# Beyond kubelet's table: the reusable CPUs (generateCPUTopologyHints' second loop).


def test_reusable_cpus_count_and_rule_out_nodes_they_are_not_on() -> None:
    # 2 free on NUMA 1 + 2 reusable on NUMA 0: only masks holding NUMA 0 qualify, and only
    # both nodes together reach 4.
    assert cpu_hints(HINTS_MACHINE, cpuset("3,9"), cpuset("0,6"), 4) == [BOTH]
    # The reusable CPUs alone cover the request: NUMA 0 on its own is preferred.
    assert cpu_hints(HINTS_MACHINE, cpuset(""), cpuset("0,6"), 2) == [N0_P, BOTH]


def test_preference_counts_all_cpus_of_a_node_not_only_the_free_ones() -> None:
    # 6 CPUs per node: one node could hold 4 if it were free, so the pair is not preferred.
    assert cpu_hints(HINTS_MACHINE, cpuset("0,1,3,4"), cpuset(""), 4) == [BOTH]


def test_memory_only_nodes_are_not_hinted() -> None:
    from crihook.hooks.node.topology import NUMAMemory

    with_memory_node = Topology.build(HINTS_MACHINE.cpus.values(), [NUMAMemory(2, 1 << 30)])
    assert cpu_hints(with_memory_node, cpuset("2-11"), set(), 7) == [BOTH_P]


def test_single_node_machine() -> None:
    machine = Topology.build(CPUInfo(cpu, 0, 0, cpu, 0, 0) for cpu in range(4))
    assert cpu_hints(machine, cpuset("0-3"), set(), 4) == [hint(0, preferred=True)]
    assert cpu_hints(machine, cpuset("0-2"), set(), 4) == []


@pytest.mark.parametrize(
    ("available", "reusable", "count", "message"),
    [
        pytest.param(cpuset("0-3"), cpuset(""), 0, "invalid request for 0 cpus", id="zero"),
        pytest.param(cpuset("0-12"), cpuset(""), 1, "cpus 12 are not online", id="offline"),
        pytest.param(cpuset("0"), cpuset("20"), 1, "cpus 20 are not online", id="reusable"),
    ],
)
def test_refusals(
    available: frozenset[int], reusable: frozenset[int], count: int, message: str
) -> None:
    with pytest.raises(CPUAllocationError, match=message):
        cpu_hints(HINTS_MACHINE, available, reusable, count)
