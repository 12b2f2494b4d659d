"""The koordinator hook on a 16-CPU node (tests.unit.hook_harness): its stages called as the
pipeline calls them, the node's containers updated as crihook's updater would.

SMALL: NUMA node 0 is CPUs 0-3 and their siblings 8-11, node 1 is 4-7 and 12-15.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.builtin import BUILTIN_HOOKS
from crihook.hooks.koordinator import KoordinatorHook
from crihook.hooks.node import PodLimits, format_cpu_list, parse_cpu_list
from crihook.hooks.spec import (
    Adjustment,
    ContainerState,
    Event,
    Field,
    InvalidRequest,
    PodView,
    Reject,
    Stage,
    TopologyHint,
)
from crihook.hooks.spec.views import container_view_from_config, pod_view_from_config
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.hook_harness import (
    GIB,
    SMALL,
    FakeCgroups,
    Node,
    besteffort,
    burstable,
    every_update,
    guaranteed,
    topology_of,
)

TOPO = topology_of(SMALL)
ONLINE = TOPO.online
QOS = "koordinator.sh/qosClass"
STATUS = "scheduling.koordinator.sh/resource-status"
SPEC = "node.koordinator.sh/extended-resource-spec"
SKIP = "runtimeproxy.koordinator.sh/skip-hookserver"
BATCH = {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"},
    "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "2Gi"},
}


async def start(options: dict[str, Any] | None = None) -> Node:
    node = Node(KoordinatorHook(options or {}), TOPO)
    await node.sync()
    return node


def koord(
    name: str,
    *containers: ContainerSpec,
    qos: str | None = None,
    cpus: str | None = None,
    numa: list[int] | None = None,
    batch: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> PodSpec:
    """A pod as Koordinator's webhook and scheduler leave it."""
    all_labels = dict(labels or {})
    if qos:
        all_labels[QOS] = qos
    all_annotations = dict(annotations or {})
    status: dict[str, Any] = {}
    if cpus is not None:
        status["cpuset"] = cpus
    if numa is not None:
        status["numaNodeResources"] = [{"node": n} for n in numa]
    if status:
        all_annotations[STATUS] = json.dumps(status)
    if batch is not None:
        all_annotations[SPEC] = json.dumps({"containers": batch})
    return PodSpec(
        name, labels=all_labels, annotations=all_annotations, containers=list(containers)
    )


async def run(node: Node, spec: PodSpec) -> PodView:
    return await node.run_pod(spec, spec.name)


async def sandbox_pre(node: Node, spec: PodSpec) -> Adjustment | None:
    """The pre stage of RunPodSandbox alone: what the hook sets on the sandbox."""
    request = api_pb2.RunPodSandboxRequest(config=node.sandbox_config(spec))
    view = pod_view_from_config("", request.config)
    result: Adjustment | None = await node.stage(
        Event.RUN_POD_SANDBOX, Stage.PRE, view, None, request
    )
    return result


def cpus_of(adjustment: Adjustment | None) -> frozenset[int] | None:
    if adjustment is None or (Field.CPUSET_CPUS, "") not in adjustment.changes:
        return None
    return parse_cpu_list(adjustment.changes[(Field.CPUSET_CPUS, "")])


def value(adjustment: Adjustment | None, field: Field) -> Any:
    return None if adjustment is None else adjustment.changes.get((field, ""))


def updated(adjustment: Adjustment | None) -> dict[str, frozenset[int]]:
    if adjustment is None:
        return {}
    return {
        u.container_id: parse_cpu_list(u.resources.cpuset_cpus or "")
        for u in every_update(adjustment)
    }


async def workload(node: Node) -> None:
    """An LS pod (`ls1`) and a BE pod (`be1`) running on the pools."""
    ls = await run(node, koord("ls", burstable("a"), qos="LS"))
    await node.create(ls, burstable("a"), "ls1")
    be = await run(node, koord("be", besteffort("b"), qos="BE", batch={"b": BATCH}))
    await node.create(be, besteffort("b"), "be1")


def lsr(name: str, cpus: str, qos: str = "LSR") -> PodSpec:
    return koord(name, guaranteed("r", 2000), qos=qos, cpus=cpus)


