"""Encoded CRI messages for the benchmark: kubelet-shaped requests and canned runtime responses.

Everything here is built once, before any timing, and handed to the load generator and the
fake runtime as bytes. Requests are built with tests.lab's kubelet encoder (the same rules
kubelet applies) plus what kubelet adds to a typical pod (service-link environment, the
usual mounts, app labels); a CreateContainerRequest comes out at ~2 KB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from crihook.api.cri.v1 import api_pb2
from tests.lab.images import BUSYBOX_REF
from tests.lab.kubelet_encoding import (
    ContainerSpec,
    Mount,
    PodSpec,
    container_config,
    sandbox_config,
)

__all__ = [
    "CREATE_CONTAINER",
    "DEVICES_CONFIG",
    "DEVICE_ANNOTATIONS",
    "LIFECYCLE_LABEL",
    "LIST_CONTAINERS",
    "LOAD_LABEL",
    "NAME_MARKER",
    "NETDEV_CONFIG",
    "NETDEV_PARENT_PREFIX",
    "RUN_POD_SANDBOX",
    "VERSION",
    "InstantRuntime",
    "bench_pod",
    "canned_responses",
    "create_container_request",
    "fake_create_container_request",
    "for_pod",
    "kubelet_create_container_request",
    "kubelet_run_pod_sandbox_request",
    "lifecycle_pod",
    "list_containers_request",
    "mount_sources",
    "runtime_methods",
]

RUNTIME_SERVICE = "runtime.v1.RuntimeService"
VERSION = f"/{RUNTIME_SERVICE}/Version"
LIST_CONTAINERS = f"/{RUNTIME_SERVICE}/ListContainers"
CREATE_CONTAINER = f"/{RUNTIME_SERVICE}/CreateContainer"
LIST_POD_SANDBOX = f"/{RUNTIME_SERVICE}/ListPodSandbox"
RUN_POD_SANDBOX = f"/{RUNTIME_SERVICE}/RunPodSandbox"

# Replaced by the load generator with a zero-padded counter, so every CreateContainer has its
# own container name (same width: no length prefix changes).
NAME_MARKER = "@@@@@@@@@@"

LOAD_LABEL = "bench.crihook.io/load"

# What the bench pod asks of the `devices` hook (ignored without it), for each of its
# containers: a device node, a read-only host mount and one device of the pool `gpu`
# (DEVICES_CONFIG). Pod-wide: every CreateContainer of the bench is a new container of the pod.
# The pod says it has no init containers (crihook.io/init-containers, empty), as a pod with
# pooled devices should: otherwise each create finds the container before it holding devices
# of unknown kind, and the hook asks the runtime whether it exited (a ListContainers round
# trip) before it may reuse them.
DEVICE_ANNOTATIONS = {
    "devices.crihook.io/pod": '[{"path": "/dev/null", "container_path": "/dev/bench-null"}]',
    "mounts.crihook.io/pod": '{"/usr/share": "/bench-share"}',
    "pools.crihook.io/pod": '{"gpu": 1}',
    "crihook.io/init-containers": "",
}
DEVICES_CONFIG = (
    "[hooks.devices]\n"
    'namespaces = ["bench"]\n'
    'devices = ["/dev/null"]\n'
    'mounts = ["/usr/share"]\n'
    "[hooks.devices.pools.gpu]\n"
    'env = "GPU_VISIBLE_DEVICES"\n'
    # Stand-ins: character devices every Linux host has. Each CreateContainer takes one; the
    # fake runtime answers every create with the same container id, so the one before is gone.
    "devices = ["
    + ", ".join(f'{{ id = "{i}", path = "/dev/tty{i}" }}' for i in range(1, 33))
    + "]\n"
)


# The sandbox lifecycle (RunPodSandbox + StopPodSandbox) on a real containerd: a pod on the
# pod network (CNI) asking the `netdev` hook for one macvlan on a bridge the bench makes
# (ignored without the hook). The bridge's name starts with NETDEV_PARENT_PREFIX.
LIFECYCLE_LABEL = "bench.crihook.io/lifecycle"
NETDEV_PARENT_PREFIX = "chbn"
NETDEV_CONFIG = (
    "[hooks.netdev]\n"
    'namespaces = ["bench"]\n'
    f'parents = ["{NETDEV_PARENT_PREFIX}*"]\n'
    "timeout_ms = 5000\n"
)


def lifecycle_pod(parent: str) -> PodSpec:
    """A pod-network pod with one macvlan on `parent` asked of the netdev hook; its name and
    uid carry NAME_MARKER (a pod per call)."""
    links = f'[{{"name": "net1", "type": "macvlan", "parent": "{parent}"}}]'
    return PodSpec(
        name=f"net-{NAME_MARKER}",
        namespace="bench",
        uid=f"be4c0000-0000-4000-80{NAME_MARKER}",
        labels={"app": "net", LIFECYCLE_LABEL: "1"},
        annotations={"netdevs.crihook.io/pod": links},
        host_network=False,
        containers=[],
    )


def _hex_id(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def for_pod(text: str, pod: int) -> str:
    """A pod's id, uid or name as the bench's pod number `pod` has it: `text` itself for pod
    0, else `text` with the number (4 digits) in its last four characters. Same length, so a
    request into another pod is the same size; `text`'s own last four hold a letter, so no
    other pod has pod 0's."""
    if pod == 0:
        return text
    if not 0 < pod < 10_000:
        raise ValueError(f"pod number {pod} does not fit in 4 digits")
    return f"{text[:-4]}{pod:04d}"


