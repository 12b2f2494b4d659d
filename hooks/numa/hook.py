"""The built-in `numa` hook: cpuset.mems, and the memory of Guaranteed containers accounted per
NUMA node as kubelet's memory manager (Static policy) does it.

    [hooks.numa]
    reserved_memory = { "0" = "1Gi" }   # kubelet's --reserved-memory: node = amount
                                        # (default: 100Mi on the first node, kubelet's default
                                        # hard eviction threshold)
    resize_exclusive_memory = false     # kubelet's InPlacePodVerticalScalingExclusiveMemory

- A container of a Guaranteed pod with a memory limit gets memory (and hugepages, from its
  hugepage limits) on NUMA nodes: the nodes the topology policy chose for the container
  (`ctx.affinity`); with no policy, the nodes of its exclusive CPUs (what the `cpuset` hook
  earlier in the chain set; a node kubelet allocates together with others counts as its
  group), or where kubelet's memory manager alone puts it when it has none. When those nodes
  cannot hold it, the allocation widens as kubelet's does, unless the policy insists on a
  preferred placement: then CreateContainer is refused, naming what did not fit. Its
  cpuset.mems are the nodes of its memory.
- Every other container gets all memory nodes.
- Allocations are reserved in the pre stage (on disk before the runtime acts), confirmed
  under the container's id, released when the call fails, when kubelet stops or removes the
  container, and when its pod is removed. The cpuset.mems crihook set is kept on kubelet's
  UpdateContainerResources.
- An in-place resize of placed memory is refused, as kubelet's Static policy refuses it
  while its alpha gate InPlacePodVerticalScalingExclusiveMemory is off (the default).
  `resize_exclusive_memory = true` is that gate: the memory then grows within the NUMA nodes
  the container holds (refused past their free memory) and shrinks in place. A growth is
  reserved in the pre stage and given back if the runtime does not apply it; a shrink gives
  memory back once the runtime applied it.
- Like the cpuset hook it places exempt pods' containers too.
- Its state is a key per container (`saved.py`): a call writes the keys of its pod and
  container, never the whole node's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list
from crihook.hooks.numa.memory import (
    MEMORY,
    Allocation,
    ContainerRef,
    InitContainer,
    MemoryAllocationError,
    MemoryState,
    allocate,
    blocks_doc,
    hugepage_resource,
    memory_hints,
    release,
    resize,
)
from crihook.hooks.numa.saved import (
    OLD_KEYS,
    OWNER_KEY,
    PENDING_KEY,
    RESIZING,
    memory_key,
    read_saved,
)
from crihook.hooks.spec import (
    Adjustment,
    ContainerState,
    ContainerUpdate,
    ContainerView,
    Hook,
    HookContext,
    HookState,
    InvalidRequest,
    PodView,
    PoolUsage,
    QoSClass,
    Reject,
    ResourceDelta,
    ResourceHints,
    SyncContext,
    TopologyHint,
)
from crihook.hooks.spec.options import reject_unknown
from crihook.hooks.spec.views import INIT_CONTAINERS_ANNOTATION, SIDECAR_CONTAINERS_ANNOTATION

__all__ = ["NumaHook", "container_requests", "parse_quantity", "parse_reserved_memory"]

log = logging.getLogger(__name__)

DEFAULT_RESERVED = "100Mi"
_KEYS = {"reserved_memory", "resize_exclusive_memory"}
_QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?")
_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
# kubelet names CRI hugepage sizes "2MB", "1GB", "64KB" (binary multiples).
_PAGE = re.compile(r"([0-9]+)(KB|MB|GB)")
_PAGE_KIB = {"KB": 1, "MB": 1 << 10, "GB": 1 << 20}
_LIVE = (ContainerState.CREATED, ContainerState.RUNNING)


def parse_quantity(text: object) -> int:
    """A Kubernetes memory quantity in bytes: 1073741824, "1Gi", "512Mi", "1G"."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = _QUANTITY.fullmatch(str(text)) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a memory quantity like 1Gi or 512Mi")
    unit = m[2] or ""
    return int(m[1]) * (_BINARY.get(unit) or _DECIMAL.get(unit) or 1)


