"""How kubelet encodes a pod into CRI messages: pure functions, no I/O.

The rules follow kubelet's code (``pkg/apis/core/v1/helper/qos`` for the QoS class,
``pkg/kubelet/cm`` for shares and quota, ``pkg/kubelet/qos/policy.go`` for the OOM score,
``pkg/kubelet/kuberuntime`` for the sandbox and container configs). Only what a lab pod
can carry is modelled; what is left out is listed in :func:`container_config`.

Resources use kubelet-internal units: CPU in milli-CPU, memory in bytes. ``None`` means
"not set" (which differs from 0 for the QoS rules).
"""

from __future__ import annotations

import enum
import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field

from crihook.api.cri.v1 import api_pb2
from tests.lab.images import BUSYBOX_REF

__all__ = [
    "BESTEFFORT_OOM_SCORE_ADJ",
    "DEFAULT_CGROUP_ROOT",
    "GUARANTEED_OOM_SCORE_ADJ",
    "QUOTA_PERIOD",
    "ContainerSpec",
    "Device",
    "Mount",
    "PodSpec",
    "QOSClass",
    "cgroup_parent",
    "container_annotations",
    "container_config",
    "container_hash",
    "container_labels",
    "cpu_manager_update",
    "effective_requests",
    "linux_resources",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "one_container_pod",
    "oom_score_adj",
    "pod_log_directory",
    "qos_class",
    "resize_update",
    "sandbox_config",
    "sandbox_labels",
    "sandbox_resources",
]

DEFAULT_CGROUP_ROOT = "/kubepods"
QUOTA_PERIOD = 100_000  # µs, kubelet's default cpuCFSQuotaPeriod
MIN_QUOTA_PERIOD = 1_000
MIN_SHARES = 2
MAX_SHARES = 262_144
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000

