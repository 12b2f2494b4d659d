"""kubelet's topology manager merge (crihook.hooks.node.hints) against kubelet's own vectors.

Ported from kubernetes/kubernetes pkg/kubelet/cm/topologymanager: ``policy_test.go``
(commonPolicyMergeTestCases, the best-effort, no-policy, closest-NUMA and single-numa-node
merge cases, TestMaxOfMinAffinityCounts, TestCompareHintsNarrowest), ``policy_*_test.go``
(which machine each policy runs them on, CanAdmitPodResult, TestPolicySingleNumaNodeFilterHints,
TestPolicyNoneMerge), ``numa_info_test.go`` (TestClosest, TestCalculateAvgDistanceFor),
``bitmask_test.go`` (TestIsNarrowerThan), ``policy_options_test.go`` and
``topology_manager_test.go`` (max-allowable-numa-nodes). The last test checks the module's
merge against a literal port of kubelet's loop over every combination, on random inputs.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence

import pytest

from crihook.hooks.node.hints import (
    POLICIES,
    TopologyPolicy,
    _average_distance,
    _closest,
    _mask_of,
    _max_of_min_affinity_counts,
    _narrower,
    _single_numa_hints,
    merge_hints,
)
from crihook.hooks.spec.hints import ResourceHints, TopologyHint


def P(*nodes: int) -> TopologyHint:
    return TopologyHint(frozenset(nodes), True)


def N(*nodes: int) -> TopologyHint:
    return TopologyHint(frozenset(nodes), False)


ANY_P = TopologyHint(None, True)
ANY_N = TopologyHint(None, False)
ALL = "all"  # expected mask: the machine's NUMA nodes (kubelet's NewTestBitMask(numaNodes...))

Providers = list[dict[str, list[TopologyHint] | None]]
Expected = tuple[tuple[int, ...] | str | None, bool]

# kubelet's commonNUMAInfoTwoNodes / FourNodes / EightNodes (distances indexed by node id).
TWO_NODES = (0, 1)
FOUR_NODES = (0, 1, 2, 3)
EIGHT_NODES = (0, 1, 2, 3, 4, 5, 6, 7)
EIGHT_DISTANCES = {
    0: [10, 11, 12, 12, 30, 30, 30, 30],
    1: [11, 10, 12, 12, 30, 30, 30, 30],
    2: [12, 12, 10, 11, 30, 30, 30, 30],
    3: [12, 12, 11, 10, 30, 30, 30, 30],
    4: [30, 30, 30, 30, 10, 11, 12, 12],
    5: [30, 30, 30, 30, 11, 10, 12, 12],
    6: [30, 30, 30, 30, 12, 12, 10, 11],
    7: [30, 30, 30, 30, 12, 12, 13, 10],
}

WIDE_NP = [N(0, 1, 2, 3), N(0, 1)]  # resource1 of the bestNonPreferredAffinityCount cases

# commonPolicyMergeTestCases
COMMON: list[tuple[str, Providers, Expected]] = [
    (
        "two providers, 1 hint each, same mask, both preferred 1/2",
        [{"resource1": [P(0)]}, {"resource2": [P(0)]}],
        ((0,), True),
    ),
    (
        "two providers, 1 hint each, same mask, both preferred 2/2",
        [{"resource1": [P(1)]}, {"resource2": [P(1)]}],
        ((1,), True),
    ),
    (
        "two providers, 1 no hints, 1 single hint preferred 1/2",
        [{}, {"resource": [P(0)]}],
        ((0,), True),
    ),
    (
        "two providers, 1 no hints, 1 single hint preferred 2/2",
        [{}, {"resource": [P(1)]}],
        ((1,), True),
    ),
    (
        "two providers, 1 with 2 hints, 1 with single hint matching 1/2",
        [{"resource1": [P(0), P(1)]}, {"resource2": [P(0)]}],
        ((0,), True),
    ),
    (
        "two providers, 1 with 2 hints, 1 with single hint matching 2/2",
        [{"resource1": [P(0), P(1)]}, {"resource2": [P(1)]}],
        ((1,), True),
    ),
    (
        "two providers, both with 2 hints, matching narrower preferred hint from both",
        [{"resource1": [P(0), P(1)]}, {"resource2": [P(0), N(0, 1)]}],
        ((0,), True),
    ),
    (
        "less narrow preferred hints are chosen over narrower non-preferred hints",
        [{"resource1": [P(1), N(0, 1)]}, {"resource2": [P(0), P(1), N(0, 1)]}],
        ((1,), True),
    ),
    (
        "multiple resources, same provider",
        [{"resource1": [P(1), N(0, 1)], "resource2": [P(0), P(1), N(0, 1)]}],
        ((1,), True),
    ),
]

# bestEffortPolicy.mergeTestCases (restricted runs them too)
BEST_EFFORT: list[tuple[str, Providers, Expected]] = [
    (
        "two providers, 2 hints each, same mask (some with different bits), same preferred",
        [{"resource1": [P(0, 1), P(0, 2)]}, {"resource2": [P(0, 1), P(0, 2)]}],
        ((0, 1), True),
    ),
    ("topology hint not set", [], (ALL, True)),
    ("provider returns an empty map", [{}], (ALL, True)),
    ("provider returns a nil list for a resource", [{"resource": None}], (ALL, True)),
    ("provider returns an empty list for a resource", [{"resource": []}], (ALL, False)),
    ("single hint, preferred, nil affinity", [{"resource": [ANY_P]}], (ALL, True)),
    ("single hint, not preferred, nil affinity", [{"resource": [ANY_N]}], (ALL, False)),
    (
        "two providers, 1 hint each, no common mask",
        [{"resource1": [P(0)]}, {"resource2": [P(1)]}],
        (ALL, False),
    ),
    (
        "two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
        [{"resource1": [P(0)]}, {"resource2": [N(0)]}],
        ((0,), False),
    ),
    (
        "two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
        [{"resource1": [P(1)]}, {"resource2": [N(1)]}],
        ((1,), False),
    ),
    (
        "two providers, 1 hint each, 1 wider mask, both preferred 1/2",
        [{"resource1": [P(0)]}, {"resource2": [P(0, 1)]}],
        ((0,), False),
    ),
    (
        "two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
        [{"resource1": [P(0), P(1)]}, {"resource2": [N(0, 1)]}],
        ((0,), False),
    ),
    (
        "two providers, 1 hint each, 1 wider mask, both preferred 2/2",
        [{"resource1": [P(1)]}, {"resource2": [P(0, 1)]}],
        ((1,), False),
    ),
    (
        "bestNonPreferredAffinityCount (1)",
        [{"resource1": WIDE_NP}, {"resource2": [N(0, 1)]}],
        ((0, 1), False),
    ),
    (
        "bestNonPreferredAffinityCount (2)",
        [{"resource1": WIDE_NP}, {"resource2": [N(0, 3)]}],
        ((0, 3), False),
    ),
    (
        "bestNonPreferredAffinityCount (3)",
        [{"resource1": WIDE_NP}, {"resource2": [N(1, 2)]}],
        ((1, 2), False),
    ),
    (
        "bestNonPreferredAffinityCount (4)",
        [{"resource1": WIDE_NP}, {"resource2": [N(2, 3)]}],
        ((2, 3), False),
    ),
]

BNPAC_5: Providers = [{"resource1": WIDE_NP}, {"resource2": [N(1, 2), N(2, 3)]}]
BNPAC_6: Providers = [
    {"resource1": WIDE_NP},
    {"resource2": [N(1, 2, 3), N(1, 2), N(1, 3), N(2, 3)]},
]

# bestEffortPolicy.mergeTestCasesNoPolicies (without prefer-closest-numa-nodes)
NO_POLICIES: list[tuple[str, Providers, Expected]] = [
    ("bestNonPreferredAffinityCount (5)", BNPAC_5, ((1, 2), False)),
    ("bestNonPreferredAffinityCount (6)", BNPAC_6, ((1, 2), False)),
]

# bestEffortPolicy.mergeTestCasesClosestNUMA (with prefer-closest-numa-nodes, eight nodes)
CLOSEST: list[tuple[str, Providers, Expected]] = [
    (
        "two providers, 2 hints each, same mask (some with different bits), same preferred",
        [{"resource1": [P(0, 4), P(0, 2)]}, {"resource2": [P(0, 4), P(0, 2)]}],
        ((0, 2), True),
    ),
    (
        "two providers, 2 hints each, different mask",
        [{"resource1": [P(4), P(0, 2)]}, {"resource2": [P(4), P(0, 2)]}],
        ((4,), True),
    ),
    ("bestNonPreferredAffinityCount (5)", BNPAC_5, ((2, 3), False)),
    ("bestNonPreferredAffinityCount (6)", BNPAC_6, ((2, 3), False)),
]

# singleNumaNodePolicy.mergeTestCases
SINGLE: list[tuple[str, Providers, Expected]] = [
    ("topology hint not set", [], (None, True)),
    ("provider returns an empty map", [{}], (None, True)),
    ("provider returns a nil list for a resource", [{"resource": None}], (None, True)),
    ("provider returns an empty list for a resource", [{"resource": []}], (None, False)),
    ("single hint, preferred, nil affinity", [{"resource": [ANY_P]}], (None, True)),
    ("single hint, not preferred, nil affinity", [{"resource": [ANY_N]}], (None, False)),
    (
        "two providers, 1 hint each, no common mask",
        [{"resource1": [P(0)]}, {"resource2": [P(1)]}],
        (None, False),
    ),
    (
        "two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
        [{"resource1": [P(0)]}, {"resource2": [N(0)]}],
        (None, False),
    ),
    (
        "two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
        [{"resource1": [P(1)]}, {"resource2": [N(1)]}],
        (None, False),
    ),
    (
        "two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
        [{"resource1": [P(0), P(1)]}, {"resource2": [N(0, 1)]}],
        (None, False),
    ),
    (
        "single NUMA hint generation",
        [{"resource1": [P(0, 1)], "resource2": [P(0), P(1), N(0, 1)]}],
        (None, False),
    ),
    (
        "one no-preference provider",
        [{"resource1": [P(0), P(1), N(0, 1)]}, {}],
        ((0,), True),
    ),
]


def cases(
    *groups: tuple[str, list[tuple[str, Providers, Expected]]],
) -> list[pytest.ParameterSet]:
    return [
        pytest.param(providers, expected, id=f"{prefix}: {name}")
        for prefix, group in groups
        for name, providers, expected in group
    ]


def expected_hint(expected: Expected, machine: Sequence[int]) -> TopologyHint:
    nodes, preferred = expected
    if nodes == ALL:
        return TopologyHint(frozenset(machine), preferred)
    assert not isinstance(nodes, str)
    return TopologyHint(None if nodes is None else frozenset(nodes), preferred)


BEST_EFFORT_CASES = cases(
    ("common", COMMON), ("best-effort", BEST_EFFORT), ("no-policies", NO_POLICIES)
)
CLOSEST_CASES = cases(("common", COMMON), ("best-effort", BEST_EFFORT), ("closest", CLOSEST))
SINGLE_CASES = cases(("common", COMMON), ("single-numa-node", SINGLE))


# --- TestPolicyBestEffortMerge / TestPolicyRestrictedMerge (four nodes) ----------------------
@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
@pytest.mark.parametrize(("providers", "expected"), BEST_EFFORT_CASES)
def test_merge_four_nodes(policy: str, providers: Providers, expected: Expected) -> None:
    hint, admit = merge_hints(policy, FOUR_NODES, providers)
    assert hint == expected_hint(expected, FOUR_NODES)
    assert admit is (True if policy == "best-effort" else hint.preferred)


# --- TestPolicy{BestEffort,Restricted}MergeClosestNUMA (eight nodes) --------------------------
@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
@pytest.mark.parametrize(("providers", "expected"), CLOSEST_CASES)
def test_merge_closest_numa(policy: str, providers: Providers, expected: Expected) -> None:
    hint, admit = merge_hints(
        policy, EIGHT_NODES, providers, prefer_closest_numa=True, distances=EIGHT_DISTANCES
    )
    assert hint == expected_hint(expected, EIGHT_NODES)
    assert admit is (True if policy == "best-effort" else hint.preferred)


# --- TestPolicySingleNumaNodeMerge (kubelet's machine has two nodes; four give the same) ------
@pytest.mark.parametrize("machine", [TWO_NODES, FOUR_NODES], ids=["two-nodes", "four-nodes"])
@pytest.mark.parametrize(("providers", "expected"), SINGLE_CASES)
def test_merge_single_numa_node(
    machine: tuple[int, ...], providers: Providers, expected: Expected
) -> None:
    hint, admit = merge_hints("single-numa-node", machine, providers)
    assert hint == expected_hint(expected, machine)
    assert admit is hint.preferred


def test_single_numa_node_ignores_prefer_closest() -> None:
    """kubelet only uses Closest when the policy is not single-numa-node (no distances needed)."""
    policy = TopologyPolicy("single-numa-node", TWO_NODES, prefer_closest_numa=True)
    assert policy.merge([{"r": [P(0), P(1)]}]) == (P(0), True)


def test_single_numa_node_on_a_one_node_machine_answers_any_node() -> None:
    """The best hint equals the machine's mask, which single-numa-node turns into nil."""
    assert merge_hints("single-numa-node", (0,), [{"r": [P(0)]}]) == (ANY_P, True)


