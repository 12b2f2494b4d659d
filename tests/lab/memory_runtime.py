"""A stateful fake CRI runtime: pods and containers kept in memory, for the resource hooks on
machines this VM is not (sysfs fixtures of big NUMA machines).

It answers the lifecycle calls (sandboxes and containers get ids, states move as kubelet
drives them), the list and status calls crihook reconciles with (resources as last created
or updated, a verbose `info` carrying the config as containerd's does), and records every
UpdateContainerResources. A call can be scripted to fail (`fail_next`, `fail_every`) or to
answer late (`slow_next`). Only for what
a real containerd cannot show here; the real one runs the same hooks on this machine.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf import json_format

from crihook.api.cri.v1 import api_pb2
from tests.lab.fake_runtime import FakeRuntime, Reply

__all__ = ["MemoryRuntime", "StoredContainer", "StoredPod"]


@dataclass
class StoredPod:
    id: str
    config: api_pb2.PodSandboxConfig
    ready: bool = True


@dataclass
class StoredContainer:
    id: str
    pod_id: str
    config: api_pb2.ContainerConfig
    resources: api_pb2.LinuxContainerResources
    state: int = api_pb2.CONTAINER_CREATED
    updates: list[api_pb2.LinuxContainerResources] = field(default_factory=list)


class MemoryRuntime(FakeRuntime):
    """FakeRuntime whose scripts keep pods and containers; `pods`/`containers` by id."""

    def __init__(self, socket_path: object) -> None:
        super().__init__(socket_path)  # type: ignore[arg-type]
        self.pods: dict[str, StoredPod] = {}
        self.containers: dict[str, StoredContainer] = {}
        self._ids = itertools.count(1)
        self._state = threading.Lock()
        self._failures: dict[str, Reply] = {}
        self._slow: dict[str, float] = {}
        self._failing: dict[str, Reply] = {}
        handlers: dict[str, Callable[[bytes], bytes]] = {
            "Version": self._version,
            "RunPodSandbox": self._run_pod,
            "StopPodSandbox": self._stop_pod,
            "RemovePodSandbox": self._remove_pod,
            "PodSandboxStatus": self._pod_status,
            "ListPodSandbox": self._list_pods,
            "CreateContainer": self._create,
            "StartContainer": self._start,
            "StopContainer": self._stop,
            "RemoveContainer": self._remove,
            "ContainerStatus": self._container_status,
            "ListContainers": self._list_containers,
            "UpdateContainerResources": self._update,
            "ImageStatus": self._image_status,
            "RestorePod": self._restore_pod,
        }
        for name, handler in handlers.items():
            self.script[name] = self._wrap(name, handler)

    def fail_next(self, method: str, code: grpc.StatusCode, details: str = "scripted") -> None:
        """The next call of `method` fails with `code`, and changes nothing."""
        with self._state:
            self._failures[method] = Reply(code=code, details=details)

    def fail_every(self, method: str, code: grpc.StatusCode | None) -> None:
        """Every call of `method` fails with `code` and changes nothing, until called again
        with None."""
        with self._state:
            if code is None:
                self._failing.pop(method, None)
            else:
                self._failing[method] = Reply(code=code, details="scripted, every call")

    def slow_next(self, method: str, seconds: float) -> None:
        """The next call of `method` is carried out, and answered `seconds` later (a client
        with a shorter deadline never hears that it was done)."""
        with self._state:
            self._slow[method] = seconds

    def cpuset_of(self, container_id: str) -> str:
        with self._state:
            return self.containers[container_id].resources.cpuset_cpus

    def mems_of(self, container_id: str) -> str:
        with self._state:
            return self.containers[container_id].resources.cpuset_mems

    def _wrap(self, name: str, handler: Callable[[bytes], bytes]) -> Callable[[bytes], Reply]:
        def reply(request: bytes) -> Reply:
            with self._state:
                failure = self._failures.pop(name, None) or self._failing.get(name)
                if failure is not None:
                    return failure
                try:
                    return Reply(response=handler(request), delay=self._slow.pop(name, 0.0))
                except KeyError as exc:
                    return Reply(code=grpc.StatusCode.NOT_FOUND, details=f"{exc} not found")

        return reply

    def _new_id(self) -> str:
        return f"{next(self._ids):064x}"

    # --- sandboxes ---------------------------------------------------------------------------
    def _version(self, raw: bytes) -> bytes:
        return api_pb2.VersionResponse(
            version="0.1.0", runtime_name="memory", runtime_version="1", runtime_api_version="v1"
        ).SerializeToString()

    def _image_status(self, raw: bytes) -> bytes:
        request = api_pb2.ImageStatusRequest.FromString(raw)
        image = api_pb2.Image(id=f"sha256:{abs(hash(request.image.image)):064x}"[:71])
        return api_pb2.ImageStatusResponse(image=image).SerializeToString()

    def _run_pod(self, raw: bytes) -> bytes:
        request = api_pb2.RunPodSandboxRequest.FromString(raw)
        pod = StoredPod(self._new_id(), request.config)
        self.pods[pod.id] = pod
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=pod.id).SerializeToString()

    def _restore_pod(self, raw: bytes) -> bytes:
        """A pod back from a checkpoint: its sandbox and running containers, made from the
        configs in the request (their resources as the checkpoint had them)."""
        request = api_pb2.RestorePodRequest.FromString(raw)
        pod = StoredPod(self._new_id(), request.config)
        self.pods[pod.id] = pod
        for config in request.container_configs:
            resources = api_pb2.LinuxContainerResources()
            resources.CopyFrom(config.linux.resources)
            container = StoredContainer(
                self._new_id(), pod.id, config, resources, state=api_pb2.CONTAINER_RUNNING
            )
            self.containers[container.id] = container
        return api_pb2.RestorePodResponse(pod_sandbox_id=pod.id).SerializeToString()

    def _stop_pod(self, raw: bytes) -> bytes:
        request = api_pb2.StopPodSandboxRequest.FromString(raw)
        self.pods[request.pod_sandbox_id].ready = False
        for c in self.containers.values():
            if c.pod_id == request.pod_sandbox_id:
                c.state = api_pb2.CONTAINER_EXITED
        return b""

    def _remove_pod(self, raw: bytes) -> bytes:
        request = api_pb2.RemovePodSandboxRequest.FromString(raw)
        self.pods.pop(request.pod_sandbox_id, None)
        for cid in [c.id for c in self.containers.values() if c.pod_id == request.pod_sandbox_id]:
            del self.containers[cid]
        return b""

    def _sandbox(self, pod: StoredPod) -> api_pb2.PodSandbox:
        return api_pb2.PodSandbox(
            id=pod.id,
            metadata=pod.config.metadata,
            state=api_pb2.SANDBOX_READY if pod.ready else api_pb2.SANDBOX_NOTREADY,
            labels=pod.config.labels,
            annotations=pod.config.annotations,
        )

    def _pod_status(self, raw: bytes) -> bytes:
        request = api_pb2.PodSandboxStatusRequest.FromString(raw)
        pod = self.pods[request.pod_sandbox_id]
        status = api_pb2.PodSandboxStatus(
            id=pod.id,
            metadata=pod.config.metadata,
            state=api_pb2.SANDBOX_READY if pod.ready else api_pb2.SANDBOX_NOTREADY,
            labels=pod.config.labels,
            annotations=pod.config.annotations,
        )
        info = {"info": json.dumps({"config": json_format.MessageToDict(pod.config)})}
        return api_pb2.PodSandboxStatusResponse(
            status=status, info=info if request.verbose else {}
        ).SerializeToString()

    def _list_pods(self, raw: bytes) -> bytes:
        request = api_pb2.ListPodSandboxRequest.FromString(raw)
        flt = request.filter
        items = []
        for pod in self.pods.values():
            if flt.id and pod.id != flt.id:
                continue
            if any(pod.config.labels.get(k) != v for k, v in flt.label_selector.items()):
                continue
            items.append(self._sandbox(pod))
        return api_pb2.ListPodSandboxResponse(items=items).SerializeToString()

    # --- containers --------------------------------------------------------------------------
    def _create(self, raw: bytes) -> bytes:
        request = api_pb2.CreateContainerRequest.FromString(raw)
        if request.pod_sandbox_id not in self.pods:
            raise KeyError(f"sandbox {request.pod_sandbox_id}")
        resources = api_pb2.LinuxContainerResources()
        resources.CopyFrom(request.config.linux.resources)
        container = StoredContainer(
            self._new_id(), request.pod_sandbox_id, request.config, resources
        )
        self.containers[container.id] = container
        return api_pb2.CreateContainerResponse(container_id=container.id).SerializeToString()

    def _set_state(self, raw: bytes, state: int) -> bytes:
        request = api_pb2.StartContainerRequest.FromString(raw)  # the id is field 1 in each
        self.containers[request.container_id].state = state
        return b""

    def _start(self, raw: bytes) -> bytes:
        return self._set_state(raw, api_pb2.CONTAINER_RUNNING)

    def _stop(self, raw: bytes) -> bytes:
        return self._set_state(raw, api_pb2.CONTAINER_EXITED)

    def _remove(self, raw: bytes) -> bytes:
        request = api_pb2.RemoveContainerRequest.FromString(raw)
        self.containers.pop(request.container_id, None)
        return b""

    def _update(self, raw: bytes) -> bytes:
        request = api_pb2.UpdateContainerResourcesRequest.FromString(raw)
        container = self.containers[request.container_id]
        container.resources.CopyFrom(request.linux)
        container.updates.append(request.linux)
        return b""

    def _container(self, c: StoredContainer) -> api_pb2.Container:
        return api_pb2.Container(
            id=c.id,
            pod_sandbox_id=c.pod_id,
            metadata=c.config.metadata,
            image=c.config.image,
            state=c.state,  # type: ignore[arg-type]
            labels=c.config.labels,
            annotations=c.config.annotations,
        )

    def _container_status(self, raw: bytes) -> bytes:
        request = api_pb2.ContainerStatusRequest.FromString(raw)
        c = self.containers[request.container_id]
        status = api_pb2.ContainerStatus(
            id=c.id,
            metadata=c.config.metadata,
            state=c.state,  # type: ignore[arg-type]
            image=c.config.image,
            labels=c.config.labels,
            annotations=c.config.annotations,
            resources=api_pb2.ContainerResources(linux=c.resources),
        )
        config = json_format.MessageToDict(c.config)
        config.pop("envs", None)
        info = {"info": json.dumps({"config": config})} if request.verbose else {}
        return api_pb2.ContainerStatusResponse(status=status, info=info).SerializeToString()

    def _list_containers(self, raw: bytes) -> bytes:
        request = api_pb2.ListContainersRequest.FromString(raw)
        flt = request.filter
        out = []
        for c in self.containers.values():
            if flt.id and c.id != flt.id:
                continue
            if flt.pod_sandbox_id and c.pod_id != flt.pod_sandbox_id:
                continue
            if flt.HasField("state") and c.state != flt.state.state:
                continue
            out.append(self._container(c))
        return api_pb2.ListContainersResponse(containers=out).SerializeToString()
