"""An in-process node for the resource hooks' unit tests: no grpc, no chain.

`Node` holds one hook, its state (`MemoryState`) and what a runtime would hold (pods,
containers with the resources they run with, their states). Its lifecycle helpers build the
CRI requests kubelet sends (`tests.lab.kubelet_encoding`), call the hook's stage methods
directly with `HookContext`s as the pipeline builds them, apply a pre stage's adjustment to
the request (so a post stage sees what the runtime got) and apply the updates to other
containers to what the node holds, as crihook's updater would after the call succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import CPUInfo, NUMAMemory, PodLimits, Topology, parse_cpu_list
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import (
    Adjustment,
    ContainerState,
    ContainerUpdate,
    ContainerView,
    Event,
    Hook,
    HookContext,
    PodView,
    ResourceHints,
    Stage,
    SyncContext,
    TopologyHint,
    stage_method_name,
)
from crihook.hooks.spec.views import (
    container_view_from_config,
    pod_view_from_config,
    resources_updated,
)
from crihook.proxy.chain.merge import apply_change
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.sysfs import GIB, MachineSpec

__all__ = [
    "GIB",
    "MIB",
    "NODE_MEMORY",
    "SMALL",
    "Created",
    "FakeCgroups",
    "FakeHost",
    "FakeRuntime",
    "Node",
    "besteffort",
    "burstable",
    "every_update",
    "guaranteed",
    "topology_of",
]

MIB = 1 << 20
NODE_MEMORY = 64 * GIB
"""The node memory kubelet computes Burstable OOM scores with."""

SMALL = MachineSpec(
    sockets=2,
    cores_per_socket=4,
    threads_per_core=2,
    memory_per_numa=8 * GIB,
    hugepages={2048: 512, 1048576: 2},
)
"""16 CPUs: socket/NUMA node 0 is cores 0-3 (cpus 0-3 and their siblings 8-11), node 1 is
cores 4-7 (cpus 4-7, 12-15). 8 GiB per node, of which 1 GiB is 2Mi pages, 2 GiB 1Gi pages."""


def every_update(adjustment: Adjustment | None) -> list[ContainerUpdate]:
    """An adjustment's updates, its group updates walked now, member by member (what crihook
    would send when nothing changes meanwhile)."""
    if adjustment is None:
        return []
    out = list(adjustment.updates)
    for group in adjustment.groups:
        for cid in group.members():
            delta = group.delta(cid)
            if delta is not None:
                out.append(ContainerUpdate(cid, delta))
    return out


def topology_of(spec: MachineSpec) -> Topology:
    """The Topology `read_topology` reads from `write_sysfs(root, spec)` (a core is named
    by its lowest online CPU, as there)."""
    online = spec.online_cpus()
    first: dict[int, int] = {}
    for cpu in online:  # by id: the first seen is the lowest
        first.setdefault(cpu.core, cpu.id)
    cpus = [CPUInfo(c.id, c.socket, c.die, first[c.core], c.numa, c.l3) for c in online]
    memory = [
        NUMAMemory(n, spec.memory_per_numa, dict(spec.hugepages)) for n in range(spec.numa_count)
    ]
    return Topology.build(cpus, memory, spec.offline)


# --- pods, as kubelet users write them ------------------------------------------------------


def guaranteed(name: str, milli: int, memory: int = GIB) -> ContainerSpec:
    return ContainerSpec(
        name, cpu_request=milli, cpu_limit=milli, memory_request=memory, memory_limit=memory
    )


def burstable(name: str, milli: int = 100, memory: int = 256 * MIB) -> ContainerSpec:
    return ContainerSpec(name, cpu_request=milli, memory_request=memory)


def besteffort(name: str) -> ContainerSpec:
    return ContainerSpec(name)


# --- the runtime and the host, faked at our boundary ----------------------------------------


class FakeRuntime:
    """RuntimeQueries answering from `states` (pod id → container id → state) and `scores`
    (container id → the oom_score_adj it was created with); records every question."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, ContainerState]] = {}
        self.asked: list[str] = []
        self.netns: dict[str, str] = {}
        self.oom_floor: int | None = None
        """containerd's own score with restrict_oom_score_adj: lower ones are raised to it."""
        self.scores: dict[str, int] = {}
        self.asked_scores: list[str] = []

    def create(self, container_id: str, oom_score_adj: int) -> None:
        """A container is created with the score asked for, as containerd applies it."""
        floor = self.oom_floor
        self.scores[container_id] = oom_score_adj if floor is None else max(oom_score_adj, floor)

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        self.asked.append(pod_id)
        return dict(self.states.get(pod_id, {}))

    async def sandbox_netns(self, pod_id: str) -> str | None:
        return self.netns.get(pod_id)

    async def oom_score_adj(self, container_id: str) -> int | None:
        self.asked_scores.append(container_id)
        return self.scores.get(container_id)


