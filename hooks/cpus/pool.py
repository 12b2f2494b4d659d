"""Who holds which CPUs: the cpuset hook's bookkeeping, pure and persisted key by key.

The node's CPUs are split as kubelet's static CPU manager splits them:
- exclusive CPUs, held by containers of Guaranteed pods with whole-CPU requests (or by a pod
  bubble: pod-level resources under the `pod` topology scope, from which the pod's own
  exclusive containers take slices);
- the shared pool: the online CPUs nobody holds (kubelet's "default cpuset"), reserved CPUs
  included, or without them under kubelet's `strict-cpu-reservation` (`strict_reservation`):
  then no container runs on a reserved CPU. Reserved CPUs are never handed out exclusively.

Holders are keyed by container id once the runtime created the container, and by a
reservation key (`<pod id>/<name>/<attempt>`) between the pre stage and the runtime's answer.
CPUs of a pod's finished init containers, and of an earlier attempt of the same container,
are reusable by its later containers (a restart of the same size gets exactly the CPUs its
earlier attempt holds, as kubelet keeps them under the container's name); a holder gives back
only the CPUs no other container of its pod holds (kubelet's rule for init-container reuse).

Koordinator's pools (`koordinator.py`) sit on the same holders: CPUs a pod got
from koord-scheduler are held like exclusive CPUs (`scheduled`), so they leave the shared
pool (Koordinator's LS share pool); the BE pool is the shared pool plus the scheduler CPUs
BE pods may share (`be_shares`: every pod's but an LSE pod's). A container without CPUs of
its own runs on the pool its holder names (`pool`).

Every change of who holds CPUs is mirrored into the hook's persisted state (`c:<container
id>`, `r:<reservation key>`, `b:<pod id>` → JSON), so a restart rebuilds the same pool. A
container that holds no CPUs of its own (one on a shared pool, a stopped one) is not
written: all it has is its pool and whether it runs, which follow from its pod and the
runtime, so a restart adopts it as it was (`reconcile`). The many shared containers of a
node then change no state.

What a call asks of the pool does not walk the node: holders are indexed by pod (a pod's
holders, its earlier attempts), the node's pools are kept until CPUs change hands, the BE
pool is kept from counts of lent and kept CPUs, and the shared containers are counted per
pool they run on (`member_keys`): only an update's walk in the background lists them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from crihook.hooks.cpus.koordinator import BE_POOL, SHARED_POOL
from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list
from crihook.hooks.spec import HookState

__all__ = ["Bubble", "CpuPool", "Holder", "reservation_key"]

_CONTAINER, _PENDING, _BUBBLE = "c:", "r:", "b:"


def reservation_key(pod_id: str, name: str, attempt: int) -> str:
    """Which container a reservation is for, before the runtime gave it an id (also what a
    restart matches against the runtime's containers)."""
    return f"{pod_id}/{name}/{attempt}"


@dataclass(frozen=True)
class Holder:
    """What one container (or a container being created) holds."""

    pod: str
    """Sandbox id."""
    name: str
    attempt: int = 0
    kind: str = "unknown"
    """ContainerKind value: init containers' CPUs are reusable by later containers."""
    cpus: frozenset[int] = frozenset()
    """Exclusive CPUs; empty: the container runs on a shared pool."""
    in_bubble: bool = False
    """Its CPUs (or shared pool) come from its pod's bubble, not from the node."""
    stopped: bool = False
    """Stopped by kubelet: it holds nothing any more and gets no pool updates."""
    pool: str = SHARED_POOL
    """Without CPUs of its own: the node pool it runs on (`shared`, or `be`)."""
    scheduled: bool = False
    """Its CPUs are the ones koord-scheduler gave its pod, not a pick of crihook's."""
    be_shares: bool = False
    """Its (scheduled) CPUs stay usable by BE pods: an LSR pod's, not an LSE pod's."""
    pod_name: str = ""
    """`namespace/name`, for messages about a pod holding scheduled CPUs."""
    numa: frozenset[int] = frozenset()
    """Without CPUs of its own: the NUMA nodes koord-scheduler narrowed its pool to."""
    promised: frozenset[int] = frozenset()
    """The exclusive CPUs it was created with, once an in-place resize changed `cpus`
    (kubelet's "promised" CPUs: a resize keeps them). Empty: never resized."""
    follows_qos: bool = False
    """Without CPUs of its own: it has no cpuset either and runs on what its QoS cgroup is
    given (`shared_pool_in = "qos-cgroups"`), so a change of its pool sends it nothing. Not
    persisted: such a holder is not written, a restart adopts it again."""

    @property
    def created_with(self) -> frozenset[int]:
        """The exclusive CPUs an in-place resize must keep."""
        return self.promised or self.cpus

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"pod": self.pod, "name": self.name, "attempt": self.attempt}
        doc["kind"] = self.kind
        doc["cpus"] = format_cpu_list(self.cpus)
        if self.in_bubble:
            doc["in_bubble"] = True
        if self.stopped:
            doc["stopped"] = True
        if self.pool != SHARED_POOL:
            doc["pool"] = self.pool
        if self.scheduled:
            doc["scheduled"] = True
        if self.be_shares:
            doc["be_shares"] = True
        if self.pod_name:
            doc["pod_name"] = self.pod_name
        if self.numa:
            doc["numa"] = format_cpu_list(self.numa)
        if self.promised:
            doc["promised"] = format_cpu_list(self.promised)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Holder:
        return cls(
            pod=str(doc["pod"]),
            name=str(doc["name"]),
            attempt=int(doc.get("attempt", 0)),
            kind=str(doc.get("kind", "unknown")),
            cpus=parse_cpu_list(str(doc.get("cpus", ""))),
            in_bubble=bool(doc.get("in_bubble", False)),
            stopped=bool(doc.get("stopped", False)),
            pool=_pool_name(doc.get("pool", SHARED_POOL)),
            scheduled=bool(doc.get("scheduled", False)),
            be_shares=bool(doc.get("be_shares", False)),
            pod_name=str(doc.get("pod_name", "")),
            numa=parse_cpu_list(str(doc.get("numa", ""))),
            promised=parse_cpu_list(str(doc.get("promised", ""))),
        )


