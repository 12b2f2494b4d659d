"""check_request and check_wire: what crihook refuses before a hook or the store sees it."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Event
from crihook.proxy.core.validate import check_request, check_resources, check_wire
from crihook.proxy.cri.events import INTERCEPTED
from crihook.proxy.cri.requests import MAX_KEPT_BYTES


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag(number, 2) + varint(len(payload)) + payload


POD_META = api_pb2.PodSandboxMetadata(name="web", namespace="shop", uid="uid-1", attempt=0)
SANDBOX = api_pb2.PodSandboxConfig(metadata=POD_META)
CONTAINER = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app"))

GOOD: dict[Event, Message] = {
    Event.RUN_POD_SANDBOX: api_pb2.RunPodSandboxRequest(config=SANDBOX, runtime_handler="runc"),
    Event.CREATE_CONTAINER: api_pb2.CreateContainerRequest(
        pod_sandbox_id="sb1", config=CONTAINER, sandbox_config=SANDBOX
    ),
    Event.START_CONTAINER: api_pb2.StartContainerRequest(container_id="c1"),
    Event.UPDATE_CONTAINER_RESOURCES: api_pb2.UpdateContainerResourcesRequest(
        container_id="c1", linux=api_pb2.LinuxContainerResources(cpu_shares=2)
    ),
    Event.STOP_CONTAINER: api_pb2.StopContainerRequest(container_id="c1", timeout=30),
    Event.REMOVE_CONTAINER: api_pb2.RemoveContainerRequest(container_id="c1"),
    Event.STOP_POD_SANDBOX: api_pb2.StopPodSandboxRequest(pod_sandbox_id="sb1"),
    Event.REMOVE_POD_SANDBOX: api_pb2.RemovePodSandboxRequest(pod_sandbox_id="sb1"),
    Event.UPDATE_POD_SANDBOX_RESOURCES: api_pb2.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id="sb1", resources=api_pb2.LinuxContainerResources(cpu_shares=2048)
    ),
}


def test_the_table_covers_every_intercepted_event() -> None:
    assert set(GOOD) == set(INTERCEPTED) == set(Event)


@pytest.mark.parametrize("event", list(GOOD), ids=lambda e: e.value)
def test_a_complete_request_passes_both_checks(event: Event) -> None:
    request = GOOD[event]
    assert type(request) is INTERCEPTED[event].request
    assert check_request(event, request) is None
    assert check_wire(event, request.SerializeToString()) is None


@pytest.mark.parametrize("event", list(GOOD), ids=lambda e: e.value)
def test_fields_of_a_newer_kubelet_pass(event: Event) -> None:
    raw = GOOD[event].SerializeToString() + field(90, b"new") + tag(91, 0) + varint(7)
    assert check_wire(event, raw) is None


def _run(config: api_pb2.PodSandboxConfig | None) -> api_pb2.RunPodSandboxRequest:
    return api_pb2.RunPodSandboxRequest(config=config)


def _create(**kw: object) -> api_pb2.CreateContainerRequest:
    parts: dict[str, object] = {
        "pod_sandbox_id": "sb1",
        "config": CONTAINER,
        "sandbox_config": SANDBOX,
    }
    parts.update(kw)
    request = api_pb2.CreateContainerRequest(
        **{k: v for k, v in parts.items() if v is not None}  # type: ignore[arg-type]
    )
    return request


@pytest.mark.parametrize(
    ("event", "request_", "problem"),
    [
        (
            Event.RUN_POD_SANDBOX,
            api_pb2.RunPodSandboxRequest(runtime_handler="runc"),
            "RunPodSandboxRequest has no config",
        ),
        (
            Event.RUN_POD_SANDBOX,
            _run(api_pb2.PodSandboxConfig(hostname="h")),
            "RunPodSandboxRequest has no config.metadata",
        ),
        (
            Event.RUN_POD_SANDBOX,
            _run(api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(name="web"))),
            "RunPodSandboxRequest config.metadata.uid is empty",
        ),
        (
            Event.CREATE_CONTAINER,
            _create(pod_sandbox_id=None),
            "CreateContainerRequest pod_sandbox_id is empty",
        ),
        (Event.CREATE_CONTAINER, _create(config=None), "CreateContainerRequest has no config"),
        (
            Event.CREATE_CONTAINER,
            _create(config=api_pb2.ContainerConfig(image=api_pb2.ImageSpec(image="busybox"))),
            "CreateContainerRequest has no config.metadata",
        ),
        (
            Event.CREATE_CONTAINER,
            _create(sandbox_config=None),
            "CreateContainerRequest has no sandbox_config",
        ),
        (
            Event.CREATE_CONTAINER,
            _create(sandbox_config=api_pb2.PodSandboxConfig(hostname="h")),
            "CreateContainerRequest has no sandbox_config.metadata",
        ),
        (
            Event.START_CONTAINER,
            api_pb2.StartContainerRequest(),
            "StartContainerRequest container_id is empty",
        ),
        (
            Event.UPDATE_CONTAINER_RESOURCES,
            api_pb2.UpdateContainerResourcesRequest(linux=api_pb2.LinuxContainerResources()),
            "UpdateContainerResourcesRequest container_id is empty",
        ),
        (
            Event.STOP_CONTAINER,
            api_pb2.StopContainerRequest(timeout=10),
            "StopContainerRequest container_id is empty",
        ),
        (
            Event.REMOVE_CONTAINER,
            api_pb2.RemoveContainerRequest(),
            "RemoveContainerRequest container_id is empty",
        ),
        (
            Event.STOP_POD_SANDBOX,
            api_pb2.StopPodSandboxRequest(),
            "StopPodSandboxRequest pod_sandbox_id is empty",
        ),
        (
            Event.REMOVE_POD_SANDBOX,
            api_pb2.RemovePodSandboxRequest(),
            "RemovePodSandboxRequest pod_sandbox_id is empty",
        ),
        (
            Event.UPDATE_POD_SANDBOX_RESOURCES,
            api_pb2.UpdatePodSandboxResourcesRequest(),
            "UpdatePodSandboxResourcesRequest pod_sandbox_id is empty",
        ),
    ],
    ids=[
        "run-no-config",
        "run-no-metadata",
        "run-no-uid",
        "create-no-sandbox-id",
        "create-no-config",
        "create-no-container-metadata",
        "create-no-sandbox-config",
        "create-no-sandbox-metadata",
        "start-no-id",
        "update-no-id",
        "stop-no-id",
        "remove-no-id",
        "stop-pod-no-id",
        "remove-pod-no-id",
        "resize-pod-no-id",
    ],
)
def test_an_incomplete_request_is_refused_naming_the_part(
    event: Event, request_: Message, problem: str
) -> None:
    assert check_request(event, request_) == problem
    # The bytes themselves are fine: only what they carry is not.
    assert check_wire(event, request_.SerializeToString()) is None


@pytest.mark.parametrize(
    "request_",
    [
        api_pb2.CreateContainerRequest(
            pod_sandbox_id="sb1",
            config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata()),
            sandbox_config=api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata()),
        ),
        api_pb2.RunPodSandboxRequest(
            config=api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(uid="u"))
        ),
    ],
    ids=["create-empty-names", "run-only-a-uid"],
)
def test_names_and_namespaces_are_not_required_as_containerd_does_not(request_: Message) -> None:
    event = Event(type(request_).__name__.removesuffix("Request"))
    assert check_request(event, request_) is None


FIXED32 = tag(1, 5) + b"\x01\x02\x03\x04"


@pytest.mark.parametrize(
    ("event", "raw", "problem"),
    [
        (
            Event.RUN_POD_SANDBOX,
            FIXED32 + field(2, b"runc"),
            "RunPodSandboxRequest field 1 (config) has wire type 5, expected 2 (length-delimited)",
        ),
        (
            Event.RUN_POD_SANDBOX,
            field(1, SANDBOX.SerializeToString()) + tag(2, 0) + varint(1),
            "RunPodSandboxRequest field 2 (runtime_handler) has wire type 0, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.CREATE_CONTAINER,
            FIXED32
            + field(2, CONTAINER.SerializeToString())
            + field(3, SANDBOX.SerializeToString()),
            "CreateContainerRequest field 1 (pod_sandbox_id) has wire type 5, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.CREATE_CONTAINER,
            field(1, b"sb1") + tag(2, 1) + b"\x00" * 8,
            "CreateContainerRequest field 2 (config) has wire type 1, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.START_CONTAINER,
            tag(1, 0) + varint(12345),
            "StartContainerRequest field 1 (container_id) has wire type 0, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.STOP_CONTAINER,
            field(1, b"c1") + field(2, b"30"),
            "StopContainerRequest field 2 (timeout) has wire type 2, expected 0 (varint)",
        ),
        (
            Event.UPDATE_CONTAINER_RESOURCES,
            field(1, b"c1") + tag(4, 5) + b"\x00" * 4,
            "UpdateContainerResourcesRequest field 4 (annotations) has wire type 5, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.REMOVE_CONTAINER,
            tag(1, 3) + tag(1, 4),
            "RemoveContainerRequest field 1 (container_id) has wire type 3, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.STOP_POD_SANDBOX,
            tag(1, 1) + b"\x00" * 8,
            "StopPodSandboxRequest field 1 (pod_sandbox_id) has wire type 1, expected 2 "
            "(length-delimited)",
        ),
        (
            Event.REMOVE_POD_SANDBOX,
            field(1, b"sb1") + FIXED32,  # the right one, then a wrong one
            "RemovePodSandboxRequest field 1 (pod_sandbox_id) has wire type 5, expected 2 "
            "(length-delimited)",
        ),
    ],
    ids=[
        "run-config-fixed32",
        "run-handler-varint",
        "create-sandbox-id-fixed32",
        "create-config-fixed64",
        "start-id-varint",
        "stop-timeout-bytes",
        "update-annotations-fixed32",
        "remove-id-group",
        "stop-pod-id-fixed64",
        "remove-pod-id-twice",
    ],
)
def test_a_known_field_with_the_wrong_wire_type_is_refused(
    event: Event, raw: bytes, problem: str
) -> None:
    assert check_wire(event, raw) == problem


def test_protobuf_itself_accepts_the_wrong_wire_type_and_loses_the_field() -> None:
    """Why check_wire exists: the decode succeeds and the field reads as absent."""
    request = api_pb2.RunPodSandboxRequest.FromString(FIXED32 + field(2, b"runc"))
    assert not request.HasField("config")
    assert request.runtime_handler == "runc"
    assert check_request(Event.RUN_POD_SANDBOX, request) == "RunPodSandboxRequest has no config"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"\x0a\x05ab", "field 1 runs past the end (7 > 4 bytes)"),
        (b"\x0a", "truncated or overlong varint at byte 1"),
        (b"\x80", "truncated or overlong varint at byte 1"),
        (b"\xff" * 11, "truncated or overlong varint at byte 10"),
        (tag(9, 7), "wire type 7 of field 9 at byte 1"),
        (b"\x00\x00", "field number 0 at byte 0"),
        (tag(9, 3) + field(1, b"x"), "truncated or overlong varint at byte 4"),
        (tag(9, 3) + tag(8, 4), "group 9 ended as 8"),
        (tag(9, 4), "wire type 4 of field 9 at byte 1"),
        (tag(9, 6), "wire type 6 of field 9 at byte 1"),
        (tag(9, 3) * 101 + tag(9, 4) * 101, "groups nested too deep"),
    ],
    ids=[
        "length-past-end",
        "truncated-tag-value",
        "truncated-varint",
        "overlong-varint",
        "field-zero-wire-7",
        "field-zero",
        "unterminated-group",
        "mismatched-group-end",
        "stray-group-end",
        "wire-type-6",
        "deep-groups",
    ],
)
def test_bytes_that_are_no_message_are_refused(raw: bytes, problem: str) -> None:
    answer = check_wire(Event.START_CONTAINER, raw)
    assert answer is not None
    assert answer.startswith("StartContainerRequest is not a valid protobuf message: ")
    assert problem in answer


def test_an_unknown_group_is_skipped_whole() -> None:
    raw = field(1, b"c1") + tag(9, 3) + tag(10, 3) + tag(1, 5) + b"\0" * 4 + tag(10, 4) + tag(9, 4)
    # field 1 inside the group is the group's, not the request's container_id
    assert check_wire(Event.START_CONTAINER, raw) is None
    assert check_wire(Event.START_CONTAINER, b"") is None


# --- check_resources: what the kernel and runc accept ----------------------------------------

R = api_pb2.LinuxContainerResources
KUBELET = R(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512, memory_limit_in_bytes=1 << 30,
            oom_score_adj=999, cpuset_cpus="0-3", cpuset_mems="0",
            hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=0)])  # fmt: skip


class Case(NamedTuple):
    resources: api_pb2.LinuxContainerResources
    problem: str | None


def _with(**fields: object) -> api_pb2.LinuxContainerResources:
    resources = R()
    resources.CopyFrom(KUBELET)
    for name, value in fields.items():
        if name == "hugepage_limits":
            del resources.hugepage_limits[:]
            resources.hugepage_limits.extend(value)  # type: ignore[arg-type]
        else:
            setattr(resources, name, value)
    return resources


PAGE = api_pb2.HugepageLimit
RESOURCE_CASES = {
    "kubelet's": Case(KUBELET, None),
    "all unset": Case(R(), None),
    "period 1 ms": Case(_with(cpu_period=1_000), None),
    "period 1 s": Case(_with(cpu_period=1_000_000), None),
    "period negative": Case(_with(cpu_period=-100_000), "cpu_period = -100000: the kernel takes a "
                            "CFS period of 1000 to 1000000 µs"),
    "period under 1 ms": Case(_with(cpu_period=999), "cpu_period = 999"),
    "period over 1 s": Case(_with(cpu_period=1_000_001), "cpu_period = 1000001"),
    "quota -1": Case(_with(cpu_quota=-1), None),
    "quota other negative": Case(_with(cpu_quota=-5), None),  # the kernel's RUNTIME_INF too
    "quota 1 ms": Case(_with(cpu_quota=1_000), None),
    "quota under 1 ms": Case(_with(cpu_quota=999), "cpu_quota = 999: the kernel takes a CFS "
                             "quota of 1000 to 17592186044415 µs, or -1 for no limit"),
    "quota at the kernel's maximum": Case(_with(cpu_quota=(1 << 44) - 1), None),
    "quota over it": Case(_with(cpu_quota=1 << 44), "cpu_quota = 17592186044416"),
    "shares 2": Case(_with(cpu_shares=2), None),
    "shares 262144": Case(_with(cpu_shares=262_144), None),
    "shares 1": Case(_with(cpu_shares=1), "cpu_shares = 1: cpu shares are 2 to 262144"),
    "shares negative": Case(_with(cpu_shares=-2), "cpu_shares = -2"),
    "shares over 262144": Case(_with(cpu_shares=262_145), "cpu_shares = 262145"),
    "memory unlimited": Case(_with(memory_limit_in_bytes=-1), None),
    "memory negative": Case(_with(memory_limit_in_bytes=-(1 << 30)),
                            "memory_limit_in_bytes = -1073741824: a memory limit is a number of "
                            "bytes, or -1 for no limit"),
    "swap unlimited": Case(_with(memory_swap_limit_in_bytes=-1), None),
    "swap equal to memory": Case(_with(memory_swap_limit_in_bytes=1 << 30), None),
    "swap negative": Case(_with(memory_swap_limit_in_bytes=-7), "memory_swap_limit_in_bytes = -7"),
    "swap below memory": Case(_with(memory_swap_limit_in_bytes=1 << 20),
                              "memory_swap_limit_in_bytes = 1048576: memory+swap must be at "
                              "least the memory limit (1073741824)"),
    "swap without memory": Case(_with(memory_limit_in_bytes=0, memory_swap_limit_in_bytes=1 << 30),
                                "a swap limit needs a memory limit"),
    "oom -1000": Case(_with(oom_score_adj=-1000), None),
    "oom 1000": Case(_with(oom_score_adj=1000), None),
    "oom 2^40": Case(_with(oom_score_adj=1 << 40), "oom_score_adj = 1099511627776: the kernel "
                     "takes -1000 to 1000"),
    "oom -1001": Case(_with(oom_score_adj=-1001), "oom_score_adj = -1001"),
    "cpuset garbage": Case(_with(cpuset_cpus="0-3,x"), "cpuset_cpus = '0-3,x': malformed cpu list"),
    "cpuset descending": Case(_with(cpuset_cpus="3-0"), "cpuset_cpus = '3-0'"),
    "mems garbage": Case(_with(cpuset_mems="0;1"), "cpuset_mems = '0;1'"),
    "page size kubelet's 1GB": Case(_with(hugepage_limits=[PAGE(page_size="1GB", limit=1 << 30)]),
                                    None),
    "page size as a quantity": Case(_with(hugepage_limits=[PAGE(page_size="2Mi", limit=1)]),
                                    "hugepage_limits page_size = '2Mi': a page size as runc names"),
    "page size the node lacks": Case(_with(hugepage_limits=[PAGE(page_size="16KB", limit=1)]),
                                     "hugepage_limits page_size = '16KB': this node has 2MB, 1GB"),
}  # fmt: skip
NODE_PAGES = frozenset({"2MB", "1GB"})


@pytest.mark.parametrize(
    ("resources", "problem"), RESOURCE_CASES.values(), ids=list(RESOURCE_CASES)
)
def test_resources_the_kernel_or_runc_refuse_are_named_with_their_value(
    resources: api_pb2.LinuxContainerResources, problem: str | None
) -> None:
    request = api_pb2.UpdateContainerResourcesRequest(container_id="c1", linux=resources)
    said = check_resources(Event.UPDATE_CONTAINER_RESOURCES, request, NODE_PAGES)
    if problem is None:
        assert said is None
    else:
        assert said is not None and said.startswith("UpdateContainerResourcesRequest linux.")
        assert problem in said


def test_without_the_nodes_page_sizes_any_well_formed_one_passes() -> None:
    resources = _with(hugepage_limits=[PAGE(page_size="16KB", limit=1)])
    request = api_pb2.UpdateContainerResourcesRequest(container_id="c1", linux=resources)
    assert check_resources(Event.UPDATE_CONTAINER_RESOURCES, request) is None


BAD = R(cpu_period=-100_000)


@pytest.mark.parametrize(
    ("event", "request_", "where"),
    [
        (Event.CREATE_CONTAINER, api_pb2.CreateContainerRequest(
            pod_sandbox_id="sb1", config=api_pb2.ContainerConfig(
                metadata=CONTAINER.metadata, linux=api_pb2.LinuxContainerConfig(resources=BAD)),
            sandbox_config=SANDBOX), "config.linux.resources.cpu_period"),
        (Event.CREATE_CONTAINER, api_pb2.CreateContainerRequest(
            pod_sandbox_id="sb1", config=CONTAINER, sandbox_config=api_pb2.PodSandboxConfig(
                metadata=POD_META, linux=api_pb2.LinuxPodSandboxConfig(overhead=BAD))),
         "sandbox_config.linux.overhead.cpu_period"),
        (Event.RUN_POD_SANDBOX, api_pb2.RunPodSandboxRequest(config=api_pb2.PodSandboxConfig(
            metadata=POD_META, linux=api_pb2.LinuxPodSandboxConfig(resources=BAD))),
         "config.linux.resources.cpu_period"),
        (Event.UPDATE_POD_SANDBOX_RESOURCES, api_pb2.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id="sb1", resources=BAD), "resources.cpu_period"),
        (Event.UPDATE_POD_SANDBOX_RESOURCES, api_pb2.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id="sb1", overhead=BAD), "overhead.cpu_period"),
    ],
    ids=["create-container", "create-sandbox-overhead", "run-pod-sandbox",
         "update-pod-resources", "update-pod-overhead"],
)  # fmt: skip
def test_every_resources_of_a_call_is_checked(event: Event, request_: Message, where: str) -> None:
    said = check_resources(event, request_)
    assert said == (
        f"{request_.DESCRIPTOR.name} {where} = -100000: the kernel takes a CFS period of 1000 to "
        "1000000 µs (1 ms to 1 s); 0 leaves it unset"
    )


@pytest.mark.parametrize("event", list(GOOD), ids=[e.value for e in GOOD])
def test_complete_requests_without_resources_pass_the_resources_check(event: Event) -> None:
    assert check_resources(event, GOOD[event]) is None


# --- what the store keeps per pod is bounded --------------------------------------------------


def _labelled(count: int, size: int) -> dict[str, str]:
    return {f"k{i:06d}": "v" * size for i in range(count)}


@pytest.mark.parametrize(
    ("event", "make"),
    [
        (
            Event.RUN_POD_SANDBOX,
            lambda labels, annotations: api_pb2.RunPodSandboxRequest(
                config=api_pb2.PodSandboxConfig(
                    metadata=api_pb2.PodSandboxMetadata(name="p", uid="u"),
                    labels=labels,
                    annotations=annotations,
                )
            ),
        ),
        (
            Event.CREATE_CONTAINER,
            lambda labels, annotations: api_pb2.CreateContainerRequest(
                pod_sandbox_id="s",
                config=api_pb2.ContainerConfig(
                    metadata=api_pb2.ContainerMetadata(name="c"),
                    labels=labels,
                    annotations=annotations,
                ),
                sandbox_config=api_pb2.PodSandboxConfig(
                    metadata=api_pb2.PodSandboxMetadata(name="p", uid="u")
                ),
            ),
        ),
    ],
    ids=["pod", "container"],
)
def test_labels_and_annotations_over_what_the_store_keeps_are_refused_by_name(
    event: Event, make: Any
) -> None:
    within = make(_labelled(100, 100), _labelled(1, MAX_KEPT_BYTES // 2))
    assert check_request(event, within) is None
    labels = _labelled(100_000, 4)  # the pod: 100k labels
    problem = check_request(event, make(labels, {}))
    assert problem is not None
    assert "config.labels and config.annotations hold 1100000 characters" in problem
    assert "(100000 labels, 0 annotations)" in problem
    assert f"more than the {MAX_KEPT_BYTES} crihook keeps per pod or container" in problem
    assert check_request(event, make({}, _labelled(2, MAX_KEPT_BYTES // 2))) is not None
