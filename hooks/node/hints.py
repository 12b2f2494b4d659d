"""Kubelet's topology manager hint merge: which NUMA nodes a container goes to, and whether the
node's topology policy admits it.

Pure: `TopologyPolicy(name, numa_nodes, ...)` is validated when built (as kubelet validates its
topology manager options at start) and `merge(providers)` is a function of its arguments.
`merge_hints(...)` does both in one call.

Followed: kubernetes/kubernetes ``pkg/kubelet/cm/topologymanager`` as stored for
``policy_test.go`` and ``policy_restricted_test.go`` at 052ac4f7bc74452f0eadfcaacde855c5b8307b1d
(with the ``HintMerger`` of ``policy.go`` they test), ``policy_best_effort_test.go`` and
``numa_info_test.go`` at 243ba086e7f4cb73ea32bdd25d635d06cda26085, ``bitmask/bitmask.go`` at
5a430f48eaced645b3992d4c65f32c2df5665dda, ``policy_options.go`` (prefer-closest-numa-nodes and
max-allowable-numa-nodes, both beta options) and ``topology_manager.go``'s ``NewManager``.

Kubelet's rules, as ported here:

* A provider that returns no hints at all (an empty map) has no preference: one preferred
  any-node hint. Per resource, ``None`` (kubelet's nil slice) is also a preferred any-node
  hint, while an *empty* sequence (cannot be placed) becomes one *non-preferred* any-node hint.
* Every combination of one hint per resource is merged: the masks are ANDed with the machine's
  mask (an any-node hint contributes nothing), and the result is preferred only if every hint
  was preferred *and* all hints with a mask had the same mask. Merged hints with no node left
  are dropped.
* The best merged hint: preferred beats non-preferred; among preferred ones the narrower mask
  wins (fewer nodes, then the lower mask value), or with prefer-closest-numa-nodes the one
  with the smaller average NUMA distance among masks of equal width (then the lower value).
  Among non-preferred ones kubelet aims at ``bestNonPreferredAffinityCount``, the largest
  over resources of the smallest mask a resource offered: a mask of exactly that width wins,
  then the widest below it, then the narrowest above it, then as for preferred ones.
* Nothing merged (no combination, or all empty): the machine's mask, not preferred.
* single-numa-node first keeps, per resource, only preferred hints of one node or of no node;
  a best hint equal to the machine's mask comes back as ``None`` (so on a one-node machine the
  answer is always ``None``). It never uses prefer-closest-numa-nodes.
* Admission: best-effort always; restricted and single-numa-node only a preferred hint; none
  always, with ``TopologyHint(None, False)`` (kubelet's zero hint) and no merge.
* Policies other than none refuse machines with more than ``max_allowable_numa_nodes`` NUMA
  nodes (default 8; kubelet refuses a setting below 8).

Deliberate differences, none observable in the result:

* Kubelet folds its comparison over every combination (255**3 for three resources on eight
  nodes). That comparison picks the best under a strict total order (preferred first, then the
  rules above, the mask value breaking every tie), so the best of the *distinct* merged hints
  is the same hint. This module finds the preferred merged hints directly (a mask every
  resource offers as preferred, or can leave to an any-node hint) and only when none exists
  walks the set of reachable AND masks resource by resource (at most 2**n states). The unit
  tests check it against a literal port of kubelet's loop on random inputs.
* Kubelet fails to build a mask for a NUMA id outside 0-63 or panics on a missing distance;
  this module raises ValueError instead.
* Alpha options seen in newer stored kubelet sources (NUMA allocation strategy, score
  weights, a "distributed" policy) are gated off by default and not implemented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from crihook.hooks.spec.hints import ResourceHints, TopologyHint

__all__ = [
    "DEFAULT_MAX_ALLOWABLE_NUMA_NODES",
    "POLICIES",
    "TopologyPolicy",
    "merge_hints",
]

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8
"""kubelet's defaultMaxAllowableNUMANodes: the default and the lowest accepted setting."""

_MAX_BIT = 64  # kubelet's bitmask is a uint64

# A hint inside the merge: (mask, preferred); mask None is an any-node hint.
_Hint = tuple[int | None, bool]
# A merged hint: (mask, preferred), the mask already ANDed with the machine's.
_Merged = tuple[int, bool]


def _mask_of(nodes: Iterable[int]) -> int:
    mask = 0
    for node in nodes:
        if not 0 <= node < _MAX_BIT:
            raise ValueError(f"NUMA node {node}: bit number must be in range 0-63")
        mask |= 1 << node
    return mask


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _narrower(m1: int, m2: int) -> bool:
    """bitmask.IsNarrowerThan: fewer bits set; equally many, the lower value."""
    c1, c2 = m1.bit_count(), m2.bit_count()
    return m1 < m2 if c1 == c2 else c1 < c2


