"""The cpuset hook in-process: its stage methods called directly, as the chain would.

Expected CPUs are kubelet's picks, computed with the ported picker (`take_cpus`, checked
against kubelet's own vectors in test_cpuset_picker.py) from the CPUs kubelet's static policy
would consider at that point: the free ones, plus those the container may reuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.cpus import cpu_hints, take_cpus
from crihook.hooks.cpus.options import CpusetOptions, parse_options, reserved_cpus
from crihook.hooks.cpus.pool import CpuPool, Holder
from crihook.hooks.cpus.rules import exclusive_cpus, slice_cpus
from crihook.hooks.cpuset import CpusetHook
from crihook.hooks.node import format_cpu_list, parse_cpu_list, read_topology
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import (
    Adjustment,
    ContainerKind,
    ContainerState,
    ContainerView,
    Event,
    Field,
    PodView,
    QoSClass,
    Reject,
    ResourcesView,
    Stage,
    TopologyHint,
)
from crihook.hooks.spec.views import pod_view_from_config
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, sandbox_config
from tests.lab.sysfs import OFFLINE_CPUS, MachineSpec, write_sysfs
from tests.unit.hook_harness import (
    GIB,
    SMALL,
    Node,
    besteffort,
    burstable,
    every_update,
    guaranteed,
    topology_of,
)

TOPO = topology_of(SMALL)
ONLINE = TOPO.online
NODE0 = TOPO.cpus_in_numa([0])
NODE1 = TOPO.cpus_in_numa([1])
INIT = "crihook.io/init-containers"
SIDECARS = "crihook.io/sidecar-containers"


async def start(
    options: dict[str, Any] | None = None, *, scope: str = "container", policy: str = "none"
) -> Node:
    node = Node(CpusetHook(options or {}), TOPO, scope=scope, policy=policy)
    await node.sync()
    return node


def pool_of(node: Node) -> CpuPool:
    hook = node.hook
    assert isinstance(hook, CpusetHook)
    return hook.pool


async def pod(node: Node, sandbox_id: str, *containers: ContainerSpec, **kw: Any) -> PodView:
    return await node.run_pod(PodSpec(sandbox_id, containers=list(containers), **kw), sandbox_id)


def cpuset(adjustment: Adjustment | None) -> frozenset[int] | None:
    if adjustment is None or (Field.CPUSET_CPUS, "") not in adjustment.changes:
        return None
    return parse_cpu_list(adjustment.changes[(Field.CPUSET_CPUS, "")])


def quota(adjustment: Adjustment | None) -> int | None:
    return None if adjustment is None else adjustment.changes.get((Field.CPU_QUOTA, ""))


def updates(adjustment: Adjustment | None) -> list[tuple[str, frozenset[int]]]:
    if adjustment is None:
        return []
    return [
        (u.container_id, parse_cpu_list(u.resources.cpuset_cpus or ""))
        for u in every_update(adjustment)
    ]


def state_keys(node: Node, prefix: str) -> list[str]:
    return sorted(k for k, _ in node.state.items() if k.startswith(prefix))


# --- options ------------------------------------------------------------------------------------

OPTIONS_OK = [
    pytest.param({}, CpusetOptions(), id="defaults"),
    pytest.param({"reserved_cpus": "0-1"}, CpusetOptions(reserved="0-1"), id="reserved-list"),
    pytest.param({"reserved_cpus": 2}, CpusetOptions(reserved=2), id="reserved-count"),
    pytest.param(
        {"policy_options": {"full-pcpus-only": "true"}},
        CpusetOptions(full_pcpus_only=True),
        id="full-pcpus-only",
    ),
    pytest.param(
        {"policy_options": {"distribute-cpus-across-numa": "True"}},
        CpusetOptions(distribute_cpus_across_numa=True),
        id="distribute-any-case",
    ),
    pytest.param(
        {"policy_options": {"full-pcpus-only": "false", "distribute-cpus-across-numa": True}},
        CpusetOptions(distribute_cpus_across_numa=True),
        id="false-string-and-toml-bool",
    ),
    pytest.param(
        {"disable_cfs_quota": False}, CpusetOptions(disable_cfs_quota=False), id="keep-quota"
    ),
    pytest.param(
        {"resize_exclusive_cpus": True},
        CpusetOptions(resize_exclusive_cpus=True),
        id="resize-exclusive-cpus",
    ),
]


@pytest.mark.parametrize(("options", "expected"), OPTIONS_OK)
def test_options_parse(options: dict[str, Any], expected: CpusetOptions) -> None:
    assert parse_options(options) == expected
    assert CpusetHook(options).config == expected


OPTIONS_BAD = [
    pytest.param({"reserved": 2}, "unknown option(s) reserved", id="unknown-key"),
    pytest.param({"reserved_cpus": -1}, "reserved_cpus must be >= 0", id="negative-count"),
    pytest.param({"reserved_cpus": True}, "reserved_cpus must be a cpulist", id="bool-count"),
    pytest.param({"reserved_cpus": 1.5}, "reserved_cpus must be a cpulist", id="float-count"),
    pytest.param({"reserved_cpus": "0-x"}, "reserved_cpus", id="bad-cpulist"),
    pytest.param(
        {"policy_options": {"prefer-closest-numa-nodes": "true"}},
        "policy_options: 'prefer-closest-numa-nodes' is not supported",
        id="not-a-cpu-manager-option",
    ),
    pytest.param(
        {"policy_options": {"full-pcpus-only": "yes"}},
        'policy_options \'full-pcpus-only\' must be "true" or "false"',
        id="bad-option-value",
    ),
    pytest.param(
        {"policy_options": "full-pcpus-only"}, "policy_options must be a table", id="not-a-table"
    ),
    pytest.param(
        {"disable_cfs_quota": "false"}, "disable_cfs_quota must be true or false", id="quota-str"
    ),
    pytest.param(
        {"resize_exclusive_cpus": "true"},
        "resize_exclusive_cpus must be true or false",
        id="resize-str",
    ),
]


@pytest.mark.parametrize(("options", "message"), OPTIONS_BAD)
def test_bad_options_name_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"^cpuset: ") as info:
        CpusetHook(options)
    assert message in str(info.value)


RESERVED = [
    pytest.param("0-1", {}, frozenset({0, 1}), id="list"),
    pytest.param("", {}, frozenset(), id="empty-list"),
    pytest.param(0, {}, frozenset(), id="zero"),
    # kubelet's takeByTopology on all CPUs: low-numbered whole cores.
    pytest.param(2, {}, frozenset({0, 8}), id="count-packed"),
    pytest.param(3, {}, take_cpus(TOPO, ONLINE, 3), id="count-packed-odd"),
    # ... which follows distribute-cpus-across-numa (and full-pcpus-only with it).
    pytest.param(
        10,
        {"spread_numa": True},
        take_cpus(TOPO, ONLINE, 10, spread_numa=True),
        id="count-distributed",
    ),
    pytest.param(
        12,
        {"spread_numa": True, "full_cores": True},
        take_cpus(TOPO, ONLINE, 12, spread_numa=True, full_cores=True),
        id="count-distributed-whole-cores",
    ),
    # Not whole cores: kubelet's distributed pick falls back to packed.
    pytest.param(
        9, {"spread_numa": True, "full_cores": True}, take_cpus(TOPO, ONLINE, 9), id="odd-packed"
    ),
]


@pytest.mark.parametrize(("reserved", "flags", "expected"), RESERVED)
def test_reserved_cpus_are_picked_as_kubelet_picks_them(
    reserved: str | int, flags: dict[str, bool], expected: frozenset[int]
) -> None:
    assert reserved_cpus(TOPO, reserved, **flags) == expected


def test_a_distributed_reserved_count_differs_from_the_packed_one() -> None:
    # What the two rows above tell apart: the strategy matters for the count.
    assert take_cpus(TOPO, ONLINE, 10, spread_numa=True) != take_cpus(TOPO, ONLINE, 10)


async def test_the_hook_reserves_with_its_policy_options() -> None:
    node = await start(
        {"reserved_cpus": 10, "policy_options": {"distribute-cpus-across-numa": "true"}}
    )
    assert pool_of(node).reserved == take_cpus(TOPO, ONLINE, 10, spread_numa=True)


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        pytest.param("14-17", "not online: [16, 17]", id="offline-list"),
        pytest.param(17, "reserved_cpus = 17", id="count-too-big"),
    ],
)
async def test_reserved_cpus_that_do_not_fit_the_node_fail_synchronize(
    reserved: str | int, message: str
) -> None:
    node = Node(CpusetHook({"reserved_cpus": reserved}), TOPO)
    with pytest.raises(ValueError, match="cpuset: reserved_cpus") as info:
        await node.sync()
    assert message in str(info.value)


# --- who gets exclusive CPUs ----------------------------------------------------------------


CLASSES = [
    pytest.param(guaranteed("app", 2000), {}, 2, -1, id="guaranteed-integer"),
    pytest.param(guaranteed("app", 1500), {}, None, None, id="guaranteed-fraction"),
    pytest.param(
        ContainerSpec("app", cpu_request=2000, memory_request=GIB), {}, None, None, id="burstable"
    ),
    pytest.param(
        ContainerSpec("app", cpu_request=2000, cpu_limit=4000, memory_limit=GIB),
        {},
        None,
        None,
        id="burstable-limit-above-request",
    ),
    pytest.param(besteffort("app"), {}, None, None, id="besteffort"),
    pytest.param(
        guaranteed("app", 2000), {"disable_cfs_quota": False}, 2, None, id="quota-kept-by-option"
    ),
]


@pytest.mark.parametrize(("container", "options", "exclusive", "cpu_quota"), CLASSES)
async def test_exclusive_cpus_only_for_integer_cpus_of_guaranteed_pods(
    container: ContainerSpec, options: dict[str, Any], exclusive: int | None, cpu_quota: int | None
) -> None:
    node = await start(options)
    p = await pod(node, "sb", container)
    created = await node.create(p, container, "c1")
    if exclusive is None:
        assert cpuset(created.pre) == ONLINE  # the whole shared pool
        assert pool_of(node).containers["c1"].cpus == frozenset()
        assert state_keys(node, "c:") == []  # holding no CPUs: a restart adopts it
    else:
        assert cpuset(created.pre) == take_cpus(TOPO, ONLINE, exclusive)
        assert pool_of(node).containers["c1"].cpus == cpuset(created.pre)
    assert quota(created.pre) == cpu_quota


async def test_reserved_cpus_stay_shared_and_are_never_handed_out() -> None:
    node = await start({"reserved_cpus": format_cpu_list(NODE0)})
    p = await pod(node, "s", burstable("s"))
    await node.create(p, burstable("s"), "s1")
    assert node.cpus("s1") == ONLINE  # reserved CPUs are in the shared pool
    taken: set[int] = set()
    for i in range(4):
        g = await pod(node, f"g{i}", guaranteed("app", 2000))
        created = await node.create(g, guaranteed("app", 2000), f"g{i}")
        got = cpuset(created.pre)
        assert got is not None
        assert got <= NODE1
        assert not got & taken
        taken |= got
    assert node.cpus("s1") == NODE0  # only the reserved CPUs are left to share
    g = await pod(node, "g4", guaranteed("app", 1000))
    with pytest.raises(Reject, match="not enough cpus available"):
        await node.create(g, guaranteed("app", 1000), "g4")


@pytest.mark.parametrize(
    ("options", "containers", "unlimited"),
    [
        ({}, [("g1", 2000), ("g2", 1000)], 1),
        ({}, [("b", None)], 0),
        ({"disable_cfs_quota": False}, [("g1", 2000)], 0),
    ],
    ids=["exclusive-once-per-pod", "shared-keeps-it", "quota-kept-by-option"],
)
async def test_the_pod_cgroup_quota_is_lifted_for_exclusive_cpus(
    options: dict[str, Any], containers: list[tuple[str, int | None]], unlimited: int
) -> None:
    """kubelet (DisableCPUQuotaWithExclusiveCPUs) lifts the CFS quota of a pod holding
    exclusive CPUs, its own cgroup's too: through the Host seam, once per pod."""
    node = await start(options)
    specs = [guaranteed(n, m) if m else burstable(n) for n, m in containers]
    p = await pod(node, "g", *specs)
    for i, spec in enumerate(specs):
        await node.create(p, spec, f"c{i}")
    assert node.host.unlimited == [p.cgroup_parent] * unlimited


