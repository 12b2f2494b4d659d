"""The built-in `oom` hook: kubelet's oom_score_adj by default, with policies beyond it.

    [hooks.oom]
    override_ranges = { "batch" = "500..1000", "*" = "0..1000" }
    qos_scores = { BestEffort = 1000 }

- By default kubelet's value (which kubelet computes and sends) is kept.
- `qos_scores` sets a fixed score per QoS class instead of kubelet's.
- A pod annotation `oom.crihook.io/score-adj` overrides both, but only inside the range
  configured for the pod's namespace (`"*"`: every other namespace); outside it, or when it is
  not an integer, CreateContainer fails with INVALID_ARGUMENT naming the annotation.
- The score crihook set is sticky: kubelet's UpdateContainerResources carries it again. And
  since containerd ignores oom_score_adj in UpdateContainerResources, a new score for a
  running container (kubelet's, after a resize) is written to `/proc/<pid>/oom_score_adj` of
  every process of the container, through the Host seam.
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
    SyncContext,
)

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
    unknown = sorted(set(options) - _KEYS)
    if unknown:
        raise ValueError(f"oom: unknown option(s) {', '.join(unknown)}")
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

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        self._host = sync.host
        live = {c.id: c for c in sync.containers}
        for key, _ in sync.state.items():
            if key.startswith(_CONTAINER) and key[len(_CONTAINER) :] not in live:
                sync.state.delete(key)
        # Containers this hook did not see created (crihook was put in front of a running
        # node): known from now on, with the score the runtime reports, so a later kubelet
        # update reaches their processes too.
        pods = {p.id: p for p in sync.pods}
        for cid, container in live.items():
            score = container.resources.oom_score_adj
            pod = pods.get(container.pod_id)
            if sync.state.get(_CONTAINER + cid) is None and score is not None and pod is not None:
                doc = {"pod": pod.id, "score": score, "sticky": _sticky(self, pod)}
                sync.state.set(_CONTAINER + cid, doc)
        return ()

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        score = chosen_score(self.config, ctx.pod)
        return None if score is None else Adjustment().set_oom_score_adj(score)

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        cid: str = ctx.response.container_id  # type: ignore[union-attr]
        score = ctx.peek_request().config.linux.resources.oom_score_adj  # type: ignore[attr-defined]
        sticky = _sticky(self, ctx.pod)
        ctx.state.set(_CONTAINER + cid, {"pod": ctx.pod.id, "score": score, "sticky": sticky})
        return None

    async def pre_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        kept = ctx.state.get(_CONTAINER + _container(ctx).id)
        if kept is None or not kept.get("sticky"):
            return None
        return Adjustment().set_oom_score_adj(int(kept["score"]))

    async def post_update_container_resources(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        key = _CONTAINER + container.id
        kept = ctx.state.get(key)
        if kept is None or self._host is None or not ctx.peek_request().HasField("linux"):
            return None  # without resources (only annotations, say) it asks for no score
        wanted = int(ctx.peek_request().linux.oom_score_adj)  # type: ignore[attr-defined]
        if int(kept["score"]) == wanted:
            return None
        # containerd ignores oom_score_adj on update: crihook writes it to the processes.
        written = await asyncio.to_thread(
            _write_scores, self._host, ctx.pod.cgroup_parent, container.id, wanted
        )
        log.info(
            "oom: container %s now has oom_score_adj %d (%d process(es))",
            container.name or container.id[:12],
            wanted,
            written,
        )
        ctx.state.set(key, {**kept, "score": wanted})
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
    try:
        return chosen_score(hook.config, pod) is not None
    except InvalidRequest:
        return False


def _write_scores(host: Host, cgroup_parent: str, container_id: str, score: int) -> int:
    pids = host.container_pids(cgroup_parent, container_id)
    for pid in pids:
        host.write_oom_score_adj(pid, score)
    return len(pids)


def _container(ctx: HookContext) -> ContainerView:
    assert ctx.container is not None, "container stages always carry the container"
    return ctx.container
