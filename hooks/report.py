"""What a built-in hook tells of itself outside the call path, read through the registry
(`crihook.hooks.builtin`): its part of node.json, what it holds for `crihook state --cpus`,
and its facts for a recording's header.

A hook may also check its options against the host before crihook serves (`HostCheck`).

A `BuiltinHook` names each reader as `package.module:function`, imported only when the hook
is configured (or, for `crihook state --cpus`, has state or is named in node.json). The proxy
calls the readers of the built-ins at their default positions in the chain (`BUILTIN_ORDER`)
and names no hook: where two hooks can give the same thing (the CPU ledger: the cpuset hook's,
or Koordinator's when no cpuset hook runs), the first one gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crihook.hooks.node import HostFiles, Topology

__all__ = [
    "Draft",
    "HeaderFacts",
    "Holdings",
    "HoldingsReader",
    "HostCheck",
    "MemoryBlock",
    "NodeDocPart",
    "NodeMemory",
    "SavedLedger",
]

NodeDocPart = Callable[[str, Mapping[str, Any], Topology, str], Mapping[str, Any]]
"""(the hook's name, its options, the node's topology, `[node] topology_policy`) → its keys
of node.json. A None value gives nothing: the key stays a later hook's, or None."""

HeaderFacts = Callable[[Mapping[str, Any], HostFiles], list[dict[str, Any]]]
"""(the hook's options, the host's files) → its device pools for a recording's header, each
path looked up through `files` (which the recorder observes, so the header holds what the
host's files said). ValueError: options the hook refuses (crihook does not start)."""

HostCheck = Callable[[Mapping[str, Any], int | None], list[tuple[str, str]]]
"""(the hook's options, the host's cgroup version: 1, 2, None for no cgroupfs) → what the
options ask that this host cannot do, as (option, problem): crihook refuses to start,
naming the option."""


@dataclass(frozen=True)
class MemoryBlock:
    """Memory the numa hook placed for a container: `size` bytes of `resource` on `numa`."""

    numa: tuple[int, ...]
    resource: str
    size: int


@dataclass(frozen=True)
class NodeMemory:
    """One kind of memory on one NUMA node, as kubelet's memory manager counts it."""

    node: int
    resource: str
    allocatable: int
    assigned: int
    free: int


@dataclass(frozen=True)
class SavedLedger:
    """The CPU ledger (`crihook.hooks.cpus`) as its hook's state holds it, read back."""

    hook: str
    """The hook whose state holds it (`cpuset`, `koordinator`)."""
    reserved: frozenset[int]
    strict: bool
    shared: frozenset[int]
    """The shared pool."""
    bubbles: frozenset[str]
    """The pods with CPUs of their own (`topology_scope = "pod"`)."""


@dataclass
class Draft:
    """A holding being put together from the hooks' states."""

    pod_id: str
    name: str
    container_id: str = ""
    pending: bool = False
    cpus: frozenset[int] = frozenset()
    memory: list[MemoryBlock] = field(default_factory=list)
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class Holdings:
    """What the hooks' states say, put together hook by hook (`crihook state --cpus`)."""

    topology: Topology
    notes: list[str]
    """What the map says under it; each hook adds what it could not read."""
    ledger: SavedLedger | None = None
    memory: tuple[NodeMemory, ...] = ()
    drafts: dict[tuple[str, str], Draft] = field(default_factory=dict)

    def draft(self, pod_id: str, name: str) -> Draft:
        """The draft of (sandbox id, container name; "" for a pod's own CPUs), made on first
        use."""
        key = (pod_id, name)
        if key not in self.drafts:
            self.drafts[key] = Draft(pod_id, name)
        return self.drafts[key]


HoldingsReader = Callable[[str, Mapping[str, Any] | None, Mapping[str, Any] | None, Holdings], None]
"""(the hook's name, its saved state (None: it has none), node.json (None: a state dir that
predates it), the holdings so far): adds the hook's holders, and its notes."""
