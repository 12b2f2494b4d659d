"""Checks that the generated CRI v1 bindings match the upstream wire contract.

The expected values below were taken from k8s.io/cri-api's
pkg/apis/runtime/v1/api.proto (Kubernetes master after v1.36) and, for CheckpointPod and
RestorePod, from KEP-5823's CRI messages (cri-api of mid-2026), not from our own api.proto, so
a typo in our copy makes these tests fail. RUNTIME_METHODS is upstream's method list: when
upstream adds a method, add it here and the proto falls behind until it follows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import (  # type: ignore[import-untyped, unused-ignore]
    FieldDescriptor,
    ServiceDescriptor,
)

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]

RUNTIME_METHODS = [
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "StreamPodSandboxes",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "StreamContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "StreamContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "StreamPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "StreamPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
    "CheckpointPod",
    "RestorePod",
]

IMAGE_METHODS = [
    "ListImages",
    "StreamImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
]

# (service, method) -> (request type, response type); all server-streaming.
STREAMING = {
    ("RuntimeService", "StreamPodSandboxes"): (
        "StreamPodSandboxesRequest",
        "StreamPodSandboxesResponse",
    ),
    ("RuntimeService", "StreamContainers"): ("StreamContainersRequest", "StreamContainersResponse"),
    ("RuntimeService", "StreamContainerStats"): (
        "StreamContainerStatsRequest",
        "StreamContainerStatsResponse",
    ),
    ("RuntimeService", "StreamPodSandboxStats"): (
        "StreamPodSandboxStatsRequest",
        "StreamPodSandboxStatsResponse",
    ),
    ("RuntimeService", "GetContainerEvents"): ("GetEventsRequest", "ContainerEventResponse"),
    ("RuntimeService", "StreamPodSandboxMetrics"): (
        "StreamPodSandboxMetricsRequest",
        "StreamPodSandboxMetricsResponse",
    ),
    ("ImageService", "StreamImages"): ("StreamImagesRequest", "StreamImagesResponse"),
}

T = FieldDescriptor
# Cardinality markers for the fact table.
ONE, REP, MAP = "singular", "repeated", "map"

# (message, field, number, type, cardinality, message/enum type name or None)
FIELD_FACTS = [
    ("CreateContainerRequest", "pod_sandbox_id", 1, T.TYPE_STRING, ONE, None),
    ("CreateContainerRequest", "config", 2, T.TYPE_MESSAGE, ONE, "ContainerConfig"),
    ("CreateContainerRequest", "sandbox_config", 3, T.TYPE_MESSAGE, ONE, "PodSandboxConfig"),
    ("ContainerConfig", "metadata", 1, T.TYPE_MESSAGE, ONE, "ContainerMetadata"),
    ("ContainerConfig", "image", 2, T.TYPE_MESSAGE, ONE, "ImageSpec"),
    ("ContainerConfig", "command", 3, T.TYPE_STRING, REP, None),
    ("ContainerConfig", "args", 4, T.TYPE_STRING, REP, None),
    ("ContainerConfig", "working_dir", 5, T.TYPE_STRING, ONE, None),
    ("ContainerConfig", "envs", 6, T.TYPE_MESSAGE, REP, "KeyValue"),
    ("ContainerConfig", "mounts", 7, T.TYPE_MESSAGE, REP, "Mount"),
    ("ContainerConfig", "devices", 8, T.TYPE_MESSAGE, REP, "Device"),
    ("ContainerConfig", "labels", 9, T.TYPE_MESSAGE, MAP, None),
    ("ContainerConfig", "annotations", 10, T.TYPE_MESSAGE, MAP, None),
    ("ContainerConfig", "log_path", 11, T.TYPE_STRING, ONE, None),
    ("ContainerConfig", "stdin", 12, T.TYPE_BOOL, ONE, None),
    ("ContainerConfig", "stdin_once", 13, T.TYPE_BOOL, ONE, None),
    ("ContainerConfig", "tty", 14, T.TYPE_BOOL, ONE, None),
    ("ContainerConfig", "linux", 15, T.TYPE_MESSAGE, ONE, "LinuxContainerConfig"),
    ("ContainerConfig", "windows", 16, T.TYPE_MESSAGE, ONE, "WindowsContainerConfig"),
    ("ContainerConfig", "CDI_devices", 17, T.TYPE_MESSAGE, REP, "CDIDevice"),
    ("ContainerConfig", "stop_signal", 18, T.TYPE_ENUM, ONE, "Signal"),
    ("LinuxContainerResources", "cpu_period", 1, T.TYPE_INT64, ONE, None),
    ("LinuxContainerResources", "cpu_quota", 2, T.TYPE_INT64, ONE, None),
    ("LinuxContainerResources", "cpu_shares", 3, T.TYPE_INT64, ONE, None),
    ("LinuxContainerResources", "memory_limit_in_bytes", 4, T.TYPE_INT64, ONE, None),
    ("LinuxContainerResources", "oom_score_adj", 5, T.TYPE_INT64, ONE, None),
    ("LinuxContainerResources", "cpuset_cpus", 6, T.TYPE_STRING, ONE, None),
    ("LinuxContainerResources", "cpuset_mems", 7, T.TYPE_STRING, ONE, None),
    ("LinuxContainerResources", "hugepage_limits", 8, T.TYPE_MESSAGE, REP, "HugepageLimit"),
    ("LinuxContainerResources", "unified", 9, T.TYPE_MESSAGE, MAP, None),
    ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10, T.TYPE_INT64, ONE, None),
    ("LinuxPodSandboxConfig", "cgroup_parent", 1, T.TYPE_STRING, ONE, None),
    ("LinuxPodSandboxConfig", "sysctls", 3, T.TYPE_MESSAGE, MAP, None),
    ("LinuxPodSandboxConfig", "overhead", 4, T.TYPE_MESSAGE, ONE, "LinuxContainerResources"),
    ("LinuxPodSandboxConfig", "resources", 5, T.TYPE_MESSAGE, ONE, "LinuxContainerResources"),
    ("PodSandboxConfig", "metadata", 1, T.TYPE_MESSAGE, ONE, "PodSandboxMetadata"),
    ("PodSandboxConfig", "labels", 6, T.TYPE_MESSAGE, MAP, None),
    ("PodSandboxConfig", "annotations", 7, T.TYPE_MESSAGE, MAP, None),
    ("PodSandboxConfig", "linux", 8, T.TYPE_MESSAGE, ONE, "LinuxPodSandboxConfig"),
    ("RunPodSandboxRequest", "config", 1, T.TYPE_MESSAGE, ONE, "PodSandboxConfig"),
    ("RunPodSandboxRequest", "runtime_handler", 2, T.TYPE_STRING, ONE, None),
    ("KeyValue", "key", 1, T.TYPE_STRING, ONE, None),
    ("KeyValue", "value", 2, T.TYPE_BYTES, ONE, None),
    ("UpdateContainerResourcesRequest", "container_id", 1, T.TYPE_STRING, ONE, None),
    ("UpdateContainerResourcesRequest", "linux", 2, T.TYPE_MESSAGE, ONE, "LinuxContainerResources"),
    (
        "UpdateContainerResourcesRequest",
        "windows",
        3,
        T.TYPE_MESSAGE,
        ONE,
        "WindowsContainerResources",
    ),
    ("UpdateContainerResourcesRequest", "annotations", 4, T.TYPE_MESSAGE, MAP, None),
    ("UpdatePodSandboxResourcesRequest", "resources", 3, T.TYPE_MESSAGE, ONE, None),
    ("Mount", "uidMappings", 6, T.TYPE_MESSAGE, REP, "IDMapping"),
    ("Mount", "image", 9, T.TYPE_MESSAGE, ONE, "ImageSpec"),
    ("Mount", "image_sub_path", 10, T.TYPE_STRING, ONE, None),
    ("Mount", "mount_options", 11, T.TYPE_STRING, REP, None),
    ("ImageSpec", "user_specified_image", 18, T.TYPE_STRING, ONE, None),
    ("ImageSpec", "runtime_handler", 19, T.TYPE_STRING, ONE, None),
    ("ImageSpec", "image_ref", 20, T.TYPE_STRING, ONE, None),
    ("LinuxSandboxSecurityContext", "run_as_group", 8, T.TYPE_MESSAGE, ONE, "Int64Value"),
    (
        "LinuxSandboxSecurityContext",
        "supplemental_groups_policy",
        11,
        T.TYPE_ENUM,
        ONE,
        "SupplementalGroupsPolicy",
    ),
    (
        "LinuxContainerSecurityContext",
        "supplemental_groups_policy",
        17,
        T.TYPE_ENUM,
        ONE,
        "SupplementalGroupsPolicy",
    ),
    ("LinuxContainerSecurityContext", "run_as_group", 12, T.TYPE_MESSAGE, ONE, "Int64Value"),
    ("ContainerStatus", "user", 18, T.TYPE_MESSAGE, ONE, "ContainerUser"),
    ("ContainerStatus", "stop_signal", 19, T.TYPE_ENUM, ONE, "Signal"),
    ("ExecSyncResponse", "stdout", 1, T.TYPE_BYTES, ONE, None),
    ("AttachRequest", "stdin", 2, T.TYPE_BOOL, ONE, None),
    ("AttachRequest", "tty", 3, T.TYPE_BOOL, ONE, None),
    ("ExecRequest", "tty", 3, T.TYPE_BOOL, ONE, None),
    ("Namespace", "options", 2, T.TYPE_MESSAGE, ONE, "NamespaceOption"),
    ("PsiData", "Avg10", 2, T.TYPE_DOUBLE, ONE, None),
    ("StreamPodSandboxesResponse", "pod_sandboxes", 1, T.TYPE_MESSAGE, REP, "PodSandbox"),
    ("StreamContainerStatsResponse", "container_stats", 1, T.TYPE_MESSAGE, REP, None),
    ("RuntimeConfigResponse", "linux", 1, T.TYPE_MESSAGE, ONE, "LinuxRuntimeConfiguration"),
    ("AuthConfig", "registry_token", 6, T.TYPE_STRING, ONE, None),
    ("CheckpointPodRequest", "pod_sandbox_id", 1, T.TYPE_STRING, ONE, None),
    ("CheckpointPodRequest", "path", 2, T.TYPE_STRING, ONE, None),
    ("CheckpointPodRequest", "timeout", 3, T.TYPE_INT64, ONE, None),
    ("CheckpointPodRequest", "options", 4, T.TYPE_MESSAGE, MAP, None),
    ("RestorePodRequest", "path", 1, T.TYPE_STRING, ONE, None),
    ("RestorePodRequest", "config", 2, T.TYPE_MESSAGE, ONE, "PodSandboxConfig"),
    ("RestorePodRequest", "timeout", 3, T.TYPE_INT64, ONE, None),
    ("RestorePodRequest", "options", 4, T.TYPE_MESSAGE, MAP, None),
    ("RestorePodRequest", "container_configs", 5, T.TYPE_MESSAGE, REP, "ContainerConfig"),
    ("RestorePodResponse", "pod_sandbox_id", 1, T.TYPE_STRING, ONE, None),
]

ENUM_FACTS = [
    ("Signal", "RUNTIME_DEFAULT", 0),
    ("Signal", "SIGKILL", 13),
    ("Signal", "SIGTERM", 23),
    ("Signal", "SIGRTMAX", 65),
    ("NamespaceMode", "TARGET", 3),
    ("SupplementalGroupsPolicy", "Strict", 1),
    ("ContainerState", "CONTAINER_UNKNOWN", 3),
    ("ContainerEventType", "CONTAINER_DELETED_EVENT", 3),
    ("CgroupDriver", "CGROUPFS", 1),
    ("MountPropagation", "PROPAGATION_BIDIRECTIONAL", 2),
]


def _service(name: str) -> ServiceDescriptor:
    return api_pb2.DESCRIPTOR.services_by_name[name]


def _cardinality(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return MAP
    return REP if field.is_repeated else ONE


def test_file_identity() -> None:
    assert api_pb2.DESCRIPTOR.package == "runtime.v1"
    assert api_pb2.DESCRIPTOR.name == "crihook/api/cri/v1/api.proto"
    assert api_pb2.DESCRIPTOR.GetOptions().go_package == "k8s.io/cri-api/pkg/apis/runtime/v1"
    assert api_pb2.DESCRIPTOR.dependencies == []  # no gogoproto or other imports


def test_runtime_service_methods() -> None:
    service = _service("RuntimeService")
    assert service.full_name == "runtime.v1.RuntimeService"
    assert [m.name for m in service.methods] == RUNTIME_METHODS


def test_image_service_methods() -> None:
    service = _service("ImageService")
    assert service.full_name == "runtime.v1.ImageService"
    assert [m.name for m in service.methods] == IMAGE_METHODS


def test_only_the_expected_services() -> None:
    assert sorted(api_pb2.DESCRIPTOR.services_by_name) == ["ImageService", "RuntimeService"]


def test_streaming_shapes() -> None:
    seen = set()
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            key = (service.name, method.name)
            assert not method.client_streaming, key
            assert method.server_streaming == (key in STREAMING), key
            if key in STREAMING:
                seen.add(key)
                assert (method.input_type.name, method.output_type.name) == STREAMING[key]
    assert seen == set(STREAMING)


def test_unary_request_response_names() -> None:
    # Spot-check the request/response pairing of the busiest unary calls.
    methods = _service("RuntimeService").methods_by_name
    assert methods["CreateContainer"].input_type.name == "CreateContainerRequest"
    assert methods["UpdatePodSandboxResources"].output_type.name == (
        "UpdatePodSandboxResourcesResponse"
    )
    assert _service("ImageService").methods_by_name["PullImage"].output_type.name == (
        "PullImageResponse"
    )


@pytest.mark.parametrize(
    ("message", "field", "number", "ftype", "cardinality", "type_name"),
    FIELD_FACTS,
    ids=[f"{m}.{f}={n}" for m, f, n, *_ in FIELD_FACTS],
)
def test_field_fact(
    message: str,
    field: str,
    number: int,
    ftype: int,
    cardinality: str,
    type_name: str | None,
) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    fd = descriptor.fields_by_name[field]
    assert fd.number == number
    assert fd.type == ftype
    assert _cardinality(fd) == cardinality
    if type_name is not None:
        target = fd.message_type if ftype == T.TYPE_MESSAGE else fd.enum_type
        assert target.full_name == f"runtime.v1.{type_name}"
    # Nothing else in the message may reuse the number.
    assert descriptor.fields_by_number[number].name == field


def test_map_fields_are_string_to_string() -> None:
    fd = api_pb2.ContainerConfig.DESCRIPTOR.fields_by_name["annotations"]
    entry = fd.message_type
    assert entry.fields_by_name["key"].type == T.TYPE_STRING
    assert entry.fields_by_name["value"].type == T.TYPE_STRING


@pytest.mark.parametrize(
    ("enum", "value", "number"),
    ENUM_FACTS,
    ids=[f"{e}.{v}={n}" for e, v, n in ENUM_FACTS],
)
def test_enum_fact(enum: str, value: str, number: int) -> None:
    assert api_pb2.DESCRIPTOR.enum_types_by_name[enum].values_by_name[value].number == number


def test_signal_enum_is_dense() -> None:
    values = api_pb2.DESCRIPTOR.enum_types_by_name["Signal"].values
    assert [v.number for v in values] == list(range(66))


def test_env_value_carries_non_utf8_bytes() -> None:
    raw = b"\xff\xfe binary \x00"
    kv = api_pb2.KeyValue(key="BLOB", value=raw)
    parsed = api_pb2.KeyValue.FromString(kv.SerializeToString())
    assert parsed.value == raw


def test_env_value_wire_compatible_with_string_encoding() -> None:
    # A peer that still declares `string value = 2` sends the same bytes.
    wire = b"\x0a\x01K" + b"\x12\x03abc"
    assert api_pb2.KeyValue.FromString(wire).value == b"abc"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def test_unknown_field_survives_round_trip() -> None:
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="app", attempt=2),
        image=api_pb2.ImageSpec(image="docker.io/library/busybox:latest"),
        command=["sh", "-c", "sleep 1"],
        envs=[api_pb2.KeyValue(key="A", value=b"1")],
        stop_signal=api_pb2.SIGTERM,
    )
    known = config.SerializeToString()
    payload = b"from-a-newer-kubelet"
    unknown = _varint((999 << 3) | 2) + _varint(len(payload)) + payload

    parsed = api_pb2.ContainerConfig.FromString(known + unknown)
    assert parsed.metadata.name == "app"
    assert parsed.stop_signal == api_pb2.SIGTERM

    reserialized = parsed.SerializeToString()
    assert unknown in reserialized
    assert reserialized == known + unknown
    # And a second hop keeps it too.
    again = api_pb2.ContainerConfig.FromString(reserialized).SerializeToString()
    assert again == reserialized


def test_grpc_stubs_cover_every_method() -> None:
    for service, methods in (("RuntimeService", RUNTIME_METHODS), ("ImageService", IMAGE_METHODS)):
        servicer = getattr(api_pb2_grpc, f"{service}Servicer")
        assert callable(getattr(api_pb2_grpc, f"add_{service}Servicer_to_server"))
        for method in methods:
            assert callable(getattr(servicer, method)), (service, method)


def test_generated_imports_are_namespaced() -> None:
    source = Path(api_pb2_grpc.__file__).read_text(encoding="utf-8")
    assert "from crihook.api.cri.v1 import api_pb2" in source


def test_generated_code_is_current() -> None:
    pytest.importorskip("grpc_tools")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "api" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