# --- reservation, confirmation, release ---------------------------------------------------------


async def test_a_reservation_is_written_ahead_then_confirmed_under_the_container_id() -> None:
    node = await start()
    s = await pod(node, "s", burstable("s"))
    await node.create(s, burstable("s"), "s1")
    g = await pod(node, "g", guaranteed("app", 2000))
    created = await node.begin_create(g, guaranteed("app", 2000))
    want = take_cpus(TOPO, ONLINE, 2)
    assert cpuset(created.pre) == want
    assert state_keys(node, "r:") == ["r:g/app/0"]
    assert parse_cpu_list(node.state.get("r:g/app/0")["cpus"]) == want
    # The shared container moves off them once the call succeeded.
    assert updates(created.pre) == [("s1", ONLINE - want)]
    await node.finish_create(g, created, "c1")
    assert created.post is None
    assert state_keys(node, "r:") == []
    assert parse_cpu_list(node.state.get("c:c1")["cpus"]) == want
    assert node.cpus("s1") == ONLINE - want


async def test_a_failed_create_releases_the_reservation() -> None:
    node = await start()
    s = await pod(node, "s", burstable("s"))
    await node.create(s, burstable("s"), "s1")
    g = await pod(node, "g", guaranteed("app", 4000))
    created = await node.begin_create(g, guaranteed("app", 4000))
    assert state_keys(node, "r:") == ["r:g/app/0"]
    await node.fail_create(g, created)
    assert state_keys(node, "r:") == []
    assert pool_of(node).shared_pool() == ONLINE
    assert node.cpus("s1") == ONLINE  # the pre stage's updates never went out
    # The same CPUs go to the retry.
    retry = await node.create(g, guaranteed("app", 4000), "c1")
    assert cpuset(retry.pre) == cpuset(created.pre)


async def test_a_failed_shared_create_leaves_nothing() -> None:
    node = await start()
    s = await pod(node, "s", burstable("s"))
    created = await node.begin_create(s, burstable("s"))
    await node.fail_create(s, created)
    assert list(node.state.items()) == []


