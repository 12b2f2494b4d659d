"""The built-in `koordinator` hook: what koordlet's runtime hooks give Koordinator's pods, from
the signals Koordinator puts on them (`protocol`), without the API server.

    RunPodSandbox    pre: a pod koord-scheduler gave CPUs gets them, and no CFS quota, on
                          its sandbox; a BE pod its batch resources, summed (`batch`)
                     post: a BE pod's own cgroup gets those sums written, as koordlet
                          writes it (containerd applies the sandbox's resources nowhere)
    CreateContainer  hints/pre/post/failed: CPUs placed on Koordinator's pools by the
                          CPU ledger (`cpu_manager = "none"`); pre: a BE container its
                          batch CFS quota/period, shares and memory limit
    UpdateContainerResources  pre: the cpuset and the batch values stay (kubelet re-sends
                          BestEffort resources)
    UpdatePodSandboxResources pre: the pod-level values stay
    Stop/RemoveContainer, RemovePodSandbox  post: CPUs given back, pools updated
    synchronize      (start, reconcile) every BE pod's cgroup written again: a restart, a
                          pod learnt from the runtime, a write that failed

The pod cgroup is written through `SyncContext.cgroups` (`crihook.hooks.node.PodCgroups`), in a
thread, after the runtime made the sandbox: a failed write never fails the call; it is logged
naming the file, counted (`pod_cgroup_failures`) and tried again at the pod's next
CreateContainer and at the next synchronize.

CPU placement is one ledger (`crihook.hooks.cpus`, below both hooks that place CPUs): with
`cpu_manager = "none"` this hook runs one in kubelet's `none` mode (no exclusive CPUs but the
scheduler's); with `cpu_manager = "cpuset"` the cpuset hook (before this one in the chain)
is the ledger, as kubelet's static policy, and this hook sets no container cpuset. Either
way the ledger honours Koordinator's CPU signals (`crihook.hooks.cpus.koordinator`).

A pod labelled `runtimeproxy.koordinator.sh/skip-hookserver: "true"`, and a pod crihook
exempts (`exempt_namespaces`, `exempt_labels`: `HookContext.exempt`), gets nothing of
Koordinator's from this hook (no scheduler CPUs on its sandbox, no batch values), and is
placed and counted on the pools like every pod (the resource hooks' rule for exempt pods): the
hook does not honour the exemption, so that it still sees these pods.

Every adjustment says why (`Adjustment.because`): the QoS class and where it came from, the
pool or the scheduler's CPUs, the batch values and their annotation, or the skip; `crihook
replay --explain koordinator` shows it per container.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from crihook.hooks.cpus import CpuLedger
from crihook.hooks.cpus.koordinator import (
    QOS_LABEL,
    RESOURCE_STATUS_ANNOTATION,
    ScheduledResources,
    check_on_node,
    raw_qos,
    scheduled_resources,
)
from crihook.hooks.koordinator.batch import BASE_PERIOD_US, container_resources, pod_resources
from crihook.hooks.koordinator.options import KoordinatorOptions, cpuset_options, parse_options
from crihook.hooks.koordinator.protocol import (
    EXTENDED_RESOURCE_SPEC_ANNOTATION,
    SKIP_LABEL,
    BatchSpec,
    batch_spec,
    is_batch,
    qos_class,
    skipped,
)
from crihook.hooks.node import (
    PodCgroups,
    PodLimits,
    Topology,
    format_cpu_list,
    parse_cpu_list,
)
from crihook.hooks.spec import (
    Adjustment,
    ContainerUpdate,
    ContainerView,
    Hook,
    HookContext,
    InvalidRequest,
    PodView,
    PoolUsage,
    QoSClass,
    Reject,
    ResourceHints,
    SyncContext,
)

__all__ = ["KoordinatorHook"]

log = logging.getLogger(__name__)


class KoordinatorHook(Hook):
    honours_exemption = False
    sets = ("cpuset_cpus", "cpu_quota", "cpu_period", "cpu_shares", "memory_limit_in_bytes")

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.config: KoordinatorOptions = parse_options(self.options)
        self._cpus: CpuLedger | None = None
        """The CPU ledger, when this hook places CPUs (`cpu_manager = "none"`)."""
        if self.config.places_cpus:
            self._cpus = CpuLedger(cpuset_options(self.config))
        self._node: Topology | None = None
        self._cgroups: PodCgroups | None = None
        self._unwritten: dict[str, tuple[PodView, PodLimits]] = {}
        """Pod cgroup parent → the limits a failed write left unwritten (tried again)."""
        self.pod_cgroup_failures = 0
        """Failed writes of a pod's cgroup since start."""

    @property
    def ledger(self) -> CpuLedger | None:
        return self._cpus

    def usage(self) -> Sequence[PoolUsage]:
        """The CPU ledger's pools, when this hook places CPUs."""
        return self._cpus.usage() if self._cpus is not None else ()

    def failures(self) -> Mapping[str, int]:
        return {"pod_cgroup": self.pod_cgroup_failures}

    # --- start-up ----------------------------------------------------------------------------
    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        self._node = sync.node
        self._cgroups = sync.cgroups
        self._unwritten.clear()  # every pod still there is written again now
        pods = []
        for pod in sync.pods:
            limits = self._pod_limits(pod, exempt=sync.exempt(pod))
            if limits is not None:
                pods.append((pod, limits))
        await self._write_pod_cgroups(pods)
        if self._cpus is None:
            return ()
        return await self._cpus.synchronize(sync)

    # --- RunPodSandbox: the pod's own resources ----------------------------------------------
    async def pre_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        adjustment = self._pod_resources(ctx)
        log.debug("koordinator: pod %s: %r", _pod(ctx.pod), adjustment)
        return adjustment

    async def post_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        limits = self._pod_limits(ctx.pod, exempt=ctx.exempt)
        if limits is not None:
            await self._write_pod_cgroups([(ctx.pod, limits)])
        return None

    async def pre_update_pod_sandbox_resources(self, ctx: HookContext) -> Adjustment | None:
        if self._cpus is not None:
            await self._cpus.pre_update_pod_sandbox_resources(ctx)  # may refuse the resize
        return self._pod_resources(ctx)

    # --- CreateContainer -----------------------------------------------------------------------
    async def hints_create_container(self, ctx: HookContext) -> ResourceHints | None:
        return await self._cpus.hints_create_container(ctx) if self._cpus is not None else None

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        if self._cpus is not None:
            _refuse_a_second_cpu_manager(ctx, container)
            adjustment = await self._cpus.pre_create_container(ctx)
        else:
            self._check_placed(ctx, container)
            adjustment = Adjustment().because('cpus: the cpuset hook\'s (cpu_manager = "cpuset")')
        return self._with_batch(ctx, container, adjustment)

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        if self._unwritten:  # its pod's cgroup could not be written: try again
            unwritten = self._unwritten.get(ctx.pod.cgroup_parent)
            if unwritten is not None:
                await self._write_pod_cgroups([unwritten])
        return await self._cpus.post_create_container(ctx) if self._cpus is not None else None

    async def failed_create_container(self, ctx: HookContext) -> None:
        if self._cpus is not None:
            await self._cpus.failed_create_container(ctx)

    # --- UpdateContainerResources: what was set stays ------------------------------------------
    async def pre_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        adjustment = None
        if self._cpus is not None:
            adjustment = await self._cpus.pre_update_container_resources(ctx)
        if not ctx.peek_request().HasField("linux"):  # annotations only: no resources to keep
            return adjustment
        return self._with_batch(ctx, _container(ctx), adjustment)

    # --- giving CPUs back ------------------------------------------------------------------------
    async def post_stop_container(self, ctx: HookContext) -> Adjustment | None:
        return await self._cpus.post_stop_container(ctx) if self._cpus is not None else None

    async def post_remove_container(self, ctx: HookContext) -> Adjustment | None:
        return await self._cpus.post_remove_container(ctx) if self._cpus is not None else None

    async def post_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        self._unwritten.pop(ctx.pod.cgroup_parent, None)
        if self._cpus is None:
            return None
        return await self._cpus.post_remove_pod_sandbox(ctx)

    # --- helpers -------------------------------------------------------------------------------
    def _pod_resources(self, ctx: HookContext) -> Adjustment:
        """koordlet's pod-level values: the scheduler's CPUs without a CFS quota, or a BE
        pod's batch resources (kubelet leaves BestEffort pods unlimited); empty, with the
        reason, when there are none."""
        pod = ctx.pod
        skip = _skip_reason(ctx)
        if skip:
            return Adjustment().because(skip)
        adjustment = Adjustment().because(_qos_reason(pod))
        cpus = self._scheduled(pod).cpus
        if cpus:
            adjustment.set_cpuset_cpus(format_cpu_list(cpus)).set_cpu_quota(-1)
            adjustment.because(
                f"koord-scheduler's cpus ({RESOURCE_STATUS_ANNOTATION}), no CFS quota"
            )
        if is_batch(pod):
            spec = _batch_spec(pod)
            if spec is None:
                adjustment.because(f"no {EXTENDED_RESOURCE_SPEC_ANNOTATION}: kubelet's values")
            else:
                values = pod_resources(spec, cfs_quota=self.config.batch_cfs_quota)
                values.apply(adjustment).because(
                    f"batch resources summed over its containers "
                    f"({EXTENDED_RESOURCE_SPEC_ANNOTATION}): {values.describe()}"
                )
        return adjustment

    def _pod_limits(self, pod: PodView, *, exempt: bool) -> PodLimits | None:
        """What koordlet writes into a BE pod's own cgroup: its batch resources summed over
        its containers (`pod_resources`; unlimited quota or memory as -1). None for a pod
        it leaves alone (not BE, skipped or exempt, no or a malformed extended resource
        spec: the pre stage refused that one)."""
        if exempt or skipped(pod) or not is_batch(pod) or not pod.cgroup_parent:
            return None
        try:
            spec = batch_spec(pod)
        except ValueError:
            return None
        if spec is None:
            return None
        values = pod_resources(spec, cfs_quota=self.config.batch_cfs_quota)
        memory = values.memory_limit_bytes
        return PodLimits(
            cpu_shares=values.cpu_shares,
            cpu_quota_us=values.cpu_quota,
            cpu_period_us=BASE_PERIOD_US,
            memory_limit_bytes=-1 if memory is None else memory,
        )

    async def _write_pod_cgroups(self, pods: Sequence[tuple[PodView, PodLimits]]) -> None:
        """Write each pod's limits into its cgroup, off the event loop. The runtime already
        made the pods: a failure is logged (it names the file), counted, and left to be tried
        again, never raised."""
        cgroups = self._cgroups
        if cgroups is None or not pods:
            return
        jobs = [(pod.cgroup_parent, limits) for pod, limits in pods]
        results = await asyncio.to_thread(_write_all, cgroups, jobs)
        for (pod, limits), (written, error) in zip(pods, results, strict=True):
            if error is None:
                self._unwritten.pop(pod.cgroup_parent, None)
                log.debug("koordinator: pod %s: cgroup limits written: %s", _pod(pod), written)
                continue
            self.pod_cgroup_failures += 1
            self._unwritten[pod.cgroup_parent] = (pod, limits)
            log.warning(
                "koordinator: pod %s: its cgroup keeps kubelet's limits for now (tried again "
                "at its next container and at the next synchronize): %s",
                _pod(pod),
                error,
            )

    def _with_batch(
        self, ctx: HookContext, container: ContainerView, adjustment: Adjustment | None
    ) -> Adjustment:
        """A BE container's batch values on top of `adjustment` (the ledger's), and why."""
        pod = ctx.pod
        out = Adjustment() if adjustment is None else adjustment  # the ledger's reason first
        skip = _skip_reason(ctx)
        out.because(skip or _qos_reason(pod))
        if not is_batch(pod) or skip:
            return out
        spec = _batch_spec(pod)
        entry = spec.containers.get(container.name) if spec is not None else None
        if entry is None:  # koordlet: nothing given for it, kubelet's values stay
            where = "" if spec is None else " for this container"
            return out.because(f"no batch resources{where} ({EXTENDED_RESOURCE_SPEC_ANNOTATION})")
        values = container_resources(entry, cfs_quota=self.config.batch_cfs_quota)
        return values.apply(out).because(
            f"batch resources ({EXTENDED_RESOURCE_SPEC_ANNOTATION}): {values.describe()}"
        )

    def _scheduled(self, pod: PodView) -> ScheduledResources:
        try:
            scheduled = scheduled_resources(pod)
            if self._node is not None and (scheduled.cpus or scheduled.numa_nodes):
                check_on_node(scheduled, self._node)
        except ValueError as exc:
            raise InvalidRequest(f"pod {_pod(pod)}: {exc}") from None
        return scheduled

    def _check_placed(self, ctx: HookContext, container: ContainerView) -> None:
        """`cpu_manager = "cpuset"`: the cpuset hook before this one must have put a pod
        koord-scheduler gave CPUs on them; if nothing did, the chain is misconfigured."""
        cpus = self._scheduled(ctx.pod).cpus
        if not cpus:
            return
        placed = ctx.peek_request().config.linux.resources.cpuset_cpus  # type: ignore[attr-defined]
        if parse_cpu_list(placed) != cpus:
            raise Reject(
                f"container {container.name!r} of pod {_pod(ctx.pod)} was given cpus "
                f"{format_cpu_list(cpus)} by koord-scheduler ({RESOURCE_STATUS_ANNOTATION}), "
                f"but no hook before koordinator put it on them ({placed or 'no cpuset'}): "
                '[hooks.koordinator] cpu_manager = "cpuset" needs the cpuset hook earlier in '
                'the chain; without it set cpu_manager = "none"'
            )


