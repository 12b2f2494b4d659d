"""The `allow` grant grammar: which fields of an Adjustment a hook is granted.

    allow = ["cpuset_cpus", "annotation:example.com/*", "device:/dev/fuse", "mount:/data/*"]

A grant names a field of the Adjustment (`cpuset_cpus`, `oom_score_adj`, `cgroup_parent`,
`device`, `mount`, `env`, ...), and for keyed fields may narrow it to keys matching a glob:
`annotation:example.com/*` allows only those annotations; devices and mounts are keyed by
container path.

A base module: config validates `allow` with it when the settings are read, and
chain/permissions applies the grants on every adjustment.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from crihook.hooks.spec.adjustment import KEYED_FIELDS, RESOURCE_FIELDS, Field, FieldKey

__all__ = ["DEFAULT_GRANTS", "Grants", "parse_grants"]

_BY_NAME = {f.value: f for f in Field}


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
