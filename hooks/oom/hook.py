"""The built-in `oom` hook: kubelet's oom_score_adj by default, with policies beyond it.

    [hooks.oom]
    override_ranges = { "batch" = "500..1000", "*" = "0..1000" }
    qos_scores = { BestEffort = 1000 }

- By default kubelet's value (which kubelet computes and sends) is kept.
- `qos_scores` sets a fixed score per QoS class instead of kubelet's.
- A pod annotation `oom.crihook.io/score-adj` overrides both, but only inside the range
  configured for the pod's namespace (`"*"`: every other namespace); outside it, or when it is
  not an integer, CreateContainer fails with INVALID_ARGUMENT naming the annotation.
- The state keeps, per container, the score it was asked for (`asked`) and the one its
  processes have (`score`): what the runtime applied at creation, which containerd with
  `restrict_oom_score_adj` raises to its own score (a Guaranteed container's -997 becomes 0
  where containerd lacks CAP_SYS_RESOURCE). The runtime's clamp is learnt from its answers
  (ContainerStatus), asked only while it is not known: once per floor, not once per call.
- The score crihook set is sticky: kubelet's UpdateContainerResources carries it again.
- containerd ignores oom_score_adj in UpdateContainerResources, and so does this hook unless
  kubelet asks for another score than the container's (a resize that changes a Burstable
  container's memory request): that one is written to `/proc/<pid>/oom_score_adj` of every
  process of the container, through the Host seam, as the runtime would have applied it. An
  update's 0 is "unset" (containerd reads every number of an update so, and kubelet never
  asks for 0): kubelet's static CPU manager and `crictl update` send only what they change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from crihook.hooks.node import Host
from crihook.hooks.oom.policy import (
    SCORE_ADJ_ANNOTATION,
    ScoreClamp,
    ScoreRanges,
    parse_score_override,
    parse_score_ranges,
)
from crihook.hooks.spec import (
    Adjustment,
    ContainerUpdate,
    ContainerView,
    Hook,
    HookContext,
    InvalidRequest,
    PodView,
    QoSClass,
    RuntimeQueries,
    SyncContext,
)
from crihook.hooks.spec.options import reject_unknown

__all__ = ["OomHook", "OomOptions", "chosen_score", "parse_options"]

log = logging.getLogger(__name__)

_KEYS = {"override_ranges", "qos_scores"}
_QOS = {q.value: q for q in (QoSClass.GUARANTEED, QoSClass.BURSTABLE, QoSClass.BEST_EFFORT)}
_CONTAINER = "c:"


@dataclass(frozen=True)
class OomOptions:
    ranges: ScoreRanges = field(default_factory=ScoreRanges)
    qos_scores: Mapping[QoSClass, int] = field(default_factory=lambda: MappingProxyType({}))


def parse_options(options: Mapping[str, Any]) -> OomOptions:
    reject_unknown("oom", options, _KEYS)
    ranges_table = options.get("override_ranges", {})
    if not isinstance(ranges_table, Mapping):
        raise ValueError('oom: override_ranges must be a table of namespace = "LOW..HIGH"')
    try:
        ranges = parse_score_ranges(ranges_table)
    except ValueError as exc:
        raise ValueError(f"oom: override_ranges: {exc}") from None
    table = options.get("qos_scores", {})
    if not isinstance(table, Mapping):
        raise ValueError("oom: qos_scores must be a table of QoS class = score")
    scores = {}
    for name, score in table.items():
        if name not in _QOS:
            raise ValueError(f"oom: qos_scores: {name!r} is not one of {', '.join(_QOS)}")
        if isinstance(score, bool) or not isinstance(score, int) or not -1000 <= score <= 1000:
            raise ValueError(f"oom: qos_scores {name}: {score!r} is not an integer in -1000..1000")
        scores[_QOS[name]] = score
    return OomOptions(ranges, MappingProxyType(scores))


def chosen_score(options: OomOptions, pod: PodView) -> int | None:
    """The score crihook sets for the pod's containers, or None (kubelet's is kept).
    InvalidRequest when the pod's annotation is malformed or outside its namespace's range."""
    raw = pod.annotations.get(SCORE_ADJ_ANNOTATION)
    if raw is not None:
        try:
            score = parse_score_override(raw)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        allowed = options.ranges.range_for(pod.namespace)
        if allowed is None or not allowed.contains(score):
            where = f"allowed: {allowed}" if allowed else "no override is allowed there"
            raise InvalidRequest(
                f"annotation {SCORE_ADJ_ANNOTATION}={raw} is outside the range for namespace "
                f"{pod.namespace!r} ({where}; see [hooks.oom] override_ranges)"
            )
        return score
    return options.qos_scores.get(pod.qos_class)


class OomHook(Hook):
    sets = ("oom_score_adj",)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.config = parse_options(self.options)
        self._host: Host | None = None
        self._runtime: RuntimeQueries | None = None
        self._clamp = ScoreClamp()

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        self._host = sync.host
        self._runtime = sync.runtime
        # Learnt again: the runtime may have restarted with another setting meanwhile.
        self._clamp = ScoreClamp()
        live = {c.id: c for c in sync.containers}
        for key, doc in sync.state.items():
            if not key.startswith(_CONTAINER):
                continue
            cid = key[len(_CONTAINER) :]
            if cid not in live:
                sync.state.delete(key)
            elif "asked" not in doc:  # written by a crihook that kept only the score asked
                reported = live[cid].resources.oom_score_adj
                applied = doc["score"] if reported is None else reported
                sync.state.set(key, {**doc, "asked": doc["score"], "score": applied})
        # Containers this hook did not see created (crihook was put in front of a running
        # node): known from now on, with the score the runtime reports, so a later kubelet
        # update reaches their processes too. What kubelet asked for is not known; what
        # crihook's policy asks for is.
        pods = {p.id: p for p in sync.pods}
        for cid, container in live.items():
            score = container.resources.oom_score_adj
            pod = pods.get(container.pod_id)
            if sync.state.get(_CONTAINER + cid) is None and score is not None and pod is not None:
                chosen = _chosen(self, pod)
                doc = {"pod": pod.id, "asked": chosen, "score": score, "sticky": chosen is not None}
                sync.state.set(_CONTAINER + cid, doc)
        return ()

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        score = chosen_score(self.config, ctx.pod)
        return None if score is None else Adjustment().set_oom_score_adj(score)

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        cid: str = ctx.response.container_id  # type: ignore[union-attr]
        asked = int(ctx.peek_request().config.linux.resources.oom_score_adj)  # type: ignore[attr-defined]
        applied = self._clamp.applied(asked)
        sticky = _sticky(self, ctx.pod)
        doc = {"pod": ctx.pod.id, "asked": asked, "score": applied, "sticky": sticky}
        if applied is None:
            # Kept before the runtime is asked: a hook timeout meanwhile loses no container.
            ctx.state.set(_CONTAINER + cid, {**doc, "score": asked})
            doc["score"] = await self._applied_by_runtime(cid, asked)
        ctx.state.set(_CONTAINER + cid, doc)
        return None

    async def _applied_by_runtime(self, cid: str, asked: int) -> int:
        """The score the runtime gave the container it just created (and what that says of
        its clamp); `asked` when it cannot say."""
        if self._runtime is None:
            return asked
        try:
            applied = await self._runtime.oom_score_adj(cid)
        except Exception as exc:  # the runtime's error (grpc): the next container asks again
            log.warning(
                "oom: cannot ask the runtime which oom_score_adj container %s got (%s); "
                "recorded as asked (%d)",
                cid[:12],
                exc,
                asked,
            )
            return asked
        self._clamp.learn(asked, applied)
        return asked if applied is None else applied

    async def pre_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        kept = ctx.state.get(_CONTAINER + _container(ctx).id)
        if kept is None or not kept.get("sticky"):
            return None
        return Adjustment().set_oom_score_adj(int(kept["asked"]))

    async def post_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        key = _CONTAINER + container.id
        kept = ctx.state.get(key)
        if kept is None or self._host is None or not ctx.peek_request().HasField("linux"):
            return None  # without resources (only annotations, say) it asks for no score
        asked = int(ctx.peek_request().linux.oom_score_adj)  # type: ignore[attr-defined]
        if asked == 0 or asked == kept.get("asked"):
            return None  # unset (a partial update), or the score it has been asked for
        current = int(kept["score"])
        # As the runtime would have applied it at creation, when its clamp is known; else
        # as asked: the kernel refuses a score below what the container may have (EACCES)
        # where containerd's clamp comes from (no CAP_SYS_RESOURCE).
        score = self._clamp.applied(asked)
        score = asked if score is None else score
        name = container.name or container.id[:12]
        if score != current:
            # containerd ignores oom_score_adj on update: crihook writes it to the processes.
            try:
                written = await asyncio.to_thread(
                    _write_scores, self._host, ctx.pod.cgroup_parent, container.id, score
                )
            except PermissionError as exc:
                log.warning(
                    "oom: container %s keeps oom_score_adj %d: the kernel refuses %d (%s)",
                    name,
                    current,
                    score,
                    exc,
                )
                return None
            log.info(
                "oom: container %s now has oom_score_adj %d (asked for %d; %d process(es))",
                name,
                score,
                asked,
                written,
            )
        ctx.state.set(key, {**kept, "asked": asked, "score": score})
        return None

    async def post_remove_container(self, ctx: HookContext) -> Adjustment | None:
        ctx.state.delete(_CONTAINER + _container(ctx).id)
        return None

    async def post_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        prefix, pod_id = _CONTAINER, ctx.pod.id
        gone = [k for k, v in ctx.state.items() if k.startswith(prefix) and v["pod"] == pod_id]
        for key in gone:
            ctx.state.delete(key)
        return None


def _sticky(hook: OomHook, pod: PodView) -> bool:
    return _chosen(hook, pod) is not None


def _chosen(hook: OomHook, pod: PodView) -> int | None:
    try:
        return chosen_score(hook.config, pod)
    except InvalidRequest:
        return None


def _write_scores(host: Host, cgroup_parent: str, container_id: str, score: int) -> int:
    pids = host.container_pids(cgroup_parent, container_id)
    for pid in pids:
        host.write_oom_score_adj(pid, score)
    return len(pids)


def _container(ctx: HookContext) -> ContainerView:
    assert ctx.container is not None, "container stages always carry the container"
    return ctx.container