# kubelet's default ProcMount masks (pkg/securitycontext/util.go).
DEFAULT_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class QOSClass(enum.StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    readonly: bool = False
    propagation: int = api_pb2.PROPAGATION_PRIVATE


@dataclass(frozen=True)
class Device:
    host_path: str
    container_path: str
    permissions: str = "rwm"


@dataclass
class ContainerSpec:
    """One container of a pod, as a Kubernetes user would write it."""

    name: str
    image: str = BUSYBOX_REF
    command: list[str] = field(default_factory=lambda: ["sleep", "3600"])
    args: list[str] = field(default_factory=list)
    env: list[tuple[str, str | bytes]] = field(default_factory=list)
    working_dir: str = ""
    cpu_request: int | None = None  # milli-CPU
    cpu_limit: int | None = None  # milli-CPU
    memory_request: int | None = None  # bytes
    memory_limit: int | None = None  # bytes
    devices: list[Device] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class PodSpec:
    """A pod as kubelet sees it after API defaulting; ``uid`` is generated when omitted."""

    name: str
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    host_network: bool = True
    containers: list[ContainerSpec] = field(default_factory=list)
    init_containers: list[ContainerSpec] = field(default_factory=list)
    runtime_handler: str = ""
    termination_grace_period: int = 30  # seconds
    attempt: int = 0  # sandbox attempt (kubelet bumps it when it recreates the sandbox)


def one_container_pod(
    name: str, guaranteed: bool = False, env_bytes: int = 0
) -> tuple[PodSpec, ContainerSpec]:
    """The scale benches' pod: one container `app` with 64 MiB, Guaranteed with one whole
    CPU or Burstable with a 100m request; `env_bytes` of padding in one env var."""
    cpu = 1000 if guaranteed else None
    container = ContainerSpec(
        name="app",
        cpu_request=cpu or 100,
        cpu_limit=cpu,
        memory_request=64 << 20,
        memory_limit=64 << 20 if guaranteed else None,
        env=[("PAD", "x" * env_bytes)] if env_bytes else [],
    )
    return PodSpec(name=name, containers=[container]), container


# -- resources -----------------------------------------------------------------------------


def effective_requests(container: ContainerSpec) -> tuple[int | None, int | None]:
    """(cpu, memory) requests after API defaulting: a missing request defaults to the limit."""
    cpu = container.cpu_request if container.cpu_request is not None else container.cpu_limit
    mem = (
        container.memory_request if container.memory_request is not None else container.memory_limit
    )
    return cpu, mem


def qos_class(spec: PodSpec) -> QOSClass:
    """The pod QoS class, computed over app and init containers as Kubernetes does."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in [*spec.containers, *spec.init_containers]:
        cpu_req, mem_req = effective_requests(c)
        for name, value in (("cpu", cpu_req), ("memory", mem_req)):
            if value:  # zero quantities do not count
                requests[name] = requests.get(name, 0) + value
        found = set()
        for name, value in (("cpu", c.cpu_limit), ("memory", c.memory_limit)):
            if value:
                found.add(name)
                limits[name] = limits.get(name, 0) + value
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return QOSClass.BEST_EFFORT
    # Pod-wide sums of requests must equal the sums of limits for every resource.
    if guaranteed and requests == limits:
        return QOSClass.GUARANTEED
    return QOSClass.BURSTABLE


def cgroup_parent(spec: PodSpec, root: str = DEFAULT_CGROUP_ROOT) -> str:
    """The cgroupfs-driver parent kubelet sends: <root>[/burstable|/besteffort]/pod<uid>."""
    base = "/" + root.strip("/") if root.strip("/") else ""
    qos = qos_class(spec)
    if qos is QOSClass.GUARANTEED:
        return f"{base}/pod{spec.uid}"
    tier = "burstable" if qos is QOSClass.BURSTABLE else "besteffort"
    return f"{base}/{tier}/pod{spec.uid}"


def milli_cpu_to_shares(milli_cpu: int) -> int:
    """cpu.shares for a CPU request (0 or unset gives the minimum, 2)."""
    if milli_cpu == 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli_cpu * 1024 // 1000))


def milli_cpu_to_quota(milli_cpu: int, period: int = QUOTA_PERIOD) -> int:
    """CFS quota for a CPU limit; 0 (no quota) when there is no limit."""
    if milli_cpu == 0:
        return 0
    return max(MIN_QUOTA_PERIOD, milli_cpu * period // 1000)


def oom_score_adj(qos: QOSClass, memory_request: int | None, node_memory: int) -> int:
    """kubelet's per-container oom_score_adj (pkg/kubelet/qos/policy.go).

    Guaranteed -997, BestEffort 1000. Burstable: 1000 - 1000*request/capacity, at least
    1000 + (-997) = 3 (so it stays above any Guaranteed process) and at most 999 (so it
    stays below BestEffort). Critical pods (also -997) are not modelled.
    """
    if qos is QOSClass.GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos is QOSClass.BEST_EFFORT:
        return BESTEFFORT_OOM_SCORE_ADJ
    score = 1000 - (1000 * (memory_request or 0)) // node_memory
    if score < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if score == BESTEFFORT_OOM_SCORE_ADJ:
        return score - 1
    return score


def _cpu_memory_resources(
    cpu_request: int | None, cpu_limit: int | None, memory_limit: int | None
) -> api_pb2.LinuxContainerResources:
    # kubelet's calculateLinuxResources with the CFS quota enabled (the default): the
    # period is always sent; the quota is 0 (none) without a CPU limit.
    shares_from = cpu_request if cpu_request is not None else (cpu_limit or 0)
    return api_pb2.LinuxContainerResources(
        cpu_shares=milli_cpu_to_shares(shares_from),
        cpu_period=QUOTA_PERIOD,
        cpu_quota=milli_cpu_to_quota(cpu_limit or 0),
        memory_limit_in_bytes=memory_limit or 0,
    )


def linux_resources(
    container: ContainerSpec, qos: QOSClass, node_memory: int, *, no_swap: bool = True
) -> api_pb2.LinuxContainerResources:
    """The container's LinuxContainerResources as kubelet sends them on CreateContainer.

    ``no_swap``: kubelet's default NoSwap behaviour on cgroup v1 with a memsw controller
    sets memory_swap_limit_in_bytes equal to the memory limit.
    """
    cpu_req, mem_req = effective_requests(container)
    res = _cpu_memory_resources(cpu_req, container.cpu_limit, container.memory_limit)
    res.oom_score_adj = oom_score_adj(qos, mem_req, node_memory)
    if no_swap:
        res.memory_swap_limit_in_bytes = res.memory_limit_in_bytes
    return res


def sandbox_resources(spec: PodSpec) -> api_pb2.LinuxContainerResources:
    """Pod-level resources kubelet puts on PodSandboxConfig.linux.resources.

    Requests and limits per resource are the sum over app containers, raised to any single
    init container's value when that is larger (init containers run one at a time).
    """

    def pod_total(values: list[int | None], init_values: list[int | None]) -> int | None:
        present = [v for v in values if v is not None]
        total = sum(present) if present else None
        for v in init_values:
            if v is not None and (total is None or v > total):
                total = v
        return total

    reqs = [effective_requests(c) for c in spec.containers]
    init_reqs = [effective_requests(c) for c in spec.init_containers]
    cpu_req = pod_total([r[0] for r in reqs], [r[0] for r in init_reqs])
    cpu_lim = pod_total(
        [c.cpu_limit for c in spec.containers], [c.cpu_limit for c in spec.init_containers]
    )
    mem_lim = pod_total(
        [c.memory_limit for c in spec.containers], [c.memory_limit for c in spec.init_containers]
    )
    return _cpu_memory_resources(cpu_req, cpu_lim, mem_lim)


# -- labels and annotations ------------------------------------------------------------------


def sandbox_labels(spec: PodSpec) -> dict[str, str]:
    return {
        **spec.labels,
        "io.kubernetes.pod.name": spec.name,
        "io.kubernetes.pod.namespace": spec.namespace,
        "io.kubernetes.pod.uid": spec.uid,
    }


def container_labels(spec: PodSpec, container: ContainerSpec) -> dict[str, str]:
    return {
        **container.labels,
        "io.kubernetes.container.name": container.name,
        "io.kubernetes.pod.name": spec.name,
        "io.kubernetes.pod.namespace": spec.namespace,
        "io.kubernetes.pod.uid": spec.uid,
    }


def container_hash(container: ContainerSpec) -> str:
    """A stable hex hash of the container spec (kubelet hashes its own v1.Container)."""
    blob = json.dumps(asdict(container), sort_keys=True, default=repr).encode()
    return format(int.from_bytes(hashlib.sha256(blob).digest()[:4], "big"), "x")


def container_annotations(
    spec: PodSpec, container: ContainerSpec, restart_count: int = 0
) -> dict[str, str]:
    return {
        **container.annotations,
        "io.kubernetes.container.hash": container_hash(container),
        "io.kubernetes.container.restartCount": str(restart_count),
        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.pod.terminationGracePeriod": str(spec.termination_grace_period),
    }


# -- whole messages --------------------------------------------------------------------------


def pod_log_directory(spec: PodSpec, log_root: str) -> str:
    """kubelet's /var/log/pods/<namespace>_<name>_<uid>, under ``log_root``."""
    return f"{log_root.rstrip('/')}/{spec.namespace}_{spec.name}_{spec.uid}"


def _namespace_options(spec: PodSpec) -> api_pb2.NamespaceOption:
    # hostNetwork -> NODE; no hostPID/shareProcessNamespace -> PID per container; IPC per pod.
    return api_pb2.NamespaceOption(
        network=api_pb2.NODE if spec.host_network else api_pb2.POD,
        pid=api_pb2.CONTAINER,
        ipc=api_pb2.POD,
    )


def sandbox_config(
    spec: PodSpec, *, cgroup_root: str = DEFAULT_CGROUP_ROOT, log_root: str | None = None
) -> api_pb2.PodSandboxConfig:
    """The PodSandboxConfig kubelet sends on RunPodSandbox (and again on CreateContainer)."""
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(
            name=spec.name, uid=spec.uid, namespace=spec.namespace, attempt=spec.attempt
        ),
        # kubelet sets a hostname only for pods on the pod network.
        hostname="" if spec.host_network else spec.name,
        log_directory=pod_log_directory(spec, log_root) if log_root else "",
        labels=sandbox_labels(spec),
        annotations=dict(spec.annotations),
        linux=api_pb2.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent(spec, cgroup_root),
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=_namespace_options(spec),
                # kubelet forces runtime/default seccomp on the sandbox (kubernetes#84623).
                seccomp=api_pb2.SecurityProfile(
                    profile_type=api_pb2.SecurityProfile.RuntimeDefault
                ),
            ),
            # kubelet sends an empty overhead when the pod has none.
            overhead=api_pb2.LinuxContainerResources(),
            resources=sandbox_resources(spec),
        ),
    )


