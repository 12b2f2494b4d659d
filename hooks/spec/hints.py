"""NUMA topology hints: how resource hooks agree on where a container goes.

A hook that places a resource (CPUs, memory, pooled devices) offers, per resource, the NUMA
node sets it could satisfy the request from, each marked preferred or not, as kubelet's
topology manager asks its hint providers. crihook merges every hook's hints under the node's
topology policy before the pre stage and hands the result to every hook as `ctx.affinity`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ResourceHints", "TopologyHint"]


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """One placement a hook could make. `numa` None: any node will do (no preference)."""

    numa: frozenset[int] | None
    preferred: bool

    def __repr__(self) -> str:
        nodes = "any" if self.numa is None else ",".join(map(str, sorted(self.numa)))
        return f"TopologyHint({nodes}{', preferred' if self.preferred else ''})"


ResourceHints = Mapping[str, Sequence[TopologyHint] | None]
"""Resource name → the hints for it. A resource mapped to None has no preference; one mapped
to an empty sequence cannot be placed at all (kubelet's semantics)."""
