"""A field value of an Adjustment as JSON shows it, and back: how the audit stores what hooks
set (proxy.core.pipeline), and how a recording writes it and a replay reads it (record/).

Strings and ints as they are, a removal as `"<removed>"`, env bytes as text, a Device or
Mount as an object of its fields in declared order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crihook.hooks.spec.adjustment import REMOVE, Device, Field, FieldKey, Mount

__all__ = ["from_jsonable", "jsonable"]

_DATACLASS_VALUES = (Device, Mount)  # a tuple: `Device | Mount` is built on every use


def jsonable(value: Any) -> Any:
    """An adjustment's value as the audit stores it."""
    kind = type(value)
    if kind is str or kind is int:  # most values: shown as they are, found at once
        return value
    if value is REMOVE:
        return "<removed>"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, _DATACLASS_VALUES):
        return vars(value).copy()  # its fields in their order: the dataclass __init__ set them
    return value


_REMOVABLE = frozenset(
    {Field.LABEL, Field.ANNOTATION, Field.UNIFIED, Field.DEVICE, Field.MOUNT, Field.ENV}
    | {Field.CDI_DEVICE}
)
"""Fields an Adjustment can remove (a `remove_...` builder)."""


def from_jsonable(key: FieldKey, shown: Any) -> Any:
    """The value `jsonable` showed for the field `key`, back (a recording's adjustment, read by
    a replay). Two things do not come back as they were: a string value `<removed>` of a
    removable field reads as a removal, and env bytes that were not UTF-8 read as their
    replacement characters (jsonable showed them so). TypeError/ValueError for a value the
    field never takes."""
    field = key[0]
    if shown == "<removed>" and field in _REMOVABLE:
        return REMOVE
    if field is Field.ENV:
        if not isinstance(shown, str):
            raise TypeError(f"env {key[1]!r}: {shown!r} is not a string")
        return shown.encode()
    if field is Field.DEVICE or field is Field.MOUNT:
        if not isinstance(shown, Mapping):
            raise TypeError(f"{field.value} {key[1]!r}: {shown!r} is not an object")
        kind = Device if field is Field.DEVICE else Mount
        return kind(**shown)
    if isinstance(shown, bool) or not isinstance(shown, int | str):
        raise TypeError(f"{field.value}: {shown!r} is neither a string nor an integer")
    return shown
