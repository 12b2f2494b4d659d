"""Field-level differences between what a recording says and what a replay did.

`field_diff(recorded, replayed)` walks two JSON values and names each field that differs by
its path (`config.linux.resources.cpuset_cpus`, `envs[3].value`); `Difference` carries one,
and `describe` prints it as a line a person reads:

    forwarded config.linux.resources.cpuset_cpus: recorded "2-3", replayed "0-1"
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["ABSENT", "Difference", "field_diff", "show"]

ABSENT: Any = object()
"""A field one side does not have."""
_LONGEST = 120


class Difference(NamedTuple):
    what: str
    """`forwarded`, `status`, `updates`, `effects`, ..."""
    field: str
    """The path inside it, or "" for the value as a whole."""
    recorded: Any
    replayed: Any

    def describe(self) -> str:
        where = f"{self.what} {self.field}" if self.field else self.what
        return f"{where}: recorded {show(self.recorded)}, replayed {show(self.replayed)}"


def show(value: Any) -> str:
    if value is ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _LONGEST else text[: _LONGEST - 3] + "..."


def field_diff(recorded: Any, replayed: Any, what: str, path: str = "") -> Iterator[Difference]:
    """Every leaf field where the two values differ (a whole value where their shapes do)."""
    if isinstance(recorded, Mapping) and isinstance(replayed, Mapping):
        for key in sorted(set(recorded) | set(replayed), key=str):
            yield from field_diff(
                recorded.get(key, ABSENT), replayed.get(key, ABSENT), what, _join(path, str(key))
            )
        return
    if _is_list(recorded) and _is_list(replayed):
        for index in range(max(len(recorded), len(replayed))):
            yield from field_diff(
                recorded[index] if index < len(recorded) else ABSENT,
                replayed[index] if index < len(replayed) else ABSENT,
                what,
                f"{path}[{index}]",
            )
        return
    if recorded != replayed or type(recorded) is not type(replayed):
        if recorded is ABSENT and replayed is ABSENT:
            return
        yield Difference(what, path, recorded, replayed)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
