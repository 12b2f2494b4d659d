"""Updates to other containers after kubelet's answer (issue 27): the pipeline core in
process, with a hook that moves a shared container on every CreateContainer (as the cpuset
hook does when it hands out an exclusive CPU) and a runtime whose answers to those updates
the test holds back or fails.

What is asserted: the call that caused an update is answered before the update went out;
a container due several pools gets only the newest, in order; a later call on that container
waits for its update; a failing update holds no other pod's call and goes out again until the
newest applied; `before-answer` waits as before; a close with updates due sends or reports
them and leaves no task behind.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Adjustment, Event, Hook, HookContext, ResourceDelta
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.core import updates as updates_module
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.cri.outcome import Status
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.state.store import Store
from tests.lab.kubelet_encoding import burstable_pod, container_config, sandbox_config
from tests.unit.test_store import container, pod

SHARED = "shared-1"
PATIENCE = 30.0


class Runtime:
    """Answers the lifecycle calls; holds UpdateContainerResources while `gate` is clear (and
    StartContainer while `start_gate` is) and fails the next `fail` updates with UNAVAILABLE.
    Keeps every call it got, in order."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.start_gate = asyncio.Event()
        self.start_gate.set()
        self.updates_when_started: list[int] = []  # how many updates had come, per start
        self.fail = 0
        self.calls: list[tuple[str, Any]] = []
        self.answered = asyncio.Event()
        self._ids = itertools.count(1)

    def call(self, path: str) -> Any:
        method = path.rsplit("/", 1)[1]

        async def call(data: bytes, **options: Any) -> bytes:
            if method == "UpdateContainerResources":
                request = api_pb2.UpdateContainerResourcesRequest.FromString(data)
                self.calls.append((method, (request.container_id, request.linux.cpuset_cpus)))
                await self.gate.wait()
                if self.fail:
                    self.fail -= 1
                    raise RuntimeCallFailed(Status(grpc.StatusCode.UNAVAILABLE, "busy"))
                self.answered.set()
                return b""
            self.calls.append((method, None))
            if method == "StartContainer":
                await self.start_gate.wait()
                self.updates_when_started.append(len(self.updates()))
            if method == "CreateContainer":
                cid = f"new-{next(self._ids)}"
                return api_pb2.CreateContainerResponse(container_id=cid).SerializeToString()
            return b""

        return call

    def updates(self) -> list[tuple[str, str]]:
        return [args for method, args in self.calls if method == "UpdateContainerResources"]


class MoveShared(Hook):
    """Each CreateContainer moves the shared container to the next pool: "1", "2", ..."""

    def __init__(self) -> None:
        self.pools = itertools.count(1)

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().update_container(
            SHARED, ResourceDelta(cpuset_cpus=str(next(self.pools)))
        )


def node(tmp_path: Path, after_answer: bool = True) -> tuple[Pipeline, Runtime, Store]:
    store = Store(tmp_path)
    store.put_pod(pod("p-shared"))
    store.put_container(container(SHARED, "p-shared"))
    chain = Chain(ChainSettings(), store.hook_state)
    chain.set_builtin([Chain.entry(LocalHook("20-move", MoveShared()), HookSettings("20-move"))])
    readiness = Readiness()
    readiness.set(True)
    runtime = Runtime()
    return (
        Pipeline(runtime, chain, store, readiness, updates_after_answer=after_answer),
        runtime,
        store,
    )


def create(i: int) -> bytes:
    spec = burstable_pod(f"web-{i}")
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id=f"sandbox-{i}",
        config=container_config(spec, spec.containers[0], image_ref="busybox", node_memory=1 << 34),
        sandbox_config=sandbox_config(spec, log_root="/var/log/pods"),
    ).SerializeToString()


def on_shared(event: Event) -> bytes:
    request = {
        Event.STOP_CONTAINER: api_pb2.StopContainerRequest(container_id=SHARED, timeout=30),
        Event.START_CONTAINER: api_pb2.StartContainerRequest(container_id=SHARED),
        Event.REMOVE_CONTAINER: api_pb2.RemoveContainerRequest(container_id=SHARED),
        Event.UPDATE_CONTAINER_RESOURCES: api_pb2.UpdateContainerResourcesRequest(
            container_id=SHARED, linux=api_pb2.LinuxContainerResources(cpu_shares=512)
        ),
    }[event]
    return request.SerializeToString()


async def until(predicate: Any, what: str) -> None:
    async with asyncio.timeout(PATIENCE):
        while not predicate():
            await asyncio.sleep(0.001)


