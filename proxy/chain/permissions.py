"""What a hook may set: grants, checked on every adjustment before it is merged.

The grant grammar (`allow = ["cpuset_cpus", "annotation:example.com/*", ...]`) is in
`proxy/grants.py`. Updates to other containers need the grants of the resources they change.

Without `allow`, a plugin (or an in-process hook that declares nothing) may set labels,
annotations and the container resources; devices, mounts, env, CDI devices and the cgroup
parent need an explicit grant. A built-in hook declares what it sets (`Hook.sets`), and a
configured `allow` only narrows that: a change must be allowed by both.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from crihook.hooks.spec.adjustment import (
    Adjustment,
    ContainerUpdate,
    Field,
    FieldKey,
    describe_key,
)
from crihook.proxy.grants import Grants

__all__ = ["Permissions"]

# ResourceDelta field names of updates to other containers, as Adjustment fields.
_DELTA_FIELDS = {
    "cpuset_cpus": Field.CPUSET_CPUS,
    "cpuset_mems": Field.CPUSET_MEMS,
    "cpu_shares": Field.CPU_SHARES,
    "cpu_quota": Field.CPU_QUOTA,
    "cpu_period": Field.CPU_PERIOD,
    "memory_limit_in_bytes": Field.MEMORY_LIMIT,
    "memory_swap_limit_in_bytes": Field.MEMORY_SWAP_LIMIT,
}


_DECIDED_MAX = 1024
"""Answers a Permissions keeps (`Permissions._decided`)."""


@dataclass(frozen=True)
class Permissions:
    """A hook's grants: what it declares (a built-in hook) or the defaults, and what the
    configuration allows it; a change must be allowed by every one of them."""

    layers: tuple[Grants, ...]

    @functools.cached_property
    def _whole(self) -> frozenset[Field]:
        """Fields every layer grants whatever the key: allowed without a glob matched."""
        return frozenset(
            f for f in Field if all(f in g.fields and g.fields[f] is None for g in self.layers)
        )

    @functools.cached_property
    def _decided(self) -> dict[FieldKey, bool]:
        """Keys already checked against the layers → the answer. Grants never change, so
        neither does an answer: a hook that sets the same keys on every call (an annotation
        under a glob) has them matched once, not on every call. Bounded: `_DECIDED_MAX`."""
        return {}

    def allows(self, key: FieldKey) -> bool:
        if key[0] in self._whole:
            return True
        decided = self._decided
        answer = decided.get(key)
        if answer is None:
            answer = all(g.allows(key) for g in self.layers)
            if len(decided) >= _DECIDED_MAX:  # ever-new keys: start over rather than grow
                decided.clear()
            decided[key] = answer
        return answer

    def denied(self, adjustment: Adjustment) -> list[str]:
        """What `adjustment` sets that is not allowed (named as the audit names fields)."""
        whole, allows = self._whole, self.allows
        denied = [
            describe_key(key)
            for key, _ in adjustment.change_items()
            if key[0] not in whole and not allows(key)
        ]
        updates = adjustment.updates
        if updates:
            denied.extend(self.denied_updates(updates))
        for group in adjustment.groups:  # its fields, once: not one check per member
            denied.extend(
                f"{name} of the containers of {group.key} (an update)"
                for name in sorted(group.fields)
                if not self.allows((_DELTA_FIELDS[name], ""))
            )
        return denied

    def denied_updates(self, updates: Iterable[ContainerUpdate]) -> Iterator[str]:
        """What updates to other containers change that is not allowed."""
        for update in updates:
            for name, _ in update.resources.items():
                if not self.allows((_DELTA_FIELDS[name], "")):
                    yield f"{name} of container {update.container_id[:12]} (an update)"

    def describe(self) -> list[list[str]]:
        return [g.describe() for g in self.layers]