async def test_stop_and_remove_give_cpus_back_to_the_running_shared_containers() -> None:
    node = await start()
    s = await pod(node, "s", burstable("a"), burstable("b"))
    await node.create(s, burstable("a"), "s1")
    await node.create(s, burstable("b"), "s2")
    e = await pod(node, "e", guaranteed("x", 2000), guaranteed("y", 2000))
    x = cpuset((await node.create(e, guaranteed("x", 2000), "e1")).pre)
    y = cpuset((await node.create(e, guaranteed("y", 2000), "e2")).pre)
    assert x is not None and y is not None
    assert node.cpus("s1") == node.cpus("s2") == ONLINE - x - y
    assert await node.stop("s2") is None  # a shared container frees nothing
    # e1 stops: its CPUs return, and only the running shared container follows.
    assert updates(await node.stop("e1")) == [("s1", ONLINE - y)]
    assert pool_of(node).containers["e1"].stopped
    assert await node.remove("e1") is None  # given back already
    assert updates(await node.remove("e2")) == [("s1", ONLINE)]
    assert await node.remove("s2") is None
    assert sorted(pool_of(node).containers) == ["s1"]
    assert state_keys(node, "c:") == []  # e1 and e2 forgotten; s1 holds no CPUs


async def test_remove_pod_gives_back_what_its_containers_held() -> None:
    node = await start()
    s = await pod(node, "s", burstable("a"))
    await node.create(s, burstable("a"), "s1")
    e = await pod(node, "e", guaranteed("x", 2000), guaranteed("y", 2000))
    await node.create(e, guaranteed("x", 2000), "e1")
    await node.create(e, guaranteed("y", 2000), "e2")
    assert updates(await node.remove_pod("e")) == [("s1", ONLINE)]
    assert sorted(pool_of(node).containers) == ["s1"]
    assert state_keys(node, "c:") == []
    assert await node.remove_pod("s") is None  # shared only: nothing to give back
    assert list(node.state.items()) == []


async def test_a_shared_container_created_while_the_pool_changed_is_moved() -> None:
    node = await start()
    s = await pod(node, "s", burstable("a"))
    created = await node.begin_create(s, burstable("a"))
    assert cpuset(created.pre) == ONLINE
    # Another pod takes exclusive CPUs between its pre stage and the runtime's answer.
    g = await pod(node, "g", guaranteed("x", 2000))
    x = cpuset((await node.create(g, guaranteed("x", 2000), "g1")).pre)
    assert x is not None
    await node.finish_create(s, created, "s1")
    assert updates(created.post) == [("s1", ONLINE - x)]


# --- the node's shared pool never empties under running containers -------------------------


async def test_an_exclusive_container_may_not_empty_the_shared_pool_under_running_ones() -> None:
    node = await start()  # no reserved CPUs
    s = await pod(node, "s", burstable("a"))
    await node.create(s, burstable("a"), "s1")
    g = await pod(node, "g", guaranteed("all", 16000))
    with pytest.raises(Reject, match="would leave the node's shared pool empty"):
        await node.begin_create(g, guaranteed("all", 16000))
    assert state_keys(node, "r:") == []
    created = await node.create(g, guaranteed("all", 15000), "g1")  # one CPU is left
    assert node.cpus("s1") == ONLINE - (cpuset(created.pre) or frozenset())
    assert len(node.cpus("s1")) == 1


async def test_with_no_shared_container_the_whole_node_may_go_exclusive() -> None:
    node = await start()
    g = await pod(node, "g", guaranteed("all", 16000))
    created = await node.create(g, guaranteed("all", 16000), "g1")
    assert cpuset(created.pre) == ONLINE
    s = await pod(node, "s", burstable("a"))
    with pytest.raises(Reject, match="the node's shared pool is empty"):
        await node.begin_create(s, burstable("a"))


# --- reuse: init containers, restarts ------------------------------------------------------------


async def test_init_container_cpus_are_reused_as_kubelet_reuses_them() -> None:
    node = await start()
    other = await pod(node, "x", guaranteed("x", 2000))
    await node.create(other, guaranteed("x", 2000), "x1")
    free = ONLINE - pool_of(node).held()
    spec = [guaranteed("init", 4000), guaranteed("a", 2000), guaranteed("b", 2000)]
    p = await pod(node, "p", *spec, annotations={INIT: "init"})
    init = cpuset((await node.create(p, spec[0], "i1")).pre)
    assert init == take_cpus(TOPO, free, 4)
    node.set_state("i1", ContainerState.EXITED)
    free -= init
    # kubelet's allocateCPUs: the free CPUs plus the init container's reusable ones.
    a = cpuset((await node.create(p, spec[1], "a1")).pre)
    assert a == take_cpus(TOPO, free | init, 2)
    assert a <= init
    # updateCPUsToReuse: an app container's CPUs are no longer reusable.
    b = cpuset((await node.create(p, spec[2], "b1")).pre)
    assert b == take_cpus(TOPO, free | (init - a), 2)
    assert not a & b
    assert node.runtime.asked == []  # the annotation says it all: the runtime is not asked
    # RemoveContainer: the init container frees only what no sibling holds.
    assert pool_of(node).release("i1") == init - a - b
    assert pool_of(node).held() == cpuset_union(node, "x1", "a1", "b1")


def cpuset_union(node: Node, *cids: str) -> frozenset[int]:
    return frozenset().union(*(pool_of(node).containers[c].cpus for c in cids))


async def test_releasing_an_init_container_whose_cpus_are_all_reused_frees_nothing() -> None:
    node = await start()
    s = await pod(node, "s", burstable("s"))
    await node.create(s, burstable("s"), "s1")
    spec = [guaranteed("init", 2000), guaranteed("app", 2000)]
    p = await pod(node, "p", *spec, annotations={INIT: "init"})
    init = cpuset((await node.create(p, spec[0], "i1")).pre)
    app = cpuset((await node.create(p, spec[1], "a1")).pre)
    assert app == init
    assert await node.remove("i1") is None  # nothing freed: no shared-pool update
    assert node.cpus("s1") == ONLINE - app
    assert updates(await node.remove("a1")) == [("s1", ONLINE)]


SIDECAR_CASES = [
    pytest.param({INIT: "side", SIDECARS: "side"}, id="listed-as-init-and-sidecar"),
    pytest.param({SIDECARS: "side"}, id="listed-as-sidecar"),
    pytest.param({INIT: "other"}, id="an-app-container"),
]


@pytest.mark.parametrize("annotations", SIDECAR_CASES)
async def test_cpus_of_sidecars_and_app_containers_are_never_reused(
    annotations: dict[str, str],
) -> None:
    node = await start()
    spec = [guaranteed("side", 2000), guaranteed("app", 2000)]
    p = await pod(node, "p", *spec, annotations=annotations)
    side = cpuset((await node.create(p, spec[0], "s1")).pre)
    node.set_state("s1", ContainerState.EXITED)  # even when the runtime says it exited
    app = cpuset((await node.create(p, spec[1], "a1")).pre)
    assert side is not None and app is not None
    assert not side & app


@pytest.mark.parametrize(
    ("state", "reused"),
    [
        pytest.param(ContainerState.EXITED, True, id="exited"),
        pytest.param(ContainerState.RUNNING, False, id="running"),
    ],
)
async def test_without_annotation_an_exited_earlier_container_counts_as_init(
    state: ContainerState, reused: bool
) -> None:
    node = await start()
    spec = [guaranteed("first", 2000), guaranteed("second", 2000)]
    p = await pod(node, "p", *spec)
    first = cpuset((await node.create(p, spec[0], "f1")).pre)
    assert first is not None
    assert pool_of(node).containers["f1"].kind == ContainerKind.UNKNOWN.value
    node.set_state("f1", state)
    second = cpuset((await node.create(p, spec[1], "s1")).pre)
    assert node.runtime.asked == ["p"]  # the runtime is asked, once per CreateContainer
    assert second == (first if reused else take_cpus(TOPO, ONLINE - first, 2))


