"""What the pipeline core keeps in the store for a CreateContainer, in process with a stub
runtime: the container's view as the runtime got it, whether hooks changed the request or
not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.examples.annotate import AnnotateHook
from crihook.hooks.spec import Adjustment, Event, Hook, HookContext
from crihook.hooks.spec.views import container_view_from_config, pod_view_from_config
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.core.sync import netns_from_verbose_info
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.state.store import Store
from tests.lab.kubelet_encoding import burstable_pod, container_config, sandbox_config

CONTAINER_ID = "c" * 64


class StubRuntime:
    """Answers CreateContainer with a fixed id and keeps what it was sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def call(self, path: str) -> Any:
        async def call(data: bytes, **options: Any) -> bytes:
            self.sent.append(data)
            return api_pb2.CreateContainerResponse(container_id=CONTAINER_ID).SerializeToString()

        return call


class PinAndLabel(Hook):
    """Changes resources and a label (the annotate example changes an annotation)."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().set_cpuset_cpus("2-3").set_cpu_shares(4096).set_label("pinned", "1")


HOOKS: dict[str, list[Hook]] = {
    "no-hooks": [],
    "annotation": [AnnotateHook({"key": "example.com/k", "value": "v"})],
    "resources-and-label": [PinAndLabel()],
    "all-three-kinds": [AnnotateHook({"key": "example.com/k", "value": "v"}), PinAndLabel()],
}


def create_request() -> api_pb2.CreateContainerRequest:
    pod = burstable_pod("web")
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id="sandbox-1",
        config=container_config(pod, pod.containers[0], image_ref="busybox", node_memory=1 << 34),
        sandbox_config=sandbox_config(pod, log_root="/var/log/pods"),
    )


@pytest.mark.parametrize("hooks", list(HOOKS))
async def test_the_stored_view_is_the_view_of_what_the_runtime_got(
    tmp_path: Path, hooks: str
) -> None:
    store = Store(tmp_path)
    chain = Chain(ChainSettings(), store.hook_state)
    names = [f"{10 * (i + 1)}-h{i}" for i in range(len(HOOKS[hooks]))]
    chain.set_builtin(
        [
            Chain.entry(LocalHook(name, hook), HookSettings(name=name))
            for name, hook in zip(names, HOOKS[hooks], strict=True)
        ]
    )
    readiness = Readiness()
    readiness.set(True)
    runtime = StubRuntime()
    pipeline = Pipeline(runtime, chain, store, readiness)
    raw = create_request().SerializeToString()

    outcome = await pipeline.handle(Event.CREATE_CONTAINER, raw)

    assert outcome.status is None
    assert outcome.response is not None
    assert api_pb2.CreateContainerResponse.FromString(outcome.response).container_id == CONTAINER_ID
    assert (outcome.forwarded is raw) is (hooks == "no-hooks")
    got = api_pb2.CreateContainerRequest.FromString(runtime.sent[0])
    assert (runtime.sent[0] == raw) is (hooks == "no-hooks")  # unchanged: kubelet's bytes
    pod = pod_view_from_config(got.pod_sandbox_id, got.sandbox_config)
    pod_record = store.pod(got.pod_sandbox_id)  # a pod crihook had not seen: kept from here
    assert pod_record is not None and pod_record.view == pod
    record = store.container(CONTAINER_ID)
    assert record is not None
    assert record.view == container_view_from_config(CONTAINER_ID, pod, got.config)
    assert ("example.com/k" in record.view.annotations) is ("annotation" in hooks or "all" in hooks)
    assert (record.view.resources.cpuset_cpus == "2-3") is ("resources" in hooks or "all" in hooks)


PARTIAL_UPDATES = [
    pytest.param(api_pb2.LinuxContainerResources(cpuset_cpus="1"), "1", id="static-cpu-manager"),
    pytest.param(api_pb2.LinuxContainerResources(cpu_shares=4), "", id="crictl-update-cpu-share"),
]


@pytest.mark.parametrize(("linux", "cpuset"), PARTIAL_UPDATES)
async def test_a_partial_update_changes_in_the_record_only_what_it_carries(
    tmp_path: Path, linux: api_pb2.LinuxContainerResources, cpuset: str
) -> None:
    """kubelet's static CPU manager sends only a cpuset, crictl update only its flags: the
    rest reads 0, which containerd leaves as it was. So must the store, or a restart finds
    every such container running "with other resources than recorded" (and hooks read a
    Guaranteed container as one without memory)."""
    store = Store(tmp_path)
    readiness = Readiness()
    readiness.set(True)
    pipeline = Pipeline(StubRuntime(), Chain(ChainSettings(), store.hook_state), store, readiness)
    created = create_request()
    await pipeline.handle(Event.CREATE_CONTAINER, created.SerializeToString())
    record = store.container(CONTAINER_ID)
    assert record is not None
    before = record.view.resources
    assert before.memory_limit_bytes and before.cpu_shares and before.oom_score_adj

    update = api_pb2.UpdateContainerResourcesRequest(container_id=CONTAINER_ID, linux=linux)
    outcome = await pipeline.handle(Event.UPDATE_CONTAINER_RESOURCES, update.SerializeToString())

    assert outcome.status is None
    after = store.container(CONTAINER_ID)
    assert after is not None
    assert after.view.resources.memory_limit_bytes == before.memory_limit_bytes
    assert after.view.resources.oom_score_adj == before.oom_score_adj
    assert after.view.resources.cpu_quota == before.cpu_quota
    assert after.view.resources.cpu_shares == (linux.cpu_shares or before.cpu_shares)
    assert after.view.resources.cpuset_cpus == cpuset


# --- the network namespace of a sandbox ------------------------------------------------------

_SPEC = {
    "linux": {
        "namespaces": [
            {"type": "pid"},
            {"type": "network", "path": "/var/run/netns/cni-1234"},
        ]
    }
}


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"info": json.dumps({"runtimeSpec": _SPEC})}, "/var/run/netns/cni-1234"),
        (
            {"info": json.dumps({"runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}})},
            None,
        ),
        (
            {"info": json.dumps({"runtimeSpec": {"linux": {"namespaces": [{"type": "network"}]}}})},
            None,
        ),
        ({"info": "not json"}, None),
        ({}, None),
    ],
    ids=["pod-network", "host-network", "no-path", "garbage", "no-info"],
)
def test_netns_from_containerds_verbose_status(info: dict[str, str], expected: str | None) -> None:
    assert netns_from_verbose_info(info) == expected


class LabelThenLook(Hook):
    """Labels the container at pre, and notes at post what the request it is shown carries."""

    def __init__(self) -> None:
        self.seen_at_post: dict[str, str] | None = None

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().set_label("pinned", "1")

    async def post_create_container(self, ctx: HookContext) -> None:
        self.seen_at_post = dict(ctx.peek_request().config.labels)  # type: ignore[attr-defined]


async def test_under_a_global_dry_run_the_post_stage_sees_what_the_runtime_got(
    tmp_path: Path,
) -> None:
    """The pre stage of a global dry-run adjusts a copy; the post stage, which shares the
    call's ChainCall with it, is shown kubelet's request again, as the runtime got it."""
    store = Store(tmp_path)
    chain = Chain(ChainSettings(dry_run=True), store.hook_state)
    hook = LabelThenLook()
    chain.set_builtin([Chain.entry(LocalHook("10-label", hook), HookSettings(name="10-label"))])
    readiness = Readiness()
    readiness.set(True)
    runtime = StubRuntime()
    raw = create_request().SerializeToString()

    outcome = await Pipeline(runtime, chain, store, readiness).handle(Event.CREATE_CONTAINER, raw)

    assert outcome.status is None
    assert runtime.sent == [raw]  # dry-run: kubelet's bytes
    assert hook.seen_at_post is not None
    assert hook.seen_at_post == dict(api_pb2.CreateContainerRequest.FromString(raw).config.labels)
    assert "pinned" not in hook.seen_at_post