def _closest(distances: Mapping[int, Sequence[int]], m1: int, m2: int) -> int:
    """NUMAInfo.Closest: the narrower; equally wide, the nearer; equally near, the lower."""
    if m1.bit_count() != m2.bit_count():
        return m1 if _narrower(m1, m2) else m2
    d1, d2 = _average_distance(distances, m1), _average_distance(distances, m2)
    if d1 == d2:
        return m1 if m1 < m2 else m2
    return m1 if d1 < d2 else m2


def _average_distance(distances: Mapping[int, Sequence[int]], mask: int) -> float:
    """NUMADistances.CalculateAverageFor, summed in kubelet's order."""
    bits = _bits(mask)
    if not bits:
        return 0.0
    total = 0.0
    count = 0.0
    for a in bits:
        row = distances[a]
        for b in bits:
            total += float(row[b])
            count += 1
    return total / count


@dataclass(frozen=True)
class TopologyPolicy:
    """A topology manager policy on one machine, checked as kubelet checks it at start."""

    name: str
    """One of POLICIES."""
    numa_nodes: tuple[int, ...]
    """The machine's NUMA node ids (kubelet's NUMAInfo.Nodes)."""
    prefer_closest_numa: bool = False
    """prefer-closest-numa-nodes: among preferred masks of equal width, the smallest average
    distance wins. Ignored by single-numa-node, as kubelet ignores it."""
    distances: Mapping[int, Sequence[int]] | None = field(default=None, hash=False)
    """Node id → the node's row of /sys/devices/system/node/nodeN/distance, indexed by node id
    as kubelet indexes it. Required with prefer_closest_numa."""
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    """max-allowable-numa-nodes: policies other than none refuse larger machines."""

    _default: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f'unknown policy: "{self.name}" (expected one of {POLICIES})')
        if self.max_allowable_numa_nodes < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
            raise ValueError(
                f'the minimum value of "max-allowable-numa-nodes" should not be less than '
                f"{DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
            )
        object.__setattr__(self, "numa_nodes", tuple(self.numa_nodes))
        if self.name != "none" and len(self.numa_nodes) > self.max_allowable_numa_nodes:
            raise ValueError(
                f"unsupported on machines with more than {self.max_allowable_numa_nodes} "
                f"NUMA Nodes (this one has {len(self.numa_nodes)})"
            )
        object.__setattr__(self, "_default", _mask_of(self.numa_nodes))
        if self._uses_distances:
            self._check_distances()

    @property
    def _uses_distances(self) -> bool:
        return self.prefer_closest_numa and self.name != "single-numa-node"

    def _check_distances(self) -> None:
        if self.distances is None:
            raise ValueError("prefer-closest-numa-nodes needs the NUMA distances")
        for node in self.numa_nodes:
            row = self.distances.get(node)
            if row is None or any(other >= len(row) for other in self.numa_nodes):
                raise ValueError(f"NUMA distances: node {node} has no distance to every node")

    # --- the merge ---------------------------------------------------------------------------

    def merge(self, providers: Sequence[ResourceHints]) -> tuple[TopologyHint, bool]:
        """The best hint for the providers' hints and whether the policy admits it."""
        if self.name == "none":
            return TopologyHint(None, False), True
        resources = _filter_providers(providers)
        if self.name == "single-numa-node":
            resources = _single_numa_hints(resources)
        mask, preferred = self._best(resources)
        numa: frozenset[int] | None = frozenset(_bits(mask))
        if self.name == "single-numa-node" and mask == self._default:
            numa = None
        admit = True if self.name == "best-effort" else preferred
        return TopologyHint(numa, preferred), admit

    def _best(self, resources: list[list[_Hint]]) -> _Merged:
        """HintMerger.Merge over the distinct merged hints (see the module docstring)."""
        default = self._default
        if any(not hints for hints in resources):
            return default, False  # no combination at all
        best: _Merged | None = None
        for merged in _preferred_merges(default, resources):
            best = self._compare(best, merged, 0)
        if best is not None:
            return best
        target = _max_of_min_affinity_counts(resources)
        for mask in _reachable_masks(default, resources):
            best = self._compare(best, (mask, False), target)
        return (default, False) if best is None else best

    def _compare(self, current: _Merged | None, candidate: _Merged, target: int) -> _Merged | None:
        """HintMerger.compare; `target` is bestNonPreferredAffinityCount."""
        cand_mask, cand_pref = candidate
        cand_count = cand_mask.bit_count()
        if cand_count == 0:
            return current
        if current is None:
            return candidate
        cur_mask, cur_pref = current
        if cand_pref != cur_pref:
            return candidate if cand_pref else current
        if cur_pref:
            return self._fitter(current, candidate)
        cur_count = cur_mask.bit_count()
        if cur_count > target:  # case 1: above the target, anything fitter
            return self._fitter(current, candidate)
        if cur_count == target:  # case 2: at the target, only a fitter one at the target
            return self._fitter(current, candidate) if cand_count == target else current
        if cand_count > target:  # case 3a
            return current
        if cand_count == target:  # case 3b
            return candidate
        if cand_count != cur_count:  # cases 3ca and 3cb: closer to the target from below
            return candidate if cand_count > cur_count else current
        return self._fitter(current, candidate)  # case 3cc

    def _fitter(self, current: _Merged, candidate: _Merged) -> _Merged:
        """CompareNUMAAffinityMasks: NUMAInfo.Narrowest, or Closest with the option."""
        m1, m2 = current[0], candidate[0]
        if m1 == m2:
            return current
        if self._uses_distances:
            assert self.distances is not None  # checked in __post_init__
            best = _closest(self.distances, m1, m2)
        else:
            best = m1 if _narrower(m1, m2) else m2
        return current if best == m1 else candidate


