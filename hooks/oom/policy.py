"""OOM score rules: kubelet's own ``oom_score_adj`` for a container, and the per-pod override
(annotation ``oom.crihook.io/score-adj``) with the per-namespace ranges that bound it.

:func:`kubelet_oom_score_adj` follows ``GetContainerOOMScoreAdjust`` in kubelet's
``pkg/kubelet/qos/policy.go`` as released in Kubernetes v1.33-v1.35, read for this port:

- node-critical pods (priority ≥ system-node-critical) and Guaranteed pods: -997;
- BestEffort: 1000;
- Burstable: ``1000 - 1000 * request / capacity`` (integer division, bytes), where request is
  the container's memory request plus its share of a pod-level memory request that no
  container claims (KEP-2837 pod-level resources, when the pod sets them);
- a sidecar (a restartable init container, KEP-753) is never more protected than the least
  protected regular container: its value is capped at the value of the regular container with
  the smallest request (kubernetes/kubernetes#128029; before it sidecars got the plain
  formula);
- then clamped to 3..999: above Guaranteed (1000 + -997) and below BestEffort.

Not reproduced: the DRA node-allocatable memory share (alpha) is the caller's to add into the
request, and the ``KubeletOOMScoreAdjTieBreak`` nudge seen in newer sources (alpha, off by
default) is left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from crihook.hooks.spec import QoSClass

__all__ = [
    "BESTEFFORT_OOM_SCORE_ADJ",
    "GUARANTEED_OOM_SCORE_ADJ",
    "SCORE_ADJ_ANNOTATION",
    "ScoreClamp",
    "ScoreRange",
    "ScoreRanges",
    "kubelet_oom_score_adj",
    "parse_score_override",
    "parse_score_range",
    "parse_score_ranges",
]

GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000
# Burstable bounds: strictly above Guaranteed's worst case and below BestEffort.
_BURSTABLE_MIN = 1000 + GUARANTEED_OOM_SCORE_ADJ
_BURSTABLE_MAX = BESTEFFORT_OOM_SCORE_ADJ - 1

SCORE_ADJ_ANNOTATION = "oom.crihook.io/score-adj"

_SCORE = re.compile(r"[+-]?[0-9]+")
_RANGE = re.compile(r"([+-]?[0-9]+)\.\.([+-]?[0-9]+)")
# A namespace name (DNS-1123 label), or "*" for every namespace without its own range.
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_FALLBACK = "*"


def kubelet_oom_score_adj(
    qos: QoSClass,
    memory_request_bytes: int,
    memory_capacity_bytes: int,
    *,
    node_critical: bool = False,
    pod_share_bytes: int = 0,
    regular_requests_bytes: Sequence[int] | None = None,
) -> int:
    """The oom_score_adj kubelet gives a container (see the module docstring for the rule).

    ``memory_request_bytes``: the container's memory request (0 when unset).
    ``memory_capacity_bytes``: the node's memory capacity (cadvisor's MemoryCapacity).
    ``pod_share_bytes``: with a pod-level memory request, the part no container claims
    divided by the pod's number of containers (init and regular); 0 otherwise.
    ``regular_requests_bytes``: for a sidecar (restartable init container) only, the memory
    requests of the pod's regular containers; None for every other container.
    """
    if qos is QoSClass.UNKNOWN:
        raise ValueError("kubelet_oom_score_adj: the pod's QoS class is unknown")
    if node_critical or qos is QoSClass.GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos is QoSClass.BEST_EFFORT:
        return BESTEFFORT_OOM_SCORE_ADJ
    if memory_capacity_bytes <= 0:
        raise ValueError(f"memory capacity must be positive, not {memory_capacity_bytes}")
    if memory_request_bytes < 0 or pod_share_bytes < 0:
        raise ValueError("memory requests are not negative")

    score = _linear(memory_request_bytes + pod_share_bytes, memory_capacity_bytes)
    if regular_requests_bytes is not None:
        if not regular_requests_bytes:
            raise ValueError("a sidecar's pod has at least one regular container")
        smallest = min(regular_requests_bytes) + pod_share_bytes
        score = min(score, _linear(smallest, memory_capacity_bytes))
    return max(_BURSTABLE_MIN, min(score, _BURSTABLE_MAX))


def _linear(request: int, capacity: int) -> int:
    # Operands are non-negative, so floor division is Go's truncating int64 division.
    return 1000 - (1000 * request) // capacity


def parse_score_override(value: str) -> int:
    """The oom_score_adj asked for by the pod annotation ``oom.crihook.io/score-adj``.

    An integer in -1000..1000 (ASCII digits, optional sign, nothing around it); anything else
    raises ValueError naming the annotation and the value.
    """
    if _SCORE.fullmatch(value) is None:
        raise ValueError(f"annotation {SCORE_ADJ_ANNOTATION}: {value!r} is not an integer")
    score = int(value)
    if not -1000 <= score <= 1000:
        raise ValueError(f"annotation {SCORE_ADJ_ANNOTATION}: {value!r} is not in -1000..1000")
    return score


@dataclass(frozen=True, slots=True)
class ScoreRange:
    """An inclusive range of oom_score_adj values, within -1000..1000."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not -1000 <= self.low <= self.high <= 1000:
            raise ValueError(
                f"score range {self.low}..{self.high} must satisfy -1000 <= low <= high <= 1000"
            )

    def contains(self, score: int) -> bool:
        return self.low <= score <= self.high

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"