async def test_the_runtime_is_asked_once_per_create_container_and_never_stale() -> None:
    node = await start(policy="single-numa-node")
    spec = [guaranteed("first", 2000), guaranteed("second", 2000)]
    p = await pod(node, "p", *spec)
    first = cpuset((await node.create(p, spec[0], "f1")).pre)
    # A CreateContainer the topology policy refused: its hints stage ran, its pre stage not.
    view, request = node.create_request(p, spec[1])
    await node.stage(Event.CREATE_CONTAINER, Stage.HINTS, p, view, request)
    assert node.runtime.asked == ["p"]
    node.set_state("f1", ContainerState.EXITED)  # now its CPUs may be reused
    second = await node.create(p, spec[1], "s1")
    assert node.runtime.asked == ["p", "p"]  # asked anew; the hints and pre stages share it
    assert cpuset(second.pre) == first


async def test_a_restarted_container_keeps_its_cpus() -> None:
    node = await start()
    x = await pod(node, "x", guaranteed("x", 2000))
    await node.create(x, guaranteed("x", 2000), "x1")
    g = await pod(node, "g", guaranteed("app", 2000))
    first = cpuset((await node.create(g, guaranteed("app", 2000), "g1")).pre)
    assert first == take_cpus(TOPO, ONLINE - {0, 8}, 2)
    await node.remove("x1")  # lower CPUs are free again: a fresh pick would take them
    assert take_cpus(TOPO, pool_of(node).free() | first, 2) != first
    node.set_state("g1", ContainerState.EXITED)  # it crashed; kubelet starts attempt 1
    again = await node.create(g, guaranteed("app", 2000), "g2", attempt=1)
    assert cpuset(again.pre) == first
    assert updates(again.pre) == []
    # kubelet removes the old attempt: its CPUs stay with the new one.
    assert await node.remove("g1") is None
    assert pool_of(node).containers["g2"].cpus == first
    assert pool_of(node).free() == ONLINE - first


async def test_a_restarted_container_is_hinted_to_the_numa_node_of_its_cpus() -> None:
    # kubelet regenerates the hints of a container that holds CPUs from those CPUs alone, so
    # reusable CPUs of an init container elsewhere do not widen them.
    node = await start(policy="single-numa-node")
    spec = [guaranteed("init", 2000), guaranteed("app", 2000)]
    p = await pod(node, "p", *spec, annotations={INIT: "init"})
    init = cpuset((await node.create(p, spec[0], "i1")).pre)
    node.set_state("i1", ContainerState.EXITED)
    app = cpuset(
        (await node.create(p, spec[1], "a1", affinity=TopologyHint(frozenset({1}), True))).pre
    )
    assert init is not None and app is not None
    assert (TOPO.numa_of(init), TOPO.numa_of(app)) == ({0}, {1})
    node.set_state("a1", ContainerState.EXITED)
    again = await node.begin_create(p, spec[1], attempt=1)
    assert again.hints == {"cpu": cpu_hints(TOPO, app, frozenset(), 2)}
    assert again.hints["cpu"][0] == TopologyHint(frozenset({1}), True)
    assert cpuset(again.pre) == app
    # What the hints would be from the free and reusable CPUs: no single node.
    widened = cpu_hints(TOPO, pool_of(node).free(), init | app, 2)
    assert widened == [TopologyHint(frozenset({0, 1}), False)]


async def test_a_stopped_container_gives_its_cpus_back_and_a_restart_picks_anew() -> None:
    node = await start()
    g = await pod(node, "g", guaranteed("app", 2000))
    await node.create(g, guaranteed("app", 2000), "g1")
    await node.stop("g1")
    assert pool_of(node).free() == ONLINE
    again = await node.create(g, guaranteed("app", 2000), "g2", attempt=1)
    assert cpuset(again.pre) == take_cpus(TOPO, ONLINE, 2)


# --- UpdateContainerResources: sticky cpuset and quota --------------------------------------------


def kubelet_update(cpuset: str = "", cpu_quota: int = 200_000) -> api_pb2.LinuxContainerResources:
    return api_pb2.LinuxContainerResources(
        cpu_shares=2048, cpu_quota=cpu_quota, cpu_period=100_000, cpuset_cpus=cpuset
    )


async def test_the_cpuset_crihook_set_is_sticky() -> None:
    node = await start()
    s = await pod(node, "s", burstable("a"), burstable("b"))
    await node.create(s, burstable("a"), "s1")
    await node.create(s, burstable("b"), "s2")
    g = await pod(node, "g", guaranteed("app", 2000))
    mine = cpuset((await node.create(g, guaranteed("app", 2000), "g1")).pre)
    assert mine is not None

    pre, _, request = await node.update("g1", kubelet_update("0-15"))
    assert cpuset(pre) == mine
    assert quota(pre) == -1
    assert (request.linux.cpuset_cpus, request.linux.cpu_quota) == (format_cpu_list(mine), -1)

    pre, _, request = await node.update("s1", kubelet_update())
    assert cpuset(pre) == ONLINE - mine
    assert quota(pre) is None
    assert request.linux.cpu_quota == 200_000  # shared containers keep kubelet's quota

    await node.stop("s2")
    assert (await node.update("s2", kubelet_update()))[0] is None  # stopped: not ours any more
    node.containers["u1"] = ContainerView("u1", "s", "unknown")
    assert (await node.update("u1", kubelet_update()))[0] is None


async def test_with_the_quota_kept_an_update_keeps_kubelets_quota() -> None:
    node = await start({"disable_cfs_quota": False})
    g = await pod(node, "g", guaranteed("app", 2000))
    await node.create(g, guaranteed("app", 2000), "g1")
    pre, _, request = await node.update("g1", kubelet_update())
    assert quota(pre) is None
    assert request.linux.cpu_quota == 200_000


# --- pod scope: the pod's bubble ------------------------------------------------------------------

# A Guaranteed pod of 3 CPUs: `main` takes an exclusive slice of 2, the others share the rest.
BUBBLE = [guaranteed("main", 2000), guaranteed("side", 500), guaranteed("log", 500)]


async def bubble_pod(node: Node, sandbox_id: str = "b", *, budget: int | None = None) -> PodView:
    spec = PodSpec(sandbox_id, containers=list(BUBBLE))
    if budget is None:
        return await node.run_pod(spec, sandbox_id)
    return await node.run_pod(spec, sandbox_id, cpu_budget=budget)


