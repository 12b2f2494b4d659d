"""The numa hook in-process: cpuset.mems, and Guaranteed containers' memory accounted per NUMA
node as kubelet's memory manager (Static policy) does, its stage methods called directly.

The node (`SMALL`): two NUMA nodes of 8 GiB, each with 1 GiB of 2Mi pages and 2 GiB of 1Gi
pages, so 5 GiB of regular memory each, less the default 100Mi reserved on node 0.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list
from crihook.hooks.numa import hook as numa_hook
from crihook.hooks.numa.hook import (
    NumaHook,
    container_requests,
    parse_quantity,
    parse_reserved_memory,
)
from crihook.hooks.numa.memory import MEMORY, MemoryState, memory_hints
from crihook.hooks.numa.saved import SavedNuma, read_saved
from crihook.hooks.sdk import MemoryState as PluginState
from crihook.hooks.spec import (
    ContainerKind,
    ContainerState,
    ContainerView,
    Event,
    Field,
    InvalidRequest,
    PodView,
    QoSClass,
    Reject,
    ResourcesView,
    Stage,
    TopologyHint,
)
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.hook_harness import (
    GIB,
    MIB,
    SMALL,
    Created,
    Node,
    besteffort,
    burstable,
    guaranteed,
    topology_of,
)

TOPO = topology_of(SMALL)
NODE0 = TOPO.cpus_in_numa([0])
NODE1 = TOPO.cpus_in_numa([1])
RESERVED = {0: {MEMORY: 100 * MIB}}
ALLOCATABLE = {0: 5 * GIB - 100 * MIB, 1: 5 * GIB}
BOTH = frozenset({0, 1})


async def start(options: dict[str, Any] | None = None, topology: Topology = TOPO) -> Node:
    node = Node(NumaHook(options or {}), topology)
    await node.sync()
    return node


async def pod(node: Node, sandbox_id: str, *containers: ContainerSpec, **kw: Any) -> PodView:
    return await node.run_pod(PodSpec(sandbox_id, containers=list(containers), **kw), sandbox_id)


def kept(node: Node) -> SavedNuma:
    """The hook's state as saved (a key per container), read back."""
    return read_saved(node.state.items())


def saved(node: Node) -> MemoryState:
    """The memory state as the hook saved it, on this machine (what a restart rebuilds)."""
    memory = kept(node).memory  # None: no container holds memory
    if memory is None:
        return MemoryState.build(TOPO, RESERVED)
    return MemoryState.from_dict(TOPO, RESERVED, memory)


def free(node: Node, numa: int, resource: str = MEMORY) -> int:
    return saved(node).nodes[numa].memory[resource].free


def blocks(node: Node) -> dict[str, dict[str, list[tuple[tuple[int, ...], str, int]]]]:
    state = saved(node)
    return {
        pod: {name: [(b.numa, b.resource, b.size) for b in bs] for name, bs in names.items()}
        for pod, names in state.assignments.items()
    }


def mems(created: Created) -> frozenset[int] | None:
    if created.pre is None or (Field.CPUSET_MEMS, "") not in created.pre.changes:
        return None
    return parse_cpu_list(created.pre.changes[(Field.CPUSET_MEMS, "")])


# --- what kubelet's memory manager accounts -------------------------------------------------------


def view(
    qos: QoSClass, memory: int | None, hugepages: dict[str, int] | None = None
) -> ContainerView:
    return ContainerView(
        "",
        "p",
        "app",
        resources=ResourcesView(
            qos_class=qos, memory_limit_bytes=memory, hugepage_limits=hugepages or {}
        ),
    )


REQUESTS = [
    pytest.param(view(QoSClass.GUARANTEED, GIB), {MEMORY: GIB}, id="memory"),
    pytest.param(
        view(QoSClass.GUARANTEED, GIB, {"2MB": 64 * MIB, "1GB": GIB}),
        {MEMORY: GIB, "hugepages-2Mi": 64 * MIB, "hugepages-1Gi": GIB},
        id="hugepages-2MB-1GB",
    ),
    pytest.param(
        view(QoSClass.GUARANTEED, GIB, {"64KB": 4 * MIB}),
        {MEMORY: GIB, "hugepages-64Ki": 4 * MIB},
        id="hugepages-64KB",
    ),
    pytest.param(
        view(QoSClass.GUARANTEED, GIB, {"2MB": 0, "2XB": 4 * MIB}),
        {MEMORY: GIB},
        id="zero-and-unknown-page-sizes-ignored",
    ),
    pytest.param(view(QoSClass.GUARANTEED, None), None, id="no-memory-limit"),
    pytest.param(view(QoSClass.BURSTABLE, GIB), None, id="burstable"),
    pytest.param(view(QoSClass.BEST_EFFORT, None), None, id="besteffort"),
]


