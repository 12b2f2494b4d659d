"""kubelet's oom_score_adj rule (kubelet's own test vectors), the annotation override and the
per-namespace ranges that bound it."""

from __future__ import annotations

from typing import Any

import pytest

from crihook.hooks.oom import (
    SCORE_ADJ_ANNOTATION,
    ScoreRange,
    ScoreRanges,
    kubelet_oom_score_adj,
    parse_score_override,
    parse_score_range,
    parse_score_ranges,
)
from crihook.hooks.spec import QoSClass

G = QoSClass.GUARANTEED
B = QoSClass.BURSTABLE
BE = QoSClass.BEST_EFFORT

STANDARD = 8_000_000_000  # kubelet's standardMemoryAmount
MI = 1 << 20
GB = 10**9
GI = 1 << 30
TI = 1 << 40

# One row per container of each pod in kubelet's TestGetContainerOOMScoreAdjust (and the
# feature-gate-off column of TestGetContainerOOMScoreAdjustTieBreak), pkg/kubelet/qos/
# policy_test.go. kubelet asserts low <= adj <= high; the rows keep its bounds. The QoS class,
# the container's request, the pod-level share and the regular containers' requests (for a
# sidecar) are what kubelet derives from the pod spec in those tests.
#   (qos, request, capacity, node_critical, pod_share, regular_requests, low, high)
KUBELET_CASES: list[tuple[str, tuple[Any, ...]]] = [
    ("cpu-limit", (B, 0, 4_000_000_000, False, 0, None, 999, 999)),
    ("memory-limit-cpu-request", (B, 0, 8_000_000_000, False, 0, None, 999, 999)),
    ("zero-memory-limit", (BE, 0, 7_230_457_451, False, 0, None, 1000, 1000)),
    ("no-request-limit", (BE, 0, 4_000_000_000, False, 0, None, 1000, 1000)),
    ("equal-request-limit-cpu-memory", (G, 10**10, 123_456_789, False, 0, None, -997, -997)),
    (
        "cpu-unlimited-memory-limited-with-requests",
        (B, STANDARD // 2, STANDARD, False, 0, None, 495, 505),
    ),
    ("request-no-limit", (B, STANDARD - 1, STANDARD, False, 0, None, 3, 3)),
    ("cluster-critical", (BE, 0, 4_000_000_000, False, 0, None, 1000, 1000)),
    ("node-critical", (BE, 0, 4_000_000_000, True, 0, None, -997, -997)),
    ("burstable-unique-container", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 880)),
    # burstable-mixed-unique-main-container-pod: an init container and a main container.
    ("mixed-unique-main/init-container", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 880)),
    ("mixed-unique-main/main-1", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 880)),
    # burstable-mixed-multi-container-small-sidecar-pod: the sidecar asks 1/20 of the node.
    ("small-sidecar/init-container", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 880)),
    (
        "small-sidecar/sidecar-small-container",
        (B, STANDARD // 20, STANDARD, False, 0, [STANDARD // 8], 875, 875),
    ),
    ("small-sidecar/main-1", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 875)),
    # burstable-mixed-multi-container-sample-request-pod: sidecar asks what main asks.
    ("same-request/init-container", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 880)),
    (
        "same-request/sidecar-container",
        (B, STANDARD // 8, STANDARD, False, 0, [STANDARD // 8], 875, 875),
    ),
    ("same-request/main-1", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 875)),
    # burstable-mixed-multi-container-big-sidecar-container-pod: the sidecar asks half.
    ("big-sidecar/init-container", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 880)),
    (
        "big-sidecar/sidecar-big-container",
        (B, STANDARD // 2, STANDARD, False, 0, [STANDARD // 8], 500, 500),
    ),
    ("big-sidecar/main-1", (B, STANDARD // 8, STANDARD, False, 0, None, 875, 875)),
    # Pod-level resources (KEP-2837), capacity 4e9, pod request 2e9 (sampleDefaultPodMemRequest).
    ("guaranteed-pod-no-container-resources", (G, 0, 4_000_000_000, False, 0, None, -997, -997)),
    ("guaranteed-pod-equal-container", (G, 10**9, 4_000_000_000, False, 0, None, -997, -997)),
    ("guaranteed-pod-unequal/burstable", (G, 10**9, 4_000_000_000, False, 0, None, -997, -997)),
    ("guaranteed-pod-unequal/best-effort", (G, 0, 4_000_000_000, False, 0, None, -997, -997)),
    # 2e9 unclaimed over 2 containers: 1e9 each.
    ("burstable-pod-no-container-resources", (B, 0, 4_000_000_000, False, 10**9, None, 750, 750)),
    # 1e9 + 1e9 claimed: nothing left to share.
    ("burstable-pod-equal-container", (B, 10**9, 4_000_000_000, False, 0, None, 750, 750)),
    # 1e9 claimed, 1e9 unclaimed over 2 containers: 5e8 each.
    (
        "burstable-pod-unequal/burstable",
        (B, 10**9, 4_000_000_000, False, 5 * 10**8, None, 625, 625),
    ),
    ("burstable-pod-unequal/best-effort", (B, 0, 4_000_000_000, False, 5 * 10**8, None, 875, 875)),
    # One regular and one sidecar without requests: 1e9 each.
    ("burstable-pod-sidecar/regular", (B, 0, 4_000_000_000, False, 10**9, None, 750, 750)),
    ("burstable-pod-sidecar/sidecar", (B, 0, 4_000_000_000, False, 10**9, [0], 750, 750)),
    ("burstable-pod-equal-sidecar/regular", (B, 10**9, 4_000_000_000, False, 0, None, 750, 750)),
    (
        "burstable-pod-equal-sidecar/sidecar",
        (B, 10**9, 4_000_000_000, False, 0, [10**9], 750, 750),
    ),
    # 1e9 + 5e8 + 2e8 (sidecar) claimed, 3e8 unclaimed over 3 containers: 1e8 each.
    (
        "burstable-pod-unequal-sidecar/container-1",
        (B, 10**9, 4_000_000_000, False, 10**8, None, 725, 725),
    ),
    (
        "burstable-pod-unequal-sidecar/container-2",
        (B, 5 * 10**8, 4_000_000_000, False, 10**8, None, 850, 850),
    ),
    (
        "burstable-pod-unequal-sidecar/sidecar",
        (B, 2 * 10**8, 4_000_000_000, False, 10**8, [10**9, 5 * 10**8], 850, 850),
    ),
    # DRA node-allocatable memory (alpha): the caller adds the claim's share to the request.
    ("dra-disabled", (B, 500 * MI, 4_000_000_000, False, 0, None, 869, 869)),
    ("dra-per-container-overhead", (B, 1000 * MI, 4_000_000_000, False, 0, None, 738, 738)),
    ("dra-shared-claim", (B, 500 * MI + 500 * MI, 4_000_000_000, False, 0, None, 738, 738)),
    ("dra-and-pod-level", (B, 3 * GI, 8_000_000_000, False, 2 * GI, None, 329, 329)),
    ("dra-shared-and-pod-level", (B, 2 * GI, 8_000_000_000, False, GI, None, 598, 598)),
    ("dra-direct-device", (B, 1000 * MI, 4_000_000_000, False, 0, None, 738, 738)),
    ("dra-direct-and-overhead", (B, 1500 * MI, 4_000_000_000, False, 0, None, 607, 607)),
    ("dra-sidecar/c1", (B, 1000 * MI, 4_000_000_000, False, 0, None, 738, 738)),
    ("dra-sidecar/s1", (B, 200 * MI, 4_000_000_000, False, 0, [1000 * MI], 738, 738)),
    # TestGetContainerOOMScoreAdjustTieBreak, gate off (the released rule) on big nodes.
    ("16Gi-node-500Mi", (B, 500 * MI, 16 * GI, False, 0, None, 970, 970)),
    ("1Ti-node-50Mi", (B, 50 * MI, TI, False, 0, None, 999, 999)),
    ("1Ti-node-500Mi", (B, 500 * MI, TI, False, 0, None, 999, 999)),
    ("1Ti-node-4Gi", (B, 4 * GI, TI, False, 0, None, 997, 997)),
    ("1Ti-node-16Gi", (B, 16 * GI, TI, False, 0, None, 985, 985)),
    ("1Ti-node-shared-claim", (B, 750 * MI, TI, False, 0, None, 999, 999)),
    ("4Ti-node-500Mi", (B, 500 * MI, 4 * TI, False, 0, None, 999, 999)),
    ("4Ti-node-64Gi", (B, 64 * GI, 4 * TI, False, 0, None, 985, 985)),
    ("1Ti-node-sidecar", (B, 50 * MI, TI, False, 0, [50 * MI, 16 * GI], 999, 999)),
    ("1Ti-node-pod-level-share", (B, 0, TI, False, 2 * GI, None, 999, 999)),
]


@pytest.mark.parametrize("case", [c for _, c in KUBELET_CASES], ids=[n for n, _ in KUBELET_CASES])
def test_kubelet_vectors(case: tuple[Any, ...]) -> None:
    qos, request, capacity, critical, share, regulars, low, high = case
    adj = kubelet_oom_score_adj(
        qos,
        request,
        capacity,
        node_critical=critical,
        pod_share_bytes=share,
        regular_requests_bytes=regulars,
    )
    assert low <= adj <= high


@pytest.mark.parametrize(
    ("qos", "request_bytes", "capacity", "regulars", "expected"),
    [
        (B, 0, 10 * GB, None, 999),  # 1000 is BestEffort's: one below
        (B, 10 * GB, 10 * GB, None, 3),  # 0 clamps to 3
        (B, 20 * GB, 10 * GB, None, 3),  # more than the node: still 3
        (B, GB, 10 * GB, None, 900),
        (B, GI, 10 * GB, None, 893),  # 1000 - 107.37..., truncated
        (B, GI, 10 * GB, [2 * GI, 4 * GI], 786),  # capped by the smallest regular (2Gi)
        (B, 4 * GI, 10 * GB, [2 * GI], 571),  # a sidecar asking more keeps its own
        (B, GI, 10 * GB, [0], 893),  # a regular without request would score 1000: no cap
        (G, 0, 1, None, -997),
        (BE, 5 * GB, 10 * GB, None, 1000),
    ],
    ids=[
        "no-request",
        "whole-node",
        "over-node",
        "a-tenth",
        "truncates",
        "sidecar-capped",
        "sidecar-bigger",
        "sidecar-regular-no-request",
        "guaranteed",
        "besteffort-ignores-request",
    ],
)
def test_exact_values(
    qos: QoSClass, request_bytes: int, capacity: int, regulars: list[int] | None, expected: int
) -> None:
    adj = kubelet_oom_score_adj(qos, request_bytes, capacity, regular_requests_bytes=regulars)
    assert adj == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"qos": QoSClass.UNKNOWN}, "the pod's QoS class is unknown"),
        ({"memory_capacity_bytes": 0}, "memory capacity must be positive, not 0"),
        ({"memory_request_bytes": -1}, "memory requests are not negative"),
        ({"pod_share_bytes": -1}, "memory requests are not negative"),
        ({"regular_requests_bytes": []}, "a sidecar's pod has at least one regular container"),
    ],
    ids=["unknown-qos", "zero-capacity", "negative-request", "negative-share", "no-regulars"],
)
def test_kubelet_oom_score_adj_refuses(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "qos": B,
        "memory_request_bytes": GI,
        "memory_capacity_bytes": 8 * GI,
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        kubelet_oom_score_adj(
            args.pop("qos"),
            args.pop("memory_request_bytes"),
            args.pop("memory_capacity_bytes"),
            **args,
        )


# --- the annotation override ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", 0), ("500", 500), ("-1000", -1000), ("1000", 1000), ("+5", 5), ("-0", 0), ("007", 7)],
    ids=["zero", "positive", "min", "max", "plus-sign", "minus-zero", "leading-zeros"],
)
def test_parse_score_override(value: str, expected: int) -> None:
    assert parse_score_override(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "is not an integer"),
        (" 5", "is not an integer"),
        ("5\n", "is not an integer"),
        ("5.0", "is not an integer"),
        ("1e3", "is not an integer"),
        ("0x10", "is not an integer"),
        ("1_000", "is not an integer"),
        ("\u0665", "is not an integer"),  # ARABIC-INDIC FIVE: int() would take it
        ("high", "is not an integer"),
        ("1001", "is not in -1000..1000"),
        ("-1001", "is not in -1000..1000"),
        ("99999999999999999999", "is not in -1000..1000"),
    ],
    ids=[
        "empty",
        "leading-space",
        "trailing-newline",
        "decimal",
        "exponent",
        "hex",
        "underscore",
        "non-ascii-digit",
        "word",
        "above",
        "below",
        "huge",
    ],
)
def test_parse_score_override_rejects(value: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_score_override(value)
    assert str(info.value) == f"annotation {SCORE_ADJ_ANNOTATION}: {value!r} {reason}"


def test_annotation_name() -> None:
    assert SCORE_ADJ_ANNOTATION == "oom.crihook.io/score-adj"


# --- ranges ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "score", "inside"),
    [
        (100, 900, 100, True),
        (100, 900, 900, True),
        (100, 900, 500, True),
        (100, 900, 99, False),
        (100, 900, 901, False),
        (-1000, 1000, -1000, True),
        (0, 0, 0, True),
        (0, 0, 1, False),
    ],
    ids=["low-edge", "high-edge", "middle", "below", "above", "full", "point", "off-point"],
)
def test_score_range_contains(low: int, high: int, score: int, inside: bool) -> None:
    assert ScoreRange(low, high).contains(score) is inside


