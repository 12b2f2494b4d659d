"""Pooled devices: who holds which, NUMA hints for a request, and the pick.

A container holds its pooled devices under its pod and name, as kubelet's device manager
keeps them: a restart of the container (a new attempt, the same name) gets the same
devices, and they go back to the pool once no container of that name is left in the pod
(or the pod is removed). Each device is used by one container at a time.

Devices of a pod's init containers are reusable by its later containers, as kubelet's
device manager reuses them (`devicesToReuse`): an init container has exited before the next
container of its pod is created, so a later container takes its devices first and new ones
only for the rest. The init container keeps holding them (a device goes back to the pool
when no allocation of the pod holds it), so a second later container does not get them
again. CRI does not say which containers are init containers: an allocation whose kind is
unknown (no `crihook.io/init-containers` annotation) is reusable once all of its containers
have exited, as the runtime reports them.

`device_hints` and `pick_devices` follow kubelet's device manager
(`generateDeviceTopologyHints`, `devicesToAllocate`): every set of NUMA nodes whose free
devices can serve the request is a hint, preferred when it is as narrow as the narrowest set
whose devices (free or not) could; a pool without any NUMA information has no preference.
The pick takes devices on the chosen NUMA nodes first, then those without a NUMA node, then
the others.

`PoolBook` keeps the holdings and mirrors every one into the hook's persisted state
(`a:<pod id>/<container name>` → JSON), reservations included (`"pending": true`): the
pipeline writes a pre stage's state to disk before it forwards the call, so a crihook that
stops between the reservation and the runtime's answer finds it at start, and `reconcile`
confirms it (the runtime made the container) or releases it (it did not). The container also
carries its devices in the annotation ASSIGNED, from which a holding lost with the state is
adopted.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from crihook.hooks.devices.policy import Pool, PoolDevice
from crihook.hooks.spec import ContainerView, HookState, TopologyHint

__all__ = [
    "ASSIGNED",
    "Allocation",
    "PoolBook",
    "assigned_value",
    "device_hints",
    "parse_assigned",
    "pick_devices",
    "preference_order",
]

log = logging.getLogger(__name__)

_PREFIX = "a:"
ASSIGNED = "pools.crihook.io/assigned"
"""The container annotation that records the pooled devices a container was given
(`{"gpu": ["0", "1"]}`): the runtime keeps it with the container, so crihook can learn the
holding from the runtime when it stopped before it recorded it."""


def assigned_value(devices: Mapping[str, Sequence[str]]) -> str:
    """ASSIGNED's value: the JSON `json.dumps(devices, separators=(",", ":"))` writes, built
    directly (every create that gets pooled devices makes one; the encoder's Python layer
    was most of its cost)."""
    pools = ",".join(f"{_quote(p)}:[{','.join(map(_quote, ids))}]" for p, ids in devices.items())
    return f"{{{pools}}}"


_quote = json.encoder.encode_basestring_ascii  # a JSON string, as json.dumps writes it


def parse_assigned(value: str) -> dict[str, tuple[str, ...]]:
    """ASSIGNED's value; ValueError when it is not what `assigned_value` writes."""
    doc = json.loads(value)
    if not isinstance(doc, dict) or not all(
        isinstance(p, str) and isinstance(ids, list) and all(isinstance(i, str) for i in ids)
        for p, ids in doc.items()
    ):
        raise ValueError(f"{value!r} is not a map of pool to device ids")
    return {p: tuple(ids) for p, ids in doc.items()}


def device_hints(
    devices: Sequence[PoolDevice],
    available: AbstractSet[str],
    count: int,
    numa_nodes: Sequence[int],
    reusable: AbstractSet[str] = frozenset(),
) -> list[TopologyHint] | None:
    """kubelet's hints for `count` devices out of `available` and `reusable` (ids; the
    latter an init container's, taken first: a mask must hold every one of them that has a
    NUMA node); None: no preference (no device of the pool has a NUMA node); empty: no NUMA
    node set can serve it."""
    located = [d for d in devices if d.numa is not None]
    if not located:
        return None
    nodes = sorted(set(numa_nodes))
    narrowest = len(nodes)
    hints: list[TopologyHint] = []
    reused = {d.numa for d in located if d.id in reusable}
    for size in range(1, len(nodes) + 1):
        for combo in itertools.combinations(nodes, size):
            mask = frozenset(combo)
            inside = [d for d in located if d.numa in mask]
            if len(inside) >= count and size < narrowest:
                narrowest = size
            if not reused <= mask:
                continue
            if sum(1 for d in inside if d.id in available or d.id in reusable) >= count:
                hints.append(TopologyHint(mask, False))
    return [TopologyHint(h.numa, len(h.numa or ()) == narrowest) for h in hints]