@pytest.mark.parametrize(("container", "expected"), REQUESTS)
def test_container_requests(container: ContainerView, expected: dict[str, int] | None) -> None:
    assert container_requests(container) == expected


QUANTITIES = [
    pytest.param(1073741824, 1 << 30, id="int"),
    pytest.param("1Gi", 1 << 30, id="Gi"),
    pytest.param("512Mi", 512 << 20, id="Mi"),
    pytest.param("1G", 10**9, id="G"),
    pytest.param("100", 100, id="plain"),
]


@pytest.mark.parametrize(("text", "expected"), QUANTITIES)
def test_parse_quantity(text: object, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["1.5Gi", "-1", "lots", "1gi", True, -5, None])
def test_parse_quantity_refuses(text: object) -> None:
    with pytest.raises(ValueError, match="is not a memory quantity"):
        parse_quantity(text)


RESERVED_TABLES = [
    pytest.param(None, {0: {MEMORY: 100 * MIB}}, id="default-100Mi-first-node"),
    pytest.param({"1": "1Gi"}, {1: {MEMORY: GIB}}, id="node-amount"),
    pytest.param(
        {"0": {"memory": "1Gi", "hugepages-2Mi": "4Mi"}},
        {0: {MEMORY: GIB, "hugepages-2Mi": 4 * MIB}},
        id="per-resource",
    ),
    pytest.param({0: 1024}, {0: {MEMORY: 1024}}, id="int-key-and-value"),
]


@pytest.mark.parametrize(("table", "expected"), RESERVED_TABLES)
def test_parse_reserved_memory(table: object, expected: dict[int, dict[str, int]]) -> None:
    assert parse_reserved_memory(table, TOPO) == expected


def test_the_default_reservation_is_on_the_first_numa_node() -> None:
    only_node1 = Topology.build([c for c in TOPO.cpus.values() if c.numa == 1], [TOPO.memory[1]])
    assert parse_reserved_memory(None, only_node1) == {1: {MEMORY: 100 * MIB}}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        pytest.param("1Gi", "must be a table", id="not-a-table"),
        pytest.param({"node0": "1Gi"}, "'node0' is not a NUMA node number", id="bad-node"),
        pytest.param({"0": "lots"}, "reserved_memory 0: 'lots' is not a memory", id="bad-amount"),
    ],
)
def test_bad_reserved_memory_is_named(table: object, message: str) -> None:
    with pytest.raises(ValueError, match=r"^numa: reserved_memory") as info:
        parse_reserved_memory(table, TOPO)
    assert message in str(info.value)


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"numa: unknown option\(s\) reserved"):
        NumaHook({"reserved": "1Gi"})


@pytest.mark.parametrize(
    "table",
    [
        pytest.param({"5": "1Gi"}, id="node-the-machine-lacks"),
        pytest.param({"0": "0"}, id="nothing-reserved"),
        pytest.param({"0": "9Gi"}, id="more-than-the-node"),
    ],
)
async def test_a_reservation_the_node_cannot_take_fails_every_synchronize(table: object) -> None:
    node = Node(NumaHook({"reserved_memory": table}), TOPO)
    with pytest.raises(ValueError, match="numa: reserved_memory"):
        await node.sync()
    # Not a hook that silently accounts nothing from now on.
    with pytest.raises(ValueError, match="numa: reserved_memory"):
        await node.sync()


# --- cpuset.mems and the allocation -----------------------------------------------------------


@pytest.mark.parametrize(
    ("cpuset", "numa"),
    [
        pytest.param("0,8", 0, id="node0"),
        pytest.param("4,12", 1, id="node1"),
    ],
)
async def test_memory_goes_to_the_numa_node_of_the_exclusive_cpus(cpuset: str, numa: int) -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, 2 * GIB))
    created = await node.create(p, guaranteed("app", 2000, 2 * GIB), "c1", cpuset=cpuset)
    assert mems(created) == {numa}
    assert blocks(node) == {"g": {"app": [((numa,), MEMORY, 2 * GIB)]}}
    assert free(node, numa) == ALLOCATABLE[numa] - 2 * GIB
    assert free(node, 1 - numa) == ALLOCATABLE[1 - numa]