# --- scheduler-assigned CPUs --------------------------------------------------------------------


async def test_an_lsr_pod_runs_on_its_scheduler_cpus_which_be_pods_keep() -> None:
    node = await start()
    await workload(node)
    assert node.cpus("ls1") == ONLINE and node.cpus("be1") == ONLINE

    spec = lsr("lsr", "2,10")
    sandbox = await sandbox_pre(node, spec)
    assert cpus_of(sandbox) == {2, 10}
    assert value(sandbox, Field.CPU_QUOTA) == -1  # koordlet unsets the pod's CFS quota

    pod = await run(node, spec)
    created = await node.create(pod, guaranteed("r", 2000), "r1")
    assert cpus_of(created.pre) == {2, 10}
    assert value(created.pre, Field.CPU_QUOTA) == -1
    # Out of the LS share pool, before CreateContainer returns; BE may still use them.
    assert updated(created.pre) == {"ls1": ONLINE - {2, 10}}
    assert node.cpus("ls1") == ONLINE - {2, 10}
    assert node.cpus("be1") == ONLINE


async def test_an_lse_pods_cpus_leave_the_be_pool_too() -> None:
    node = await start()
    await workload(node)
    pod = await run(node, lsr("lse", "4-5", qos="LSE"))
    created = await node.create(pod, guaranteed("r", 2000), "e1")
    assert cpus_of(created.pre) == {4, 5}
    assert updated(created.pre) == {"ls1": ONLINE - {4, 5}, "be1": ONLINE - {4, 5}}


async def test_two_pods_claiming_the_same_cpus_fail_naming_both() -> None:
    node = await start()
    first = await run(node, lsr("first", "4-5", qos="LSE"))
    await node.create(first, guaranteed("r", 2000), "f1")
    second = await run(node, lsr("second", "5-6", qos="LSE"))
    with pytest.raises(Reject) as info:
        await node.begin_create(second, guaranteed("r", 2000))
    assert type(info.value) is Reject  # FAILED_PRECONDITION, not a malformed request
    message = str(info.value)
    assert "default/second" in message and "default/first" in message
    assert "cpus 5" in message
    assert not [k for k, _ in node.state.items() if k.startswith("r:")]  # nothing reserved


async def test_containers_of_one_pod_share_its_scheduler_cpus_until_the_last_goes() -> None:
    node = await start()
    await workload(node)
    spec = koord("lsr", guaranteed("a", 2000), guaranteed("b", 2000), qos="LSR", cpus="8-9")
    pod = await run(node, spec)
    await node.create(pod, guaranteed("a", 2000), "a1")
    second = await node.create(pod, guaranteed("b", 2000), "b1")
    assert cpus_of(second.pre) == {8, 9}
    await node.stop("a1")
    await node.remove("a1")
    assert node.cpus("ls1") == ONLINE - {8, 9}  # b1 still holds them
    gone = await node.remove_pod("lsr")
    assert updated(gone) == {"ls1": ONLINE}  # LSR CPUs back in the LS pool; BE pool unchanged


async def test_pools_follow_pods_as_they_come_and_go() -> None:
    node = await start()
    await workload(node)
    lse = await run(node, lsr("lse", "0-1", qos="LSE"))
    await node.create(lse, guaranteed("r", 2000), "e1")
    r = await run(node, lsr("lsr", "2-3"))
    await node.create(r, guaranteed("r", 2000), "r1")
    assert node.cpus("ls1") == ONLINE - {0, 1, 2, 3}
    assert node.cpus("be1") == ONLINE - {0, 1}
    # A new LS container starts on the pool as it is now.
    ls2 = await run(node, koord("ls2", burstable("c"), qos="LS"))
    assert cpus_of((await node.create(ls2, burstable("c"), "ls2c")).pre) == ONLINE - {0, 1, 2, 3}
    await node.remove_pod("lse")
    assert node.cpus("ls1") == node.cpus("ls2c") == ONLINE - {2, 3}
    assert node.cpus("be1") == ONLINE


