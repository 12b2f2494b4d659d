"""Conversions between the hook spec's types and the plugin protocol (crihook.hook.v1)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
from google.protobuf.message import Message

from crihook.api.hook.v1 import hook_pb2
from crihook.hooks.remote import convert
from crihook.hooks.spec import (
    REMOVE,
    Adjustment,
    ContainerKind,
    ContainerUpdate,
    ContainerView,
    Event,
    Field,
    PodView,
    QoSClass,
    ResourceDelta,
    ResourcesView,
    Stage,
)
from crihook.hooks.spec.events import PLUGIN_STAGES


def wire(adj: Adjustment) -> Adjustment:
    """Adjustment → proto → bytes → proto → Adjustment, as it travels between processes."""
    data = convert.adjustment_to_proto(adj).SerializeToString()
    return convert.adjustment_from_proto(hook_pb2.Adjustment.FromString(data))


# --- adjustments: every Field, set and (for keyed fields) removed ------------------------------
ADJUSTMENTS = [
    ("cgroup_parent", Adjustment().set_cgroup_parent("/kubepods/burstable/podx")),
    ("label", Adjustment().set_label("app", "web")),
    ("label-remove", Adjustment().remove_label("app")),
    ("annotation", Adjustment().set_annotation("example.com/a", "1")),
    ("annotation-remove", Adjustment().remove_annotation("example.com/a")),
    ("annotation-empty-value", Adjustment().set_annotation("example.com/a", "")),
    ("cpuset_cpus", Adjustment().set_cpuset_cpus("2-3")),
    ("cpuset_cpus-empty", Adjustment().set_cpuset_cpus("")),
    ("cpuset_mems", Adjustment().set_cpuset_mems("0")),
    ("cpu_shares", Adjustment().set_cpu_shares(1024)),
    ("cpu_quota", Adjustment().set_cpu_quota(50_000)),
    ("cpu_quota-zero", Adjustment().set_cpu_quota(0)),
    ("cpu_quota-unlimited", Adjustment().set_cpu_quota(-1)),
    ("cpu_period", Adjustment().set_cpu_period(100_000)),
    ("memory_limit", Adjustment().set_memory_limit(256 << 20)),
    ("memory_swap_limit-unlimited", Adjustment().set_memory_swap_limit(-1)),
    ("hugepage_limit", Adjustment().set_hugepage_limit("2MB", 1 << 30)),
    ("unified", Adjustment().set_unified("memory.high", "max")),
    ("unified-remove", Adjustment().remove_unified("memory.high")),
    ("oom_score_adj", Adjustment().set_oom_score_adj(-997)),
    ("oom_score_adj-zero", Adjustment().set_oom_score_adj(0)),
    ("device", Adjustment().add_device("/dev/fuse", "/dev/fuse", "rw")),
    ("device-remove", Adjustment().remove_device("/dev/fuse")),
    (
        "mount",
        Adjustment().add_mount(
            "/data", "/srv/data", readonly=True, propagation="rslave", selinux_relabel=True
        ),
    ),
    ("mount-defaults", Adjustment().add_mount("/data", "/srv/data")),
    ("mount-remove", Adjustment().remove_mount("/data")),
    ("env", Adjustment().set_env("LANG", "C.UTF-8")),
    ("env-binary", Adjustment().set_env("BLOB", b"\x00\xff")),
    ("env-remove", Adjustment().remove_env("LANG")),
    ("cdi_device", Adjustment().add_cdi_device("vendor.com/gpu=0")),
    ("cdi_device-remove", Adjustment().remove_cdi_device("vendor.com/gpu=0")),
    ("update", Adjustment().update_container("c0ffee", ResourceDelta(cpuset_cpus="0-1"))),
    (
        "update-zero-values",
        Adjustment().update_container("c0ffee", ResourceDelta(cpu_quota=0, cpuset_mems="")),
    ),
    (
        "update-every-field",
        Adjustment().update_container(
            "c0ffee",
            ResourceDelta(
                cpuset_cpus="0-1",
                cpuset_mems="0",
                cpu_shares=2,
                cpu_quota=-1,
                cpu_period=100_000,
                memory_limit_in_bytes=1 << 30,
                memory_swap_limit_in_bytes=-1,
            ),
        ),
    ),
    (
        "two-updates",
        Adjustment()
        .update_container("a", ResourceDelta(cpu_shares=2))
        .update_container("b", ResourceDelta(cpu_shares=4)),
    ),
    ("empty", Adjustment()),
]


def everything() -> Adjustment:
    adj = Adjustment()
    for _, part in ADJUSTMENTS:
        for key, value in part.changes.items():
            adj.set_raw(key, value)
        for update in part.updates:
            adj.update_container(update.container_id, update.resources)
    return adj


@pytest.mark.parametrize("adj", [a for _, a in ADJUSTMENTS], ids=[i for i, _ in ADJUSTMENTS])
def test_adjustment_round_trip(adj: Adjustment) -> None:
    back = wire(adj)
    assert back == adj
    assert dict(back.changes) == dict(adj.changes)
    assert back.updates == adj.updates


def test_every_field_is_covered() -> None:
    covered = {field for _, adj in ADJUSTMENTS for field, _ in adj.changes}
    assert covered == set(Field)
    removable = {
        field for _, adj in ADJUSTMENTS for (field, _), v in adj.changes.items() if v is REMOVE
    }
    assert removable == {
        Field.LABEL,
        Field.ANNOTATION,
        Field.UNIFIED,
        Field.DEVICE,
        Field.MOUNT,
        Field.ENV,
        Field.CDI_DEVICE,
    }


def test_all_fields_together_round_trip() -> None:
    adj = everything()
    assert wire(adj) == adj


def test_empty_adjustment_is_an_empty_message() -> None:
    assert convert.adjustment_to_proto(Adjustment()).ByteSize() == 0


# --- explicit presence -------------------------------------------------------------------------
PRESENCE = [
    ("cpu_quota-zero-is-set", Adjustment().set_cpu_quota(0), "cpu_quota", True),
    ("cpu_quota-unset", Adjustment().set_cpu_shares(2), "cpu_quota", False),
    ("cpuset_cpus-empty-is-set", Adjustment().set_cpuset_cpus(""), "cpuset_cpus", True),
    ("cpuset_cpus-unset", Adjustment(), "cpuset_cpus", False),
    ("oom_score_adj-zero-is-set", Adjustment().set_oom_score_adj(0), "oom_score_adj", True),
    ("cgroup_parent-unset", Adjustment().set_label("a", "b"), "cgroup_parent", False),
]


@pytest.mark.parametrize(
    ("adj", "proto_field", "present"), [p[1:] for p in PRESENCE], ids=[p[0] for p in PRESENCE]
)
def test_scalar_presence(adj: Adjustment, proto_field: str, present: bool) -> None:
    msg = hook_pb2.Adjustment.FromString(convert.adjustment_to_proto(adj).SerializeToString())
    assert msg.HasField(proto_field) is present
    assert wire(adj) == adj


REMOVALS = [
    ("label", Adjustment().remove_label("app"), "remove_labels", "app"),
    ("annotation", Adjustment().remove_annotation("x/y"), "remove_annotations", "x/y"),
    ("unified", Adjustment().remove_unified("memory.high"), "remove_unified", "memory.high"),
    ("device", Adjustment().remove_device("/dev/fuse"), "remove_devices", "/dev/fuse"),
    ("mount", Adjustment().remove_mount("/data"), "remove_mounts", "/data"),
    ("env", Adjustment().remove_env("LANG"), "remove_env", "LANG"),
    ("cdi", Adjustment().remove_cdi_device("v.com/gpu=0"), "remove_cdi_devices", "v.com/gpu=0"),
]


@pytest.mark.parametrize(
    ("adj", "proto_list", "key"), [r[1:] for r in REMOVALS], ids=[r[0] for r in REMOVALS]
)
def test_remove_travels_in_the_remove_list(adj: Adjustment, proto_list: str, key: str) -> None:
    msg = convert.adjustment_to_proto(adj)
    assert list(getattr(msg, proto_list)) == [key]
    assert [fd.name for fd, _ in msg.ListFields()] == [proto_list]  # nothing set, only removed


UNREMOVABLE = [
    ("cpu_quota", (Field.CPU_QUOTA, "")),
    ("cgroup_parent", (Field.CGROUP_PARENT, "")),
    ("hugepage_limit", (Field.HUGEPAGE_LIMIT, "2MB")),
]


@pytest.mark.parametrize("key", [u[1] for u in UNREMOVABLE], ids=[u[0] for u in UNREMOVABLE])
def test_remove_the_protocol_cannot_carry_is_refused(key: tuple[Field, str]) -> None:
    with pytest.raises(ValueError, match="cannot be removed"):
        convert.adjustment_to_proto(Adjustment().set_raw(key, REMOVE))


def test_env_order_is_kept() -> None:
    adj = (
        Adjustment()
        .set_env("ZED", "1")
        .set_env("ALPHA", "2")
        .remove_env("OLD")
        .set_env("MIDDLE", "3")
    )
    msg = convert.adjustment_to_proto(adj)
    assert [e.name for e in msg.set_env] == ["ZED", "ALPHA", "MIDDLE"]
    back = wire(adj)
    env = [(key, value) for (field, key), value in back.changes.items() if field is Field.ENV]
    assert env == [("ZED", b"1"), ("ALPHA", b"2"), ("MIDDLE", b"3"), ("OLD", REMOVE)]


INVALID = [
    (
        "relative-device-path",
        hook_pb2.Adjustment(
            add_devices=[
                hook_pb2.Device(container_path="dev/x", host_path="/dev/x", permissions="rw")
            ]
        ),
    ),
    (
        "bad-device-permissions",
        hook_pb2.Adjustment(
            add_devices=[
                hook_pb2.Device(container_path="/dev/x", host_path="/dev/x", permissions="rwx")
            ]
        ),
    ),
    (
        "bad-propagation",
        hook_pb2.Adjustment(
            add_mounts=[hook_pb2.Mount(container_path="/a", host_path="/b", propagation="shared")]
        ),
    ),
    ("oom_score_adj-out-of-range", hook_pb2.Adjustment(oom_score_adj=5000)),
    ("negative-cpu_shares", hook_pb2.Adjustment(cpu_shares=-1)),
    ("empty-label-key", hook_pb2.Adjustment(set_labels={"": "x"})),
    (
        "update-without-id",
        hook_pb2.Adjustment(
            updates=[hook_pb2.ContainerUpdate(resources=hook_pb2.ResourceDelta(cpu_shares=2))]
        ),
    ),
    (
        "update-without-change",
        hook_pb2.Adjustment(updates=[hook_pb2.ContainerUpdate(container_id="c")]),
    ),
]


@pytest.mark.parametrize("msg", [i[1] for i in INVALID], ids=[i[0] for i in INVALID])
def test_a_plugins_invalid_values_are_refused_like_a_hooks(msg: hook_pb2.Adjustment) -> None:
    with pytest.raises(ValueError):
        convert.adjustment_from_proto(msg)


def test_updates_round_trip() -> None:
    update = ContainerUpdate("c0ffee", ResourceDelta(cpu_quota=0, cpuset_cpus="1"))
    msg = convert.update_to_proto(update)
    assert msg.resources.HasField("cpu_quota") and not msg.resources.HasField("cpu_shares")
    assert convert.update_from_proto(msg) == update


# --- views ---------------------------------------------------------------------------------------
RESOURCES = ResourcesView(
    qos_class=QoSClass.GUARANTEED,
    cpu_request_milli=2000,
    cpu_limit_milli=2000,
    memory_limit_bytes=1 << 30,
    integer_cpus=2,
    oom_score_adj=-997,
    cpu_shares=2048,
    cpu_quota=200_000,
    cpu_period=100_000,
    cpuset_cpus="2-3",
    cpuset_mems="0",
    hugepage_limits=MappingProxyType({"2MB": 0, "1GB": 1 << 30}),
)
POD = PodView(
    id="sandbox1",
    uid="u-1",
    name="web",
    namespace="prod",
    attempt=1,
    labels=MappingProxyType({"app": "web"}),
    annotations=MappingProxyType({"a/b": "c"}),
    cgroup_parent="/kubepods/podu-1",
    runtime_handler="runc",
    qos_class=QoSClass.GUARANTEED,
    resources=RESOURCES,
)
CONTAINER = ContainerView(
    id="c0ffee",
    pod_id="sandbox1",
    name="app",
    attempt=2,
    image="busybox:1.36",
    labels=MappingProxyType({"io.kubernetes.container.name": "app"}),
    annotations=MappingProxyType({"x": "y"}),
    kind=ContainerKind.SIDECAR,
    resources=RESOURCES,
)

RESOURCE_VIEWS = [
    ("all-set", RESOURCES),
    ("defaults", ResourcesView()),
    (
        "zeros-are-not-unset",
        ResourcesView(cpu_quota=0, cpu_request_milli=0, oom_score_adj=0, integer_cpus=0),
    ),
    ("only-limit", ResourcesView(qos_class=QoSClass.BURSTABLE, memory_limit_bytes=1)),
]


@pytest.mark.parametrize("view", [v for _, v in RESOURCE_VIEWS], ids=[i for i, _ in RESOURCE_VIEWS])
def test_resources_round_trip(view: ResourcesView) -> None:
    data = convert.resources_to_proto(view).SerializeToString()
    assert convert.resources_from_proto(hook_pb2.Resources.FromString(data)) == view


def test_unset_and_zero_resources_differ_on_the_wire() -> None:
    zero = convert.resources_to_proto(ResourcesView(cpu_quota=0))
    unset = convert.resources_to_proto(ResourcesView())
    assert zero.HasField("cpu_quota") and not unset.HasField("cpu_quota")


POD_VIEWS = [
    ("full", POD),
    ("no-pod-resources", dataclasses.replace(POD, resources=None)),
    ("pre-run-pod-sandbox-no-id", PodView(id="", uid="u", name="n", namespace="ns")),
]


@pytest.mark.parametrize("view", [v for _, v in POD_VIEWS], ids=[i for i, _ in POD_VIEWS])
def test_pod_round_trip(view: PodView) -> None:
    msg = hook_pb2.Pod.FromString(convert.pod_to_proto(view).SerializeToString())
    assert msg.HasField("resources") is (view.resources is not None)
    back = convert.pod_from_proto(msg)
    assert back == view
    assert isinstance(back.labels, MappingProxyType)  # still read-only


CONTAINER_VIEWS = [
    ("full", CONTAINER),
    ("pre-create-no-id", dataclasses.replace(CONTAINER, id="", kind=ContainerKind.UNKNOWN)),
    ("defaults", ContainerView(id="", pod_id="p", name="c")),
    (
        "cdi-devices",
        dataclasses.replace(CONTAINER, cdi_devices=("nvidia.com/gpu=0", "vendor.com/net=a")),
    ),
]


@pytest.mark.parametrize(
    "view", [v for _, v in CONTAINER_VIEWS], ids=[i for i, _ in CONTAINER_VIEWS]
)
def test_container_round_trip(view: ContainerView) -> None:
    msg = hook_pb2.Container.FromString(convert.container_to_proto(view).SerializeToString())
    assert convert.container_from_proto(msg) == view


def test_values_a_newer_peer_may_send_degrade_to_unknown() -> None:
    pod = convert.pod_from_proto(hook_pb2.Pod(qos_class="Platinum"))
    container = convert.container_from_proto(hook_pb2.Container(kind="daemon"))
    assert pod.qos_class is QoSClass.UNKNOWN
    assert container.kind is ContainerKind.UNKNOWN


FIELD_PAIRS = [
    ("resources", hook_pb2.Resources, ResourcesView),
    ("pod", hook_pb2.Pod, PodView),
    ("container", hook_pb2.Container, ContainerView),
    ("resource-delta", hook_pb2.ResourceDelta, ResourceDelta),
]


@pytest.mark.parametrize(
    ("message", "view"), [p[1:] for p in FIELD_PAIRS], ids=[p[0] for p in FIELD_PAIRS]
)
def test_view_and_message_fields_match(message: type[Message], view: type) -> None:
    # Decoding maps message fields to dataclass fields by name.
    assert [f.name for f in message.DESCRIPTOR.fields] == [f.name for f in dataclasses.fields(view)]


# --- events, stages, subscriptions ---------------------------------------------------------------
@pytest.mark.parametrize("event", list(Event), ids=[e.name for e in Event])
def test_event_round_trip(event: Event) -> None:
    value = convert.event_to_proto(event)
    assert hook_pb2.Event.Name(value) == event.name
    assert convert.event_from_proto(value) is event


@pytest.mark.parametrize("stage", PLUGIN_STAGES, ids=[s.name for s in PLUGIN_STAGES])
def test_stage_round_trip(stage: Stage) -> None:
    assert convert.stage_from_proto(convert.stage_to_proto(stage)) is stage


@pytest.mark.parametrize(
    ("decode", "value"),
    [
        (convert.event_from_proto, hook_pb2.EVENT_UNSPECIFIED),
        (convert.event_from_proto, 99),
        (convert.stage_from_proto, hook_pb2.STAGE_UNSPECIFIED),
    ],
    ids=["event-unspecified", "event-unknown", "stage-unspecified"],
)
def test_unspecified_or_unknown_enums_are_errors(decode: object, value: int) -> None:
    with pytest.raises(ValueError, match="unknown"):
        decode(value)  # type: ignore[operator]


def test_subscriptions_round_trip_in_a_stable_order() -> None:
    subs = {
        (Event.REMOVE_CONTAINER, Stage.POST),
        (Event.CREATE_CONTAINER, Stage.POST),
        (Event.CREATE_CONTAINER, Stage.PRE),
    }
    msgs = convert.subscriptions_to_proto(subs)
    assert [(m.event, m.stage) for m in msgs] == [
        (hook_pb2.CREATE_CONTAINER, hook_pb2.PRE),
        (hook_pb2.CREATE_CONTAINER, hook_pb2.POST),
        (hook_pb2.REMOVE_CONTAINER, hook_pb2.POST),
    ]
    known, unknown = convert.subscriptions_from_proto(msgs)
    assert known == subs and unknown == []


def test_unknown_subscriptions_are_set_aside() -> None:
    future = hook_pb2.Subscription(event=42, stage=hook_pb2.PRE)  # type: ignore[arg-type]
    known, unknown = convert.subscriptions_from_proto(
        [future, hook_pb2.Subscription(event=hook_pb2.START_CONTAINER, stage=hook_pb2.PRE)]
    )
    assert known == {(Event.START_CONTAINER, Stage.PRE)}
    assert unknown == [future]