async def test_memory_widens_when_the_nodes_of_the_cpus_cannot_hold_it() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, 6 * GIB))
    created = await node.create(p, guaranteed("app", 2000, 6 * GIB), "c1", cpuset="4,12")
    assert mems(created) == BOTH
    assert blocks(node) == {"g": {"app": [((0, 1), MEMORY, 6 * GIB)]}}
    # kubelet takes it node by node, in order.
    assert free(node, 0) == 0
    assert free(node, 1) == ALLOCATABLE[1] - (6 * GIB - ALLOCATABLE[0])


async def test_a_node_grouped_with_others_is_near_only_as_its_group() -> None:
    node = await start()
    p = await pod(node, "a", guaranteed("big", 2000, 6 * GIB), guaranteed("small", 2000, GIB))
    await node.create(p, guaranteed("big", 2000, 6 * GIB), "c1", cpuset="4,12")
    # Node 1 (with 3.9 GiB free) serves the group {0, 1} now; kubelet never hints it alone.
    small = await node.create(p, guaranteed("small", 2000, GIB), "c2", cpuset="5,13")
    assert mems(small) == BOTH
    assert blocks(node)["a"]["small"] == [((0, 1), MEMORY, GIB)]
    assert [saved(node).nodes[n].cells for n in (0, 1)] == [(0, 1), (0, 1)]


async def test_a_guaranteed_container_on_the_shared_pool_gets_kubelets_own_choice() -> None:
    # The shared pool (every CPU but an exclusive container's) says nothing about where the
    # container runs: its memory goes where kubelet's memory manager alone puts it (the
    # narrowest preferred node, the lowest), not across every node of the shared pool.
    node = await start()
    p = await pod(node, "s", guaranteed("app", 1500, GIB))
    shared = format_cpu_list(TOPO.online - {4, 12})
    created = await node.create(p, guaranteed("app", 1500, GIB), "c1", cpuset=shared)
    assert mems(created) == {0}
    assert saved(node).nodes[1].cells == (1,)
    # So node 1 is still whole for an exclusive container there.
    g = await pod(node, "g", guaranteed("app", 2000, GIB))
    assert mems(await node.create(g, guaranteed("app", 2000, GIB), "c2", cpuset="4,12")) == {1}


async def test_without_cpus_from_the_cpuset_hook_kubelets_choice_is_taken() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, GIB))
    assert mems(await node.create(p, guaranteed("app", 2000, GIB), "c1")) == {0}


@pytest.mark.parametrize(
    ("affinity", "size", "expected"),
    [
        pytest.param(TopologyHint(frozenset({1}), True), GIB, {1}, id="preferred-fits"),
        pytest.param(TopologyHint(frozenset({1}), False), 6 * GIB, BOTH, id="widened"),
        pytest.param(TopologyHint(BOTH, True), GIB, BOTH, id="two-nodes"),
    ],
)
async def test_the_topology_policys_choice_is_followed(
    affinity: TopologyHint, size: int, expected: frozenset[int]
) -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, size))
    created = await node.create(p, guaranteed("app", 2000, size), "c1", affinity=affinity)
    assert mems(created) == expected


REFUSED = [
    pytest.param(
        TopologyHint(frozenset({1}), True),
        4 * GIB,
        {},
        f"memory {4 * GIB} bytes (free: {3 * GIB}) on NUMA node(s) 1",
        id="memory",
    ),
    pytest.param(
        TopologyHint(frozenset({1}), True),
        GIB,
        {"1GB": 2 * GIB},
        f"hugepages-1Gi {2 * GIB} bytes (free: {GIB}) on NUMA node(s) 1",
        id="hugepages",
    ),
]


