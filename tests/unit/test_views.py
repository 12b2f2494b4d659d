"""The read-only views hooks get: kubelet's CRI encodings decoded, as tables."""

from __future__ import annotations

import dataclasses
import json
from types import MappingProxyType

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.views import (
    INIT_CONTAINERS_ANNOTATION,
    SIDECAR_CONTAINERS_ANNOTATION,
    ContainerKind,
    ContainerView,
    PodView,
    QoSClass,
    ResourcesView,
    container_view_from_config,
    container_view_updated,
    cpu_request_milli_from_shares,
    pod_view_from_config,
    qos_from_cgroup_parent,
    resources_updated,
    resources_view,
)

UID = "0b0b0b0b-1111-2222-3333-444444444444"
UID_SYSTEMD = UID.replace("-", "_")  # systemd escapes the dashes of the uid
MiB = 1 << 20

# --- QoS class from the sandbox cgroup parent ----------------------------------------------

QOS_CASES = [
    ("cgroupfs-guaranteed", f"/kubepods/pod{UID}", QoSClass.GUARANTEED),
    ("cgroupfs-guaranteed-trailing-slash", f"/kubepods/pod{UID}/", QoSClass.GUARANTEED),
    ("cgroupfs-burstable", f"/kubepods/burstable/pod{UID}", QoSClass.BURSTABLE),
    ("cgroupfs-besteffort", f"/kubepods/besteffort/pod{UID}", QoSClass.BEST_EFFORT),
    (
        "systemd-burstable",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice",
        QoSClass.BURSTABLE,
    ),
    (
        "systemd-besteffort-full",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice",
        QoSClass.BEST_EFFORT,
    ),
    (
        "systemd-besteffort-leaf",
        f"kubepods-besteffort-pod{UID_SYSTEMD}.slice",
        QoSClass.BEST_EFFORT,
    ),
    ("systemd-guaranteed-leaf", f"kubepods-pod{UID_SYSTEMD}.slice", QoSClass.GUARANTEED),
    (
        "systemd-guaranteed-full",
        f"/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice",
        QoSClass.GUARANTEED,
    ),
    ("custom-root-burstable", "/custom/kubepods/burstable/podX", QoSClass.BURSTABLE),
    ("custom-root-guaranteed", f"/custom/kubepods/pod{UID}", QoSClass.GUARANTEED),
    ("non-kubelet", "/k8s.io/abc", QoSClass.UNKNOWN),
    ("empty", "", QoSClass.UNKNOWN),
    ("kubepods-root-only", "/kubepods", QoSClass.UNKNOWN),
]


@pytest.mark.parametrize(
    ("parent", "expected"), [c[1:] for c in QOS_CASES], ids=[c[0] for c in QOS_CASES]
)
def test_qos_from_cgroup_parent(parent: str, expected: QoSClass) -> None:
    assert qos_from_cgroup_parent(parent) is expected


# --- CPU request from cpu.shares -----------------------------------------------------------


