"""Kubelet's memory manager, Static policy: NUMA hints for a Guaranteed container's memory and
hugepages, the allocation that follows the merged hint, and the machine state behind both.

Pure functions over a `MemoryState` that the caller owns and persists:

* `MemoryState.build(topology, reserved)`: kubelet's default machine state. Per NUMA node and
  per resource ("memory" and "hugepages-<size>", the size as kubelet names it, "2Mi", "1Gi"):
  total, system-reserved (``reserved``, kubelet's --reserved-memory), allocatable, reserved
  (by containers) and free; and per node the number of assignments and the cells, the group
  of nodes it is allocated with.
* `memory_hints(state, requests, container=...)`: kubelet's GetTopologyHints.
* `allocate(state, container, requests, affinity, init_containers=...)`: kubelet's Allocate.
* `release(state, container)`: kubelet's RemoveContainer.
* `resize(state, container, size)`: an in-place resize of a container's memory within the
  NUMA nodes it holds (not kubelet's: its Static policy does not resize, see below).
* `state.to_dict()` / `MemoryState.from_dict(topology, reserved, data)`: the containers'
  blocks as JSON, and the machine state rebuilt from the topology and those blocks the way
  kubelet's validateState recomputes it at start.

Followed: kubernetes/kubernetes ``pkg/kubelet/cm/memorymanager/policy_static.go`` at
030880a5dc5449403c6d1f0aa146a7dc21d6c6dc, ``state/state.go`` at
03a94bce366bff83b4cf6ad8da338d1da67f2526, and the vectors of ``policy_static_test.go`` at
1c9cf914f2f951313b8e9f7c321f5bd50b5e3d9f.

Kubelet's rules, as ported here:

* Hints: every NUMA mask (by size, then in order) whose nodes' allocatable memory covers each
  request sets the minimal size; it becomes a hint if, besides, a one-node mask's node is in
  no group with other nodes, a wider mask's already used nodes are grouped with exactly this
  mask, and free memory (plus memory the pod's init containers leave to reuse) covers each
  request. Hints of the minimal size are preferred. No mask at all: an empty map, which the
  topology manager reads as "no preference" (not "cannot be placed").
* A container that already has blocks gets them back as preferred hints (kubelet after a
  restart), or no hints when its requests no longer match its blocks.
* Allocate: with no NUMA affinity from the topology manager the policy's own best hint is
  used (the preferred, then narrowest, of the "memory" hints); an affinity whose free memory
  is short is extended to the best hint that contains it; a preferred affinity must stay
  preferred. Memory is taken node by node in ascending order, every node of the mask counts
  one assignment per resource and joins the mask's group.
* Init containers: memory a regular (non-restartable) init container got stays reusable by
  the containers after it in the same pod on the same mask; their blocks keep their full size
  while the reused part is taken off the init containers' blocks. Like kubelet, this
  bookkeeping lives in memory only (`MemoryState.reusable`) and is not persisted.

Deliberate differences:

* Requests name resources as kubelet's pod spec does; other resources are ignored (kubelet
  filters them out too). The caller decides QoS: kubelet skips non-Guaranteed pods.
* Where kubelet would dereference a missing table and crash (a hint naming a NUMA node or a
  hugepage size the machine lacks), this module treats the missing table as empty or raises
  MemoryAllocationError; a request without "memory" (impossible for Guaranteed pods) raises.
* `build` refuses reservations on NUMA nodes the topology lacks and reservations larger than
  a node's memory, which kubelet would accept or underflow.
* Error messages are kubelet's without its "[memorymanager]" prefix.
* `resize`: kubelet's Static policy refuses an in-place memory resize of a Guaranteed pod
  at admission, and with its alpha gate InPlacePodVerticalScalingExclusiveMemory on it admits
  the resize and leaves its state as it was (Allocate handles only the add operation). Here
  the "memory" block grows into, or shrinks back from, the free memory of the nodes it is on,
  taken and given back node by node in order as `allocate` and `release` do; a growth they
  cannot hold is refused, never placed elsewhere.
* Newer stored kubelet sources add pod-level resource managers and a memory drift tolerance
  at restart, both behind feature gates that are off by default; not implemented. Only the
  pod-level request arithmetic (`pod_memory_requests`) is ported.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crihook.hooks.node.topology import Topology
from crihook.hooks.spec.hints import TopologyHint

__all__ = [
    "HUGEPAGES_PREFIX",
    "MEMORY",
    "Allocation",
    "Block",
    "ContainerRef",
    "InitContainer",
    "MemoryAllocationError",
    "MemoryState",
    "MemoryTable",
    "NodeState",
    "allocate",
    "blocks_doc",
    "hugepage_resource",
    "memory_hints",
    "pod_memory_requests",
    "release",
    "resize",
]

MEMORY = "memory"
HUGEPAGES_PREFIX = "hugepages-"
_FORMAT = 1

_BINARY_SUFFIXES = ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki"))


def hugepage_resource(page_kib: int) -> str:
    """The resource name kubelet gives a hugepage size: 2048 KiB → "hugepages-2Mi"."""
    size = page_kib * 1024
    for shift, suffix in _BINARY_SUFFIXES:
        if size % (1 << shift) == 0:
            return f"{HUGEPAGES_PREFIX}{size >> shift}{suffix}"
    return f"{HUGEPAGES_PREFIX}{size}"  # unreachable for whole KiB


class MemoryAllocationError(ValueError):
    """The request cannot be placed; the message is kubelet's."""

    def __init__(self, message: str, container: ContainerRef | None = None) -> None:
        super().__init__(message)
        self.container = container