def _member(holder: Holder) -> bool:
    """A running node-level container without CPUs of its own: it runs on a node pool."""
    return not holder.cpus and not holder.stopped and not holder.in_bubble


def _pool_name(value: object) -> str:
    if value not in (SHARED_POOL, BE_POOL):
        raise ValueError(f"unknown pool {value!r}")
    return str(value)


@dataclass(frozen=True)
class Bubble:
    """A pod's own CPUs (pod-level resources, `pod` topology scope)."""

    uid: str
    cpus: frozenset[int]
    pending: bool = False
    """Reserved at RunPodSandbox, the runtime has not answered yet (keyed by pod uid)."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"uid": self.uid, "cpus": format_cpu_list(self.cpus)}
        if self.pending:
            doc["pending"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Bubble:
        return cls(
            uid=str(doc["uid"]),
            cpus=parse_cpu_list(str(doc.get("cpus", ""))),
            pending=bool(doc.get("pending", False)),
        )


@dataclass
class CpuPool:
    """The node's CPUs and who holds them. Methods change the pool and the state together."""

    topology: Topology
    reserved: frozenset[int]
    state: HookState
    strict_reservation: bool = False
    """kubelet's `strict-cpu-reservation`: the reserved CPUs are out of the shared pool too."""
    containers: dict[str, Holder] = field(default_factory=dict)
    pending: dict[str, Holder] = field(default_factory=dict)
    bubbles: dict[str, Bubble] = field(default_factory=dict)
    """By pod id; a pending bubble by `uid:<pod uid>`."""
    _refs: Counter[int] = field(default_factory=Counter)
    """How many node-level holders (containers, reservations, bubbles) hold each CPU."""
    _pools: dict[tuple[str, frozenset[int]], tuple[frozenset[int], str]] = field(
        default_factory=dict
    )
    """Node pools by (name, NUMA nodes) with their cpulist, asked on every call: computed
    once, forgotten whenever CPUs change hands (`_changed`)."""
    _be: frozenset[int] | None = None
    """The BE pool, kept as `_pools` is."""
    _by_pod: dict[str, dict[str, None]] = field(default_factory=dict)
    """Pod id → the keys of its holders (container ids and reservation keys)."""
    _members: Counter[tuple[str, frozenset[int], bool]] = field(default_factory=Counter)
    """(pool name, NUMA nodes, follows its QoS cgroup) → how many running node-level
    containers without CPUs of their own run on it."""
    _lent: Counter[int] = field(default_factory=Counter)
    """Scheduled CPUs BE pods may share (an LSR pod's), by holders holding them."""
    _kept: Counter[int] = field(default_factory=Counter)
    """CPUs no BE pod may run on: bubbles' and other node-level holders' CPUs."""

    # --- reading -----------------------------------------------------------------------------
    def held(self) -> frozenset[int]:
        return frozenset(self._refs)

    def shared_pool(self) -> frozenset[int]:
        """The node's shared pool: online CPUs nobody holds, reserved ones included unless
        `strict_reservation` (kubelet's default cpuset either way)."""
        pool = self.topology.online - self.held()
        return pool - self.reserved if self.strict_reservation else pool

    def free(self) -> frozenset[int]:
        """What may be handed out exclusively: the shared pool without the reserved CPUs."""
        return self.shared_pool() - self.reserved

    def be_pool(self) -> frozenset[int]:
        """Koordinator's BE pool: the shared pool plus the scheduled CPUs BE pods may share
        (an LSR pod's), unless another holder holds them too."""
        if self._be is None:
            self._be = self._be_pool()
        return self._be

    def _be_pool(self) -> frozenset[int]:
        kept = self._kept
        return self.shared_pool() | frozenset(c for c in self._lent if c not in kept)

    def pool_cpus(self, name: str) -> frozenset[int]:
        """The CPUs of a node pool by name (`shared` or `be`)."""
        return self.be_pool() if name == BE_POOL else self.shared_pool()

    def node_pool(self, name: str, numa: frozenset[int] = frozenset()) -> frozenset[int]:
        """A node pool (`shared` or `be`), narrowed to `numa` nodes when some are named."""
        return self._node_pool(name, numa)[0]

    def node_pool_text(self, name: str, numa: frozenset[int] = frozenset()) -> str:
        """`node_pool` as a cpulist (what a container on it is given)."""
        return self._node_pool(name, numa)[1]

    def _node_pool(self, name: str, numa: frozenset[int]) -> tuple[frozenset[int], str]:
        key = (name, numa)
        found = self._pools.get(key)
        if found is None:
            cpus = self.pool_cpus(name)
            if numa:
                cpus &= self.topology.cpus_in_numa(numa)
            found = self._pools[key] = (cpus, format_cpu_list(cpus))
        return found

    def member_cpus(self, holder: Holder) -> frozenset[int]:
        """What a node-level container without CPUs of its own runs on: its pool, narrowed
        to its NUMA nodes when koord-scheduler named some."""
        return self.node_pool(holder.pool, holder.numa)

    def member_text(self, holder: Holder) -> str:
        """`member_cpus` as a cpulist."""
        return self.node_pool_text(holder.pool, holder.numa)

    def holders_of(self, cpus: frozenset[int], but: str) -> list[Holder]:
        """Holders of pods other than `but` holding any of `cpus` (node level, not stopped)."""
        return [
            h
            for h in self._holders()
            if h.pod != but and not h.in_bubble and not h.stopped and h.cpus & cpus
        ]

    def bubble_of(self, pod: str) -> Bubble | None:
        return self.bubbles.get(pod)

    def bubble_shared_pool(self, pod: str) -> frozenset[int]:
        """A bubble's CPUs that none of its pod's exclusive containers holds."""
        bubble = self.bubbles.get(pod)
        if bubble is None:
            return frozenset()
        sliced = {c for _, h in self.pod_holders(pod) if h.in_bubble for c in h.cpus}
        return bubble.cpus - sliced

    def holder_of(self, key: str) -> Holder | None:
        return self.containers.get(key) or self.pending.get(key)

    def pod_holders(self, pod: str) -> Iterator[tuple[str, Holder]]:
        """The pod's holders: its containers', then its reservations."""
        keys = list(self._by_pod.get(pod, ()))
        for table in (self.containers, self.pending):
            for key in keys:
                holder = table.get(key)
                if holder is not None and holder.pod == pod:
                    yield key, holder

    def shared_members(self, pod: str | None = None) -> list[str]:
        """Container ids running on a shared pool: the node's (pod None: every container's
        walked, for an update's walk in the background) or a bubble's (its pod's)."""
        if pod is not None:
            return [
                key
                for key, h in self.pod_holders(pod)
                if key in self.containers and not h.cpus and not h.stopped and h.in_bubble
            ]
        return [cid for cid, h in self.containers.items() if _member(h)]

    def pool_members(self, name: str) -> list[str]:
        """Container ids running on the node pool `name` with a cpuset of their own: those
        an update moves onto it (walks every container)."""
        return [
            cid
            for cid, h in self.containers.items()
            if _member(h) and h.pool == name and not h.follows_qos
        ]

    def member_keys(self) -> list[tuple[str, frozenset[int]]]:
        """The node pools (name, NUMA nodes) running containers without CPUs of their own
        run on, those following their QoS cgroup included: a few, however many containers."""
        return list(dict.fromkeys((name, numa) for name, numa, _ in self._members))

    def has_members(self, name: str) -> bool:
        """Some running container runs on the node pool `name` with a cpuset of its own (one
        an update must reach; those following their QoS cgroup are not counted)."""
        return any(key[0] == name and not key[2] for key in self._members)

    def attempt_cpus(self, pod: str, name: str) -> frozenset[int]:
        """The exclusive CPUs the latest earlier attempt of a container still holds (empty:
        none). kubelet keeps a container's CPUs under its name, so a restart gets them back."""
        held = [h for _, h in self.pod_holders(pod) if h.name == name and h.cpus and not h.stopped]
        return max(held, key=lambda h: h.attempt).cpus if held else frozenset()

    def reusable(self, pod: str, name: str, states: Mapping[str, bool]) -> frozenset[int]:
        """CPUs of `pod` a new container may take besides the free ones: those of earlier
        attempts of the same container, and of finished init containers, minus what the
        pod's other (app) containers hold. `states`: container id → finished (exited)."""
        reuse: set[int] = set()
        keep: set[int] = set()
        for key, h in self.pod_holders(pod):
            if not h.cpus or h.stopped:
                continue
            finished = states.get(key, False)
            if (
                h.name == name
                or (h.kind == "init" and key in self.containers)
                or (h.kind == "unknown" and finished)
            ):
                reuse |= h.cpus
            else:
                keep |= h.cpus
        return frozenset(reuse - keep)

    # --- changing ----------------------------------------------------------------------------
    def reserve(self, key: str, holder: Holder) -> None:
        """Hold CPUs for a container being created."""
        self._drop(key)
        self.pending[key] = holder
        self._index(holder.pod, key)
        self._hold(holder)
        self._persist(_PENDING + key, holder)

    def confirm(self, key: str, container_id: str) -> Holder | None:
        """The runtime created the container: its reservation becomes its holder."""
        holder = self.pending.pop(key, None)
        if holder is None:
            return None
        self.state.delete(_PENDING + key)
        self._unindex(holder.pod, key)
        self.containers[container_id] = holder
        self._enter(holder)
        self._index(holder.pod, container_id)
        self._persist(_CONTAINER + container_id, holder)
        return holder

    def record(self, container_id: str, holder: Holder) -> None:
        """Set a container's holder directly (adopted at synchronize)."""
        self._drop(container_id)
        self.containers[container_id] = holder
        self._enter(holder)
        self._index(holder.pod, container_id)
        self._hold(holder)
        self._persist(_CONTAINER + container_id, holder)

    def resize(self, container_id: str, cpus: frozenset[int]) -> Holder:
        """A running container's exclusive CPUs become `cpus` (an in-place resize; the CPUs
        it was created with stay `promised`). Returns the holder as it was, to put back with
        `record` if the runtime does not apply the resize."""
        holder = self.containers[container_id]
        self.record(container_id, replace(holder, cpus=cpus, promised=holder.created_with))
        return holder

    def release(self, key: str) -> frozenset[int]:
        """Forget a container or a reservation. Returns the CPUs it gave back to the node
        (none that another container of its pod still holds)."""
        holder = self.holder_of(key)
        if holder is None:
            return frozenset()
        before = self.held()
        self._drop(key)
        return before - self.held()

    def stop(self, container_id: str) -> frozenset[int]:
        """kubelet stopped the container: it gives its CPUs back, stays known (no updates)."""
        holder = self.containers.get(container_id)
        if holder is None or holder.stopped:
            return frozenset()
        before = self.held()
        self._unhold(holder)
        stopped = replace(holder, cpus=frozenset(), stopped=True)
        self._leave(holder)
        self.containers[container_id] = stopped
        self._persist(_CONTAINER + container_id, stopped)
        return before - self.held()

    def reserve_bubble(self, uid: str, cpus: frozenset[int]) -> None:
        key = f"uid:{uid}"
        self.drop_bubble(key)
        bubble = Bubble(uid, cpus, pending=True)
        self.bubbles[key] = bubble
        self._refs.update(cpus)
        self._kept.update(cpus)
        self._changed()
        self.state.set(_BUBBLE + key, bubble.to_dict())

    def confirm_bubble(self, uid: str, pod: str) -> None:
        bubble = self.bubbles.pop(f"uid:{uid}", None)
        if bubble is None:
            return
        self.state.delete(_BUBBLE + f"uid:{uid}")
        bubble = replace(bubble, pending=False)
        self.bubbles[pod] = bubble
        self.state.set(_BUBBLE + pod, bubble.to_dict())

    def drop_bubble(self, key: str) -> frozenset[int]:
        bubble = self.bubbles.pop(key, None)
        if bubble is None:
            return frozenset()
        before = self.held()
        self._refs.subtract(bubble.cpus)
        self._refs = +self._refs  # drop zero counts
        self._kept.subtract(bubble.cpus)
        self._kept = +self._kept
        self._changed()
        self.state.delete(_BUBBLE + key)
        return before - self.held()

    # --- persistence -------------------------------------------------------------------------
    def load(self) -> list[str]:
        """Rebuild from the persisted state. Returns the keys it could not read (dropped)."""
        self.containers.clear()
        self.pending.clear()
        self.bubbles.clear()
        self._by_pod.clear()
        self._refs.clear()
        self._members.clear()
        self._lent.clear()
        self._kept.clear()
        self._changed()
        bad = []
        for key, doc in self.state.items():
            try:
                if key.startswith(_CONTAINER):
                    holder = Holder.from_dict(doc)
                    self.containers[key[len(_CONTAINER) :]] = holder
                    self._enter(holder)
                    self._index(holder.pod, key[len(_CONTAINER) :])
                    self._hold(holder)
                elif key.startswith(_PENDING):
                    holder = Holder.from_dict(doc)
                    self.pending[key[len(_PENDING) :]] = holder
                    self._index(holder.pod, key[len(_PENDING) :])
                    self._hold(holder)
                elif key.startswith(_BUBBLE):
                    bubble = Bubble.from_dict(doc)
                    self.bubbles[key[len(_BUBBLE) :]] = bubble
                    self._refs.update(bubble.cpus)
                    self._kept.update(bubble.cpus)
                else:
                    raise KeyError(key)
            except (KeyError, TypeError, ValueError):
                bad.append(key)
        for key in bad:
            self.state.delete(key)
        return bad

    # --- internals ---------------------------------------------------------------------------
    def _items(self) -> Iterable[tuple[str, Holder]]:
        yield from self.containers.items()
        yield from self.pending.items()

    def _holders(self) -> Iterable[Holder]:
        for _, holder in self._items():
            yield holder

    def _persist(self, key: str, holder: Holder) -> None:
        """Write a holder of CPUs; forget one that holds none (see the module's docstring)."""
        if holder.cpus:
            self.state.set(key, holder.to_dict())
        else:
            self.state.delete(key)

    def _hold(self, holder: Holder) -> None:
        if not holder.in_bubble and holder.cpus:
            self._refs.update(holder.cpus)
            (self._lent if holder.be_shares else self._kept).update(holder.cpus)
            self._changed()  # the pools depend on node-level holders with CPUs only

    def _unhold(self, holder: Holder) -> None:
        if not holder.in_bubble and holder.cpus:
            self._refs.subtract(holder.cpus)
            self._refs = +self._refs
            if holder.be_shares:
                self._lent.subtract(holder.cpus)
                self._lent = +self._lent
            else:
                self._kept.subtract(holder.cpus)
                self._kept = +self._kept
            self._changed()

    def _enter(self, holder: Holder) -> None:
        """A container's holder set: counted on its pool when it runs on one."""
        if _member(holder):
            self._members[(holder.pool, holder.numa, holder.follows_qos)] += 1

    def _leave(self, holder: Holder) -> None:
        if _member(holder):
            key = (holder.pool, holder.numa, holder.follows_qos)
            self._members[key] -= 1
            if self._members[key] <= 0:
                del self._members[key]

    def _drop(self, key: str) -> None:
        holder = self.containers.pop(key, None)
        if holder is not None:
            self._leave(holder)
            self.state.delete(_CONTAINER + key)
        else:
            holder = self.pending.pop(key, None)
            if holder is not None:
                self.state.delete(_PENDING + key)
        if holder is not None:
            self._unindex(holder.pod, key)
            self._unhold(holder)

    def _changed(self) -> None:
        """CPUs changed hands: the node's pools are worked out again when next asked."""
        self._pools.clear()
        self._be = None

    def _index(self, pod: str, key: str) -> None:
        self._by_pod.setdefault(pod, {})[key] = None

    def _unindex(self, pod: str, key: str) -> None:
        keys = self._by_pod.get(pod)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._by_pod[pod]
