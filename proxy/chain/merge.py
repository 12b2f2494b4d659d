"""Applies hook adjustments to a CRI request, field by field, recording who owns what.

The chain calls `Merger.add(hook, adjustment)` after each hook, in chain order; the request is
changed in place so the next hook sees it as adjusted so far. A second hook touching a field
another hook owns is a conflict: an error naming both (the default), or decided by the
configured precedence (earlier in the list wins).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.adjustment import (
    REMOVE,
    Adjustment,
    ContainerUpdate,
    Device,
    Field,
    FieldKey,
    GroupUpdate,
    Mount,
    describe_key,
)
from crihook.hooks.spec.events import Event
from crihook.proxy.cri.events import EVENTS, EventSpec
from crihook.proxy.cri.values import jsonable
from crihook.proxy.errors import HookConflict, HookInvalidAdjustment

__all__ = [
    "Audit",
    "Merged",
    "Merger",
    "PendingGroup",
    "PendingUpdate",
    "apply_change",
    "next_order",
    "stamp",
]

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


class PendingGroup(NamedTuple):
    """An update to a group of containers a hook asked for (`GroupUpdate`), not sent yet."""

    hook: str
    group: GroupUpdate
    seq: int


def next_order() -> int:
    """The next number in the order updates are produced (a call that sets resources itself
    takes one too: what it set is newer than any update numbered before)."""
    return next(_ORDER)


def stamp(hook: str, updates: Iterable[ContainerUpdate]) -> list[PendingUpdate]:
    """Updates a hook returned just now, numbered in the order hooks produced them."""
    return [PendingUpdate(hook, u, next(_ORDER)) for u in updates]


Audit = dict[str, dict[str, Any]]
"""The store's audit entries of one call, by field (or `refused <hook>`)."""


class Merged(Protocol):
    """What a stage's merge tells the pipeline (a `Merger` is one): what changed, what was
    not applied, the updates to send, and who set what (for the audit and the read-back).
    The merging itself, and who owns what while it goes on, stay the chain's."""

    @property
    def changed(self) -> bool:
        """Some hook's adjustment was applied to the request."""
        ...

    @property
    def unapplied(self) -> Mapping[str, str]:
        """Hook → why its adjustment was not applied (dry-run, an ignored failure)."""
        ...

    @property
    def updates(self) -> Sequence[PendingUpdate]: ...

    @property
    def groups(self) -> Sequence[PendingGroup]: ...

    def audit(self) -> Audit:
        """Per field, who set it to what; the changes refused; empty when neither."""
        ...

    def changed_fields(self) -> set[Field]: ...

    def owned(self) -> tuple[Mapping[FieldKey, str], Mapping[FieldKey, Any]]:
        """Who set each field, and to what (the read-back compares them with the runtime)."""
        ...