def runtime_methods() -> list[tuple[str, str, bool]]:
    """(service full name, method name, is_unary) for every method of the CRI v1 services."""
    methods = []
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            unary = not (method.client_streaming or method.server_streaming)
            methods.append((service.full_name, method.name, unary))
    return methods


def bench_pod(
    *,
    name: str = "web-7d4b9c8f6d-x2kqp",
    namespace: str = "bench",
    uid: str = "0b8e6f2a-51c4-4d3e-9f1a-7c2d5e8b9a10",
    image: str = BUSYBOX_REF,
    kubelet_dir: str = "/var/lib/kubelet",
    container_name: str = f"web-{NAME_MARKER}",
) -> PodSpec:
    """A Burstable Deployment pod with one container shaped like kubelet's usual request.

    On top of what tests.lab's encoder models it carries what kubelet adds to a typical
    pod: the service-link environment, the projected service-account token, /etc/hosts and
    /dev/termination-log mounts (their sources live under ``kubelet_dir``), app labels and
    the config annotations. The container's labels include LOAD_LABEL.
    """
    pod_dir = f"{kubelet_dir}/pods/{uid}"
    web = ContainerSpec(
        name=container_name,
        image=image,
        command=["sleep", "3600"],
        env=[
            ("LOG_LEVEL", "info"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
        ],
        working_dir="/",
        cpu_request=250,
        cpu_limit=500,
        memory_request=128 * 1024 * 1024,
        memory_limit=256 * 1024 * 1024,
        mounts=[
            Mount(
                host_path=f"{pod_dir}/volumes/kubernetes.io~projected/kube-api-access-8xk2p",
                container_path="/var/run/secrets/kubernetes.io/serviceaccount",
                readonly=True,
            ),
            Mount(host_path=f"{pod_dir}/etc-hosts", container_path="/etc/hosts"),
            Mount(
                host_path=f"{pod_dir}/containers/web/4f1c2b7a",
                container_path="/dev/termination-log",
            ),
        ],
        labels={LOAD_LABEL: "1"},
    )
    return PodSpec(
        name=name,
        namespace=namespace,
        uid=uid,
        labels={"app": "web", "pod-template-hash": "7d4b9c8f6d"},
        annotations={
            "kubernetes.io/config.seen": "2026-11-29T15:00:00.000000000Z",
            "kubernetes.io/config.source": "api",
            **DEVICE_ANNOTATIONS,
        },
        host_network=True,
        containers=[web],
    )


def mount_sources(pod: PodSpec) -> list[tuple[str, bool]]:
    """(host path, is_dir) of every mount source of the pod's containers."""
    return [
        (m.host_path, not m.container_path.startswith(("/etc/", "/dev/")))
        for c in pod.containers
        for m in c.mounts
    ]


def create_container_request(
    pod: PodSpec,
    *,
    sandbox_id: str,
    sandbox: api_pb2.PodSandboxConfig,
    image_ref: str,
    node_memory: int,
    container: ContainerSpec | None = None,
) -> bytes:
    """An encoded CreateContainerRequest for ``container`` (default: the pod's first)."""
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox_id,
        config=container_config(
            pod, container or pod.containers[0], node_memory=node_memory, image_ref=image_ref
        ),
        sandbox_config=sandbox,
    )
    return request.SerializeToString()


