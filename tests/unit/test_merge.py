"""Merging hook adjustments into real CRI requests: fields, validation, ownership."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.adjustment import (
    REMOVE,
    Adjustment,
    Device,
    Field,
    Mount,
    ResourceDelta,
    describe_key,
)
from crihook.hooks.spec.events import Event
from crihook.proxy.chain.merge import (
    _PARTS,
    _WRITERS,
    Merger,
    apply_change,
)
from crihook.proxy.cri.events import ALLOWED_FIELDS
from crihook.proxy.cri.values import jsonable
from crihook.proxy.errors import HookConflict, HookInvalidAdjustment

MiB = 1 << 20


def create_request() -> api_pb2.CreateContainerRequest:
    """A CreateContainerRequest as kubelet sends it (trimmed to what the merge touches)."""
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id="sb1",
        config=api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name="app"),
            labels={"io.kubernetes.container.name": "app", "keep": "1"},
            annotations={"io.kubernetes.container.hash": "abc", "old": "x"},
            envs=[
                api_pb2.KeyValue(key="A", value=b"1"),
                api_pb2.KeyValue(key="DUP", value=b"first"),
                api_pb2.KeyValue(key="B", value=b"2"),
                api_pb2.KeyValue(key="DUP", value=b"second"),
            ],
            devices=[
                api_pb2.Device(container_path="/dev/a", host_path="/dev/a", permissions="rwm"),
                api_pb2.Device(container_path="/dev/b", host_path="/dev/b", permissions="r"),
            ],
            mounts=[
                api_pb2.Mount(container_path="/data", host_path="/srv/data"),
                api_pb2.Mount(container_path="/etc/hosts", host_path="/pods/hosts"),
            ],
            CDI_devices=[api_pb2.CDIDevice(name="vendor.com/gpu=0")],
            linux=api_pb2.LinuxContainerConfig(
                resources=api_pb2.LinuxContainerResources(
                    cpu_shares=256,
                    cpu_quota=50000,
                    cpu_period=100000,
                    memory_limit_in_bytes=64 * MiB,
                    oom_score_adj=996,
                    hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=0)],
                    unified={"memory.high": "max"},
                )
            ),
        ),
        sandbox_config=api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name="web", uid="u", namespace="ns")
        ),
    )


def run_pod_request() -> api_pb2.RunPodSandboxRequest:
    return api_pb2.RunPodSandboxRequest(
        config=api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name="web", uid="u", namespace="ns"),
            labels={"app": "web"},
            annotations={"a": "1"},
            linux=api_pb2.LinuxPodSandboxConfig(
                cgroup_parent="/kubepods/burstable/podu",
                resources=api_pb2.LinuxContainerResources(cpu_shares=256, cpu_period=100000),
            ),
        ),
        runtime_handler="runc",
    )


def update_request() -> api_pb2.UpdateContainerResourcesRequest:
    return api_pb2.UpdateContainerResourcesRequest(
        container_id="c1",
        linux=api_pb2.LinuxContainerResources(cpu_shares=256, cpuset_cpus="0-7"),
        annotations={"a": "1"},
    )


def envs(req: api_pb2.CreateContainerRequest) -> list[tuple[str, bytes]]:
    return [(kv.key, kv.value) for kv in req.config.envs]


def devices(req: api_pb2.CreateContainerRequest) -> list[tuple[str, str, str]]:
    return [(d.container_path, d.host_path, d.permissions) for d in req.config.devices]


def mounts(req: api_pb2.CreateContainerRequest) -> list[tuple[str, str, bool, bool, int]]:
    return [
        (m.container_path, m.host_path, m.readonly, m.selinux_relabel, m.propagation)
        for m in req.config.mounts
    ]


def hugepages(res: api_pb2.LinuxContainerResources) -> list[tuple[str, int]]:
    return [(h.page_size, h.limit) for h in res.hugepage_limits]


# --- CreateContainer: every field ---------------------------------------------------------

Check = Callable[[api_pb2.CreateContainerRequest], Any]


def res_of(req: Any) -> api_pb2.LinuxContainerResources:
    return req.config.linux.resources  # type: ignore[no-any-return]


# (id, adjustment, what to read from the request, expected)
CREATE_CASES: list[tuple[str, Adjustment, Check, Any]] = [
    ("cpuset_cpus", Adjustment().set_cpuset_cpus("2-3"), lambda r: res_of(r).cpuset_cpus, "2-3"),
    ("cpuset_mems", Adjustment().set_cpuset_mems("1"), lambda r: res_of(r).cpuset_mems, "1"),
    ("cpu_shares", Adjustment().set_cpu_shares(2048), lambda r: res_of(r).cpu_shares, 2048),
    ("cpu_quota-zero", Adjustment().set_cpu_quota(0), lambda r: res_of(r).cpu_quota, 0),
    ("cpu_quota-minus-1", Adjustment().set_cpu_quota(-1), lambda r: res_of(r).cpu_quota, -1),
    ("cpu_period", Adjustment().set_cpu_period(50000), lambda r: res_of(r).cpu_period, 50000),
    (
        "memory_limit",
        Adjustment().set_memory_limit(MiB),
        lambda r: res_of(r).memory_limit_in_bytes,
        MiB,
    ),
    (
        "memory_swap",
        Adjustment().set_memory_swap_limit(-1),
        lambda r: res_of(r).memory_swap_limit_in_bytes,
        -1,
    ),
    (
        "oom_score_adj",
        Adjustment().set_oom_score_adj(-500),
        lambda r: res_of(r).oom_score_adj,
        -500,
    ),
    (
        "hugepage-replace-in-place",
        Adjustment().set_hugepage_limit("2MB", 8 * MiB),
        lambda r: hugepages(res_of(r)),
        [("2MB", 8 * MiB)],
    ),
    (
        "hugepage-append",
        Adjustment().set_hugepage_limit("1GB", 1 << 30),
        lambda r: hugepages(res_of(r)),
        [("2MB", 0), ("1GB", 1 << 30)],
    ),
    (
        "unified-set",
        Adjustment().set_unified("cpu.weight", "100"),
        lambda r: dict(res_of(r).unified),
        {"memory.high": "max", "cpu.weight": "100"},
    ),
    (
        "unified-replace",
        Adjustment().set_unified("memory.high", "1G"),
        lambda r: dict(res_of(r).unified),
        {"memory.high": "1G"},
    ),
    (
        "unified-remove",
        Adjustment().remove_unified("memory.high"),
        lambda r: dict(res_of(r).unified),
        {},
    ),
    (
        "unified-remove-absent",
        Adjustment().remove_unified("nope"),
        lambda r: dict(res_of(r).unified),
        {"memory.high": "max"},
    ),
    (
        "label-set",
        Adjustment().set_label("new", "v"),
        lambda r: dict(r.config.labels),
        {"io.kubernetes.container.name": "app", "keep": "1", "new": "v"},
    ),
    (
        "label-remove",
        Adjustment().remove_label("keep"),
        lambda r: dict(r.config.labels),
        {"io.kubernetes.container.name": "app"},
    ),
    (
        "annotation-set",
        Adjustment().set_annotation("old", "y"),
        lambda r: dict(r.config.annotations),
        {"io.kubernetes.container.hash": "abc", "old": "y"},
    ),
    (
        "annotation-remove",
        Adjustment().remove_annotation("old"),
        lambda r: dict(r.config.annotations),
        {"io.kubernetes.container.hash": "abc"},
    ),
    (
        "annotation-remove-absent",
        Adjustment().remove_annotation("nope"),
        lambda r: dict(r.config.annotations),
        {"io.kubernetes.container.hash": "abc", "old": "x"},
    ),
    (
        "device-replace-in-place",
        Adjustment().add_device("/dev/a", "/dev/nvidia0", "rw"),
        devices,
        [("/dev/a", "/dev/nvidia0", "rw"), ("/dev/b", "/dev/b", "r")],
    ),
    (
        "device-append",
        Adjustment().add_device("/dev/c", "/dev/c"),
        devices,
        [("/dev/a", "/dev/a", "rwm"), ("/dev/b", "/dev/b", "r"), ("/dev/c", "/dev/c", "rwm")],
    ),
    ("device-remove", Adjustment().remove_device("/dev/a"), devices, [("/dev/b", "/dev/b", "r")]),
    (
        "device-remove-absent",
        Adjustment().remove_device("/dev/z"),
        devices,
        [("/dev/a", "/dev/a", "rwm"), ("/dev/b", "/dev/b", "r")],
    ),
    (
        "mount-replace-in-place-rslave",
        Adjustment().add_mount(
            "/data", "/mnt/fast", readonly=True, propagation="rslave", selinux_relabel=True
        ),
        mounts,
        [
            ("/data", "/mnt/fast", True, True, api_pb2.PROPAGATION_HOST_TO_CONTAINER),
            ("/etc/hosts", "/pods/hosts", False, False, api_pb2.PROPAGATION_PRIVATE),
        ],
    ),
    (
        "mount-append-rshared",
        Adjustment().add_mount("/shared", "/host/shared", propagation="rshared"),
        mounts,
        [
            ("/data", "/srv/data", False, False, api_pb2.PROPAGATION_PRIVATE),
            ("/etc/hosts", "/pods/hosts", False, False, api_pb2.PROPAGATION_PRIVATE),
            ("/shared", "/host/shared", False, False, api_pb2.PROPAGATION_BIDIRECTIONAL),
        ],
    ),
    (
        "mount-append-private",
        Adjustment().add_mount("/p", "/host/p"),
        lambda r: mounts(r)[-1],
        ("/p", "/host/p", False, False, api_pb2.PROPAGATION_PRIVATE),
    ),
    (
        "mount-remove",
        Adjustment().remove_mount("/data"),
        mounts,
        [("/etc/hosts", "/pods/hosts", False, False, api_pb2.PROPAGATION_PRIVATE)],
    ),
    (
        "env-set-rewrites-every-occurrence-in-place",
        Adjustment().set_env("DUP", "new"),
        envs,
        [("A", b"1"), ("DUP", b"new"), ("B", b"2"), ("DUP", b"new")],
    ),
    (
        "env-set-existing-once",
        Adjustment().set_env("A", b"\xff"),
        envs,
        [("A", b"\xff"), ("DUP", b"first"), ("B", b"2"), ("DUP", b"second")],
    ),
    (
        "env-append-new",
        Adjustment().set_env("C", "3"),
        envs,
        [("A", b"1"), ("DUP", b"first"), ("B", b"2"), ("DUP", b"second"), ("C", b"3")],
    ),
    ("env-remove-drops-all", Adjustment().remove_env("DUP"), envs, [("A", b"1"), ("B", b"2")]),
    (
        "env-remove-absent",
        Adjustment().remove_env("Z"),
        envs,
        [("A", b"1"), ("DUP", b"first"), ("B", b"2"), ("DUP", b"second")],
    ),
    (
        "cdi-append",
        Adjustment().add_cdi_device("vendor.com/gpu=1"),
        lambda r: [d.name for d in r.config.CDI_devices],
        ["vendor.com/gpu=0", "vendor.com/gpu=1"],
    ),
    (
        "cdi-again-no-duplicate",
        Adjustment().add_cdi_device("vendor.com/gpu=0"),
        lambda r: [d.name for d in r.config.CDI_devices],
        ["vendor.com/gpu=0"],
    ),
    (
        "cdi-remove",
        Adjustment().remove_cdi_device("vendor.com/gpu=0"),
        lambda r: [d.name for d in r.config.CDI_devices],
        [],
    ),
]


@pytest.mark.parametrize(
    ("adjustment", "read", "expected"),
    [c[1:] for c in CREATE_CASES],
    ids=[c[0] for c in CREATE_CASES],
)
def test_create_container_fields(adjustment: Adjustment, read: Check, expected: Any) -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    merger.validate("10-a", adjustment, post=False)
    merger.add("10-a", "a", adjustment)
    assert read(request) == expected
    assert merger.changed


def test_create_container_changes_only_what_is_named() -> None:
    request = create_request()
    expected = create_request()
    expected.config.linux.resources.cpuset_cpus = "1"
    Merger(Event.CREATE_CONTAINER, request, "error", ()).add(
        "10-a", "a", Adjustment().set_cpuset_cpus("1")
    )
    assert request == expected


def test_sandbox_config_is_not_touched_by_container_fields() -> None:
    request = create_request()
    before = api_pb2.PodSandboxConfig()
    before.CopyFrom(request.sandbox_config)
    adj = Adjustment().set_label("x", "1").set_annotation("y", "2").set_cpu_shares(4)
    Merger(Event.CREATE_CONTAINER, request, "error", ()).add("10-a", "a", adj)
    assert request.sandbox_config == before


# --- RunPodSandbox and UpdateContainerResources -------------------------------------------


POD_CASES: list[tuple[str, Adjustment, Callable[[Any], Any], Any]] = [
    (
        "cgroup_parent",
        Adjustment().set_cgroup_parent("/kubepods/custom/podu"),
        lambda r: r.config.linux.cgroup_parent,
        "/kubepods/custom/podu",
    ),
    (
        "label",
        Adjustment().set_label("b", "2"),
        lambda r: dict(r.config.labels),
        {"app": "web", "b": "2"},
    ),
    (
        "annotation-remove",
        Adjustment().remove_annotation("a"),
        lambda r: dict(r.config.annotations),
        {},
    ),
    (
        "pod-cpuset",
        Adjustment().set_cpuset_cpus("0-1"),
        lambda r: r.config.linux.resources.cpuset_cpus,
        "0-1",
    ),
    (
        "pod-memory",
        Adjustment().set_memory_limit(MiB),
        lambda r: r.config.linux.resources.memory_limit_in_bytes,
        MiB,
    ),
    (
        "pod-cpu-shares",
        Adjustment().set_cpu_shares(512),
        lambda r: r.config.linux.resources.cpu_shares,
        512,
    ),
    (
        "pod-hugepage",
        Adjustment().set_hugepage_limit("2MB", MiB * 2),
        lambda r: hugepages(r.config.linux.resources),
        [("2MB", 2 * MiB)],
    ),
    (
        "pod-unified",
        Adjustment().set_unified("cpu.weight", "10"),
        lambda r: dict(r.config.linux.resources.unified),
        {"cpu.weight": "10"},
    ),
]


@pytest.mark.parametrize(
    ("adjustment", "read", "expected"), [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES]
)
def test_run_pod_sandbox_fields(
    adjustment: Adjustment, read: Callable[[Any], Any], expected: Any
) -> None:
    request = run_pod_request()
    merger = Merger(Event.RUN_POD_SANDBOX, request, "error", ())
    merger.validate("10-a", adjustment, post=False)
    merger.add("10-a", "a", adjustment)
    assert read(request) == expected


UPDATE_CASES: list[tuple[str, Adjustment, Callable[[Any], Any], Any]] = [
    ("cpuset_cpus", Adjustment().set_cpuset_cpus("2"), lambda r: r.linux.cpuset_cpus, "2"),
    ("cpuset_mems", Adjustment().set_cpuset_mems("0"), lambda r: r.linux.cpuset_mems, "0"),
    ("cpu_quota", Adjustment().set_cpu_quota(0), lambda r: r.linux.cpu_quota, 0),
    ("memory", Adjustment().set_memory_limit(MiB), lambda r: r.linux.memory_limit_in_bytes, MiB),
    ("oom", Adjustment().set_oom_score_adj(5), lambda r: r.linux.oom_score_adj, 5),
    (
        "hugepage",
        Adjustment().set_hugepage_limit("1GB", 1 << 30),
        lambda r: hugepages(r.linux),
        [("1GB", 1 << 30)],
    ),
    (
        "unified",
        Adjustment().set_unified("memory.max", "1G"),
        lambda r: dict(r.linux.unified),
        {"memory.max": "1G"},
    ),
    (
        "annotation",
        Adjustment().set_annotation("b", "2"),
        lambda r: dict(r.annotations),
        {"a": "1", "b": "2"},
    ),
    ("annotation-remove", Adjustment().remove_annotation("a"), lambda r: dict(r.annotations), {}),
]


@pytest.mark.parametrize(
    ("adjustment", "read", "expected"),
    [c[1:] for c in UPDATE_CASES],
    ids=[c[0] for c in UPDATE_CASES],
)
def test_update_container_resources_fields(
    adjustment: Adjustment, read: Callable[[Any], Any], expected: Any
) -> None:
    request = update_request()
    merger = Merger(Event.UPDATE_CONTAINER_RESOURCES, request, "error", ())
    merger.validate("10-a", adjustment, post=False)
    merger.add("10-a", "a", adjustment)
    assert read(request) == expected
    assert request.container_id == "c1"


def test_apply_change_directly() -> None:
    request = update_request()
    apply_change(Event.UPDATE_CONTAINER_RESOURCES, request, (Field.CPU_SHARES, ""), 1024)
    apply_change(Event.UPDATE_CONTAINER_RESOURCES, request, (Field.ANNOTATION, "a"), REMOVE)
    assert (request.linux.cpu_shares, dict(request.annotations)) == (1024, {})


# --- validation: what each call can carry --------------------------------------------------

# (id, event, post, adjustment, text naming the field and the call)
INVALID_CASES = [
    (
        "env-on-run-pod",
        Event.RUN_POD_SANDBOX,
        False,
        Adjustment().set_env("FOO", "1"),
        "env 'FOO'",
        "RunPodSandbox",
    ),
    (
        "device-on-run-pod",
        Event.RUN_POD_SANDBOX,
        False,
        Adjustment().add_device("/dev/x", "/d"),
        "device '/dev/x'",
        "RunPodSandbox",
    ),
    (
        "mount-on-run-pod",
        Event.RUN_POD_SANDBOX,
        False,
        Adjustment().add_mount("/x", "/y"),
        "mount '/x'",
        "RunPodSandbox",
    ),
    (
        "oom-on-run-pod",
        Event.RUN_POD_SANDBOX,
        False,
        Adjustment().set_oom_score_adj(1),
        "oom_score_adj",
        "RunPodSandbox",
    ),
    (
        "cgroup-parent-on-create",
        Event.CREATE_CONTAINER,
        False,
        Adjustment().set_cgroup_parent("/x"),
        "cgroup_parent",
        "CreateContainer",
    ),
    (
        "label-on-update",
        Event.UPDATE_CONTAINER_RESOURCES,
        False,
        Adjustment().set_label("a", "b"),
        "label 'a'",
        "UpdateContainerResources",
    ),
    (
        "env-on-update",
        Event.UPDATE_CONTAINER_RESOURCES,
        False,
        Adjustment().set_env("A", "b"),
        "env 'A'",
        "UpdateContainerResources",
    ),
    (
        "annotation-on-start",
        Event.START_CONTAINER,
        False,
        Adjustment().set_annotation("a", "b"),
        "annotation 'a'",
        "StartContainer",
    ),
    (
        "cpuset-on-start",
        Event.START_CONTAINER,
        False,
        Adjustment().set_cpuset_cpus("1"),
        "cpuset_cpus",
        "StartContainer",
    ),
    (
        "cpuset-on-stop",
        Event.STOP_CONTAINER,
        False,
        Adjustment().set_cpuset_cpus("1"),
        "cpuset_cpus",
        "StopContainer",
    ),
    (
        "label-on-remove-pod",
        Event.REMOVE_POD_SANDBOX,
        False,
        Adjustment().set_label("a", "b"),
        "label 'a'",
        "RemovePodSandbox",
    ),
    (
        "post-create-cpuset",
        Event.CREATE_CONTAINER,
        True,
        Adjustment().set_cpuset_cpus("1"),
        "cpuset_cpus",
        "post-CreateContainer",
    ),
    (
        "post-run-pod-annotation",
        Event.RUN_POD_SANDBOX,
        True,
        Adjustment().set_annotation("a", "b"),
        "annotation 'a'",
        "post-RunPodSandbox",
    ),
]


@pytest.mark.parametrize(
    ("event", "post", "adjustment", "field", "call"),
    [c[1:] for c in INVALID_CASES],
    ids=[c[0] for c in INVALID_CASES],
)
def test_validate_refuses_fields_the_call_cannot_carry(
    event: Event, post: bool, adjustment: Adjustment, field: str, call: str
) -> None:
    merger = Merger(event, api_pb2.StartContainerRequest(), "error", ())
    with pytest.raises(HookInvalidAdjustment) as info:
        merger.validate("10-bad", adjustment, post=post)
    assert info.value.hook == "10-bad"
    assert "10-bad" in str(info.value)
    assert field in str(info.value)
    assert call in str(info.value)
    assert not merger.changed


VALID_CASES = [
    ("updates-in-post", Event.CREATE_CONTAINER, True),
    ("updates-on-start", Event.START_CONTAINER, False),
    ("updates-on-remove", Event.REMOVE_CONTAINER, False),
    ("updates-in-post-remove-pod", Event.REMOVE_POD_SANDBOX, True),
]


@pytest.mark.parametrize(
    ("event", "post"), [c[1:] for c in VALID_CASES], ids=[c[0] for c in VALID_CASES]
)
def test_updates_are_allowed_everywhere(event: Event, post: bool) -> None:
    merger = Merger(event, api_pb2.StartContainerRequest(), "error", ())
    adj = Adjustment().update_container("other", ResourceDelta(cpuset_cpus="0-3"))
    merger.validate("10-a", adj, post=post)
    merger.add("10-a", "a", adj)
    assert [(h, u.container_id) for h, u, _ in merger.updates] == [("10-a", "other")]
    assert not merger.changed


def test_every_field_is_allowed_on_create_container() -> None:
    assert ALLOWED_FIELDS[Event.CREATE_CONTAINER] == frozenset(Field) - {Field.CGROUP_PARENT}


# --- ownership and conflicts ---------------------------------------------------------------


def test_conflict_names_both_hooks_and_the_field() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    merger.add("10-a", "a", Adjustment().set_cpuset_cpus("1"))
    with pytest.raises(HookConflict) as info:
        merger.add("20-b", "b", Adjustment().set_cpuset_cpus("2"))
    err = info.value
    assert (err.owner, err.other, err.field) == ("10-a", "20-b", "cpuset_cpus")
    assert "10-a" in str(err) and "20-b" in str(err) and "cpuset_cpus" in str(err)
    assert request.config.linux.resources.cpuset_cpus == "1"


def test_keyed_fields_are_owned_key_by_key() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    merger.add("10-a", "a", Adjustment().set_annotation("x", "1").set_env("X", "1"))
    merger.add("20-b", "b", Adjustment().set_annotation("y", "2").set_env("Y", "2"))
    assert request.config.annotations["x"] == "1"
    assert request.config.annotations["y"] == "2"
    with pytest.raises(HookConflict) as info:
        merger.add("30-c", "c", Adjustment().remove_annotation("x"))
    assert info.value.field == "annotation 'x'"
    assert (info.value.owner, info.value.other) == ("10-a", "30-c")


def test_conflicting_adjustment_is_never_half_applied() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    merger.add("10-a", "a", Adjustment().set_annotation("owned", "a"))
    snapshot = api_pb2.CreateContainerRequest()
    snapshot.CopyFrom(request)
    # The non-conflicting fields come first: none of them may be applied.
    loser = (
        Adjustment()
        .set_annotation("fresh", "b")
        .set_cpuset_cpus("5")
        .set_env("NEW", "b")
        .set_annotation("owned", "b")
    )
    with pytest.raises(HookConflict):
        merger.add("20-b", "b", loser)
    assert request == snapshot
    assert set(merger.owners.values()) == {"10-a"}
    assert list(merger.owners) == [(Field.ANNOTATION, "owned")]


def test_conflicting_adjustment_adds_no_updates() -> None:
    merger = Merger(Event.CREATE_CONTAINER, create_request(), "error", ())
    merger.add("10-a", "a", Adjustment().set_cpuset_cpus("1"))
    loser = Adjustment().set_cpuset_cpus("2").update_container("c", ResourceDelta(cpu_shares=2))
    with pytest.raises(HookConflict):
        merger.add("20-b", "b", loser)
    assert merger.updates == []


def test_the_same_hook_twice_is_not_a_conflict() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    merger.add("10-a", "a", Adjustment().set_cpuset_cpus("1"))
    merger.add("10-a", "a", Adjustment().set_cpuset_cpus("2"))
    assert request.config.linux.resources.cpuset_cpus == "2"
    assert merger.owners == {(Field.CPUSET_CPUS, ""): "10-a"}


# (id, precedence, first hook, second hook, expected owner/value, or None for a conflict)
PRECEDENCE_CASES = [
    ("winner-first", ("a", "b"), "10-a", "20-b", ("10-a", "from 10-a")),
    ("winner-second", ("a", "b"), "10-b", "20-a", ("20-a", "from 20-a")),
    ("ranked-beats-unranked-first", ("a",), "10-a", "20-x", ("10-a", "from 10-a")),
    ("ranked-beats-unranked-second", ("a",), "10-x", "20-a", ("20-a", "from 20-a")),
    ("unranked-vs-unranked-conflicts", ("a",), "10-x", "20-y", None),
]


@pytest.mark.parametrize(
    ("precedence", "first", "second", "expected"),
    [c[1:] for c in PRECEDENCE_CASES],
    ids=[c[0] for c in PRECEDENCE_CASES],
)
def test_precedence_earlier_in_the_list_wins(
    precedence: tuple[str, ...], first: str, second: str, expected: tuple[str, str] | None
) -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "precedence", precedence)
    for hook in (first, second):
        adj = Adjustment().set_annotation("contested", f"from {hook}")
        adj.set_annotation(f"own-{hook}", "1")
        if hook == second and expected is None:
            with pytest.raises(HookConflict) as info:
                merger.add(hook, hook[3:], adj)
            assert (info.value.owner, info.value.other) == (first, second)
            assert f"own-{second}" not in request.config.annotations
            return
        merger.add(hook, hook[3:], adj)
    assert expected is not None
    owner, value = expected
    assert merger.owners[(Field.ANNOTATION, "contested")] == owner
    assert request.config.annotations["contested"] == value
    # The loser's uncontested fields are still applied.
    assert request.config.annotations[f"own-{first}"] == "1"
    assert request.config.annotations[f"own-{second}"] == "1"


def test_error_mode_does_not_consult_the_precedence_list() -> None:
    merger = Merger(Event.CREATE_CONTAINER, create_request(), "error", ("a", "b"))
    merger.add("10-b", "b", Adjustment().set_cpuset_cpus("1"))
    # conflict = "error": the precedence list is not consulted.
    with pytest.raises(HookConflict):
        merger.add("20-a", "a", Adjustment().set_cpuset_cpus("2"))


def test_owners_and_values_name_each_field() -> None:
    # What the pipeline's audit is built from: per field, the hook that set it and the value.
    merger = Merger(Event.CREATE_CONTAINER, create_request(), "error", ())
    merger.add(
        "10-a",
        "a",
        Adjustment().set_cpuset_cpus("2-3").set_env("K", b"v").remove_label("keep"),
    )
    merger.add("20-b", "b", Adjustment().add_device("/dev/x", "/dev/y", "r"))
    assert merger.owners == {
        (Field.CPUSET_CPUS, ""): "10-a",
        (Field.ENV, "K"): "10-a",
        (Field.LABEL, "keep"): "10-a",
        (Field.DEVICE, "/dev/x"): "20-b",
    }
    assert [describe_key(k) for k in merger.owners] == [
        "cpuset_cpus",
        "env 'K'",
        "label 'keep'",
        "device '/dev/x'",
    ]
    assert [jsonable(merger.values[k]) for k in merger.owners] == [
        "2-3",
        "v",
        "<removed>",
        {"container_path": "/dev/x", "host_path": "/dev/y", "permissions": "r"},
    ]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("2-3", "2-3"),
        (-1, -1),
        (True, True),
        (b"\xffok", "\ufffdok"),
        (REMOVE, "<removed>"),
        (
            Device("/dev/x", "/dev/y", "r"),
            {"container_path": "/dev/x", "host_path": "/dev/y", "permissions": "r"},
        ),
    ],
    ids=["str", "int", "bool", "bytes-not-utf8", "remove", "device"],
)
def test_jsonable_shows_each_kind_of_value(value: Any, shown: Any) -> None:
    assert jsonable(value) == shown
    assert type(jsonable(value)) is type(shown)


def test_jsonable_shows_a_mount_or_device_field_by_field_in_declared_order() -> None:
    # Recordings and the audit are JSON: the keys' order is part of the bytes written.
    mount = Mount("/m", "/h", readonly=True, propagation="rslave")
    assert list(jsonable(mount).items()) == [
        (f.name, getattr(mount, f.name)) for f in fields(Mount)
    ]
    device = Device("/d", "/h")
    assert list(jsonable(device)) == [f.name for f in fields(Device)]
    assert jsonable(device) is not jsonable(device)  # a copy: the audit may change its own


def test_owner_after_precedence_override_is_the_winner() -> None:
    merger = Merger(Event.CREATE_CONTAINER, create_request(), "precedence", ("a",))
    merger.add("10-x", "x", Adjustment().set_cpuset_cpus("1"))
    merger.add("20-a", "a", Adjustment().set_cpuset_cpus("2"))
    assert merger.owners == {(Field.CPUSET_CPUS, ""): "20-a"}
    assert merger.values[(Field.CPUSET_CPUS, "")] == "2"


# --- the Merger's index of keyed lists ------------------------------------------------------
# A Merger reads a list's keys once per call and keeps them beside the list. These check it
# against the request itself after each write, and against a plain model of the rules.


def _adds(merger: Merger, *adjustments: Adjustment, hook: str = "10-a") -> None:
    for adjustment in adjustments:
        merger.add(hook, hook[3:], adjustment)


def test_a_later_hook_replaces_an_entry_kubelet_sent_after_another_appended() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    _adds(merger, Adjustment().add_device("/dev/c", "/dev/c"))
    _adds(merger, Adjustment().add_device("/dev/a", "/dev/nvidia0", "r"), hook="20-b")
    _adds(merger, Adjustment().add_device("/dev/c", "/dev/c2"))  # the same hook again
    assert devices(request) == [
        ("/dev/a", "/dev/nvidia0", "r"),
        ("/dev/b", "/dev/b", "r"),
        ("/dev/c", "/dev/c2", "rwm"),
    ]


def test_removed_then_added_again_goes_to_the_end() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    _adds(merger, Adjustment().remove_device("/dev/a").remove_mount("/data"))
    _adds(merger, Adjustment().add_device("/dev/a", "/dev/x").add_mount("/data", "/srv/new"))
    assert devices(request) == [("/dev/b", "/dev/b", "r"), ("/dev/a", "/dev/x", "rwm")]
    assert [m[:2] for m in mounts(request)] == [
        ("/etc/hosts", "/pods/hosts"),
        ("/data", "/srv/new"),
    ]


def test_an_env_name_kubelet_repeats_is_set_removed_and_set_again() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    _adds(merger, Adjustment().set_env("DUP", "x"))
    assert envs(request) == [("A", b"1"), ("DUP", b"x"), ("B", b"2"), ("DUP", b"x")]
    _adds(merger, Adjustment().remove_env("DUP").set_env("B", "3"))
    assert envs(request) == [("A", b"1"), ("B", b"3")]
    _adds(merger, Adjustment().set_env("DUP", "y").set_env("B", "4"))
    assert envs(request) == [("A", b"1"), ("B", b"4"), ("DUP", b"y")]


def test_a_path_kubelet_lists_twice_is_replaced_and_removed_first_one_first() -> None:
    request = create_request()
    request.config.mounts.add(container_path="/data", host_path="/srv/second")
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    _adds(merger, Adjustment().add_mount("/data", "/srv/first"))
    assert [m[:2] for m in mounts(request)] == [
        ("/data", "/srv/first"),
        ("/etc/hosts", "/pods/hosts"),
        ("/data", "/srv/second"),
    ]
    _adds(merger, Adjustment().remove_mount("/data"))
    _adds(merger, Adjustment().add_mount("/data", "/srv/third"))
    assert [m[:2] for m in mounts(request)] == [
        ("/etc/hosts", "/pods/hosts"),
        ("/data", "/srv/third"),
    ]


def test_a_raw_value_keyed_by_another_path_is_found_by_its_own_path() -> None:
    # set_raw can name an entry by one path and carry another: the entry written has the
    # value's path, and that is the path a later change finds it by.
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    odd = Adjustment().set_raw((Field.DEVICE, "/dev/a"), Device("/dev/z", "/dev/z", "r"))
    _adds(merger, odd)
    _adds(merger, Adjustment().add_device("/dev/z", "/dev/zz").add_device("/dev/a", "/dev/aa"))
    assert devices(request) == [
        ("/dev/z", "/dev/zz", "rwm"),
        ("/dev/b", "/dev/b", "r"),
        ("/dev/a", "/dev/aa", "rwm"),
    ]


def test_precedence_winners_write_through_the_index() -> None:
    request = create_request()
    merger = Merger(Event.CREATE_CONTAINER, request, "precedence", ("a", "b"))
    _adds(merger, Adjustment().add_device("/dev/c", "/dev/from-x").set_env("A", "x"), hook="10-x")
    _adds(merger, Adjustment().add_device("/dev/c", "/dev/from-b").set_env("C", "b"), hook="20-b")
    _adds(merger, Adjustment().add_device("/dev/c", "/dev/from-a").set_env("A", "a"), hook="30-a")
    _adds(merger, Adjustment().add_device("/dev/c", "/dev/from-b2").set_env("D", "b"), hook="40-b")
    assert devices(request)[2:] == [("/dev/c", "/dev/from-a", "rwm")]  # one entry, a's
    assert envs(request) == [
        ("A", b"a"),
        ("DUP", b"first"),
        ("B", b"2"),
        ("DUP", b"second"),
        ("C", b"b"),
        ("D", b"b"),
    ]
    assert merger.owners[(Field.DEVICE, "/dev/c")] == "30-a"


def test_resources_written_through_a_part_found_once_reach_a_sandbox_without_linux() -> None:
    # The Merger keeps `config.linux` and `config.linux.resources` while they are unset
    # (protobuf makes them on the first write): both writes must land in the request.
    request = api_pb2.RunPodSandboxRequest(config=api_pb2.PodSandboxConfig())
    merger = Merger(Event.RUN_POD_SANDBOX, request, "error", ())
    _adds(merger, Adjustment().set_cpu_shares(512))
    _adds(merger, Adjustment().set_cgroup_parent("/kubepods/p").set_cpu_period(1000), hook="20-b")
    _adds(merger, Adjustment().set_unified("cpu.weight", "5"), hook="30-c")
    expected = api_pb2.RunPodSandboxRequest(config=api_pb2.PodSandboxConfig())
    for key, value in merger.values.items():
        apply_change(Event.RUN_POD_SANDBOX, expected, key, value)
    assert request == expected
    assert request.config.linux.resources.cpu_shares == 512
    assert request.config.linux.cgroup_parent == "/kubepods/p"


def test_every_field_has_a_part_and_a_writer() -> None:
    assert set(_PARTS) == set(_WRITERS) == set(Field)


_LIST_FIELDS = {
    Field.DEVICE: ("devices", "container_path"),
    Field.MOUNT: ("mounts", "container_path"),
    Field.CDI_DEVICE: ("CDI_devices", "name"),
    Field.ENV: ("envs", "key"),
}


def _model_write(
    model: dict[Field, list[tuple[str, Any]]], field: Field, key: str, value: Any
) -> None:
    """The rules, restated as a plain scan: keyed entries replace or drop their first match,
    env sets every occurrence or drops them all; a new key is appended."""
    entries = model[field]
    hits = [i for i, (k, _) in enumerate(entries) if k == key]
    if field is not Field.ENV:
        hits = hits[:1]
    if value is REMOVE:
        for i in reversed(hits):
            del entries[i]
    elif not hits:
        entries.append((key, value))
    else:
        for i in hits:
            entries[i] = (key, value)


def _as_model(request: api_pb2.CreateContainerRequest) -> dict[Field, list[tuple[str, Any]]]:
    model: dict[Field, list[tuple[str, Any]]] = {}
    for field, (repeated, key_attr) in _LIST_FIELDS.items():
        items = getattr(request.config, repeated)
        model[field] = [(getattr(item, key_attr), _shown(field, item)) for item in items]
    return model


def _shown(field: Field, item: Any) -> Any:
    if field is Field.DEVICE:
        return Device(item.container_path, item.host_path, item.permissions)
    if field is Field.MOUNT:
        return Mount(item.container_path, item.host_path, item.readonly)
    if field is Field.ENV:
        return item.value
    return item.name


_KEYS = st.sampled_from(["/a", "/b", "/c", "/d"])
_CHANGE = st.one_of(
    st.tuples(st.just(Field.DEVICE), _KEYS, st.booleans()),
    st.tuples(st.just(Field.MOUNT), _KEYS, st.booleans()),
    st.tuples(st.just(Field.CDI_DEVICE), _KEYS, st.booleans()),
    st.tuples(st.just(Field.ENV), _KEYS, st.booleans()),
)


@settings(max_examples=200, deadline=None)
@given(
    start=st.lists(st.tuples(st.sampled_from(sorted(_LIST_FIELDS, key=str)), _KEYS), max_size=8),
    steps=st.lists(st.lists(_CHANGE, min_size=1, max_size=4), min_size=1, max_size=6),
)
def test_the_index_writes_what_a_scan_per_change_would(
    start: list[tuple[Field, str]], steps: list[list[tuple[Field, str, bool]]]
) -> None:
    request = api_pb2.CreateContainerRequest(config=api_pb2.ContainerConfig())
    for n, (field, key) in enumerate(start):  # kubelet's lists, repeated keys and all
        items = getattr(request.config, _LIST_FIELDS[field][0])
        value = _value(field, key, n)
        if field is Field.ENV:
            items.add(key=key, value=value)
        elif field is Field.CDI_DEVICE:
            items.add(name=key)
        else:
            items.add(container_path=key, host_path=value.host_path)
    model = _as_model(request)
    merger = Merger(Event.CREATE_CONTAINER, request, "error", ())
    for n, step in enumerate(steps):
        adjustment = Adjustment()
        for field, key, remove in step:
            adjustment.set_raw((field, key), REMOVE if remove else _value(field, key, 100 + n))
        merger.add("10-a", "a", adjustment)
        for (field, key), value in adjustment.change_items():
            _model_write(model, field, key, value)
        assert _as_model(request) == model


def _value(field: Field, key: str, n: int) -> Any:
    if field is Field.DEVICE:
        return Device(key, f"/host{key}{n}", "rwm")
    if field is Field.MOUNT:
        return Mount(key, f"/host{key}{n}")
    if field is Field.ENV:
        return f"v{n}".encode()
    return key