async def test_the_scheduler_cpus_are_hinted_to_their_numa_node() -> None:
    node = await start()
    pod = await run(node, lsr("lsr", "4-5"))
    created = await node.begin_create(pod, guaranteed("r", 2000))
    assert created.hints == {"cpu": [TopologyHint(frozenset({1}), True)]}


@pytest.mark.parametrize(
    ("status", "message"),
    [
        pytest.param('{"cpuset": "0-"}', "malformed cpu list", id="bad-cpulist"),
        pytest.param("0-3", "not JSON", id="not-json"),
        pytest.param('{"cpuset": "14-17"}', r"cpus \[16, 17\] are not online", id="not-on-node"),
        pytest.param('{"numaNodeResources": [{"node": 3}]}', r"NUMA nodes \[3\]", id="numa-node"),
    ],
)
async def test_a_bad_resource_status_is_invalid_argument_naming_it(
    status: str, message: str
) -> None:
    node = await start()
    spec = koord("bad", guaranteed("r", 2000), qos="LSR", annotations={STATUS: status})
    with pytest.raises(InvalidRequest, match=message) as refused:
        await sandbox_pre(node, spec)
    pod = node.add_pod(spec, "bad")  # a sandbox made without the hook: the container is refused
    with pytest.raises(InvalidRequest, match=message) as again:
        await node.begin_create(pod, spec.containers[0])
    for info in (refused, again):
        assert f"pod default/bad: annotation {STATUS}: " in str(info.value)


# --- the pools of the other classes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("qos", "container", "pool"),
    [
        pytest.param("LS", guaranteed("c", 2000), "ls", id="LS-whole-cpus-still-share"),
        pytest.param(None, guaranteed("c", 2000), "ls", id="unlabelled-guaranteed"),
        pytest.param(None, burstable("c"), "ls", id="unlabelled-burstable"),
        pytest.param("SYSTEM", burstable("c"), "ls", id="SYSTEM"),
        pytest.param(None, besteffort("c"), "be", id="k8s-besteffort"),
        pytest.param("BE", besteffort("c"), "be", id="BE"),
    ],
)
async def test_every_other_pod_runs_on_the_ls_or_the_be_pool(
    qos: str | None, container: ContainerSpec, pool: str
) -> None:
    node = await start()
    r = await run(node, lsr("lsr", "2-3"))
    await node.create(r, guaranteed("r", 2000), "r1")
    pod = await run(node, koord("p", container, qos=qos))
    created = await node.create(pod, container, "c1")
    want = ONLINE - {2, 3} if pool == "ls" else ONLINE
    assert cpus_of(created.pre) == want
    assert value(created.pre, Field.CPU_QUOTA) is None  # kubelet's quota, no exclusive CPUs


async def test_an_ls_pod_narrowed_to_numa_nodes_runs_on_their_share_pool() -> None:
    node = await start()
    r = await run(node, lsr("lsr", "4"))
    await node.create(r, guaranteed("r", 2000), "r1")
    pod = await run(node, koord("ls", burstable("a"), qos="LS", numa=[1]))
    created = await node.create(pod, burstable("a"), "a1")
    assert cpus_of(created.pre) == TOPO.cpus_in_numa([1]) - {4}
    await node.remove_pod("lsr")
    assert node.cpus("a1") == TOPO.cpus_in_numa([1])


async def test_reserved_cpus_leave_both_pools() -> None:
    node = await start({"reserved_cpus": "0,8"})
    await workload(node)
    assert node.cpus("ls1") == node.cpus("be1") == ONLINE - {0, 8}
    r = await run(node, lsr("lsr", "0-1"))
    with pytest.raises(Reject, match="are reserved"):
        await node.begin_create(r, guaranteed("r", 2000))


# --- batch resources ----------------------------------------------------------------------------