def preference_order(
    devices: Sequence[PoolDevice], affinity: frozenset[int] | None
) -> Sequence[PoolDevice]:
    """The order devices are taken in: on `affinity`'s NUMA nodes first (lower nodes first),
    then devices without a NUMA node, then the others, each in the pool's order."""
    if affinity is None:
        return devices
    aligned = sorted((d for d in devices if d.numa in affinity), key=lambda d: d.numa or 0)
    unknown = [d for d in devices if d.numa is None]
    others = [d for d in devices if d.numa is not None and d.numa not in affinity]
    return aligned + unknown + others


def pick_devices(
    devices: Sequence[PoolDevice],
    available: AbstractSet[str],
    count: int,
    affinity: frozenset[int] | None,
) -> tuple[str, ...] | None:
    """The first `count` ids of `available` in preference order; None when there are not
    enough."""
    chosen = [d.id for d in preference_order(devices, affinity) if d.id in available]
    return tuple(chosen[:count]) if len(chosen) >= count else None


@dataclass
class Allocation:
    """The pooled devices of one container name in one pod."""

    pod: str
    name: str
    devices: dict[str, tuple[str, ...]]
    """Pool → ids, in the order they were given."""
    containers: list[str] = field(default_factory=list)
    """Ids of the containers (attempts) that hold them."""
    pending: bool = False
    """Reserved by a CreateContainer the runtime has not answered yet."""
    kind: str = "unknown"
    """The container's kind (ContainerKind value): an init container's devices are reusable
    by the pod's later containers."""

    key: str = field(init=False, repr=False, compare=False)
    """`<pod>/<name>`: the book's key (made once; looked up a dozen times per call)."""

    def __post_init__(self) -> None:
        self.key = f"{self.pod}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "pod": self.pod,
            "name": self.name,
            "devices": {p: list(ids) for p, ids in self.devices.items()},
            "containers": list(self.containers),
        }
        if self.pending:
            doc["pending"] = True
        if self.kind != "unknown":
            doc["kind"] = self.kind
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Allocation:
        devices = doc["devices"]
        if not isinstance(devices, Mapping):
            raise TypeError("devices is not an object")
        return cls(
            pod=str(doc["pod"]),
            name=str(doc["name"]),
            devices={str(p): tuple(str(i) for i in ids) for p, ids in devices.items()},
            containers=[str(c) for c in doc.get("containers", [])],
            pending=bool(doc.get("pending", False)),
            kind=str(doc.get("kind", "unknown")),
        )