async def settled(pipeline: Pipeline) -> None:
    async with asyncio.timeout(PATIENCE):
        await pipeline.updater.settled(SHARED)


def cpuset(store: Store) -> str:
    record = store.container(SHARED)
    assert record is not None
    return record.view.resources.cpuset_cpus


async def test_the_call_is_answered_before_its_update_goes_out(tmp_path: Path) -> None:
    pipeline, runtime, store = node(tmp_path)
    told: list[Any] = []
    pipeline.on_outcome = told.append  # (what was issued is described for who listens)
    runtime.gate.clear()
    outcome = await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    assert told == [outcome]
    assert outcome.status is None
    assert outcome.response is not None
    # What the call issued, as it goes out (the record with the pool on top), not answered yet.
    assert [(u.container_id, u.changed, u.status) for u in outcome.updates] == [
        (SHARED, {"cpuset_cpus": "1"}, None)
    ]
    assert outcome.updates[0].resources["cpuset_cpus"] == "1"
    assert pipeline.updater.pending(SHARED)
    assert cpuset(store) == "2-3"  # the runtime did not apply it yet
    runtime.gate.set()
    await settled(pipeline)
    assert runtime.updates() == [(SHARED, "1")]
    assert cpuset(store) == "1"
    assert not pipeline.updater.pending(SHARED)
    assert sum(pipeline.updater.window.counts) == 1  # the window was measured


async def test_a_container_due_several_pools_gets_only_the_newest_in_order(tmp_path: Path) -> None:
    pipeline, runtime, store = node(tmp_path)
    runtime.gate.clear()
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await until(lambda: runtime.updates(), "the first update on its way")
    for i in (2, 3, 4):  # due while the first is on its way
        await pipeline.handle(Event.CREATE_CONTAINER, create(i))
    runtime.gate.set()
    await settled(pipeline)
    # "1" was on its way; "2" and "3" were overtaken before they went out and never sent.
    assert runtime.updates() == [(SHARED, "1"), (SHARED, "4")]
    assert cpuset(store) == "4"