# --- TestPolicyNoneMerge ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "providers",
    [
        pytest.param([], id="merged empty providers hints"),
        pytest.param([{"resource": [P(0, 1)]}], id="single provider, single preferred hint"),
        pytest.param([{"resource": [N(0, 1)]}], id="single provider, single non-preferred hint"),
    ],
)
def test_none_merge(providers: Providers) -> None:
    assert merge_hints("none", TWO_NODES, providers) == (ANY_N, True)


# --- Test*CanAdmitPodResult: admit from the best hint's preference ---------------------------
@pytest.mark.parametrize(
    ("policy", "providers", "admit"),
    [
        pytest.param("best-effort", [{"r": [ANY_N]}], True, id="best-effort, not preferred"),
        pytest.param("best-effort", [{"r": [ANY_P]}], True, id="best-effort, preferred"),
        pytest.param("restricted", [{"r": [ANY_N]}], False, id="restricted, not preferred"),
        pytest.param("restricted", [{"r": [ANY_P]}], True, id="restricted, preferred"),
        pytest.param(
            "single-numa-node", [{"r": [ANY_N]}], False, id="single-numa-node, not preferred"
        ),
        pytest.param("none", [{"r": [ANY_N]}], True, id="none, not preferred"),
        pytest.param("none", [{"r": [ANY_P]}], True, id="none, preferred"),
    ],
)
def test_can_admit(policy: str, providers: Providers, admit: bool) -> None:
    assert merge_hints(policy, TWO_NODES, providers)[1] is admit