async def test_a_be_container_gets_its_batch_limits_and_the_pod_their_sums() -> None:
    node = await start()
    spec = koord(
        "be",
        besteffort("a"),
        besteffort("b"),
        qos="BE",
        batch={"a": BATCH, "b": {"requests": {"kubernetes.io/batch-cpu": "250"}}},
    )
    sandbox = await sandbox_pre(node, spec)
    # kubelet leaves BestEffort pods unlimited; b has no limits: the pod is unlimited.
    assert dict(sandbox.changes) == {  # type: ignore[union-attr]
        (Field.CPU_SHARES, ""): 768,
        (Field.CPU_QUOTA, ""): -1,
    }
    pod = await run(node, spec)
    a = (await node.create(pod, besteffort("a"), "a1")).pre
    assert value(a, Field.CPU_SHARES) == 512
    assert (value(a, Field.CPU_QUOTA), value(a, Field.CPU_PERIOD)) == (100_000, 100_000)
    assert value(a, Field.MEMORY_LIMIT) == 2 * GIB
    b = (await node.create(pod, besteffort("b"), "b1")).pre
    assert (value(b, Field.CPU_SHARES), value(b, Field.CPU_QUOTA)) == (256, -1)
    assert value(b, Field.MEMORY_LIMIT) is None
    # A container the spec does not name keeps kubelet's values.
    other = (await node.create(pod, besteffort("c"), "c1")).pre
    assert value(other, Field.CPU_SHARES) is None
    assert cpus_of(other) == ONLINE  # still placed on the BE pool


async def test_with_the_batch_cfs_quota_off_be_pods_get_none() -> None:
    node = await start({"batch_cfs_quota": False})
    pod = await run(node, koord("be", besteffort("a"), qos="BE", batch={"a": BATCH}))
    a = (await node.create(pod, besteffort("a"), "a1")).pre
    assert value(a, Field.CPU_QUOTA) == -1
    assert value(a, Field.MEMORY_LIMIT) == 2 * GIB


# --- the BE pod's own cgroup ----------------------------------------------------------------------


async def cgroup_node(options: dict[str, Any] | None = None) -> Node:
    node = Node(KoordinatorHook(options or {}), TOPO, cgroups=FakeCgroups())
    await node.sync()
    return node


def writes(node: Node) -> list[tuple[str, PodLimits]]:
    assert node.cgroups is not None
    return node.cgroups.writes


async def test_a_be_pods_own_cgroup_gets_the_sums_once_the_runtime_made_it() -> None:
    node = await cgroup_node()
    half = {"requests": {"kubernetes.io/batch-cpu": "250"}, "limits": BATCH["limits"]}
    spec = koord("be", besteffort("a"), besteffort("b"), qos="BE", batch={"a": BATCH, "b": half})
    await sandbox_pre(node, spec)
    assert writes(node) == []  # not before the runtime made the sandbox (and its cgroup)
    pod = await run(node, spec)
    # shares from 500 + 250 milli-cores; quota from 1000 + 1000; memory 2Gi + 2Gi.
    assert writes(node) == [
        (
            pod.cgroup_parent,
            PodLimits(
                cpu_shares=768,
                cpu_quota_us=200_000,
                cpu_period_us=100_000,
                memory_limit_bytes=4 * GIB,
            ),
        )
    ]
    assert pod.cgroup_parent.startswith("/kubepods/besteffort/pod")


async def test_a_be_pod_with_an_unlimited_container_gets_an_unlimited_cgroup() -> None:
    node = await cgroup_node({"batch_cfs_quota": False})
    b = {"requests": {"kubernetes.io/batch-cpu": "250"}}
    pod = await run(node, koord("be", besteffort("a"), qos="BE", batch={"a": BATCH, "b": b}))
    assert writes(node) == [
        (pod.cgroup_parent, PodLimits(cpu_shares=768, cpu_quota_us=-1, memory_limit_bytes=-1))
    ]


@pytest.mark.parametrize(
    "kind", ["ls", "be-without-spec", "skip-label", "exempt", "unlabelled-besteffort"]
)
async def test_pods_koordlet_leaves_alone_get_no_cgroup_write(kind: str) -> None:
    node = await cgroup_node()
    node.exempt_namespaces = frozenset({"kube-system"})
    spec = {
        "ls": koord("ls", burstable("a"), qos="LS", batch={"a": BATCH}),
        "be-without-spec": koord("be", besteffort("a"), qos="BE"),
        "skip-label": koord(
            "k", besteffort("a"), qos="BE", batch={"a": BATCH}, labels={SKIP: "true"}
        ),
        "exempt": koord("dns", besteffort("a"), qos="BE", batch={"a": BATCH}),
        "unlabelled-besteffort": koord("be", besteffort("a"), batch={"a": BATCH}),
    }[kind]
    if kind == "exempt":
        spec.namespace = "kube-system"
    await run(node, spec)
    await node.sync("reconcile")
    assert writes(node) == []


