"""What hooks ask the node and the runtime, noted per call for recordings.

Hooks learn about the node only through seams crihook hands them in `SyncContext`: the host's
processes and cgroups (`Host`, `PodCgroups`), its files (`HostFiles`), where checked host
paths are pinned (`Staging`), its network interfaces (`Netlink`) and the runtime's answers
on the call path (`RuntimeQueries`). While crihook
records, it hands them the wrappers below: each question and its answer (or error) is noted
in the list of the call (or synchronize) being recorded, so a replay can answer the same
questions the same way on another machine. What changes the host (`EFFECTS`) is noted the
same way; a replay compares it, and makes none.

    observed, token = begin()        # the call's list, for this task and its threads
    ... hooks run; ObservedHost/ObservedFiles/ObservedNetlink/... append Observations ...
    end(token)

Blocking seams (netlink) are called from worker threads: asyncio.to_thread copies the
context, so their observations go to the list of the call that started them.

Answers are kept as JSON values: pids and scores as ints, container states by their value,
device nodes as `[kind, major, minor]`, interfaces as `LinkInfo.to_dict()`; an error as
`{"type", "errno"/"code", "message"}`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from crihook.hooks.node import (
    DeviceNode,
    Host,
    HostFiles,
    LinkInfo,
    Netlink,
    NetlinkSession,
    PodCgroups,
    PodLimits,
    Staging,
    WouldBlock,
)
from crihook.hooks.spec import ContainerState, RuntimeQueries
from crihook.proxy.cri.outcome import Observation
from crihook.proxy.cri.runtime import RuntimeCallFailed

__all__ = [
    "EFFECTS",
    "ObservedCgroups",
    "ObservedFiles",
    "ObservedHost",
    "ObservedNetlink",
    "ObservedQueries",
    "ObservedStaging",
    "begin",
    "end",
    "error_doc",
]

_T = TypeVar("_T")

NETLINK_EFFECTS = frozenset({"move_in", "move_out", "create", "delete", "configure", "restore"})
"""What changes network interfaces (seam `netlink`)."""
STAGING_EFFECTS = frozenset({"pin_mount", "pin_device", "release"})
"""What mounts or makes nodes under the staging directory (seam `staging`)."""
EFFECTS = (
    frozenset({"write_oom_score_adj", "unlimit_cpu_quota", "write_pod_limits", "write_qos_cpus"})
    | NETLINK_EFFECTS
    | STAGING_EFFECTS
)
"""Operations that change the host (compared by a replay, not only answered)."""


_CURRENT: contextvars.ContextVar[list[Observation] | None] = contextvars.ContextVar(
    "crihook_observed", default=None
)


def begin() -> tuple[list[Observation], contextvars.Token[list[Observation] | None]]:
    """Start noting observations for the current task (and threads it starts with
    asyncio.to_thread, which copy the context)."""
    observed: list[Observation] = []
    return observed, _CURRENT.set(observed)


def end(token: contextvars.Token[list[Observation] | None]) -> None:
    _CURRENT.reset(token)


def error_doc(exc: BaseException) -> dict[str, Any]:
    """An error a seam raised, as a recording keeps it."""
    if isinstance(exc, RuntimeCallFailed):
        return {"type": "rpc", "code": exc.status.code.name, "message": exc.status.details}
    doc: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, OSError) and exc.errno is not None:
        doc["errno"] = exc.errno
    return doc


def _note(seam: str, op: str, args: list[Any], call: Callable[[], _T], render: Any = None) -> _T:
    observed = _CURRENT.get()
    if observed is None:
        return call()
    try:
        result = call()
    except WouldBlock:
        raise  # not an answer: the hook asks again from a thread, and that one is noted
    except Exception as exc:
        observed.append(Observation(seam, op, args, None, error_doc(exc)))
        raise
    observed.append(Observation(seam, op, args, render(result) if render else result, None))
    return result


async def _note_async(
    seam: str, op: str, args: list[Any], call: Callable[[], Awaitable[_T]], render: Any
) -> _T:
    observed = _CURRENT.get()
    if observed is None:
        return await call()
    try:
        result = await call()
    except Exception as exc:
        observed.append(Observation(seam, op, args, None, error_doc(exc)))
        raise
    observed.append(Observation(seam, op, args, render(result) if render else result, None))
    return result


def _device(node: DeviceNode | None) -> list[Any] | None:
    return None if node is None else [node.kind, node.major, node.minor]


def _link(info: LinkInfo | None) -> dict[str, Any] | None:
    return None if info is None else info.to_dict()


def _links(infos: Sequence[LinkInfo]) -> list[dict[str, Any]]:
    return [info.to_dict() for info in infos]


def _none(_: object) -> None:
    return None


def _states(states: Mapping[str, ContainerState]) -> dict[str, str]:
    return {cid: state.value for cid, state in states.items()}


class ObservedHost:
    """A `Host` whose every question and change is noted."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def container_pids(self, cgroup_parent: str, container_id: str) -> list[int]:
        return _note(
            "host",
            "container_pids",
            [cgroup_parent, container_id],
            lambda: self.host.container_pids(cgroup_parent, container_id),
        )

    def write_oom_score_adj(self, pid: int, score: int) -> None:
        _note(
            "host",
            "write_oom_score_adj",
            [pid, score],
            lambda: self.host.write_oom_score_adj(pid, score),
        )

    def read_oom_score_adj(self, pid: int) -> int:
        return _note("host", "read_oom_score_adj", [pid], lambda: self.host.read_oom_score_adj(pid))

    def unlimit_cpu_quota(self, cgroup_parent: str) -> bool:
        return _note(
            "host",
            "unlimit_cpu_quota",
            [cgroup_parent],
            lambda: self.host.unlimit_cpu_quota(cgroup_parent),
        )


