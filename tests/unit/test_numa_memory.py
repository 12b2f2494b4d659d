"""kubelet's memory manager Static policy (crihook.hooks.numa.memory) against kubelet's vectors.

Ported from kubernetes/kubernetes pkg/kubelet/cm/memorymanager/policy_static_test.go:
TestStaticPolicyNew, TestStaticPolicyStart (the default state, and the recomputation from
saved assignments that `from_dict` does), TestStaticPolicyAllocate,
TestStaticPolicyAllocateWithInitContainers, TestStaticPolicyAllocateWithRestartableInitContainers,
TestStaticPolicyRemoveContainer, TestStaticPolicyGetTopologyHints and
Test_getPodRequestedResources. Machine states are kubelet's tables as written; blocks compare
without order, as kubelet's areMemoryBlocksEqual does.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from crihook.hooks.node.topology import NUMAMemory, Topology
from crihook.hooks.numa import (
    MEMORY,
    Allocation,
    Block,
    ContainerRef,
    InitContainer,
    MemoryAllocationError,
    MemoryState,
    MemoryTable,
    NodeState,
    allocate,
    hugepage_resource,
    memory_hints,
    pod_memory_requests,
    release,
    resize,
)
from crihook.hooks.spec.hints import TopologyHint

MB = 1024 * 1024
GB = 1024 * MB
HP1G = "hugepages-1Gi"
HP2M = "hugepages-2Mi"
PAGE_1G_KIB = 1048576

# requirementsGuaranteed (cpu is not a memory resource and is ignored)
GUARANTEED = {"cpu": 1, MEMORY: GB, HP1G: GB}


def t(allocatable: int, free: int, reserved: int, system_reserved: int, total: int) -> MemoryTable:
    """A MemoryTable in MiB, fields in the order kubelet's tests write them."""
    return MemoryTable(total * MB, system_reserved * MB, allocatable * MB, reserved * MB, free * MB)


def ns(cells: tuple[int, ...], assignments: int, **tables: MemoryTable) -> NodeState:
    """A NodeState; tables by keyword: memory=, hp1g=, hp2m=."""
    names = {"memory": MEMORY, "hp1g": HP1G, "hp2m": HP2M}
    return NodeState({names[k]: v for k, v in tables.items()}, cells, assignments)


def b(numa: tuple[int, ...], resource: str, size: int) -> Block:
    return Block(numa, resource, size)


def ref(pod: str, name: str) -> ContainerRef:
    return ContainerRef(pod, name)


Assignments = dict[str, dict[str, list[Block]]]


def as_counters(assignments: Mapping[str, Mapping[str, Sequence[Block]]]) -> dict[Any, Any]:
    return {
        pod: {name: Counter(blocks) for name, blocks in containers.items()}
        for pod, containers in assignments.items()
    }


def clone_nodes(nodes: Mapping[int, NodeState]) -> dict[int, NodeState]:
    return {
        n: NodeState(
            {r: dataclasses.replace(v) for r, v in s.memory.items()},
            s.cells,
            s.assignments,
        )
        for n, s in nodes.items()
    }


def state_of(nodes: Mapping[int, NodeState], assignments: Assignments | None = None) -> MemoryState:
    return MemoryState(clone_nodes(nodes), assignments)


# Recurring tables.
MEM_FREE = t(1536, 1536, 0, 512, 2048)
MEM_USED_1G = t(1536, 512, 1024, 512, 2048)
HP_FREE = t(1024, 1024, 0, 0, 1024)
HP_USED = t(1024, 0, 1024, 0, 1024)
SMALL_FREE = t(512, 512, 0, 512, 1024)  # 1 GiB node, 512 MiB allocatable
SMALL_USED = t(512, 0, 512, 512, 1024)

# "default preferred false" / "extended preferred false": node 0 half used, 1 and 2 too small.
THREE_NODES_HALF_USED = {
    0: ns((0,), 1, memory=t(1024, 512, 512, 512, 1536), hp1g=HP_FREE),
    1: ns((1,), 0, memory=t(512, 512, 0, 512, 1536), hp1g=HP_FREE),
    2: ns((2,), 0, memory=t(512, 512, 0, 512, 1536), hp1g=HP_FREE),
}
HALF_USED_ASSIGNMENTS: Assignments = {"pod1": {"container1": [b((0,), MEMORY, 512 * MB)]}}
FOUR_SMALL_NODES = {n: ns((n,), 0, memory=SMALL_FREE, hp1g=HP_FREE) for n in range(4)}


