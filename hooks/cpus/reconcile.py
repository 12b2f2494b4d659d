"""The pool checked against what the runtime has: at start, and after a reconcile.

- holders of containers the runtime no longer has are dropped, and their CPUs freed;
- a reservation whose container the runtime did create (crihook stopped between the runtime's
  answer and the confirmation) becomes that container's holder; any other is dropped;
- bubbles of pods that are gone are dropped, pending ones confirmed or dropped likewise;
- containers the pool does not know are adopted: one whose pod koord-scheduler gave CPUs
  (`scheduling.koordinator.sh/resource-status`) holds those; one of a Guaranteed pod that
  runs on exactly its whole-CPU request of free CPUs keeps them (what kubelet's static
  manager gave it before crihook was put in front); after start (a pod the runtime
  restored, or kept after a call crihook did not see end), one whose CPUs are taken gets
  free ones (`place`), or runs on the shared pool, logged, when none are left; any other
  joins its pool (the BE pool for a BestEffort pod's, the shared pool for the others'; with
  `exclusive` False, kubelet's `none` policy, no container gets exclusive CPUs but the
  scheduler's), following its QoS cgroup when `follows` says so (`shared_pool_in =
  "qos-cgroups"`);
- two pods never hold the same CPU: if the state says so (it was edited, or is corrupt), the
  pod seen later loses them and runs on the shared pool, logged; so does a container holding
  CPUs that are now reserved or offline;
- every created or running container whose cpuset differs from what the pool says gets an
  update (a repair, logged). One that follows its QoS cgroup should have no cpuset of its
  own; CRI cannot clear one (an update's empty cpuset keeps it), so one made with the pool
  as its cpuset (before `qos-cgroups` was set) is given every online CPU, which on cgroup
  v2 runs it on what its QoS cgroup has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from crihook.hooks.cpus.koordinator import (
    BE_POOL,
    SHARED_POOL,
    ScheduledResources,
    be_may_share,
    check_on_node,
    member_pool,
    scheduled_resources,
    shuns_exclusive_cpus,
)
from crihook.hooks.cpus.pool import CpuPool, Holder, reservation_key
from crihook.hooks.cpus.rules import exclusive_cpus
from crihook.hooks.node import format_cpu_list, parse_cpu_list
from crihook.hooks.spec import (
    ContainerState,
    ContainerUpdate,
    ContainerView,
    PodView,
    QoSClass,
    ResourceDelta,
)

__all__ = ["desired_cpus", "reconcile"]

log = logging.getLogger(__name__)

_LIVE = (ContainerState.CREATED, ContainerState.RUNNING)

Follows = Callable[[PodView, str, frozenset[int]], bool]
"""(pod, node pool, NUMA nodes koord-scheduler narrowed it to) → whether a container of the
pod without CPUs of its own follows its QoS cgroup."""


def reconcile(
    pool: CpuPool,
    pods: Sequence[PodView],
    containers: Sequence[ContainerView],
    states: Mapping[str, ContainerState],
    *,
    place: Callable[[int], frozenset[int] | None] | None = None,
    exclusive: bool = True,
    follows: Follows | None = None,
) -> list[ContainerUpdate]:
    """Bring the pool in line with the runtime; the repairs to send. `place(count)`: free
    CPUs for an adopted exclusive container whose own are taken (None: none left).
    `exclusive`: kubelet's static policy (False: `none`, no exclusive CPUs of crihook's).
    `follows(pod, pool, numa)`: whether a container of `pod` without CPUs of its own runs
    on its QoS cgroup's pool rather than a cpuset (None: none does)."""
    live = {c.id: c for c in containers}
    pods_by_id = {p.id: p for p in pods}
    for cid in [cid for cid in pool.containers if cid not in live]:
        pool.release(cid)
    by_key = {reservation_key(c.pod_id, c.name, c.attempt): c.id for c in containers}
    for key in list(pool.pending):
        created = by_key.get(key)
        if created is not None and created not in pool.containers:
            pool.confirm(key, created)
            log.info("cpuset: reservation %s was created as container %s", key, created[:12])
        else:
            pool.release(key)
    _reconcile_bubbles(pool, pods)
    for container in containers:
        if container.id not in pool.containers:
            state = states.get(container.id, ContainerState.UNKNOWN)
            pod = pods_by_id.get(container.pod_id)
            _adopt(pool, container, pod, state, place, exclusive=exclusive, follows=follows)
    _split_overlaps(pool)
    updates = []
    for container in containers:
        if states.get(container.id) not in _LIVE or container.pod_id not in pods_by_id:
            continue
        want = desired_cpus(pool, container.id)
        if want is None:
            continue
        have = parse_cpu_list(container.resources.cpuset_cpus) or pool.topology.online
        if have != want:
            log.warning(
                "cpuset: container %s runs on cpus %s, should run on %s; repairing",
                container.id[:12],
                format_cpu_list(have),
                format_cpu_list(want),
            )
            updates.append(
                ContainerUpdate(container.id, ResourceDelta(cpuset_cpus=format_cpu_list(want)))
            )
    return updates


