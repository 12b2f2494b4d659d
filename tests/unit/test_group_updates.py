"""Group updates (issue 27): the work of moving every shared container onto a new pool leaves
the call that changed the pool, and grows with nothing on the call's path.

Counted, not timed:
- the cpuset hook's pre stage of a Guaranteed CreateContainer asks for one group update and
  lists no container, with 10 shared containers on the node as with 200;
- the updater builds no request when the group is issued, then one per member when it sends;
  a member due several of the group's updates before its turn gets (and is built) the newest
  only; a member that already shows the value is sent nothing;
- a later call for a member the walk has not reached yet waits for its update (it goes first);
  `before-answer` waits for every member; a recording describes every member.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.cpuset import CpusetHook
from crihook.hooks.spec import ResourceDelta
from crihook.proxy.chain.merge import PendingGroup, next_order
from crihook.proxy.core.updates import WALK_STEP, ContainerUpdater
from crihook.proxy.state.store import Store
from crihook.proxy.state.unsettled import UnsettledRuntime
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.hook_harness import SMALL, Node, burstable, guaranteed, topology_of
from tests.unit.test_store import container, pod
from tests.unit.test_unsettled import Appends
from tests.unit.test_updates import Runtime

PATIENCE = 30.0


class Pool:
    """A GroupUpdate over fixed members whose value the test changes; counts what it built."""

    key = "shared pool"
    fields = frozenset({"cpuset_cpus"})

    def __init__(self, members: list[str], value: str) -> None:
        self.ids = members
        self.value = value
        self.asked: list[str] = []
        self.listed = 0

    def members(self) -> list[str]:
        self.listed += 1
        return list(self.ids)

    def delta(self, container_id: str) -> ResourceDelta | None:
        if container_id not in self.ids:
            return None
        self.asked.append(container_id)
        return ResourceDelta(cpuset_cpus=self.value)

    def describe(self) -> dict[str, Any]:
        return {"cpuset_cpus": self.value}


def sent(runtime: Runtime) -> list[tuple[str, str]]:
    out = []
    for raw in runtime.sent:
        request = api_pb2.UpdateContainerResourcesRequest.FromString(raw)
        out.append((request.container_id, request.linux.cpuset_cpus))
    return out


def node_store(tmp_path: Path, ids: list[str]) -> Store:
    store = Store(tmp_path)
    store.put_pod(pod("p"))
    for cid in ids:
        store.put_container(container(cid, "p"))  # cpuset "2-3"
    return store


def members(
    tmp_path: Path, count: int, **options: Any
) -> tuple[list[str], Runtime, Store, ContainerUpdater]:
    """`count` containers on a node, the runtime and an updater in front of it."""
    ids = [f"c{i}" for i in range(count)]
    runtime, store = Runtime(), node_store(tmp_path, ids)
    return ids, runtime, store, ContainerUpdater(runtime, store, **options)


def issued(group: Pool) -> PendingGroup:
    return PendingGroup("20-cpuset", group, next_order())


async def until_quiet(updater: ContainerUpdater, ids: list[str]) -> None:
    async with asyncio.timeout(PATIENCE):
        while any(updater.pending(cid) for cid in ids):
            for cid in ids:
                await updater.settled(cid)
        while updater._workers:  # private: the walk's last step ends
            await asyncio.sleep(0)


# --- the cpuset hook: one group update, whatever the node holds -----------------------------


class Scans:
    """Counts the walks over every container of a CpuPool (what a call must not do)."""

    def __init__(self, pool: CpuPool, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("shared_members", "pool_members"):
            walk = getattr(pool, name)

            def counted(*args: Any, _walk: Any = walk, **kw: Any) -> Any:
                if not args or args[0] is None:  # the node's (a pod's is its own holders)
                    self.count += 1
                return _walk(*args, **kw)

            monkeypatch.setattr(pool, name, counted)


async def shared_node(shared: int) -> Node:
    node = Node(CpusetHook({}), topology_of(SMALL))
    await node.sync()
    for i in range(shared):
        pod_view = await node.run_pod(_spec(f"s{i}", burstable("app")), f"s{i}")
        await node.create(pod_view, burstable("app"), f"s{i}-c")
    return node


def _spec(name: str, *containers: ContainerSpec) -> PodSpec:
    return PodSpec(name, containers=list(containers))


@pytest.mark.parametrize("shared", [10, 200], ids=["10-shared", "200-shared"])
async def test_an_exclusive_create_asks_one_group_update_and_lists_no_container(
    shared: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await shared_node(shared)
    hook = node.hook
    assert isinstance(hook, CpusetHook)
    scans = Scans(hook.pool, monkeypatch)
    pod_view = await node.run_pod(_spec("g", guaranteed("app", 1000)), "g")
    created = await node.begin_create(pod_view, guaranteed("app", 1000))
    adjustment = created.pre
    assert adjustment is not None
    assert adjustment.updates == ()  # no update per shared container ...
    assert [g.key for g in adjustment.groups] == ["shared pool"]  # ... one for them all
    assert scans.count == 0  # and no walk over the node's containers on the call's path
    # Walked (in the background, here by the harness), it moves every shared container.
    await node.finish_create(pod_view, created, "g-c")
    moved = {u.container_id for u in node.sent if u.container_id.startswith("s")}
    assert moved == {f"s{i}-c" for i in range(shared)}


async def test_the_pool_update_gives_each_member_its_pool_as_it_is_when_sent() -> None:
    node = await shared_node(3)
    hook = node.hook
    assert isinstance(hook, CpusetHook)
    pod_view = await node.run_pod(_spec("g", guaranteed("app", 2000)), "g")
    created = await node.begin_create(pod_view, guaranteed("app", 2000))
    assert created.pre is not None
    (group,) = created.pre.groups
    assert sorted(group.members()) == ["s0-c", "s1-c", "s2-c"]
    first = group.delta("s0-c")
    assert first is not None and first.cpuset_cpus == hook.pool.node_pool_text("shared")
    assert group.delta("g-nope") is None  # not a member
    await node.finish_create(pod_view, created, "g-c")
    assert group.delta("g-c") is None  # exclusive: not on the pool
    other = await node.run_pod(_spec("h", guaranteed("app", 1000)), "h")
    await node.create(other, guaranteed("app", 1000), "h-c")
    newest = group.delta("s0-c")  # the pool shrank again: the same group gives the newest
    assert newest is not None and newest.cpuset_cpus == hook.pool.node_pool_text("shared")
    assert newest != first


# --- the updater: built only when sent, the newest only ------------------------------------


async def test_a_group_is_issued_without_building_a_request_and_sent_once_per_member(
    tmp_path: Path,
) -> None:
    ids, runtime, store, updater = members(tmp_path, 50)
    group = Pool(ids, "0-1")
    assert updater.issue([], {}, describe=False, groups=[issued(group)]) == []
    assert (updater.built, group.asked, group.listed) == (0, [], 0)  # nothing on the call's path
    assert all(updater.pending(cid) for cid in ids)
    await until_quiet(updater, ids)
    assert sorted(sent(runtime)) == sorted((cid, "0-1") for cid in ids)
    assert updater.built == len(ids)
    assert group.listed == 1
    record = store.container("c7")
    assert record is not None and record.view.resources.cpuset_cpus == "0-1"


async def test_members_due_several_pools_before_their_turn_get_the_newest_only(
    tmp_path: Path,
) -> None:
    ids, runtime, _, updater = members(tmp_path, 40)
    group = Pool(ids, "0-1")
    updater.issue([], {}, describe=False, groups=[issued(group)])
    group.value = "0"  # the pool changed again before any worker ran
    newer = Pool(ids, "0")
    updater.issue([], {}, describe=False, groups=[issued(newer)])
    await until_quiet(updater, ids)
    assert sorted(sent(runtime)) == sorted((cid, "0") for cid in ids)
    assert updater.built == len(ids)  # one request per member, none for the older pool


async def test_a_member_that_shows_the_value_already_is_sent_nothing(tmp_path: Path) -> None:
    runtime, store = Runtime(), node_store(tmp_path, ["c1", "c2"])
    updater = ContainerUpdater(runtime, store)
    updater.issue([], {}, describe=False, groups=[issued(Pool(["c1", "c2"], "2-3"))])
    await until_quiet(updater, ["c1", "c2"])
    assert sent(runtime) == []  # both were created with that pool
    assert not updater.pending("c1")


async def test_a_call_for_a_member_not_walked_yet_waits_for_its_update_first(
    tmp_path: Path,
) -> None:
    ids, runtime, _, updater = members(tmp_path, 100, parallel=1)
    runtime.answer.clear()
    updater.issue([], {}, describe=False, groups=[issued(Pool(ids, "0-1"))])
    async with asyncio.timeout(PATIENCE):
        while not runtime.sent:  # the walk began: c0 is on its way, c99 far from its turn
            await asyncio.sleep(0)
    assert updater.pending("c99")
    waiting = asyncio.create_task(updater.settled("c99"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    runtime.answer.set()
    async with asyncio.timeout(PATIENCE):
        await waiting
    # c99 went right after the update on its way, before the members walked before it.
    assert [cid for cid, _ in sent(runtime)][:2] == ["c0", "c99"]
    assert not updater.pending("c99")
    await until_quiet(updater, ids)


async def test_before_answer_waits_for_every_member(tmp_path: Path) -> None:
    ids, runtime, _, updater = members(tmp_path, 30)
    done = await updater.send([], {}, groups=[issued(Pool(ids, "1"))])
    assert sorted(u.container_id for u in done) == sorted(ids)
    assert all(u.status is None for u in done)
    assert len(runtime.sent) == len(ids)
    assert not any(updater.pending(cid) for cid in ids)


async def test_a_recording_has_the_group_described_member_by_member(tmp_path: Path) -> None:
    runtime, store = Runtime(), node_store(tmp_path, ["c1", "c2"])
    updater = ContainerUpdater(runtime, store)
    runtime.answer.clear()
    described = updater.issue([], {}, describe=True, groups=[issued(Pool(["c1", "c2"], "5"))])
    assert [(u.container_id, u.changed, u.hooks) for u in described] == [
        ("c1", {"cpuset_cpus": "5"}, ["20-cpuset"]),
        ("c2", {"cpuset_cpus": "5"}, ["20-cpuset"]),
    ]
    assert described[0].resources["cpuset_cpus"] == "5"
    runtime.answer.set()
    await until_quiet(updater, ["c1", "c2"])


async def test_what_is_due_counts_the_members_not_walked_yet(tmp_path: Path) -> None:
    """status.json's `updates_due`: what waits for crihook to be idle reads it."""
    ids, runtime, _, updater = members(tmp_path, 20)
    runtime.answer.clear()
    updater.issue([], {}, describe=False, groups=[issued(Pool(ids, "0-1"))])
    assert updater.due() == 20
    runtime.answer.set()
    await until_quiet(updater, ids)
    assert updater.due() == 0


