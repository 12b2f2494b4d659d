"""Read-only views of pods, containers and their resources, as hooks see them.

CRI carries no pod spec; kubelet encodes it. The views decode it once for every hook:
- QoS class from the sandbox cgroup parent (`/kubepods/burstable/pod<uid>`,
  `kubepods-besteffort-pod<uid>.slice`; Guaranteed pods sit directly under kubepods);
- CPU request from `cpu_shares` (kubelet sends max(2, milli*1024//1000)), CPU limit from
  `cpu_quota`/`cpu_period`, memory limit from `memory_limit_in_bytes`;
- "integer CPUs": a Guaranteed container whose CPU request is whole CPUs;
- `oom_score_adj` as kubelet computed it.
Views are frozen; maps are read-only. `to_dict`/`from_dict` persist them in the store.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from crihook.api.cri.v1 import api_pb2

__all__ = [
    "ContainerKind",
    "ContainerState",
    "ContainerView",
    "PodView",
    "QoSClass",
    "ResourcesView",
    "container_state",
    "container_view_from_config",
    "container_view_updated",
    "cpu_request_milli_from_shares",
    "pod_view_from_config",
    "qos_from_cgroup_parent",
    "resources_updated",
    "resources_view",
]

# kubelet's pod annotations (set by an operator's webhook, not by kubelet) that tell crihook
# which containers are init containers or sidecars: CRI itself does not say.
INIT_CONTAINERS_ANNOTATION = "crihook.io/init-containers"
SIDECAR_CONTAINERS_ANNOTATION = "crihook.io/sidecar-containers"

_EMPTY: Mapping[str, str] = MappingProxyType({})
_NO_HUGEPAGES: Mapping[str, int] = MappingProxyType({})


class QoSClass(enum.Enum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"
    UNKNOWN = "Unknown"  # the cgroup parent is not kubelet's (no `kubepods` in it)


class ContainerKind(enum.Enum):
    INIT = "init"
    SIDECAR = "sidecar"
    APP = "app"
    UNKNOWN = "unknown"  # CRI does not say, and the pod carries no crihook.io annotation


class ContainerState(enum.Enum):
    """A container's state as the runtime reports it (CRI ContainerState)."""

    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


_CRI_STATES: dict[int, ContainerState] = {
    api_pb2.CONTAINER_CREATED: ContainerState.CREATED,
    api_pb2.CONTAINER_RUNNING: ContainerState.RUNNING,
    api_pb2.CONTAINER_EXITED: ContainerState.EXITED,
}


def container_state(cri_state: int) -> ContainerState:
    """The CRI ContainerState enum value as a ContainerState."""
    return _CRI_STATES.get(cri_state, ContainerState.UNKNOWN)