# --- TestPolicySingleNumaNodeFilterHints -----------------------------------------------------
def internal(hints: Sequence[TopologyHint]) -> list[tuple[int | None, bool]]:
    return [(None if h.numa is None else _mask_of(h.numa), h.preferred) for h in hints]


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param([], [], id="filter empty resources"),
        pytest.param([[ANY_N], [ANY_P]], [[], [ANY_P]], id="filter hints with nil socket mask 1/2"),
        pytest.param(
            [[P(0), ANY_N], [P(1), ANY_P]],
            [[P(0)], [P(1), ANY_P]],
            id="filter hints with nil socket mask 2/2",
        ),
        pytest.param(
            [[P(1), P(0), ANY_N], []],
            [[P(1), P(0)], []],
            id="filter hints with empty resource socket mask",
        ),
        pytest.param(
            [
                [P(0), P(1), N(1, 2), N(0, 1, 2), ANY_N],
                [N(1, 2), N(0, 1, 2), N(0, 2), N(3)],
                [N(1, 2), N(0, 1, 2), N(0, 2)],
            ],
            [[P(0), P(1)], [], []],
            id="filter hints with wide sockemask",
        ),
    ],
)
def test_filter_single_numa_hints(
    resources: list[list[TopologyHint]], expected: list[list[TopologyHint]]
) -> None:
    got = _single_numa_hints([internal(r) for r in resources])
    assert got == [internal(r) for r in expected]