class Merger:
    """Merges the adjustments of one call. One instance per intercepted call."""

    def __init__(
        self, event: Event, request: Message, conflict: str, precedence: Sequence[str]
    ) -> None:
        self.event = event
        self.request = request
        self._spec = EVENTS[event]
        self._conflict = conflict
        self._rank = {name: i for i, name in enumerate(precedence)} if precedence else {}
        self.owners: dict[FieldKey, str] = {}
        self.values: dict[FieldKey, Any] = {}
        self.updates: list[PendingUpdate] = []
        self.groups: list[PendingGroup] = []
        self.unapplied: dict[str, str] = {}
        """Hook → why its adjustment was not applied (dry-run, an ignored failure)."""
        self.refused: list[dict[str, Any]] = []
        """Changes hooks were not permitted to make ({hook, fields}), for the audit."""
        self.refused_answers: dict[str, Adjustment] = {}
        """Hook → the adjustment the chain refused (invalid, not permitted), for the trace:
        a recording keeps what the hook asked, so a replay can ask it again."""
        self._parts: dict[str, Any] = {}
        """The parts of the request this call's hooks changed (`_part`), kept: found once."""

    @property
    def changed(self) -> bool:
        return bool(self.owners)

    def changed_fields(self) -> set[Field]:
        return {key[0] for key in self.owners}

    def owned(self) -> tuple[Mapping[FieldKey, str], Mapping[FieldKey, Any]]:
        return self.owners, self.values

    def audit(self) -> Audit:
        """The store's audit entries of this call: per field, who set it to what (hook,
        field and value, plus the call), built directly: this runs on every adjusted call.
        Changes a hook was not permitted to make are kept too, as `refused <hook>`."""
        if not (self.owners or self.refused):
            return {}
        now, name, values = time.time(), self.event.value, self.values
        entries = {}
        for key, hook in self.owners.items():
            label = describe_key(key)
            value = jsonable(values[key])
            entries[label] = {
                "hook": hook,
                "field": label,
                "value": value,
                "event": name,
                "at": now,
            }
        for refusal in self.refused:
            hook = refusal["hook"]
            entries[f"refused {hook}"] = {
                "hook": hook,
                "refused": refusal["fields"],
                "event": name,
                "at": now,
            }
        return entries

    def validate(self, hook: str, adjustment: Adjustment, post: bool) -> None:
        """Refuse fields the call cannot carry, before anything is applied."""
        allowed = frozenset() if post else self._spec.fields
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
        owners, values = self.owners, self.values
        changes: Iterable[tuple[FieldKey, Any]] = adjustment.change_items()
        if owners:  # the first adjustment of a call cannot conflict: nothing to check
            changes = self._winners(hook, base_name, changes)
        for key, value in changes:
            self._apply(key, value)
            owners[key] = hook
            values[key] = value
        updates = adjustment.updates
        if updates:
            self.updates.extend(stamp(hook, updates))
        for group in adjustment.groups:
            self.groups.append(PendingGroup(hook, group, next(_ORDER)))

    def _winners(
        self, hook: str, base_name: str, changes: Iterable[tuple[FieldKey, Any]]
    ) -> list[tuple[FieldKey, Any]]:
        """The changes `hook` wins (a field another hook owns and keeps is left out);
        HookConflict for the first it may not make."""
        winners = []
        for key, value in changes:
            owner = self.owners.get(key)
            if owner is None or owner == hook or self._wins(base_name, owner):
                winners.append((key, value))
            elif self._conflict != "precedence" or not self._ranked(owner):
                raise HookConflict(describe_key(key), owner, hook)
        return winners

    def _apply(self, key: FieldKey, value: Any) -> None:
        field = key[0]
        name = _PARTS[field]
        part = self._parts.get(name)
        if part is None:
            part = self._parts[name] = _part(self._spec, self.request, name)
        _WRITERS[field](part, key[1], value)

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
#
# A change is written into one part of the request (a map, a message or a keyed list): the
# part is found with `_part` and written with the field's `_WRITERS` function. A Merger keeps
# each part it found for the rest of its call: finding one walks down several messages, each
# step a protobuf object made.

_Writer = Callable[[Any, str, Any], None]
"""Writes (key, value) into the part of the request a field lives in."""


def _part(spec: EventSpec, request: Any, part: str) -> Any:
    """The part of the request named `part` (a `_PARTS` value); where the resources and the
    labels and annotations are is the call's (`EventSpec.resources`, `.labels`, ...)."""
    if part in _LISTS:
        return _Entries(getattr(request.config, part), _LISTS[part])
    if part == "labels":
        return spec.labels(request)  # type: ignore[misc]  # a call hooks may label
    if part == "annotations":
        return spec.annotations(request)  # type: ignore[misc]
    if part == "linux":
        return request.config.linux
    resources = spec.resources(request)  # type: ignore[misc]  # a call with resources
    return resources.unified if part == "unified" else resources


def apply_change(event: Event, request: Any, key: FieldKey, value: Any) -> None:
    """Write one field into the request (a protobuf message, changed in place)."""
    field, name = key
    _WRITERS[field](_part(EVENTS[event], request, _PARTS[field]), name, value)


def _set_map(target: Any, name: str, value: Any) -> None:
    if value is REMOVE:
        target.pop(name, None)
    else:
        target[name] = value