@pytest.mark.parametrize(
    ("low", "high"),
    [(900, 100), (-1001, 0), (0, 1001)],
    ids=["inverted", "below-min", "above-max"],
)
def test_score_range_refuses(low: int, high: int) -> None:
    with pytest.raises(ValueError, match=f"score range {low}..{high} must satisfy"):
        ScoreRange(low, high)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100..900", ScoreRange(100, 900)),
        ("-1000..1000", ScoreRange(-1000, 1000)),
        ("-500..-100", ScoreRange(-500, -100)),
        ("0..0", ScoreRange(0, 0)),
        (" 0..1000 ", ScoreRange(0, 1000)),
    ],
    ids=["plain", "full", "negative", "point", "padded"],
)
def test_parse_score_range(text: str, expected: ScoreRange) -> None:
    assert parse_score_range(text) == expected
    assert str(expected) == text.strip()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100-900", "malformed score range '100-900' (expected LOW..HIGH, e.g. 0..1000)"),
        ("100...900", "malformed score range '100...900' (expected LOW..HIGH, e.g. 0..1000)"),
        ("..900", "malformed score range '..900' (expected LOW..HIGH, e.g. 0..1000)"),
        ("", "malformed score range '' (expected LOW..HIGH, e.g. 0..1000)"),
        (
            "900..100",
            "bad score range '900..100': score range 900..100 must satisfy "
            "-1000 <= low <= high <= 1000",
        ),
        (
            "0..2000",
            "bad score range '0..2000': score range 0..2000 must satisfy "
            "-1000 <= low <= high <= 1000",
        ),
    ],
    ids=["dash", "three-dots", "no-low", "empty", "inverted", "too-high"],
)
def test_parse_score_range_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_score_range(text)
    assert str(info.value) == message