def parse_score_range(text: str) -> ScoreRange:
    """``"100..900"`` → ScoreRange(100, 900); ValueError naming the text otherwise."""
    m = _RANGE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"malformed score range {text!r} (expected LOW..HIGH, e.g. 0..1000)")
    try:
        return ScoreRange(int(m[1]), int(m[2]))
    except ValueError as exc:
        raise ValueError(f"bad score range {text!r}: {exc}") from None


@dataclass(frozen=True)
class ScoreRanges:
    """Which overrides each namespace may ask for. No range (and no fallback): none."""

    by_namespace: Mapping[str, ScoreRange] = field(default_factory=lambda: MappingProxyType({}))
    fallback: ScoreRange | None = None
    """The ``"*"`` entry: the range of every namespace not named."""

    def range_for(self, namespace: str) -> ScoreRange | None:
        return self.by_namespace.get(namespace, self.fallback)

    def allows(self, namespace: str, score: int) -> bool:
        allowed = self.range_for(namespace)
        return allowed is not None and allowed.contains(score)


def parse_score_ranges(table: Mapping[str, object]) -> ScoreRanges:
    """Per-namespace ranges from config, e.g. ``{"default" = "100..900", "*" = "0..1000"}``.

    Keys are namespace names or ``"*"``; values ``"LOW..HIGH"`` strings. A ValueError names
    the bad key.
    """
    by_namespace: dict[str, ScoreRange] = {}
    fallback = None
    for key, value in table.items():
        if not isinstance(key, str) or (key != _FALLBACK and _NAMESPACE.fullmatch(key) is None):
            raise ValueError(f"score ranges: key {key!r} is not a namespace name or '*'")
        if not isinstance(value, str):
            raise ValueError(
                f"score ranges: key {key!r}: value must be a string like '0..1000', not {value!r}"
            )
        try:
            parsed = parse_score_range(value)
        except ValueError as exc:
            raise ValueError(f"score ranges: key {key!r}: {exc}") from None
        if key == _FALLBACK:
            fallback = parsed
        else:
            by_namespace[key] = parsed
    return ScoreRanges(MappingProxyType(dict(sorted(by_namespace.items()))), fallback)


@dataclass
class ScoreClamp:
    """What the runtime makes of the score a container is created with, as far as its answers
    have told. containerd with ``restrict_oom_score_adj`` (set where it lacks
    CAP_SYS_RESOURCE) raises a score below its own oom_score_adj to its own: a floor, the
    same for every container; without it every score is applied as asked. One answer with a
    raised score gives the floor; one as asked says there is none above that score."""

    floor: int | None = None
    """The runtime raised a score to this one: every score below it becomes it."""
    as_asked_from: int = BESTEFFORT_OOM_SCORE_ADJ + 1
    """Every score from this one up is applied as asked."""
    silent: bool = False
    """The runtime does not say what it applied: scores are taken as asked."""

    def applied(self, asked: int) -> int | None:
        """The score a container asking for `asked` gets; None while that is not known."""
        if self.floor is not None:
            return max(asked, self.floor)
        if self.silent or asked >= self.as_asked_from:
            return asked
        return None

    def learn(self, asked: int, applied: int | None) -> None:
        """The runtime gave a container created with `asked` the score `applied` (None: it
        does not say)."""
        if applied is None:
            self.silent = True
        elif applied > asked:
            self.floor = applied
        elif applied == asked:
            self.as_asked_from = min(self.as_asked_from, asked)