def parse_reserved_memory(table: object, topology: Topology) -> dict[int, dict[str, int]]:
    """`{"0" = "1Gi"}` (node → memory) or `{"0" = {memory = "1Gi", "hugepages-2Mi" = ...}}`."""
    if table is None:
        first = topology.numa_nodes[0] if topology.numa_nodes else 0
        return {first: {MEMORY: parse_quantity(DEFAULT_RESERVED)}}
    if not isinstance(table, Mapping):
        raise ValueError("numa: reserved_memory must be a table of NUMA node = amount")
    out: dict[int, dict[str, int]] = {}
    for key, value in table.items():
        if not str(key).isdigit():
            raise ValueError(f"numa: reserved_memory: {key!r} is not a NUMA node number")
        node = int(key)
        try:
            if isinstance(value, Mapping):
                out[node] = {str(r): parse_quantity(v) for r, v in value.items()}
            else:
                out[node] = {MEMORY: parse_quantity(value)}
        except ValueError as exc:
            raise ValueError(f"numa: reserved_memory {key}: {exc}") from None
    return out


def container_requests(container: ContainerView) -> dict[str, int] | None:
    """What kubelet's memory manager would account for a container: its memory (the limit,
    which equals the request in a Guaranteed pod) and hugepages; None when it accounts
    nothing (not a Guaranteed pod, no memory limit, or -1: unlimited). A limit the kernel
    would not take (crihook's door refuses it first) is InvalidRequest, not a crash."""
    res = container.resources
    limit = res.memory_limit_bytes
    if res.qos_class is not QoSClass.GUARANTEED or not limit or limit == -1:
        return None
    if limit < 0:
        raise InvalidRequest(
            f"container {container.name!r}: memory_limit_in_bytes {limit} is negative (a limit "
            "in bytes, or -1 for none)"
        )
    requests = {MEMORY: limit}
    for size, pages_limit in res.hugepage_limits.items():
        m = _PAGE.fullmatch(size)
        if m is not None and pages_limit > 0:
            requests[hugepage_resource(int(m[1]) * _PAGE_KIB[m[2]])] = pages_limit
    return requests