async def test_a_pod_bubble_is_reserved_confirmed_sliced_shared_and_freed() -> None:
    node = await start(scope="pod")
    s = await pod(node, "s", burstable("a"))
    await node.create(s, burstable("a"), "s1")
    await pod(node, "x", guaranteed("x", 2000))  # its own bubble of 2
    held = pool_of(node).bubbles["x"].cpus
    assert node.cpus("s1") == ONLINE - held
    free = ONLINE - held

    p = await bubble_pod(node)
    bubble = take_cpus(TOPO, free, 3)
    assert node.pod_hints == {"cpu": cpu_hints(TOPO, free, frozenset(), 3)}
    assert pool_of(node).bubbles["b"].cpus == bubble
    assert state_keys(node, "b:") == ["b:b", "b:x"]  # confirmed under the sandbox id
    assert node.cpus("s1") == free - bubble  # the node's shared containers moved off it

    main = await node.create(p, BUBBLE[0], "m1")
    slice_ = take_cpus(TOPO, bubble, 2)
    assert cpuset(main.pre) == slice_
    assert quota(main.pre) == -1
    assert cpuset((await node.create(p, BUBBLE[1], "p1")).pre) == bubble - slice_
    assert cpuset((await node.create(p, BUBBLE[2], "l1")).pre) == bubble - slice_
    assert node.cpus("s1") == free - bubble  # the slices come out of the pod, not the node
    assert pool_of(node).free() == free - bubble

    # The slice goes back to the pod's shared pool, not to the node.
    assert updates(await node.remove("m1")) == [("p1", bubble), ("l1", bubble)]
    assert pool_of(node).free() == free - bubble
    await node.remove("p1")
    await node.remove("l1")
    assert pool_of(node).bubbles["b"].cpus == bubble  # the bubble lasts as long as the pod
    assert updates(await node.remove_pod("b")) == [("s1", free)]
    assert state_keys(node, "b:") == ["b:x"]


async def test_a_pending_bubble_is_keyed_by_pod_uid_and_dropped_when_the_call_fails() -> None:
    node = await start(scope="pod")
    spec = PodSpec("b", containers=list(BUBBLE))
    await node.fail_pod(spec)
    assert state_keys(node, "b:") == []
    assert pool_of(node).free() == ONLINE


async def test_pre_run_pod_sandbox_reserves_the_bubble_by_uid() -> None:
    node = await start(scope="pod")
    spec = PodSpec("b", uid="uid-1", containers=list(BUBBLE))
    config = sandbox_config(spec)
    before = pod_view_from_config("", config)
    request = api_pb2.RunPodSandboxRequest(config=config)
    assert await node.stage(Event.RUN_POD_SANDBOX, Stage.PRE, before, None, request) is None
    assert state_keys(node, "b:") == ["b:uid:uid-1"]
    assert node.state.get("b:uid:uid-1")["pending"] is True


@pytest.mark.parametrize("scope", ["container", "pod"])
async def test_only_the_pod_scope_makes_bubbles(scope: str) -> None:
    node = await start(scope=scope)
    await bubble_pod(node)
    assert bool(pool_of(node).bubbles) is (scope == "pod")


async def test_burstable_pods_get_no_bubble() -> None:
    node = await start(scope="pod")
    await pod(node, "s", burstable("a", 2000))
    assert pool_of(node).bubbles == {}


async def test_a_bubble_that_would_empty_the_nodes_shared_pool_is_refused() -> None:
    node = await start(scope="pod")
    s = await pod(node, "s", burstable("a"))
    await node.create(s, burstable("a"), "s1")
    spec = PodSpec("big", containers=[guaranteed("all", 16000)])
    with pytest.raises(Reject, match="bubble: 16 exclusive CPUs would leave the node's shared"):
        await node.run_pod(spec, "big")
    assert pool_of(node).bubbles == {}


async def test_an_exclusive_slice_may_not_empty_the_pods_shared_pool() -> None:
    # The shared container first, then an exclusive one that would take all that is left.
    node = await start(scope="pod")
    p = await bubble_pod(node, budget=2)
    await node.create(p, BUBBLE[2], "l1")
    assert node.cpus("l1") == pool_of(node).bubbles["b"].cpus
    with pytest.raises(Reject, match="would leave pod default/b's shared pool empty"):
        await node.begin_create(p, BUBBLE[0])
    assert state_keys(node, "r:") == []


async def test_a_shared_container_has_no_cpu_when_slices_took_the_whole_bubble() -> None:
    # The exclusive slice first, leaving the shared container nothing.
    node = await start(scope="pod")
    p = await bubble_pod(node, budget=2)
    await node.create(p, BUBBLE[0], "m1")
    with pytest.raises(Reject, match="pod default/b's shared pool is empty"):
        await node.begin_create(p, BUBBLE[2])


async def test_a_slice_reusing_init_cpus_may_not_empty_the_pods_shared_pool_either() -> None:
    # A bubble of 10: NUMA node 0 and two CPUs of node 1. The init container ran on those two,
    # `log` shares node 0; `main` asks for 8 of the 10 it may take (shared + reusable), and
    # kubelet's pick takes the whole of node 0: `log` would be left with nothing.
    node = await start(scope="pod")
    spec = [guaranteed("init", 2000), guaranteed("main", 8000), guaranteed("log", 500)]
    p = await node.run_pod(
        PodSpec("b", containers=spec[1:], init_containers=spec[:1], annotations={INIT: "init"}),
        "b",
        cpu_budget=10,
    )
    bubble = pool_of(node).bubbles["b"].cpus
    assert bubble == NODE0 | {4, 12}
    await node.create(p, spec[2], "l1")
    init = await node.create(p, spec[0], "i1", affinity=TopologyHint(frozenset({1}), True))
    assert cpuset(init.pre) == {4, 12}
    assert node.cpus("l1") == NODE0
    node.set_state("i1", ContainerState.EXITED)
    assert take_cpus(TOPO, NODE0 | {4, 12}, 8) == NODE0
    with pytest.raises(Reject, match="would leave pod default/b's shared pool empty"):
        await node.begin_create(p, spec[1])
    assert node.cpus("l1") == NODE0
    assert state_keys(node, "r:") == []


# --- synchronize: reconcile with the runtime ------------------------------------------------------


def holder_doc(pod: str, name: str, cpus: str, attempt: int = 0, **kw: Any) -> dict[str, Any]:
    return Holder(pod, name, attempt, cpus=parse_cpu_list(cpus), **kw).to_dict()


def running(node: Node, cid: str, pod: str, name: str, spec: ContainerSpec, cpus: str) -> None:
    """A container the runtime runs, as the store knows it (resources from the runtime)."""
    view, _ = node.create_request(node.pods[pod], spec)
    res = view.resources
    node.containers[cid] = ContainerView(
        cid,
        pod,
        name,
        kind=view.kind,
        resources=ResourcesView(
            qos_class=res.qos_class,
            cpu_request_milli=res.cpu_request_milli,
            cpu_limit_milli=res.cpu_limit_milli,
            integer_cpus=res.integer_cpus,
            cpuset_cpus=cpus,
        ),
    )
    node.set_state(cid, ContainerState.RUNNING)


def add_pod(node: Node, sandbox_id: str, *containers: ContainerSpec) -> None:
    node.add_pod(PodSpec(sandbox_id, containers=list(containers)), sandbox_id)


async def test_synchronize_drops_containers_that_are_gone() -> None:
    node = Node(CpusetHook({}), TOPO)
    node.state.set("c:gone", holder_doc("p", "app", "0,8"))
    add_pod(node, "s", burstable("a"))
    running(node, "s1", "s", "a", burstable("a"), "1-7,9-15")
    node.state.set("c:s1", holder_doc("s", "a", ""))
    repairs = await node.sync()
    assert state_keys(node, "c:") == ["c:s1"]
    assert pool_of(node).shared_pool() == ONLINE
    assert [(u.container_id, u.resources.cpuset_cpus) for u in repairs] == [("s1", "0-15")]