def fake_create_container_request(pod_number: int = 0) -> bytes:
    """The CreateContainerRequest sent to the fake runtime (fixed ids, 16 GiB node), into the
    bench pod, or with `pod_number` into its twin of that number (_into_pod)."""
    pod = bench_pod()
    encoded = create_container_request(
        pod,
        sandbox_id=_hex_id("bench-sandbox"),
        sandbox=sandbox_config(pod, log_root="/var/log/pods"),
        image_ref=f"sha256:{_hex_id(BUSYBOX_REF)}",
        node_memory=16 * 1024**3,
    )
    if not pod_number:
        return encoded
    request = api_pb2.CreateContainerRequest.FromString(encoded)
    _into_pod(request, pod_number)
    return request.SerializeToString()


KUBELET_CAPTURED = Path(__file__).resolve().parent / "kubelet_captured"
"""A real kubelet's requests for a Burstable pod, taken from the kubelet corpus
(bench/kubelet_capture.py)."""
KUBELET_CONTAINER_LABEL = "io.kubernetes.container.name"


def kubelet_run_pod_sandbox_request(marked: bool = False) -> bytes:
    """The RunPodSandboxRequest a real kubelet sent, byte for byte as recorded.

    ``marked``: a pod per request instead: NAME_MARKER in the pod's name and at the end of its
    uid, wherever kubelet wrote them (labels, log directory, cgroup parent); re-encoded by
    protobuf, as the CreateContainer below."""
    recorded = (KUBELET_CAPTURED / "RunPodSandbox.bin").read_bytes()
    if not marked:
        return recorded
    request = api_pb2.RunPodSandboxRequest.FromString(recorded)
    old_uid, old_name = request.config.metadata.uid, request.config.metadata.name
    _move_pod(
        request.config, old_uid[: -len(NAME_MARKER)] + NAME_MARKER, f"{old_name}-{NAME_MARKER}"
    )
    return request.SerializeToString()


def _move_pod(
    config: api_pb2.PodSandboxConfig, uid: str, name: str
) -> Callable[[api_pb2.ContainerConfig], None]:
    """Give kubelet's sandbox config another pod's uid and name wherever kubelet wrote them
    (metadata, labels, log directory, cgroup parent). Returns what does the same to one of
    the pod's container configs (kubelet's pod labels, the mount sources under the pod's
    directory)."""
    old_uid, old_name = config.metadata.uid, config.metadata.name

    def mark(text: str) -> str:
        return text.replace(old_uid, uid).replace(f"_{old_name}_", f"_{name}_")

    def relabel(labels: Any) -> None:
        for key, value in list(labels.items()):
            labels[key] = name if value == old_name else mark(value)

    def move_container(container: api_pb2.ContainerConfig) -> None:
        relabel(container.labels)
        for mount in container.mounts:
            mount.host_path = mark(mount.host_path)

    config.metadata.uid, config.metadata.name = uid, name
    config.log_directory = mark(config.log_directory)
    config.linux.cgroup_parent = mark(config.linux.cgroup_parent)
    relabel(config.labels)
    return move_container


def kubelet_create_container_request(pod_number: int = 0) -> bytes:
    """The CreateContainerRequest a real kubelet sent, its container named ``app-`` +
    NAME_MARKER (name and kubelet's name label) so that each request has its own; re-encoded
    by protobuf (kubelet's Go encoder may order map entries otherwise: same size, same
    content). With `pod_number`: into the captured pod's twin of that number (_into_pod)."""
    request = api_pb2.CreateContainerRequest.FromString(
        (KUBELET_CAPTURED / "CreateContainer.bin").read_bytes()
    )
    name = f"app-{NAME_MARKER}"
    request.config.metadata.name = name
    request.config.labels[KUBELET_CONTAINER_LABEL] = name
    if pod_number:
        _into_pod(request, pod_number)
    return request.SerializeToString()


def _into_pod(request: api_pb2.CreateContainerRequest, pod_number: int) -> None:
    """The same container into pod `pod_number`'s twin, as kubelet would send it for another
    pod of the same template: the sandbox id, the pod's uid and name numbered (for_pod)
    wherever kubelet wrote them; the rest, the container's hash included, unchanged. As long
    as the request it was."""
    metadata = request.sandbox_config.metadata
    move_container = _move_pod(
        request.sandbox_config,
        for_pod(metadata.uid, pod_number),
        for_pod(metadata.name, pod_number),
    )
    move_container(request.config)
    request.pod_sandbox_id = for_pod(request.pod_sandbox_id, pod_number)


def list_containers_request() -> bytes:
    """kubelet's periodic ListContainers: a present but empty filter."""
    request = api_pb2.ListContainersRequest()
    request.filter.SetInParent()
    return request.SerializeToString()


