"""The node's policy for the `devices` hook (`[hooks.devices]`), and the check of one
container's request against it.

    [hooks.devices]
    namespaces = ["ml-*"]                       # who may ask at all (globs; default: nobody)
    devices = ["/dev/fuse", "/dev/nvidia-uvm"]  # device nodes pods may ask for by path
    device_permissions = "rw"                   # the most a pod may ask (rwm letters)
    mounts = ["/srv/models", "/srv/models/**"]  # host paths pods may mount read-only
    writable_mounts = ["/scratch/**"]           # ... and read-write
    env = ["MODEL_*", "HTTP_PROXY"]             # variables pods may set by annotation

    [hooks.devices.pools.gpu]                   # devices handed out one container at a time
    env = "GPU_VISIBLE_DEVICES"                 # lists the ids a container was given
    permissions = "rw"
    devices = [
      { id = "0", paths = ["/dev/nvidia0"], numa = 0 },
      { id = "1", path = "/dev/nvidia1", numa = 1 },
    ]

Every list defaults to empty: the default policy allows nothing. Path globs: `*` within one
path component, `**` across components (see `globs`).

A request is checked where it leads on this host: a path must match the allowlist both as
asked and once every symlink, `.` and `..` is resolved. The hook then pins what the resolved
path is (`crihook.hooks.node.staging`): the runtime is given a staged copy, which a later
swap of the host path cannot change. A device must be a character or block device node (a
directory would give the container every device below it); its type, major and minor are
the host's. A pooled device is never given by path, only through its pool. A refusal says
what was refused and why: malformed or missing → InvalidRequest (INVALID_ARGUMENT), not
allowed → Forbidden (PERMISSION_DENIED).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from crihook.hooks.devices.annotations import (
    POOLS,
    ContainerAsk,
    DeviceAsk,
    EnvAsk,
    MountAsk,
)
from crihook.hooks.devices.host import DeviceNode, HostFiles
from crihook.hooks.node.globs import GlobSet, compile_path_glob
from crihook.hooks.spec import Forbidden, InvalidRequest
from crihook.hooks.spec.options import reject_unknown

__all__ = [
    "DevicePolicy",
    "Granted",
    "Pool",
    "PoolDevice",
    "PooledIndex",
    "check_ask",
    "parse_policy",
]

_KEYS = frozenset(
    {"namespaces", "devices", "device_permissions", "mounts", "writable_mounts", "env", "pools"}
)
_POOL_KEYS = frozenset({"env", "permissions", "devices"})
_DEVICE_KEYS = frozenset({"id", "path", "paths", "numa"})
_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")


@dataclass(frozen=True)
class PoolDevice:
    id: str
    paths: tuple[str, ...]
    numa: int | None = None
    """Its NUMA node; None: unknown (it aligns with nothing)."""


@dataclass(frozen=True)
class Pool:
    name: str
    devices: tuple[PoolDevice, ...]
    env: str | None = None
    permissions: str = "rw"

    @cached_property
    def by_id(self) -> Mapping[str, PoolDevice]:
        return MappingProxyType({d.id: d for d in self.devices})

    @cached_property
    def aligned(self) -> bool:
        """Some device has a NUMA node: the pool offers NUMA hints."""
        return any(d.numa is not None for d in self.devices)


@dataclass(frozen=True)
class DevicePolicy:
    namespaces: GlobSet = field(default_factory=GlobSet)
    devices: GlobSet = field(default_factory=GlobSet)
    device_permissions: str = "rw"
    mounts: GlobSet = field(default_factory=GlobSet)
    writable_mounts: GlobSet = field(default_factory=GlobSet)
    env: GlobSet = field(default_factory=GlobSet)
    pools: Mapping[str, Pool] = field(default_factory=lambda: MappingProxyType({}))

    @cached_property
    def pool_env(self) -> Mapping[str, str]:
        """Env var → the pool that sets it."""
        return MappingProxyType({p.env: p.name for p in self.pools.values() if p.env})


def parse_policy(options: Mapping[str, Any]) -> DevicePolicy:
    """`[hooks.devices]` as a DevicePolicy; ValueError naming the option."""
    reject_unknown("devices", options, _KEYS)
    namespaces = _globs(options, "namespaces", GlobSet.of_names)
    devices = _globs(options, "devices", GlobSet.of_paths)
    mounts = _globs(options, "mounts", GlobSet.of_paths)
    writable = _globs(options, "writable_mounts", GlobSet.of_paths)
    env = _globs(options, "env", GlobSet.of_names)
    permissions = _permissions("device_permissions", options.get("device_permissions", "rw"))
    pools = _pools(options.get("pools", {}))
    return DevicePolicy(
        namespaces=namespaces,
        devices=devices,
        device_permissions=permissions,
        mounts=mounts,
        writable_mounts=writable,
        env=env,
        pools=MappingProxyType(pools),
    )


def _globs(options: Mapping[str, Any], key: str, build: Callable[[list[str]], GlobSet]) -> GlobSet:
    value = options.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"devices: {key} must be a list of strings (globs)")
    try:
        return build(value)
    except ValueError as exc:
        raise ValueError(f"devices: {key}: {exc}") from None


def _permissions(what: str, value: object) -> str:
    if (
        not isinstance(value, str)
        or not value
        or set(value) - set("rwm")
        or len(set(value)) != len(value)
    ):
        raise ValueError(f"devices: {what} {value!r} is not some of the letters r, w, m")
    return value


def _pools(table: object) -> dict[str, Pool]:
    if not isinstance(table, Mapping):
        raise ValueError("devices: pools must be a table of pool name = { devices = [...] }")
    pools: dict[str, Pool] = {}
    owner: dict[str, str] = {}
    envs: dict[str, str] = {}
    for name, doc in table.items():
        where = f"devices: pools.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{where}: not a pool name (lowercase letters, digits, '-')")
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where} must be a table")
        unknown = sorted(set(doc) - _POOL_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
        env = doc.get("env")
        if env is not None and (not isinstance(env, str) or not _ENV_NAME.fullmatch(env)):
            raise ValueError(f"{where}.env: {env!r} is not an environment variable name")
        if env is not None and env in envs:
            raise ValueError(f"{where}.env: {env} is the env of pool {envs[env]} too")
        permissions = _permissions(f"pools.{name}.permissions", doc.get("permissions", "rw"))
        entries = doc.get("devices")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{where}.devices must be a non-empty list of {{ id, path, numa }}")
        devices = []
        ids: set[str] = set()
        for i, entry in enumerate(entries):
            device = _pool_device(f"{where}.devices[{i}]", entry)
            if device.id in ids:
                raise ValueError(f"{where}.devices[{i}]: id {device.id!r} is there twice")
            ids.add(device.id)
            for path in device.paths:
                if path in owner:
                    raise ValueError(
                        f"{where}.devices[{i}]: {path} is a device of {owner[path]} already"
                    )
                owner[path] = f"pool {name} (id {device.id})"
            devices.append(device)
        if env is not None:
            envs[env] = name
        pools[name] = Pool(name, tuple(devices), env, permissions)
    return pools


def _pool_device(where: str, entry: object) -> PoolDevice:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a table {{ id, path, numa }}")
    unknown = sorted(set(entry) - _DEVICE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    ident = entry.get("id")
    if isinstance(ident, int) and not isinstance(ident, bool):
        ident = str(ident)
    if not isinstance(ident, str) or not _ID.fullmatch(ident):
        raise ValueError(f"{where}: id {ident!r} is not a device id (letters, digits, _.:-)")
    if ("path" in entry) == ("paths" in entry):
        raise ValueError(f"{where}: give path or paths (one of them)")
    paths = [entry["path"]] if "path" in entry else entry["paths"]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise ValueError(f"{where}: paths must be a non-empty list of device paths")
    for path in paths:
        try:
            if any(c in path for c in "*?["):
                raise ValueError(f"{path!r} is a glob; a pooled device is one path")
            compile_path_glob(path)  # absolute and normalized
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if len(set(paths)) != len(paths):
        raise ValueError(f"{where}: a path is listed twice")
    numa = entry.get("numa")
    if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
        raise ValueError(f"{where}: numa {numa!r} is not a NUMA node number")
    return PoolDevice(ident, tuple(paths), numa)


# --- checking one container's request ----------------------------------------------------------


@dataclass(frozen=True)
class PooledIndex:
    """The pools' device nodes as found on the host (refreshed at synchronize): a device
    asked for by path is refused if it is one of them, whatever path leads to it."""

    by_path: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Resolved path → (pool, id)."""
    by_node: Mapping[DeviceNode, tuple[str, str]] = field(default_factory=dict)

    def find(self, path: str, node: DeviceNode) -> tuple[str, str] | None:
        return self.by_path.get(path) or self.by_node.get(node)