class FakeHost:
    """Host with processes per container id; records every pid lookup and score write."""

    def __init__(self) -> None:
        self.pids: dict[str, list[int]] = {}
        self.scores: dict[int, int] = {}
        self.looked_up: list[tuple[str, str]] = []
        self.writes: list[tuple[int, int]] = []
        self.unlimited: list[str] = []
        self.refuse: OSError | None = None
        """Raised by every score write (the kernel refusing it), when set."""

    def container_pids(self, cgroup_parent: str, container_id: str) -> list[int]:
        self.looked_up.append((cgroup_parent, container_id))
        return list(self.pids.get(container_id, []))

    def write_oom_score_adj(self, pid: int, score: int) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.writes.append((pid, score))
        self.scores[pid] = score

    def read_oom_score_adj(self, pid: int) -> int:
        return self.scores[pid]

    def unlimit_cpu_quota(self, cgroup_parent: str) -> bool:
        self.unlimited.append(cgroup_parent)
        return True


class FakeCgroups:
    """PodCgroups recording every write; `fail` names cgroup parents whose write fails, as a
    read-only or full cgroupfs would (naming the file)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, PodLimits]] = []
        self.fail: set[str] = set()
        self.qos: dict[str, str] = {}
        """QoS cgroup path → its cpuset.cpus as last written."""
        self.qos_writes: list[tuple[str, str]] = []
        self.qos_missing: set[str] = set()
        """QoS cgroups kubelet has not made yet (the write answers False, the read None)."""
        self.qos_reads: list[str] = []
        self.read_fail: set[str] = set()

    def write_limits(self, cgroup_parent: str, limits: PodLimits) -> list[str]:
        if cgroup_parent in self.fail:
            raise PermissionError(13, f"cannot open /fake/{cgroup_parent}/cpu.max: denied")
        self.writes.append((cgroup_parent, limits))
        return [f"/fake/{cgroup_parent}/cpu.max"]

    def write_qos_cpus(self, qos_path: str, cpus: str) -> bool:
        if qos_path in self.fail:
            raise PermissionError(13, f"cannot open /fake/{qos_path}/cpuset.cpus: denied")
        if qos_path in self.qos_missing:
            return False
        self.qos_writes.append((qos_path, cpus))
        self.qos[qos_path] = cpus
        return True

    def read_qos_cpus(self, qos_path: str) -> str | None:
        if qos_path in self.read_fail:
            raise PermissionError(13, f"cannot read /fake/{qos_path}/cpuset.cpus: denied")
        self.qos_reads.append(qos_path)
        if qos_path in self.qos_missing:
            return None
        return self.qos.get(qos_path, "")  # kubelet makes it with an empty one


class FakeStaging:
    """A `Staging` that pins in a table: each pin gets `/staged/<key>/<name>` and remembers
    the host path it pins (`source`); `changed` holds host paths that were swapped since they
    were checked (their pin fails, as the real one does); `fail_release` keys whose release
    fails. Every pin and release is recorded, in order, in `done`."""

    ROOT = "/staged"

    def __init__(self) -> None:
        self.source: dict[str, str] = {}
        self.changed: set[str] = set()
        self.fail_release: set[str] = set()
        self.done: list[tuple[str, str]] = []
        self.on_disk: list[str] = []
        """Keys `keys()` reports besides the pinned ones (left by an earlier crihook)."""

    def pin_mount(self, key: str, name: str, path: str, readonly: bool) -> str:
        return self._pin(key, name, path)

    def pin_device(self, key: str, name: str, path: str, node: Any) -> str:
        return self._pin(key, name, path)

    def _pin(self, key: str, name: str, path: str) -> str:
        if path in self.changed:
            raise OSError(40, f"{path} is a symlink")
        staged = f"{self.ROOT}/{key}/{name}"
        self.source[staged] = path
        self.done.append(("pin", staged))
        return staged

    def release(self, key: str) -> None:
        if key in self.fail_release:
            raise OSError(16, f"umount {self.ROOT}/{key}: busy")
        self.done.append(("release", key))
        prefix = f"{self.ROOT}/{key}/"
        for staged in [s for s in self.source if s.startswith(prefix)]:
            del self.source[staged]
        self.on_disk = [k for k in self.on_disk if k != key and not k.startswith(f"{key}/")]

    def keys(self) -> list[str]:
        pinned = {s[len(self.ROOT) + 1 :].rsplit("/", 1)[0] for s in self.source}
        return sorted(pinned | set(self.on_disk))

    def host_path(self, path: str) -> str:
        """What the runtime's path pins: the host path for a staged one."""
        return self.source.get(path, path)