def kubelet_shares(milli: int) -> int:
    return max(2, milli * 1024 // 1000)


def test_cpu_request_inverts_kubelet_shares_for_every_request() -> None:
    wrong = {
        milli: cpu_request_milli_from_shares(kubelet_shares(milli))
        for milli in range(3, 64001)
        if cpu_request_milli_from_shares(kubelet_shares(milli)) != milli
    }
    assert wrong == {}


SHARES_CASES = [
    ("floor-2", 2, 0),
    ("below-floor-1", 1, 0),
    ("unset-0", 0, None),
    ("one-cpu", 1024, 1000),
    ("two-cpus", 2048, 2000),
    ("250m", 256, 250),
]


@pytest.mark.parametrize(
    ("shares", "expected"), [c[1:] for c in SHARES_CASES], ids=[c[0] for c in SHARES_CASES]
)
def test_cpu_request_from_shares_table(shares: int, expected: int | None) -> None:
    assert cpu_request_milli_from_shares(shares) == expected


# --- resources view on LinuxContainerResources as kubelet fills them -----------------------


def res(**kw: int) -> api_pb2.LinuxContainerResources:
    return api_pb2.LinuxContainerResources(**kw)


RESOURCES_CASES = [
    (
        "guaranteed-2-cpus",
        res(
            cpu_shares=2048,
            cpu_quota=200000,
            cpu_period=100000,
            memory_limit_in_bytes=64 * MiB,
            oom_score_adj=-997,
        ),
        QoSClass.GUARANTEED,
        dict(
            cpu_request_milli=2000,
            cpu_limit_milli=2000,
            integer_cpus=2,
            memory_limit_bytes=64 * MiB,
            oom_score_adj=-997,
        ),
    ),
    (
        "guaranteed-1500m-not-integer",
        res(cpu_shares=1536, cpu_quota=150000, cpu_period=100000, memory_limit_in_bytes=MiB),
        QoSClass.GUARANTEED,
        dict(cpu_request_milli=1500, cpu_limit_milli=1500, integer_cpus=None),
    ),
    (
        "burstable-250m-500m",
        res(cpu_shares=256, cpu_quota=50000, cpu_period=100000, oom_score_adj=996),
        QoSClass.BURSTABLE,
        dict(
            cpu_request_milli=250,
            cpu_limit_milli=500,
            integer_cpus=None,
            memory_limit_bytes=None,
            oom_score_adj=996,
        ),
    ),
    (
        "burstable-whole-cpus-not-integer",
        res(cpu_shares=2048, cpu_period=100000),
        QoSClass.BURSTABLE,
        dict(cpu_request_milli=2000, cpu_limit_milli=None, integer_cpus=None),
    ),
    (
        "besteffort",
        res(cpu_shares=2, cpu_period=100000, oom_score_adj=1000),
        QoSClass.BEST_EFFORT,
        dict(
            cpu_request_milli=0,
            cpu_limit_milli=None,
            integer_cpus=None,
            memory_limit_bytes=None,
            oom_score_adj=1000,
            cpu_shares=2,
            cpu_quota=None,
            cpu_period=100000,
        ),
    ),
    (
        "quota-minus-1-no-limit",
        res(cpu_shares=1024, cpu_quota=-1, cpu_period=100000),
        QoSClass.BURSTABLE,
        dict(cpu_request_milli=1000, cpu_limit_milli=None, cpu_quota=-1),
    ),
    (
        "memory-limit",
        res(cpu_shares=2, memory_limit_in_bytes=128 * MiB),
        QoSClass.BURSTABLE,
        dict(memory_limit_bytes=128 * MiB),
    ),
    (
        "oom-score-adj-passes-through",
        res(cpu_shares=2, oom_score_adj=-42),
        QoSClass.BURSTABLE,
        dict(oom_score_adj=-42),
    ),
    (
        "cpuset-and-hugepages",
        api_pb2.LinuxContainerResources(
            cpuset_cpus="2-3",
            cpuset_mems="0",
            hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=4 * MiB)],
        ),
        QoSClass.GUARANTEED,
        dict(cpuset_cpus="2-3", cpuset_mems="0", hugepage_limits={"2MB": 4 * MiB}),
    ),
]


@pytest.mark.parametrize(
    ("linux", "qos", "expected"),
    [c[1:] for c in RESOURCES_CASES],
    ids=[c[0] for c in RESOURCES_CASES],
)
def test_resources_view(
    linux: api_pb2.LinuxContainerResources, qos: QoSClass, expected: dict[str, object]
) -> None:
    view = resources_view(linux, qos)
    assert view.qos_class is qos
    got = {name: getattr(view, name) for name in expected}
    if "hugepage_limits" in got:
        got["hugepage_limits"] = dict(view.hugepage_limits)
    assert got == expected


def test_resources_view_without_resources_is_all_unset() -> None:
    assert resources_view(None, QoSClass.BURSTABLE) == ResourcesView(qos_class=QoSClass.BURSTABLE)


def test_resources_view_is_frozen_and_read_only() -> None:
    view = resources_view(
        api_pb2.LinuxContainerResources(
            hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=1)]
        ),
        QoSClass.GUARANTEED,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.cpu_shares = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.hugepage_limits["2MB"] = 2  # type: ignore[index]


# --- an UpdateContainerResources applied as containerd applies it ---------------------------

# A Guaranteed 2-CPU container with 1 GiB, pinned, as crihook's store records it at creation.
CREATED = resources_view(
    api_pb2.LinuxContainerResources(
        cpu_shares=2048,
        cpu_quota=-1,
        cpu_period=100_000,
        memory_limit_in_bytes=1024 * MiB,
        oom_score_adj=-997,
        cpuset_cpus="2-3",
        cpuset_mems="0",
        hugepage_limits=[
            api_pb2.HugepageLimit(page_size="2MB", limit=0),
            api_pb2.HugepageLimit(page_size="1GB", limit=0),
        ],
    ),
    QoSClass.GUARANTEED,
)

