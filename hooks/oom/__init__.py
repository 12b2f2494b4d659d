"""The built-in `oom` hook (``OomHook``) and its pure rules: kubelet's oom_score_adj and the
per-pod override policy."""

from crihook.hooks.oom.hook import OomHook
from crihook.hooks.oom.policy import (
    BESTEFFORT_OOM_SCORE_ADJ,
    GUARANTEED_OOM_SCORE_ADJ,
    SCORE_ADJ_ANNOTATION,
    ScoreClamp,
    ScoreRange,
    ScoreRanges,
    kubelet_oom_score_adj,
    parse_score_override,
    parse_score_range,
    parse_score_ranges,
)

__all__ = [
    "BESTEFFORT_OOM_SCORE_ADJ",
    "GUARANTEED_OOM_SCORE_ADJ",
    "SCORE_ADJ_ANNOTATION",
    "OomHook",
    "ScoreClamp",
    "ScoreRange",
    "ScoreRanges",
    "kubelet_oom_score_adj",
    "parse_score_override",
    "parse_score_range",
    "parse_score_ranges",
]