class NumaHook(Hook):
    honours_exemption = False
    sets = ("cpuset_mems",)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        reject_unknown("numa", self.options, _KEYS)
        resize_memory = self.options.get("resize_exclusive_memory", False)
        if not isinstance(resize_memory, bool):
            raise ValueError(
                f"numa: resize_exclusive_memory must be true or false, not {resize_memory!r}"
            )
        self.resize_exclusive_memory = resize_memory
        self._node: Topology | None = None
        self._reserved: dict[int, dict[str, int]] = {}
        self._memory: MemoryState | None = None
        self._state: HookState | None = None
        self._owners: dict[str, list[str]] = {}
        """Container id → [pod id, name]: the attempt that holds its name's memory."""
        self._pending: dict[str, dict[str, Any]] = {}
        """Reservation key → {"ref": [pod id, name], "new": bool} until the runtime answers."""
        self._resizing: dict[str, dict[str, int]] = {}
        """Container id → {"from": bytes, "to": bytes}: an in-place resize of its memory the
        runtime has not answered yet (a growth is held already, a shrink not given back)."""
        self._written: dict[str, set[str]] = {}
        """Pod id → the container names whose memory keys are in the state."""

    # --- start-up ----------------------------------------------------------------------------
    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        if self._node is None:
            # Set only once all of it worked: a reserved_memory that does not fit this node
            # fails every synchronize, never leaves a hook that accounts nothing silently.
            reserved = parse_reserved_memory(self.options.get("reserved_memory"), sync.node)
            self._memory = self._load(sync.node, reserved, sync.state)
            self._reserved = reserved
            self._state = sync.state
            self._node = sync.node
        return self._reconcile(sync)

    def _load(
        self, node: Topology, reserved: dict[int, dict[str, int]], state: HookState
    ) -> MemoryState | None:
        if not node.memory:
            log.warning("numa: sysfs shows no per-node memory; memory is not accounted")
            return None
        try:
            empty = MemoryState.build(node, reserved)
        except ValueError as exc:
            raise ValueError(f"numa: reserved_memory: {exc}") from None
        memory = empty
        try:
            saved = read_saved(state.items())
        except ValueError as exc:
            log.error("numa: the saved state is unusable (%s); rebuilt empty", exc)
            return memory
        if saved.memory:
            try:
                memory = MemoryState.from_dict(node, reserved, saved.memory)
            except ValueError as exc:
                log.error("numa: the saved memory state is unusable (%s); rebuilt empty", exc)
        self._owners = saved.owners
        self._pending = saved.pending
        self._resizing = saved.resizing
        if saved.old_layout:  # written whole by an earlier crihook: a key per container now
            for key in OLD_KEYS:
                state.delete(key)
        self._written = {
            pod: set(names) for pod, names in ((saved.memory or {}).get("entries") or {}).items()
        }
        return memory

    def _reconcile(self, sync: SyncContext) -> list[ContainerUpdate]:
        live = {c.id: c for c in sync.containers}
        memory = self._memory
        if memory is not None:
            by_key = {_key(c.pod_id, c.name, c.attempt): c.id for c in sync.containers}
            for key, pending in list(self._pending.items()):
                created = by_key.get(key)
                if created is not None:
                    self._owners[created] = pending["ref"]
                elif pending.get("new"):
                    release(memory, ContainerRef(*pending["ref"]))
                del self._pending[key]
            for cid, change in list(self._resizing.items()):
                self._settle_resize(cid, change, live.get(cid))
            held = {tuple(ref) for cid, ref in self._owners.items() if cid in live}
            self._owners = {cid: ref for cid, ref in self._owners.items() if cid in live}
            for pod, names in list(memory.assignments.items()):
                for name in list(names):
                    if (pod, name) not in held:
                        release(memory, ContainerRef(pod, name))
            for container in sync.containers:
                if container.id not in self._owners:
                    self._adopt(container, sync.container_states.get(container.id))
            self._save_all()
        updates = []
        for cid, container in live.items():
            if sync.container_states.get(cid) not in _LIVE:
                continue
            every = frozenset(self._all_nodes)
            want = self._mems_of(cid) or every  # a container not accounted gets every node
            have = parse_cpu_list(container.resources.cpuset_mems) or every
            if have != want:
                log.warning(
                    "numa: container %s has memory nodes %s, should have %s; repairing",
                    cid[:12],
                    format_cpu_list(have),
                    format_cpu_list(want),
                )
                updates.append(
                    ContainerUpdate(cid, ResourceDelta(cpuset_mems=format_cpu_list(want)))
                )
        return updates

    def _adopt(self, container: ContainerView, state: ContainerState | None) -> None:
        """A Guaranteed container the state does not know (crihook was put in front of a
        running node): its memory accounted on the nodes it runs on, if they hold it."""
        requests = container_requests(container)
        if requests is None or state not in _LIVE or self._memory is None:
            return
        nodes = parse_cpu_list(container.resources.cpuset_mems) or frozenset(self._all_nodes)
        ref = ContainerRef(container.pod_id, container.name)
        try:
            allocate(self._memory, ref, requests, TopologyHint(nodes, False))
        except MemoryAllocationError as exc:
            log.error("numa: container %s not accounted: %s", container.id[:12], exc)
            return
        self._owners[container.id] = [ref.pod, ref.name]

    # --- CreateContainer ---------------------------------------------------------------------
    async def hints_create_container(self, ctx: HookContext) -> ResourceHints | None:
        requests = container_requests(_container(ctx))
        if requests is None or self._memory is None:
            return None
        ref = ContainerRef(ctx.pod.id, _container(ctx).name)
        hints = memory_hints(self._memory, requests, container=ref)
        return hints or None  # kubelet: no mask at all means "no preference"

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        requests = container_requests(container)
        memory = self._memory
        if requests is None or memory is None:
            return Adjustment().set_cpuset_mems(format_cpu_list(self._all_nodes))
        ref = ContainerRef(ctx.pod.id, container.name)
        inits = _init_containers(ctx.pod)
        try:
            if ctx.affinity is not None:  # the topology policy's choice, as kubelet takes it
                allocation = allocate(memory, ref, requests, ctx.affinity, init_containers=inits)
            else:
                allocation = self._near_cpus(ctx, ref, requests, inits)
        except MemoryAllocationError as exc:
            where = f"container {container.name!r} of pod {ctx.pod.namespace}/{ctx.pod.name}"
            nodes = ctx.affinity.numa if ctx.affinity is not None else None
            raise Reject(f"{where}: {_misfit(memory, requests, nodes)}: {exc}") from None
        key = _key(ctx.pod.id, container.name, container.attempt)
        self._pending[key] = {"ref": [ref.pod, ref.name], "new": not allocation.existing}
        self._save(pod=ref.pod, pending=key)
        return Adjustment().set_cpuset_mems(format_cpu_list(allocation.nodes))

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        key = _key(ctx.pod.id, container.name, container.attempt)
        pending = self._pending.pop(key, None)
        if pending is not None:
            cid: str = ctx.response.container_id  # type: ignore[union-attr]
            self._owners[cid] = pending["ref"]
            self._save(owner=cid, pending=key)
        return None

    async def failed_create_container(self, ctx: HookContext) -> None:
        container = _container(ctx)
        key = _key(ctx.pod.id, container.name, container.attempt)
        pending = self._pending.pop(key, None)
        if pending is None or self._memory is None:
            return
        if pending["new"]:
            release(self._memory, ContainerRef(*pending["ref"]))
        self._save(pod=ctx.pod.id, pending=key)

    # --- UpdateContainerResources: what crihook set stays -------------------------------------
    async def pre_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        want = self._mems_of(container.id)
        if want is None:
            return None
        # 0 is "unset" (containerd keeps the limit): kubelet's static CPU manager, crictl.
        limit = ctx.peek_request().linux.memory_limit_in_bytes  # type: ignore[attr-defined]
        held = self._held(container.id)
        if limit and held and limit != held:
            self._resize(ctx, container, held, limit)
        return Adjustment().set_cpuset_mems(format_cpu_list(want))

    def _resize(self, ctx: HookContext, container: ContainerView, held: int, limit: int) -> None:
        """kubelet's rule: memory the Static policy placed is not resized in place while
        InPlacePodVerticalScalingExclusiveMemory is off (`resize_exclusive_memory`, off by
        default as in kubelet): refused. With it, the memory grows within the NUMA nodes it
        is on (held from now on) or shrinks (given back once the runtime applied it)."""
        what = f"resize of container {container.name!r} to {limit} bytes of memory"
        if not self.resize_exclusive_memory:
            raise Reject(
                f"{what} is infeasible: {held} bytes are placed on NUMA nodes for it (kubelet's "
                "memory manager does not resize Guaranteed containers in place; "
                "[hooks.numa] resize_exclusive_memory = true resizes within its NUMA nodes)"
            )
        ref = ContainerRef(*self._owners[container.id])
        assert self._memory is not None
        if limit > held:
            try:
                resize(self._memory, ref, limit)
            except MemoryAllocationError as exc:
                raise Reject(f"{what} is infeasible: {exc}") from None
        self._resizing[container.id] = {"from": held, "to": limit}
        self._save(pod=ref.pod)

    async def post_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        cid = _container(ctx).id
        change = self._resizing.pop(cid, None)
        if change is None:
            return None
        self._settle_resize(cid, change, applied=True)
        self._save(pod=_container(ctx).pod_id)
        return None

    async def failed_update_container_resources(self, ctx: HookContext) -> None:
        cid = _container(ctx).id
        change = self._resizing.pop(cid, None)
        if change is None:
            return
        self._settle_resize(cid, change, applied=False)
        self._save(pod=_container(ctx).pod_id)

    def _settle_resize(
        self,
        cid: str,
        change: Mapping[str, int],
        live: ContainerView | None = None,
        *,
        applied: bool | None = None,
    ) -> None:
        """A resize the runtime answered (`applied`), or one whose answer crihook did not see
        (at a synchronize: applied if the container runs with the new limit): a growth not
        applied is given back, a shrink applied gives back what it no longer needs."""
        self._resizing.pop(cid, None)
        ref = self._owners.get(cid)
        if ref is None or self._memory is None:
            return
        if applied is None:
            applied = live is not None and live.resources.memory_limit_bytes == change["to"]
        grew = change["to"] > change["from"]
        if grew == applied:
            return  # a growth applied is held already; a shrink not applied holds as before
        try:
            resize(self._memory, ContainerRef(*ref), change["from"] if grew else change["to"])
        except MemoryAllocationError as exc:  # giving back always fits: a bug
            log.error("numa: container %s: settling its resize failed: %s", cid[:12], exc)

    def _held(self, container_id: str) -> int | None:
        """The bytes of memory placed for the container, None when it has none placed."""
        ref = self._owners.get(container_id)
        if ref is None or self._memory is None:
            return None
        blocks = self._memory.blocks(ContainerRef(*ref)) or []
        return sum(b.size for b in blocks if b.resource == MEMORY) or None

    # --- giving memory back ------------------------------------------------------------------
    async def post_stop_container(self, ctx: HookContext) -> Adjustment | None:
        self._give_back(_container(ctx).id)
        return None

    async def post_remove_container(self, ctx: HookContext) -> Adjustment | None:
        self._give_back(_container(ctx).id)
        return None

    async def post_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        for cid, (pod, _) in list(self._owners.items()):
            if pod == ctx.pod.id:
                self._give_back(cid)
        for key, pending in list(self._pending.items()):
            if pending["ref"][0] == ctx.pod.id:
                del self._pending[key]
                self._save(pending=key)
        if self._memory is not None:
            names = list(self._memory.assignments.get(ctx.pod.id, {}))
            for name in names:
                release(self._memory, ContainerRef(ctx.pod.id, name))
            if names:  # a pod that held nothing (most do not) writes no state
                self._save(pod=ctx.pod.id)
        return None

    def usage(self) -> list[PoolUsage]:
        """Per NUMA node and kind of memory: bytes allocatable to containers, assigned to
        them, and free (kubelet's memory manager table)."""
        if self._memory is None:
            return []
        figures = []
        for node, state in self._memory.nodes.items():
            for resource, table in sorted(state.memory.items()):
                for what, value in (
                    ("allocatable", table.allocatable),
                    ("assigned", table.reserved),
                    ("free", table.free),
                ):
                    figures.append(PoolUsage("memory", resource, what, str(node), value))
        return figures

    # --- helpers -----------------------------------------------------------------------------
    @property
    def _topology(self) -> Topology:
        if self._node is None:
            raise RuntimeError("numa: called before synchronize (crihook starts hooks so)")
        return self._node

    @property
    def _all_nodes(self) -> tuple[int, ...]:
        node = self._topology
        return tuple(sorted(node.memory)) or node.numa_nodes

    def _near_cpus(
        self,
        ctx: HookContext,
        ref: ContainerRef,
        requests: Mapping[str, int],
        inits: Sequence[InitContainer],
    ) -> Allocation:
        """No topology policy: memory on the NUMA nodes of the container's CPUs (what the
        cpuset hook set) when they can take it; else where kubelet's memory manager would put
        it with no policy (its own best hint)."""
        memory = self._memory
        assert memory is not None
        cpuset = ctx.peek_request().config.linux.resources.cpuset_cpus  # type: ignore[attr-defined]
        cpus = parse_cpu_list(cpuset) & self._topology.online
        # Only exclusive CPUs say where the container runs; a shared pool (any other cpuset)
        # leaves the choice to kubelet's memory manager.
        if cpus and len(cpus) == _container(ctx).resources.integer_cpus:
            # A node kubelet grouped with others serves only that group (kubelet never
            # hints it alone): the group, not the node, is near.
            nodes = frozenset(
                n for node in self._topology.numa_of(cpus) for n in _cells(memory, node)
            )
            near = TopologyHint(nodes, False)
            try:
                return allocate(memory, ref, requests, near, init_containers=inits)
            except MemoryAllocationError:
                pass  # those nodes are grouped with others already: kubelet's own choice
        return allocate(memory, ref, requests, None, init_containers=inits)

    def _mems_of(self, container_id: str) -> frozenset[int] | None:
        ref = self._owners.get(container_id)
        if ref is None or self._memory is None:
            return None
        blocks = self._memory.blocks(ContainerRef(*ref))
        if not blocks:
            return None
        return frozenset(n for b in blocks for n in b.numa)

    def _give_back(self, container_id: str) -> None:
        ref = self._owners.pop(container_id, None)
        if ref is None:
            return
        still_held = any(r == ref for r in self._owners.values())  # a later attempt's
        if not still_held and self._memory is not None:
            release(self._memory, ContainerRef(*ref))
        self._save(pod=ref[0], owner=container_id)

    def _save(self, pod: str = "", owner: str = "", pending: str = "") -> None:
        """Write what a call changed: the memory keys of `pod`'s containers, the owner key
        of container `owner`, the reservation `pending` (see saved.py)."""
        state, memory = self._state, self._memory
        if state is None or memory is None:
            return
        if pod:
            names = memory.assignments.get(pod, {})
            for gone in self._written.pop(pod, set()) - names.keys():
                state.delete(memory_key(pod, gone))
            for name, blocks in names.items():
                state.set(memory_key(pod, name), blocks_doc(blocks))
            if names:
                self._written[pod] = set(names)
        if owner:
            ref = self._owners.get(owner)
            if ref is None:
                state.delete(OWNER_KEY + owner)
            else:
                state.set(OWNER_KEY + owner, list(ref))
        if pending:
            reservation = self._pending.get(pending)
            if reservation is None:
                state.delete(PENDING_KEY + pending)
            else:
                state.set(PENDING_KEY + pending, reservation)
        # Written only while a resize is pending: every other call saves no more than before.
        if self._resizing:
            state.set(RESIZING, self._resizing)
        elif state.get(RESIZING) is not None:
            state.delete(RESIZING)

    def _save_all(self) -> None:
        """Everything written anew, and keys of what is gone deleted (at a synchronize)."""
        state, memory = self._state, self._memory
        if state is None or memory is None:
            return
        kept = {OWNER_KEY + c for c in self._owners} | {PENDING_KEY + k for k in self._pending}
        for key, _ in list(state.items()):
            if key.startswith((OWNER_KEY, PENDING_KEY)) and key not in kept:
                state.delete(key)
        for pod in set(self._written) | set(memory.assignments):
            self._save(pod=pod)
        for cid in self._owners:
            self._save(owner=cid)
        for key in self._pending:
            self._save(pending=key)