class ObservedCgroups:
    """`PodCgroups` whose every write and read is noted (as the host's: `write_pod_limits`,
    `write_qos_cpus`, `read_qos_cpus`)."""

    def __init__(self, cgroups: PodCgroups) -> None:
        self.cgroups = cgroups

    def write_limits(self, cgroup_parent: str, limits: PodLimits) -> list[str]:
        return _note(
            "host",
            "write_pod_limits",
            [cgroup_parent, limits.to_dict()],
            lambda: self.cgroups.write_limits(cgroup_parent, limits),
        )

    def write_qos_cpus(self, qos_path: str, cpus: str) -> bool:
        return _note(
            "host",
            "write_qos_cpus",
            [qos_path, cpus],
            lambda: self.cgroups.write_qos_cpus(qos_path, cpus),
        )

    def read_qos_cpus(self, qos_path: str) -> str | None:
        return _note(
            "host", "read_qos_cpus", [qos_path], lambda: self.cgroups.read_qos_cpus(qos_path)
        )


class ObservedFiles:
    """A `HostFiles` whose every answer is noted."""

    def __init__(self, files: HostFiles) -> None:
        self.files = files

    def resolve(self, path: str) -> str:
        return _note("files", "resolve", [path], lambda: self.files.resolve(path))

    def device(self, path: str) -> DeviceNode | None:
        return _note("files", "device", [path], lambda: self.files.device(path), _device)

    def nonblocking(self) -> HostFiles:
        return ObservedFiles(self.files.nonblocking())