def _write_all(
    cgroups: PodCgroups, jobs: Sequence[tuple[str, PodLimits]]
) -> list[tuple[list[str], str | None]]:
    """Each job's files written, or why not (in a worker thread)."""
    out: list[tuple[list[str], str | None]] = []
    for parent, limits in jobs:
        try:
            out.append((cgroups.write_limits(parent, limits), None))
        except (OSError, ValueError) as exc:
            out.append(([], str(exc)))
    return out


def _refuse_a_second_cpu_manager(ctx: HookContext, container: ContainerView) -> None:
    """`cpu_manager = "none"`: this hook places CPUs; a cpuset set by a hook before it means
    another CPU manager (the cpuset hook) is in the chain too: two ledgers would hand the
    same CPUs out twice."""
    placed = ctx.peek_request().config.linux.resources.cpuset_cpus  # type: ignore[attr-defined]
    if placed != container.resources.cpuset_cpus:
        raise Reject(
            f"a hook before koordinator set container {container.name!r}'s cpuset "
            f"({placed}): with the cpuset hook in the chain, set [hooks.koordinator] "
            'cpu_manager = "cpuset" (it then places CPUs for Koordinator\'s pods too)'
        )


def _skip_reason(ctx: HookContext) -> str:
    """Why Koordinator's rules leave the pod alone ("" when they do not): koord-runtime-proxy's
    skip label, or crihook's own exemption."""
    if skipped(ctx.pod):
        return f'skipped: label {SKIP_LABEL}="true" (placed and counted on the pools only)'
    if ctx.exempt:
        return "skipped: exempt by crihook's configuration (placed and counted on the pools only)"
    return ""