def _ro(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    # A comprehension: dict() of a protobuf map goes through collections.abc's Python views.
    return MappingProxyType({k: mapping[k] for k in mapping}) if mapping else _EMPTY


@dataclass(frozen=True)
class ResourcesView:
    """Resources as kubelet encoded them, decoded once. None means "not set"."""

    qos_class: QoSClass = QoSClass.UNKNOWN
    cpu_request_milli: int | None = None
    cpu_limit_milli: int | None = None
    memory_limit_bytes: int | None = None
    integer_cpus: int | None = None
    oom_score_adj: int | None = None
    cpu_shares: int | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    hugepage_limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        doc = {name: getattr(self, name) for name in _RESOURCE_FIELDS}
        doc["qos_class"] = self.qos_class.value
        doc["hugepage_limits"] = dict(self.hugepage_limits)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ResourcesView:
        kw = dict(doc)
        kw["qos_class"] = QoSClass(kw.get("qos_class", "Unknown"))
        kw["hugepage_limits"] = MappingProxyType(dict(kw.get("hugepage_limits", {})))
        return cls(**kw)


_RESOURCE_FIELDS = tuple(f.name for f in fields(ResourcesView))
"""Its field names, found once: dataclasses.fields() walks the class on every call, and the
store encodes a record's resources whenever the record changes."""


@dataclass(frozen=True)
class PodView:
    id: str
    """Sandbox id; empty during pre-RunPodSandbox (the runtime has not made one yet)."""
    uid: str
    name: str
    namespace: str
    attempt: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    cgroup_parent: str = ""
    runtime_handler: str = ""
    qos_class: QoSClass = QoSClass.UNKNOWN
    resources: ResourcesView | None = None
    """Pod-level resources (`LinuxPodSandboxConfig.resources`), when kubelet sends them."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "uid": self.uid,
            "name": self.name,
            "namespace": self.namespace,
            "attempt": self.attempt,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "cgroup_parent": self.cgroup_parent,
            "runtime_handler": self.runtime_handler,
            "qos_class": self.qos_class.value,
            "resources": self.resources.to_dict() if self.resources else None,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PodView:
        res = doc.get("resources")
        return cls(
            id=doc["id"],
            uid=doc["uid"],
            name=doc["name"],
            namespace=doc["namespace"],
            attempt=int(doc.get("attempt", 0)),
            labels=_ro(doc.get("labels")),
            annotations=_ro(doc.get("annotations")),
            cgroup_parent=doc.get("cgroup_parent", ""),
            runtime_handler=doc.get("runtime_handler", ""),
            qos_class=QoSClass(doc.get("qos_class", "Unknown")),
            resources=ResourcesView.from_dict(res) if res else None,
        )


@dataclass(frozen=True)
class ContainerView:
    id: str
    """Container id; empty during pre-CreateContainer."""
    pod_id: str
    name: str
    attempt: int = 0
    image: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    kind: ContainerKind = ContainerKind.UNKNOWN
    resources: ResourcesView = field(default_factory=ResourcesView)
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names the container asks for (`vendor.com/class=name`):
    DRA's devices reach the runtime this way."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pod_id": self.pod_id,
            "name": self.name,
            "attempt": self.attempt,
            "image": self.image,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "kind": self.kind.value,
            "resources": self.resources.to_dict(),
            "cdi_devices": list(self.cdi_devices),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ContainerView:
        return cls(
            id=doc["id"],
            pod_id=doc["pod_id"],
            name=doc["name"],
            attempt=int(doc.get("attempt", 0)),
            image=doc.get("image", ""),
            labels=_ro(doc.get("labels")),
            annotations=_ro(doc.get("annotations")),
            kind=ContainerKind(doc.get("kind", "unknown")),
            resources=ResourcesView.from_dict(doc.get("resources", {})),
            cdi_devices=tuple(doc.get("cdi_devices", ())),
        )


# --- decoding kubelet's encodings (pure) -----------------------------------------------------

_TOKENS = re.compile(r"[/-]")


def qos_from_cgroup_parent(cgroup_parent: str) -> QoSClass:
    """The QoS class kubelet encoded in a sandbox cgroup parent (cgroupfs or systemd form)."""
    last = cgroup_parent.rstrip("/").rsplit("/", 1)[-1].removesuffix(".slice")
    tokens = [t.removesuffix(".slice") for t in _TOKENS.split(cgroup_parent) if t]
    if "kubepods" not in tokens:
        return QoSClass.UNKNOWN
    if "besteffort" in tokens:
        return QoSClass.BEST_EFFORT
    if "burstable" in tokens:
        return QoSClass.BURSTABLE
    if last.startswith("pod") or last.split("-")[-1].startswith("pod"):
        return QoSClass.GUARANTEED
    return QoSClass.UNKNOWN


def cpu_request_milli_from_shares(shares: int) -> int | None:
    """Invert kubelet's shares = max(2, milli*1024//1000); exact for every request ≥ 2m.

    shares ≤ 2 is kubelet's floor (no request, or a tiny one): reported as 0.
    """
    if shares <= 0:
        return None
    if shares <= 2:
        return 0
    return math.ceil(shares * 1000 / 1024)


def resources_view(
    linux: api_pb2.LinuxContainerResources | None, qos_class: QoSClass
) -> ResourcesView:
    """Decode LinuxContainerResources as kubelet fills them."""
    if linux is None:
        return ResourcesView(qos_class=qos_class)
    return _decoded(
        qos_class,
        shares=linux.cpu_shares,
        quota=linux.cpu_quota,
        period=linux.cpu_period,
        memory=linux.memory_limit_in_bytes,
        oom_score_adj=linux.oom_score_adj,
        cpuset_cpus=linux.cpuset_cpus,
        cpuset_mems=linux.cpuset_mems,
        hugepages=(
            MappingProxyType({h.page_size: h.limit for h in linux.hugepage_limits})
            if linux.hugepage_limits
            else _NO_HUGEPAGES
        ),
    )


def resources_updated(view: ResourcesView, linux: api_pb2.LinuxContainerResources) -> ResourcesView:
    """The resources a container runs with after an UpdateContainerResources carrying
    `linux`, field by field as containerd (1.6 and 2.x) applies one to the container's spec:
    a zero number or an empty cpuset leaves the field as it was (CRI cannot tell "unset"
    from 0: kubelet's static CPU manager sends only a cpuset, `crictl update` only what it
    is given), hugepage limits replace those of the page sizes they name, and
    oom_score_adj is ignored (it is set once, at creation)."""
    hugepages = view.hugepage_limits
    if linux.hugepage_limits:
        hugepages = MappingProxyType(
            {**hugepages, **{h.page_size: h.limit for h in linux.hugepage_limits}}
        )
    return _decoded(
        view.qos_class,
        shares=linux.cpu_shares or view.cpu_shares or 0,
        quota=linux.cpu_quota or view.cpu_quota or 0,
        period=linux.cpu_period or view.cpu_period or 0,
        memory=linux.memory_limit_in_bytes or view.memory_limit_bytes or 0,
        oom_score_adj=view.oom_score_adj,
        cpuset_cpus=linux.cpuset_cpus or view.cpuset_cpus,
        cpuset_mems=linux.cpuset_mems or view.cpuset_mems,
        hugepages=hugepages,
    )


def _decoded(
    qos_class: QoSClass,
    *,
    shares: int,
    quota: int,
    period: int,
    memory: int,
    oom_score_adj: int | None,
    cpuset_cpus: str,
    cpuset_mems: str,
    hugepages: Mapping[str, int],
) -> ResourcesView:
    request = cpu_request_milli_from_shares(shares)
    limit = None
    if quota > 0 and period > 0:
        limit = quota * 1000 // period
    integer = None
    if qos_class is QoSClass.GUARANTEED and request and request % 1000 == 0:
        integer = request // 1000
    return ResourcesView(
        qos_class=qos_class,
        cpu_request_milli=request,
        cpu_limit_milli=limit,
        memory_limit_bytes=memory or None,
        integer_cpus=integer,
        oom_score_adj=oom_score_adj,
        cpu_shares=shares or None,
        cpu_quota=quota or None,
        cpu_period=period or None,
        cpuset_cpus=cpuset_cpus,
        cpuset_mems=cpuset_mems,
        hugepage_limits=hugepages,
    )


def pod_view_from_config(
    sandbox_id: str, config: api_pb2.PodSandboxConfig, runtime_handler: str = ""
) -> PodView:
    parent = config.linux.cgroup_parent
    qos = qos_from_cgroup_parent(parent)
    has_pod_resources = config.linux.HasField("resources")
    return PodView(
        id=sandbox_id,
        uid=config.metadata.uid,
        name=config.metadata.name,
        namespace=config.metadata.namespace,
        attempt=config.metadata.attempt,
        labels=_ro(config.labels),
        annotations=_ro(config.annotations),
        cgroup_parent=parent,
        runtime_handler=runtime_handler,
        qos_class=qos,
        resources=resources_view(config.linux.resources, qos) if has_pod_resources else None,
    )


def _names(annotations: Mapping[str, str], key: str) -> set[str]:
    return {n.strip() for n in annotations.get(key, "").split(",") if n.strip()}


def container_kind(pod: PodView, name: str) -> ContainerKind:
    # A sidecar is a restartable init container: listed among the init containers too, it
    # is still a sidecar (it runs alongside the app containers).
    if name in _names(pod.annotations, SIDECAR_CONTAINERS_ANNOTATION):
        return ContainerKind.SIDECAR
    if name in _names(pod.annotations, INIT_CONTAINERS_ANNOTATION):
        return ContainerKind.INIT
    if INIT_CONTAINERS_ANNOTATION in pod.annotations or (
        SIDECAR_CONTAINERS_ANNOTATION in pod.annotations
    ):
        return ContainerKind.APP
    return ContainerKind.UNKNOWN


def container_view_from_config(
    container_id: str, pod: PodView, config: api_pb2.ContainerConfig
) -> ContainerView:
    linux = config.linux.resources if config.linux.HasField("resources") else None
    return ContainerView(
        id=container_id,
        pod_id=pod.id,
        name=config.metadata.name,
        attempt=config.metadata.attempt,
        image=config.image.image,
        labels=_ro(config.labels),
        annotations=_ro(config.annotations),
        kind=container_kind(pod, config.metadata.name),
        resources=resources_view(linux, pod.qos_class),
        cdi_devices=tuple(d.name for d in config.CDI_devices),
    )


def container_view_updated(
    view: ContainerView,
    container_id: str,
    config: api_pb2.ContainerConfig,
    *,
    labels: bool,
    annotations: bool,
    resources: bool,
    cdi_devices: bool = False,
) -> ContainerView:
    """`view`, made from `config` before hooks adjusted it, with its id set and the parts
    hooks changed decoded again: what container_view_from_config(container_id, pod, config)
    gives, without decoding what did not change. Hooks cannot change the rest of it."""
    res = view.resources
    if resources:
        linux = config.linux.resources if config.linux.HasField("resources") else None
        res = resources_view(linux, res.qos_class)
    # Built directly, not with dataclasses.replace (which looks every field up again): this
    # runs for every CreateContainer the runtime answers.
    return ContainerView(
        id=container_id,
        pod_id=view.pod_id,
        name=view.name,
        attempt=view.attempt,
        image=view.image,
        labels=_ro(config.labels) if labels else view.labels,
        annotations=_ro(config.annotations) if annotations else view.annotations,
        kind=view.kind,
        resources=res,
        cdi_devices=tuple(d.name for d in config.CDI_devices) if cdi_devices else view.cdi_devices,
    )
