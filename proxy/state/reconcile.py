"""The store reconciled with the runtime: what the runtime no longer has is dropped, what it
has that the store lacks is rebuilt from its verbose status (proxy/state/runtime_status.py).

At start (`reconcile`), every `reconcile_seconds` while crihook runs (`missing_from`, which
changes nothing), and for one pod or sandbox after a call whose outcome crihook did not see
or a restore (`reconcile_pod`, `reconcile_sandbox`). `Store` offers each as a method.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerView, PodView
from crihook.hooks.spec.views import (
    container_state,
    container_view_from_config,
    pod_view_from_config,
    qos_from_cgroup_parent,
    resources_view,
)
from crihook.proxy.cri.methods import method_path
from crihook.proxy.cri.runtime import Runtime, RuntimeCallFailed
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.runtime_status import verbose_config

if TYPE_CHECKING:
    from crihook.proxy.state.store import Store

__all__ = ["POD_UID_LABEL", "missing_from", "reconcile", "reconcile_pod", "reconcile_sandbox"]

POD_UID_LABEL = "io.kubernetes.pod.uid"
"""The label kubelet puts on every sandbox; a ListPodSandbox filter finds a pod by it."""


async def reconcile(store: Store, runtime: Runtime) -> tuple[int, int, int]:
    """Drop what the runtime no longer has, rebuild what it has that the disk lacks.
    Returns (kept, rebuilt, dropped) counts over pods and containers."""
    sandboxes, containers = await _everything(runtime)
    live_pods = {s.id: s for s in sandboxes.items if s.id}
    live_containers = {c.id: c for c in containers.containers if c.id}
    kept = rebuilt = dropped = 0
    for cid in list(store.containers):
        if cid not in live_containers:
            store.remove_container(cid)
            dropped += 1
    for sid in list(store.pods):
        if sid not in live_pods:
            store.remove_pod(sid)
            dropped += 1
    for sid, sandbox in live_pods.items():
        if sid in store.pods:
            kept += 1
            continue
        store.put_pod(PodRecord(await _rebuild_pod(runtime, sandbox)))
        rebuilt += 1
    for cid, container in live_containers.items():
        if cid in store.containers:
            kept += 1
            store.set_state(cid, container_state(container.state))
            continue
        pod = store.pods.get(container.pod_sandbox_id)
        if pod is None:
            continue  # a container of a sandbox the runtime did not list: nothing to hang it on
        view = await _rebuild_container(runtime, container, pod.view)
        store.put_container(ContainerRecord(view, state=container_state(container.state)))
        rebuilt += 1
    return kept, rebuilt, dropped


async def missing_from(store: Store, runtime: Runtime) -> tuple[list[str], list[str]]:
    """The sandbox and container ids `store` records that the runtime no longer lists:
    removed without crihook (another client, an operator's crictl, the runtime's own
    clean-up). Changes nothing. Raises RuntimeCallFailed when the runtime fails."""
    sandboxes, containers = await _everything(runtime)
    live_pods = {s.id for s in sandboxes.items}
    live_containers = {c.id for c in containers.containers}
    return (
        [sid for sid in store.pods if sid not in live_pods],
        [cid for cid in store.containers if cid not in live_containers],
    )


async def reconcile_pod(
    store: Store, runtime: Runtime, pod_uid: str
) -> tuple[list[PodRecord], list[ContainerRecord]]:
    """Rebuild what the runtime has of one pod and the store lacks; returns the records
    added (drops nothing). For a RunPodSandbox whose outcome crihook did not see (the
    runtime went away, the deadline passed): the runtime may have kept a sandbox.

    Sandboxes are found by kubelet's `io.kubernetes.pod.uid` label, or, when none
    carries it (a client other than kubelet), by metadata.uid among all of them; their
    containers by a sandbox filter. Raises RuntimeCallFailed when the runtime fails
    a call; what was added before stays."""
    if not pod_uid:
        raise ValueError("reconcile_pod needs a pod uid")
    by_label = await _call(
        runtime,
        "ListPodSandbox",
        api_pb2.ListPodSandboxRequest(
            filter=api_pb2.PodSandboxFilter(label_selector={POD_UID_LABEL: pod_uid})
        ),
        api_pb2.ListPodSandboxResponse,
    )
    sandboxes = [s for s in by_label.items if s.id]
    if not sandboxes:
        every = await _call(
            runtime,
            "ListPodSandbox",
            api_pb2.ListPodSandboxRequest(),
            api_pb2.ListPodSandboxResponse,
        )
        sandboxes = [s for s in every.items if s.id and s.metadata.uid == pod_uid]
    return await _learn(store, runtime, sandboxes)


async def reconcile_sandbox(
    store: Store, runtime: Runtime, sandbox_id: str
) -> tuple[list[PodRecord], list[ContainerRecord]]:
    """As `reconcile_pod`, for one sandbox by id (a pod the runtime restored)."""
    listed = await _call(
        runtime,
        "ListPodSandbox",
        api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(id=sandbox_id)),
        api_pb2.ListPodSandboxResponse,
    )
    return await _learn(store, runtime, [s for s in listed.items if s.id == sandbox_id])


async def _learn(
    store: Store, runtime: Runtime, sandboxes: list[Any]
) -> tuple[list[PodRecord], list[ContainerRecord]]:
    """Records for these sandboxes and their containers, where the store lacks them."""
    pods: list[PodRecord] = []
    containers: list[ContainerRecord] = []
    for sandbox in sandboxes:
        if sandbox.id not in store.pods:
            pod_view = await _rebuild_pod(runtime, sandbox)
            if sandbox.id not in store.pods:  # not recorded by a call while we waited
                record = PodRecord(pod_view)
                store.put_pod(record)
                pods.append(record)
        listed = await _call(
            runtime,
            "ListContainers",
            api_pb2.ListContainersRequest(
                filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox.id)
            ),
            api_pb2.ListContainersResponse,
        )
        for container in listed.containers:
            if not container.id or container.id in store.containers:
                continue
            pod = store.pods.get(sandbox.id)
            if pod is None:  # removed by a call while we waited
                break
            container_view = await _rebuild_container(runtime, container, pod.view)
            if container.id not in store.containers:
                container_record = ContainerRecord(
                    container_view, state=container_state(container.state)
                )
                store.put_container(container_record)
                containers.append(container_record)
    if pods or containers:
        store.write_behind()
    return pods, containers


async def _everything(runtime: Runtime) -> tuple[Any, Any]:
    """Every sandbox and every container the runtime has (two list calls)."""
    sandboxes = await _call(
        runtime, "ListPodSandbox", api_pb2.ListPodSandboxRequest(), api_pb2.ListPodSandboxResponse
    )
    containers = await _call(
        runtime, "ListContainers", api_pb2.ListContainersRequest(), api_pb2.ListContainersResponse
    )
    return sandboxes, containers


async def _call(runtime: Runtime, name: str, request: Any, response_type: Any) -> Any:
    raw = await runtime.control(method_path("RuntimeService", name))(
        request.SerializeToString(), timeout=30
    )
    return response_type.FromString(raw)


async def _rebuild_pod(runtime: Runtime, sandbox: Any) -> PodView:
    try:
        status = await _call(
            runtime,
            "PodSandboxStatus",
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id, verbose=True),
            api_pb2.PodSandboxStatusResponse,
        )
        config = verbose_config(status.info, api_pb2.PodSandboxConfig())
    except RuntimeCallFailed:
        config = None
    if config is None:
        config = api_pb2.PodSandboxConfig(
            metadata=sandbox.metadata, labels=sandbox.labels, annotations=sandbox.annotations
        )
    return pod_view_from_config(sandbox.id, config, sandbox.runtime_handler)


async def _rebuild_container(runtime: Runtime, container: Any, pod: PodView) -> ContainerView:
    config = None
    resources = None
    try:
        status = await _call(
            runtime,
            "ContainerStatus",
            api_pb2.ContainerStatusRequest(container_id=container.id, verbose=True),
            api_pb2.ContainerStatusResponse,
        )
        config = verbose_config(status.info, api_pb2.ContainerConfig())
        if status.status.HasField("resources") and status.status.resources.HasField("linux"):
            resources = status.status.resources.linux
    except RuntimeCallFailed:
        pass
    if config is None:
        config = api_pb2.ContainerConfig(
            metadata=container.metadata,
            image=container.image,
            labels=container.labels,
            annotations=container.annotations,
        )
    view = container_view_from_config(container.id, pod, config)
    if resources is not None:
        # The runtime's view of the resources is the current one (updates included).
        qos = qos_from_cgroup_parent(pod.cgroup_parent)
        view = replace(view, resources=resources_view(resources, qos))
    return view