# --- TestMaxOfMinAffinityCounts --------------------------------------------------------------
@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param([], 0, id="no resources"),
        pytest.param([[P()]], 0, id="one empty mask"),
        pytest.param([[P(0)]], 1, id="one node"),
        pytest.param([[P(0, 1)]], 2, id="two nodes"),
        pytest.param([[P(0, 1), P(0, 1, 2)]], 2, id="narrowest of one resource"),
        pytest.param([[P(0, 1), P(0, 1, 2)], [P(0, 1, 2)]], 3, id="widest narrowest, 1"),
        pytest.param(
            [[P(0, 1), P(0, 1, 2)], [P(0, 1, 2), P(0, 1, 2, 3)]], 3, id="widest narrowest, 2"
        ),
    ],
)
def test_max_of_min_affinity_counts(resources: list[list[TopologyHint]], expected: int) -> None:
    assert _max_of_min_affinity_counts([internal(r) for r in resources]) == expected


# --- TestCompareHintsNarrowest ---------------------------------------------------------------
def merged(hint: TopologyHint) -> tuple[int, bool]:
    assert hint.numa is not None
    return _mask_of(hint.numa), hint.preferred


@pytest.mark.parametrize(
    ("target", "current", "candidate", "expected"),
    [
        pytest.param(-1, None, N(), "current", id="candidate count 0 (1)"),
        pytest.param(-1, P(), N(), "current", id="candidate count 0 (2)"),
        pytest.param(-1, None, P(0), "candidate", id="current nil (1)"),
        pytest.param(-1, None, N(0), "candidate", id="current nil (2)"),
        pytest.param(-1, N(0), P(0), "candidate", id="current not preferred, candidate is"),
        pytest.param(-1, P(0), N(0), "current", id="current preferred, candidate not"),
        pytest.param(-1, P(0), P(0), "current", id="both preferred (1)"),
        pytest.param(-1, P(0, 1), P(0), "candidate", id="both preferred (2)"),
        pytest.param(-1, P(0), P(0, 1), "current", id="both preferred (3)"),
        pytest.param(1, N(0, 1), N(0, 1), "current", id="neither preferred (1.1)"),
        pytest.param(1, N(1, 2), N(0, 1), "candidate", id="neither preferred (1.2)"),
        pytest.param(1, N(0, 1), N(1, 2), "current", id="neither preferred (1.3)"),
        pytest.param(2, N(0, 1), N(0), "current", id="neither preferred (2.1)"),
        pytest.param(2, N(0, 1), N(0, 1), "current", id="neither preferred (2.2)"),
        pytest.param(2, N(1, 2), N(0, 1), "candidate", id="neither preferred (2.3)"),
        pytest.param(2, N(0, 1), N(1, 2), "current", id="neither preferred (2.4)"),
        pytest.param(2, N(0), N(0, 1, 2), "current", id="neither preferred (3a)"),
        pytest.param(2, N(0), N(0, 1), "candidate", id="neither preferred (3b)"),
        pytest.param(3, N(0), N(0, 1), "candidate", id="neither preferred (3ca.1)"),
        pytest.param(3, N(0), N(1, 2), "candidate", id="neither preferred (3ca.2)"),
        pytest.param(4, N(0, 1), N(1, 2, 3), "candidate", id="neither preferred (3ca.3)"),
        pytest.param(4, N(1, 2, 3), N(0, 1), "current", id="neither preferred (3cb)"),
        pytest.param(4, N(0, 1, 2), N(0, 1, 2), "current", id="neither preferred (3cc.1)"),
        pytest.param(4, N(0, 1, 2), N(1, 2, 3), "current", id="neither preferred (3cc.2)"),
        pytest.param(4, N(1, 2, 3), N(0, 1, 2), "candidate", id="neither preferred (3cc.3)"),
    ],
)
def test_compare_hints_narrowest(
    target: int, current: TopologyHint | None, candidate: TopologyHint, expected: str
) -> None:
    policy = TopologyPolicy("best-effort", FOUR_NODES)
    cur = None if current is None else merged(current)
    cand = merged(candidate)
    result = policy._compare(cur, cand, target)
    assert result is (cur if expected == "current" else cand)


