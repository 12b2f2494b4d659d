"""The EventSpec table: one row per intercepted call, and nothing intercepted without one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Event, Hook, HookContext
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.cri.events import EVENTS, EventSpec
from crihook.proxy.state.store import Store
from crihook.proxy.wire.grpc import server as grpc_server
from crihook.proxy.wire.grpc.passthrough import Readiness
from crihook.proxy.wire.h2.server import H2Server

RUNTIME_SERVICE = api_pb2.DESCRIPTOR.services_by_name["RuntimeService"]
UPSR = Event.UPDATE_POD_SANDBOX_RESOURCES
UPSR_PATH = "/runtime.v1.RuntimeService/UpdatePodSandboxResources"
WITHOUT_UPSR = {event: spec for event, spec in EVENTS.items() if event is not UPSR}


def test_the_table_has_a_row_for_every_event_keyed_by_its_own_event() -> None:
    assert set(EVENTS) == set(Event)
    assert [spec.event for spec in EVENTS.values()] == list(EVENTS)


@pytest.mark.parametrize("event", list(Event), ids=lambda e: e.value)
def test_a_row_carries_the_types_and_path_of_its_cri_method(event: Event) -> None:
    spec = EVENTS[event]
    method = RUNTIME_SERVICE.methods_by_name[event.value]
    # The types come from the method's name: the CRI's own method must take and give them.
    assert spec.request.DESCRIPTOR.full_name == method.input_type.full_name
    assert spec.response.DESCRIPTOR.full_name == method.output_type.full_name
    assert spec.path == f"/runtime.v1.RuntimeService/{event.value}"


@pytest.mark.parametrize("event", list(Event), ids=lambda e: e.value)
def test_the_paths_of_a_row_lead_somewhere_in_its_request(event: Event) -> None:
    """A typo in a path would fail only on the call that walks it: walk every one here."""
    spec = EVENTS[event]
    request = spec.request()
    for where, holder, name in spec.checked:
        assert holder(request).DESCRIPTOR.fields_by_name[name].message_type is not None, where
    for part, _ in spec.secret_parts:
        part(request)
    if spec.resources is not None:
        spec.resources(request)
    if spec.annotations is not None:
        spec.annotations(request)
    if spec.labels is not None:
        spec.labels(request)


# --- an event missing from the table cannot be intercepted ---------------------------------


class Runtime:
    """What building the servers and the pipeline asks of a runtime client; keeps which
    methods it was asked to forward as bytes, and what the pipeline sent."""

    def __init__(self) -> None:
        self.forwarded: list[str] = []
        self.sent: list[str] = []
        self.flusher: Any = None
        self.takes = 0.0
        """Seconds each call takes to answer."""

    def call(self, path: str) -> Any:
        async def call(data: bytes, **options: Any) -> bytes:
            self.sent.append(path)
            await asyncio.sleep(self.takes)
            return b""

        return call

    def unary(self, path: str, image_service: bool) -> Any:
        self.forwarded.append(path)
        return self.call(path)

    def unary_stream(self, path: str, image_service: bool) -> Any:
        self.forwarded.append(path)
        return self.call(path)

    def stream_stream(self, path: str, image_service: bool) -> Any:
        self.forwarded.append(path)
        return self.call(path)

    def pool(self, image_service: bool) -> str:
        return "the runtime's pool"


class Resize(Hook):
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def pre_update_pod_sandbox_resources(self, ctx: HookContext) -> None:
        self.asked.append(ctx.pod.id)


def pipeline_with(tmp_path: Path, runtime: Runtime, hook: Hook, events: Any = EVENTS) -> Pipeline:
    store = Store(tmp_path)
    chain = Chain(ChainSettings(), store.hook_state)
    chain.set_builtin([Chain.entry(LocalHook("10-resize", hook), HookSettings(name="10-resize"))])
    readiness = Readiness()
    readiness.set(True)
    return Pipeline(runtime, chain, store, readiness, events=events)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("events", "intercepted"), [(EVENTS, True), (WITHOUT_UPSR, False)], ids=["all", "no-upsr"]
)
async def test_the_grpc_server_forwards_a_call_with_no_row(
    tmp_path: Path, events: dict[Event, EventSpec], intercepted: bool
) -> None:
    runtime = Runtime()
    pipeline = pipeline_with(tmp_path, runtime, Resize())
    server = grpc_server.build_server(
        runtime,  # type: ignore[arg-type]
        pipeline,
        Readiness(),
        events=events,
    )
    await server.stop(None)
    assert (UPSR_PATH in runtime.forwarded) is not intercepted
    assert [p for p in runtime.forwarded if p.endswith(("/StartContainer", "/RunPodSandbox"))] == []


@pytest.mark.parametrize(
    ("events", "intercepted"), [(EVENTS, True), (WITHOUT_UPSR, False)], ids=["all", "no-upsr"]
)
def test_the_h2_server_forwards_a_call_with_no_row(
    tmp_path: Path, events: dict[Event, EventSpec], intercepted: bool
) -> None:
    runtime = Runtime()
    pipeline = pipeline_with(tmp_path, runtime, Resize())
    server = H2Server(runtime, pipeline, Readiness(), events=events)  # type: ignore[arg-type]
    assert server.routes[UPSR_PATH] == (UPSR if intercepted else "the runtime's pool")
    assert (UPSR_PATH in server.labels) is not intercepted
    assert server.routes["/runtime.v1.RuntimeService/StartContainer"] is Event.START_CONTAINER


async def test_the_pipeline_refuses_a_call_with_no_row_before_any_hook(tmp_path: Path) -> None:
    raw = api_pb2.UpdatePodSandboxResourcesRequest(pod_sandbox_id="p1").SerializeToString()
    hook, runtime = Resize(), Runtime()
    pipeline = pipeline_with(tmp_path / "all", runtime, hook)
    runtime.takes = 0.05
    outcome = await pipeline.handle(UPSR, raw)
    assert outcome.status is None
    assert hook.asked == ["p1"]  # with its row, the hook is asked
    assert runtime.sent == [UPSR_PATH]
    assert outcome.runtime_elapsed is not None and outcome.runtime_elapsed >= 0.05

    hook, runtime = Resize(), Runtime()
    pipeline = pipeline_with(tmp_path / "no-upsr", runtime, hook, WITHOUT_UPSR)
    outcome = await pipeline.handle(UPSR, raw)
    assert outcome.status is not None
    assert outcome.status.code == grpc.StatusCode.INTERNAL
    assert outcome.status.details == "crihook: UpdatePodSandboxResources is not intercepted"
    assert outcome.status_origin == "crihook"
    assert outcome.runtime_elapsed is None  # it never reached the runtime
    assert hook.asked == []
    assert runtime.sent == []