async def test_synchronize_confirms_a_reservation_whose_container_exists() -> None:
    node = Node(CpusetHook({}), TOPO)
    add_pod(node, "g", guaranteed("app", 2000), guaranteed("other", 2000))
    node.state.set("r:g/app/0", holder_doc("g", "app", "0,8"))
    node.state.set("r:g/other/0", holder_doc("g", "other", "1,9"))  # never created
    running(node, "c1", "g", "app", guaranteed("app", 2000), "0,8")
    assert await node.sync() == []
    assert state_keys(node, "r:") == []
    assert state_keys(node, "c:") == ["c:c1"]
    assert pool_of(node).containers["c1"].cpus == {0, 8}
    assert pool_of(node).free() == ONLINE - {0, 8}


async def test_synchronize_adopts_running_containers() -> None:
    node = Node(CpusetHook({}), TOPO)
    add_pod(node, "a", guaranteed("app", 2000))
    add_pod(node, "b", guaranteed("app", 2000))
    add_pod(node, "c", guaranteed("app", 2000))
    add_pod(node, "s", burstable("app"))
    # In the runtime's order: the first on its request of free CPUs keeps them exclusively.
    running(node, "z1", "a", "app", guaranteed("app", 2000), "2,10")
    running(node, "b1", "b", "app", guaranteed("app", 2000), "2,10")  # taken by z1: shared
    running(node, "c1", "c", "app", guaranteed("app", 2000), "3,4,11")  # 3 CPUs for 2: shared
    running(node, "s1", "s", "app", burstable("app"), "")  # burstable: shared
    repairs = await node.sync()
    pool = pool_of(node)
    assert pool.containers["z1"].cpus == {2, 10}
    assert [cid for cid in sorted(pool.containers) if pool.containers[cid].cpus] == ["z1"]
    shared = format_cpu_list(ONLINE - {2, 10})
    assert sorted((u.container_id, u.resources.cpuset_cpus) for u in repairs) == [
        ("b1", shared),
        ("c1", shared),
        ("s1", shared),
    ]


async def test_synchronize_adopts_only_free_unreserved_cpus() -> None:
    node = Node(CpusetHook({"reserved_cpus": "0,8"}), TOPO)
    add_pod(node, "a", guaranteed("app", 2000))
    running(node, "a1", "a", "app", guaranteed("app", 2000), "0,8")
    await node.sync()
    assert pool_of(node).containers["a1"].cpus == frozenset()
    assert node.cpus("a1") == ONLINE


async def test_synchronize_splits_cpus_two_pods_hold() -> None:
    node = Node(CpusetHook({}), TOPO)
    add_pod(node, "p", guaranteed("a", 2000), guaranteed("b", 2000))
    add_pod(node, "q", guaranteed("c", 2000))
    node.state.set("c:a1", holder_doc("p", "a", "0,8", kind="init"))
    node.state.set("c:b1", holder_doc("p", "b", "0,8"))  # the same pod may share (reuse)
    node.state.set("c:c1", holder_doc("q", "c", "0,8"))  # another pod may not
    running(node, "a1", "p", "a", guaranteed("a", 2000), "0,8")
    running(node, "b1", "p", "b", guaranteed("b", 2000), "0,8")
    running(node, "c1", "q", "c", guaranteed("c", 2000), "0,8")
    repairs = await node.sync()
    pool = pool_of(node)
    assert pool.containers["a1"].cpus == pool.containers["b1"].cpus == {0, 8}
    assert pool.containers["c1"].cpus == frozenset()
    assert [(u.container_id, u.resources.cpuset_cpus) for u in repairs] == [
        ("c1", format_cpu_list(ONLINE - {0, 8}))
    ]


async def test_synchronize_moves_holders_of_cpus_now_reserved_to_the_shared_pool() -> None:
    node = Node(CpusetHook({"reserved_cpus": "0"}), TOPO)
    add_pod(node, "p", guaranteed("a", 2000))
    node.state.set("c:a1", holder_doc("p", "a", "0,8"))
    running(node, "a1", "p", "a", guaranteed("a", 2000), "0,8")
    repairs = await node.sync()
    assert pool_of(node).containers["a1"].cpus == frozenset()
    assert pool_of(node).shared_pool() == ONLINE
    assert [(u.container_id, u.resources.cpuset_cpus) for u in repairs] == [("a1", "0-15")]


@pytest.mark.parametrize(
    ("state", "repaired"),
    [
        pytest.param(ContainerState.CREATED, True, id="created"),
        pytest.param(ContainerState.RUNNING, True, id="running"),
        pytest.param(ContainerState.EXITED, False, id="exited"),
        pytest.param(ContainerState.UNKNOWN, False, id="unknown"),
    ],
)
async def test_synchronize_repairs_only_created_and_running_containers(
    state: ContainerState, repaired: bool
) -> None:
    node = Node(CpusetHook({}), TOPO)
    add_pod(node, "g", guaranteed("app", 2000))
    node.state.set("c:g1", holder_doc("g", "app", "0,8"))
    running(node, "g1", "g", "app", guaranteed("app", 2000), "0-3")
    node.set_state("g1", state)
    repairs = await node.sync()
    assert [(u.container_id, u.resources.cpuset_cpus) for u in repairs] == (
        [("g1", "0,8")] if repaired else []
    )


async def test_synchronize_drops_bubbles_of_pods_that_are_gone_and_confirms_pending_ones() -> None:
    node = Node(CpusetHook({}), TOPO, scope="pod")
    add_pod(node, "b", *BUBBLE)
    uid = node.pods["b"].uid
    node.state.set("b:uid:" + uid, {"uid": uid, "cpus": "0-1", "pending": True})
    node.state.set("b:uid:nobody", {"uid": "nobody", "cpus": "2-3", "pending": True})
    node.state.set("b:gone", {"uid": "u-gone", "cpus": "4-5"})
    await node.sync()
    assert state_keys(node, "b:") == ["b:b"]
    assert pool_of(node).bubbles["b"].cpus == {0, 1}
    assert pool_of(node).free() == ONLINE - {0, 1}


async def test_the_pool_survives_a_restart() -> None:
    node = await start(scope="pod")
    s = await pod(node, "s", burstable("a"))
    await node.create(s, burstable("a"), "s1")
    spec = [guaranteed("init", 2000), guaranteed("app", 2000)]
    p = await pod(node, "p", *spec, annotations={INIT: "init"})
    await node.create(p, spec[0], "i1")
    await node.create(p, spec[1], "a1")
    b = await bubble_pod(node)
    await node.create(b, BUBBLE[0], "m1")
    await node.create(b, BUBBLE[1], "p1")
    await node.stop("s1")
    before = pool_of(node)

    # A fresh pool on the same state rebuilds the same holders of CPUs and bubbles (the
    # containers holding none, s1 and the bubble's shared one, are the runtime's to tell).
    fresh = CpuPool(TOPO, frozenset(), node.state)
    assert fresh.load() == []
    holding = {cid: h for cid, h in before.containers.items() if h.cpus}
    assert sorted(before.containers.keys() - holding.keys()) == ["p1", "s1"]
    assert (fresh.containers, fresh.pending, fresh.bubbles) == (
        holding,
        before.pending,
        before.bubbles,
    )
    assert fresh.held() == before.held()
    assert fresh.shared_pool() == before.shared_pool()
    assert fresh.bubble_shared_pool("b") == before.bubble_shared_pool("b")

    # And a fresh hook on it (crihook restarted) adopts the others as they were, and finds
    # nothing to repair.
    restarted = Node(CpusetHook({}), TOPO, scope="pod", state=node.state)
    restarted.pods, restarted.containers, restarted.states = node.pods, node.containers, node.states
    assert await restarted.sync() == []
    assert pool_of(restarted).containers == before.containers