def _qos_reason(pod: PodView) -> str:
    """The pod's QoS class and where it came from (asked on every call: a handful of distinct
    answers, each worded once)."""
    key = (pod.labels.get(QOS_LABEL), pod.qos_class)
    reason = _QOS_REASONS.get(key)
    if reason is None:
        if len(_QOS_REASONS) >= 256:  # label values are the users': keep the memo small
            _QOS_REASONS.clear()
        reason = _QOS_REASONS[key] = _describe_qos(pod)
    return reason


_QOS_REASONS: dict[tuple[str | None, QoSClass], str] = {}


def _describe_qos(pod: PodView) -> str:
    qos = qos_class(pod)
    if qos is None:
        return "no QoS class (not under kubelet's cgroups, no label)"
    if raw_qos(pod) is not None:
        return f"QoS {qos.value} (label {QOS_LABEL})"
    label = pod.labels.get(QOS_LABEL)
    unknown = f"label {QOS_LABEL}={label!r} unknown, so " if label is not None else ""
    return f"QoS {qos.value} ({unknown}from Kubernetes QoS {pod.qos_class.value})"


def _batch_spec(pod: PodView) -> BatchSpec | None:
    try:
        return batch_spec(pod)
    except ValueError as exc:
        raise InvalidRequest(f"pod {_pod(pod)}: {exc}") from None


def _container(ctx: HookContext) -> ContainerView:
    assert ctx.container is not None, "container stages always carry the container"
    return ctx.container


def _pod(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}" if pod.name else pod.id[:12]