# --- the node ---------------------------------------------------------------------------------


@dataclass
class Created:
    """One CreateContainer as the hook saw it."""

    view: ContainerView
    """As the pre stage saw it (no id yet)."""
    request: api_pb2.CreateContainerRequest
    """As adjusted by the pre stage."""
    hints: ResourceHints | None = None
    pre: Adjustment | None = None
    post: Adjustment | None = None
    cid: str = ""


@dataclass
class Node:
    """One hook on a node; see the module docstring."""

    hook: Hook
    topology: Topology
    scope: str = "container"
    policy: str = "none"
    exempt_namespaces: frozenset[str] = frozenset()
    """Pods in these namespaces are exempt (`HookContext.exempt`), as crihook's setting."""
    state: MemoryState = field(default_factory=MemoryState)
    runtime: FakeRuntime = field(default_factory=FakeRuntime)
    host: FakeHost = field(default_factory=FakeHost)
    cgroups: FakeCgroups | None = None
    """The pod cgroups hooks may write (None: none, as SyncContext's default)."""
    netlink: Any = None
    """The network interfaces hooks reach (a FakeNetlink; None: the real host's, as
    SyncContext's default)."""
    staging: FakeStaging = field(default_factory=FakeStaging)
    """Where checked host paths are pinned: never the real host's in unit tests."""
    pods: dict[str, PodView] = field(default_factory=dict)
    specs: dict[str, PodSpec] = field(default_factory=dict)
    containers: dict[str, ContainerView] = field(default_factory=dict)
    states: dict[str, ContainerState] = field(default_factory=dict)
    sent: list[ContainerUpdate] = field(default_factory=list)
    """Every update to other containers the hook asked for, in order."""
    pod_hints: ResourceHints | None = None
    """The hints stage's answer at the last RunPodSandbox."""

    # --- start-up --------------------------------------------------------------------------
    async def sync(self, reason: str = "start") -> list[ContainerUpdate]:
        sync = SyncContext(
            state=self.state,
            node=self.topology,
            host=self.host,  # type: ignore[arg-type]
            runtime=self.runtime,
            pods=list(self.pods.values()),
            containers=list(self.containers.values()),
            container_states=dict(self.states),
            reason=reason,
            topology_policy=self.policy,
            topology_scope=self.scope,
            cgroups=self.cgroups,
            netlink=self.netlink,
            staging=self.staging,
            exempt=lambda pod: pod.namespace in self.exempt_namespaces,
        )
        updates = list(await self.hook.synchronize(sync) or ())
        self._apply_updates(updates)
        return updates

    # --- calling stages --------------------------------------------------------------------
    async def stage(
        self,
        event: Event,
        stage: Stage,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        response: Message | None = None,
        *,
        affinity: TopologyHint | None = None,
        failure: str = "",
    ) -> Any:
        """Call one stage of the hook (None when it does not implement it, as the chain)."""
        method = getattr(self.hook, stage_method_name(event, stage), None)
        if method is None:
            return None
        ctx = HookContext(
            event,
            stage,
            pod,
            container,
            request,
            response,
            self.state,
            1.0,
            affinity=affinity,
            failure=failure,
            exempt=pod.namespace in self.exempt_namespaces,
        )
        return await method(ctx)

    def _apply(self, event: Event, request: Message, adjustment: Adjustment | None) -> None:
        if adjustment is None:
            return
        for key, value in adjustment.change_items():
            apply_change(event, request, key, value)
        self._apply_updates(every_update(adjustment))

    def _apply_updates(self, updates: Iterable[ContainerUpdate]) -> None:
        for update in updates:
            self.sent.append(update)
            view = self.containers.get(update.container_id)
            if view is None:
                continue
            res = view.resources
            changes = dict(update.resources.items())
            if "cpuset_cpus" in changes:
                res = replace(res, cpuset_cpus=changes["cpuset_cpus"])
            if "cpuset_mems" in changes:
                res = replace(res, cpuset_mems=changes["cpuset_mems"])
            if "cpu_quota" in changes:
                res = replace(res, cpu_quota=changes["cpu_quota"] or None)
            self.containers[update.container_id] = replace(view, resources=res)

    # --- pods --------------------------------------------------------------------------------
    def sandbox_config(
        self, spec: PodSpec, cpu_budget: int | None = None
    ) -> api_pb2.PodSandboxConfig:
        """kubelet's sandbox config; `cpu_budget`: whole CPUs of pod-level resources other
        than the sum of the containers' (a pod with `.spec.resources`)."""
        config = sandbox_config(spec)
        if cpu_budget is not None:
            res = config.linux.resources
            res.cpu_shares = cpu_budget * 1024
            res.cpu_quota = cpu_budget * 100_000
            res.cpu_period = 100_000
        return config

    async def run_pod(
        self,
        spec: PodSpec,
        sandbox_id: str,
        *,
        affinity: TopologyHint | None = None,
        cpu_budget: int | None = None,
    ) -> PodView:
        """RunPodSandbox through hints, pre and post; the pod view (with its id)."""
        config = self.sandbox_config(spec, cpu_budget)
        before = pod_view_from_config("", config)
        request = api_pb2.RunPodSandboxRequest(config=config)
        self.pod_hints = await self.stage(Event.RUN_POD_SANDBOX, Stage.HINTS, before, None, request)
        pre = await self.stage(
            Event.RUN_POD_SANDBOX, Stage.PRE, before, None, request, affinity=affinity
        )
        self._apply(Event.RUN_POD_SANDBOX, request, pre)
        response = api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox_id)
        post = await self.stage(Event.RUN_POD_SANDBOX, Stage.POST, before, None, request, response)
        self._apply(Event.RUN_POD_SANDBOX, request, post)
        view = pod_view_from_config(sandbox_id, config)
        self.pods[sandbox_id] = view
        self.specs[sandbox_id] = spec
        return view

    async def fail_pod(self, spec: PodSpec, *, failure: str = "runtime said no") -> None:
        """RunPodSandbox whose runtime call fails after the pre stage."""
        config = sandbox_config(spec)
        before = pod_view_from_config("", config)
        request = api_pb2.RunPodSandboxRequest(config=config)
        await self.stage(Event.RUN_POD_SANDBOX, Stage.PRE, before, None, request)
        await self.stage(
            Event.RUN_POD_SANDBOX, Stage.FAILED, before, None, request, failure=failure
        )

    async def remove_pod(self, sandbox_id: str) -> Adjustment | None:
        pod = self.pods[sandbox_id]
        request = api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        response = api_pb2.RemovePodSandboxResponse()
        post = await self.stage(Event.REMOVE_POD_SANDBOX, Stage.POST, pod, None, request, response)
        self._apply(Event.REMOVE_POD_SANDBOX, request, post)
        del self.pods[sandbox_id]
        for cid in [c for c, v in self.containers.items() if v.pod_id == sandbox_id]:
            del self.containers[cid]
            self.states.pop(cid, None)
        return post  # type: ignore[no-any-return]

    # --- containers --------------------------------------------------------------------------
    def add_pod(self, spec: PodSpec, sandbox_id: str) -> PodView:
        """A pod the runtime has, unseen by the hook (for synchronize)."""
        view = pod_view_from_config(sandbox_id, sandbox_config(spec))
        self.pods[sandbox_id] = view
        self.specs[sandbox_id] = spec
        return view

    def create_request(
        self,
        pod: PodView,
        container: ContainerSpec,
        *,
        attempt: int = 0,
        hugepages: Mapping[str, int] | None = None,
    ) -> tuple[ContainerView, api_pb2.CreateContainerRequest]:
        spec = self.specs[pod.id]
        config = container_config(spec, container, node_memory=NODE_MEMORY, restart_count=attempt)
        for size, limit in (hugepages or {}).items():
            config.linux.resources.hugepage_limits.add(page_size=size, limit=limit)
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=sandbox_config(spec)
        )
        return container_view_from_config("", pod, config), request

    async def begin_create(
        self,
        pod: PodView,
        container: ContainerSpec,
        *,
        attempt: int = 0,
        affinity: TopologyHint | None = None,
        cpuset: str | None = None,
        hugepages: Mapping[str, int] | None = None,
    ) -> Created:
        """CreateContainer's hints and pre stages (Reject propagates). `cpuset`: what an
        earlier hook (cpuset) set on the request."""
        view, request = self.create_request(pod, container, attempt=attempt, hugepages=hugepages)
        if cpuset is not None:
            request.config.linux.resources.cpuset_cpus = cpuset
        created = Created(view, request)
        created.hints = await self.stage(Event.CREATE_CONTAINER, Stage.HINTS, pod, view, request)
        created.pre = await self.stage(
            Event.CREATE_CONTAINER, Stage.PRE, pod, view, request, affinity=affinity
        )
        if created.pre is not None:
            for key, value in created.pre.change_items():
                apply_change(Event.CREATE_CONTAINER, request, key, value)
        return created

    async def finish_create(self, pod: PodView, created: Created, cid: str) -> Created:
        """The runtime created it: the pre stage's updates go out, then the post stage."""
        if created.pre is not None:
            self._apply_updates(every_update(created.pre))
        self.runtime.create(cid, created.request.config.linux.resources.oom_score_adj)
        response = api_pb2.CreateContainerResponse(container_id=cid)
        created.post = await self.stage(
            Event.CREATE_CONTAINER, Stage.POST, pod, created.view, created.request, response
        )
        created.cid = cid
        self.containers[cid] = container_view_from_config(cid, pod, created.request.config)
        self.states[cid] = ContainerState.CREATED
        self.runtime.states.setdefault(pod.id, {})[cid] = ContainerState.CREATED
        self._apply(Event.CREATE_CONTAINER, created.request, created.post)
        return created

    async def fail_create(
        self, pod: PodView, created: Created, *, failure: str = "runtime said no"
    ) -> None:
        await self.stage(
            Event.CREATE_CONTAINER,
            Stage.FAILED,
            pod,
            created.view,
            created.request,
            failure=failure,
        )

    async def create(
        self,
        pod: PodView,
        container: ContainerSpec,
        cid: str,
        *,
        attempt: int = 0,
        affinity: TopologyHint | None = None,
        cpuset: str | None = None,
        hugepages: Mapping[str, int] | None = None,
        start: bool = True,
    ) -> Created:
        """CreateContainer through hints, pre and post, then StartContainer."""
        created = await self.begin_create(
            pod, container, attempt=attempt, affinity=affinity, cpuset=cpuset, hugepages=hugepages
        )
        await self.finish_create(pod, created, cid)
        if start:
            self.set_state(cid, ContainerState.RUNNING)
        return created

    def set_state(self, cid: str, state: ContainerState) -> None:
        self.states[cid] = state
        self.runtime.states.setdefault(self.containers[cid].pod_id, {})[cid] = state

    async def stop(self, cid: str) -> Adjustment | None:
        view = self.containers[cid]
        pod = self.pods[view.pod_id]
        request = api_pb2.StopContainerRequest(container_id=cid)
        response = api_pb2.StopContainerResponse()
        self.set_state(cid, ContainerState.EXITED)
        post = await self.stage(Event.STOP_CONTAINER, Stage.POST, pod, view, request, response)
        self._apply(Event.STOP_CONTAINER, request, post)
        return post  # type: ignore[no-any-return]

    async def remove(self, cid: str) -> Adjustment | None:
        view = self.containers[cid]
        pod = self.pods[view.pod_id]
        request = api_pb2.RemoveContainerRequest(container_id=cid)
        response = api_pb2.RemoveContainerResponse()
        del self.containers[cid]
        self.states.pop(cid, None)
        self.runtime.states.get(view.pod_id, {}).pop(cid, None)
        post = await self.stage(Event.REMOVE_CONTAINER, Stage.POST, pod, view, request, response)
        self._apply(Event.REMOVE_CONTAINER, request, post)
        return post  # type: ignore[no-any-return]

    async def update(
        self, cid: str, linux: api_pb2.LinuxContainerResources
    ) -> tuple[Adjustment | None, Adjustment | None, api_pb2.UpdateContainerResourcesRequest]:
        """UpdateContainerResources as kubelet sends it: pre, the request as adjusted, post."""
        view = self.containers[cid]
        pod = self.pods[view.pod_id]
        request = api_pb2.UpdateContainerResourcesRequest(container_id=cid)
        request.linux.CopyFrom(linux)
        event = Event.UPDATE_CONTAINER_RESOURCES
        pre = await self.stage(event, Stage.PRE, pod, view, request)
        if pre is not None:
            for key, value in pre.change_items():
                apply_change(event, request, key, value)
        response = api_pb2.UpdateContainerResourcesResponse()
        post = await self.stage(event, Stage.POST, pod, view, request, response)
        # What crihook's store keeps: the update applied as containerd applies it.
        self.containers[cid] = replace(
            view, resources=resources_updated(view.resources, request.linux)
        )
        if pre is not None:
            self._apply_updates(every_update(pre))
        self._apply(event, request, post)
        return pre, post, request

    async def fail_update(
        self, cid: str, linux: api_pb2.LinuxContainerResources, *, failure: str = "runtime said no"
    ) -> Adjustment | None:
        """UpdateContainerResources whose runtime call fails after the pre stage."""
        view = self.containers[cid]
        pod = self.pods[view.pod_id]
        request = api_pb2.UpdateContainerResourcesRequest(container_id=cid)
        request.linux.CopyFrom(linux)
        event = Event.UPDATE_CONTAINER_RESOURCES
        pre = await self.stage(event, Stage.PRE, pod, view, request)
        await self.stage(event, Stage.FAILED, pod, view, request, failure=failure)
        return pre  # type: ignore[no-any-return]

    # --- what the node runs with ---------------------------------------------------------------
    def cpus(self, cid: str) -> frozenset[int]:
        """The container's CPUs; an unset cpuset is every online CPU."""
        return parse_cpu_list(self.containers[cid].resources.cpuset_cpus) or self.topology.online

    def mems(self, cid: str) -> frozenset[int]:
        return parse_cpu_list(self.containers[cid].resources.cpuset_mems)