UPDATES = [
    pytest.param(
        api_pb2.LinuxContainerResources(cpuset_cpus="1"),
        dict(cpuset_cpus="1"),
        id="static-cpu-manager-sends-only-a-cpuset",
    ),
    pytest.param(
        api_pb2.LinuxContainerResources(cpu_shares=4),
        dict(cpu_shares=4, cpu_request_milli=4, integer_cpus=None),
        id="crictl-update-cpu-share",
    ),
    pytest.param(
        api_pb2.LinuxContainerResources(
            cpu_shares=3072,
            cpu_period=100_000,
            memory_limit_in_bytes=2048 * MiB,
            oom_score_adj=-997,
            hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=4 * MiB)],
        ),
        dict(
            cpu_shares=3072,
            cpu_request_milli=3000,
            integer_cpus=3,
            memory_limit_bytes=2048 * MiB,
            hugepage_limits=MappingProxyType({"2MB": 4 * MiB, "1GB": 0}),
        ),
        id="kubelets-resize-quota-0-kept-hugepages-per-size",
    ),
    pytest.param(
        api_pb2.LinuxContainerResources(oom_score_adj=500, cpu_quota=150_000),
        dict(cpu_quota=150_000, cpu_limit_milli=1500),
        id="oom-score-adj-ignored",
    ),
    pytest.param(api_pb2.LinuxContainerResources(), {}, id="nothing-set-changes-nothing"),
]


@pytest.mark.parametrize(("linux", "changed"), UPDATES)
def test_resources_updated_changes_only_what_containerd_changes(
    linux: api_pb2.LinuxContainerResources, changed: dict[str, object]
) -> None:
    """containerd's WithResources (1.6 and 2.x): a 0 or "" leaves the field, hugepage limits
    are added per page size, oom_score_adj is never read on update."""
    assert resources_updated(CREATED, linux) == dataclasses.replace(CREATED, **changed)


# --- pod and container views from real CRI messages ----------------------------------------


def sandbox_config(
    cgroup_parent: str = f"/kubepods/burstable/pod{UID}",
    annotations: dict[str, str] | None = None,
    resources: api_pb2.LinuxContainerResources | None = None,
) -> api_pb2.PodSandboxConfig:
    config = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="web", uid=UID, namespace="shop", attempt=2),
        labels={"app": "web", "io.kubernetes.pod.uid": UID},
        annotations=annotations or {},
        linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent),
    )
    if resources is not None:
        config.linux.resources.CopyFrom(resources)
    return config


def container_config(name: str = "app") -> api_pb2.ContainerConfig:
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=name, attempt=3),
        image=api_pb2.ImageSpec(image="sha256:abc", user_specified_image="busybox"),
        labels={"io.kubernetes.container.name": name},
        annotations={"io.kubernetes.container.restartCount": "3"},
        linux=api_pb2.LinuxContainerConfig(
            resources=api_pb2.LinuxContainerResources(
                cpu_shares=256, cpu_quota=50000, cpu_period=100000, oom_score_adj=996
            )
        ),
    )


def test_pod_view_from_config() -> None:
    config = sandbox_config(annotations={"a": "1"})
    view = pod_view_from_config("sb1", config, "runc")
    assert view == PodView(
        id="sb1",
        uid=UID,
        name="web",
        namespace="shop",
        attempt=2,
        labels={"app": "web", "io.kubernetes.pod.uid": UID},
        annotations={"a": "1"},
        cgroup_parent=f"/kubepods/burstable/pod{UID}",
        runtime_handler="runc",
        qos_class=QoSClass.BURSTABLE,
        resources=None,
    )


def test_pod_view_carries_pod_resources_when_kubelet_sends_them() -> None:
    pod_res = api_pb2.LinuxContainerResources(
        cpu_shares=2048, cpu_quota=200000, cpu_period=100000, memory_limit_in_bytes=64 * MiB
    )
    view = pod_view_from_config("sb1", sandbox_config(f"/kubepods/pod{UID}", resources=pod_res))
    assert view.resources is not None
    assert (view.resources.cpu_request_milli, view.resources.cpu_limit_milli) == (2000, 2000)
    assert view.resources.memory_limit_bytes == 64 * MiB