async def test_a_failed_write_is_logged_counted_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = await cgroup_node()
    assert node.cgroups is not None
    spec = koord("be", besteffort("a"), besteffort("b"), qos="BE", batch={"a": BATCH})
    parent = node.sandbox_config(spec).linux.cgroup_parent
    node.cgroups.fail.add(parent)
    pod = await run(node, spec)  # the call goes on: the runtime made the sandbox
    hook = node.hook
    assert hook.pod_cgroup_failures == 1  # type: ignore[attr-defined]
    assert f"/fake/{parent}/cpu.max" in caplog.text  # the file, and why
    assert "denied" in caplog.text
    assert writes(node) == []
    await node.create(pod, besteffort("a"), "a1")  # still failing: counted again
    assert hook.pod_cgroup_failures == 2  # type: ignore[attr-defined]
    assert hook.failures() == {"pod_cgroup": 2}  # what `crihook state` and metrics show
    node.cgroups.fail.clear()
    await node.create(pod, besteffort("b"), "b1")  # the pod's next container: tried again
    assert [p for p, _ in writes(node)] == [parent]
    await node.create(pod, besteffort("c"), "c1")  # written: not again
    assert [p for p, _ in writes(node)] == [parent]


async def test_a_restart_writes_every_be_pods_cgroup_again() -> None:
    node = await start()  # no cgroups seam: nothing written
    spec = koord("be", besteffort("a"), qos="BE", batch={"a": BATCH})
    pod = await run(node, spec)
    exempt = koord("dns", besteffort("a"), qos="BE", batch={"a": BATCH})
    exempt.namespace = "kube-system"
    node.add_pod(exempt, "dns")  # learnt from the runtime
    learnt = node.add_pod(koord("late", besteffort("a"), qos="BE", batch={"a": BATCH}), "late")
    node.add_pod(koord("ls", burstable("a"), qos="LS"), "ls")

    restarted = Node(
        KoordinatorHook({}),
        TOPO,
        state=node.state,
        cgroups=FakeCgroups(),
        exempt_namespaces=frozenset({"kube-system"}),
    )
    restarted.pods, restarted.specs = node.pods, node.specs
    await restarted.sync()
    assert [p for p, _ in writes(restarted)] == [pod.cgroup_parent, learnt.cgroup_parent]


async def test_kubelets_update_does_not_undo_what_the_hook_set() -> None:
    node = await start()
    await workload(node)
    r = await run(node, lsr("lsr", "2-3"))
    await node.create(r, guaranteed("r", 2000), "r1")
    # kubelet re-sends a BestEffort container's resources: 2 shares, no quota, no memory limit.
    besteffort_linux = api_pb2.LinuxContainerResources(cpu_shares=2, cpu_period=100_000)
    pre, _, request = await node.update("be1", besteffort_linux)
    assert cpus_of(pre) == ONLINE
    assert (request.linux.cpu_shares, request.linux.cpu_quota) == (512, 100_000)
    assert request.linux.memory_limit_in_bytes == 2 * GIB
    guaranteed_linux = api_pb2.LinuxContainerResources(
        cpu_shares=2048, cpu_quota=200_000, cpu_period=100_000, cpuset_cpus="0-15"
    )
    pre, _, request = await node.update("r1", guaranteed_linux)
    assert (request.linux.cpuset_cpus, request.linux.cpu_quota) == ("2-3", -1)
    # An in-place resize (3 CPUs now) keeps the scheduler's cpuset too.
    resized = api_pb2.LinuxContainerResources(
        cpu_shares=3072, cpu_quota=300_000, cpu_period=100_000, cpuset_cpus="0-15"
    )
    pre, _, request = await node.update("r1", resized)
    assert (request.linux.cpuset_cpus, request.linux.cpu_quota) == ("2-3", -1)
    assert request.linux.cpu_shares == 3072
    # An update carrying annotations only asks for no resources: no batch values are set.
    request = api_pb2.UpdateContainerResourcesRequest(container_id="be1")
    view = node.containers["be1"]
    pre = await node.stage(
        Event.UPDATE_CONTAINER_RESOURCES, Stage.PRE, node.pods["be"], view, request
    )
    assert value(pre, Field.CPU_SHARES) is None


