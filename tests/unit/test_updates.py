"""ContainerUpdater: updates to containers removed while they were on their way.

Found by the soak's endurance part (bench/soak_load.py): a Guaranteed container's exclusive CPU
makes the cpuset hook update every shared container after CreateContainer succeeds; a shared
container that kubelet removed meanwhile gets the update after `forget`, and its ordering
record stayed for ever (one per such race: the Python objects grew with the calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerUpdate, ResourceDelta
from crihook.hooks.spec.views import ContainerKind, ContainerView, ResourcesView
from crihook.proxy.chain.merge import PendingUpdate
from crihook.proxy.core.updates import ContainerUpdater, _with_resources
from crihook.proxy.cri.outcome import Status
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.state.store import Store
from crihook.proxy.state.unsettled import UnsettledRuntime
from tests.unit.test_store import container, pod


class Runtime:
    """Answers UpdateContainerResources when `answer` is set; NOT_FOUND for `gone` ids."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.answer.set()
        self.gone: set[str] = set()
        self.sent: list[bytes] = []

    def call(self, path: str) -> Callable[..., Awaitable[bytes]]:
        async def update(
            request: bytes, timeout: float | None = None, metadata: object = None
        ) -> bytes:
            self.sent.append(request)
            await self.answer.wait()
            if any(cid.encode() in request for cid in self.gone):
                raise RuntimeCallFailed(Status(grpc.StatusCode.NOT_FOUND, "not found"))
            return b""

        return update


def pending(cid: str, seq: int) -> PendingUpdate:
    return PendingUpdate("20-cpuset", ContainerUpdate(cid, ResourceDelta(cpuset_cpus="0-3")), seq)


async def test_an_update_sent_after_the_removal_keeps_no_record(tmp_path: Path) -> None:
    runtime, store = Runtime(), Store(tmp_path)
    updater = ContainerUpdater(runtime, store)
    runtime.gone.add("c1")  # removed (and forgotten) before the update was sent
    updater.forget("c1")
    sent = await updater.send([pending("c1", 1)], {})
    assert [u.status.code for u in sent if u.status] == [grpc.StatusCode.NOT_FOUND]
    assert updater._targets == {}  # private: the leak is there
    assert updater.failures == 0  # nothing was left to update: not a failure


async def test_an_update_to_a_container_crihook_never_saw_removed_is_a_failure(
    tmp_path: Path,
) -> None:
    runtime, store = Runtime(), Store(tmp_path)
    updater = ContainerUpdater(runtime, store)
    runtime.gone.add("c9")  # a hook named an id nobody created
    await updater.send([pending("c9", 1)], {})
    assert updater.failures == 1


async def test_a_container_the_runtime_lost_while_crihook_has_it_is_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, store = Runtime(), Store(tmp_path)
    store.put_pod(pod("p1"))
    store.put_container(container("c1", "p1"))
    updater = ContainerUpdater(runtime, store)
    runtime.gone.add("c1")
    await updater.send([pending("c1", 1)], {})
    assert updater.failures == 1
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    errors = store.container("c1").update_errors  # type: ignore[union-attr]
    assert errors[-1]["code"] == "NOT_FOUND"


async def test_a_live_container_keeps_its_record_one_removed_meanwhile_does_not(
    tmp_path: Path,
) -> None:
    runtime, store = Runtime(), Store(tmp_path)
    store.put_pod(pod("p1"))
    store.put_container(container("c1", "p1"))
    store.put_container(container("c2", "p1"))
    updater = ContainerUpdater(runtime, store)
    runtime.answer.clear()
    sending = asyncio.create_task(updater.send([pending("c1", 1), pending("c2", 1)], {}))
    while len(runtime.sent) < 2:
        await asyncio.sleep(0)
    store.remove_container("c1")  # kubelet's RemoveContainer went through meanwhile
    updater.forget("c1")
    runtime.answer.set()
    sent = await sending
    assert sorted(u.container_id for u in sent) == ["c1", "c2"]
    # c2 is still there: its ordering record stays, so an older update cannot overwrite.
    assert list(updater._targets) == ["c2"]
    assert await updater.send([pending("c2", 0)], {}) == []


async def test_an_update_keeps_in_the_record_what_it_does_not_carry(tmp_path: Path) -> None:
    """The update carries the record's resources with the cpuset on top, but no hugepage
    limits: containerd keeps those (it adds what an update names per page size), and so must
    the record, or the numa hook reads the container as one without hugepages."""
    runtime, store = Runtime(), Store(tmp_path)
    store.put_pod(pod("p1"))
    store.put_container(container("c1", "p1"))
    updater = ContainerUpdater(runtime, store)
    await updater.send([pending("c1", 1)], {})
    record = store.container("c1")
    assert record is not None
    assert record.view.resources.cpuset_cpus == "0-3"
    assert dict(record.view.resources.hugepage_limits) == {"2MB": 1 << 21}


def test_an_applied_update_changes_the_records_resources_and_nothing_else() -> None:
    view = ContainerView(
        id="c1",
        pod_id="p1",
        name="app",
        attempt=2,
        image="img",
        labels={"l": "1"},
        annotations={"a": "2"},
        kind=ContainerKind.SIDECAR,
        resources=ResourcesView(cpuset_cpus="0-3"),
        cdi_devices=("vendor.com/x=y",),
    )
    blank = ContainerView(id="", pod_id="", name="")
    for f in dataclasses.fields(view):  # every field set: the copy must carry each
        assert getattr(view, f.name) != getattr(blank, f.name), f.name
    res = ResourcesView(cpuset_cpus="1")
    updated = _with_resources(view, res)  # private: the record's copy on each update
    assert updated == dataclasses.replace(view, resources=res)
    assert view.resources.cpuset_cpus == "0-3"  # the view it came from is left as it was


async def test_a_container_updater_marks_what_it_sends_by_the_id_it_knows(
    tmp_path: Path,
) -> None:
    runtime, store = Runtime(), Store(tmp_path)
    store.put_pod(pod("p"))
    store.put_container(container("c1", "p"))
    marked: list[str] = []
    unsettled = store.unsettled
    mark = unsettled.mark

    def noted(cid: str) -> None:
        marked.append(cid)
        mark(cid)

    unsettled.mark = noted  # type: ignore[method-assign]
    updater = ContainerUpdater(UnsettledRuntime(runtime, unsettled), store)
    await updater.send([pending("c1", 1)], {})
    assert marked == ["c1"]
    assert [
        api_pb2.UpdateContainerResourcesRequest.FromString(r).container_id for r in runtime.sent
    ] == ["c1"]