def test_pod_view_maps_are_read_only_copies() -> None:
    config = sandbox_config(annotations={"a": "1"})
    view = pod_view_from_config("sb1", config)
    with pytest.raises(TypeError):
        view.labels["app"] = "evil"  # type: ignore[index]
    with pytest.raises(TypeError):
        view.annotations["b"] = "2"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.name = "other"  # type: ignore[misc]
    config.labels["app"] = "changed-later"
    assert view.labels["app"] == "web"


def test_container_view_from_config() -> None:
    pod = pod_view_from_config("sb1", sandbox_config())
    view = container_view_from_config("c1", pod, container_config())
    assert (view.id, view.pod_id, view.name, view.attempt, view.image) == (
        "c1",
        "sb1",
        "app",
        3,
        "sha256:abc",
    )
    assert dict(view.labels) == {"io.kubernetes.container.name": "app"}
    assert dict(view.annotations) == {"io.kubernetes.container.restartCount": "3"}
    assert view.resources.qos_class is QoSClass.BURSTABLE
    assert (view.resources.cpu_request_milli, view.resources.cpu_limit_milli) == (250, 500)
    assert view.kind is ContainerKind.UNKNOWN
    with pytest.raises(TypeError):
        view.labels["x"] = "y"  # type: ignore[index]


def test_cdi_devices_are_in_the_view_in_order() -> None:
    pod = pod_view_from_config("sb1", sandbox_config())
    config = container_config()
    config.CDI_devices.add(name="nvidia.com/gpu=1")
    config.CDI_devices.add(name="nvidia.com/gpu=0")
    view = container_view_from_config("c1", pod, config)
    assert view.cdi_devices == ("nvidia.com/gpu=1", "nvidia.com/gpu=0")
    assert ContainerView.from_dict(view.to_dict()) == view
    config.CDI_devices.add(name="vendor.com/net=eth1")  # a hook added one
    updated = container_view_updated(
        view, "c1", config, labels=False, annotations=False, resources=False, cdi_devices=True
    )
    assert updated.cdi_devices[-1] == "vendor.com/net=eth1"


@pytest.mark.parametrize("changed", [False, True], ids=["nothing-changed", "all-changed"])
def test_the_updated_view_is_the_view_of_the_adjusted_config(changed: bool) -> None:
    # Every field, so a field added to ContainerView and not carried over fails here.
    assert [f.name for f in dataclasses.fields(ContainerView)] == [
        "id", "pod_id", "name", "attempt", "image", "labels", "annotations", "kind",
        "resources", "cdi_devices",
    ]  # fmt: skip
    pod = pod_view_from_config("sb1", sandbox_config())
    pod = dataclasses.replace(pod, annotations={"crihook.io/init-containers": "app"})
    config = container_config()
    config.image.image = "busybox"
    config.metadata.attempt = 2
    config.CDI_devices.add(name="nvidia.com/gpu=1")
    config.linux.resources.hugepage_limits.add(page_size="2MB", limit=1 << 21)
    before = container_view_from_config("", pod, config)
    if changed:  # what hooks may change
        config.labels["l"] = "1"
        config.annotations["a"] = "1"
        config.linux.resources.cpu_shares = 4096
        config.linux.resources.hugepage_limits[0].limit = 1 << 22
        config.CDI_devices.add(name="vendor.com/net=eth1")
    updated = container_view_updated(
        before,
        "c1",
        config,
        labels=changed,
        annotations=changed,
        resources=changed,
        cdi_devices=changed,
    )
    expected = container_view_from_config("c1", pod, config) if changed else before
    assert updated == dataclasses.replace(expected, id="c1")
    assert updated.kind is ContainerKind.INIT and updated.attempt == 2


def test_guaranteed_whole_cpu_container_in_cgroupfs_pod_has_integer_cpus() -> None:
    # kubelet's cgroupfs driver: a Guaranteed pod sits at /kubepods/pod<uid with dashes>.
    pod = pod_view_from_config("sb1", sandbox_config(f"/kubepods/pod{UID}"))
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="app"),
        linux=api_pb2.LinuxContainerConfig(
            resources=api_pb2.LinuxContainerResources(
                cpu_shares=2048, cpu_quota=200000, cpu_period=100000, oom_score_adj=-997
            )
        ),
    )
    view = container_view_from_config("c1", pod, config)
    assert (view.resources.qos_class, view.resources.integer_cpus) == (QoSClass.GUARANTEED, 2)


