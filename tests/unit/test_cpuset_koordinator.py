"""The cpuset hook (kubelet's static policy) honours Koordinator's CPU signals: the ledger the
koordinator hook shares with it when both are in the chain (`cpu_manager = "cpuset"`).

SMALL: NUMA node 0 is CPUs 0-3 and their siblings 8-11, node 1 is 4-7 and 12-15.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.cpus import take_cpus
from crihook.hooks.cpus.options import CpusetOptions, parse_options
from crihook.hooks.cpus.pool import Holder
from crihook.hooks.cpuset import CpusetHook
from crihook.hooks.node import parse_cpu_list
from crihook.hooks.spec import Adjustment, Field, PodView, Reject
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.hook_harness import SMALL, Node, besteffort, burstable, guaranteed, topology_of

TOPO = topology_of(SMALL)
ONLINE = TOPO.online


async def start(options: dict[str, Any] | None = None) -> Node:
    node = Node(CpusetHook(options or {}), TOPO)
    await node.sync()
    return node


async def pod(
    node: Node, name: str, *containers: ContainerSpec, qos: str | None = None, cpus: str = ""
) -> PodView:
    labels = {"koordinator.sh/qosClass": qos} if qos else {}
    annotations = {}
    if cpus:
        annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": cpus})
    spec = PodSpec(name, labels=labels, annotations=annotations, containers=list(containers))
    return await node.run_pod(spec, name)


def cpus_of(adjustment: Adjustment | None) -> frozenset[int] | None:
    if adjustment is None or (Field.CPUSET_CPUS, "") not in adjustment.changes:
        return None
    return parse_cpu_list(adjustment.changes[(Field.CPUSET_CPUS, "")])


async def test_scheduler_cpus_are_held_like_exclusive_ones_and_lent_to_be_pods() -> None:
    node = await start()
    s = await pod(node, "s", burstable("a"))
    await node.create(s, burstable("a"), "s1")
    b = await pod(node, "b", besteffort("b"))
    await node.create(b, besteffort("b"), "b1")

    r = await pod(node, "lsr", guaranteed("r", 2000), qos="LSR", cpus="0,8")
    pinned = await node.create(r, guaranteed("r", 2000), "r1")
    assert cpus_of(pinned.pre) == {0, 8}
    assert pinned.pre is not None and pinned.pre.changes[(Field.CPU_QUOTA, "")] == -1
    assert node.cpus("s1") == ONLINE - {0, 8}
    assert node.cpus("b1") == ONLINE  # LSR CPUs stay in the BE pool

    # kubelet's static pick comes from what is left; it leaves both pools.
    want = take_cpus(TOPO, ONLINE - {0, 8}, 2)
    g = await pod(node, "g", guaranteed("app", 2000))
    picked = await node.create(g, guaranteed("app", 2000), "g1")
    assert cpus_of(picked.pre) == want
    assert node.cpus("s1") == ONLINE - {0, 8} - want
    assert node.cpus("b1") == ONLINE - want


async def test_a_scheduler_claim_on_a_pick_of_kubelets_fails_naming_both_pods() -> None:
    node = await start()
    g = await pod(node, "g", guaranteed("app", 2000))
    mine = cpus_of((await node.create(g, guaranteed("app", 2000), "g1")).pre)
    assert mine is not None
    taken = min(mine)
    r = await pod(node, "lse", guaranteed("r", 1000), qos="LSE", cpus=str(taken))
    with pytest.raises(Reject) as info:
        await node.begin_create(r, guaranteed("r", 1000))
    message = str(info.value)
    assert "default/lse" in message and "default/g" in message
    assert "(exclusive cpus)" in message


@pytest.mark.parametrize(
    ("qos", "exclusive"),
    [
        pytest.param("LS", False, id="LS-shares"),
        pytest.param("LSR", True, id="LSR-without-cpuset-is-kubelets"),
        pytest.param(None, True, id="unlabelled-is-kubelets"),
    ],
)
async def test_ls_pods_never_get_exclusive_cpus(qos: str | None, exclusive: bool) -> None:
    node = await start()
    p = await pod(node, "p", guaranteed("app", 2000), qos=qos)
    created = await node.create(p, guaranteed("app", 2000), "p1")
    got = cpus_of(created.pre)
    assert got is not None
    assert (len(got) == 2) is exclusive
    assert (got == ONLINE) is not exclusive


async def test_under_the_none_policy_only_the_schedulers_cpus_are_a_pods_own() -> None:
    node = await start({"policy": "none"})
    g = await pod(node, "g", guaranteed("app", 2000))
    assert cpus_of((await node.create(g, guaranteed("app", 2000), "g1")).pre) == ONLINE
    r = await pod(node, "lsr", guaranteed("r", 2000), qos="LSR", cpus="4-5")
    assert cpus_of((await node.create(r, guaranteed("r", 2000), "r1")).pre) == {4, 5}
    assert node.cpus("g1") == ONLINE - {4, 5}


def test_the_policy_option() -> None:
    assert parse_options({"policy": "none"}) == CpusetOptions(static=False)
    assert parse_options({}) == CpusetOptions(static=True)
    with pytest.raises(ValueError, match='policy must be "static" or "none"'):
        parse_options({"policy": "dynamic"})


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(Holder("p", "a"), id="shared"),
        pytest.param(Holder("p", "a", pool="be"), id="be-member"),
        pytest.param(Holder("p", "a", numa=frozenset({1})), id="numa-narrowed"),
        pytest.param(
            Holder(
                "p", "a", cpus=frozenset({2, 3}), scheduled=True, be_shares=True, pod_name="d/p"
            ),
            id="lsr",
        ),
    ],
)
def test_holders_round_trip_through_the_state(holder: Holder) -> None:
    assert Holder.from_dict(holder.to_dict()) == holder


def test_a_state_entry_with_an_unknown_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pool"):
        Holder.from_dict({"pod": "p", "name": "a", "pool": "gold"})


async def test_an_in_place_resize_keeps_the_scheduler_cpus() -> None:
    """Koordinator's rule: kubelet's UpdateContainerResources never undoes koord-scheduler's
    cpuset, on an in-place resize too (which the static policy refuses for its own picks)."""
    node = await start()
    r = await pod(node, "lsr", guaranteed("r", 2000), qos="LSR", cpus="0,8")
    await node.create(r, guaranteed("r", 2000), "r1")
    g = await pod(node, "g", guaranteed("app", 2000))
    await node.create(g, guaranteed("app", 2000), "g1")
    grown = api_pb2.LinuxContainerResources(
        cpu_shares=3072, cpu_quota=300_000, cpu_period=100_000, cpuset_cpus="0-15"
    )

    pre, _, request = await node.update("r1", grown)

    assert cpus_of(pre) == {0, 8}
    assert (request.linux.cpuset_cpus, request.linux.cpu_quota) == ("0,8", -1)
    assert request.linux.cpu_shares == 3072  # the resize itself goes through
    with pytest.raises(Reject, match="infeasible"):  # kubelet's own pick is not resized
        await node.update("g1", grown)