class PoolBook:
    """Who holds which pooled device. Methods change the book and the state together."""

    def __init__(self, pools: Mapping[str, Pool], state: HookState) -> None:
        self.pools = pools
        self.state = state
        self.allocations: dict[str, Allocation] = {}
        self._holders: dict[tuple[str, str], list[str]] = {}
        """(pool, id) → keys of the allocations that hold it (several only within one pod:
        an init container's devices reused by a later container)."""
        self._by_container: dict[str, str] = {}
        self._of_pod: dict[str, dict[str, Allocation]] = {}
        """Pod → its allocations by key: what a create asks about its own pod does not walk
        the whole node's."""

    # --- reading -----------------------------------------------------------------------------
    def of(self, pod: str, name: str) -> Allocation | None:
        return self.allocations.get(f"{pod}/{name}")

    def available(self, pool: str) -> frozenset[str]:
        return frozenset(
            d.id for d in self.pools[pool].devices if (pool, d.id) not in self._holders
        )

    def held(self, pool: str, ident: str) -> bool:
        return (pool, ident) in self._holders

    def undecided(self, pod: str) -> bool:
        """The pod has allocations of containers whose kind CRI did not say: whether their
        devices are reusable depends on whether they exited (`reusable`'s `finished`)."""
        return any(a.kind == "unknown" for a in self._of_pod.get(pod, {}).values())

    def reusable(
        self, pod: str, name: str, finished: Mapping[str, bool]
    ) -> dict[str, frozenset[str]]:
        """Pool → devices of `pod` a new container `name` may take besides the free ones: those
        of its init containers (created, so exited: the next container of a pod is created
        after its init containers ran), and of containers of unknown kind that have all
        exited (`finished`: container id → exited), minus what the pod's other containers
        hold (an app container that already took them, a sidecar)."""
        reuse: set[tuple[str, str]] = set()
        keep: set[tuple[str, str]] = set()
        for allocation in self._of_pod.get(pod, {}).values():
            if allocation.name == name:
                continue
            done = bool(allocation.containers) and not allocation.pending
            if allocation.kind == "unknown":
                done = done and all(finished.get(c, False) for c in allocation.containers)
            elif allocation.kind != "init":
                done = False
            held = {(p, i) for p, ids in allocation.devices.items() for i in ids}
            (reuse if done else keep).update(held)
        out: dict[str, set[str]] = {}
        for pool, ident in reuse - keep:
            out.setdefault(pool, set()).add(ident)
        return {p: frozenset(ids) for p, ids in out.items()}

    # --- changing ----------------------------------------------------------------------------
    def reserve(
        self, pod: str, name: str, devices: Mapping[str, Sequence[str]], kind: str = "unknown"
    ) -> Allocation:
        """Hold `devices` (pool → ids: free ones, or ones `reusable` gave) for a container
        being created. Saved at once (`pending`): the pipeline has it on disk before the
        runtime acts, so a crihook that stops before the runtime answers finds it at start."""
        ids = {p: tuple(ids) for p, ids in devices.items()}
        allocation = Allocation(pod, name, ids, pending=True, kind=kind)
        self._put(allocation)
        return allocation

    def confirm(self, pod: str, name: str, container_id: str) -> bool:
        """The runtime created the container: it holds its name's devices. False when its
        name holds none."""
        allocation = self.of(pod, name)
        if allocation is None:
            return False
        # A container id the runtime hands out again names a new container: the one that
        # had it is gone.
        if self._by_container.get(container_id, allocation.key) != allocation.key:
            self.remove_container(container_id)
        if container_id not in allocation.containers:
            allocation.containers.append(container_id)
        allocation.pending = False
        self._by_container[container_id] = allocation.key
        self._save(allocation)
        return True

    def release_pending(self, pod: str, name: str) -> bool:
        """A create failed: a reservation no container holds yet goes back. True if freed."""
        allocation = self.of(pod, name)
        if allocation is None or not allocation.pending:
            return False
        if allocation.containers:  # an earlier attempt still holds them
            allocation.pending = False
            self._save(allocation)
            return False
        self._drop(allocation)
        return True

    def remove_container(self, container_id: str) -> Allocation | None:
        """The container is gone. Returns the allocation it freed, if it was the last of its
        name (and no create of that name is pending)."""
        key = self._by_container.pop(container_id, None)
        allocation = self.allocations.get(key) if key is not None else None
        if allocation is None:
            return None
        if container_id in allocation.containers:
            allocation.containers.remove(container_id)
        if allocation.containers or allocation.pending:
            self._save(allocation)
            return None
        self._drop(allocation)
        return allocation

    def remove_pod(self, pod: str) -> list[Allocation]:
        gone = list(self._of_pod.get(pod, {}).values())
        for allocation in gone:
            self._drop(allocation)
        return gone

    # --- persistence and the runtime ---------------------------------------------------------
    def load(self) -> list[str]:
        """Rebuild from the persisted state; returns the keys it dropped (unreadable, or
        naming devices the configuration no longer has, or held twice)."""
        self.allocations.clear()
        self._holders.clear()
        self._by_container.clear()
        self._of_pod.clear()
        dropped = []
        for key, doc in sorted(self.state.items()):
            if not key.startswith(_PREFIX):
                continue
            try:
                allocation = Allocation.from_dict(doc)
            except (KeyError, TypeError, ValueError):
                self.state.delete(key)
                dropped.append(f"{key} (unreadable)")
                continue
            kept, lost = self._known(allocation)
            if lost:
                dropped.append(f"{key}: {', '.join(lost)}")
            if not kept:
                self.state.delete(key)
                continue
            allocation.devices = kept
            self._put(allocation)
        return dropped

    def reconcile(self, containers: Iterable[ContainerView]) -> tuple[list[Allocation], list[str]]:
        """Against the containers the runtime has: every container of a pod and name that
        holds devices holds them (a create crihook did not see confirmed is confirmed);
        an allocation no container holds any more goes back; a container that carries
        devices it was given (ASSIGNED) and that the book does not know is adopted. Returns
        those freed, and what could not be adopted (a device held by another)."""
        live: dict[str, list[str]] = {}
        containers = list(containers)
        for c in containers:
            live.setdefault(f"{c.pod_id}/{c.name}", []).append(c.id)
        freed = []
        for allocation in list(self.allocations.values()):
            holders = live.get(allocation.key, [])
            if not holders:
                self._drop(allocation)
                freed.append(allocation)
                continue
            for cid in [c for c in allocation.containers if c not in holders]:
                allocation.containers.remove(cid)
                self._by_container.pop(cid, None)
            for cid in holders:
                if cid not in allocation.containers:
                    allocation.containers.append(cid)
                self._by_container[cid] = allocation.key
            allocation.pending = False
            self._save(allocation)
        problems = []
        for c in containers:
            key = f"{c.pod_id}/{c.name}"
            raw = c.annotations.get(ASSIGNED)
            if raw is None or key in self.allocations:
                continue
            try:
                assigned = parse_assigned(raw)
            except ValueError:
                problems.append(f"container {c.id[:12]}: unreadable {ASSIGNED} {raw!r}")
                continue
            adopted = Allocation(
                c.pod_id, c.name, {}, containers=list(live[key]), kind=c.kind.value
            )
            kept, lost = self._known(Allocation(c.pod_id, c.name, dict(assigned)))
            adopted.devices = kept
            problems.extend(f"container {c.id[:12]}: {what}" for what in lost)
            if kept:
                self._put(adopted)
        return freed, problems

    # --- internals ---------------------------------------------------------------------------
    def _known(self, allocation: Allocation) -> tuple[dict[str, tuple[str, ...]], list[str]]:
        """The devices of `allocation` that the configuration has and no other pod holds."""
        kept: dict[str, tuple[str, ...]] = {}
        lost = []
        for pool, ids in allocation.devices.items():
            known = self.pools[pool].by_id if pool in self.pools else {}
            keep = []
            for ident in ids:
                others = [
                    k
                    for k in self._holders.get((pool, ident), ())
                    if k != allocation.key and self.allocations[k].pod != allocation.pod
                ]
                if ident not in known:
                    lost.append(f"{pool} {ident} is no longer configured")
                elif others:
                    lost.append(f"{pool} {ident} is held by {others[0]} too")
                else:
                    keep.append(ident)
            if keep:
                kept[pool] = tuple(keep)
        return kept, lost

    def _put(self, allocation: Allocation) -> None:
        old = self.allocations.get(allocation.key)
        if old is not None:
            self._drop(old)
        self.allocations[allocation.key] = allocation
        self._of_pod.setdefault(allocation.pod, {})[allocation.key] = allocation
        for pool, ids in allocation.devices.items():
            for ident in ids:
                self._holders.setdefault((pool, ident), []).append(allocation.key)
        for cid in allocation.containers:
            self._by_container[cid] = allocation.key
        self._save(allocation)

    def _drop(self, allocation: Allocation) -> None:
        if self.allocations.get(allocation.key) is not allocation:
            return
        del self.allocations[allocation.key]
        of_pod = self._of_pod[allocation.pod]
        del of_pod[allocation.key]
        if not of_pod:
            del self._of_pod[allocation.pod]
        for pool, ids in allocation.devices.items():
            for ident in ids:
                holders = self._holders.get((pool, ident), [])
                if allocation.key in holders:
                    holders.remove(allocation.key)
                if not holders:
                    self._holders.pop((pool, ident), None)
        for cid in allocation.containers:
            if self._by_container.get(cid) == allocation.key:
                del self._by_container[cid]
        self.state.delete(_PREFIX + allocation.key)

    def _save(self, allocation: Allocation) -> None:
        self.state.set(_PREFIX + allocation.key, allocation.to_dict())