# --- TestStaticPolicyAllocate ----------------------------------------------------------------
ALLOCATE = [
    pytest.param(
        {0: ns((), 0, memory=MEM_USED_1G, hp1g=HP_FREE)},
        {"pod1": {"container1": [b((0,), MEMORY, GB)]}},
        ref("pod1", "container1"),
        TopologyHint(None, False),
        {"pod1": {"container1": [b((0,), MEMORY, GB)]}},
        {0: ns((), 0, memory=MEM_USED_1G, hp1g=HP_FREE)},
        id="should do nothing once container already exists under the state file",
    ),
    pytest.param(
        {0: ns((0,), 0, memory=MEM_FREE, hp1g=HP_FREE)},
        {},
        ref("pod1", "container1"),
        TopologyHint(None, False),
        {"pod1": {"container1": [b((0,), MEMORY, GB), b((0,), HP1G, GB)]}},
        {0: ns((0,), 2, memory=MEM_USED_1G, hp1g=HP_USED)},
        id="should calculate a default topology hint when no NUMA affinity was provided",
    ),
    pytest.param(
        FOUR_SMALL_NODES,
        {},
        ref("pod1", "container1"),
        TopologyHint(None, True),
        {"pod1": {"container1": [b((0, 1), MEMORY, GB), b((0, 1), HP1G, GB)]}},
        {
            0: ns((0, 1), 2, memory=SMALL_USED, hp1g=HP_USED),
            1: ns((0, 1), 2, memory=SMALL_USED, hp1g=HP_FREE),
            2: ns((2,), 0, memory=SMALL_FREE, hp1g=HP_FREE),
            3: ns((3,), 0, memory=SMALL_FREE, hp1g=HP_FREE),
        },
        id="should succeed to allocate memory from multiple NUMA nodes",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "assignments", "container", "hint", "want_assignments", "want_nodes"), ALLOCATE
)
def test_allocate(
    nodes: dict[int, NodeState],
    assignments: Assignments,
    container: ContainerRef,
    hint: TopologyHint,
    want_assignments: Assignments,
    want_nodes: dict[int, NodeState],
) -> None:
    state = state_of(nodes, assignments)
    allocation = allocate(state, container, GUARANTEED, hint)
    assert as_counters(state.assignments) == as_counters(want_assignments)
    assert state.nodes == want_nodes
    assert Counter(allocation.blocks) == Counter(want_assignments["pod1"]["container1"])


ALLOCATE_ERRORS = [
    pytest.param(
        {0: ns((0,), 2, memory=MEM_USED_1G, hp1g=HP_USED)},
        {"pod1": {"container1": [b((0,), MEMORY, GB), b((0,), HP1G, GB)]}},
        TopologyHint(None, False),
        "failed to get the default NUMA affinity, no NUMA nodes with enough memory is available",
        id="should fail when no affinity was provided and the default hint failed",
    ),
    pytest.param(
        THREE_NODES_HALF_USED,
        HALF_USED_ASSIGNMENTS,
        TopologyHint(None, True),
        "failed to find the default preferred hint",
        id="should fail when no affinity under a preferred hint and default hint not preferred",
    ),
    pytest.param(
        {
            0: ns((0,), 0, memory=SMALL_FREE, hp1g=HP_FREE),
            1: ns((1, 2), 1, memory=MEM_USED_1G, hp1g=HP_FREE),
            2: ns((1, 2), 1, memory=MEM_USED_1G, hp1g=HP_FREE),
        },
        {},
        TopologyHint(frozenset({0}), False),
        "failed to find NUMA nodes to extend the current topology hint",
        id="should fail when the affinity did not satisfy the request and extending it failed",
    ),
    pytest.param(
        THREE_NODES_HALF_USED,
        HALF_USED_ASSIGNMENTS,
        TopologyHint(frozenset({1}), True),
        "failed to find the extended preferred hint",
        id="should fail when the hint was preferred and the extended hint is not",
    ),
]


