"""Applies hook adjustments to a CRI request, field by field, recording who owns what.

The chain calls `Merger.add(hook, adjustment)` after each hook, in chain order; the request is
changed in place so the next hook sees it as adjusted so far. A second hook touching a field
another hook owns is a conflict: an error naming both (the default), or decided by the
configured precedence (earlier in the list wins).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.adjustment import (
    REMOVE,
    RESOURCE_FIELDS,
    Adjustment,
    ContainerUpdate,
    Device,
    Field,
    FieldKey,
    Mount,
    describe_key,
)
from crihook.hooks.spec.events import Event
from crihook.proxy.errors import HookConflict, HookInvalidAdjustment

__all__ = [
    "ALLOWED_FIELDS",
    "Merger",
    "PendingUpdate",
    "apply_change",
    "from_jsonable",
    "jsonable",
    "stamp",
]

_CONTAINER_FIELDS = RESOURCE_FIELDS | {
    Field.LABEL,
    Field.ANNOTATION,
    Field.DEVICE,
    Field.MOUNT,
    Field.ENV,
    Field.CDI_DEVICE,
}

# What each call can carry. Start/Stop/Remove carry only ids: hooks there may only update
# other containers.
ALLOWED_FIELDS: Mapping[Event, frozenset[Field]] = {
    Event.RUN_POD_SANDBOX: frozenset(
        (RESOURCE_FIELDS - {Field.OOM_SCORE_ADJ})
        | {Field.CGROUP_PARENT, Field.LABEL, Field.ANNOTATION}
    ),
    Event.CREATE_CONTAINER: frozenset(_CONTAINER_FIELDS),
    Event.UPDATE_CONTAINER_RESOURCES: frozenset(RESOURCE_FIELDS | {Field.ANNOTATION}),
    Event.UPDATE_POD_SANDBOX_RESOURCES: frozenset(RESOURCE_FIELDS - {Field.OOM_SCORE_ADJ}),
    Event.START_CONTAINER: frozenset(),
    Event.STOP_CONTAINER: frozenset(),
    Event.REMOVE_CONTAINER: frozenset(),
    Event.STOP_POD_SANDBOX: frozenset(),
    Event.REMOVE_POD_SANDBOX: frozenset(),
}

_PROPAGATION = {
    "private": api_pb2.PROPAGATION_PRIVATE,
    "rslave": api_pb2.PROPAGATION_HOST_TO_CONTAINER,
    "rshared": api_pb2.PROPAGATION_BIDIRECTIONAL,
}


_ORDER = itertools.count(1)


class PendingUpdate(NamedTuple):
    """An update to another container a hook asked for, not sent yet."""

    hook: str
    update: ContainerUpdate
    seq: int
    """When the hook produced it: for one container and field, a later one wins."""


def stamp(hook: str, updates: Iterable[ContainerUpdate]) -> list[PendingUpdate]:
    """Updates a hook returned just now, numbered in the order hooks produced them."""
    return [PendingUpdate(hook, u, next(_ORDER)) for u in updates]


def jsonable(value: Any) -> Any:
    """An adjustment's value as the audit stores it."""
    if value is REMOVE:
        return "<removed>"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, Device | Mount):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
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


class Merger:
    """Merges the adjustments of one call. One instance per intercepted call."""

    def __init__(
        self, event: Event, request: Message, conflict: str, precedence: Sequence[str]
    ) -> None:
        self.event = event
        self.request = request
        self._conflict = conflict
        self._rank = {name: i for i, name in enumerate(precedence)}
        self.owners: dict[FieldKey, str] = {}
        self.values: dict[FieldKey, Any] = {}
        self.updates: list[PendingUpdate] = []
        self.unapplied: dict[str, str] = {}
        """Hook → why its adjustment was not applied (dry-run, an ignored failure)."""
        self.refused: list[dict[str, Any]] = []
        """Changes hooks were not permitted to make ({hook, fields}), for the audit."""
        self.refused_answers: dict[str, Adjustment] = {}
        """Hook → the adjustment the chain refused (invalid, not permitted), for the trace:
        a recording keeps what the hook asked, so a replay can ask it again."""

    @property
    def changed(self) -> bool:
        return bool(self.owners)

    def validate(self, hook: str, adjustment: Adjustment, post: bool) -> None:
        """Refuse fields the call cannot carry, before anything is applied."""
        allowed = frozenset() if post else ALLOWED_FIELDS[self.event]
        for key, _ in adjustment.change_items():
            if key[0] not in allowed:
                where = f"post-{self.event.value}" if post else self.event.value
                raise HookInvalidAdjustment(
                    hook, f"set {describe_key(key)}, which {where} cannot carry"
                )

    def add(self, hook: str, base_name: str, adjustment: Adjustment) -> None:
        """Apply one hook's adjustment (already validated), or raise HookConflict.

        Conflicts are checked for every field first, so a conflicting adjustment changes
        nothing (never half-applied)."""
        winners: list[tuple[FieldKey, Any]] = []
        for key, value in adjustment.change_items():
            owner = self.owners.get(key)
            if owner is None or owner == hook or self._wins(base_name, owner):
                winners.append((key, value))
            elif self._conflict != "precedence" or not self._ranked(owner):
                raise HookConflict(describe_key(key), owner, hook)
        for key, value in winners:
            apply_change(self.event, self.request, key, value)
            self.owners[key] = hook
            self.values[key] = value
        self.updates.extend(stamp(hook, adjustment.updates))

    def _ranked(self, hook: str) -> bool:
        return _base(hook) in self._rank

    def _wins(self, challenger_base: str, owner: str) -> bool:
        if self._conflict != "precedence":
            return False
        mine, theirs = self._rank.get(challenger_base), self._rank.get(_base(owner))
        return mine is not None and (theirs is None or mine < theirs)