class ObservedStaging:
    """A `Staging` whose every pin and release is noted (seam `staging`)."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging

    def pin_mount(self, key: str, name: str, path: str, readonly: bool) -> str:
        return _note(
            "staging",
            "pin_mount",
            [key, name, path, readonly],
            lambda: self.staging.pin_mount(key, name, path, readonly),
        )

    def pin_device(self, key: str, name: str, path: str, node: DeviceNode) -> str:
        return _note(
            "staging",
            "pin_device",
            [key, name, path, _device(node)],
            lambda: self.staging.pin_device(key, name, path, node),
        )

    def release(self, key: str) -> None:
        _note("staging", "release", [key], lambda: self.staging.release(key))

    def keys(self) -> list[str]:
        return _note("staging", "keys", [], self.staging.keys)


class ObservedQueries:
    """`RuntimeQueries` whose answers are noted; whatever else the wrapped object offers
    (what crihook itself asks at a synchronize) passes through unobserved."""

    def __init__(self, queries: RuntimeQueries) -> None:
        self.queries = queries

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queries, name)

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        return await _note_async(
            "runtime",
            "container_states",
            [pod_id],
            lambda: self.queries.container_states(pod_id),
            _states,
        )

    async def sandbox_netns(self, pod_id: str) -> str | None:
        return await _note_async(
            "runtime", "sandbox_netns", [pod_id], lambda: self.queries.sandbox_netns(pod_id), None
        )

    async def oom_score_adj(self, container_id: str) -> int | None:
        return await _note_async(
            "runtime",
            "oom_score_adj",
            [container_id],
            lambda: self.queries.oom_score_adj(container_id),
            None,
        )


class ObservedNetlink:
    """A `Netlink` whose every question and change is noted (seam `netlink`): opening a
    session (its error, when the namespace cannot be entered), and each operation in it. What
    acts in the pod's namespace carries the namespace first (`pod_link`: `[netns, name]`);
    what asks or changes the host does not (`host_link`: `[name]`, `restore`)."""

    def __init__(self, netlink: Netlink) -> None:
        self.netlink = netlink

    def exists(self, netns: str) -> bool:
        return _note("netlink", "exists", [netns], lambda: self.netlink.exists(netns))

    @contextlib.contextmanager
    def session(self, netns: str | None) -> Iterator[NetlinkSession]:
        with contextlib.ExitStack() as stack:
            inner: NetlinkSession = _note(
                "netlink",
                "session",
                [netns],
                lambda: stack.enter_context(self.netlink.session(netns)),
                _none,
            )
            yield _ObservedSession(inner, netns)


class _ObservedSession:
    def __init__(self, session: NetlinkSession, netns: str | None) -> None:
        self.session = session
        self.netns = netns

    def host_link(self, name: str) -> LinkInfo | None:
        return _note("netlink", "host_link", [name], lambda: self.session.host_link(name), _link)

    def host_links(self) -> list[LinkInfo]:
        return _note("netlink", "host_links", [], self.session.host_links, _links)

    def pod_link(self, name: str) -> LinkInfo | None:
        return _note(
            "netlink", "pod_link", [self.netns, name], lambda: self.session.pod_link(name), _link
        )

    def pod_links(self) -> list[LinkInfo]:
        return _note("netlink", "pod_links", [self.netns], self.session.pod_links, _links)

    def move_in(self, host_index: int, name: str) -> None:
        _note(
            "netlink",
            "move_in",
            [self.netns, host_index, name],
            lambda: self.session.move_in(host_index, name),
        )

    def move_out(self, name: str, host_name: str) -> None:
        _note(
            "netlink",
            "move_out",
            [self.netns, name, host_name],
            lambda: self.session.move_out(name, host_name),
        )

    def create(self, name: str, kind: str, parent_index: int, mode: str) -> None:
        _note(
            "netlink",
            "create",
            [self.netns, name, kind, parent_index, mode],
            lambda: self.session.create(name, kind, parent_index, mode),
        )

    def delete(self, name: str) -> None:
        _note("netlink", "delete", [self.netns, name], lambda: self.session.delete(name))

    def configure(self, name: str, mtu: int | None, addresses: Sequence[str]) -> None:
        _note(
            "netlink",
            "configure",
            [self.netns, name, mtu, list(addresses)],
            lambda: self.session.configure(name, mtu, addresses),
        )

    def restore(self, index: int, name: str, mtu: int, up: bool) -> None:
        _note(
            "netlink",
            "restore",
            [index, name, mtu, up],
            lambda: self.session.restore(index, name, mtu, up),
        )