@pytest.mark.parametrize(("nodes", "assignments", "hint", "message"), ALLOCATE_ERRORS)
def test_allocate_errors(
    nodes: dict[int, NodeState], assignments: Assignments, hint: TopologyHint, message: str
) -> None:
    state = state_of(nodes, assignments)
    container = ref("pod2", "container2")
    with pytest.raises(MemoryAllocationError) as caught:
        allocate(state, container, GUARANTEED, hint)
    assert str(caught.value) == message
    assert caught.value.container == container
    assert state.nodes == nodes
    assert state.assignments == assignments


def test_allocation_reports_what_it_took_per_node() -> None:
    state = state_of(FOUR_SMALL_NODES)
    allocation = allocate(state, ref("pod1", "container1"), GUARANTEED, TopologyHint(None, True))
    assert allocation.nodes == {0, 1}
    assert allocation.reserved == {0: {MEMORY: 512 * MB, HP1G: GB}, 1: {MEMORY: 512 * MB}}
    assert not allocation.existing
    again = allocate(state, ref("pod1", "container1"), GUARANTEED, TopologyHint(None, True))
    assert again == Allocation(allocation.container, allocation.blocks, {}, existing=True)


def test_allocate_refuses_a_hint_naming_unknown_nodes() -> None:
    state = state_of({0: ns((0,), 0, memory=MEM_FREE, hp1g=HP_FREE)})
    with pytest.raises(MemoryAllocationError, match="without memory state"):
        allocate(state, ref("p", "c"), GUARANTEED, TopologyHint(frozenset({3}), True))


def test_allocate_needs_memory_with_hugepages() -> None:
    state = state_of({0: ns((0,), 0, memory=MEM_FREE, hp1g=HP_FREE)})
    with pytest.raises(MemoryAllocationError, match="must request memory"):
        allocate(state, ref("p", "c"), {HP1G: GB}, None)