@pytest.mark.parametrize(
    "event",
    [
        Event.UPDATE_CONTAINER_RESOURCES,
        Event.STOP_CONTAINER,
        Event.START_CONTAINER,
        Event.REMOVE_CONTAINER,
    ],
    ids=lambda e: e.value,
)
async def test_a_later_call_on_the_container_waits_for_its_update(
    tmp_path: Path, event: Event
) -> None:
    pipeline, runtime, _ = node(tmp_path)
    runtime.gate.clear()
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await until(lambda: runtime.updates(), "the update on its way")
    later = asyncio.create_task(pipeline.handle(event, on_shared(event)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not later.done()
    crihooks = ("UpdateContainerResources", (SHARED, "1"))
    assert runtime.calls == [("CreateContainer", None), crihooks]  # held back: not forwarded
    runtime.gate.set()
    async with asyncio.timeout(PATIENCE):
        outcome = await later
    assert outcome.status is None
    kubelets = runtime.calls[-1]
    assert kubelets[0] == event.value
    assert runtime.calls == [("CreateContainer", None), crihooks, kubelets]


async def test_a_failing_update_holds_no_other_call_and_the_newest_goes_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(updates_module, "RETRY_FIRST_SECONDS", 0.01)
    pipeline, runtime, store = node(tmp_path)
    runtime.fail = 3
    runtime.gate.clear()
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await until(lambda: runtime.updates(), "the update on its way")
    # Other pods' calls go through while the update hangs and then fails.
    for i in (2, 3):
        outcome = await pipeline.handle(Event.CREATE_CONTAINER, create(i))
        assert outcome.status is None
    runtime.gate.set()
    await until(lambda: runtime.answered.is_set(), "an update applied")
    await settled(pipeline)
    assert pipeline.updater.failures == 3
    sent = runtime.updates()
    assert sent[-1] == (SHARED, "3")  # what was applied in the end is the newest pool
    assert (SHARED, "2") not in sent  # overtaken while "1" failed: never sent
    assert cpuset(store) == "3"
    record = store.container(SHARED)
    assert record is not None
    failed = [(e["code"], e["resources"]["cpuset_cpus"]) for e in record.update_errors[1:]]
    # The retries carry the newest pool due ("3"), not the one that failed first.
    assert failed == [("UNAVAILABLE", "1"), ("UNAVAILABLE", "3"), ("UNAVAILABLE", "3")]


async def test_a_call_after_a_kubelet_update_is_not_undone_by_an_older_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubelet's own UpdateContainerResources of the container, applied after an update
    that failed: the retry must not put back what kubelet's call replaced."""
    monkeypatch.setattr(updates_module, "RETRY_FIRST_SECONDS", 0.05)
    pipeline, runtime, store = node(tmp_path)
    runtime.fail = 1
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await settled(pipeline)  # tried once: failed, due again later
    assert pipeline.updater.failures == 1
    update = api_pb2.UpdateContainerResourcesRequest(
        container_id=SHARED, linux=api_pb2.LinuxContainerResources(cpuset_cpus="7")
    )
    outcome = await pipeline.handle(Event.UPDATE_CONTAINER_RESOURCES, update.SerializeToString())
    assert outcome.status is None
    await asyncio.sleep(0.2)  # past the retry's time: nothing may go out
    assert runtime.updates() == [(SHARED, "1"), (SHARED, "7")]  # crihook's, then kubelet's
    assert cpuset(store) == "7"


async def test_before_answer_keeps_the_call_waiting_for_its_update(tmp_path: Path) -> None:
    pipeline, runtime, store = node(tmp_path, after_answer=False)
    runtime.gate.clear()
    call = asyncio.create_task(pipeline.handle(Event.CREATE_CONTAINER, create(1)))
    await until(lambda: runtime.updates(), "the update on its way")
    for _ in range(20):
        await asyncio.sleep(0)
    assert not call.done()  # kubelet has no answer while the update waits
    runtime.gate.set()
    async with asyncio.timeout(PATIENCE):
        outcome = await call
    assert [(u.container_id, u.changed, u.status) for u in outcome.updates] == [
        (SHARED, {"cpuset_cpus": "1"}, None)
    ]
    assert cpuset(store) == "1"


async def test_a_close_sends_what_is_due(tmp_path: Path) -> None:
    pipeline, runtime, store = node(tmp_path)
    runtime.gate.clear()
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await until(lambda: runtime.updates(), "the update on its way")
    runtime.gate.set()
    assert await pipeline.updater.close(PATIENCE) == 0
    assert cpuset(store) == "1"
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("crihook-updates")]


async def test_a_close_with_a_runtime_that_does_not_answer_stops_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline, runtime, store = node(tmp_path)
    runtime.gate.clear()  # never answers
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await until(lambda: runtime.updates(), "the update on its way")
    waiting = asyncio.create_task(pipeline.updater.settled(SHARED))
    assert await pipeline.updater.close(0.05) == 1
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("crihook-updates")]
    async with asyncio.timeout(PATIENCE):
        await waiting  # nobody is left waiting on a closed updater
    assert "stopping with updates to 1 container(s) not sent" in caplog.text
    assert cpuset(store) == "2-3"


async def test_a_call_waiting_for_an_update_in_backoff_has_it_sent_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(updates_module, "RETRY_FIRST_SECONDS", 3600.0)  # a backoff never ending
    pipeline, runtime, store = node(tmp_path)
    runtime.fail = 1
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))
    await settled(pipeline)  # failed: sent again in an hour
    await pipeline.handle(Event.CREATE_CONTAINER, create(2))  # due too, behind the backoff
    async with asyncio.timeout(PATIENCE):
        outcome = await pipeline.handle(Event.STOP_CONTAINER, on_shared(Event.STOP_CONTAINER))
    assert outcome.status is None
    assert runtime.updates() == [(SHARED, "1"), (SHARED, "2")]
    assert [m for m, _ in runtime.calls][-1] == "StopContainer"
    assert cpuset(store) == "2"


async def test_an_update_waits_for_the_start_of_its_container_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update that lands while the runtime makes the container's task reaches the stored
    spec only (a real kubelet's pod kept the old cpuset): it goes out once the start
    answered."""
    monkeypatch.setattr(updates_module, "CALLS_FIRST_SECONDS", 0.0)  # no turn for calls
    pipeline, runtime, store = node(tmp_path)
    runtime.start_gate.clear()
    start = asyncio.create_task(
        pipeline.handle(Event.START_CONTAINER, on_shared(Event.START_CONTAINER))
    )
    await until(lambda: ("StartContainer", None) in runtime.calls, "the start on its way")
    await pipeline.handle(Event.CREATE_CONTAINER, create(1))  # another pod: not held
    for _ in range(200):  # without the wait the update goes out within a few turns
        await asyncio.sleep(0)
    assert runtime.updates() == []
    assert pipeline.updater.pending(SHARED)
    runtime.start_gate.set()
    await start
    await settled(pipeline)
    assert runtime.updates_when_started == [0]
    assert runtime.updates() == [(SHARED, "1")]
    assert cpuset(store) == "1"