async def test_pod_level_values_stay_on_a_pod_resize() -> None:
    node = await start()
    spec = koord("be", besteffort("a"), qos="BE", batch={"a": BATCH})
    pod = await run(node, spec)
    request = api_pb2.UpdatePodSandboxResourcesRequest(pod_sandbox_id="be")
    pre = await node.stage(Event.UPDATE_POD_SANDBOX_RESOURCES, Stage.PRE, pod, None, request)
    assert value(pre, Field.CPU_QUOTA) == 100_000
    assert value(pre, Field.MEMORY_LIMIT) == 2 * GIB


@pytest.mark.parametrize(
    ("qos", "refused"),
    [pytest.param("BE", True, id="BE-refused"), pytest.param("LS", False, id="LS-not-read")],
)
async def test_a_malformed_batch_spec_refuses_be_pods(qos: str, refused: bool) -> None:
    node = await start()
    spec = koord("p", besteffort("a"), qos=qos, annotations={SPEC: '{"containers": {"a": 1}}'})
    if not refused:
        pre = await sandbox_pre(node, spec)
        assert pre is not None and not pre
        assert pre.reason == "QoS LS (label koordinator.sh/qosClass)"
        return
    with pytest.raises(InvalidRequest, match=f"pod default/p: annotation {SPEC}: container 'a'"):
        await sandbox_pre(node, spec)


# --- skip label, write-ahead, failures, restarts -------------------------------------------------


async def test_a_skipped_pod_gets_nothing_of_koordinators_but_is_placed_and_counted() -> None:
    node = await start()
    r = await run(node, lsr("lsr", "2-3"))
    await node.create(r, guaranteed("r", 2000), "r1")
    spec = koord("koordlet", besteffort("k"), qos="BE", batch={"k": BATCH}, labels={SKIP: "true"})
    pre = await sandbox_pre(node, spec)
    assert pre is not None and not pre
    assert pre.reason == f'skipped: label {SKIP}="true" (placed and counted on the pools only)'
    pod = await run(node, spec)
    created = await node.create(pod, besteffort("k"), "k1")
    assert dict(created.pre.changes) == {(Field.CPUSET_CPUS, ""): format_cpu_list(ONLINE)}  # type: ignore[union-attr]
    assert "k1" in node.hook.ledger.pool.containers  # type: ignore[attr-defined]  # it counts
    lse = await run(node, lsr("lse", "4-5", qos="LSE"))
    moved = await node.create(lse, guaranteed("r", 2000), "e1")
    assert updated(moved.pre)["k1"] == ONLINE - {4, 5}


async def test_a_pod_crihook_exempts_is_skipped_like_the_label_says() -> None:
    node = await start()
    node.exempt_namespaces = frozenset({"kube-system"})
    spec = koord("dns", besteffort("d"), qos="BE", batch={"d": BATCH})
    spec.namespace = "kube-system"
    pre = await sandbox_pre(node, spec)
    assert pre is not None and not pre
    assert pre.reason.startswith("skipped: exempt by crihook's configuration")
    pod = await run(node, spec)
    created = await node.create(pod, besteffort("d"), "d1")
    # Placed on the BE pool and counted, but no batch values.
    assert dict(created.pre.changes) == {(Field.CPUSET_CPUS, ""): format_cpu_list(ONLINE)}  # type: ignore[union-attr]
    assert "d1" in node.hook.ledger.pool.containers  # type: ignore[attr-defined]
    # The same pod outside the exempt namespace gets its batch values.
    spec.namespace = "default"
    assert value(await sandbox_pre(node, spec), Field.CPU_QUOTA) == 100_000