def container_config(
    spec: PodSpec,
    container: ContainerSpec,
    *,
    node_memory: int,
    image_ref: str | None = None,
    restart_count: int = 0,
    no_swap: bool = True,
) -> api_pb2.ContainerConfig:
    """The ContainerConfig kubelet sends on CreateContainer.

    ``image_ref`` is what kubelet puts in ImageSpec.image: the image id from ImageStatus
    (defaults to the reference itself). Not modelled: the /etc/hosts and
    /dev/termination-log mounts (they need kubelet's pod directory), service environment
    variables, volumes, hugepage limits, ports and lifecycle hooks.
    """
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=container.name, attempt=restart_count),
        image=api_pb2.ImageSpec(
            image=image_ref or container.image, user_specified_image=container.image
        ),
        command=list(container.command),
        args=list(container.args),
        working_dir=container.working_dir,
        envs=[
            api_pb2.KeyValue(key=k, value=v.encode() if isinstance(v, str) else v)
            for k, v in container.env
        ],
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path,
                host_path=m.host_path,
                readonly=m.readonly,
                propagation=m.propagation,
            )
            for m in container.mounts
        ],
        devices=[
            api_pb2.Device(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in container.devices
        ],
        labels=container_labels(spec, container),
        annotations=container_annotations(spec, container, restart_count),
        log_path=f"{container.name}/{restart_count}.log",
        linux=api_pb2.LinuxContainerConfig(
            resources=linux_resources(container, qos_class(spec), node_memory, no_swap=no_swap),
            security_context=api_pb2.LinuxContainerSecurityContext(
                namespace_options=_namespace_options(spec),
                # The image names no user, so kubelet runs the container as uid 0.
                run_as_user=api_pb2.Int64Value(value=0),
                # seccompDefault is off in kubelet's default config: Unconfined.
                seccomp=api_pb2.SecurityProfile(profile_type=api_pb2.SecurityProfile.Unconfined),
                masked_paths=list(DEFAULT_MASKED_PATHS),
                readonly_paths=list(DEFAULT_READONLY_PATHS),
            ),
        ),
    )