# --- TestClosest (kubelet calls Closest(candidate, current)) ---------------------------------
UNIFORM = {n: [10, 10, 10, 10] for n in range(4)}
FOUR_DISTANCES = {
    0: [10, 11, 12, 12],
    1: [11, 10, 12, 12],
    2: [12, 12, 10, 11],
    3: [12, 12, 11, 10],
}


@pytest.mark.parametrize(
    ("current", "candidate", "distances", "expected"),
    [
        pytest.param((0,), (0, 2), {}, "current", id="widths differ, current narrower"),
        pytest.param(
            (0, 1), (0, 2), UNIFORM, "current", id="same width and distance, current lower"
        ),
        pytest.param(
            (0, 3), (0, 2), UNIFORM, "candidate", id="same width and distance, candidate lower"
        ),
        pytest.param((0, 3), (0, 1), FOUR_DISTANCES, "candidate", id="candidate nearer"),
        pytest.param((2, 3), (0, 3), FOUR_DISTANCES, "current", id="current nearer"),
    ],
)
def test_closest(
    current: tuple[int, ...],
    candidate: tuple[int, ...],
    distances: Mapping[int, Sequence[int]],
    expected: str,
) -> None:
    cur, cand = _mask_of(current), _mask_of(candidate)
    assert _closest(distances, cand, cur) == (cur if expected == "current" else cand)