@dataclass(frozen=True)
class Granted:
    """What a request may have, as the runtime will be given it."""

    devices: tuple[tuple[DeviceAsk, str, DeviceNode], ...] = ()
    """Each device with its resolved host path and the node found there."""
    mounts: tuple[tuple[MountAsk, str], ...] = ()
    env: tuple[EnvAsk, ...] = ()


def check_ask(
    policy: DevicePolicy,
    namespace: str,
    ask: ContainerAsk,
    files: HostFiles,
    pooled: PooledIndex,
) -> Granted:
    """`ask` checked against the policy and the host, or the first refusal (Forbidden,
    InvalidRequest) naming the annotation, the entry and what to change."""
    if not policy.namespaces.matches(namespace):
        raise Forbidden(
            f"namespace {namespace!r} may not ask for devices, mounts or env "
            f"({', '.join(ask.keys)}): [hooks.devices] namespaces allows "
            f"{policy.namespaces.describe()}"
        )
    devices = tuple((d, *_check_device(policy, d, files, pooled)) for d in ask.devices)
    mounts = tuple((m, _check_mount(policy, m, files)) for m in ask.mounts)
    reserved = policy.pool_env
    for entry in ask.env:
        if entry.name in reserved:
            raise Forbidden(
                f"{entry.source}: {entry.name} is set by pool {reserved[entry.name]} (the ids "
                f"a container is given); ask for devices with {POOLS}/container.<name>"
            )
        if not policy.env.matches(entry.name):
            raise Forbidden(
                f"{entry.source}: env {entry.name} is not allowed ([hooks.devices] env allows "
                f"{policy.env.describe()})"
            )
    return Granted(devices, mounts, ask.env)