def burstable_pod(name: str) -> PodSpec:
    """The integration tests' usual pod: one busybox `app`, 250m/500m CPU, 32/64 MiB."""
    mib = 1024 * 1024
    app = ContainerSpec(
        name="app", cpu_request=250, cpu_limit=500, memory_request=32 * mib, memory_limit=64 * mib
    )
    return PodSpec(name=name, containers=[app])


# -- UpdateContainerResources ----------------------------------------------------------------


def cpu_manager_update(cpus: str) -> api_pb2.LinuxContainerResources:
    """What kubelet's static CPU manager sends, at its reconcile and whenever the shared pool
    changes: the cpuset and nothing else (``updateContainerCPUSet`` in
    pkg/kubelet/cm/cpumanager/cpu_manager_others.go, v1.37.2); every other field reads 0."""
    return api_pb2.LinuxContainerResources(cpuset_cpus=cpus)


def resize_update(
    spec: PodSpec, container: ContainerSpec, *, node_memory: int, no_swap: bool = True
) -> api_pb2.LinuxContainerResources:
    """What kubelet sends for an in-place resize to ``container``'s resources (``spec``, the
    pod as resized; a resize never changes its QoS class): the container's whole resources
    as at creation, oom_score_adj recomputed (kuberuntime ``updateContainerResources`` →
    ``generateLinuxContainerResources``, v1.37.2)."""
    return linux_resources(container, qos_class(spec), node_memory, no_swap=no_swap)