def _base(hook: str) -> str:
    return hook[3:] if len(hook) > 3 and hook[2] == "-" and hook[:2].isdigit() else hook


# --- applying one change to a CRI request ------------------------------------------------


def _resources(event: Event, request: Any) -> Any:
    if event is Event.UPDATE_CONTAINER_RESOURCES:
        return request.linux
    if event is Event.UPDATE_POD_SANDBOX_RESOURCES:
        return request.resources
    return request.config.linux.resources


def _maps(event: Event, request: Any, field: Field) -> Any:
    if event is Event.UPDATE_CONTAINER_RESOURCES:
        return request.annotations
    return request.config.labels if field is Field.LABEL else request.config.annotations


_SCALAR_RESOURCES = {
    Field.CPUSET_CPUS: "cpuset_cpus",
    Field.CPUSET_MEMS: "cpuset_mems",
    Field.CPU_SHARES: "cpu_shares",
    Field.CPU_QUOTA: "cpu_quota",
    Field.CPU_PERIOD: "cpu_period",
    Field.MEMORY_LIMIT: "memory_limit_in_bytes",
    Field.MEMORY_SWAP_LIMIT: "memory_swap_limit_in_bytes",
    Field.OOM_SCORE_ADJ: "oom_score_adj",
}


def apply_change(event: Event, request: Any, key: FieldKey, value: Any) -> None:
    """Write one field into the request (a protobuf message, changed in place)."""
    field, name = key
    keyed = _KEYED.get(field)
    if keyed is not None:  # devices, mounts, CDI devices: the most common on CreateContainer
        repeated, attr, fields = keyed
        _replace_keyed(getattr(request.config, repeated), attr, name, value, fields)
    elif field is Field.ENV:
        _set_env(request.config.envs, name, value)
    elif field is Field.LABEL or field is Field.ANNOTATION:
        target = _maps(event, request, field)
        if value is REMOVE:
            target.pop(name, None)
        else:
            target[name] = value
    elif field is Field.CGROUP_PARENT:
        request.config.linux.cgroup_parent = value
    elif field in _SCALAR_RESOURCES:
        setattr(_resources(event, request), _SCALAR_RESOURCES[field], value)
    elif field is Field.HUGEPAGE_LIMIT:
        _set_hugepage(_resources(event, request), name, value)
    elif field is Field.UNIFIED:
        unified = _resources(event, request).unified
        if value is REMOVE:
            unified.pop(name, None)
        else:
            unified[name] = value
    else:  # pragma: no cover - every Field is handled above
        raise AssertionError(f"unhandled field {field}")


def _set_hugepage(resources: Any, page_size: str, limit: int) -> None:
    for entry in resources.hugepage_limits:
        if entry.page_size == page_size:
            entry.limit = limit
            return
    resources.hugepage_limits.add(page_size=page_size, limit=limit)


def _replace_keyed(
    items: Any, attr: str, key: str, value: Any, fields: Callable[[Any], dict[str, Any]]
) -> None:
    """Replace the entry with this key in place (order kept), append it, or remove it."""
    index = None
    for i, item in enumerate(items):
        if getattr(item, attr) == key:
            index = i
            break
    if value is REMOVE:
        if index is not None:
            del items[index]
        return
    if index is None:
        items.add(**fields(value))  # made in place: no message built and copied in
    else:
        items[index].CopyFrom(type(items[index])(**fields(value)))


def _device_fields(device: Device) -> dict[str, Any]:
    return {
        "container_path": device.container_path,
        "host_path": device.host_path,
        "permissions": device.permissions,
    }


def _mount_fields(mount: Mount) -> dict[str, Any]:
    return {
        "container_path": mount.container_path,
        "host_path": mount.host_path,
        "readonly": mount.readonly,
        "selinux_relabel": mount.selinux_relabel,
        "propagation": _PROPAGATION[mount.propagation],
    }


def _cdi_fields(name: str) -> dict[str, Any]:
    return {"name": name}


_KEYED: dict[Field, tuple[str, str, Callable[[Any], dict[str, Any]]]] = {
    Field.DEVICE: ("devices", "container_path", _device_fields),
    Field.MOUNT: ("mounts", "container_path", _mount_fields),
    Field.CDI_DEVICE: ("CDI_devices", "name", _cdi_fields),
}
"""ContainerConfig's repeated fields whose entries are keyed: the field, the entry's key
field, and the entry's fields from an adjustment's value."""


def _set_env(envs: Any, name: str, value: Any) -> None:
    """Env is an ordered list that may repeat a name: a set rewrites every occurrence in
    place (the order kubelet sent is kept), or appends; a remove drops every occurrence."""
    if value is REMOVE:
        keep = [kv for kv in envs if kv.key != name]
        del envs[:]
        envs.extend(keep)
        return
    found = False
    for kv in envs:
        if kv.key == name:
            kv.value = value
            found = True
    if not found:
        envs.add(key=name, value=value)