# --- TestStaticPolicyAllocateWithInitContainers / WithRestartableInitContainers --------------
def init_case(
    inits: list[tuple[str, int, bool]],
    apps: list[tuple[str, int]],
    node: NodeState,
    want_sizes: dict[str, int],
    want_node: NodeState,
    reusable: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    return inits, apps, node, want_sizes, want_node, reusable


INIT_CONTAINERS = [
    pytest.param(
        *init_case(
            [("initContainer1", 1, False), ("initContainer2", 2, False)],
            [("container1", 3), ("container2", 4)],
            ns((0,), 0, memory=t(7680, 7680, 0, 512, 8192), hp1g=t(8192, 8192, 0, 0, 8192)),
            {"initContainer1": 0, "initContainer2": 0, "container1": 3, "container2": 4},
            ns((0,), 8, memory=t(7680, 512, 7168, 512, 8192), hp1g=t(8192, 1024, 7168, 0, 8192)),
        ),
        id="init containers 1Gi and 2Gi, app containers 3Gi and 4Gi",
    ),
    pytest.param(
        *init_case(
            [("initContainer1", 4, False), ("initContainer2", 3, False)],
            [("container1", 2), ("container2", 1)],
            ns((0,), 0, memory=t(7680, 7680, 0, 512, 8192), hp1g=t(8192, 8192, 0, 0, 8192)),
            {"initContainer1": 0, "initContainer2": 1, "container1": 2, "container2": 1},
            ns((0,), 8, memory=t(7680, 3584, 4096, 512, 8192), hp1g=t(8192, 4096, 4096, 0, 8192)),
        ),
        id="init containers 4Gi and 3Gi, app containers 2Gi and 1Gi",
    ),
    pytest.param(
        *init_case(
            [("initContainer1", 7, False), ("initContainer2", 4, False)],
            [("container1", 4), ("container2", 3)],
            ns((0,), 0, memory=t(7680, 7680, 0, 512, 8192), hp1g=t(8192, 8192, 0, 0, 8192)),
            {"initContainer1": 0, "initContainer2": 0, "container1": 4, "container2": 3},
            ns((0,), 8, memory=t(7680, 512, 7168, 512, 8192), hp1g=t(8192, 1024, 7168, 0, 8192)),
        ),
        id="init containers 7Gi and 4Gi, app containers 4Gi and 3Gi",
    ),
    pytest.param(
        *init_case(
            [("initContainer1", 7, False), ("initContainer2", 4, False)],
            [("container1", 5), ("container2", 2)],
            ns((0,), 0, memory=t(10240, 10240, 0, 512, 10240), hp1g=t(10240, 10240, 0, 0, 10240)),
            {"initContainer1": 0, "initContainer2": 0, "container1": 5, "container2": 2},
            ns(
                (0,),
                8,
                memory=t(10240, 3072, 7168, 512, 10240),
                hp1g=t(10240, 3072, 7168, 0, 10240),
            ),
            reusable={"pod0": {}},
        ),
        id="init containers 7Gi and 4Gi, app containers 5Gi and 2Gi, another pod's leftovers",
    ),
    pytest.param(
        *init_case(
            [
                ("initContainer1", 1, False),
                ("restartableInitContainer2", 2, True),
                ("initContainer3", 3, False),
                ("restartableInitContainer4", 4, True),
            ],
            [("container1", 1)],
            ns((0,), 0, memory=t(7168, 7168, 0, 512, 7680), hp1g=t(7168, 7168, 0, 0, 7168)),
            {
                "initContainer1": 0,
                "restartableInitContainer2": 2,
                "initContainer3": 0,
                "restartableInitContainer4": 4,
                "container1": 1,
            },
            ns((0,), 10, memory=t(7168, 0, 7168, 512, 7680), hp1g=t(7168, 0, 7168, 0, 7168)),
        ),
        id="should not re-use restartable init containers memory",
    ),
]


@pytest.mark.parametrize(
    ("inits", "apps", "node", "want_sizes", "want_node", "reusable"), INIT_CONTAINERS
)
def test_allocate_with_init_containers(
    inits: list[tuple[str, int, bool]],
    apps: list[tuple[str, int]],
    node: NodeState,
    want_sizes: dict[str, int],
    want_node: NodeState,
    reusable: dict[str, Any] | None,
) -> None:
    state = state_of({0: node})
    if reusable is not None:
        state.reusable = reusable
    pod_inits = [InitContainer(name, restartable) for name, _, restartable in inits]
    order = [(name, size) for name, size, _ in inits] + apps
    for name, size in order:
        allocate(
            state,
            ref("pod1", name),
            {MEMORY: size * GB, HP1G: size * GB},
            TopologyHint(None, False),
            init_containers=pod_inits,
        )
    want = {
        name: [b((0,), MEMORY, size * GB), b((0,), HP1G, size * GB)]
        for name, size in want_sizes.items()
    }
    assert as_counters(state.assignments) == as_counters({"pod1": want})
    assert state.nodes == {0: want_node}


def test_allocate_restartable_init_containers_already_in_state() -> None:
    """...WithRestartableInitContainers: should do nothing once containers already exist."""
    node = ns((), 0, memory=t(2560, 512, 2048, 512, 3072), hp1g=t(2048, 2048, 0, 0, 2048))
    assignments: Assignments = {
        "pod1": {
            "initContainer1": [b((0,), MEMORY, GB)],
            "container1": [b((0,), MEMORY, GB)],
        }
    }
    state = state_of({0: node}, assignments)
    inits = [InitContainer("initContainer1", restartable=True)]
    for name in ("initContainer1", "container1"):
        got = allocate(state, ref("pod1", name), GUARANTEED, None, init_containers=inits)
        assert got.existing
    assert as_counters(state.assignments) == as_counters(assignments)
    assert state.nodes == {0: node}


# --- TestStaticPolicyRemoveContainer ---------------------------------------------------------
REMOVE = [
    pytest.param(
        {0: ns((), 0, memory=MEM_FREE, hp1g=HP_FREE)},
        {},
        {0: ns((), 0, memory=MEM_FREE, hp1g=HP_FREE)},
        id="should do nothing when the container does not exist under the state",
    ),
    pytest.param(
        {0: ns((0,), 2, memory=MEM_USED_1G, hp1g=HP_USED)},
        {"pod1": {"container1": [b((0,), MEMORY, GB), b((0,), HP1G, GB)]}},
        {0: ns((0,), 0, memory=MEM_FREE, hp1g=HP_FREE)},
        id="should delete the container assignment and update the machine state",
    ),
    pytest.param(
        {
            0: ns((0, 1), 2, memory=SMALL_USED, hp1g=HP_USED),
            1: ns((0, 1), 2, memory=SMALL_USED, hp1g=HP_FREE),
        },
        {"pod1": {"container1": [b((0, 1), MEMORY, GB), b((0, 1), HP1G, GB)]}},
        {
            0: ns((0,), 0, memory=SMALL_FREE, hp1g=HP_FREE),
            1: ns((1,), 0, memory=SMALL_FREE, hp1g=HP_FREE),
        },
        id="should delete the cross NUMA container assignment and update the machine state",
    ),
]


@pytest.mark.parametrize(("nodes", "assignments", "want_nodes"), REMOVE)
def test_release(
    nodes: dict[int, NodeState], assignments: Assignments, want_nodes: dict[int, NodeState]
) -> None:
    state = state_of(nodes, assignments)
    release(state, ref("pod1", "container1"))
    assert state.assignments == {}
    assert state.nodes == want_nodes


# --- TestStaticPolicyGetTopologyHints --------------------------------------------------------
def P(*nodes: int) -> TopologyHint:
    return TopologyHint(frozenset(nodes), True)


def N(*nodes: int) -> TopologyHint:
    return TopologyHint(frozenset(nodes), False)


GROUPED_0_1 = {
    0: ns((0, 1), 2, memory=t(1536, 0, 1536, 512, 2048), hp1g=HP_USED),
    1: ns((0, 1), 2, memory=t(1536, 1024, 512, 512, 2048), hp1g=HP_USED),
    2: ns((2,), 0, memory=MEM_FREE, hp1g=HP_FREE),
    3: ns((3,), 0, memory=MEM_FREE, hp1g=HP_FREE),
}
ONE_NODE = {0: ns((0,), 0, memory=MEM_FREE, hp1g=HP_FREE)}

HINTS = [
    pytest.param(
        ONE_NODE,
        {"pod1": {"container1": [b((0,), MEMORY, GB), b((0,), HP1G, GB)]}},
        ref("pod1", "container1"),
        GUARANTEED,
        {MEMORY: [P(0)], HP1G: [P(0)]},
        id="should provide topology hints based on the existent memory assignment",
    ),
    pytest.param(
        GROUPED_0_1,
        {"pod1": {"container1": [b((0, 1), MEMORY, 2 * GB), b((0, 1), HP1G, 2 * GB)]}},
        ref("pod2", "container2"),
        GUARANTEED,
        {MEMORY: [P(2), P(3), N(2, 3)], HP1G: [P(2), P(3), N(2, 3)]},
        id="should calculate new topology hints, when the container does not exist",
    ),
    pytest.param(
        ONE_NODE,
        {"pod1": {"container1": [b((0,), MEMORY, GB)]}},
        ref("pod1", "container1"),
        GUARANTEED,
        {},
        id="existing assignment has another number of resources than requested",
    ),
    pytest.param(
        ONE_NODE,
        {"pod1": {"container1": [b((0,), MEMORY, GB), b((0,), HP2M, GB)]}},
        ref("pod1", "container1"),
        GUARANTEED,
        {},
        id="existing assignment has other resources than requested",
    ),
    pytest.param(
        ONE_NODE,
        {"pod1": {"container1": [b((0,), MEMORY, 512 * MB), b((0,), HP1G, GB)]}},
        ref("pod1", "container1"),
        GUARANTEED,
        {},
        id="existing assignment size differs from the request",
    ),
    pytest.param(
        {
            0: ns((0, 1), 2, memory=t(1536, 0, 1536, 512, 2048), hp2m=t(20, 0, 20, 0, 20)),
            1: ns((0, 1), 2, memory=t(1536, 1024, 512, 512, 2048), hp2m=t(20, 16, 4, 0, 20)),
        },
        {"pod1": {"container1": [b((0, 1), MEMORY, 2 * GB), b((0, 1), HP2M, 24 * MB)]}},
        ref("pod2", "container2"),
        {"cpu": 1, MEMORY: GB, HP2M: 16 * MB},
        {MEMORY: [N(0, 1)], HP2M: [N(0, 1)]},
        id="no preferred multi-NUMA hints for a pod a single NUMA node could satisfy",
    ),
]


@pytest.mark.parametrize(("nodes", "assignments", "container", "requests", "want"), HINTS)
def test_memory_hints(
    nodes: dict[int, NodeState],
    assignments: Assignments,
    container: ContainerRef,
    requests: dict[str, int],
    want: dict[str, list[TopologyHint]],
) -> None:
    state = state_of(nodes, assignments)
    assert memory_hints(state, requests, container=container) == want


def test_memory_hints_for_an_unknown_hugepage_size_are_none() -> None:
    """kubelet would dereference a missing table; an absent size has no memory."""
    assert memory_hints(state_of(ONE_NODE), {MEMORY: GB, HP2M: 2 * MB}) == {}


# --- TestStaticPolicyNew / Start: the default state, and the state rebuilt from saved blocks --
def topology(*nodes: tuple[int, int, int]) -> Topology:
    """(node, memory bytes, 1 GiB pages) per NUMA node."""
    return Topology.build([], [NUMAMemory(n, mem, {PAGE_1G_KIB: pages}) for n, mem, pages in nodes])


def test_build_default_state() -> None:
    """Start: should fill the state with default values, when the state is empty."""
    state = MemoryState.build(topology((0, 3 * GB, 1)), {0: {MEMORY: 512 * MB}})
    assert state.nodes == {0: ns((0,), 0, memory=t(1536, 1536, 0, 512, 3072), hp1g=HP_FREE)}
    assert state.assignments == {}


def test_build_needs_reserved_memory() -> None:
    """New: should fail when the machine has no memory reserved for the system."""
    with pytest.raises(ValueError, match="you should specify the system reserved memory"):
        MemoryState.build(topology((0, 2 * GB, 1), (1, 2 * GB, 1)), {})
    # should succeed when at least one NUMA node has reserved memory
    MemoryState.build(topology((0, 2 * GB, 1), (1, 2 * GB, 1)), {0: {}, 1: {MEMORY: 512 * MB}})


def test_build_refuses_impossible_reservations() -> None:
    with pytest.raises(ValueError, match="NUMA nodes this machine lacks"):
        MemoryState.build(topology((0, 2 * GB, 1)), {0: {MEMORY: MB}, 3: {MEMORY: MB}})
    with pytest.raises(ValueError, match="does not fit"):
        MemoryState.build(topology((0, 2 * GB, 1)), {0: {MEMORY: 2 * GB}})


def test_from_dict_recomputes_cross_numa_state() -> None:
    """Start: should validate cross NUMA reserved memory vs container assignments."""
    entries = {
        "pod1": {
            "container1": [
                {"numaAffinity": [0, 1], "type": MEMORY, "size": 768 * MB},
                {"numaAffinity": [0, 1], "type": HP1G, "size": GB},
            ]
        },
        "pod2": {
            "container2": [
                {"numaAffinity": [0, 1], "type": MEMORY, "size": 256 * MB},
                {"numaAffinity": [0, 1], "type": HP1G, "size": GB},
            ]
        },
    }
    state = MemoryState.from_dict(
        topology((0, 2176 * MB, 1), (1, 2176 * MB, 1)),
        {0: {MEMORY: 512 * MB}, 1: {MEMORY: 512 * MB}},
        {"version": 1, "entries": entries},
    )
    assert state.nodes == {
        0: ns((0, 1), 4, memory=t(640, 0, 640, 512, 2176), hp1g=HP_USED),
        1: ns((0, 1), 4, memory=t(640, 256, 384, 512, 2176), hp1g=HP_USED),
    }
    assert state.to_dict() == {"version": 1, "entries": entries}


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        pytest.param(
            [{"numaAffinity": [1], "type": MEMORY, "size": GB}],
            "(pod: pod1, container: container1) the memory assignment uses the NUMA that does "
            "not exist",
            id="should fail when the assignment uses a NUMA node the machine lacks",
        ),
        pytest.param(
            [
                {"numaAffinity": [0], "type": MEMORY, "size": GB},
                {"numaAffinity": [0], "type": HP2M, "size": GB},
            ],
            "(pod: pod1, container: container1) the memory assignment uses memory resource "
            "that does not exist",
            id="should fail when the assignment uses a resource the machine lacks",
        ),
        pytest.param(
            [{"numaAffinity": [0], "type": MEMORY}],
            "bad block",
            id="a block without size",
        ),
    ],
)
def test_from_dict_errors(blocks: list[dict[str, Any]], message: str) -> None:
    data = {"version": 1, "entries": {"pod1": {"container1": blocks}}}
    with pytest.raises(ValueError) as caught:
        MemoryState.from_dict(topology((0, 2 * GB, 1)), {0: {MEMORY: 512 * MB}}, data)
    assert message in str(caught.value)