class InstantRuntime:
    """The runtime as the pipeline sees it, in process: every call is answered at once, a
    CreateContainer with the same container id (as the fake runtime does), anything else
    with an empty message. For figures that leave the sockets out (bench.record_cost,
    bench.pipeline_cost)."""

    CONTAINER_ID = "c" * 64

    def call(self, path: str) -> Callable[..., Awaitable[bytes]]:
        answer = b""
        if path == CREATE_CONTAINER:
            created = api_pb2.CreateContainerResponse(container_id=self.CONTAINER_ID)
            answer = created.SerializeToString()

        async def unary(request: bytes, *, timeout: Any = None, metadata: Any = None) -> bytes:
            return answer

        return unary


# --- canned responses for the fake runtime ---------------------------------------------------

_FAKE_PODS = [
    ("coredns-5d78c9869d-abcde", "kube-system", ["coredns"]),
    ("kube-proxy-7xk2p", "kube-system", ["kube-proxy"]),
    ("web-7d4b9c8f6d-x2kqp", "default", ["web", "envoy"]),
    ("db-0", "default", ["postgres", "exporter"]),
    ("worker-6f5c7b8d9-q8w7e", "batch", ["worker", "log-shipper", "metrics"]),
]


def _fake_pods() -> list[tuple[str, str, str, str, list[str]]]:
    return [
        (_hex_id(f"sandbox/{ns}/{name}"), name, ns, f"uid-{_hex_id(name)[:12]}", containers)
        for name, ns, containers in _FAKE_PODS
    ]


def _list_containers_response() -> bytes:
    response = api_pb2.ListContainersResponse()
    created = 1_764_428_400_000_000_000
    for sandbox_id, pod, ns, uid, containers in _fake_pods():
        for i, cname in enumerate(containers):
            image = f"registry.example.com/{ns}/{cname}:1.{i}.3"
            c = response.containers.add(
                id=_hex_id(f"container/{sandbox_id}/{cname}"),
                pod_sandbox_id=sandbox_id,
                metadata=api_pb2.ContainerMetadata(name=cname, attempt=0),
                image=api_pb2.ImageSpec(image=image),
                image_ref=f"sha256:{_hex_id(image)}",
                state=api_pb2.CONTAINER_RUNNING,
                created_at=created + i,
            )
            c.labels.update(
                {
                    "io.kubernetes.container.name": cname,
                    "io.kubernetes.pod.name": pod,
                    "io.kubernetes.pod.namespace": ns,
                    "io.kubernetes.pod.uid": uid,
                }
            )
            c.annotations.update(
                {
                    "io.kubernetes.container.hash": _hex_id(cname)[:8],
                    "io.kubernetes.container.restartCount": "0",
                    "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                    "io.kubernetes.container.terminationMessagePolicy": "File",
                    "io.kubernetes.pod.terminationGracePeriod": "30",
                }
            )
    return response.SerializeToString()


def _list_pod_sandbox_response() -> bytes:
    response = api_pb2.ListPodSandboxResponse()
    for sandbox_id, pod, ns, uid, _ in _fake_pods():
        s = response.items.add(
            id=sandbox_id,
            metadata=api_pb2.PodSandboxMetadata(name=pod, uid=uid, namespace=ns, attempt=0),
            state=api_pb2.SANDBOX_READY,
            created_at=1_764_428_400_000_000_000,
        )
        s.labels.update(
            {
                "io.kubernetes.pod.name": pod,
                "io.kubernetes.pod.namespace": ns,
                "io.kubernetes.pod.uid": uid,
            }
        )
    return response.SerializeToString()


def canned_responses() -> dict[str, bytes]:
    """Full method path -> encoded response; methods not listed answer an empty message."""
    return {
        VERSION: api_pb2.VersionResponse(
            version="0.1.0",
            runtime_name="fake-runtime",
            runtime_version="1.0.0-bench",
            runtime_api_version="v1",
        ).SerializeToString(),
        LIST_CONTAINERS: _list_containers_response(),
        LIST_POD_SANDBOX: _list_pod_sandbox_response(),
        CREATE_CONTAINER: api_pb2.CreateContainerResponse(
            container_id=_hex_id("bench-created-container")
        ).SerializeToString(),
        f"/{RUNTIME_SERVICE}/RunPodSandbox": api_pb2.RunPodSandboxResponse(
            pod_sandbox_id=_hex_id("bench-run-sandbox")
        ).SerializeToString(),
    }
