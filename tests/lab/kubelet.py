"""A kubelet-like CRI client: drives the pod lifecycle in kubelet's order over gRPC.

It builds every message with the pure functions of :mod:`tests.lab.kubelet_encoding`
(re-exported here), so a test can send exactly what kubelet would, to containerd
directly or through crihook. It never calls PullImage: images must already be present
(the lab imports them), and a missing one is an error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab import cgroups
from tests.lab.kubelet_encoding import (
    DEFAULT_CGROUP_ROOT,
    ContainerSpec,
    Device,
    Mount,
    PodSpec,
    QOSClass,
    cgroup_parent,
    container_config,
    linux_resources,
    oom_score_adj,
    pod_log_directory,
    qos_class,
    sandbox_config,
)

__all__ = [
    "ContainerSpec",
    "Device",
    "KubeletClient",
    "Mount",
    "PodHandle",
    "PodSpec",
    "PodStartError",
    "QOSClass",
    "cgroup_parent",
    "container_config",
    "linux_resources",
    "node_memory_capacity",
    "oom_score_adj",
    "qos_class",
    "sandbox_config",
]

_POLL_INTERVAL = 0.05


class PodStartError(RuntimeError):
    """run_pod could not bring the pod up.

    ``handle`` is the partial pod (None when RunPodSandbox itself failed); ``code`` and
    ``details`` carry the gRPC status when a CRI call was refused (e.g. by a crihook hook).
    """

    def __init__(
        self,
        message: str,
        handle: PodHandle | None,
        code: grpc.StatusCode | None = None,
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.handle = handle
        self.code = code
        self.details = details

    @classmethod
    def from_rpc(cls, what: str, exc: grpc.RpcError, handle: PodHandle | None) -> PodStartError:
        code, details = exc.code(), exc.details() or ""
        return cls(f"{what}: {code}: {details}", handle, code, details)


@dataclass
class PodHandle:
    """What run_pod created and the configs it sent (for assertions and replay)."""

    spec: PodSpec
    sandbox_id: str
    sandbox_config: api_pb2.PodSandboxConfig
    qos: QOSClass
    cgroup_parent: str
    pod_ip: str = ""
    container_ids: dict[str, str] = field(default_factory=dict)  # app containers by name
    init_container_ids: dict[str, str] = field(default_factory=dict)
    container_configs: dict[str, api_pb2.ContainerConfig] = field(default_factory=dict)


def node_memory_capacity() -> int:
    """Node memory in bytes as kubelet (cAdvisor) sees it: MemTotal from /proc/meminfo."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemTotal missing from /proc/meminfo")