def _setter(attr: str) -> _Writer:
    def write(target: Any, _name: str, value: Any) -> None:
        setattr(target, attr, value)

    return write


def _set_hugepage(resources: Any, page_size: str, limit: int) -> None:
    for entry in resources.hugepage_limits:
        if entry.page_size == page_size:
            entry.limit = limit
            return
    resources.hugepage_limits.add(page_size=page_size, limit=limit)


class _Entries:
    """One of ContainerConfig's keyed lists (devices, mounts, env, CDI devices) with its
    entries' keys beside it, in the same order. Reading a key costs a protobuf object per
    entry: a Merger reads them once, when its call first changes the list, and every write
    changes both lists alike, so a call's changes do not scan the list once each."""

    __slots__ = ("items", "key_attr", "keys")

    def __init__(self, items: Any, key_attr: str) -> None:
        self.items = items
        self.key_attr = key_attr
        # kubelet often sends no devices: even an empty list costs a comprehension its frame
        self.keys: list[str] = [getattr(item, key_attr) for item in items] if items else []

    def append(self, fields: dict[str, Any]) -> None:
        self.items.add(**fields)  # made in place: no message built and copied in
        self.keys.append(fields[self.key_attr])

    def replace(self, position: int, fields: dict[str, Any]) -> None:
        item = self.items[position]
        item.CopyFrom(type(item)(**fields))
        self.keys[position] = fields[self.key_attr]  # set_raw may key it by another path

    def delete(self, position: int) -> None:
        del self.items[position]
        del self.keys[position]


def _keyed_writer(fields: Callable[[Any], dict[str, Any]]) -> _Writer:
    """A device's, mount's or CDI device's writer: replace the first entry with this key in
    place (order kept), append it, or remove it."""

    def write(entries: _Entries, key: str, value: Any) -> None:
        keys = entries.keys
        position = keys.index(key) if key in keys else None
        if value is REMOVE:
            if position is not None:
                entries.delete(position)
        elif position is None:
            entries.append(fields(value))
        else:
            entries.replace(position, fields(value))

    return write


def _set_env(entries: _Entries, name: str, value: Any) -> None:
    """Env is an ordered list that may repeat a name: a set rewrites every occurrence in
    place (the order kubelet sent is kept), or appends; a remove drops every occurrence."""
    keys = entries.keys
    if name not in keys:
        if value is not REMOVE:
            entries.append({"key": name, "value": value})
        return
    at = [i for i, key in enumerate(keys) if key == name]
    if value is REMOVE:
        for position in reversed(at):
            entries.delete(position)
    else:
        for position in at:
            entries.items[position].value = value


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

_LISTS = {
    "devices": "container_path",
    "mounts": "container_path",
    "CDI_devices": "name",
    "envs": "key",
}
"""ContainerConfig's keyed lists, and the field that keys their entries."""

_PARTS: dict[Field, str] = {
    Field.LABEL: "labels",
    Field.ANNOTATION: "annotations",
    Field.CGROUP_PARENT: "linux",
    **dict.fromkeys(_SCALAR_RESOURCES, "resources"),
    Field.HUGEPAGE_LIMIT: "resources",
    Field.UNIFIED: "unified",
    Field.DEVICE: "devices",
    Field.MOUNT: "mounts",
    Field.CDI_DEVICE: "CDI_devices",
    Field.ENV: "envs",
}
"""The part of the request each field is written into (see `_part`)."""

_WRITERS: dict[Field, _Writer] = {
    Field.LABEL: _set_map,
    Field.ANNOTATION: _set_map,
    Field.CGROUP_PARENT: _setter("cgroup_parent"),
    **{field: _setter(attr) for field, attr in _SCALAR_RESOURCES.items()},
    Field.HUGEPAGE_LIMIT: _set_hugepage,
    Field.UNIFIED: _set_map,
    Field.DEVICE: _keyed_writer(_device_fields),
    Field.MOUNT: _keyed_writer(_mount_fields),
    Field.CDI_DEVICE: _keyed_writer(_cdi_fields),
    Field.ENV: _set_env,
}