EXAMPLE = {"default": "100..900", "batch": "500..1000", "*": "0..1000"}


@pytest.mark.parametrize(
    ("table", "namespace", "score", "allowed", "range_"),
    [
        (EXAMPLE, "default", 100, True, ScoreRange(100, 900)),
        (EXAMPLE, "default", 950, False, ScoreRange(100, 900)),
        (EXAMPLE, "batch", 1000, True, ScoreRange(500, 1000)),
        (EXAMPLE, "batch", 499, False, ScoreRange(500, 1000)),
        (EXAMPLE, "kube-system", 950, True, ScoreRange(0, 1000)),
        (EXAMPLE, "kube-system", -1, False, ScoreRange(0, 1000)),
        ({"default": "100..900"}, "default", 500, True, ScoreRange(100, 900)),
        ({"default": "100..900"}, "other", 500, False, None),
        ({}, "default", 0, False, None),
        ({"*": "-1000..1000"}, "anything", -1000, True, ScoreRange(-1000, 1000)),
    ],
    ids=[
        "named-low-edge",
        "named-outside",
        "batch-top",
        "batch-below",
        "fallback-inside",
        "fallback-outside",
        "no-fallback-named",
        "no-fallback-other",
        "empty-config",
        "fallback-only",
    ],
)
def test_score_ranges(
    table: dict[str, object],
    namespace: str,
    score: int,
    allowed: bool,
    range_: ScoreRange | None,
) -> None:
    ranges = parse_score_ranges(table)
    assert ranges.range_for(namespace) == range_
    assert ranges.allows(namespace, score) is allowed