def test_state_survives_json_round_trip() -> None:
    """Allocations saved as JSON rebuild the same machine state on the same topology."""
    machine = topology((0, 4 * GB, 1), (1, 4 * GB, 1), (2, 4 * GB, 1), (3, 4 * GB, 1))
    reserved = {n: {MEMORY: 512 * MB} for n in range(4)}
    state = MemoryState.build(machine, reserved)
    assert allocate(state, ref("pod1", "c1"), {MEMORY: 3 * GB, HP1G: 2 * GB}, None).nodes == {0, 1}
    assert allocate(state, ref("pod2", "c2"), GUARANTEED, P(3)).nodes == {3}
    assert allocate(state, ref("pod3", "c3"), {MEMORY: 256 * MB}, None).nodes == {2}
    saved = json.loads(json.dumps(state.to_dict()))
    restored = MemoryState.from_dict(machine, reserved, saved)
    assert restored.nodes == state.nodes
    assert restored.assignments == state.assignments
    release(restored, ref("pod1", "c1"))
    assert restored.nodes[0].cells == (0,)


def test_hugepage_resource_names() -> None:
    assert [hugepage_resource(k) for k in (64, 2048, 1536, 32768, PAGE_1G_KIB)] == [
        "hugepages-64Ki",
        "hugepages-2Mi",
        "hugepages-1536Ki",
        "hugepages-32Mi",
        "hugepages-1Gi",
    ]