class NamedWhenSent(Runtime):
    """The runtime, noting for each update whether the unsettled files named its container."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__()
        self.state_dir = state_dir
        self.unnamed: list[str] = []

    def call(self, path: str) -> Any:
        inner = super().call(path)

        async def update(
            request: bytes, timeout: float | None = None, metadata: object = None
        ) -> bytes:
            cid = api_pb2.UpdateContainerResourcesRequest.FromString(request).container_id
            files = [p for p in self.state_dir.iterdir() if p.name.startswith("unsettled-")]
            if cid not in {c for p in files for c in p.read_text().split()}:
                self.unnamed.append(cid)
            return await inner(request, timeout=timeout)

        return update


async def test_a_walk_names_its_members_in_the_files_once_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"c{i}" for i in range(40)]
    runtime, store = NamedWhenSent(tmp_path), node_store(tmp_path, ids)
    appends = Appends(store.unsettled, monkeypatch)
    updater = ContainerUpdater(UnsettledRuntime(runtime, store.unsettled), store)
    updater.issue([], {}, describe=False, groups=[issued(Pool(ids, "0-1"))])
    async with asyncio.timeout(PATIENCE):  # nobody waits: the walk goes step by step
        while updater.due() or updater._workers:  # private: the walk's last step ends
            await asyncio.sleep(0)
    assert sorted(sent(runtime)) == sorted((cid, "0-1") for cid in ids)
    assert runtime.unnamed == []  # each named before the runtime was asked
    assert appends.count == -(-len(ids) // WALK_STEP)  # a write per step, none per member