# --- TestCalculateAvgDistanceFor -------------------------------------------------------------
@pytest.mark.parametrize(
    ("nodes", "distances", "expected"),
    [
        pytest.param((0,), {0: [10]}, 10.0, id="1 NUMA node"),
        pytest.param((0,), {0: [10, 11], 1: [11, 10]}, 10.0, id="2 NUMA node, 1 set"),
        pytest.param((0, 1), {0: [10, 11], 1: [11, 10]}, 10.5, id="2 NUMA node, 2 set"),
        pytest.param((0, 2), FOUR_DISTANCES, 11.0, id="4 NUMA node, 2 set"),
        pytest.param((0, 2, 3), FOUR_DISTANCES, 11.11111111111111, id="4 NUMA node, 3 set"),
        pytest.param((), {}, 0.0, id="0 NUMA node, 0 set"),
    ],
)
def test_average_distance(
    nodes: tuple[int, ...], distances: Mapping[int, Sequence[int]], expected: float
) -> None:
    assert _average_distance(distances, _mask_of(nodes)) == expected


# --- bitmask TestIsNarrowerThan --------------------------------------------------------------
@pytest.mark.parametrize(
    ("first", "second", "narrower"),
    [
        pytest.param((0,), (0, 1), True, id="unequal bits set 1/2"),
        pytest.param((0, 1), (0,), False, id="unequal bits set 2/2"),
        pytest.param((0,), (1,), True, id="equal bits set 1/2"),
        pytest.param((1,), (0,), False, id="equal bits set 2/2"),
    ],
)
def test_is_narrower_than(first: tuple[int, ...], second: tuple[int, ...], narrower: bool) -> None:
    assert _narrower(_mask_of(first), _mask_of(second)) is narrower