@pytest.mark.parametrize(("affinity", "size", "hugepages", "message"), REFUSED)
async def test_a_preferred_placement_that_cannot_be_met_is_refused_naming_what_did_not_fit(
    affinity: TopologyHint, size: int, hugepages: dict[str, int], message: str
) -> None:
    node = await start()
    # Node 1 already serves a container of 2 GiB and one 1Gi page: it cannot join a group.
    x = await pod(node, "x", guaranteed("x", 2000, 2 * GIB))
    await node.create(
        x, guaranteed("x", 2000, 2 * GIB), "x1", cpuset="4,12", hugepages={"1GB": GIB}
    )
    before = blocks(node)
    p = await pod(node, "g", guaranteed("app", 2000, size))
    with pytest.raises(Reject) as info:
        await node.begin_create(
            p, guaranteed("app", 2000, size), affinity=affinity, hugepages=hugepages
        )
    assert info.value.reason == (
        f"container 'app' of pod default/g: {message}: "
        "failed to find NUMA nodes to extend the current topology hint"  # kubelet's words
    )
    assert blocks(node) == before
    assert kept(node).pending == {}


async def test_a_preferred_placement_is_kept_when_kubelet_prefers_the_wider_one() -> None:
    # No single node holds 6 GiB: kubelet's preferred hints are the pairs, so it widens.
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, 6 * GIB))
    affinity = TopologyHint(frozenset({1}), True)
    created = await node.create(p, guaranteed("app", 2000, 6 * GIB), "c1", affinity=affinity)
    assert mems(created) == BOTH


async def test_hugepages_follow_the_request() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, GIB))
    pages = {"2MB": 64 * MIB, "1GB": GIB}
    created = await node.create(
        p, guaranteed("app", 2000, GIB), "c1", cpuset="4,12", hugepages=pages
    )
    assert mems(created) == {1}
    assert sorted(blocks(node)["g"]["app"]) == [
        ((1,), "hugepages-1Gi", GIB),
        ((1,), "hugepages-2Mi", 64 * MIB),
        ((1,), MEMORY, GIB),
    ]
    assert free(node, 1, "hugepages-2Mi") == GIB - 64 * MIB
    assert free(node, 1, "hugepages-1Gi") == GIB


@pytest.mark.parametrize(
    "container",
    [
        pytest.param(burstable("app", 2000, 2 * GIB), id="burstable"),
        pytest.param(besteffort("app"), id="besteffort"),
    ],
)
async def test_other_containers_get_every_memory_node(container: ContainerSpec) -> None:
    node = await start()
    p = await pod(node, "p", container)
    created = await node.create(p, container, "c1", cpuset="4,12")
    assert mems(created) == BOTH
    assert created.hints is None
    assert blocks(node) == {}
    assert (await node.update("c1", api_pb2.LinuxContainerResources()))[0] is None


async def test_a_node_without_memory_facts_accounts_nothing() -> None:
    bare = Topology.build(TOPO.cpus.values())
    node = await start(topology=bare)
    p = await pod(node, "g", guaranteed("app", 2000))
    created = await node.create(p, guaranteed("app", 2000), "c1", cpuset="4,12")
    assert mems(created) == BOTH  # the NUMA nodes of the CPUs
    assert kept(node).memory is None


async def test_hints_are_kubelets() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, 6 * GIB))
    created = await node.begin_create(p, guaranteed("app", 2000, 6 * GIB))
    state = MemoryState.build(TOPO, RESERVED)
    assert created.hints == memory_hints(state, {MEMORY: 6 * GIB})
    assert created.hints == {MEMORY: [TopologyHint(BOTH, True)]}


# --- release -------------------------------------------------------------------------------------


async def test_confirm_then_stop_releases() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000))
    created = await node.begin_create(p, guaranteed("app", 2000), cpuset="4,12")
    assert kept(node).pending == {"g/app/0": {"ref": ["g", "app"], "new": True}}
    await node.finish_create(p, created, "c1")
    assert kept(node).pending == {}
    assert kept(node).owners == {"c1": ["g", "app"]}
    assert await node.stop("c1") is None
    assert blocks(node) == {}
    assert kept(node).owners == {}
    assert await node.remove("c1") is None
    assert free(node, 1) == ALLOCATABLE[1]


async def test_a_failed_create_releases() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000))
    created = await node.begin_create(p, guaranteed("app", 2000), cpuset="4,12")
    assert free(node, 1) == ALLOCATABLE[1] - GIB
    await node.fail_create(p, created)
    assert blocks(node) == {}
    assert kept(node).pending == {}
    assert free(node, 1) == ALLOCATABLE[1]


async def test_remove_releases() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000))
    await node.create(p, guaranteed("app", 2000), "c1", cpuset="4,12")
    await node.remove("c1")
    assert blocks(node) == {}
    assert kept(node).owners == {}