async def test_unreadable_state_entries_are_dropped() -> None:
    state = MemoryState()
    state.set("c:ok", holder_doc("p", "a", "1"))
    state.set("c:bad", {"pod": "p"})  # no name
    state.set("r:bad", {"pod": "p", "name": "a", "cpus": "x"})
    state.set("stray", 1)
    pool = CpuPool(TOPO, frozenset(), state)
    assert sorted(pool.load()) == ["c:bad", "r:bad", "stray"]
    assert sorted(k for k, _ in state.items()) == ["c:ok"]
    assert pool.held() == {1}


def test_the_pools_asked_on_every_call_follow_every_change_of_hands() -> None:
    """The node pools are kept between calls (`node_pool_text`); any CPU changing hands,
    a bubble included, gives the new ones; a container without CPUs changes nothing."""
    pool = CpuPool(TOPO, frozenset({0}), MemoryState(), strict_reservation=True)
    lsr = Holder("p", "a", 0, "regular", frozenset({2, 3}), scheduled=True, be_shares=True)
    lse = Holder("q", "a", 0, "regular", frozenset({4}), scheduled=True)
    steps: list[tuple[str, Any]] = [
        ("start", None),
        ("shared container", lambda: pool.record("s1", Holder("r", "s", 0, "regular"))),
        ("LSR reserved", lambda: pool.reserve("p/a/0", lsr)),
        ("LSR confirmed", lambda: pool.confirm("p/a/0", "c1")),
        ("LSE recorded", lambda: pool.record("c2", lse)),
        ("LSE stopped", lambda: pool.stop("c2")),
        ("bubble", lambda: pool.reserve_bubble("u", frozenset({5, 6}))),
        ("bubble dropped", lambda: pool.drop_bubble("uid:u")),
        ("LSR released", lambda: pool.release("c1")),
    ]
    seen = []
    for what, change in steps:
        if change is not None:
            change()
        shared, be = pool.node_pool_text("shared"), pool.node_pool_text("be")
        assert (parse_cpu_list(shared), parse_cpu_list(be)) == (
            pool.shared_pool(),
            pool.be_pool(),
        ), what
        seen.append((what, shared, be))
    assert seen == [
        ("start", "1-15", "1-15"),
        ("shared container", "1-15", "1-15"),
        ("LSR reserved", "1,4-15", "1-15"),
        ("LSR confirmed", "1,4-15", "1-15"),
        ("LSE recorded", "1,5-15", "1-3,5-15"),
        ("LSE stopped", "1,4-15", "1-15"),
        ("bubble", "1,4,7-15", "1-4,7-15"),
        ("bubble dropped", "1,4-15", "1-15"),
        ("LSR released", "1-15", "1-15"),
    ]


def container(qos: QoSClass, request: int | None, limit: int | None) -> ContainerView:
    integer = (
        request // 1000 if qos is QoSClass.GUARANTEED and request and not request % 1000 else None
    )
    return ContainerView(
        "",
        "p",
        "app",
        resources=ResourcesView(
            qos_class=qos, cpu_request_milli=request, cpu_limit_milli=limit, integer_cpus=integer
        ),
    )


RULES = [
    pytest.param(container(QoSClass.GUARANTEED, 2000, 2000), 2, 2, id="guaranteed"),
    pytest.param(container(QoSClass.GUARANTEED, 2000, None), 2, 2, id="no-cfs-quota"),
    pytest.param(container(QoSClass.GUARANTEED, 1500, 1500), None, None, id="fraction"),
    # A pod Guaranteed by its pod-level resources: a container that is not Guaranteed itself
    # runs on the shared pool.
    pytest.param(container(QoSClass.GUARANTEED, 2000, 4000), None, None, id="limit-above"),
    pytest.param(container(QoSClass.BURSTABLE, 2000, 2000), None, 2, id="burstable-pod"),
    pytest.param(container(QoSClass.GUARANTEED, None, None), None, None, id="no-request"),
]


@pytest.mark.parametrize(("view", "exclusive", "sliced"), RULES)
def test_who_gets_exclusive_cpus_and_slices(
    view: ContainerView, exclusive: int | None, sliced: int | None
) -> None:
    assert exclusive_cpus(view) == exclusive
    assert slice_cpus(view) == sliced  # asked only in a (Guaranteed) pod's bubble


@pytest.mark.parametrize("spec", [SMALL, OFFLINE_CPUS], ids=["small", "offline-cpus"])
def test_the_harness_topology_is_what_sysfs_gives(spec: MachineSpec, tmp_path: Path) -> None:
    assert topology_of(spec) == read_topology(write_sysfs(tmp_path / "sys", spec))


# --- resize -------------------------------------------------------------------------------------


def resources_for(milli: int, memory: int = GIB) -> api_pb2.LinuxContainerResources:
    """What kubelet sends in UpdateContainerResources for a Guaranteed container."""
    return api_pb2.LinuxContainerResources(
        cpu_shares=milli * 1024 // 1000,
        cpu_quota=milli * 100,
        cpu_period=100_000,
        memory_limit_in_bytes=memory,
    )


async def test_a_cpu_resize_of_an_exclusive_container_is_refused_and_a_revert_passes() -> None:
    """kubelet's rule (InPlacePodVerticalScalingExclusiveCPUs off): the CPUs of a Guaranteed
    container are not resized in place. kubelet's revert after the failed update, and its
    reconcile re-sending the same values, go through and keep the CPUs."""
    node = await start()
    g = await pod(node, "g", guaranteed("app", 2000))
    created = await node.create(g, guaranteed("app", 2000), "c1")
    held = cpuset(created.pre)
    with pytest.raises(Reject, match="resize of container 'app' to 4000m CPU is infeasible"):
        await node.update("c1", resources_for(4000))
    pre, _, request = await node.update("c1", resources_for(2000))  # the revert
    assert cpuset(pre) == held and request.linux.cpu_quota == -1
    assert pool_of(node).containers["c1"].cpus == held


def pod_resources(milli: int, memory: int = GIB) -> api_pb2.UpdatePodSandboxResourcesRequest:
    """kubelet's UpdatePodSandboxResources before it writes a Guaranteed pod's cgroup: the
    pod's CPU limit (its containers' sum), sent first when it grows."""
    request = api_pb2.UpdatePodSandboxResourcesRequest()
    request.resources.CopyFrom(resources_for(milli, memory))
    return request


async def pod_update(
    node: Node, pod: PodView, request: api_pb2.UpdatePodSandboxResourcesRequest
) -> Adjustment | None:
    pre = await node.stage(Event.UPDATE_POD_SANDBOX_RESOURCES, Stage.PRE, pod, None, request)
    return pre  # type: ignore[no-any-return]