# --- configuration, as kubelet checks it at start --------------------------------------------
@pytest.mark.parametrize(
    ("policy", "nodes", "max_nodes", "error"),
    [
        pytest.param(
            "best-effort", 9, 8, "more than 8 NUMA Nodes", id="more than 8 NUMA nodes refused"
        ),
        pytest.param("none", 9, 8, None, id="none accepts more than 8 NUMA nodes"),
        pytest.param("restricted", 9, 12, None, id="max-allowable-numa-nodes 12"),
        pytest.param("best-effort", 2, 7, "should not be less than 8", id="setting below 8"),
        pytest.param("static", 2, 8, "unknown policy", id="unknown policy"),
    ],
)
def test_policy_options(policy: str, nodes: int, max_nodes: int, error: str | None) -> None:
    def build() -> TopologyPolicy:
        return TopologyPolicy(policy, tuple(range(nodes)), max_allowable_numa_nodes=max_nodes)

    if error is None:
        assert build().numa_nodes == tuple(range(nodes))
    else:
        with pytest.raises(ValueError, match=error):
            build()


def test_prefer_closest_needs_distances() -> None:
    with pytest.raises(ValueError, match="distances"):
        TopologyPolicy("restricted", TWO_NODES, prefer_closest_numa=True)
    with pytest.raises(ValueError, match="node 1"):
        TopologyPolicy("restricted", TWO_NODES, prefer_closest_numa=True, distances={0: [10, 11]})


def test_numa_ids_beyond_the_bitmask_are_refused() -> None:
    with pytest.raises(ValueError, match="range 0-63"):
        merge_hints("best-effort", TWO_NODES, [{"r": [P(64)]}])