def test_container_view_without_linux_resources() -> None:
    pod = pod_view_from_config("sb1", sandbox_config(f"/kubepods/besteffort/pod{UID}"))
    config = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app"))
    view = container_view_from_config("c1", pod, config)
    assert view.resources == ResourcesView(qos_class=QoSClass.BEST_EFFORT)


BOTH = {INIT_CONTAINERS_ANNOTATION: "setup, migrate", SIDECAR_CONTAINERS_ANNOTATION: "proxy"}
KIND_CASES = [
    ("init", BOTH, "setup", ContainerKind.INIT),
    ("init-with-spaces", BOTH, "migrate", ContainerKind.INIT),
    ("sidecar", BOTH, "proxy", ContainerKind.SIDECAR),
    ("app-when-annotated", BOTH, "app", ContainerKind.APP),
    (
        "app-when-only-sidecars-annotated",
        {SIDECAR_CONTAINERS_ANNOTATION: "proxy"},
        "app",
        ContainerKind.APP,
    ),
    (
        "app-when-only-init-annotated",
        {INIT_CONTAINERS_ANNOTATION: "setup"},
        "app",
        ContainerKind.APP,
    ),
    (
        "sidecar-also-listed-as-init",
        {INIT_CONTAINERS_ANNOTATION: "setup,proxy", SIDECAR_CONTAINERS_ANNOTATION: "proxy"},
        "proxy",
        ContainerKind.SIDECAR,
    ),
    ("unknown-without-annotations", {}, "app", ContainerKind.UNKNOWN),
    ("no-prefix-match", {INIT_CONTAINERS_ANNOTATION: "setup-db"}, "setup", ContainerKind.APP),
]


@pytest.mark.parametrize(
    ("annotations", "name", "expected"),
    [c[1:] for c in KIND_CASES],
    ids=[c[0] for c in KIND_CASES],
)
def test_container_kind_from_pod_annotations(
    annotations: dict[str, str], name: str, expected: ContainerKind
) -> None:
    pod = pod_view_from_config("sb1", sandbox_config(annotations=annotations))
    assert container_view_from_config("c1", pod, container_config(name)).kind is expected


# --- persistence round trips -----------------------------------------------------------------


def json_round_trip(doc: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = json.loads(json.dumps(doc))
    return out


POD_WITH_RESOURCES = pod_view_from_config(
    "sb1",
    sandbox_config(
        f"/kubepods/pod{UID}",
        annotations={INIT_CONTAINERS_ANNOTATION: "setup"},
        resources=api_pb2.LinuxContainerResources(
            cpu_shares=2048,
            cpu_quota=200000,
            cpu_period=100000,
            hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=4 * MiB)],
        ),
    ),
    "kata",
)
POD_PLAIN = pod_view_from_config("sb2", sandbox_config())
ROUND_TRIP_CASES = [
    ("pod-with-resources", POD_WITH_RESOURCES),
    ("pod-without-resources", POD_PLAIN),
    (
        "container-init",
        container_view_from_config("c1", POD_WITH_RESOURCES, container_config("setup")),
    ),
    ("container-plain", container_view_from_config("c2", POD_PLAIN, container_config())),
    ("resources", POD_WITH_RESOURCES.resources),
    ("resources-empty", ResourcesView()),
]


@pytest.mark.parametrize(
    "view", [c[1] for c in ROUND_TRIP_CASES], ids=[c[0] for c in ROUND_TRIP_CASES]
)
def test_to_dict_from_dict_round_trip(view: PodView | ContainerView | ResourcesView) -> None:
    back = type(view).from_dict(json_round_trip(view.to_dict()))
    assert back == view
    assert isinstance(back, type(view))


def test_from_dict_keeps_maps_read_only() -> None:
    back = PodView.from_dict(json_round_trip(POD_WITH_RESOURCES.to_dict()))
    assert isinstance(back.labels, MappingProxyType)
    assert back.resources is not None
    with pytest.raises(TypeError):
        back.resources.hugepage_limits["1GB"] = 1  # type: ignore[index]