async def test_the_reservation_is_written_ahead_and_released_when_the_call_fails() -> None:
    node = await start()
    pod = await run(node, lsr("lsr", "2-3"))
    created = await node.begin_create(pod, guaranteed("r", 2000))
    assert parse_cpu_list(node.state.get("r:lsr/r/0")["cpus"]) == {2, 3}
    await node.fail_create(pod, created)
    assert node.state.get("r:lsr/r/0") is None
    ls = await run(node, koord("ls", burstable("a"), qos="LS"))
    assert cpus_of((await node.create(ls, burstable("a"), "a1")).pre) == ONLINE


async def test_a_restart_rebuilds_the_pools_and_adopts_what_it_missed() -> None:
    node = await start()
    await workload(node)
    r = await run(node, lsr("lsr", "2-3"))
    await node.create(r, guaranteed("r", 2000), "r1")
    # Created while crihook was down: an LSE pod running where kubelet put it (everywhere).
    lse = lsr("lse", "6-7", qos="LSE")
    view = node.add_pod(lse, "lse")
    _, request = node.create_request(view, lse.containers[0])
    node.containers["e1"] = container_view_from_config("e1", view, request.config)
    node.set_state("e1", ContainerState.RUNNING)

    restarted = Node(KoordinatorHook({}), TOPO, state=node.state)
    restarted.pods, restarted.specs = node.pods, node.specs
    restarted.containers, restarted.states = node.containers, node.states
    repairs = await restarted.sync()
    repaired = {u.container_id: parse_cpu_list(u.resources.cpuset_cpus or "") for u in repairs}
    assert repaired == {"e1": {6, 7}, "ls1": ONLINE - {2, 3, 6, 7}, "be1": ONLINE - {6, 7}}
    ledger = restarted.hook.ledger  # type: ignore[attr-defined]
    assert ledger.pool.containers["e1"].scheduled


# --- with the cpuset hook as the CPU manager ------------------------------------------------------


async def test_with_the_cpuset_hook_in_front_this_hook_sets_no_container_cpuset() -> None:
    node = await start({"cpu_manager": "cpuset"})
    pod = await run(node, koord("be", besteffort("a"), qos="BE", batch={"a": BATCH}))
    created = await node.create(pod, besteffort("a"), "a1", cpuset="0-15")
    assert cpus_of(created.pre) is None
    assert value(created.pre, Field.CPU_QUOTA) == 100_000
    spec = lsr("lsr", "2-3")
    assert cpus_of(await sandbox_pre(node, spec)) == {2, 3}  # the sandbox is still this hook's
    r = await run(node, spec)
    placed = await node.create(r, guaranteed("r", 2000), "r1", cpuset="2-3")
    assert placed.pre is not None and not placed.pre
    assert placed.pre.reason == (
        'cpus: the cpuset hook\'s (cpu_manager = "cpuset"); QoS LSR (label koordinator.sh/qosClass)'
    )
    with pytest.raises(Reject, match='cpu_manager = "cpuset" needs the cpuset hook'):
        await node.begin_create(r, guaranteed("r", 2000), attempt=1, cpuset="")


async def test_placing_cpus_itself_it_refuses_a_second_cpu_manager_in_front() -> None:
    node = await start()
    pod = await run(node, koord("ls", burstable("a"), qos="LS"))
    with pytest.raises(Reject, match=r'set \[hooks.koordinator\] cpu_manager = "cpuset"'):
        await node.begin_create(pod, burstable("a"), cpuset="0-7")


def test_registered_at_25_between_cpuset_and_numa_with_its_grants() -> None:
    builtin = BUILTIN_HOOKS["koordinator"]
    assert builtin.position == 25
    assert builtin.target == "crihook.hooks.koordinator:KoordinatorHook"
    assert KoordinatorHook.sets == (
        "cpuset_cpus",
        "cpu_quota",
        "cpu_period",
        "cpu_shares",
        "memory_limit_in_bytes",
    )
    assert KoordinatorHook.honours_exemption is False


# --- why: each adjustment names the rule that decided -------------------------------------------