async def test_removing_the_pod_releases_everything_of_it() -> None:
    node = await start()
    spec = [guaranteed("a", 2000), guaranteed("b", 2000), guaranteed("c", 2000)]
    p = await pod(node, "g", *spec)
    other = await pod(node, "o", guaranteed("x", 2000))
    await node.create(other, guaranteed("x", 2000), "x1", cpuset="0,8")
    await node.create(p, spec[0], "c1", cpuset="4,12")
    await node.create(p, spec[1], "c2", cpuset="5,13")
    await node.begin_create(p, spec[2], cpuset="6,14")  # its post stage never came
    assert sorted(blocks(node)["g"]) == ["a", "b", "c"]
    await node.remove_pod("g")
    assert blocks(node) == {"o": {"x": [((0,), MEMORY, GIB)]}}
    assert kept(node).owners == {"x1": ["o", "x"]}
    assert kept(node).pending == {}
    assert free(node, 1) == ALLOCATABLE[1]


async def test_a_restarted_container_keeps_its_memory() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, 2 * GIB))
    first = await node.create(p, guaranteed("app", 2000, 2 * GIB), "c1", cpuset="4,12")
    node.set_state("c1", ContainerState.EXITED)  # it crashed; kubelet creates attempt 1
    retry = await node.begin_create(p, guaranteed("app", 2000, 2 * GIB), attempt=1, cpuset="4,12")
    assert kept(node).pending == {"g/app/1": {"ref": ["g", "app"], "new": False}}
    await node.fail_create(p, retry)  # a failed restart frees nothing of the first attempt's
    assert free(node, 1) == ALLOCATABLE[1] - 2 * GIB
    again = await node.create(p, guaranteed("app", 2000, 2 * GIB), "c2", attempt=1, cpuset="4,12")
    assert mems(again) == mems(first) == {1}
    assert free(node, 1) == ALLOCATABLE[1] - 2 * GIB  # counted once
    # kubelet removes the old attempt: the memory stays with the new one.
    await node.remove("c1")
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, 2 * GIB)]}}
    assert kept(node).owners == {"c2": ["g", "app"]}
    await node.remove("c2")
    assert blocks(node) == {}


async def test_the_mems_crihook_set_are_sticky() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("app", 2000, 6 * GIB))
    await node.create(p, guaranteed("app", 2000, 6 * GIB), "c1", cpuset="4,12")
    pre, _, request = await node.update("c1", api_pb2.LinuxContainerResources(cpuset_mems="1"))
    assert pre is not None
    assert pre.changes == {(Field.CPUSET_MEMS, ""): "0-1"}
    assert request.linux.cpuset_mems == "0-1"
    await node.stop("c1")
    assert (await node.update("c1", api_pb2.LinuxContainerResources()))[0] is None


# --- synchronize ----------------------------------------------------------------------------------


def runs(node: Node, cid: str, pod: str, spec: ContainerSpec, mems: str, **kw: Any) -> None:
    """A container the runtime has, with the memory nodes it reports."""
    built, _ = node.create_request(node.pods[pod], spec, **kw)
    node.containers[cid] = ContainerView(
        cid,
        pod,
        spec.name,
        attempt=built.attempt,
        kind=ContainerKind.UNKNOWN,
        resources=ResourcesView(
            qos_class=built.resources.qos_class,
            memory_limit_bytes=built.resources.memory_limit_bytes,
            integer_cpus=built.resources.integer_cpus,
            cpuset_mems=mems,
        ),
    )
    node.set_state(cid, ContainerState.RUNNING)


async def test_synchronize_adopts_running_guaranteed_containers_where_they_run() -> None:
    node = Node(NumaHook({}), TOPO)
    node.add_pod(PodSpec("g", containers=[guaranteed("app", 2000, 2 * GIB)]), "g")
    node.add_pod(PodSpec("s", containers=[burstable("app")]), "s")
    runs(node, "c1", "g", guaranteed("app", 2000, 2 * GIB), "1")
    runs(node, "s1", "s", burstable("app"), "")
    assert await node.sync() == []
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, 2 * GIB)]}}
    assert kept(node).owners == {"c1": ["g", "app"]}


