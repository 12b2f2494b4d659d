"""The CPU ledger (`CpuLedger`): exclusive CPUs as kubelet's static CPU manager picks them, and a
shared pool for every other container, kept consistent as containers come and go. It is
driven through the hook stages: the built-in `cpuset` hook is one, the `koordinator` hook
runs one (in kubelet's `none` mode) when it places CPUs itself; one per node either way.

    CreateContainer  hints: the NUMA nodes that could hold its exclusive CPUs
                     pre: exclusive CPUs reserved (on disk before the runtime acts), or the
                          shared pool; shared containers moved off the new CPUs; refused
                          when it would empty a shared pool other containers run on
                     post: the reservation confirmed under the container's id (and, once
                          per pod, the pod cgroup's CFS quota lifted, as kubelet does)
                     failed: the reservation released
    UpdateContainerResources  pre: the cpuset crihook set is kept (kubelet re-sends resources)
    StopContainer / RemoveContainer  post: the CPUs given back, the shared pool grows
    RunPodSandbox    (`pod` topology scope) the pod's bubble, reserved like a container's CPUs
    RemovePodSandbox post: everything of the pod given back

It places every container, exempt pods' included (it does not honour the exemption): an
exempt container must not run on another pod's exclusive CPUs.

It honours Koordinator's CPU signals (`koordinator.py`): a pod koord-scheduler gave CPUs
(`scheduling.koordinator.sh/resource-status`) runs on exactly those, held like exclusive
CPUs (two pods claiming one CPU are refused, naming both); LS and BE pods never get
exclusive CPUs; BestEffort containers run on the BE pool (the shared pool plus the CPUs of
LSR pods). On a node without Koordinator's pods nothing of this changes anything.

Each adjustment says why (`Adjustment.because`): the pool, the exclusive pick, the
scheduler's CPUs, or the cpuset kept on an update.

With `shared_pool_in = "qos-cgroups"` (cgroup v2) the containers of Burstable and BestEffort
pods get no cpuset (one kubelet sent is cleared) and are no members of the pools' group
updates: the pools are written to kubelet's QoS cgroups, which they inherit (`qos_pools.py`
keeps the books, `qos_writer.py` writes, retries and reads back). The stage that makes a
pool change final ends by writing what is due, in a thread, before it returns: a new
container's pick narrows them in its post stage (before kubelet hears OK and can start it;
a call refused later, or a dry-run, writes nothing), and so does an in-place resize (the
resized container shares its new CPUs with the QoS cgroups' containers for the runtime's
update call, milliseconds, as a per-container update's window does under `containers`); a
release widens them in its post stage, a failed call in its failed stage only when another
call wrote the pools it had narrowed meanwhile. A write that fails is logged, counted
(`failures`) and tried again; the call goes on. Every 10 s (kubelet's default
`cpuManagerReconcilePeriod`) they are read back and given the pool again where someone reset
them behind crihook's back (logged, counted). Containers of Guaranteed pods (directly in
`kubepods`) keep their cpusets and their updates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from crihook.hooks.cpus.hints import cpu_hints
from crihook.hooks.cpus.koordinator import (
    BE_POOL,
    RESOURCE_STATUS_ANNOTATION,
    SHARED_POOL,
    ScheduledResources,
    be_may_share,
    check_on_node,
    member_pool,
    scheduled_resources,
    shuns_exclusive_cpus,
)
from crihook.hooks.cpus.options import CpusetOptions, node_reserved_cpus, parse_options
from crihook.hooks.cpus.picker import CPUAllocationError, take_cpus
from crihook.hooks.cpus.pool import CpuPool, Holder, reservation_key
from crihook.hooks.cpus.pool_update import PoolUpdate
from crihook.hooks.cpus.qos_writer import QosWriter
from crihook.hooks.cpus.reconcile import desired_cpus, reconcile
from crihook.hooks.cpus.rules import bubble_cpus, exclusive_cpus, slice_cpus
from crihook.hooks.node import Host, Topology, format_cpu_list, parse_cpu_list
from crihook.hooks.spec import (
    Adjustment,
    ContainerState,
    ContainerUpdate,
    ContainerView,
    Hook,
    HookContext,
    InvalidRequest,
    PodView,
    PoolUsage,
    Reject,
    ResourceDelta,
    ResourceHints,
    RuntimeQueries,
    SyncContext,
    TopologyHint,
)
from crihook.hooks.spec.views import cpu_request_milli_from_shares

__all__ = ["CpuLedger"]

log = logging.getLogger(__name__)


class CpuLedger(Hook):
    honours_exemption = False
    sets = ("cpuset_cpus", "cpu_quota")

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.config: CpusetOptions = parse_options(self.options)
        self._pool: CpuPool | None = None
        self._runtime: RuntimeQueries | None = None
        self._host: Host | None = None
        self._unlimited: set[str] = set()
        """Pods whose cgroup's CFS quota crihook lifted."""
        self._scope = "container"
        self._topology_policy = "none"
        self._resized: dict[str, Holder] = {}
        """Container id → its holder before an in-place resize the runtime has not applied
        yet (put back if it fails)."""
        self._finished: dict[str, Mapping[str, bool]] = {}
        """Pod id → which of its containers have exited, asked once per CreateContainer."""
        self._qos = QosWriter(lambda: self.pool) if self.config.pool_in_qos_cgroups else None
        """The pools held in kubelet's QoS cgroups (`shared_pool_in = "qos-cgroups"`)."""

    # --- start-up ----------------------------------------------------------------------------
    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        if self._pool is None:
            self._pool = _new_pool(sync.node, self.config, sync)
        self._runtime = sync.runtime
        self._host = sync.host
        self._scope = sync.topology_scope
        self._topology_policy = sync.topology_policy
        # At start a running container keeps what it has, or shares; later (a restored pod)
        # one whose exclusive CPUs are taken meanwhile is given free ones.
        place = self._place_adopted if sync.reason != "start" else None
        if self._qos is not None:
            for pod in sync.pods:
                self._qos.learn(pod.cgroup_parent, appeared=True)
        updates = reconcile(
            self._pool,
            sync.pods,
            sync.containers,
            sync.container_states,
            place=place,
            exclusive=self.config.static,
            follows=self._qos.follows if self._qos is not None else None,
        )
        if self._qos is not None:
            # Before the repairs (which widen containers made with a cpuset onto every CPU)
            # and before crihook is ready: the QoS cgroups hold the pools as the ledger says.
            await self._qos.start(sync.cgroups)
        pool = self._pool
        log.info(
            "cpuset: %d container(s), %d exclusive; shared pool %s, reserved %s",
            len(pool.containers),
            sum(1 for h in pool.containers.values() if h.cpus),
            format_cpu_list(pool.shared_pool()),
            format_cpu_list(pool.reserved) or "none",
        )
        return updates

    def failures(self) -> Mapping[str, int]:
        """With `qos-cgroups`: QoS cgroup writes that failed (each tried again), QoS cgroups
        found reset behind crihook's back (each written again), and reads back that failed
        (read again at the next check)."""
        return {} if self._qos is None else self._qos.failures()

    async def close(self) -> None:
        if self._qos is not None:
            await self._qos.close()

    def usage(self) -> list[PoolUsage]:
        """CPUs held exclusively (containers, bubbles, reservations), in the node's shared
        pool, and reserved for the system (`reserved` CPUs are in the shared pool too unless
        `strict_reservation`)."""
        pool = self._pool
        if pool is None:
            return []
        return [
            PoolUsage("cpu", "exclusive", value=len(pool.held())),
            PoolUsage("cpu", "shared", value=len(pool.shared_pool())),
            PoolUsage("cpu", "reserved", value=len(pool.reserved)),
        ]

    @property
    def pool(self) -> CpuPool:
        if self._pool is None:
            raise RuntimeError("cpuset: called before synchronize (crihook starts hooks so)")
        return self._pool

    # --- RunPodSandbox: the pod's bubble (pod scope) -----------------------------------------
    async def hints_run_pod_sandbox(self, ctx: HookContext) -> ResourceHints | None:
        count = self._bubble(ctx.pod)
        if count is None:
            return None
        return {"cpu": self._hints(self.pool.free(), frozenset(), count)}

    async def pre_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        count = self._bubble(ctx.pod)
        if count is None:
            return None
        pool = self.pool
        what = f"pod {_pod(ctx.pod)}'s bubble"
        cpus = self._take(pool.free(), count, ctx.affinity, what)
        self._keep_node_shared_pool(cpus, what)
        pool.reserve_bubble(ctx.pod.uid, cpus)
        return None  # the sandbox itself runs as the runtime places it; the bubble is ours

    async def post_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        if self._qos is not None:
            # kubelet made the pod's cgroup, so its QoS cgroup, before asking: written now,
            # before any container of the pod is made, if it was not there before (and a
            # bubble's CPUs leave the pools).
            self._qos.learn(ctx.pod.cgroup_parent, appeared=True)
            await self._follow_pool()
        if self._bubble(ctx.pod) is None:
            return None
        assert ctx.response is not None
        self.pool.confirm_bubble(ctx.pod.uid, ctx.response.pod_sandbox_id)  # type: ignore[attr-defined]
        return self._shared_updates(None)

    async def failed_run_pod_sandbox(self, ctx: HookContext) -> None:
        self.pool.drop_bubble(f"uid:{ctx.pod.uid}")
        await self._follow_pool()

    # --- CreateContainer ---------------------------------------------------------------------
    async def hints_create_container(self, ctx: HookContext) -> ResourceHints | None:
        container = _container(ctx)
        if self.pool.bubble_of(ctx.pod.id) is not None:
            return None
        try:
            scheduled = self._scheduled(ctx.pod)
        except InvalidRequest:
            return None  # the pre stage refuses the call, naming the annotation
        if scheduled.cpus:  # the scheduler chose: the NUMA nodes of its CPUs
            return {"cpu": [TopologyHint(self.pool.topology.numa_of(scheduled.cpus), True)]}
        count = self._exclusive(ctx.pod, container)
        if count is None:
            return None
        self._finished.pop(ctx.pod.id, None)  # asked anew for every call
        kept = self.pool.attempt_cpus(ctx.pod.id, container.name)
        if len(kept) == count:  # kubelet regenerates the hints of the CPUs it keeps
            return {"cpu": self._hints(kept, frozenset(), count)}
        reusable = self.pool.reusable(ctx.pod.id, container.name, await self._exits(ctx))
        return {"cpu": self._hints(self.pool.free(), reusable, count)}

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        pool = self.pool
        bubble = pool.bubble_of(ctx.pod.id)
        scheduled = self._scheduled(ctx.pod)
        if scheduled.cpus and bubble is None:
            return self._pin_scheduled(ctx.pod, container, scheduled.cpus)
        count = slice_cpus(container) if bubble else self._exclusive(ctx.pod, container)
        if count is None:
            if bubble:
                cpus = pool.bubble_shared_pool(ctx.pod.id)
                text, whose = format_cpu_list(cpus), f"pod {_pod(ctx.pod)}'s shared"
            else:
                name, numa = _member_of(ctx.pod, scheduled)
                text, whose = pool.node_pool_text(name, numa), _NODE_POOLS[name]
            if not text:
                raise Reject(
                    f"{whose} pool is empty: exclusive containers hold all of its "
                    f"CPUs, so container {container.name!r} has no CPU to run on"
                )
            if not bubble and self._follows(ctx.pod, name, numa):
                sent = ctx.peek_request().config.linux.resources.cpuset_cpus  # type: ignore[attr-defined]
                return _no_cpuset(sent, whose)
            why = f"cpus: {whose} pool" + _narrowed(scheduled)
            return Adjustment().set_cpuset_cpus(text).because(why)
        finished = await self._exits(ctx)
        # From here on nothing awaits: the pick and the reservation see one state of the pool.
        self._finished.pop(ctx.pod.id, None)
        what = f"container {container.name!r} of pod {_pod(ctx.pod)}"
        kept = pool.attempt_cpus(ctx.pod.id, container.name)
        why = f"cpus: {count} exclusive (whole CPUs of a Guaranteed container)"
        if len(kept) == count:
            cpus = kept  # a restart: kubelet keeps a container's CPUs under its name
            why += ", kept from its last attempt"
        else:
            reusable = pool.reusable(ctx.pod.id, container.name, finished)
            if bubble is not None:
                available = pool.bubble_shared_pool(ctx.pod.id) | (reusable & bubble.cpus)
            else:
                available = pool.free() | reusable
            cpus = self._take(available, count, ctx.affinity, what)
            if bubble is None:
                self._keep_node_shared_pool(cpus, what)
            elif pool.shared_members(ctx.pod.id) and not pool.bubble_shared_pool(ctx.pod.id) - cpus:
                raise Reject(
                    f"{what}: {count} exclusive CPUs would leave pod {_pod(ctx.pod)}'s shared "
                    "pool empty, and its other containers run on it"
                )
        key = reservation_key(ctx.pod.id, container.name, container.attempt)
        holder = Holder(
            ctx.pod.id,
            container.name,
            container.attempt,
            container.kind.value,
            cpus,
            in_bubble=bubble is not None,
            pod_name=_pod(ctx.pod),
        )
        pool.reserve(key, holder)
        if bubble is not None:
            why += f" from pod {_pod(ctx.pod)}'s own CPUs (pod topology scope)"
        adjustment = Adjustment().set_cpuset_cpus(format_cpu_list(cpus)).because(why)
        if self.config.disable_cfs_quota:
            adjustment.set_cpu_quota(-1)  # kubelet's DisableCPUQuotaWithExclusiveCPUs
        self._shared_updates(ctx.pod.id if bubble else None, adjustment)
        return adjustment

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        assert ctx.response is not None
        cid: str = ctx.response.container_id  # type: ignore[attr-defined]
        pool = self.pool
        key = reservation_key(ctx.pod.id, container.name, container.attempt)
        confirmed = pool.confirm(key, cid)
        if confirmed is not None:
            # The pick narrowed the pools: the QoS cgroups follow before kubelet hears OK,
            # so before it can start the container (not in the pre stage: a call a later
            # hook refuses, or a dry-run, then writes nothing).
            await self._follow_pool()
            if confirmed.cpus and self.config.disable_cfs_quota:
                self._unlimit_pod_quota(ctx.pod)
            return None
        # A shared container: recorded now (nothing was reserved for it). If the pool changed
        # since its pre stage, it follows.
        bubble = pool.bubble_of(ctx.pod.id) is not None
        name, numa = _member_of(ctx.pod, self._scheduled(ctx.pod))
        holder = Holder(
            ctx.pod.id,
            container.name,
            container.attempt,
            container.kind.value,
            in_bubble=bubble,
            pool=name,
            numa=numa,
            follows_qos=not bubble and self._follows(ctx.pod, name, numa),
        )
        pool.record(cid, holder)
        if holder.follows_qos:
            return None  # its QoS cgroup holds its pool, written when the pool changed
        sent = ctx.peek_request().config.linux.resources.cpuset_cpus  # type: ignore[attr-defined]
        if not bubble and sent == pool.member_text(holder):
            return None  # what its pre stage gave it is still its pool (the usual case)
        want = desired_cpus(pool, cid)
        if want is not None and parse_cpu_list(sent) != want:
            delta = ResourceDelta(cpuset_cpus=format_cpu_list(want))
            return Adjustment().update_container(cid, delta)
        return None

    async def failed_create_container(self, ctx: HookContext) -> None:
        container = _container(ctx)
        self._finished.pop(ctx.pod.id, None)
        self.pool.release(reservation_key(ctx.pod.id, container.name, container.attempt))
        await self._follow_pool()

    # --- UpdateContainerResources: what crihook set stays -------------------------------------
    async def pre_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        holder = self.pool.containers.get(container.id)
        want = desired_cpus(self.pool, container.id)
        if holder is None or want is None:
            return None
        if holder.follows_qos:
            sent = ctx.peek_request().linux.cpuset_cpus  # type: ignore[attr-defined]
            return _no_cpuset(sent, _NODE_POOLS[holder.pool])
        if holder.cpus and not holder.scheduled:
            milli = cpu_request_milli_from_shares(ctx.peek_request().linux.cpu_shares)  # type: ignore[attr-defined]
            if milli is not None and milli != len(holder.cpus) * 1000:
                if not self.config.resize_exclusive_cpus or holder.in_bubble:
                    _refuse_cpu_resize(holder, milli, container)
                return self._resize_exclusive(ctx, container, holder, milli)
        adjustment = Adjustment().set_cpuset_cpus(format_cpu_list(want)).because(_kept(holder))
        if holder.cpus and self.config.disable_cfs_quota:
            adjustment.set_cpu_quota(-1)
        return adjustment

    async def failed_update_container_resources(self, ctx: HookContext) -> None:
        container = _container(ctx)
        before = self._resized.pop(container.id, None)
        if before is not None:  # the runtime did not resize it: it holds what it held
            self.pool.record(container.id, before)
            # Its pre stage wrote nothing; this writes only if another call's stage wrote
            # the narrowed pools meanwhile (nothing due costs a few dict look-ups).
            await self._follow_pool()

    async def post_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        if self._resized.pop(_container(ctx).id, None) is not None:
            # A resize that grew exclusive CPUs narrowed the pools: the QoS cgroups follow
            # now, not in the pre stage (a call a later hook refuses, or a dry-run, writes
            # nothing). The container shares its new CPUs with the QoS cgroups' containers
            # for the runtime's update call, as a per-container update's window does.
            await self._follow_pool()
        return None

    def _resize_exclusive(
        self, ctx: HookContext, container: ContainerView, holder: Holder, milli: int
    ) -> Adjustment:
        """kubelet's in-place resize of exclusive CPUs (InPlacePodVerticalScalingExclusiveCPUs,
        KEP-5554): a container keeps the CPUs it was created with; growing adds free CPUs,
        those of its NUMA nodes first; shrinking keeps a subset of what it holds, never fewer
        than it was created with. The shared pool follows once the runtime applied it."""
        what = f"resize of container {container.name!r} of pod {_pod(ctx.pod)}"
        if milli % 1000:
            raise Reject(
                f"{what} to {milli}m CPU is infeasible: it holds {len(holder.cpus)} exclusive "
                "CPUs, which resize by whole CPUs only"
            )
        count, current, kept = milli // 1000, holder.cpus, holder.created_with
        topology = self.pool.topology
        if count < len(kept):
            raise Reject(
                f"{what} to {count} CPUs is infeasible: it was created with {len(kept)} "
                f"exclusive CPUs ({format_cpu_list(kept)}), which an in-place resize keeps"
            )
        if count > len(current):
            numa = topology.numa_of(current)
            affinity = TopologyHint(numa, True)
            extra = self._take(self.pool.free(), count - len(current), affinity, what)
            if self._topology_policy == "single-numa-node" and topology.numa_of(extra) - numa:
                raise Reject(
                    f"{what} to {count} CPUs: NUMA node(s) {format_cpu_list(numa)} have too "
                    "few free CPUs, and the single-numa-node topology policy keeps it there"
                )
            self._keep_node_shared_pool(extra, what)
            cpus = current | extra
        else:
            more = count - len(kept)
            affinity = TopologyHint(topology.numa_of(kept), True)
            cpus = kept | (self._take(current - kept, more, affinity, what) if more else kept)
        self._resized[container.id] = self.pool.resize(container.id, cpus)
        adjustment = Adjustment().set_cpuset_cpus(format_cpu_list(cpus))
        adjustment.because(
            f"exclusive CPUs resized in place from {len(current)} to {count} "
            f"(created with {format_cpu_list(kept)})"
        )
        if self.config.disable_cfs_quota:
            adjustment.set_cpu_quota(-1)
        self._shared_updates(None, adjustment)
        return adjustment

    # --- giving CPUs back --------------------------------------------------------------------
    async def post_stop_container(self, ctx: HookContext) -> Adjustment | None:
        cid = _container(ctx).id
        holder = self.pool.containers.get(cid)
        if holder is None:
            return None
        out = self._gave_back(holder, self.pool.stop(cid))
        await self._follow_pool()
        return out

    async def post_remove_container(self, ctx: HookContext) -> Adjustment | None:
        cid = _container(ctx).id
        holder = self.pool.containers.get(cid)
        if holder is None:
            return None
        out = self._gave_back(holder, self.pool.release(cid))
        await self._follow_pool()
        return out

    async def pre_update_pod_sandbox_resources(self, ctx: HookContext) -> Adjustment | None:
        """A pod-level resize of a pod with a bubble: its CPUs stay as they are (kubelet's
        pod-level resource managers do not resize a pod's exclusive resources). A pod whose
        containers hold exclusive CPUs: its CPU resize is refused here already, as its
        containers' would be, before kubelet writes the pod's cgroup (undoing the CFS quota
        crihook lifted for them) and then finds its containers' resize refused."""
        request = ctx.peek_request()
        if not request.HasField("resources"):
            return None
        resources = request.resources  # type: ignore[attr-defined]
        bubble = self.pool.bubble_of(ctx.pod.id)
        if bubble is None:
            overhead = request.overhead  # type: ignore[attr-defined]
            cpu_overhead = overhead.cpu_shares or overhead.cpu_quota  # in kubelet's pod figure
            if not self.config.resize_exclusive_cpus and not cpu_overhead:
                self._refuse_pod_cpu_resize(ctx.pod, resources.cpu_quota, resources.cpu_period)
            return None
        milli = cpu_request_milli_from_shares(resources.cpu_shares)
        if milli is not None and milli != len(bubble.cpus) * 1000:
            raise Reject(
                f"pod {_pod(ctx.pod)} holds {len(bubble.cpus)} CPUs of its own (pod topology "
                f"scope): resizing its CPU budget to {milli}m is infeasible"
            )
        return None

    def _refuse_pod_cpu_resize(self, pod: PodView, quota: int, period: int) -> None:
        """kubelet sends the pod's new CPU limit (its containers' sum) first when it grows,
        and any limit is a growth of the quota crihook lifted (-1). A limit that is not the
        exclusive CPUs the pod's containers hold is a resize of them: refused. Judged only
        where that sum is known: every container of the pod running on exclusive CPUs
        crihook picked (an exited one, an init container, may have asked for more, which
        kubelet's pod limit then is). The quota, not the shares: a cgroup v2 weight does not
        convert back to the shares it was written from."""
        holders = [h for _, h in self.pool.pod_holders(pod.id)]
        if quota <= 0 or period <= 0 or not holders:
            return
        if any(h.stopped or not h.cpus or h.scheduled or h.in_bubble for h in holders):
            return
        held = sum(len(h.cpus) for h in holders)
        if quota != held * period:
            raise Reject(
                f"resize of pod {_pod(pod)} to {quota * 1000 // period}m CPU is infeasible: its "
                f"containers hold {held} exclusive CPUs ({_STATIC_NO_RESIZE})"
            )

    async def post_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        pool = self.pool
        be_before = pool.be_pool()
        freed: set[int] = set()
        for key, _ in list(pool.pod_holders(ctx.pod.id)):
            freed |= pool.release(key)
        freed |= pool.drop_bubble(ctx.pod.id)
        self._unlimited.discard(ctx.pod.id)
        if not freed:
            return None
        await self._follow_pool()
        return self._shared_updates(None, be_changed=pool.be_pool() != be_before)

    # --- Koordinator: the CPUs koord-scheduler gave a pod ---------------------------------
    def _pin_scheduled(
        self, pod: PodView, container: ContainerView, cpus: frozenset[int]
    ) -> Adjustment:
        """The container runs on its pod's scheduler CPUs, held like exclusive ones (refused
        when another pod holds any of them, or they are reserved here)."""
        pool = self.pool
        what = f"container {container.name!r} of pod {_pod(pod)}"
        reserved = cpus & pool.reserved
        if reserved:
            raise Reject(
                f"{what}: koord-scheduler gave it cpus {format_cpu_list(cpus)} "
                f"({RESOURCE_STATUS_ANNOTATION}), but {format_cpu_list(reserved)} are reserved "
                "on this node"
            )
        others = pool.holders_of(cpus, pod.id)
        if others:
            other = others[0]
            whose = other.pod_name or other.pod[:12]
            raise Reject(
                f"pods {_pod(pod)} and {whose} both claim cpus "
                f"{format_cpu_list(cpus & other.cpus)}: {_pod(pod)} was given "
                f"{format_cpu_list(cpus)} by koord-scheduler ({RESOURCE_STATUS_ANNOTATION}), "
                f"{whose} holds {format_cpu_list(other.cpus)}"
                + (" (its own scheduler cpus)" if other.scheduled else " (exclusive cpus)")
            )
        be_shares = be_may_share(pod)
        self._keep_node_pools(cpus, what, be_shares=be_shares)
        key = reservation_key(pod.id, container.name, container.attempt)
        holder = Holder(
            pod.id,
            container.name,
            container.attempt,
            container.kind.value,
            cpus,
            scheduled=True,
            be_shares=be_shares,
            pod_name=_pod(pod),
        )
        pool.reserve(key, holder)
        why = f"cpus: koord-scheduler's ({RESOURCE_STATUS_ANNOTATION})"
        if not be_shares:
            why += ", out of the BE pool too (LSE)"
        adjustment = Adjustment().set_cpuset_cpus(format_cpu_list(cpus)).because(why)
        if self.config.disable_cfs_quota:
            adjustment.set_cpu_quota(-1)  # Koordinator unsets it for cpuset pods too
        # An LSR pod's CPUs stay in the BE pool: only the shared pool changed.
        self._shared_updates(None, adjustment, be_changed=not be_shares)
        return adjustment

    def _scheduled(self, pod: PodView) -> ScheduledResources:
        """What koord-scheduler gave the pod; InvalidRequest naming the annotation when it is
        malformed or names CPUs this node has not."""
        try:
            scheduled = scheduled_resources(pod)
            if scheduled.cpus or scheduled.numa_nodes:
                check_on_node(scheduled, self.pool.topology)
        except ValueError as exc:
            raise InvalidRequest(f"pod {_pod(pod)}: {exc}") from None
        return scheduled

    def _exclusive(self, pod: PodView, container: ContainerView) -> int | None:
        """Whole CPUs of its own a container gets: kubelet's static policy, but never for
        Koordinator's LS and BE pods, nor under the `none` policy."""
        if not self.config.static or shuns_exclusive_cpus(pod):
            return None
        return exclusive_cpus(container)

    def _bubble(self, pod: PodView) -> int | None:
        return bubble_cpus(pod, self._scope) if self.config.static else None

    # --- the pools in the QoS cgroups (shared_pool_in = "qos-cgroups") ----------------------
    def _follows(self, pod: PodView, pool: str, numa: frozenset[int]) -> bool:
        return self._qos is not None and self._qos.follows(pod, pool, numa)

    async def _follow_pool(self) -> None:
        """The QoS cgroups follow a change of the pools (`qos-cgroups`; else nothing)."""
        if self._qos is not None:
            await self._qos.follow()

    # --- helpers -----------------------------------------------------------------------------
    def _unlimit_pod_quota(self, pod: PodView) -> None:
        """kubelet lifts the CFS quota of a pod with exclusive CPUs, its own cgroup too, so
        the pod's quota does not throttle them. Once per pod; a failure is logged."""
        if self._host is None or pod.id in self._unlimited or not pod.cgroup_parent:
            return
        try:
            # On the loop, not in a thread: a stat, a read and a write in cgroupfs (kernel
            # memory, no disk) take ~20 µs here, and the thread hop cost the Guaranteed
            # CreateContainer's answer 0.4-0.6 ms (the store's write-ahead append, same trade).
            done = self._host.unlimit_cpu_quota(pod.cgroup_parent)
        except (OSError, ValueError) as exc:
            log.warning("cpuset: pod %s keeps its CFS quota: %s", _pod(pod), exc)
            return
        if done:
            self._unlimited.add(pod.id)

    def _place_adopted(self, count: int) -> frozenset[int] | None:
        try:
            cpus = self._take(self.pool.free(), count, None, "an adopted container")
            self._keep_node_shared_pool(cpus, "an adopted container")
        except Reject:
            return None
        return cpus

    def _gave_back(self, holder: Holder, freed: frozenset[int]) -> Adjustment | None:
        """Updates for the shared pool that grew when `holder` gave its CPUs back."""
        if holder.in_bubble:  # its slice returns to its pod's shared pool
            out = self._shared_updates(holder.pod) if holder.cpus else None
            return out.because("cpus given back to its pod's shared pool") if out else None
        out = self._shared_updates(None, be_changed=not holder.be_shares) if freed else None
        return (
            out.because(f"cpus {format_cpu_list(freed)} given back: the pools grow")
            if out
            else None
        )

    def _keep_node_shared_pool(self, cpus: frozenset[int], what: str) -> None:
        """Refuse to take the node's last shared CPUs while shared containers run on them: an
        empty cpuset cannot be applied. (kubelet's static policy requires reserved CPUs, which
        stay in the shared pool unless strict-cpu-reservation takes them out; crihook allows
        none, and with that option the pool can empty as in kubelet.)"""
        self._keep_node_pools(cpus, what, be_shares=False)

    def _keep_node_pools(self, cpus: frozenset[int], what: str, *, be_shares: bool) -> None:
        """`_keep_node_shared_pool` for every node pool a container runs on (the BE pool
        keeps `cpus` when BE pods may share them)."""
        pool = self.pool
        shared = pool.shared_pool() - cpus
        be = pool.be_pool() - (frozenset() if be_shares else cpus)
        for runs_on, numa in pool.member_keys():  # a few pools, however many containers
            left = be if runs_on == BE_POOL else shared
            if numa:
                left &= pool.topology.cpus_in_numa(numa)
            if not left:
                name = "BE pool" if runs_on == BE_POOL else "shared pool"
                raise Reject(
                    f"{what}: {len(cpus)} exclusive CPUs would leave the node's {name} empty, "
                    "and other containers run on it (reserve CPUs with [hooks.cpuset] "
                    "reserved_cpus)"
                )

    def _take(
        self, available: frozenset[int], count: int, affinity: TopologyHint | None, what: str
    ) -> frozenset[int]:
        try:
            return take_cpus(
                self.pool.topology,
                available,
                count,
                spread_numa=self.config.distribute_cpus_across_numa,
                full_cores=self.config.full_pcpus_only,
                numa_affinity=affinity.numa if affinity is not None else None,
                uncore_cache=self.config.prefer_align_cpus_by_uncorecache,
                spread_cores=self.config.distribute_cpus_across_cores,
                align_socket=self.config.align_by_socket,
            )
        except CPUAllocationError as exc:
            raise Reject(f"{what}: {count} exclusive CPUs: {exc}") from None

    def _hints(
        self, available: frozenset[int], reusable: frozenset[int], count: int
    ) -> list[TopologyHint]:
        return cpu_hints(
            self.pool.topology, available, reusable, count, align_socket=self.config.align_by_socket
        )

    async def _exits(self, ctx: HookContext) -> Mapping[str, bool]:
        """Which earlier containers of the pod have exited, when it matters: their CPUs are
        reusable if CRI does not say what they are (no init-containers annotation). Asked
        once per call: the hints stage asks, the pre stage takes the answer."""
        pod_id = ctx.pod.id
        cached = self._finished.get(pod_id)
        if cached is not None:
            return cached
        unknown = any(h.cpus and h.kind == "unknown" for _, h in self.pool.pod_holders(pod_id))
        finished: Mapping[str, bool] = {}
        if unknown and self._runtime is not None:
            states = await self._runtime.container_states(pod_id)
            finished = {cid: s is ContainerState.EXITED for cid, s in states.items()}
        self._finished[pod_id] = finished
        return finished

    def _shared_updates(
        self, pod: str | None, adjustment: Adjustment | None = None, *, be_changed: bool = True
    ) -> Adjustment | None:
        """Move the containers of a shared pool (the node's, or a bubble's) onto it as it is
        now. Added to `adjustment`, or a new one; None when nobody runs on it. The node's
        pools: one group update each (`PoolUpdate`), whatever the number of containers on
        them; a bubble's: an update per container of its pod."""
        pool = self.pool
        if pod is not None:
            members = pool.shared_members(pod)
            if not members:
                return adjustment
            out = adjustment if adjustment is not None else Adjustment()
            bubble = ResourceDelta(cpuset_cpus=format_cpu_list(pool.bubble_shared_pool(pod)))
            for cid in members:
                out.update_container(cid, bubble)
            return out
        names = [SHARED_POOL, BE_POOL] if be_changed else [SHARED_POOL]
        names = [name for name in names if pool.has_members(name)]
        if not names:
            return adjustment
        out = adjustment if adjustment is not None else Adjustment()
        for name in names:
            out.update_group(PoolUpdate(pool, name))
        return out