# --- the merge against a literal port of kubelet's loop over every combination ---------------
def kubelet_merge(
    policy: str,
    machine: Sequence[int],
    providers: Sequence[ResourceHints],
    distances: Mapping[int, Sequence[int]] | None,
) -> tuple[TopologyHint, bool]:
    """policy_*.go Merge with HintMerger, written out as kubelet runs it."""
    if policy == "none":
        return ANY_N, True
    default = frozenset(machine)
    all_hints: list[list[TopologyHint]] = []
    for provider in providers:  # filterProvidersHints
        if not provider:
            all_hints.append([ANY_P])
            continue
        for hints in provider.values():
            all_hints.append([ANY_P] if hints is None else [ANY_N] if not hints else list(hints))
    if policy == "single-numa-node":  # filterSingleNumaHints
        all_hints = [
            [h for h in r if h.preferred and (h.numa is None or len(h.numa) == 1)]
            for r in all_hints
        ]
    closest = distances is not None and policy != "single-numa-node"
    narrowest = [min((len(h.numa) for h in r if h.numa is not None), default=0) for r in all_hints]
    target = max(narrowest, default=0)

    def value(m: frozenset[int]) -> int:
        return sum(1 << n for n in m)

    def narrower(a: frozenset[int], b: frozenset[int]) -> bool:
        return value(a) < value(b) if len(a) == len(b) else len(a) < len(b)

    def avg(m: frozenset[int]) -> float:
        assert distances is not None
        return sum(float(distances[a][b]) for a in sorted(m) for b in sorted(m)) / len(m) ** 2

    def fitter(cur: TopologyHint, cand: TopologyHint) -> TopologyHint:
        a, b = cur.numa, cand.numa
        assert a is not None and b is not None
        if a == b:
            return cur
        if closest and len(a) == len(b):
            if avg(a) == avg(b):
                best = a if value(a) < value(b) else b
            else:
                best = a if avg(a) < avg(b) else b
        else:
            best = a if narrower(a, b) else b
        return cur if best == a else cand

    def compare(cur: TopologyHint | None, cand: TopologyHint) -> TopologyHint | None:
        assert cand.numa is not None
        if not cand.numa:
            return cur
        if cur is None:
            return cand
        assert cur.numa is not None
        if not cur.preferred and cand.preferred:
            return cand
        if cur.preferred and not cand.preferred:
            return cur
        if cur.preferred and cand.preferred:
            return fitter(cur, cand)
        cc, nc = len(cur.numa), len(cand.numa)
        if cc > target:
            return fitter(cur, cand)
        if cc == target:
            return cur if nc != target else fitter(cur, cand)
        if nc > target:
            return cur
        if nc == target:
            return cand
        if nc > cc:
            return cand
        if nc < cc:
            return cur
        return fitter(cur, cand)

    best: TopologyHint | None = None
    for permutation in itertools.product(*all_hints):  # iterateAllProviderTopologyHints
        preferred = True
        masks: list[frozenset[int]] = []
        for h in permutation:  # mergePermutation
            if h.numa is not None:
                masks.append(h.numa)
                if h.numa != masks[0]:
                    preferred = False
            if not h.preferred:
                preferred = False
        merged_mask = default.intersection(*masks)
        best = compare(best, TopologyHint(merged_mask, preferred))
    result = TopologyHint(default, False) if best is None else best
    if policy == "single-numa-node" and result.numa == default:
        result = TopologyHint(None, result.preferred)
    admit = True if policy == "best-effort" else result.preferred
    return result, admit


def random_providers(rng: random.Random, machine: Sequence[int]) -> list[ResourceHints]:
    # Mostly masks of the machine's nodes, some naming nodes it lacks (kubelet ANDs them away
    # but compares the raw masks for preference).
    masks = [
        frozenset(c) for k in range(len(machine) + 1) for c in itertools.combinations(machine, k)
    ]
    foreign = [frozenset(c) for k in (1, 2, 3) for c in itertools.combinations(range(6), k)]
    providers: list[ResourceHints] = []
    for p in range(rng.randrange(4)):
        resources: dict[str, list[TopologyHint] | None] = {}
        for r in range(rng.randrange(3)):
            roll = rng.random()
            if roll < 0.05:
                resources[f"r{p}{r}"] = None
            elif roll < 0.1:
                resources[f"r{p}{r}"] = []
            else:
                resources[f"r{p}{r}"] = [
                    TopologyHint(
                        None
                        if rng.random() < 0.1
                        else rng.choice(foreign if rng.random() < 0.2 else masks),
                        rng.random() < 0.6,
                    )
                    for _ in range(rng.randint(1, 5))
                ]
        providers.append(resources)
    return providers


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("closest", [False, True], ids=["narrowest", "closest"])
def test_merge_matches_kubelets_loop(policy: str, closest: bool) -> None:
    rng = random.Random(f"{policy}-{closest}")
    for _ in range(400):
        machine = tuple(sorted(rng.sample(range(6), rng.randint(1, 4))))
        distances: dict[int, list[int]] | None = None
        if closest:
            distances = {a: [0] * 6 for a in range(6)}
            for a, b in itertools.combinations_with_replacement(range(6), 2):
                distances[a][b] = distances[b][a] = 10 if a == b else rng.randint(11, 14)
        providers = random_providers(rng, machine)
        got = merge_hints(
            policy, machine, providers, prefer_closest_numa=closest, distances=distances
        )
        assert got == kubelet_merge(policy, machine, providers, distances), providers
