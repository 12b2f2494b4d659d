"""What a pod asks for, read from its annotations: pure parsers, one per annotation kind.

Each kind has a pod-wide key and one key per container (kubelet passes pod annotations to
the runtime; a container's own annotations are not the user's to set):

    devices.crihook.io/pod, devices.crihook.io/container.<name>
        [{"path": "/dev/fuse"}, {"path": "/dev/kvm", "container_path": "/dev/kvm",
          "permissions": "rw"}]
        `permissions` are `rwm` letters (default `rw`); type, major and minor are read from
        the host, never taken from the annotation.
    mounts.crihook.io/pod, mounts.crihook.io/container.<name>
        {"/srv/models": "/models"}                       host path → container path, read-only
        [{"host_path": "/scratch", "container_path": "/scratch", "readonly": false}]
    env.crihook.io/pod, env.crihook.io/container.<name>
        [{"name": "MODEL_DIR", "value": "/models"}]      in order
    pools.crihook.io/pod, pools.crihook.io/container.<name>
        {"gpu": 2}                                       counts from the node's device pools

Values are JSON. A container gets the pod-wide entries and its own; its own win where both
name the same container path (devices, mounts), variable (env) or pool (pools: a pod-wide
count is what each container gets, so `{"gpu": 0}` of its own keeps a container out). A key
of these kinds that is neither form (`devices.crihook.io/containers.app`) is an error, not
ignored: a typo must not look like a request that was granted.

Every problem raises AnnotationError, whose message names the annotation and the entry
(`annotation devices.crihook.io/container.app [1]: ...`). Nothing here touches the host.
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from crihook.hooks.spec.errors import cut, shown, shown_all

__all__ = [
    "DEVICES",
    "ENV",
    "KINDS",
    "MOUNTS",
    "POOLS",
    "AnnotationError",
    "ContainerAsk",
    "DeviceAsk",
    "EnvAsk",
    "MountAsk",
    "PodAsks",
    "container_ask",
    "parse_device_annotation",
    "parse_env_annotation",
    "parse_mount_annotation",
    "parse_pool_annotation",
]

DEVICES = "devices.crihook.io"
MOUNTS = "mounts.crihook.io"
ENV = "env.crihook.io"
POOLS = "pools.crihook.io"
KINDS = (DEVICES, MOUNTS, ENV, POOLS)

MAX_VALUE_CHARS = 64 * 1024
MAX_ENTRIES = 64
MAX_PATH_BYTES = 4096
MAX_POOL_COUNT = 1024
DEFAULT_PERMISSIONS = "rw"

_CONTAINER_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_POOL_NAME = _CONTAINER_NAME
# Kubernetes' env var names (before its relaxed validation): letters, digits, `_`, `-`, `.`.
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_HOST_KEYS = frozenset({"type", "major", "minor", "uid", "gid", "file_mode"})


class AnnotationError(ValueError):
    """An annotation that does not parse, or asks for something malformed. `key` is the
    annotation, `entry` the JSON index (`[1]`) or key (`["/srv"]`) of the bad entry."""

    def __init__(self, message: str, *, key: str = "", entry: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.entry = entry

    def within(self, key: str) -> AnnotationError:
        return AnnotationError(self.message, key=key, entry=self.entry)

    def __str__(self) -> str:
        where = f"annotation {self.key}" if self.key else "annotation"
        if self.entry:
            where += f" {self.entry}"
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class DeviceAsk:
    path: str
    container_path: str
    permissions: str = DEFAULT_PERMISSIONS
    source: str = ""
    """Where it was asked (`devices.crihook.io/pod [0]`; the entry alone from a parser)."""


@dataclass(frozen=True, slots=True)
class MountAsk:
    host_path: str
    container_path: str
    readonly: bool = True
    source: str = ""


@dataclass(frozen=True, slots=True)
class EnvAsk:
    name: str
    value: str
    source: str = ""


@dataclass(frozen=True)
class ContainerAsk:
    """Everything one container asks for, pod-wide entries and its own merged."""

    devices: tuple[DeviceAsk, ...] = ()
    mounts: tuple[MountAsk, ...] = ()
    env: tuple[EnvAsk, ...] = ()
    pools: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    pools_from: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Pool → the annotation that asked for it."""
    keys: tuple[str, ...] = ()
    """The annotations it came from."""

    def __bool__(self) -> bool:
        return bool(self.devices or self.mounts or self.env or self.pools)