class KubeletClient:
    """CRI client for ``endpoint`` (``unix:///path``) that behaves like kubelet.

    ``cgroup_root`` is kubelet's cgroup root for pods (cgroupfs driver); ``log_root``
    stands in for /var/log/pods (None: no container logs are written); ``node_memory``
    defaults to this host's MemTotal. Every call takes an optional ``timeout`` (seconds).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        cgroup_root: str = DEFAULT_CGROUP_ROOT,
        log_root: str | Path | None = None,
        node_memory: int | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.endpoint = endpoint
        self.cgroup_root = cgroup_root
        self.log_root = str(log_root) if log_root is not None else None
        self.node_memory = node_memory or node_memory_capacity()
        self.timeout = timeout
        # The target for a unix socket is the endpoint string itself.
        self._channel = grpc.insecure_channel(endpoint)
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self._channel)
        self.images = api_pb2_grpc.ImageServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> KubeletClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    # -- messages --------------------------------------------------------------------------

    def sandbox_config(self, spec: PodSpec) -> api_pb2.PodSandboxConfig:
        return sandbox_config(spec, cgroup_root=self.cgroup_root, log_root=self.log_root)

    def container_config(
        self, spec: PodSpec, container: ContainerSpec, image_ref: str | None = None
    ) -> api_pb2.ContainerConfig:
        return container_config(spec, container, node_memory=self.node_memory, image_ref=image_ref)

    # -- pod lifecycle ---------------------------------------------------------------------

    def run_pod(self, spec: PodSpec, timeout: float | None = None) -> PodHandle:
        """RunPodSandbox, then init containers one by one to completion, then app containers.

        Raises PodStartError (with the partial handle) when a step fails; the caller (or the
        pod_cleanup fixture) removes what was created.
        """
        t = self._t(timeout)
        if self.log_root is not None:
            # kubelet creates the pod log directory before RunPodSandbox.
            Path(pod_log_directory(spec, self.log_root)).mkdir(parents=True, exist_ok=True)
        pod = f"{spec.namespace}/{spec.name}"
        sb_config = self.sandbox_config(spec)
        try:
            resp = self.runtime.RunPodSandbox(
                api_pb2.RunPodSandboxRequest(
                    config=sb_config, runtime_handler=spec.runtime_handler
                ),
                timeout=t,
            )
        except grpc.RpcError as exc:
            raise PodStartError.from_rpc(f"RunPodSandbox for pod {pod}", exc, None) from exc
        handle = PodHandle(
            spec=spec,
            sandbox_id=resp.pod_sandbox_id,
            sandbox_config=sb_config,
            qos=qos_class(spec),
            cgroup_parent=sb_config.linux.cgroup_parent,
        )
        try:
            handle.pod_ip = self.pod_status(handle.sandbox_id, timeout=t).status.network.ip
            for c in spec.init_containers:
                cid = self._create_and_start(handle, c, t)
                handle.init_container_ids[c.name] = cid
                exited = self.wait_container_exited(cid, timeout=t)
                if exited.exit_code != 0:
                    raise PodStartError(
                        f"init container {c.name!r} of pod {pod} exited with "
                        f"{exited.exit_code} ({exited.reason}: {exited.message})",
                        handle,
                    )
            for c in spec.containers:
                handle.container_ids[c.name] = self._create_and_start(handle, c, t)
        except grpc.RpcError as exc:
            raise PodStartError.from_rpc(f"starting pod {pod}", exc, handle) from exc
        except TimeoutError as exc:
            raise PodStartError(f"starting pod {pod}: {exc}", handle) from exc
        return handle

    def _create_and_start(self, handle: PodHandle, c: ContainerSpec, timeout: float) -> str:
        # kubelet resolves the image first (EnsureImageExists) and sends the image id.
        image = self.images.ImageStatus(
            api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=c.image)), timeout=timeout
        ).image
        if not image.id:
            raise PodStartError(f"image {c.image!r} is not present (and is never pulled)", handle)
        config = self.container_config(handle.spec, c, image_ref=image.id)
        handle.container_configs[c.name] = config
        if handle.sandbox_config.log_directory and config.log_path:
            # kubelet makes the container's log dir before CreateContainer; containerd would
            # make it too, CRI-O (conmon) does not.
            log_file = Path(handle.sandbox_config.log_directory, config.log_path)
            log_file.parent.mkdir(parents=True, exist_ok=True)
        cid: str = self.runtime.CreateContainer(
            api_pb2.CreateContainerRequest(
                pod_sandbox_id=handle.sandbox_id,
                config=config,
                sandbox_config=handle.sandbox_config,
            ),
            timeout=timeout,
        ).container_id
        self.runtime.StartContainer(
            api_pb2.StartContainerRequest(container_id=cid), timeout=timeout
        )
        return cid

    def stop_pod(self, handle: PodHandle, grace: int = 0, timeout: float | None = None) -> None:
        """Stop every container of the pod (with ``grace`` seconds), then the sandbox."""
        self.stop_pod_by_id(handle.sandbox_id, grace=grace, timeout=timeout)

    def stop_pod_by_id(self, sandbox_id: str, grace: int = 0, timeout: float | None = None) -> None:
        t = self._t(timeout)
        for c in self._containers_of(sandbox_id, t):
            if c.state in (api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_UNKNOWN):
                _ignore_not_found(
                    self.runtime.StopContainer,
                    api_pb2.StopContainerRequest(container_id=c.id, timeout=grace),
                    timeout=t + grace,
                )
        _ignore_not_found(
            self.runtime.StopPodSandbox,
            api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            timeout=t,
        )

    def remove_pod(self, handle: PodHandle, timeout: float | None = None) -> None:
        """Tear the pod down as kubelet does, including its pod cgroup directories."""
        self.remove_pod_by_id(
            handle.sandbox_id, timeout=timeout, cgroup_parent=handle.cgroup_parent
        )

    def remove_pod_by_id(
        self, sandbox_id: str, timeout: float | None = None, cgroup_parent: str | None = None
    ) -> None:
        """Stop containers (timeout 0), remove them, stop and remove the sandbox, rmdir cgroups.

        Missing objects are fine (idempotent). ``cgroup_parent`` is the pod cgroup kubelet
        asked for; the one the sandbox really got (a proxy may change it) goes too.
        """
        t = self._t(timeout)
        actual_parent = self._sandbox_cgroup_parent(sandbox_id, t)
        self.stop_pod_by_id(sandbox_id, grace=0, timeout=t)
        containers = self._containers_of(sandbox_id, t)
        for c in containers:
            _ignore_not_found(
                self.runtime.RemoveContainer,
                api_pb2.RemoveContainerRequest(container_id=c.id),
                timeout=t,
            )
        _ignore_not_found(
            self.runtime.RemovePodSandbox,
            api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            timeout=t,
        )
        # kubelet's pod cgroup manager removes the pod level; containerd leaves it behind.
        problems: list[str] = []
        if cgroup_parent and cgroup_parent.startswith("/") and cgroup_parent.strip("/"):
            problems += cgroups.remove_cgroup_tree(cgroup_parent)
        if actual_parent and actual_parent != cgroup_parent:
            # Not ours to sweep: only the dir itself (its containers are gone already), and
            # what the runtime left in it for this pod's own containers: after a restart
            # CRI-O forgets the cgroup of each container's conmon (crio-conmon-<id>).
            for c in (*containers, sandbox_id):
                cid = c if isinstance(c, str) else c.id
                for name in (cid, f"crio-{cid}", f"crio-conmon-{cid}"):
                    problems += cgroups.remove_cgroup_dir(f"{actual_parent}/{name}")
            problems += cgroups.remove_cgroup_dir(actual_parent)
        if problems:
            raise RuntimeError(f"pod cgroup not removed: {'; '.join(problems)}")

    def _containers_of(self, sandbox_id: str, timeout: float) -> list[api_pb2.Container]:
        req = api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox_id)
        )
        return list(self.runtime.ListContainers(req, timeout=timeout).containers)

    def _sandbox_cgroup_parent(self, sandbox_id: str, timeout: float) -> str | None:
        try:
            resp = self.pod_status(sandbox_id, verbose=True, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        raw = resp.info.get("info")
        if not raw:
            return None
        path = ((json.loads(raw).get("runtimeSpec") or {}).get("linux") or {}).get(
            "cgroupsPath", ""
        )
        parent = str(Path(path).parent)
        # Absolute and below the hierarchy root; a relative path lands under the shim's cgroup.
        return parent if path.startswith("/") and parent.strip("/") else None

    # -- thin helpers ----------------------------------------------------------------------

    def version(self, timeout: float | None = None) -> api_pb2.VersionResponse:
        return self.runtime.Version(api_pb2.VersionRequest(), timeout=self._t(timeout))

    def status(self, verbose: bool = False, timeout: float | None = None) -> api_pb2.StatusResponse:
        return self.runtime.Status(api_pb2.StatusRequest(verbose=verbose), timeout=self._t(timeout))

    def list_pods(self, timeout: float | None = None) -> list[api_pb2.PodSandbox]:
        resp = self.runtime.ListPodSandbox(
            api_pb2.ListPodSandboxRequest(), timeout=self._t(timeout)
        )
        return list(resp.items)

    def pod_status(
        self, sandbox_id: str, verbose: bool = False, timeout: float | None = None
    ) -> api_pb2.PodSandboxStatusResponse:
        return self.runtime.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose),
            timeout=self._t(timeout),
        )

    def container_status(
        self, container_id: str, verbose: bool = False, timeout: float | None = None
    ) -> api_pb2.ContainerStatusResponse:
        return self.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose),
            timeout=self._t(timeout),
        )

    def container_pid(self, container_id: str, timeout: float | None = None) -> int:
        """Host PID of the container's init process (from the verbose status info)."""
        info = self.container_status(container_id, verbose=True, timeout=timeout).info
        return int(json.loads(info["info"])["pid"])

    def exec_sync(
        self, container_id: str, cmd: list[str], timeout: int = 10
    ) -> api_pb2.ExecSyncResponse:
        """Run ``cmd`` in the container; ``timeout`` (s) bounds the command itself."""
        return self.runtime.ExecSync(
            api_pb2.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout),
            timeout=timeout + 10,
        )

    def wait_container_exited(
        self, container_id: str, timeout: float | None = None
    ) -> api_pb2.ContainerStatus:
        """Poll ContainerStatus until the container is EXITED (as kubelet's PLEG would see)."""
        deadline = time.monotonic() + self._t(timeout)
        while True:
            status = self.container_status(container_id).status
            if status.state == api_pb2.CONTAINER_EXITED:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"container {container_id[:12]} ({status.metadata.name}) did not exit "
                    f"within {self._t(timeout)}s; state {api_pb2.ContainerState.Name(status.state)}"
                )
            time.sleep(_POLL_INTERVAL)


def _ignore_not_found(method: Callable[..., object], request: object, timeout: float) -> None:
    try:
        method(request, timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
