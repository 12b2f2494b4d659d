"""`[hooks.cpuset] shared_pool_in = "qos-cgroups"`: the shared pool held in kubelet's QoS
cgroups instead of every shared container's cpuset.

The path mapping and the file write are pure or on a temp tree; the ledger runs in-process
(tests/unit/hook_harness.py) with a `FakeCgroups` recording what each QoS cgroup was given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.cpus import qos_writer
from crihook.hooks.cpus.options import host_problems, parse_options
from crihook.hooks.cpus.qos_pools import same_cpus
from crihook.hooks.cpus.report import ledger_host_check
from crihook.hooks.cpuset import CpusetHook
from crihook.hooks.node import LinuxPodCgroups, format_cpu_list, parse_cpu_list
from crihook.hooks.node.qos import QosCgroup, qos_cgroup
from crihook.hooks.spec import ContainerState, Event, Field, Stage
from crihook.proxy.core import observe
from crihook.proxy.core.observe import ObservedCgroups
from crihook.proxy.replay.seams import RecordedNode
from crihook.proxy.state.store import Store
from tests.lab.kubelet_encoding import PodSpec
from tests.unit.hook_harness import (
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
QOS = {"shared_pool_in": "qos-cgroups"}
BURSTABLE = "kubepods/burstable"
BESTEFFORT = "kubepods/besteffort"
SYSTEMD_BURSTABLE = "kubepods.slice/kubepods-burstable.slice"
SYSTEMD_BESTEFFORT = "kubepods.slice/kubepods-besteffort.slice"
PATIENCE = 30.0


# --- where the QoS cgroup is --------------------------------------------------------------


class Parent(NamedTuple):
    cgroup_parent: str
    want: QosCgroup | None


PARENTS = {
    "cgroupfs burstable": Parent("/kubepods/burstable/pod1", QosCgroup(BURSTABLE, "burstable")),
    "cgroupfs besteffort": Parent("/kubepods/besteffort/pod1", QosCgroup(BESTEFFORT, "besteffort")),
    "cgroupfs guaranteed": Parent("/kubepods/pod1", None),
    "cgroupfs cgroup root": Parent(
        "/node-x/kubepods/burstable/pod1", QosCgroup("node-x/kubepods/burstable", "burstable")
    ),
    "systemd burstable": Parent(
        "kubepods-burstable-pod1.slice", QosCgroup(SYSTEMD_BURSTABLE, "burstable")
    ),
    "systemd besteffort": Parent(
        "kubepods-besteffort-pod1.slice", QosCgroup(SYSTEMD_BESTEFFORT, "besteffort")
    ),
    "systemd guaranteed": Parent("kubepods-pod1.slice", None),
    "systemd cgroup root": Parent(
        "node-kubepods-burstable-pod1.slice",
        QosCgroup("node.slice/node-kubepods.slice/node-kubepods-burstable.slice", "burstable"),
    ),
    "empty": Parent("", None),
    "climbs out": Parent("/kubepods/../burstable/pod1", None),
    "no pod level": Parent("/burstable", None),
    "other parent": Parent("/system/workload/pod1", None),
}


@pytest.mark.parametrize("row", PARENTS.values(), ids=PARENTS.keys())
def test_qos_cgroup_of_a_pod(row: Parent) -> None:
    assert qos_cgroup(row.cgroup_parent) == row.want


def test_write_qos_cpus_on_a_cgroup_tree(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu memory\n")
    qos = tmp_path / "kubepods" / "burstable"
    qos.mkdir(parents=True)
    (qos / "cpuset.cpus").write_text("")
    cgroups = LinuxPodCgroups(tmp_path)
    assert cgroups.write_qos_cpus(BURSTABLE, "0-3,8")
    assert (qos / "cpuset.cpus").read_text() == "0-3,8"
    assert cgroups.write_qos_cpus(BESTEFFORT, "0-3") is False  # kubelet has not made it
    assert not (tmp_path / "kubepods" / "besteffort").exists()  # nor did crihook
    with pytest.raises(ValueError, match="empty cpuset"):
        cgroups.write_qos_cpus(BURSTABLE, "")
    with pytest.raises(ValueError, match="not a QoS cgroup path"):
        cgroups.write_qos_cpus("kubepods/../..", "0")
    assert (qos / "cpuset.cpus").read_text() == "0-3,8"


def test_read_qos_cpus_on_a_cgroup_tree(tmp_path: Path) -> None:
    qos = tmp_path / "kubepods" / "burstable"
    qos.mkdir(parents=True)
    (qos / "cpuset.cpus").write_text("\n")  # as kubelet made it: every CPU of its parent
    cgroups = LinuxPodCgroups(tmp_path)
    assert cgroups.read_qos_cpus(BURSTABLE) == ""
    (qos / "cpuset.cpus").write_text("0-3,8\n")
    assert cgroups.read_qos_cpus(BURSTABLE) == "0-3,8"
    assert cgroups.read_qos_cpus(BESTEFFORT) is None  # kubelet has not made it
    with pytest.raises(ValueError, match="not a QoS cgroup path"):
        cgroups.read_qos_cpus("kubepods/../..")
    (qos / "cpuset.cpus").unlink()  # the cpuset controller not enabled there
    with pytest.raises(OSError, match=r"cannot read .*kubepods/burstable/cpuset\.cpus"):
        cgroups.read_qos_cpus(BURSTABLE)


def test_a_qos_read_is_noted_for_a_recording_and_answered_by_a_replay(tmp_path: Path) -> None:
    cgroups = FakeCgroups()
    cgroups.qos[BURSTABLE] = "1-15"
    cgroups.qos_missing = {BESTEFFORT}
    observed, token = observe.begin()
    try:
        assert ObservedCgroups(cgroups).read_qos_cpus(BURSTABLE) == "1-15"
        assert ObservedCgroups(cgroups).read_qos_cpus(BESTEFFORT) is None
    finally:
        observe.end(token)
    assert [(o.seam, o.op, o.args, o.result) for o in observed] == [
        ("host", "read_qos_cpus", [BURSTABLE], "1-15"),
        ("host", "read_qos_cpus", [BESTEFFORT], None),
    ]
    replayed = RecordedNode(Store(tmp_path))
    replayed.begin([o._asdict() for o in observed])
    assert replayed.read_qos_cpus(BURSTABLE) == "1-15"
    assert replayed.read_qos_cpus(BESTEFFORT) is None
    assert replayed.read_qos_cpus(SYSTEMD_BURSTABLE) is None  # not recorded: not there
    assert replayed.effects == []  # a read changes nothing on the host
    assert replayed.missing == [f"host.read_qos_cpus({SYSTEMD_BURSTABLE!r},)"]


# --- the option, and the hosts it needs -----------------------------------------------------


def test_shared_pool_in_option() -> None:
    assert parse_options({}).shared_pool_in == "containers"
    assert not parse_options({}).pool_in_qos_cgroups
    assert parse_options(QOS).pool_in_qos_cgroups
    with pytest.raises(ValueError, match='shared_pool_in must be "containers" or "qos-cgroups"'):
        parse_options({"shared_pool_in": "qos"})


HOSTS = {
    "v2": (2, []),
    "v1": (1, ["shared_pool_in"]),
    "no cgroupfs": (None, ["shared_pool_in"]),
}


@pytest.mark.parametrize(("version", "refused"), HOSTS.values(), ids=HOSTS.keys())
def test_qos_cgroups_needs_cgroup_v2(version: int | None, refused: list[str]) -> None:
    assert [option for option, _ in ledger_host_check(QOS, version)] == refused
    assert ledger_host_check({}, version) == []  # the default asks nothing of the host
    if version == 1:
        [(_, problem)] = host_problems(parse_options(QOS), 1)
        assert "cgroup v2" in problem and "cgroup v1" in problem


def test_crihook_refuses_qos_cgroups_on_cgroup_v1(tmp_path: Path) -> None:
    from crihook.proxy.chain.local_hooks import host_problems
    from crihook.proxy.config import HookSettings

    (tmp_path / "memory").mkdir()  # a v1 hierarchy, and no cgroup.controllers
    hooks = [HookSettings(name="20-cpuset", options=QOS), HookSettings(name="40-oom")]
    [refused] = host_problems(hooks, tmp_path)
    assert refused.setting == "[hooks.cpuset] shared_pool_in"
    assert "cgroup v1" in refused.problem
    assert host_problems([HookSettings(name="20-cpuset")], tmp_path) == []
    # A hook of that name that is not the built-in one is not judged by the built-in's rule.
    custom = HookSettings(name="20-cpuset", options=QOS, module="example.hooks:Cpuset")
    assert host_problems([custom], tmp_path) == []
    (tmp_path / "memory").rmdir()
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu\n")
    assert host_problems(hooks, tmp_path) == []  # v2: nothing to say


# --- the ledger ------------------------------------------------------------------------------


async def start(options: dict[str, Any] | None = None, cgroups: FakeCgroups | None = None) -> Node:
    node = Node(CpusetHook({**QOS, **(options or {})}), TOPO, cgroups=cgroups or FakeCgroups())
    await node.sync()
    return node


def cgroups_of(node: Node) -> FakeCgroups:
    assert node.cgroups is not None
    return node.cgroups


def held(node: Node, path: str) -> frozenset[int]:
    return parse_cpu_list(cgroups_of(node).qos[path])


async def test_start_writes_every_qos_cgroup_with_the_pool() -> None:
    cgroups = FakeCgroups()
    cgroups.qos_missing = {SYSTEMD_BURSTABLE, SYSTEMD_BESTEFFORT}  # a cgroupfs node
    node = await start({"reserved_cpus": "0"}, cgroups)
    assert sorted(cgroups.qos_writes) == [(BESTEFFORT, "0-15"), (BURSTABLE, "0-15")]
    await node.run_pod(PodSpec("b", containers=[burstable("app")]), "b")
    assert len(cgroups.qos_writes) == 2  # nothing changed: nothing written again
    await node.hook.close()


async def test_shared_containers_get_no_cpuset_and_no_update() -> None:
    node = await start({"reserved_cpus": "0"})
    b = await node.run_pod(PodSpec("b", containers=[burstable("app")]), "b")
    made = await node.create(b, burstable("app"), "b1")
    assert made.pre is None and made.post is None
    assert node.containers["b1"].resources.cpuset_cpus == ""
    e = await node.run_pod(PodSpec("e", containers=[besteffort("app")]), "e")
    await node.create(e, besteffort("app"), "e1")
    # A Guaranteed pod's shared container (not whole CPUs) sits in kubepods: its own cpuset.
    h = await node.run_pod(PodSpec("h", containers=[guaranteed("app", 500)]), "h")
    half = await node.create(h, guaranteed("app", 500), "h1")
    assert half.pre is not None and half.pre.changes[(Field.CPUSET_CPUS, "")] == "0-15"

    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    pick = await node.begin_create(g, guaranteed("app", 2000))
    exclusive = parse_cpu_list(pick.request.config.linux.resources.cpuset_cpus)
    assert len(exclusive) == 2
    assert held(node, BURSTABLE) == ONLINE  # the pick alone writes nothing (a later hook
    # may refuse the call)
    # Only the Guaranteed pod's shared container is sent the pool.
    assert [u.container_id for u in every_update(pick.pre)] == ["h1"]
    await node.finish_create(g, pick, "g1")
    # Narrowed in the post stage: before kubelet hears OK, so before it starts the container.
    assert held(node, BURSTABLE) == ONLINE - exclusive
    assert held(node, BESTEFFORT) == ONLINE - exclusive
    assert held(node, SYSTEMD_BURSTABLE) == ONLINE - exclusive
    assert node.cpus("h1") == ONLINE - exclusive
    assert node.containers["b1"].resources.cpuset_cpus == ""
    assert node.containers["e1"].resources.cpuset_cpus == ""

    # Given back: the QoS cgroups widen (post stage), the Guaranteed shared container follows.
    gone = await node.remove("g1")
    assert held(node, BURSTABLE) == ONLINE
    assert held(node, BESTEFFORT) == ONLINE
    assert [u.container_id for u in every_update(gone)] == ["h1"]
    await node.hook.close()


async def test_a_failed_create_writes_nothing() -> None:
    node = await start({"reserved_cpus": "0"})
    writes = len(cgroups_of(node).qos_writes)
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    pick = await node.begin_create(g, guaranteed("app", 2000))
    await node.fail_create(g, pick)  # refused by a later hook, the runtime, or a dry-run
    assert len(cgroups_of(node).qos_writes) == writes
    assert held(node, BURSTABLE) == ONLINE
    await node.hook.close()


async def test_an_in_place_resize_narrows_them_in_its_post_stage() -> None:
    node = await start({"reserved_cpus": "0", "resize_exclusive_cpus": True})
    cgroups = cgroups_of(node)
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    await node.create(g, guaranteed("app", 2000), "g1")
    created_with = node.cpus("g1")
    grow = api_pb2.LinuxContainerResources(cpu_shares=4096, cpu_quota=400_000, cpu_period=100_000)
    before = len(cgroups.qos_writes)
    # Refused after its pre stage (by the runtime, a later hook, or a dry-run): nothing
    # was written, so nothing is widened back either.
    pre = await node.fail_update("g1", grow)
    assert len(parse_cpu_list(pre.changes[(Field.CPUSET_CPUS, "")])) == 4
    assert cgroups.qos_writes[before:] == []
    assert held(node, BURSTABLE) == ONLINE - created_with

    # Its pre stage picks the CPUs and writes nothing; the post stage narrows them, after
    # the runtime gave the container its CPUs (shared with the QoS cgroup's containers for
    # that call only).
    view, event = node.containers["g1"], Event.UPDATE_CONTAINER_RESOURCES
    request = api_pb2.UpdateContainerResourcesRequest(container_id="g1", linux=grow)
    pre = await node.stage(event, Stage.PRE, g, view, request)
    grown = parse_cpu_list(pre.changes[(Field.CPUSET_CPUS, "")])
    assert len(grown) == 4 and grown > created_with
    assert cgroups.qos_writes[before:] == []
    response = api_pb2.UpdateContainerResourcesResponse()
    assert await node.stage(event, Stage.POST, g, view, request, response) is None
    assert held(node, BURSTABLE) == ONLINE - grown
    assert held(node, BESTEFFORT) == ONLINE - grown
    after = len(cgroups.qos_writes)

    # Shrunk back to what it was created with: widened in the post stage too.
    shrink = api_pb2.LinuxContainerResources(cpu_shares=2048, cpu_quota=200_000, cpu_period=100_000)
    request = api_pb2.UpdateContainerResourcesRequest(container_id="g1", linux=shrink)
    pre = await node.stage(event, Stage.PRE, g, view, request)
    assert parse_cpu_list(pre.changes[(Field.CPUSET_CPUS, "")]) == created_with
    assert len(cgroups.qos_writes) == after
    await node.stage(event, Stage.POST, g, view, request, response)
    assert held(node, BURSTABLE) == ONLINE - created_with
    await node.hook.close()


async def test_a_failed_resize_widens_them_back_if_another_call_wrote_its_pick() -> None:
    node = await start({"reserved_cpus": "0", "resize_exclusive_cpus": True})
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    await node.create(g, guaranteed("app", 2000), "g1")
    grow = api_pb2.LinuxContainerResources(cpu_shares=4096, cpu_quota=400_000, cpu_period=100_000)
    view, event = node.containers["g1"], Event.UPDATE_CONTAINER_RESOURCES
    request = api_pb2.UpdateContainerResourcesRequest(container_id="g1", linux=grow)
    pre = await node.stage(event, Stage.PRE, g, view, request)
    grown = parse_cpu_list(pre.changes[(Field.CPUSET_CPUS, "")])
    # Meanwhile another pod's container is created: its post stage writes the pools as the
    # ledger has them, the resize's pick left out too.
    h = await node.run_pod(PodSpec("h", containers=[guaranteed("app", 1000)]), "h")
    await node.create(h, guaranteed("app", 1000), "h1")
    assert held(node, BURSTABLE) == ONLINE - grown - node.cpus("h1")
    await node.stage(event, Stage.FAILED, g, view, request, failure="runtime said no")
    assert held(node, BURSTABLE) == ONLINE - node.cpus("g1") - node.cpus("h1")
    await node.hook.close()


async def test_a_cpuset_kubelet_sent_is_cleared() -> None:
    node = await start({"reserved_cpus": "0"})
    b = await node.run_pod(PodSpec("b", containers=[burstable("app")]), "b")
    made = await node.create(b, burstable("app"), "b1", cpuset="0-3")
    assert made.pre is not None
    assert made.pre.changes[(Field.CPUSET_CPUS, "")] == ""
    assert made.request.config.linux.resources.cpuset_cpus == ""
    # kubelet's update with a cpuset: cleared too (an empty one keeps what the runtime has).
    pre, _, request = await node.update("b1", api_pb2.LinuxContainerResources(cpuset_cpus="1"))
    assert pre is not None and request.linux.cpuset_cpus == ""
    pre, _, _ = await node.update("b1", api_pb2.LinuxContainerResources(cpu_shares=512))
    assert pre is None
    await node.hook.close()


async def test_systemd_pods_follow_their_slice() -> None:
    node = await start({"reserved_cpus": "0"})
    plain = node.sandbox_config

    def systemd(spec: PodSpec, cpu_budget: int | None = None) -> api_pb2.PodSandboxConfig:
        config = plain(spec, cpu_budget)
        qos = config.linux.cgroup_parent.split("/")[-2]
        tier = "" if qos == "kubepods" else f"-{qos}"
        config.linux.cgroup_parent = f"kubepods{tier}-pod{spec.uid.replace('-', '_')}.slice"
        return config

    node.sandbox_config = systemd  # type: ignore[method-assign]
    b = await node.run_pod(PodSpec("b", containers=[burstable("app")]), "b")
    assert b.cgroup_parent.startswith("kubepods-burstable-pod")
    made = await node.create(b, burstable("app"), "b1")
    assert made.pre is None
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 1000)]), "g")
    assert g.cgroup_parent.startswith("kubepods-pod")
    await node.create(g, guaranteed("app", 1000), "g1")
    assert held(node, SYSTEMD_BURSTABLE) == ONLINE - node.cpus("g1")
    await node.hook.close()


async def test_a_qos_cgroup_kubelet_makes_later_is_written_at_its_first_pod() -> None:
    cgroups = FakeCgroups()
    cgroups.qos_missing = {BESTEFFORT}
    node = await start({"reserved_cpus": "0"}, cgroups)
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 1000)]), "g")
    await node.create(g, guaranteed("app", 1000), "g1")
    assert BESTEFFORT not in cgroups.qos
    cgroups.qos_missing = set()  # kubelet made it
    await node.run_pod(PodSpec("e", containers=[besteffort("app")]), "e")
    assert held(node, BESTEFFORT) == ONLINE - node.cpus("g1")
    await node.hook.close()


async def test_a_failed_write_is_counted_and_retried() -> None:
    cgroups = FakeCgroups()
    node = await start({"reserved_cpus": "0"}, cgroups)
    hook = node.hook
    assert hook.failures() == {
        "qos_cgroup_writes": 0,
        "qos_cgroup_repairs": 0,
        "qos_cgroup_reads": 0,
    }
    cgroups.fail = {BURSTABLE}
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 1000)]), "g")
    made = await node.create(g, guaranteed("app", 1000), "g1")  # the call goes on
    assert made.cid == "g1"
    assert hook.failures()["qos_cgroup_writes"] >= 1
    assert held(node, BURSTABLE) == ONLINE  # not narrowed yet
    assert held(node, BESTEFFORT) == ONLINE - node.cpus("g1")  # the other one was
    cgroups.fail = set()
    for _ in range(100):  # the retry task's first try is 0.2 s after the failure
        if held(node, BURSTABLE) != ONLINE:
            break
        await asyncio.sleep(0.05)
    assert held(node, BURSTABLE) == ONLINE - node.cpus("g1")
    await hook.close()


async def test_the_retry_stops_at_close() -> None:
    cgroups = FakeCgroups()
    node = await start({"reserved_cpus": "0"}, cgroups)
    cgroups.fail = {BURSTABLE}
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 1000)]), "g")
    await node.create(g, guaranteed("app", 1000), "g1")
    retry = node.hook._qos._retry  # type: ignore[attr-defined]
    assert retry is not None and not retry.done()
    await node.hook.close()
    assert retry.cancelled()


# --- read back every QOS_VERIFY_SECONDS --------------------------------------------------------


class Held(NamedTuple):
    held: str
    written: str
    same: bool


HELD = {
    "equal text": Held("0-3,8", "0-3,8", True),
    "ranges and a list": Held("0-3", "0,1,2,3", True),
    "whitespace": Held("0-3\n", "0-3", True),
    "reset to every CPU": Held("", "1-15", False),
    "wider": Held("0-15", "1-15", False),
    "narrower": Held("2-15", "1-15", False),
    "no cpulist": Held("all", "1-15", False),
}


@pytest.mark.parametrize("row", HELD.values(), ids=HELD.keys())
def test_what_a_qos_cgroup_holds_compared_as_cpus(row: Held) -> None:
    assert same_cpus(row.held, row.written) is row.same


async def until(predicate: Callable[[], object], what: str) -> None:
    async with asyncio.timeout(PATIENCE):
        while not predicate():
            await asyncio.sleep(0.001)


async def checked(node: Node, rounds: int = 2) -> None:
    """Until the verification read every QoS cgroup crihook wrote `rounds` more times."""
    cgroups = cgroups_of(node)
    want = len(cgroups.qos_reads) + rounds * len(cgroups.qos)
    await until(lambda: len(cgroups.qos_reads) >= want, "the QoS cgroups read back")


@pytest.fixture
def verify_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qos_writer, "QOS_VERIFY_SECONDS", 0.001)


@pytest.mark.usefixtures("verify_often")
async def test_a_qos_cgroup_reset_behind_crihooks_back_is_written_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cgroups = FakeCgroups()
    cgroups.qos_missing = {SYSTEMD_BURSTABLE, SYSTEMD_BESTEFFORT}  # a cgroupfs node
    node = await start({"reserved_cpus": "0"}, cgroups)
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    await node.create(g, guaranteed("app", 2000), "g1")
    pool = format_cpu_list(ONLINE - node.cpus("g1"))
    await checked(node)
    assert set(cgroups.qos_reads) == {BURSTABLE, BESTEFFORT}  # only those there
    writes = len(cgroups.qos_writes)
    caplog.set_level(logging.WARNING, logger="crihook.hooks.cpus.ledger")
    cgroups.qos[BURSTABLE] = ""  # systemd re-applied the slice's empty AllowedCPUs=
    await until(lambda: cgroups.qos[BURSTABLE] != "", "the QoS cgroup written again")
    assert cgroups.qos_writes[writes:] == [(BURSTABLE, pool)]  # only the one reset
    assert node.hook.failures()["qos_cgroup_repairs"] == 1
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning == (
        f'cpuset: QoS cgroup {BURSTABLE} held cpuset.cpus "" (every CPU of its parent), not '
        f"the pool {pool} crihook gave it (reset behind its back): given {pool} again"
    )
    await checked(node)
    assert node.hook.failures()["qos_cgroup_repairs"] == 1  # repaired once, not again
    await node.hook.close()


@pytest.mark.usefixtures("verify_often")
async def test_the_same_cpus_written_otherwise_are_left_alone() -> None:
    cgroups = FakeCgroups()
    node = await start({"reserved_cpus": "0"}, cgroups)
    g = await node.run_pod(PodSpec("g", containers=[guaranteed("app", 2000)]), "g")
    await node.create(g, guaranteed("app", 2000), "g1")
    writes = len(cgroups.qos_writes)
    spelled_out = ",".join(str(cpu) for cpu in sorted(ONLINE - node.cpus("g1")))
    cgroups.qos[BURSTABLE] = spelled_out  # the same CPUs, not as crihook wrote them
    await checked(node)
    assert len(cgroups.qos_writes) == writes
    assert node.hook.failures()["qos_cgroup_repairs"] == 0
    await node.hook.close()


@pytest.mark.usefixtures("verify_often")
async def test_a_failed_read_back_is_counted_and_read_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cgroups = FakeCgroups()
    node = await start({"reserved_cpus": "0"}, cgroups)
    writes = len(cgroups.qos_writes)
    caplog.set_level(logging.WARNING, logger="crihook.hooks.cpus.ledger")
    cgroups.read_fail = {BURSTABLE}
    await until(lambda: node.hook.failures()["qos_cgroup_reads"] >= 2, "two failed reads")
    assert f"cpuset: QoS cgroup {BURSTABLE}: its cpuset.cpus could not be checked" in (
        caplog.records[0].getMessage()
    )
    cgroups.read_fail = set()
    cgroups.qos[BURSTABLE] = ""
    await until(lambda: cgroups.qos[BURSTABLE] != "", "read again, and written again")
    assert cgroups.qos_writes[writes:] == [(BURSTABLE, format_cpu_list(ONLINE))]
    await node.hook.close()


@pytest.mark.usefixtures("verify_often")
async def test_the_check_belongs_to_no_recorded_call_and_stops_at_close() -> None:
    cgroups = FakeCgroups()
    node = Node(CpusetHook(QOS), TOPO, cgroups=ObservedCgroups(cgroups))  # type: ignore[arg-type]
    observed, token = observe.begin()  # as a recording notes a synchronize
    try:
        await node.sync()
    finally:
        observe.end(token)
    assert {o.op for o in observed} == {"write_qos_cpus"}
    await until(lambda: len(cgroups.qos_reads) >= 2 * len(cgroups.qos), "two checks")
    assert {o.op for o in observed} == {"write_qos_cpus"}  # the reads noted nowhere
    verify = node.hook._qos._verify  # type: ignore[attr-defined]
    assert verify is not None and not verify.done()
    await node.hook.close()
    assert verify.cancelled()


async def test_no_check_without_qos_cgroups() -> None:
    node = Node(CpusetHook({"reserved_cpus": "0"}), TOPO, cgroups=FakeCgroups())
    await node.sync()
    assert node.hook._qos is None  # type: ignore[attr-defined]  # no writer, so no check
    assert node.hook.failures() == {}


async def test_restart_writes_the_pool_and_moves_containers_off_their_own_cpuset() -> None:
    """A node that ran with `containers`: its shared containers hold the pool as their
    cpuset. With `qos-cgroups` they are given every CPU (CRI cannot clear a cpuset) after
    their QoS cgroups were narrowed; a Guaranteed pod's shared container keeps the pool."""
    old = Node(CpusetHook({"reserved_cpus": "0"}), TOPO)
    await old.sync()
    g = await old.run_pod(PodSpec("g", containers=[guaranteed("app", 1000)]), "g")
    await old.create(g, guaranteed("app", 1000), "g1")
    b = await old.run_pod(PodSpec("b", containers=[burstable("app")]), "b")
    await old.create(b, burstable("app"), "b1")
    h = await old.run_pod(PodSpec("h", containers=[guaranteed("app", 500)]), "h")
    await old.create(h, guaranteed("app", 500), "h1")
    exclusive = old.cpus("g1")
    assert old.cpus("b1") == ONLINE - exclusive

    cgroups = FakeCgroups()
    new = Node(CpusetHook({**QOS, "reserved_cpus": "0"}), TOPO, cgroups=cgroups, state=old.state)
    new.pods, new.specs, new.states = old.pods, old.specs, old.states
    new.containers = dict(old.containers)
    repairs = await new.sync()
    assert held(new, BURSTABLE) == ONLINE - exclusive
    assert [(u.container_id, u.resources.cpuset_cpus) for u in repairs] == [
        ("b1", format_cpu_list(ONLINE))
    ]
    # From now on a pool change sends b1 nothing, h1 its pool.
    g2 = await new.run_pod(PodSpec("g2", containers=[guaranteed("app", 1000)]), "g2")
    made = await new.create(g2, guaranteed("app", 1000), "g2c")
    assert [u.container_id for u in every_update(made.pre)] == ["h1"]
    assert held(new, BURSTABLE) == ONLINE - exclusive - new.cpus("g2c")
    assert new.states["b1"] is ContainerState.RUNNING
    await new.hook.close()