def merge_hints(
    policy: str,
    numa_nodes: Sequence[int],
    providers: Sequence[ResourceHints],
    *,
    prefer_closest_numa: bool = False,
    distances: Mapping[int, Sequence[int]] | None = None,
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
) -> tuple[TopologyHint, bool]:
    """`TopologyPolicy(...).merge(providers)` in one call: (best hint, admit)."""
    return TopologyPolicy(
        policy, tuple(numa_nodes), prefer_closest_numa, distances, max_allowable_numa_nodes
    ).merge(providers)


# --- kubelet's helpers ---------------------------------------------------------------------


def _filter_providers(providers: Sequence[ResourceHints]) -> list[list[_Hint]]:
    """filterProvidersHints: one hint list per resource, nil and empty made explicit."""
    out: list[list[_Hint]] = []
    for provider in providers:
        if not provider:
            out.append([(None, True)])  # no preference for any resource
            continue
        for hints in provider.values():
            if hints is None:
                out.append([(None, True)])  # no preference for this resource
            elif not hints:
                out.append([(None, False)])  # no possible placement for this resource
            else:
                out.append(
                    [(None if h.numa is None else _mask_of(h.numa), h.preferred) for h in hints]
                )
    return out


def _single_numa_hints(resources: list[list[_Hint]]) -> list[list[_Hint]]:
    """filterSingleNumaHints: keep preferred hints of no node or of exactly one node."""
    return [
        [(m, p) for m, p in hints if p and (m is None or m.bit_count() == 1)] for hints in resources
    ]


def _max_of_min_affinity_counts(resources: list[list[_Hint]]) -> int:
    """maxOfMinAffinityCounts: the widest of the resources' narrowest masks."""
    best = 0
    for hints in resources:
        counts = [m.bit_count() for m, _ in hints if m is not None]
        if counts:
            best = max(best, min(counts))
    return best


def _preferred_merges(default: int, resources: list[list[_Hint]]) -> set[_Merged]:
    """The merged hints that come out preferred.

    A combination merges to a preferred hint only if each of its hints is preferred and all
    of them that name nodes name the same mask M: every resource offers M as preferred or
    has a preferred any-node hint. The merged mask is M & default (or default when every
    resource took its any-node hint).
    """
    masks = [{m for m, p in hints if p and m is not None} for hints in resources]
    anywhere = [any(p and m is None for m, p in hints) for hints in resources]
    out: set[_Merged] = set()
    if all(anywhere):
        out.add((default, True))
    for mask in set().union(*masks):
        if all(mask in offered or free for offered, free in zip(masks, anywhere, strict=True)):
            out.add((mask & default, True))
    return out


def _reachable_masks(default: int, resources: list[list[_Hint]]) -> set[int]:
    """Every non-empty AND mask some combination reaches (preference left aside)."""
    states = {default}
    for hints in resources:
        masks = {default if m is None else m & default for m, _ in hints}
        states = {s & m for s in states for m in masks}
        states.discard(0)  # an empty mask stays empty and is never a candidate
        if not states:
            break
    return states