async def test_synchronize_repairs_live_containers_only() -> None:
    node = Node(NumaHook({}), TOPO)
    node.add_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    node.add_pod(PodSpec("s", containers=[burstable("a"), burstable("b")]), "s")
    node.state.set(
        "memory",
        {
            "version": 1,
            "entries": {"g": {"app": [{"numaAffinity": [1], "type": "memory", "size": GIB}]}},
        },
    )
    node.state.set("owners", {"c1": ["g", "app"]})
    runs(node, "c1", "g", guaranteed("app", 2000), "0")  # its memory is on node 1
    runs(node, "s1", "s", burstable("a"), "1")  # a shared container belongs on every node
    runs(node, "s2", "s", burstable("b"), "1")
    node.set_state("s2", ContainerState.EXITED)
    repairs = await node.sync()
    assert [(u.container_id, u.resources.cpuset_mems) for u in repairs] == [
        ("c1", "1"),
        ("s1", "0-1"),
    ]


async def test_synchronize_confirms_or_drops_pending_reservations_and_frees_the_gone() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("a", 2000), guaranteed("b", 2000), guaranteed("c", 2000))
    await node.create(p, guaranteed("a", 2000), "c1", cpuset="0,8")
    await node.begin_create(p, guaranteed("b", 2000), cpuset="4,12")  # the runtime made it
    await node.begin_create(p, guaranteed("c", 2000), cpuset="5,13")  # the runtime did not
    restarted = Node(NumaHook({}), TOPO, state=node.state)
    restarted.pods, restarted.specs = node.pods, node.specs
    runs(restarted, "c2", "g", guaranteed("b", 2000), "1")  # c1 is gone
    assert await restarted.sync() == []
    assert kept(restarted).pending == {}
    assert kept(restarted).owners == {"c2": ["g", "b"]}
    assert blocks(restarted) == {"g": {"b": [((1,), MEMORY, GIB)]}}


async def test_the_accounting_survives_a_restart() -> None:
    node = await start()
    p = await pod(node, "g", guaranteed("a", 2000, 6 * GIB), guaranteed("b", 2000, GIB))
    await node.create(p, guaranteed("a", 2000, 6 * GIB), "c1", cpuset="4,12")
    await node.create(p, guaranteed("b", 2000, GIB), "c2", cpuset="0,8")
    before = kept(node).memory
    restarted = Node(NumaHook({}), TOPO, state=node.state)
    restarted.pods, restarted.specs = node.pods, node.specs
    restarted.containers, restarted.states = node.containers, node.states
    assert await restarted.sync() == []
    assert kept(restarted).memory == before
    assert kept(restarted).owners == {"c1": ["g", "a"], "c2": ["g", "b"]}
    # The rebuilt state is what the first hook kept: the next container sees the same node.
    s = await pod(restarted, "h", guaranteed("x", 2000, GIB))
    created = await restarted.create(s, guaranteed("x", 2000, GIB), "c3", cpuset="4,12")
    assert mems(created) == BOTH  # node 1 is in the group {0, 1}
    await restarted.remove("c1")
    await restarted.remove("c2")
    await restarted.remove("c3")
    assert blocks(restarted) == {}
    assert [free(restarted, n) for n in (0, 1)] == [ALLOCATABLE[0], ALLOCATABLE[1]]


def test_the_hook_module_exports_its_helpers() -> None:
    assert set(numa_hook.__all__) == {
        "NumaHook",
        "container_requests",
        "parse_quantity",
        "parse_reserved_memory",
    }


async def test_a_memory_resize_of_a_placed_container_is_refused_and_a_revert_passes() -> None:
    """kubelet's rule (InPlacePodVerticalScalingExclusiveMemory off)."""
    node = await start()
    g = await pod(node, "g", guaranteed("app", 2000, 2 * GIB))
    await node.create(g, guaranteed("app", 2000, 2 * GIB), "c1")
    grow = api_pb2.LinuxContainerResources(cpu_shares=2048, memory_limit_in_bytes=4 * GIB)
    with pytest.raises(Reject, match="infeasible"):
        await node.update("c1", grow)
    same = api_pb2.LinuxContainerResources(cpu_shares=2048, memory_limit_in_bytes=2 * GIB)
    pre, _, _ = await node.update("c1", same)
    assert pre is not None  # the sticky cpuset.mems


# --- in-place memory resize (resize_exclusive_memory, kubelet's alpha gate) ---------------------

RESIZE = {"resize_exclusive_memory": True}


