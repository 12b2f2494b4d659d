"""Adjustments: what a hook asks to change, as a typed delta with explicit presence.

A hook never edits the request. It returns an Adjustment naming each field it sets (or
removes); a field it does not name is untouched, so "unset" and "zero" never mix. Keyed fields
(a label, an env variable, a mount by container path, ...) are owned key by key, so two hooks
may add different annotations but not the same one.

    adj = Adjustment().set_cpuset_cpus("2-3").set_annotation("example.com/pinned", "true")
    adj.update_container("c0ffee...", ResourceDelta(cpuset_cpus="0-1,4-7"))
    adj.because("2 exclusive CPUs: Guaranteed, whole CPUs")

An update that concerns a whole group of containers (every container on a shared pool) is
one `GroupUpdate` (`update_group`): crihook walks its members after the call's answer and
asks it for each container's resources only when it sends them, so the hook's call costs
the same however many containers the group holds.

`because` attaches a short reason: which rule decided. It changes nothing in the request; the
recording keeps it next to the hook's verdict and `crihook replay --explain HOOK` shows it.
An empty Adjustment with a reason says why the hook set nothing.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import ItemsView, Iterator, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Protocol

from crihook.hooks.spec.limits import value_problem

__all__ = [
    "REMOVE",
    "RESOURCE_FIELDS",
    "Adjustment",
    "ContainerUpdate",
    "Device",
    "Field",
    "FieldKey",
    "GroupUpdate",
    "Mount",
    "ResourceDelta",
    "describe_key",
    "parse_key",
]


class Field(enum.Enum):
    CGROUP_PARENT = "cgroup_parent"
    LABEL = "label"
    ANNOTATION = "annotation"
    CPUSET_CPUS = "cpuset_cpus"
    CPUSET_MEMS = "cpuset_mems"
    CPU_SHARES = "cpu_shares"
    CPU_QUOTA = "cpu_quota"
    CPU_PERIOD = "cpu_period"
    MEMORY_LIMIT = "memory_limit_in_bytes"
    MEMORY_SWAP_LIMIT = "memory_swap_limit_in_bytes"
    HUGEPAGE_LIMIT = "hugepage_limit"
    UNIFIED = "unified"
    OOM_SCORE_ADJ = "oom_score_adj"
    DEVICE = "device"
    MOUNT = "mount"
    ENV = "env"
    CDI_DEVICE = "cdi_device"

    __hash__ = object.__hash__  # singletons: cheap identity hashing for the field-key dicts


# Fields of LinuxContainerResources.
RESOURCE_FIELDS = frozenset(
    {
        Field.CPUSET_CPUS,
        Field.CPUSET_MEMS,
        Field.CPU_SHARES,
        Field.CPU_QUOTA,
        Field.CPU_PERIOD,
        Field.MEMORY_LIMIT,
        Field.MEMORY_SWAP_LIMIT,
        Field.HUGEPAGE_LIMIT,
        Field.UNIFIED,
        Field.OOM_SCORE_ADJ,
    }
)
KEYED_FIELDS = frozenset(
    {
        Field.LABEL,
        Field.ANNOTATION,
        Field.HUGEPAGE_LIMIT,
        Field.UNIFIED,
        Field.DEVICE,
        Field.MOUNT,
        Field.ENV,
        Field.CDI_DEVICE,
    }
)
_FIELD_NAMES = {f: f.value for f in Field}

FieldKey = tuple[Field, str]
"""(field, key); the key is "" for scalar fields."""


class _Remove:
    """Marks a keyed field for removal."""

    _instance: _Remove | None = None

    def __new__(cls) -> _Remove:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REMOVE"


REMOVE: Any = _Remove()
_SECRET = "<redacted>"


def describe_key(key: FieldKey) -> str:
    """`annotation "a/b"`, `cpuset_cpus`: how a field is named in errors and the audit."""
    field, name = key
    label = _FIELD_NAMES[field]  # Enum's .value is a slow descriptor; this is on the call path
    return f"{label} {name!r}" if field in KEYED_FIELDS else label


def parse_key(text: str) -> FieldKey:
    """The field key `describe_key` named, back (a recording's adjustment, read by a replay):
    `cpuset_cpus` → (CPUSET_CPUS, ""), `annotation 'a/b'` → (ANNOTATION, "a/b"). ValueError
    for a text `describe_key` never writes."""
    label, _, rest = text.partition(" ")
    try:
        field = Field(label)
    except ValueError:
        raise ValueError(f"{text!r} names no adjustment field") from None
    if field not in KEYED_FIELDS:
        if rest:
            raise ValueError(f"{text!r}: {label} takes no key")
        return (field, "")
    try:  # the key as repr() wrote it: a string literal, nothing else is evaluated
        name = ast.literal_eval(rest)
    except (ValueError, SyntaxError):
        name = None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{text!r}: {label} needs a quoted key, like {label} 'name'")
    return (field, name)


@dataclass(frozen=True)
class Device:
    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    readonly: bool = False
    propagation: str = "private"  # private | rslave | rshared
    selinux_relabel: bool = False


@dataclass(frozen=True)
class ResourceDelta:
    """Resources to change on another running container; None leaves a field as it is."""

    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    cpu_shares: int | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    memory_limit_in_bytes: int | None = None
    memory_swap_limit_in_bytes: int | None = None

    def __post_init__(self) -> None:
        for name, value in self.items():  # what the runtime would refuse, refused here
            if not name.startswith("cpuset_"):
                _resource(name, value)

    def items(self) -> Iterator[tuple[str, Any]]:
        for name in _DELTA_NAMES:  # (dataclasses.fields() per call: a third of the cost)
            value = getattr(self, name)
            if value is not None:
                yield name, value


_DELTA_NAMES = tuple(f.name for f in fields(ResourceDelta))


@dataclass(frozen=True)
class ContainerUpdate:
    """An UpdateContainerResources crihook sends for a hook after the call succeeds."""

    container_id: str
    resources: ResourceDelta


class GroupUpdate(Protocol):
    """An update to every container of a group (the containers of a shared pool), worked out
    per container only when crihook sends it, from the hook's state as it is then: a
    container due several of a group's updates before one went out gets the newest only.

    `key` names the group within its hook: a newer update of the same group overtakes an
    older one. `fields` are the ResourceDelta fields it may set (checked against the hook's
    grants once, not per container)."""

    @property
    def key(self) -> str: ...

    @property
    def fields(self) -> frozenset[str]: ...

    def members(self) -> list[str]:
        """The ids of the containers it concerns now (walked in the background)."""
        ...

    def delta(self, container_id: str) -> ResourceDelta | None:
        """What the container is due now; None when it is not (or no longer) a member."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the recording and `repr` show of it (a few values, never one per member)."""
        ...


class Adjustment:
    """A hook's requested changes. Builder methods return self, so calls chain."""

    __slots__ = ("_changes", "_groups", "_reason", "_updates")

    def __init__(self) -> None:
        self._changes: dict[FieldKey, Any] = {}
        self._updates: list[ContainerUpdate] = []
        self._groups: list[GroupUpdate] = []
        self._reason = ""

    # --- reading -----------------------------------------------------------------------
    @property
    def changes(self) -> Mapping[FieldKey, Any]:
        return MappingProxyType(self._changes)

    def change_items(self) -> ItemsView[FieldKey, Any]:
        """(field key, value) pairs, read-only; cheaper than `changes.items()`."""
        return self._changes.items()

    @property
    def updates(self) -> tuple[ContainerUpdate, ...]:
        return tuple(self._updates)

    @property
    def groups(self) -> tuple[GroupUpdate, ...]:
        return tuple(self._groups)

    @property
    def reason(self) -> str:
        """Why the hook asks for this (which rule decided); "" when it did not say."""
        return self._reason

    def __bool__(self) -> bool:
        return bool(self._changes or self._updates or self._groups)

    def __eq__(self, other: object) -> bool:
        """Same changes and updates (the reason explains them; it is not one of them)."""
        if not isinstance(other, Adjustment):
            return NotImplemented
        return (
            self._changes == other._changes
            and self._updates == other._updates
            and self._groups == other._groups
        )

    def __repr__(self) -> str:
        # What logs show: an env value may be a secret, so only its name is shown.
        parts = [
            f"{describe_key(k)}={_SECRET if k[0] is Field.ENV and v is not REMOVE else repr(v)}"
            for k, v in self._changes.items()
        ]
        parts += [
            f"update {u.container_id[:12]} {dict(u.resources.items())}" for u in self._updates
        ]
        parts += [f"update group {g.key} {g.describe()}" for g in self._groups]
        if self._reason:
            parts.append(f"because {self._reason!r}")
        return f"Adjustment({', '.join(parts)})"

    def _set(self, field: Field, key: str, value: Any) -> Adjustment:
        self._changes[(field, key)] = value
        return self

    # --- why ------------------------------------------------------------------------------
    def because(self, reason: str) -> Adjustment:
        """Attach a short reason (one line: which rule decided, from which signal); a second
        call appends to it with "; "."""
        text = " ".join(_str("reason", reason).split())
        if text:
            self._reason = f"{self._reason}; {text}" if self._reason else text
        return self

    # --- pod ----------------------------------------------------------------------------
    def set_cgroup_parent(self, path: str) -> Adjustment:
        return self._set(Field.CGROUP_PARENT, "", _str("cgroup_parent", path))

    # --- labels / annotations (pod at RunPodSandbox, container at CreateContainer) --------
    def set_label(self, key: str, value: str) -> Adjustment:
        return self._set(Field.LABEL, _key("label", key), _str("label value", value))

    def remove_label(self, key: str) -> Adjustment:
        return self._set(Field.LABEL, _key("label", key), REMOVE)

    def set_annotation(self, key: str, value: str) -> Adjustment:
        return self._set(Field.ANNOTATION, _key("annotation", key), _str("annotation", value))

    def remove_annotation(self, key: str) -> Adjustment:
        return self._set(Field.ANNOTATION, _key("annotation", key), REMOVE)

    # --- resources -------------------------------------------------------------------------
    def set_cpuset_cpus(self, cpus: str) -> Adjustment:
        return self._set(Field.CPUSET_CPUS, "", _str("cpuset_cpus", cpus))

    def set_cpuset_mems(self, mems: str) -> Adjustment:
        return self._set(Field.CPUSET_MEMS, "", _str("cpuset_mems", mems))

    # Each within what the kernel and runc accept (hooks.spec.limits, the rules of crihook's
    # door for kubelet's requests), and narrower where a hook has one way to say it: -1 is
    # the quota's and the swap's "no limit".
    def set_cpu_shares(self, shares: int) -> Adjustment:
        return self._set(Field.CPU_SHARES, "", _resource("cpu_shares", shares, low=0))

    def set_cpu_quota(self, quota: int) -> Adjustment:
        return self._set(Field.CPU_QUOTA, "", _resource("cpu_quota", quota, low=-1))

    def set_cpu_period(self, period: int) -> Adjustment:
        return self._set(Field.CPU_PERIOD, "", _resource("cpu_period", period, low=0))

    def set_memory_limit(self, limit: int) -> Adjustment:
        return self._set(Field.MEMORY_LIMIT, "", _resource("memory_limit_in_bytes", limit, low=0))

    def set_memory_swap_limit(self, limit: int) -> Adjustment:
        return self._set(
            Field.MEMORY_SWAP_LIMIT, "", _resource("memory_swap_limit_in_bytes", limit, low=-1)
        )

    def set_hugepage_limit(self, page_size: str, limit: int) -> Adjustment:
        return self._set(
            Field.HUGEPAGE_LIMIT, _key("hugepage size", page_size), _int("limit", limit, low=0)
        )

    def set_unified(self, key: str, value: str) -> Adjustment:
        return self._set(Field.UNIFIED, _key("unified", key), _str("unified value", value))

    def remove_unified(self, key: str) -> Adjustment:
        return self._set(Field.UNIFIED, _key("unified", key), REMOVE)

    def set_oom_score_adj(self, score: int) -> Adjustment:
        return self._set(Field.OOM_SCORE_ADJ, "", _int("oom_score_adj", score, -1000, 1000))

    # --- devices, mounts, env, CDI (CreateContainer) -------------------------------------
    def add_device(
        self, container_path: str, host_path: str, permissions: str = "rwm"
    ) -> Adjustment:
        if not permissions or set(permissions) - set("rwm"):
            raise ValueError(f"device permissions must be a subset of 'rwm', not {permissions!r}")
        device = Device(
            _path("container_path", container_path), _path("host_path", host_path), permissions
        )
        return self._set(Field.DEVICE, container_path, device)

    def remove_device(self, container_path: str) -> Adjustment:
        return self._set(Field.DEVICE, _path("container_path", container_path), REMOVE)

    def add_mount(
        self,
        container_path: str,
        host_path: str,
        *,
        readonly: bool = False,
        propagation: str = "private",
        selinux_relabel: bool = False,
    ) -> Adjustment:
        if propagation not in ("private", "rslave", "rshared"):
            raise ValueError("mount propagation must be private, rslave or rshared")
        mount = Mount(
            _path("container_path", container_path),
            _path("host_path", host_path),
            readonly,
            propagation,
            selinux_relabel,
        )
        return self._set(Field.MOUNT, container_path, mount)

    def remove_mount(self, container_path: str) -> Adjustment:
        return self._set(Field.MOUNT, _path("container_path", container_path), REMOVE)

    def set_env(self, name: str, value: str | bytes) -> Adjustment:
        raw = value.encode() if isinstance(value, str) else value
        if not isinstance(raw, bytes):
            raise TypeError(f"env value must be str or bytes, not {type(value).__name__}")
        return self._set(Field.ENV, _key("env", name), raw)

    def remove_env(self, name: str) -> Adjustment:
        return self._set(Field.ENV, _key("env", name), REMOVE)

    def add_cdi_device(self, name: str) -> Adjustment:
        return self._set(Field.CDI_DEVICE, _key("cdi device", name), name)

    def remove_cdi_device(self, name: str) -> Adjustment:
        return self._set(Field.CDI_DEVICE, _key("cdi device", name), REMOVE)

    # --- other containers ------------------------------------------------------------------
    def update_container(self, container_id: str, resources: ResourceDelta) -> Adjustment:
        if not container_id:
            raise ValueError("update_container needs a container id")
        if not any(True for _ in resources.items()):
            raise ValueError("update_container needs at least one resource to change")
        self._updates.append(ContainerUpdate(container_id, resources))
        return self

    def update_group(self, group: GroupUpdate) -> Adjustment:
        """Every container of `group`, updated after the call (see `GroupUpdate`)."""
        unknown = group.fields - set(_DELTA_NAMES)
        if not group.fields or unknown:
            raise ValueError(f"update group {group.key!r}: bad fields {sorted(unknown)}")
        self._groups.append(group)
        return self

    # --- raw access, for the plugin protocol and the merge ---------------------------------
    def set_raw(self, key: FieldKey, value: Any) -> Adjustment:
        return self._set(key[0], key[1], value)


def _key(what: str, key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what} key must be a non-empty string")
    return key


def _str(what: str, value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _path(what: str, value: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{what} must be an absolute path, not {value!r}")
    return value


def _int(what: str, value: int, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{what} {value} is out of range [{low}, {high}]")
    return value


def _resource(name: str, value: int, low: int | None = None) -> int:
    """`_int`, then the kernel's and runc's rule for the LinuxContainerResources field."""
    _int(name, value, low)
    problem = value_problem(name, value)
    if problem is not None:
        raise ValueError(f"{name} {value}: {problem}")
    return value