def test_score_ranges_parsed_fields() -> None:
    ranges = parse_score_ranges(EXAMPLE)
    assert dict(ranges.by_namespace) == {
        "batch": ScoreRange(500, 1000),
        "default": ScoreRange(100, 900),
    }
    assert ranges.fallback == ScoreRange(0, 1000)
    assert ScoreRanges().range_for("default") is None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"Default": "0..1"}, "score ranges: key 'Default' is not a namespace name or '*'"),
        ({"a_b": "0..1"}, "score ranges: key 'a_b' is not a namespace name or '*'"),
        ({"": "0..1"}, "score ranges: key '' is not a namespace name or '*'"),
        ({"-a": "0..1"}, "score ranges: key '-a' is not a namespace name or '*'"),
        ({"a" * 64: "0..1"}, f"score ranges: key '{'a' * 64}' is not a namespace name or '*'"),
        ({"**": "0..1"}, "score ranges: key '**' is not a namespace name or '*'"),
        ({5: "0..1"}, "score ranges: key 5 is not a namespace name or '*'"),
        (
            {"batch": 500},
            "score ranges: key 'batch': value must be a string like '0..1000', not 500",
        ),
        (
            {"ok": "0..1", "batch": "500-1000"},
            "score ranges: key 'batch': malformed score range '500-1000' "
            "(expected LOW..HIGH, e.g. 0..1000)",
        ),
        (
            {"*": "1000..0"},
            "score ranges: key '*': bad score range '1000..0': score range 1000..0 must "
            "satisfy -1000 <= low <= high <= 1000",
        ),
    ],
    ids=[
        "uppercase",
        "underscore",
        "empty",
        "leading-dash",
        "too-long",
        "double-star",
        "not-a-string",
        "value-not-string",
        "malformed-value",
        "inverted-fallback",
    ],
)
def test_parse_score_ranges_rejects(table: dict[Any, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_score_ranges(table)
    assert str(info.value) == message