def resized(memory: int) -> api_pb2.LinuxContainerResources:
    """kubelet's UpdateContainerResources for a resize of a 2-CPU Guaranteed container."""
    return api_pb2.LinuxContainerResources(
        cpu_shares=2048, cpu_quota=200_000, cpu_period=100_000, memory_limit_in_bytes=memory
    )


async def placed(node: Node, memory: int = 2 * GIB) -> PodView:
    g = await pod(node, "g", guaranteed("app", 2000, memory))
    await node.create(g, guaranteed("app", 2000, memory), "c1", cpuset="4-5")  # on node 1
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, memory)]}}
    return g


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_resize_exclusive_memory_is_a_boolean(value: object) -> None:
    with pytest.raises(ValueError, match="numa: resize_exclusive_memory must be true or false"):
        NumaHook({"resize_exclusive_memory": value})


async def test_by_default_a_resize_is_refused_naming_the_setting_and_partial_updates_pass() -> None:
    node = await start()
    await placed(node)
    with pytest.raises(Reject) as info:
        await node.update("c1", resized(3 * GIB))
    assert "resize_exclusive_memory = true" in info.value.reason
    # kubelet's static CPU manager and crictl send no memory limit (0): no resize.
    for partial in (
        api_pb2.LinuxContainerResources(cpuset_cpus="4-5"),
        api_pb2.LinuxContainerResources(cpu_shares=4),
    ):
        _, _, request = await node.update("c1", partial)
        assert request.linux.cpuset_mems == "1"
        assert request.linux.memory_limit_in_bytes == 0
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, 2 * GIB)]}}
    assert node.containers["c1"].resources.memory_limit_bytes == 2 * GIB


async def test_memory_grows_within_its_numa_node_and_is_held_from_the_pre_stage() -> None:
    node = await start(RESIZE)
    await placed(node)
    _, _, request = await node.update("c1", resized(3 * GIB))
    assert request.linux.cpuset_mems == "1"  # where it was
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, 3 * GIB)]}}
    assert free(node, 1) == ALLOCATABLE[1] - 3 * GIB
    assert free(node, 0) == ALLOCATABLE[0]
    assert node.state.get("resizing") is None
    # It shrinks back in place.
    await node.update("c1", resized(GIB))
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, GIB)]}}
    assert free(node, 1) == ALLOCATABLE[1] - GIB


async def test_a_growth_past_its_numa_nodes_is_refused_and_changes_nothing() -> None:
    node = await start(RESIZE)
    await placed(node)
    before = kept(node).memory
    with pytest.raises(Reject) as info:
        await node.update("c1", resized(6 * GIB))
    reason = info.value.reason
    assert "resize of container 'app' to 6442450944 bytes of memory is infeasible" in reason
    assert f"NUMA node(s) 1 it holds ({ALLOCATABLE[1] - 2 * GIB} bytes free there)" in reason
    assert kept(node).memory == before
    assert node.state.get("resizing") is None
    # The memory node 0 has free is not taken instead.
    assert free(node, 0) == ALLOCATABLE[0]


async def test_a_growth_the_runtime_does_not_apply_is_given_back() -> None:
    node = await start(RESIZE)
    await placed(node)
    await node.fail_update("c1", resized(3 * GIB))
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, 2 * GIB)]}}
    assert free(node, 1) == ALLOCATABLE[1] - 2 * GIB
    assert node.state.get("resizing") is None


async def test_a_shrink_gives_memory_back_only_once_the_runtime_applied_it() -> None:
    node = await start(RESIZE)
    g = await placed(node)
    view = node.containers["c1"]
    request = api_pb2.UpdateContainerResourcesRequest(container_id="c1", linux=resized(GIB))
    event = Event.UPDATE_CONTAINER_RESOURCES
    await node.stage(event, Stage.PRE, g, view, request)
    # Not given back yet: another container must not take what the runtime may keep.
    assert free(node, 1) == ALLOCATABLE[1] - 2 * GIB
    assert node.state.get("resizing") == {"c1": {"from": 2 * GIB, "to": GIB}}
    await node.stage(event, Stage.FAILED, g, view, request, failure="runtime said no")
    assert free(node, 1) == ALLOCATABLE[1] - 2 * GIB
    assert blocks(node) == {"g": {"app": [((1,), MEMORY, 2 * GIB)]}}