def _new_pool(node: Topology, config: CpusetOptions, sync: SyncContext) -> CpuPool:
    reserved = node_reserved_cpus(node, config, sync.topology_policy)  # ValueError: bad option
    pool = CpuPool(node, reserved, sync.state, strict_reservation=config.strict_cpu_reservation)
    dropped = pool.load()
    if dropped:
        log.error("cpuset: unreadable state entries dropped: %s", ", ".join(dropped))
    return pool


def _no_cpuset(sent: str, whose: str) -> Adjustment | None:
    """A container that follows its QoS cgroup has no cpuset of its own: one kubelet sent
    is cleared (as crihook replaces it with the pool otherwise), none sent is left so."""
    if not sent:
        return None
    why = f"cpus: none of its own, its QoS cgroup holds {whose} pool (kubelet's {sent} cleared)"
    return Adjustment().set_cpuset_cpus("").because(why)


def _refuse_cpu_resize(holder: Holder, milli: int, container: ContainerView) -> None:
    """kubelet's rule: with the static policy a Guaranteed container's CPUs are not resized
    in place unless InPlacePodVerticalScalingExclusiveCPUs is on (`resize_exclusive_cpus`,
    off by default, as in kubelet; a pod's bubble never): the resize is refused, and kubelet
    reports it infeasible. (kubelet re-sending the same resources, its reconcile or a
    restart, is no resize: the caller checks.)"""
    raise Reject(
        f"resize of container {container.name!r} to {milli}m CPU is infeasible: it holds "
        f"{len(holder.cpus)} exclusive CPUs ({_STATIC_NO_RESIZE})"
    )