def _init_containers(pod: PodView) -> list[InitContainer]:
    sidecars = {
        n.strip() for n in pod.annotations.get(SIDECAR_CONTAINERS_ANNOTATION, "").split(",")
    }
    names = [n.strip() for n in pod.annotations.get(INIT_CONTAINERS_ANNOTATION, "").split(",")]
    return [InitContainer(n, restartable=n in sidecars) for n in names if n]


def _key(pod_id: str, name: str, attempt: int) -> str:
    return f"{pod_id}/{name}/{attempt}"


def _describe(requests: Mapping[str, int]) -> str:
    return ", ".join(f"{r}={v}" for r, v in sorted(requests.items()))


def _cells(memory: MemoryState, node: int) -> tuple[int, ...]:
    state = memory.nodes.get(node)
    return state.cells if state is not None else (node,)


def _misfit(memory: MemoryState, requests: Mapping[str, int], nodes: frozenset[int] | None) -> str:
    """What did not fit: each request above the free memory of `nodes` (all nodes when
    None), with that free memory; every request when each fits on its own."""
    where = sorted(memory.nodes) if nodes is None else sorted(nodes)
    short = []
    for resource, size in sorted(requests.items()):
        tables = [memory.nodes[n].memory.get(resource) for n in where if n in memory.nodes]
        free = sum(t.free for t in tables if t is not None)
        if size > free:
            short.append(f"{resource} {size} bytes (free: {free})")
    if not short:
        return f"memory {_describe(requests)}"
    return f"{', '.join(short)} on NUMA node(s) {format_cpu_list(where)}"


def _container(ctx: HookContext) -> ContainerView:
    assert ctx.container is not None, "container stages always carry the container"
    return ctx.container