RESIZE_OUTCOMES = [
    pytest.param(3 * GIB, 3 * GIB, 3 * GIB, id="growth-applied-stays-held"),
    pytest.param(3 * GIB, 2 * GIB, 2 * GIB, id="growth-not-applied-given-back"),
    pytest.param(GIB, GIB, GIB, id="shrink-applied-given-back"),
    pytest.param(GIB, 2 * GIB, 2 * GIB, id="shrink-not-applied-stays"),
]


@pytest.mark.parametrize(("to", "runs_with", "held"), RESIZE_OUTCOMES)
async def test_a_resize_whose_answer_was_not_seen_is_settled_at_synchronize(
    to: int, runs_with: int, held: int
) -> None:
    """The runtime went away mid-call (or crihook did): at the next synchronize the limit the
    container runs with says whether the runtime applied it."""
    node = await start(RESIZE)
    g = await placed(node)
    view = node.containers["c1"]
    request = api_pb2.UpdateContainerResourcesRequest(container_id="c1", linux=resized(to))
    await node.stage(Event.UPDATE_CONTAINER_RESOURCES, Stage.PRE, g, view, request)
    res = dataclasses.replace(view.resources, memory_limit_bytes=runs_with)
    node.containers["c1"] = dataclasses.replace(view, resources=res)
    restarted = Node(NumaHook(RESIZE), TOPO, state=node.state)
    restarted.pods, restarted.specs = node.pods, node.specs
    restarted.containers, restarted.states = node.containers, node.states
    await restarted.sync("reconcile")
    assert blocks(restarted) == {"g": {"app": [((1,), MEMORY, held)]}}
    assert free(restarted, 1) == ALLOCATABLE[1] - held
    assert restarted.state.get("resizing") is None


# --- values crihook's door refuses, reaching the hook all the same (an SDK plugin, a replay) ---


def test_a_negative_memory_limit_is_an_invalid_request_not_a_crash() -> None:
    """Issue 28: `--hooks cpuset,numa,oom`, a Guaranteed container with a negative memory
    limit crashed the hook (ValueError: INTERNAL and a traceback). It is the request's fault:
    InvalidRequest (INVALID_ARGUMENT) naming the value; -1 is "no limit": nothing accounted."""

    def view(limit: int) -> ContainerView:
        resources = ResourcesView(qos_class=QoSClass.GUARANTEED, memory_limit_bytes=limit)
        return ContainerView(id="c1", pod_id="p1", name="app", resources=resources)

    with pytest.raises(InvalidRequest, match="memory_limit_in_bytes -1073741824 is negative"):
        container_requests(view(-GIB))
    assert container_requests(view(-1)) is None
    assert container_requests(view(GIB)) == {MEMORY: GIB}


async def test_the_hook_refuses_a_negative_limit_in_both_of_its_create_stages() -> None:
    node = await start()
    app = guaranteed("app", 1000, memory=-GIB)
    sandbox = await pod(node, "neg", app)
    with pytest.raises(InvalidRequest, match="is negative"):
        await node.begin_create(sandbox, app)
    assert saved(node).assignments == {}  # nothing held for the refused call


class CountedState(PluginState):
    """A HookState counting the bytes of JSON each `set` writes (what the store journals)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def set(self, key: str, value: Any) -> None:
        self.written += len(json.dumps(value))
        super().set(key, value)


@pytest.mark.parametrize("held", [2, 40], ids=["2-guaranteed", "40-guaranteed"])
async def test_a_guaranteed_create_writes_its_own_keys_whatever_the_node_holds(held: int) -> None:
    """Counted, not timed: the state a Guaranteed CreateContainer writes is the same with 40
    Guaranteed containers on the node as with 2 (it was the whole memory state, every owner
    and every reservation)."""
    state = CountedState()
    node = Node(NumaHook({}), TOPO, state=state)
    await node.sync()
    for i in range(held):
        p = await pod(node, f"g{i}", guaranteed("app", 1000, 64 * MIB))
        await node.create(p, guaranteed("app", 1000, 64 * MIB), f"c{i}", cpuset="0")
    p = await pod(node, "new", guaranteed("app", 1000, 64 * MIB))
    state.written = 0
    await node.create(p, guaranteed("app", 1000, 64 * MIB), "c-new", cpuset="0")
    # Its blocks (twice: reserved, then confirmed with its owner), its owner and reservation.
    assert state.written < 400
    assert kept(node).owners["c-new"] == ["new", "app"]