# --- Test_getPodRequestedResources -----------------------------------------------------------
def r(memory: int, hugepages: int) -> dict[str, int]:
    return {MEMORY: memory * GB, HP1G: hugepages * GB}


@pytest.mark.parametrize(
    ("containers", "inits", "want"),
    [
        pytest.param(
            [r(1, 1), r(2, 2)],
            [(r(1, 1), False), (r(4, 4), False)],
            r(4, 4),
            id="maximum resources of init containers > total resources of containers",
        ),
        pytest.param(
            [r(2, 2), r(3, 3)],
            [(r(1, 1), False), (r(3, 3), False)],
            r(5, 5),
            id="maximum resources of init containers < total resources of containers",
        ),
        pytest.param(
            [r(2, 1), r(3, 2)],
            [(r(1, 1), False), (r(3, 4), False)],
            r(5, 4),
            id="calculate different resources independently",
        ),
        pytest.param(
            [r(1, 1), r(2, 2)],
            [(r(2, 2), True), (r(4, 4), False)],
            r(6, 6),
            id="init peak > long running containers, including restartable init containers",
        ),
        pytest.param(
            [r(2, 2), r(3, 3)],
            [(r(2, 2), True), (r(4, 4), False)],
            r(7, 7),
            id="init peak < long running containers, including restartable init containers",
        ),
    ],
)
def test_pod_memory_requests(
    containers: list[dict[str, int]],
    inits: list[tuple[dict[str, int], bool]],
    want: dict[str, int],
) -> None:
    assert pod_memory_requests(containers, inits) == want


