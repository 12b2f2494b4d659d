"""Placement: the topology policy applied to the NUMA hints the resource hooks offered.

kubelet's topology manager, for hooks: every hook that places a resource offers hints per
resource; they are merged under the node's policy (none, best-effort, restricted,
single-numa-node) and the best merged hint is handed to every hook's pre stage as
`ctx.affinity`. A policy that admits none of them fails the call before any hook reserved
anything.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from crihook.hooks.node.hints import merge_hints
from crihook.hooks.spec import ResourceHints, TopologyHint
from crihook.proxy.errors import TopologyRejected

__all__ = ["Placement"]

log = logging.getLogger(__name__)


class Placement:
    def __init__(self, policy: str, numa_nodes: Sequence[int]) -> None:
        self.policy = policy
        self.numa_nodes = tuple(numa_nodes)

    def choose(self, offered: Sequence[tuple[str, ResourceHints]]) -> TopologyHint | None:
        """The affinity for this call: None when no hook offered hints or the policy is
        `none` (no alignment asked). TopologyRejected when the policy admits nothing."""
        if not offered or self.policy == "none":
            return None
        best, admit = merge_hints(self.policy, self.numa_nodes, [h for _, h in offered])
        if not admit:
            raise TopologyRejected(
                f"topology policy {self.policy} admits no placement: {_describe(offered)}"
            )
        return best


def _describe(offered: Sequence[tuple[str, ResourceHints]]) -> str:
    """`cpuset: cpu on {0}, {1} (preferred) …` — what each hook could do, for the operator."""
    parts = []
    for hook, hints in offered:
        for resource, options in hints.items():
            if options is None:
                continue
            shown = (
                ", ".join(
                    (
                        "{" + ",".join(map(str, sorted(h.numa))) + "}"
                        if h.numa is not None
                        else "any"
                    )
                    + (" preferred" if h.preferred else "")
                    for h in options
                )
                or "nowhere"
            )
            parts.append(f"{hook} can place {resource} on {shown}")
    return "; ".join(parts) or "no hints"