def desired_cpus(pool: CpuPool, container_id: str) -> frozenset[int] | None:
    """The CPUs a known, not stopped container should run on."""
    holder = pool.containers.get(container_id)
    if holder is None or holder.stopped:
        return None
    if holder.cpus:
        return holder.cpus
    if holder.in_bubble:
        return pool.bubble_shared_pool(holder.pod)
    if holder.follows_qos:  # no cpuset of its own: its QoS cgroup's (see the docstring)
        return pool.topology.online
    return pool.member_cpus(holder)


def _reconcile_bubbles(pool: CpuPool, pods: Sequence[PodView]) -> None:
    by_uid = {p.uid: p.id for p in pods}
    ids = set(by_uid.values())
    for key, bubble in list(pool.bubbles.items()):
        if bubble.pending:
            pod_id = by_uid.get(bubble.uid)
            if pod_id is not None and pod_id not in pool.bubbles:
                pool.confirm_bubble(bubble.uid, pod_id)
            else:
                pool.drop_bubble(key)
        elif key not in ids:
            pool.drop_bubble(key)


def _adopt(
    pool: CpuPool,
    container: ContainerView,
    pod: PodView | None,
    state: ContainerState,
    place: Callable[[int], frozenset[int] | None] | None,
    *,
    exclusive: bool,
    follows: Follows | None,
) -> None:
    stopped = state not in _LIVE
    scheduled = _scheduled(pool, pod)
    in_bubble = container.pod_id in pool.bubbles
    pool_name = member_pool(pod) if pod is not None else _member_pool_of(container)
    holder = Holder(
        pod=container.pod_id,
        name=container.name,
        attempt=container.attempt,
        kind=container.kind.value,
        in_bubble=in_bubble,
        stopped=stopped,
        pool=pool_name,
        follows_qos=(
            follows is not None
            and pod is not None
            and not in_bubble
            and follows(pod, pool_name, scheduled.numa_nodes)
        ),
    )
    if scheduled.cpus and pod is not None and not stopped and not holder.in_bubble:
        pool.record(container.id, _scheduled_holder(holder, pod, scheduled.cpus))
        return
    if scheduled.numa_nodes:  # replace() costs ~20 µs: not for each of a node's containers
        holder = replace(holder, numa=scheduled.numa_nodes)
    want = exclusive_cpus(container) if exclusive else None
    if pod is not None and shuns_exclusive_cpus(pod):
        want = None
    if not stopped and not holder.in_bubble and want:
        have = parse_cpu_list(container.resources.cpuset_cpus)
        if len(have) == want and have <= pool.free():
            holder = replace(holder, cpus=have, follows_qos=False)
            log.info(
                "cpuset: adopted container %s with its exclusive cpus %s",
                container.id[:12],
                format_cpu_list(have),
            )
        elif place is not None:
            cpus = place(want)
            if cpus:
                holder = replace(holder, cpus=cpus, follows_qos=False)
                log.warning(
                    "cpuset: container %s ran on cpus %s that are not free; re-placed on %s",
                    container.id[:12],
                    format_cpu_list(have) or "all",
                    format_cpu_list(cpus),
                )
            else:
                log.error(
                    "cpuset: container %s needs %d exclusive cpus and none are free; it runs "
                    "on the shared pool",
                    container.id[:12],
                    want,
                )
    pool.record(container.id, holder)


def _member_pool_of(container: ContainerView) -> str:
    """The pool of a container whose pod the runtime no longer lists (it goes soon)."""
    return BE_POOL if container.resources.qos_class is QoSClass.BEST_EFFORT else SHARED_POOL


def _scheduled(pool: CpuPool, pod: PodView | None) -> ScheduledResources:
    """What koord-scheduler gave the pod, if it fits this node (otherwise logged: its
    containers run on their pool)."""
    if pod is None:
        return ScheduledResources()
    try:
        scheduled = scheduled_resources(pod)
        check_on_node(scheduled, pool.topology)
    except ValueError as exc:
        log.error("cpuset: pod %s/%s: %s; it runs on a pool", pod.namespace, pod.name, exc)
        return ScheduledResources()
    return scheduled


def _scheduled_holder(holder: Holder, pod: PodView, cpus: frozenset[int]) -> Holder:
    return replace(
        holder,
        cpus=cpus,
        follows_qos=False,
        scheduled=True,
        be_shares=be_may_share(pod),
        pod_name=f"{pod.namespace}/{pod.name}",
    )


def _split_overlaps(pool: CpuPool) -> None:
    owner: dict[int, str] = {c: key for key, b in pool.bubbles.items() for c in b.cpus}
    # Reserved CPUs, or CPUs no longer online (the options or the machine changed since the
    # state was written), are never held exclusively either.
    for cpu in pool.reserved | (pool.held() - pool.topology.online):
        owner[cpu] = ""
    for cid in sorted(pool.containers):
        holder = pool.containers[cid]
        if not holder.cpus or holder.in_bubble:
            continue
        clash = {c for c in holder.cpus if owner.get(c, holder.pod) != holder.pod}
        if clash:
            log.error(
                "cpuset: container %s of pod %s holds cpus %s that another pod holds, or that "
                "are reserved or offline; it moves to the shared pool",
                cid[:12],
                holder.pod[:12],
                format_cpu_list(clash),
            )
            pool.record(cid, replace(holder, cpus=frozenset()))
            continue
        for cpu in holder.cpus:
            owner[cpu] = holder.pod