async def test_a_cpu_resize_of_a_pod_with_exclusive_cpus_is_refused_before_its_cgroup() -> None:
    """The pod-level call comes first: refused there, kubelet leaves the pod's cgroup (and
    the CFS quota crihook lifted) as it was. The same CPUs, a memory resize's pod call
    (the quota crihook lifted), or no resources at all pass."""
    node = await start()
    g = await pod(node, "g", guaranteed("app", 2000), guaranteed("side", 1000))
    await node.create(g, guaranteed("app", 2000), "c1")
    await node.create(g, guaranteed("side", 1000), "c2")
    with pytest.raises(Reject) as refused:
        await pod_update(node, g, pod_resources(2500))
    assert refused.value.reason == (
        "resize of pod default/g to 2500m CPU is infeasible: its containers hold 3 exclusive "
        "CPUs (kubelet's static policy does not resize Guaranteed containers in place)"
    )
    memory = pod_resources(3000, 2 * GIB)
    memory.resources.cpu_quota = -1
    for passes in (pod_resources(3000), memory, api_pb2.UpdatePodSandboxResourcesRequest()):
        assert await pod_update(node, g, passes) is None


@pytest.mark.parametrize("case", ["resize-on", "shared-container", "exited-container", "overhead"])
async def test_a_pod_cpu_resize_is_left_to_the_containers_where_the_pod_sum_is_unknown(
    case: str,
) -> None:
    """With resize_exclusive_cpus the containers' calls decide; a pod with a container on a
    shared pool, or an exited one (an init container may have asked for more), or with
    overhead has a pod figure crihook cannot add up."""
    node = await start(RESIZE if case == "resize-on" else None)
    g = await pod(node, "g", guaranteed("app", 2000), guaranteed("side", 500))
    await node.create(g, guaranteed("app", 2000), "c1")
    if case == "shared-container":
        await node.create(g, guaranteed("side", 500), "c2")
    if case == "exited-container":
        await node.create(g, guaranteed("side", 1000), "c2")
        await node.stop("c2")
    request = pod_resources(2500)
    if case == "overhead":
        request.overhead.cpu_shares = 512
    assert await pod_update(node, g, request) is None


async def test_a_shared_container_resizes_freely() -> None:
    node = await start()
    b = await pod(node, "b", burstable("app", 500))
    await node.create(b, burstable("app", 500), "c1")
    pre, _, request = await node.update(
        "c1", api_pb2.LinuxContainerResources(cpu_shares=2048, cpu_period=100_000)
    )
    assert cpuset(pre) == ONLINE and request.linux.cpu_shares == 2048


# --- resize with InPlacePodVerticalScalingExclusiveCPUs (resize_exclusive_cpus) ----------------

RESIZE = {"resize_exclusive_cpus": True}


async def exclusive_and_shared(node: Node, cpus: int = 2) -> frozenset[int]:
    """A Guaranteed container `c1` with `cpus` exclusive CPUs, and a shared one, `s1`."""
    b = await pod(node, "b", burstable("web", 500))
    await node.create(b, burstable("web", 500), "s1")
    g = await pod(node, "g", guaranteed("app", cpus * 1000))
    created = await node.create(g, guaranteed("app", cpus * 1000), "c1")
    held = cpuset(created.pre)
    assert held is not None and len(held) == cpus
    return held


async def test_growing_keeps_the_cpus_and_adds_free_ones_of_the_same_numa_node_first() -> None:
    node = await start(RESIZE)
    held = await exclusive_and_shared(node)
    free = pool_of(node).free()
    pre, _, request = await node.update("c1", resources_for(4000))

    extra = take_cpus(TOPO, free, 2, numa_affinity=TOPO.numa_of(held))
    assert cpuset(pre) == held | extra
    assert request.linux.cpu_quota == -1  # still exclusive: no quota (kubelet's default)
    assert pool_of(node).containers["c1"].cpus == held | extra
    assert pool_of(node).containers["c1"].promised == held
    assert node.cpus("s1") == ONLINE - held - extra  # the shared pool follows
    assert TOPO.numa_of(held | extra) == TOPO.numa_of(held)


async def test_shrinking_keeps_a_subset_and_never_goes_below_the_cpus_it_was_created_with() -> None:
    node = await start(RESIZE)
    held = await exclusive_and_shared(node)
    await node.update("c1", resources_for(6000))
    grown = pool_of(node).containers["c1"].cpus

    pre, _, _ = await node.update("c1", resources_for(4000))
    shrunk = cpuset(pre)
    assert shrunk is not None and len(shrunk) == 4 and held <= shrunk <= grown
    assert node.cpus("s1") == ONLINE - shrunk

    with pytest.raises(Reject, match="created with 2 exclusive CPUs"):
        await node.update("c1", resources_for(1000))
    pre, _, _ = await node.update("c1", resources_for(2000))
    assert cpuset(pre) == held and node.cpus("s1") == ONLINE - held


async def test_a_resize_the_runtime_refuses_leaves_the_cpus_as_they_were() -> None:
    node = await start(RESIZE)
    held = await exclusive_and_shared(node)
    shared = node.cpus("s1")
    pre = await node.fail_update("c1", resources_for(4000))
    assert cpuset(pre) is not None and len(cpuset(pre) or ()) == 4  # what was asked for

    holder = pool_of(node).containers["c1"]
    assert holder.cpus == held and not holder.promised
    assert parse_cpu_list(node.state.get("c:c1")["cpus"]) == held  # written back too
    assert pool_of(node).shared_pool() == shared
    # kubelet's revert, and then a resize that works, start from there.
    pre, _, _ = await node.update("c1", resources_for(2000))
    assert cpuset(pre) == held


async def test_exclusive_cpus_resize_by_whole_cpus_only() -> None:
    node = await start(RESIZE)
    held = await exclusive_and_shared(node)
    with pytest.raises(Reject, match=r"to 2500m CPU is infeasible: .* by whole CPUs only"):
        await node.update("c1", resources_for(2500))
    assert pool_of(node).containers["c1"].cpus == held


@pytest.mark.parametrize("policy", ["none", "single-numa-node"])
async def test_growing_past_its_numa_node_spills_unless_single_numa_node(policy: str) -> None:
    node = await start(RESIZE, policy=policy)
    held = await exclusive_and_shared(node, cpus=6)
    assert len(TOPO.numa_of(held)) == 1  # 6 of a node's 8 CPUs
    if policy == "single-numa-node":
        with pytest.raises(Reject, match="single-numa-node topology policy keeps it there"):
            await node.update("c1", resources_for(10000))
        assert pool_of(node).containers["c1"].cpus == held
        return
    pre, _, _ = await node.update("c1", resources_for(10000))
    grown = cpuset(pre)
    assert grown is not None and held < grown and len(TOPO.numa_of(grown)) == 2


async def test_the_cpus_it_was_created_with_survive_a_restart() -> None:
    node = await start(RESIZE)
    held = await exclusive_and_shared(node)
    await node.update("c1", resources_for(4000))
    grown = pool_of(node).containers["c1"].cpus

    restarted = Node(
        CpusetHook(RESIZE),
        TOPO,
        state=node.state,
        pods=node.pods,
        specs=node.specs,
        containers=node.containers,
        states=node.states,
    )
    assert await restarted.sync() == []
    holder = pool_of(restarted).containers["c1"]
    assert (holder.cpus, holder.promised) == (grown, held)
    with pytest.raises(Reject, match="created with 2 exclusive CPUs"):
        await restarted.update("c1", resources_for(1000))


async def test_the_same_resources_again_are_no_resize() -> None:
    """kubelet's reconcile re-sends what it sent: nothing moves, gate or not."""
    node = await start(RESIZE)
    held = await exclusive_and_shared(node)
    pre, _, _ = await node.update("c1", resources_for(2000))
    assert cpuset(pre) == held and not pool_of(node).containers["c1"].promised