def _resolve(files: HostFiles, path: str, source: str, what: str) -> str:
    try:
        return files.resolve(path)
    except FileNotFoundError:
        raise InvalidRequest(f"{source}: {what} {path} does not exist on this node") from None
    except OSError as exc:
        raise InvalidRequest(
            f"{source}: {what} {path} cannot be resolved: {exc.strerror or exc}"
        ) from None


def _check_device(
    policy: DevicePolicy, ask: DeviceAsk, files: HostFiles, pooled: PooledIndex
) -> tuple[str, DeviceNode]:
    path = ask.path
    allowed = policy.devices
    if not allowed.matches(path):
        raise Forbidden(
            f"{ask.source}: device {path} is not allowed ([hooks.devices] devices allows "
            f"{allowed.describe()})"
        )
    resolved = _resolve(files, path, ask.source, "device")
    if resolved != path and not allowed.matches(resolved):
        raise Forbidden(
            f"{ask.source}: device {path} leads to {resolved}, which is not allowed "
            f"([hooks.devices] devices allows {allowed.describe()})"
        )
    try:
        node = files.device(resolved)
    except FileNotFoundError:
        raise InvalidRequest(f"{ask.source}: device {path} does not exist on this node") from None
    except OSError as exc:
        raise InvalidRequest(f"{ask.source}: device {path}: {exc.strerror or exc}") from None
    if node is None:
        raise InvalidRequest(
            f"{ask.source}: {path} is not a character or block device node on this node"
        )
    owner = pooled.find(resolved, node)
    if owner is not None:
        raise Forbidden(
            f"{ask.source}: {path} ({node}) is device {owner[1]} of pool {owner[0]}: pooled "
            f"devices are given one container at a time, ask with {POOLS}/container.<name>"
        )
    extra = set(ask.permissions) - set(policy.device_permissions)
    if extra:
        raise Forbidden(
            f"{ask.source}: permissions {ask.permissions!r} on {path}: at most "
            f"{policy.device_permissions!r} ([hooks.devices] device_permissions)"
        )
    return resolved, node


def _check_mount(policy: DevicePolicy, ask: MountAsk, files: HostFiles) -> str:
    path = ask.host_path
    writable = policy.writable_mounts
    allowed: Sequence[GlobSet] = (writable,) if not ask.readonly else (policy.mounts, writable)
    how = "read-only" if ask.readonly else "read-write"
    described = (
        f"writable_mounts allows {writable.describe()}"
        if not ask.readonly
        else f"mounts allows {policy.mounts.describe()}, writable_mounts {writable.describe()}"
    )
    if not any(g.matches(path) for g in allowed):
        raise Forbidden(
            f"{ask.source}: mounting {path} {how} is not allowed ([hooks.devices] {described})"
        )
    resolved = _resolve(files, path, ask.source, "host path")
    if resolved != path and not any(g.matches(resolved) for g in allowed):
        raise Forbidden(
            f"{ask.source}: host path {path} leads to {resolved}, which is not allowed {how} "
            f"([hooks.devices] {described})"
        )
    return resolved