_STATIC_NO_RESIZE = "kubelet's static policy does not resize Guaranteed containers in place"


_POOL_NAMES = {SHARED_POOL: "shared", BE_POOL: "BE"}
_NODE_POOLS = {name: f"the node's {what}" for name, what in _POOL_NAMES.items()}


def _member_of(pod: PodView, scheduled: ScheduledResources) -> tuple[str, frozenset[int]]:
    """The node pool a container of `pod` without CPUs of its own runs on, and the NUMA nodes
    koord-scheduler narrowed it to (Koordinator: the LS share pool of those nodes)."""
    if scheduled.numa_nodes:
        return SHARED_POOL, scheduled.numa_nodes
    return member_pool(pod), frozenset()


def _narrowed(scheduled: ScheduledResources) -> str:
    if not scheduled.numa_nodes:
        return ""
    nodes = format_cpu_list(scheduled.numa_nodes)
    return f" of NUMA node(s) {nodes} ({RESOURCE_STATUS_ANNOTATION})"


def _kept(holder: Holder) -> str:
    """Why a container's cpuset is re-applied on UpdateContainerResources."""
    if holder.scheduled:
        what = f"koord-scheduler's cpus ({RESOURCE_STATUS_ANNOTATION})"
    elif holder.cpus:
        what = "its exclusive CPUs"
    elif holder.in_bubble:
        what = "its pod's shared pool"
    else:
        what = f"the node's {_POOL_NAMES.get(holder.pool, holder.pool)} pool"
    return f"cpus kept: {what} (kubelet's resources would undo it)"


def _container(ctx: HookContext) -> ContainerView:
    assert ctx.container is not None, "container stages always carry the container"
    return ctx.container


def _pod(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}" if pod.name else pod.id[:12]