# --- resize (crihook's: kubelet's Static policy does not resize) ----------------------------

TWO_NODES_GROUPED = {
    0: ns((0, 1), 1, memory=t(1536, 0, 1536, 512, 2048), hp1g=HP_FREE),
    1: ns((0, 1), 1, memory=t(1536, 1024, 512, 512, 2048), hp1g=HP_FREE),
}
ON_BOTH: Assignments = {"pod1": {"container1": [b((0, 1), MEMORY, 2 * GB)]}}

RESIZE = [
    pytest.param(
        {0: ns((0,), 2, memory=MEM_USED_1G, hp1g=HP_USED)},
        {"pod1": {"container1": [b((0,), MEMORY, GB), b((0,), HP1G, GB)]}},
        1536 * MB,
        [b((0,), MEMORY, 1536 * MB), b((0,), HP1G, GB)],
        {0: ns((0,), 2, memory=t(1536, 0, 1536, 512, 2048), hp1g=HP_USED)},
        id="grows-into-the-free-memory-of-its-node-hugepages-untouched",
    ),
    pytest.param(
        {0: ns((0,), 1, memory=MEM_USED_1G, hp1g=HP_FREE)},
        {"pod1": {"container1": [b((0,), MEMORY, GB)]}},
        256 * MB,
        [b((0,), MEMORY, 256 * MB)],
        {0: ns((0,), 1, memory=t(1536, 1280, 256, 512, 2048), hp1g=HP_FREE)},
        id="shrinks-giving-back-to-its-node",
    ),
    pytest.param(
        TWO_NODES_GROUPED,
        ON_BOTH,
        3 * GB,
        [b((0, 1), MEMORY, 3 * GB)],
        {
            0: ns((0, 1), 1, memory=t(1536, 0, 1536, 512, 2048), hp1g=HP_FREE),
            1: ns((0, 1), 1, memory=t(1536, 0, 1536, 512, 2048), hp1g=HP_FREE),
        },
        id="grows-over-the-group-of-nodes-it-holds",
    ),
    pytest.param(
        TWO_NODES_GROUPED,
        ON_BOTH,
        2 * GB,
        [b((0, 1), MEMORY, 2 * GB)],
        TWO_NODES_GROUPED,
        id="same-size-changes-nothing",
    ),
]


