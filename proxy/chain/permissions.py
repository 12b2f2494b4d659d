"""What a hook may set: grants, checked on every adjustment before it is merged.

    allow = ["cpuset_cpus", "annotation:example.com/*", "device:/dev/fuse", "mount:/data/*"]

A grant names a field of the Adjustment (`cpuset_cpus`, `oom_score_adj`, `cgroup_parent`,
`device`, `mount`, `env`, ...), and for keyed fields may narrow it to keys matching a glob:
`annotation:example.com/*` allows only those annotations; devices and mounts are keyed by
container path. Updates to other containers need the grants of the resources they change.

Without `allow`, a plugin (or an in-process hook that declares nothing) may set labels,
annotations and the container resources; devices, mounts, env, CDI devices and the cgroup
parent need an explicit grant. A built-in hook declares what it sets (`Hook.sets`), and a
configured `allow` only narrows that: a change must be allowed by both.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from crihook.hooks.spec.adjustment import (
    KEYED_FIELDS,
    RESOURCE_FIELDS,
    Adjustment,
    ContainerUpdate,
    Field,
    FieldKey,
    describe_key,
)

__all__ = ["DEFAULT_GRANTS", "Grants", "Permissions", "parse_grants"]

_BY_NAME = {f.value: f for f in Field}
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


@dataclass(frozen=True)
class Grants:
    """Per field: None (any key), or the key globs allowed. A field absent: not allowed."""

    fields: Mapping[Field, tuple[str, ...] | None]

    def allows(self, key: FieldKey) -> bool:
        field, name = key
        if field not in self.fields:
            return False
        patterns = self.fields[field]
        return patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)

    def describe(self) -> list[str]:
        """As `allow` lists them."""
        out = []
        for field, patterns in sorted(self.fields.items(), key=lambda kv: kv[0].value):
            if patterns is None:
                out.append(field.value)
            else:
                out.extend(f"{field.value}:{p}" for p in patterns)
        return out


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


def parse_grants(entries: Iterable[object], where: str) -> Grants:
    """`allow` entries → Grants; ValueError naming `where` and the bad entry."""
    fields: dict[Field, tuple[str, ...] | None] = {}
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"{where}: {entry!r} is not a field name like 'cpuset_cpus'")
        name, colon, pattern = entry.partition(":")
        field = _BY_NAME.get(name)
        if field is None:
            known = ", ".join(sorted(_BY_NAME))
            raise ValueError(f"{where}: {name!r} is not a field an adjustment sets ({known})")
        if colon:
            if field not in KEYED_FIELDS:
                raise ValueError(f"{where}: {name} has no keys to narrow ({entry!r})")
            if not pattern:
                raise ValueError(f"{where}: {entry!r} has an empty key pattern")
            current = fields.get(field, ())
            if current is not None:  # an unnarrowed grant of the field already allows all
                fields[field] = (*current, pattern)
        else:
            fields[field] = None
    return Grants(fields)


DEFAULT_GRANTS = Grants(
    {Field.LABEL: None, Field.ANNOTATION: None, **dict.fromkeys(RESOURCE_FIELDS)}
)
"""What a hook that declares nothing may set without `allow`: labels, annotations and the
container resources."""