LABEL_QOS = "(label koordinator.sh/qosClass)"


@pytest.mark.parametrize(
    ("spec", "container", "reason"),
    [
        pytest.param(
            lsr("lsr", "2-3"),
            guaranteed("r", 2000),
            f"cpus: koord-scheduler's ({STATUS}); QoS LSR {LABEL_QOS}",
            id="LSR-scheduler-cpus",
        ),
        pytest.param(
            lsr("lse", "2-3", qos="LSE"),
            guaranteed("r", 2000),
            f"cpus: koord-scheduler's ({STATUS}), out of the BE pool too (LSE); "
            f"QoS LSE {LABEL_QOS}",
            id="LSE-scheduler-cpus",
        ),
        pytest.param(
            koord("ls", burstable("a"), qos="LS"),
            burstable("a"),
            f"cpus: the node's shared pool; QoS LS {LABEL_QOS}",
            id="LS-label",
        ),
        pytest.param(
            koord("web", burstable("a")),
            burstable("a"),
            "cpus: the node's shared pool; QoS LS (from Kubernetes QoS Burstable)",
            id="LS-from-kubernetes",
        ),
        pytest.param(
            koord("web", burstable("a"), qos="XL"),
            burstable("a"),
            "cpus: the node's shared pool; QoS LS (label koordinator.sh/qosClass='XL' unknown, "
            "so from Kubernetes QoS Burstable)",
            id="unknown-label",
        ),
        pytest.param(
            koord("ls", burstable("a"), qos="LS", numa=[1]),
            burstable("a"),
            f"cpus: the node's shared pool of NUMA node(s) 1 ({STATUS}); QoS LS {LABEL_QOS}",
            id="LS-numa-narrowed",
        ),
        pytest.param(
            koord("be", besteffort("b"), qos="BE", batch={"b": BATCH}),
            besteffort("b"),
            f"cpus: the node's BE pool; QoS BE {LABEL_QOS}; batch resources ({SPEC}): "
            "CFS quota 100000/100000 µs, 512 cpu shares, memory 2Gi",
            id="BE-batch",
        ),
        pytest.param(
            koord("be", besteffort("b"), besteffort("c"), qos="BE", batch={"b": BATCH}),
            besteffort("c"),
            f"cpus: the node's BE pool; QoS BE {LABEL_QOS}; no batch resources for this "
            f"container ({SPEC})",
            id="BE-container-not-in-spec",
        ),
        pytest.param(
            koord("k", besteffort("k"), qos="BE", batch={"k": BATCH}, labels={SKIP: "true"}),
            besteffort("k"),
            f'cpus: the node\'s BE pool; skipped: label {SKIP}="true" (placed and counted on '
            "the pools only)",
            id="skip-label",
        ),
    ],
)
async def test_each_container_adjustment_says_which_rule_decided(
    spec: PodSpec, container: ContainerSpec, reason: str
) -> None:
    node = await start()
    pod = await run(node, spec)
    created = await node.create(pod, container, "c1")
    assert created.pre is not None
    assert created.pre.reason == reason


async def test_an_update_says_what_it_keeps() -> None:
    node = await start()
    pod = await run(node, lsr("lsr", "2-3"))
    await node.create(pod, guaranteed("r", 2000), "r1")
    be = await run(node, koord("be", besteffort("b"), qos="BE", batch={"b": BATCH}))
    await node.create(be, besteffort("b"), "b1")

    kept, _, _ = await node.update("r1", api_pb2.LinuxContainerResources(cpu_shares=2048))
    batch, _, _ = await node.update("b1", api_pb2.LinuxContainerResources(cpu_shares=2))

    assert kept is not None and kept.reason == (
        f"cpus kept: koord-scheduler's cpus ({STATUS}) (kubelet's resources would undo it); "
        f"QoS LSR {LABEL_QOS}"
    )
    assert batch is not None and batch.reason.startswith(
        "cpus kept: the node's BE pool (kubelet's resources would undo it); QoS BE"
    )
    assert batch.reason.endswith("CFS quota 100000/100000 µs, 512 cpu shares, memory 2Gi")