@pytest.mark.parametrize(("nodes", "assignments", "size", "want_blocks", "want_nodes"), RESIZE)
def test_resize(
    nodes: dict[int, NodeState],
    assignments: Assignments,
    size: int,
    want_blocks: list[Block],
    want_nodes: dict[int, NodeState],
) -> None:
    state = state_of(nodes, assignments)
    old = assignments["pod1"]["container1"][0].size
    assert resize(state, ref("pod1", "container1"), size) == old
    assert state.blocks(ref("pod1", "container1")) == want_blocks
    assert state.nodes == want_nodes


RESIZE_ERRORS = [
    pytest.param(
        {0: ns((0,), 1, memory=MEM_USED_1G), 1: ns((1,), 0, memory=MEM_FREE)},
        {"pod1": {"container1": [b((0,), MEMORY, GB)]}},
        2 * GB,
        f"{GB} more bytes of memory do not fit on NUMA node(s) 0 it holds ({512 * MB} bytes "
        "free there)",
        id="growth-past-its-node-is-not-placed-elsewhere",
    ),
    pytest.param(
        {0: ns((0,), 0, memory=MEM_FREE)},
        {},
        GB,
        "the container has no memory placed on NUMA nodes",
        id="no-blocks",
    ),
    pytest.param(
        {0: ns((0,), 1, hp1g=HP_USED, memory=MEM_FREE)},
        {"pod1": {"container1": [b((0,), HP1G, GB)]}},
        GB,
        "the container has no memory placed on NUMA nodes",
        id="hugepages-only",
    ),
]


@pytest.mark.parametrize(("nodes", "assignments", "size", "message"), RESIZE_ERRORS)
def test_resize_errors_change_nothing(
    nodes: dict[int, NodeState], assignments: Assignments, size: int, message: str
) -> None:
    state = state_of(nodes, assignments)
    with pytest.raises(MemoryAllocationError) as info:
        resize(state, ref("pod1", "container1"), size)
    assert str(info.value) == message
    assert state.nodes == nodes
    assert state.assignments == assignments