# --- JSON ------------------------------------------------------------------------------------


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise AnnotationError(f"{shown(key)} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise AnnotationError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_constant=_no_constant)


def _load(value: object) -> Any:
    if not isinstance(value, str):
        raise AnnotationError(f"the value is not a string but {type(value).__name__}")
    if len(value) > MAX_VALUE_CHARS:
        raise AnnotationError(f"the value is longer than {MAX_VALUE_CHARS} characters")
    try:
        return _DECODER.decode(value)
    except AnnotationError:
        raise
    except RecursionError:
        raise AnnotationError("the value is nested too deeply") from None
    except ValueError as exc:
        raise AnnotationError(f"the value is not JSON ({exc})") from None


def _entries(doc: Any, what: str) -> list[Any]:
    if not isinstance(doc, list):
        raise AnnotationError(f"expected a JSON list of {what}, got {_kind(doc)}")
    if len(doc) > MAX_ENTRIES:
        raise AnnotationError(f"{len(doc)} entries; at most {MAX_ENTRIES} are allowed")
    return doc


def _kind(doc: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if doc is None:
        return "null"
    if isinstance(doc, int | float) and not isinstance(doc, bool):
        return "a number"
    return names.get(type(doc), type(doc).__name__)


def _object(doc: Any, allowed: frozenset[str], entry: str) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise AnnotationError(f"expected an object, got {_kind(doc)}", entry=entry)
    unknown = sorted(set(doc) - allowed)
    if unknown:
        host = sorted(set(unknown) & _HOST_KEYS)
        if host:
            raise AnnotationError(
                f"{', '.join(host)} cannot be given: crihook reads them from the host",
                entry=entry,
            )
        raise AnnotationError(
            f"unknown key(s) {shown_all(unknown)} (known: {', '.join(sorted(allowed))})",
            entry=entry,
        )
    return doc


def _path(what: str, value: Any, entry: str) -> str:
    """An absolute, normalized path: no `.`/`..`/empty components, no NUL, bounded."""
    if not isinstance(value, str):
        raise AnnotationError(f"{what} must be a string, not {_kind(value)}", entry=entry)
    if not value.startswith("/"):
        raise AnnotationError(f"{what} {shown(value)} is not an absolute path", entry=entry)
    if "\0" in value:
        raise AnnotationError(f"{what} {shown(value)} contains a NUL character", entry=entry)
    if len(value.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise AnnotationError(f"{what} is longer than {MAX_PATH_BYTES} bytes", entry=entry)
    if value == "/" or posixpath.normpath(value) != value or value.startswith("//"):
        raise AnnotationError(
            f"{what} {shown(value)} is not a normalized path below / (no '.', '..', '//' or "
            "'/' at the end)",
            entry=entry,
        )
    return value


# --- the parsers -----------------------------------------------------------------------------


def parse_device_annotation(value: object) -> tuple[DeviceAsk, ...]:
    """`[{"path": ..., "container_path": ..., "permissions": ...}, ...]`."""
    out = []
    seen: set[str] = set()
    for i, doc in enumerate(_entries(_load(value), "device objects")):
        entry = f"[{i}]"
        obj = _object(doc, frozenset({"path", "container_path", "permissions"}), entry)
        if "path" not in obj:
            raise AnnotationError("a device needs a path", entry=entry)
        path = _path("path", obj["path"], entry)
        container_path = _path("container_path", obj.get("container_path", path), entry)
        permissions = obj.get("permissions", DEFAULT_PERMISSIONS)
        if (
            not isinstance(permissions, str)
            or not permissions
            or set(permissions) - set("rwm")
            or len(set(permissions)) != len(permissions)
        ):
            raise AnnotationError(
                f"permissions {shown(permissions)} are not some of the letters r, w, m", entry=entry
            )
        if container_path in seen:
            raise AnnotationError(
                f"container_path {shown(container_path)} is given twice", entry=entry
            )
        seen.add(container_path)
        out.append(DeviceAsk(path, container_path, permissions, entry))
    return tuple(out)


def parse_mount_annotation(value: object) -> tuple[MountAsk, ...]:
    """`{"/host": "/container", ...}` (read-only), or
    `[{"host_path": ..., "container_path": ..., "readonly": true}, ...]`."""
    doc = _load(value)
    out = []
    if isinstance(doc, dict):
        if len(doc) > MAX_ENTRIES:
            raise AnnotationError(f"{len(doc)} entries; at most {MAX_ENTRIES} are allowed")
        for host, target in doc.items():
            entry = f"[{cut(json.dumps(host))}]"
            host_path = _path("host path", host, entry)
            out.append(MountAsk(host_path, _path("container path", target, entry), True, entry))
    else:
        keys = frozenset({"host_path", "container_path", "readonly"})
        for i, item in enumerate(_entries(doc, "mount objects (or an object)")):
            entry = f"[{i}]"
            obj = _object(item, keys, entry)
            if "host_path" not in obj:
                raise AnnotationError("a mount needs a host_path", entry=entry)
            host = _path("host_path", obj["host_path"], entry)
            target = _path("container_path", obj.get("container_path", host), entry)
            readonly = obj.get("readonly", True)
            if not isinstance(readonly, bool):
                raise AnnotationError(
                    f"readonly must be true or false, not {shown(readonly)}", entry=entry
                )
            out.append(MountAsk(host, target, readonly, entry))
    seen: set[str] = set()
    for mount in out:
        if mount.container_path in seen:
            raise AnnotationError(
                f"container path {shown(mount.container_path)} is given twice", entry=mount.source
            )
        seen.add(mount.container_path)
    return tuple(out)


def parse_env_annotation(value: object) -> tuple[EnvAsk, ...]:
    """`[{"name": "A", "value": "b"}, ...]`, in order; a name at most once."""
    out = []
    seen: set[str] = set()
    for i, doc in enumerate(_entries(_load(value), "env objects")):
        entry = f"[{i}]"
        obj = _object(doc, frozenset({"name", "value"}), entry)
        name = obj.get("name")
        if not isinstance(name, str) or len(name) > 256 or not _ENV_NAME.fullmatch(name):
            raise AnnotationError(
                f"name {shown(name)} is not an environment variable name (letters, digits, '_', "
                "'-', '.'; not starting with a digit)",
                entry=entry,
            )
        text = obj.get("value", "")
        if not isinstance(text, str):
            raise AnnotationError(
                f"value of {name} must be a string, not {_kind(text)}", entry=entry
            )
        if "\0" in text:
            raise AnnotationError(f"value of {name} contains a NUL character", entry=entry)
        if name in seen:
            raise AnnotationError(f"{name} is given twice", entry=entry)
        seen.add(name)
        out.append(EnvAsk(name, text, entry))
    return tuple(out)


def parse_pool_annotation(value: object) -> Mapping[str, int]:
    """`{"gpu": 2, ...}`: how many devices of each pool (0: none)."""
    doc = _load(value)
    if not isinstance(doc, dict):
        raise AnnotationError(f'expected an object like {{"gpu": 1}}, got {_kind(doc)}')
    if len(doc) > MAX_ENTRIES:
        raise AnnotationError(f"{len(doc)} pools; at most {MAX_ENTRIES} are allowed")
    out = {}
    for name, count in doc.items():
        entry = f"[{cut(json.dumps(name))}]"
        if not _POOL_NAME.fullmatch(name):
            raise AnnotationError(f"{shown(name)} is not a pool name", entry=entry)
        if isinstance(count, bool) or not isinstance(count, int):
            raise AnnotationError(f"count {shown(count)} is not a whole number", entry=entry)
        if not 0 <= count <= MAX_POOL_COUNT:
            raise AnnotationError(f"count {count} is not in 0..{MAX_POOL_COUNT}", entry=entry)
        out[name] = count
    return MappingProxyType(out)


# --- one container's request -------------------------------------------------------------------


def container_ask(annotations: Mapping[str, str], container: str) -> ContainerAsk:
    """What `container` asks for, from its pod's annotations (empty when nothing). Raises
    AnnotationError naming the annotation and the entry."""
    return PodAsks(annotations).container(container)


class PodAsks:
    """A pod's annotations read once for all of its containers: which keys are pod-wide and
    which are a container's own. Raises AnnotationError for a key of these kinds that is
    neither. `container()` merges them for one container; the pod-wide ask, which every
    container without keys of its own gets, is merged once."""

    __slots__ = ("_annotations", "_own", "_pod", "_pod_wide")

    def __init__(self, annotations: Mapping[str, str]) -> None:
        pod: dict[str, str] = {}
        own: dict[str, dict[str, str]] = {}
        for key in annotations:
            kind, slash, scope = key.partition("/")
            if not slash or kind not in KINDS:
                continue
            if scope == "pod":
                pod[kind] = key
            elif scope.startswith("container."):
                name = scope[len("container.") :]
                if not _CONTAINER_NAME.fullmatch(name):
                    raise AnnotationError(f"{shown(name)} is not a container name", key=key)
                own.setdefault(name, {})[kind] = key
            else:
                raise AnnotationError(
                    f"unknown key: use {kind}/pod or {kind}/container.<name>", key=key
                )
        self._annotations = annotations
        self._pod = pod
        self._own = own
        self._pod_wide: ContainerAsk | None = None

    def container(self, name: str) -> ContainerAsk:
        """What container `name` asks for; AnnotationError naming the annotation and entry."""
        own = self._own.get(name)
        if own is not None:
            return _container_ask(self._annotations, self._pod, own)
        if self._pod_wide is None:  # a refusal is not kept: it is raised again
            self._pod_wide = _container_ask(self._annotations, self._pod, {})
        return self._pod_wide


def _container_ask(
    annotations: Mapping[str, str], pod: Mapping[str, str], own: Mapping[str, str]
) -> ContainerAsk:
    if not pod and not own:
        return _NOTHING
    devices = _merged(annotations, pod.get(DEVICES), own.get(DEVICES), parse_device_annotation)
    mounts = _merged(annotations, pod.get(MOUNTS), own.get(MOUNTS), parse_mount_annotation)
    env = _merged(annotations, pod.get(ENV), own.get(ENV), parse_env_annotation)
    pools: dict[str, int] = {}
    pools_from: dict[str, str] = {}
    for key in (pod.get(POOLS, ""), own.get(POOLS, "")):
        if not key:
            continue
        try:
            asked = _parsed(parse_pool_annotation, annotations[key])
        except AnnotationError as exc:
            raise exc.within(key) from None
        for name, count in asked.items():  # the container's own count replaces the pod's
            pools[name], pools_from[name] = count, key
    for name in [n for n, count in pools.items() if count == 0]:
        del pools[name], pools_from[name]
    return ContainerAsk(
        devices=devices,
        mounts=mounts,
        env=env,
        pools=MappingProxyType(pools) if pools else _EMPTY_POOLS,
        pools_from=MappingProxyType(pools_from),
        keys=tuple(sorted({*pod.values(), *own.values()})),
    )


_NOTHING = ContainerAsk()
_MEMO_CHARS = 4096
_T = TypeVar("_T")


def _parsed(parse: Callable[[object], _T], value: str) -> _T:
    """`parse(value)`, remembered for short values: every container of a pod, and every
    restart, carries the same annotation values (results are immutable; refusals are not
    remembered)."""
    if len(value) > _MEMO_CHARS:
        return parse(value)
    return _memo(parse, value)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=256)
def _memo(parse: Callable[[object], Any], value: str) -> Any:
    return parse(value)


_EMPTY_POOLS: Mapping[str, int] = MappingProxyType({})
_Ask = TypeVar("_Ask", DeviceAsk, MountAsk, EnvAsk)


def _sourced(ask: _Ask, source: str) -> _Ask:
    # Not dataclasses.replace: this runs on every CreateContainer that asks for something.
    if isinstance(ask, DeviceAsk):
        return DeviceAsk(ask.path, ask.container_path, ask.permissions, source)
    if isinstance(ask, MountAsk):
        return MountAsk(ask.host_path, ask.container_path, ask.readonly, source)
    return EnvAsk(ask.name, ask.value, source)


def _merged(
    annotations: Mapping[str, str],
    pod_key: str | None,
    own_key: str | None,
    parse: Callable[[object], tuple[_Ask, ...]],
) -> tuple[_Ask, ...]:
    """Pod-wide entries, then the container's own (which replace those with the same
    container path or name), each marked with the annotation it was asked in."""
    out: dict[str, _Ask] = {}
    for key in (pod_key, own_key):
        if key is None:
            continue
        try:
            parsed = _parsed(parse, annotations[key])
        except AnnotationError as exc:
            raise exc.within(key) from None
        for ask in parsed:
            ident = ask.name if isinstance(ask, EnvAsk) else ask.container_path
            out.pop(ident, None)  # the container's own entry takes the pod-wide one's place
            out[ident] = _sourced(ask, f"{key} {ask.source}")
    return tuple(out.values())