@dataclass(slots=True)
class MemoryTable:
    """kubelet's state.MemoryTable, bytes."""

    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


@dataclass(slots=True)
class NodeState:
    """kubelet's state.NUMANodeState."""

    memory: dict[str, MemoryTable]
    """Resource name → its table on this node."""
    cells: tuple[int, ...]
    """This node and the nodes it is allocated together with (just itself when unused)."""
    assignments: int = 0
    """Blocks placed on this node (a container with memory and hugepages counts two)."""


@dataclass(frozen=True, slots=True)
class Block:
    """kubelet's state.Block: `size` bytes of `resource` on the nodes of `numa`."""

    numa: tuple[int, ...]
    resource: str
    size: int


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A container as kubelet's memory state keys it."""

    pod: str
    """The pod's UID."""
    name: str


@dataclass(frozen=True, slots=True)
class InitContainer:
    """One of the pod's init containers, in the pod's order."""

    name: str
    restartable: bool = False
    """restartPolicy: Always (a sidecar): its memory is never reused."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """What `allocate` decided for one container."""

    container: ContainerRef
    blocks: tuple[Block, ...]
    reserved: Mapping[int, Mapping[str, int]]
    """Node → resource → bytes this call moved from free to reserved (what init containers
    left to reuse is not taken again; empty when `existing`)."""
    existing: bool = False
    """The container already had blocks; nothing changed (kubelet's Allocate is idempotent)."""

    @property
    def nodes(self) -> frozenset[int]:
        """The NUMA nodes of the container's memory: its cpuset.mems."""
        return frozenset(n for b in self.blocks for n in b.numa)


ReusableMemory = dict[str, dict[frozenset[int], dict[str, int]]]
"""Pod UID → NUMA mask → resource → bytes the pod's init containers leave to reuse."""


class MemoryState:
    """kubelet's memory manager state: the machine state and the containers' blocks."""

    def __init__(
        self,
        nodes: Mapping[int, NodeState],
        assignments: Mapping[str, Mapping[str, Sequence[Block]]] | None = None,
    ) -> None:
        self.nodes: dict[int, NodeState] = dict(sorted(nodes.items()))
        self.assignments: dict[str, dict[str, list[Block]]] = {
            pod: {name: list(blocks) for name, blocks in containers.items()}
            for pod, containers in (assignments or {}).items()
        }
        self.reusable: ReusableMemory = {}
        """kubelet's initContainersReusableMemory; kept for one pod at a time, not persisted."""

    def blocks(self, container: ContainerRef) -> list[Block] | None:
        """The container's blocks, None when it has none in the state."""
        blocks = self.assignments.get(container.pod, {}).get(container.name)
        return None if blocks is None else list(blocks)

    @classmethod
    def build(cls, topology: Topology, reserved: Mapping[int, Mapping[str, int]]) -> MemoryState:
        """kubelet's default machine state: per node, memory and hugepages less `reserved`.

        `reserved` is kubelet's --reserved-memory: NUMA node → resource → bytes. Like kubelet's
        static policy, some "memory" must be reserved.
        """
        unknown = set(reserved) - set(topology.numa_nodes)
        if unknown:
            raise ValueError(f"reserved memory names NUMA nodes this machine lacks: {unknown}")
        if sum(node.get(MEMORY, 0) for node in reserved.values()) <= 0:
            raise ValueError("you should specify the system reserved memory")
        nodes: dict[int, NodeState] = {}
        for node in topology.numa_nodes:
            info = topology.memory.get(node)
            node_reserved = reserved.get(node, {})
            tables: dict[str, MemoryTable] = {}
            hugepages_total = 0
            for page_kib, pages in sorted((info.hugepages if info else {}).items()):
                name = hugepage_resource(page_kib)
                total = pages * page_kib * 1024
                tables[name] = _table(node, name, total, node_reserved.get(name, 0))
                hugepages_total += total
            memory_total = info.total_bytes if info else 0
            tables[MEMORY] = _table(
                node, MEMORY, memory_total, node_reserved.get(MEMORY, 0), hugepages_total
            )
            nodes[node] = NodeState(tables, (node,))
        return cls(nodes)

    def to_dict(self) -> dict[str, Any]:
        """The containers' blocks, JSON-ready; with the topology they rebuild the state."""
        return {
            "version": _FORMAT,
            "entries": {
                pod: {name: blocks_doc(blocks) for name, blocks in containers.items()}
                for pod, containers in self.assignments.items()
            },
        }

    @classmethod
    def from_dict(
        cls,
        topology: Topology,
        reserved: Mapping[int, Mapping[str, int]],
        data: Mapping[str, Any],
    ) -> MemoryState:
        """The state `to_dict` saved, on this machine: kubelet's validateState recomputation.

        The machine state is the default one with every saved block taken again, in the saved
        order, node by node as kubelet does at start. ValueError when the data is not what
        `to_dict` writes or a block names a NUMA node or resource this machine lacks.
        """
        if data.get("version") != _FORMAT:
            raise ValueError(f"memory state: unsupported version {data.get('version')!r}")
        state = cls.build(topology, reserved)
        entries = data.get("entries")
        if not isinstance(entries, Mapping):
            raise ValueError("memory state: 'entries' must be an object")
        for pod, containers in entries.items():
            if not isinstance(containers, Mapping):
                raise ValueError(f"memory state: pod {pod!r} must map container names to blocks")
            for name, raw_blocks in containers.items():
                blocks = [_block_from_dict(pod, name, raw) for raw in raw_blocks]
                for block in blocks:
                    _replay(state, pod, name, block)
                state.assignments.setdefault(pod, {})[name] = blocks
        return state


def blocks_doc(blocks: Iterable[Block]) -> list[dict[str, Any]]:
    """A container's blocks, JSON-ready (as `MemoryState.to_dict` lists them)."""
    return [{"numaAffinity": list(b.numa), "type": b.resource, "size": b.size} for b in blocks]


def _table(
    node: int, resource: str, total: int, system_reserved: int, hugepages: int = 0
) -> MemoryTable:
    allocatable = total - system_reserved - hugepages
    if system_reserved < 0 or allocatable < 0:
        raise ValueError(
            f"NUMA node {node}: reserved {resource} {system_reserved} does not fit in "
            f"{total - hugepages} bytes"
        )
    return MemoryTable(total, system_reserved, allocatable, 0, allocatable)


def _block_from_dict(pod: str, name: str, raw: Any) -> Block:
    bad = f"memory state: (pod: {pod}, container: {name}) bad block {raw!r}"
    try:
        numa = tuple(sorted({int(n) for n in raw["numaAffinity"]}))
        block = Block(numa, str(raw["type"]), int(raw["size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(bad) from exc
    if block.size < 0 or not numa:
        raise ValueError(bad)
    return block


def _replay(state: MemoryState, pod: str, name: str, block: Block) -> None:
    """validateState's recomputation of one saved block."""
    remaining = block.size
    for node in block.numa:
        node_state = state.nodes.get(node)
        if node_state is None:
            raise ValueError(
                f"(pod: {pod}, container: {name}) the memory assignment uses the NUMA that "
                f"does not exist"
            )
        node_state.assignments += 1
        node_state.cells = block.numa
        table = node_state.memory.get(block.resource)
        if table is None:
            raise ValueError(
                f"(pod: {pod}, container: {name}) the memory assignment uses memory resource "
                f"that does not exist"
            )
        remaining = _take_from(table, remaining)


def _take_from(table: MemoryTable, size: int) -> int:
    """Move up to `size` bytes from free to reserved; what is left to take elsewhere."""
    if size == 0 or table.free <= 0:
        return size
    taken = min(size, table.free)
    table.reserved += taken
    table.free -= taken
    return size - taken


# --- requests ------------------------------------------------------------------------------


def _is_memory(resource: str) -> bool:
    return resource == MEMORY or resource.startswith(HUGEPAGES_PREFIX)


def _memory_requests(requests: Mapping[str, int]) -> dict[str, int]:
    """getRequestedResources: the memory and hugepages requests, in bytes."""
    out: dict[str, int] = {}
    for resource, size in requests.items():
        if not _is_memory(resource):
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"request for {resource} must be a whole number of bytes: {size!r}")
        out[resource] = size
    return out


def pod_memory_requests(
    containers: Sequence[Mapping[str, int]],
    init_containers: Sequence[tuple[Mapping[str, int], bool]] = (),
) -> dict[str, int]:
    """getPodRequestedResources: what the pod needs at its peak, per resource.

    `init_containers` are (requests, restartable) in the pod's order. A resource counts only if
    some app container requests it; its need is the larger of the app containers plus the
    restartable init containers, and the peak while init containers run one by one.
    """
    by_init: dict[str, int] = {}
    by_restartable: dict[str, int] = {}
    for requests, restartable in init_containers:
        for resource, size in _memory_requests(requests).items():
            by_init.setdefault(resource, 0)
            if restartable:
                by_restartable[resource] = by_restartable.get(resource, 0) + size
            elif by_restartable.get(resource, 0) + size > by_init[resource]:
                by_init[resource] = by_restartable.get(resource, 0) + size
    by_app: dict[str, int] = {}
    for requests in containers:
        for resource, size in _memory_requests(requests).items():
            by_app[resource] = by_app.get(resource, 0) + size
    return {
        resource: max(size + by_restartable.get(resource, 0), by_init.get(resource, 0))
        for resource, size in by_app.items()
    }


# --- hints ---------------------------------------------------------------------------------


def memory_hints(
    state: MemoryState,
    requests: Mapping[str, int],
    *,
    container: ContainerRef | None = None,
) -> dict[str, list[TopologyHint]]:
    """kubelet's GetTopologyHints for a Guaranteed container's requests.

    With `container`, a container that already has blocks gets them back as preferred hints
    (an empty map when they no longer match its requests), and memory its pod's init
    containers left to reuse counts as free. An empty map means "no preference".
    """
    wanted = _memory_requests(requests)
    if container is not None:
        blocks = state.blocks(container)
        if blocks is not None:
            return _regenerate_hints(blocks, wanted)
    return _calculate_hints(state, wanted, None if container is None else container.pod)


def _regenerate_hints(blocks: list[Block], wanted: dict[str, int]) -> dict[str, list[TopologyHint]]:
    """regenerateHints: the blocks as preferred hints, or nothing when they differ."""
    hints: dict[str, list[TopologyHint]] = {resource: [] for resource in wanted}
    if len(blocks) != len(wanted):
        return {}
    for block in blocks:
        if block.resource not in wanted or block.size != wanted[block.resource]:
            return {}
        hints[block.resource].append(TopologyHint(frozenset(block.numa), True))
    return hints


def _free(node: NodeState, resource: str) -> int:
    table = node.memory.get(resource)
    return 0 if table is None else table.free


def _allocatable(node: NodeState, resource: str) -> int:
    table = node.memory.get(resource)
    return 0 if table is None else table.allocatable


def _calculate_hints(
    state: MemoryState, wanted: dict[str, int], pod: str | None
) -> dict[str, list[TopologyHint]]:
    """calculateHints."""
    numa_nodes = sorted(state.nodes)
    min_size = len(numa_nodes)
    found: list[tuple[int, ...]] = []
    for size in range(1, len(numa_nodes) + 1):
        for mask in itertools.combinations(numa_nodes, size):
            nodes = [state.nodes[n] for n in mask]
            if any(sum(_allocatable(n, r) for n in nodes) < req for r, req in wanted.items()):
                continue
            min_size = min(min_size, size)
            if size == 1 and len(nodes[0].cells) > 1:
                continue  # the node is grouped with others: no single-node allocation
            if size > 1 and any(
                n.assignments > 0 and (len(n.cells) == 1 or sorted(n.cells) != list(mask))
                for n in nodes
            ):
                continue  # a used node only serves its own group
            key = frozenset(mask)
            if any(
                sum(_free(n, r) for n in nodes) + _reusable(state, pod, key, r) < req
                for r, req in wanted.items()
            ):
                continue
            found.append(mask)
    if not found:
        return {}
    return {
        resource: [TopologyHint(frozenset(mask), len(mask) == min_size) for mask in found]
        for resource in wanted
    }


def _find_best_hint(hints: Iterable[TopologyHint]) -> TopologyHint | None:
    """findBestHint: preferred first, then the narrowest (kubelet's IsNarrowerThan)."""
    best: TopologyHint | None = None
    for hint in hints:
        if (
            best is None
            or (hint.preferred and not best.preferred)
            or (hint.preferred == best.preferred and _narrower(hint, best))
        ):
            best = hint
    return best


def _narrower(a: TopologyHint, b: TopologyHint) -> bool:
    assert a.numa is not None and b.numa is not None
    if len(a.numa) != len(b.numa):
        return len(a.numa) < len(b.numa)
    return sum(1 << n for n in a.numa) < sum(1 << n for n in b.numa)


# --- allocate / release --------------------------------------------------------------------


def allocate(
    state: MemoryState,
    container: ContainerRef,
    requests: Mapping[str, int],
    affinity: TopologyHint | None,
    *,
    init_containers: Sequence[InitContainer] = (),
) -> Allocation:
    """kubelet's Allocate for one container of a Guaranteed pod; updates `state`.

    `affinity` is the topology manager's merged hint for the container (None: kubelet's
    zero hint, no affinity and not preferred). `init_containers` are the pod's init
    containers in order, for kubelet's reuse of their memory. MemoryAllocationError when the
    request cannot be placed; the state is then unchanged.
    """
    wanted = _memory_requests(requests)
    existing = state.blocks(container)
    if existing is not None:
        _update_reusable(state, container, init_containers, existing)
        return Allocation(container, tuple(existing), {}, existing=True)

    best = affinity if affinity is not None else TopologyHint(None, False)
    if best.numa is None:
        default = _default_hint(state, wanted, container)
        if not default.preferred and best.preferred:
            raise MemoryAllocationError("failed to find the default preferred hint", container)
        best = default
    assert best.numa is not None
    missing = best.numa - set(state.nodes)
    if missing:
        raise MemoryAllocationError(
            f"the topology hint names NUMA nodes without memory state: {sorted(missing)}",
            container,
        )
    if not _satisfies(state, best.numa, wanted):
        extended = _extend_hint(state, wanted, best.numa, container)
        if not extended.preferred and best.preferred:
            raise MemoryAllocationError("failed to find the extended preferred hint", container)
        best = extended
    assert best.numa is not None
    if _violates_numa_allocations(state, best.numa):
        raise MemoryAllocationError("preferred hint violates NUMA node allocation", container)

    numa = tuple(sorted(best.numa))
    blocks: list[Block] = []
    taken: dict[int, dict[str, int]] = {}
    for resource, size in wanted.items():
        blocks.append(Block(numa, resource, size))
        reusable = _reusable(state, container.pod, best.numa, resource)
        _reserve(state, numa, resource, max(size - reusable, 0), taken)
    _update_reusable(state, container, init_containers, blocks)
    state.assignments.setdefault(container.pod, {})[container.name] = blocks
    _shrink_init_blocks(state, container, init_containers, blocks)
    return Allocation(container, tuple(blocks), taken)


def release(state: MemoryState, container: ContainerRef) -> None:
    """kubelet's RemoveContainer: drop the container's blocks, give their memory back."""
    blocks = state.blocks(container)
    if blocks is None:
        return
    containers = state.assignments[container.pod]
    del containers[container.name]
    if not containers:
        del state.assignments[container.pod]
    for block in blocks:
        released = block.size
        for node in block.numa:
            node_state = state.nodes[node]
            node_state.assignments -= 1
            if node_state.assignments == 0:
                node_state.cells = (node,)
            table = node_state.memory.get(block.resource)
            if released == 0 or table is None or table.reserved == 0:
                continue
            given = min(released, table.reserved)
            table.free += given
            table.reserved -= given
            released -= given


def resize(state: MemoryState, container: ContainerRef, size: int) -> int:
    """The container's "memory" block made `size` bytes on the NUMA nodes it is on: the
    growth taken from their free memory, a shrink given back to them. Returns the size it
    had. MemoryAllocationError when it has no memory block, or when those nodes' free memory
    cannot hold the growth; the state is then unchanged."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"memory size must be a whole number of bytes: {size!r}")
    blocks = state.blocks(container) or []
    held = [b for b in blocks if b.resource == MEMORY]
    if len(held) != 1:
        raise MemoryAllocationError("the container has no memory placed on NUMA nodes", container)
    block = held[0]
    tables = [state.nodes[n].memory[MEMORY] for n in block.numa if MEMORY in state.nodes[n].memory]
    if size > block.size:
        free = sum(t.free for t in tables)
        if size - block.size > free:
            nodes = ",".join(str(n) for n in block.numa)
            raise MemoryAllocationError(
                f"{size - block.size} more bytes of memory do not fit on NUMA node(s) {nodes} "
                f"it holds ({free} bytes free there)",
                container,
            )
        left = size - block.size
        for table in tables:
            left = _take_from(table, left)
    else:
        given = block.size - size
        for table in tables:
            back = min(given, table.reserved)
            table.reserved -= back
            table.free += back
            given -= back
    resized = dataclasses.replace(block, size=size)
    state.assignments[container.pod][container.name] = [
        resized if b is block else b for b in blocks
    ]
    return block.size


def _default_hint(
    state: MemoryState, wanted: dict[str, int], container: ContainerRef
) -> TopologyHint:
    """getDefaultHint: the best of the policy's own hints for regular memory."""
    hints = _calculate_hints(state, wanted, container.pod)
    if not hints:
        raise MemoryAllocationError(
            "failed to get the default NUMA affinity, no NUMA nodes with enough memory is "
            "available",
            container,
        )
    best = _find_best_hint(hints.get(MEMORY, []))
    if best is None:  # kubelet dereferences nil here
        raise MemoryAllocationError("a container with hugepages must request memory", container)
    return best


def _extend_hint(
    state: MemoryState, wanted: dict[str, int], mask: frozenset[int], container: ContainerRef
) -> TopologyHint:
    """extendTopologyManagerHint: the best of the policy's hints that contain `mask`."""
    hints = _calculate_hints(state, wanted, container.pod).get(MEMORY, [])
    best = _find_best_hint(h for h in hints if h.numa is not None and mask <= h.numa)
    if best is None:
        raise MemoryAllocationError(
            "failed to find NUMA nodes to extend the current topology hint", container
        )
    return best


def _satisfies(state: MemoryState, mask: frozenset[int], wanted: dict[str, int]) -> bool:
    """isAffinitySatisfyRequest: free memory on the mask covers every request."""
    nodes = [state.nodes[n] for n in sorted(mask)]
    return all(sum(_free(n, r) for n in nodes) >= req for r, req in wanted.items())


def _violates_numa_allocations(state: MemoryState, mask: frozenset[int]) -> bool:
    """isAffinityViolatingNUMAAllocations: a node cannot serve both one-node and group use."""
    if len(mask) == 1:
        return False
    bits = sorted(mask)
    for node in bits:
        node_state = state.nodes[node]
        if node_state.assignments == 0:
            continue
        if len(node_state.cells) == 1 or sorted(node_state.cells) != bits:
            return True
    return False


def _reserve(
    state: MemoryState,
    numa: tuple[int, ...],
    resource: str,
    size: int,
    taken: dict[int, dict[str, int]],
) -> None:
    """updateMachineState: count the assignment on every node, take memory in node order."""
    for node in numa:
        node_state = state.nodes[node]
        node_state.assignments += 1
        node_state.cells = numa
        table = node_state.memory.get(resource)
        if table is None:
            continue
        left = _take_from(table, size)
        if left != size:
            taken.setdefault(node, {})[resource] = size - left
        size = left


def _reusable(state: MemoryState, pod: str | None, mask: frozenset[int], resource: str) -> int:
    """getPodReusableMemory."""
    if pod is None:
        return 0
    return state.reusable.get(pod, {}).get(mask, {}).get(resource, 0)


def _is_regular_init(name: str, init_containers: Sequence[InitContainer]) -> bool:
    for init in init_containers:
        if init.name == name:
            return not init.restartable
    return False


def _update_reusable(
    state: MemoryState,
    container: ContainerRef,
    init_containers: Sequence[InitContainer],
    blocks: Sequence[Block],
) -> None:
    """updatePodReusableMemory: init containers leave memory, the next containers use it."""
    for pod in list(state.reusable):
        if pod != container.pod:
            del state.reusable[pod]
    if _is_regular_init(container.name, init_containers):
        per_mask = state.reusable.setdefault(container.pod, {})
        for block in blocks:
            per_resource = per_mask.setdefault(frozenset(block.numa), {})
            if block.size > per_resource.get(block.resource, 0):
                per_resource[block.resource] = block.size
        return
    for block in blocks:
        mask = frozenset(block.numa)
        reusable = _reusable(state, container.pod, mask, block.resource)
        if reusable != 0:
            state.reusable[container.pod][mask][block.resource] = max(reusable - block.size, 0)


def _shrink_init_blocks(
    state: MemoryState,
    container: ContainerRef,
    init_containers: Sequence[InitContainer],
    blocks: Sequence[Block],
) -> None:
    """updateInitContainersMemoryBlocks: the memory this container reused comes off the
    blocks of the regular init containers before it, so the pod's blocks add up."""
    pod_blocks = state.assignments.get(container.pod, {})
    for block in blocks:
        left = block.size
        for init in init_containers:
            if init.name == container.name or left == 0:
                break
            if init.restartable:
                continue
            init_blocks = pod_blocks.get(init.name)
            if not init_blocks:
                continue
            shrunk: list[Block] = []
            for init_block in init_blocks:
                if (
                    init_block.size != 0
                    and init_block.resource == block.resource
                    and set(init_block.numa) == set(block.numa)
                ):
                    used = min(init_block.size, left)
                    left -= used
                    init_block = dataclasses.replace(init_block, size=init_block.size - used)
                shrunk.append(init_block)
            pod_blocks[init.name] = shrunk
