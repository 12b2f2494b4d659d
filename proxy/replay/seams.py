"""The runtime and the node as a replay sees them: answers from the recording, never from
this machine.

- `RecordedRuntime` answers the call being replayed with what the runtime answered in the
  recording (its response, or its error status), the updates crihook sends with what the
  runtime answered to them, and anything the recording does not have (a call the recorded
  crihook refused but the replayed chain lets through) with a made-up success, so the replay
  goes on: the difference is reported anyway.
- `RecordedNode` answers what hooks ask the host's processes (`Host`), its files
  (`HostFiles`), pods' cgroups (`PodCgroups`) and the runtime on the call path
  (`RuntimeQueries`): first from the answers noted in the line being replayed, then from any
  earlier line (or the header's node facts), then as an empty host would. Changes a hook
  makes to the host (an oom_score_adj written, a CFS quota lifted, a pod's cgroup limits
  written, a host path pinned on a staging path or released) are noted as `effects`, never
  carried out; a pin the recording does not have is answered with the staging path it
  would have had under the default staging directory.
- `RecordedNetlink` is the node's network interfaces (`Netlink`) the same way: sessions,
  interfaces looked up, from the recording (an interface the recording does not know is not
  there); interfaces moved, made, configured, deleted or given back are effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import DEFAULT_STAGING_ROOT, DeviceNode, LinkInfo, NetlinkSession, PodLimits
from crihook.hooks.spec import ContainerState
from crihook.proxy.core.observe import EFFECTS
from crihook.proxy.cri.outcome import Metadata, Status
from crihook.proxy.cri.runtime import RuntimeCallFailed, UnaryCall
from crihook.proxy.replay.file import CallEntry
from crihook.proxy.state.store import Store

__all__ = ["RecordedNetlink", "RecordedNode", "RecordedRuntime", "not_recorded"]

_CODES = {c.name: c for c in grpc.StatusCode}
_MISSING = object()


def _status(doc: Mapping[str, Any]) -> Status:
    return Status(_CODES[doc["code"]], str(doc.get("message", "")))


class RecordedRuntime:
    """`Runtime` for the pipeline core during a replay."""

    def __init__(self) -> None:
        self.call_entry: CallEntry | None = None
        self.cancelled_by_kubelet = False
        """The recorded call was cancelled by kubelet: the replayed one is too, when it
        reaches the runtime."""
        self.unrecorded: list[str] = []
        """Calls the runtime was asked that the recording has no answer for."""

    def call(self, path: str) -> UnaryCall:
        method = path.rsplit("/", 1)[-1]

        async def call(
            request: bytes, *, timeout: float | None = None, metadata: Metadata | None = None
        ) -> bytes:
            return self._answer(method, request)

        return call

    def control(self, path: str, image_service: bool = False) -> UnaryCall:
        """The control path answers from the recording as the data path does (a replay's
        reconcile and queries go to `RecordedNode`, so nothing asks it today)."""
        return self.call(path)

    def _answer(self, method: str, request: bytes) -> bytes:
        entry = self.call_entry
        if entry is not None and method == entry.event.value and not self._other(request):
            if self.cancelled_by_kubelet:
                raise asyncio.CancelledError
            status = entry.doc.get("runtime_status") or entry.status  # (--update keeps it)
            if status is not None and status.get("origin") == "runtime":
                raise RuntimeCallFailed(_status(status))
            if entry.response is not None:
                return entry.response
        if method == "UpdateContainerResources":
            return self._update(request)
        if method in ("StopPodSandbox", "RemovePodSandbox"):
            return b""  # crihook undoing a sandbox a hook refused
        self.unrecorded.append(method)
        return _made_up(method, request)

    def _other(self, request: bytes) -> bool:
        """An UpdateContainerResources crihook sends to another container while it replays
        one kubelet sent."""
        entry = self.call_entry
        if entry is None or entry.event.value != "UpdateContainerResources":
            return False
        parse = api_pb2.UpdateContainerResourcesRequest.FromString
        return bool(parse(request).container_id != parse(entry.request).container_id)

    def _update(self, request: bytes) -> bytes:
        """An update crihook sends: answered as the runtime answered it in the recording."""
        target = api_pb2.UpdateContainerResourcesRequest.FromString(request).container_id
        docs = self.call_entry.doc.get("updates", []) if self.call_entry else []
        for doc in docs:
            if doc.get("container_id") == target and doc.get("status"):
                raise RuntimeCallFailed(_status(doc["status"]))
        return b""

    def entry_for_sync(self) -> None:
        self.call_entry = None
        self.cancelled_by_kubelet = False


def _made_up(method: str, request: bytes) -> bytes:
    """A success for a call the recording never forwarded: new ids that cannot collide with
    the runtime's (they are not hex)."""
    digest = hashlib.sha256(request).hexdigest()[:20]
    if method == "RunPodSandbox":
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=f"replay-{digest}").SerializeToString()
    if method == "CreateContainer":
        return api_pb2.CreateContainerResponse(container_id=f"replay-{digest}").SerializeToString()
    return b""


def not_recorded(what: str) -> str:
    return f"{what} (not in the recording)"


class RecordedNode:
    """Host, HostFiles, PodCgroups and RuntimeQueries for the hooks, answered from the
    recording."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._line: list[dict[str, Any]] = []
        self._used: set[int] = set()
        self._known: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.effects: list[dict[str, Any]] = []
        """What hooks did to the host while the current line was replayed (as observations:
        `{"seam": "host", "op", "args", "result"}`)."""
        self.states: Mapping[str, ContainerState] = {}
        """The container states of the synchronize being replayed."""
        self.missing: list[str] = []
        """Questions the recording had no answer for (answered as an empty host would)."""

    def learn(self, observed: Sequence[Mapping[str, Any]]) -> None:
        """Answers valid from now on (the header's node facts, earlier lines)."""
        for doc in observed:
            self._known[_key(doc)] = dict(doc)

    def begin(self, observed: Sequence[Mapping[str, Any]]) -> None:
        """The answers of the line about to be replayed."""
        self._line = [dict(d) for d in observed]
        self._used = set()
        self.effects = []
        self.missing = []

    def end(self) -> None:
        self.learn(self._line)

    @staticmethod
    def recorded_effects(observed: Sequence[Mapping[str, Any]]) -> list[str]:
        """The changes to the host among observations, as `op(args)` texts."""
        return [_effect(d["op"], d.get("args", [])) for d in observed if d.get("op") in EFFECTS]

    def _effect(self, op: str, args: list[Any], seam: str = "host") -> dict[str, Any]:
        doc: dict[str, Any] = {"seam": seam, "op": op, "args": args, "result": None}
        self.effects.append(doc)
        return doc

    # --- answers ---------------------------------------------------------------------------
    def _ask(self, seam: str, op: str, args: list[Any]) -> Any:
        """The recorded result, or raises the recorded error; _MISSING when unknown."""
        key = (seam, op, repr(args))
        found = None
        for index, doc in enumerate(self._line):
            if index not in self._used and _key(doc) == key:
                self._used.add(index)
                found = doc
                break
        if found is None:
            found = self._known.get(key)
        if found is None:
            self.missing.append(f"{seam}.{op}{tuple(args)}")
            return _MISSING
        if found.get("error") is not None:
            raise _error(found["error"])
        return found.get("result")

    # Host
    def container_pids(self, cgroup_parent: str, container_id: str) -> list[int]:
        answer = self._ask("host", "container_pids", [cgroup_parent, container_id])
        return [] if answer is _MISSING else [int(p) for p in answer]

    def write_oom_score_adj(self, pid: int, score: int) -> None:
        self._effect("write_oom_score_adj", [pid, score])
        self._ask("host", "write_oom_score_adj", [pid, score])

    def read_oom_score_adj(self, pid: int) -> int:
        answer = self._ask("host", "read_oom_score_adj", [pid])
        if answer is _MISSING:
            raise ProcessLookupError(errno.ESRCH, not_recorded(f"process {pid}"))
        return int(answer)

    def unlimit_cpu_quota(self, cgroup_parent: str) -> bool:
        effect = self._effect("unlimit_cpu_quota", [cgroup_parent])
        answer = self._ask("host", "unlimit_cpu_quota", [cgroup_parent])
        effect["result"] = False if answer is _MISSING else bool(answer)
        return bool(effect["result"])

    # PodCgroups: writes noted, never carried out; reads answered from the recording
    def write_limits(self, cgroup_parent: str, limits: PodLimits) -> list[str]:
        args = [cgroup_parent, limits.to_dict()]
        effect = self._effect("write_pod_limits", args)
        answer = self._ask("host", "write_pod_limits", args)
        effect["result"] = [] if answer is _MISSING else [str(p) for p in answer]
        return list(effect["result"])

    def write_qos_cpus(self, qos_path: str, cpus: str) -> bool:
        effect = self._effect("write_qos_cpus", [qos_path, cpus])
        answer = self._ask("host", "write_qos_cpus", [qos_path, cpus])
        effect["result"] = False if answer is _MISSING else bool(answer)
        return bool(effect["result"])

    def read_qos_cpus(self, qos_path: str) -> str | None:
        answer = self._ask("host", "read_qos_cpus", [qos_path])
        return None if answer is _MISSING or answer is None else str(answer)

    # HostFiles
    def resolve(self, path: str) -> str:
        answer = self._ask("files", "resolve", [path])
        if answer is _MISSING:
            raise FileNotFoundError(errno.ENOENT, not_recorded(path))
        return str(answer)

    def nonblocking(self) -> RecordedNode:
        return self  # answers from the recording never wait

    def device(self, path: str) -> DeviceNode | None:
        answer = self._ask("files", "device", [path])
        if answer is _MISSING:
            raise FileNotFoundError(errno.ENOENT, not_recorded(path))
        if answer is None:
            return None
        kind, major, minor = answer
        return DeviceNode(str(kind), int(major), int(minor))

    # Staging: noted, never mounted
    def pin_mount(self, key: str, name: str, path: str, readonly: bool) -> str:
        return self._pin("pin_mount", [key, name, path, readonly], key, name)

    def pin_device(self, key: str, name: str, path: str, node: DeviceNode) -> str:
        return self._pin(
            "pin_device", [key, name, path, [node.kind, node.major, node.minor]], key, name
        )

    def _pin(self, op: str, args: list[Any], key: str, name: str) -> str:
        effect = self._effect(op, args, "staging")
        answer = self._ask("staging", op, args)
        made = f"{DEFAULT_STAGING_ROOT}/{key}/{name}"
        effect["result"] = made if answer is _MISSING else str(answer)
        return str(effect["result"])

    def release(self, key: str) -> None:
        self._effect("release", [key], "staging")
        self._ask("staging", "release", [key])

    def keys(self) -> list[str]:
        answer = self._ask("staging", "keys", [])
        return [] if answer is _MISSING else [str(k) for k in answer]

    # RuntimeQueries (and what the synchronizer asks)
    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        answer = self._ask("runtime", "container_states", [pod_id])
        if answer is _MISSING:  # what the replay knows of the pod's containers
            states = self._store.container_states()
            return {c.id: states[c.id] for c in self._store.containers_of(pod_id)}
        return {str(k): ContainerState(v) for k, v in dict(answer).items()}

    async def sandbox_netns(self, pod_id: str) -> str | None:
        answer = self._ask("runtime", "sandbox_netns", [pod_id])
        return None if answer is _MISSING or answer is None else str(answer)

    async def oom_score_adj(self, container_id: str) -> int | None:
        answer = self._ask("runtime", "oom_score_adj", [container_id])
        return None if answer is _MISSING or answer is None else int(answer)

    async def all_container_states(self) -> dict[str, ContainerState]:
        return dict(self.states)

    async def resources(self, container_id: str) -> api_pb2.LinuxContainerResources | None:
        return None  # the synchronize line already carries the runtime's resources


class RecordedNetlink:
    """`Netlink` for the hooks during a replay, answered from the recording through a
    `RecordedNode` (its lines, its notes of what is missing, its effects)."""

    def __init__(self, node: RecordedNode) -> None:
        self._node = node

    def exists(self, netns: str) -> bool:
        answer = self._node._ask("netlink", "exists", [netns])
        return answer is not _MISSING and bool(answer)

    @contextlib.contextmanager
    def session(self, netns: str | None) -> Iterator[NetlinkSession]:
        self._node._ask("netlink", "session", [netns])  # raises what entering it raised
        yield _RecordedSession(self._node, netns)


class _RecordedSession:
    def __init__(self, node: RecordedNode, netns: str | None) -> None:
        self._node = node
        self._netns = netns

    def _link(self, op: str, args: list[Any]) -> LinkInfo | None:
        answer = self._node._ask("netlink", op, args)
        return None if answer is _MISSING or answer is None else LinkInfo.from_dict(answer)

    def _links(self, op: str, args: list[Any]) -> list[LinkInfo]:
        answer = self._node._ask("netlink", op, args)
        return [] if answer is _MISSING else [LinkInfo.from_dict(d) for d in answer]

    def _change(self, op: str, args: list[Any]) -> None:
        self._node._effect(op, args, "netlink")
        self._node._ask("netlink", op, args)  # raises what the kernel answered then

    def host_link(self, name: str) -> LinkInfo | None:
        return self._link("host_link", [name])

    def host_links(self) -> list[LinkInfo]:
        return self._links("host_links", [])

    def pod_link(self, name: str) -> LinkInfo | None:
        return self._link("pod_link", [self._netns, name])

    def pod_links(self) -> list[LinkInfo]:
        return self._links("pod_links", [self._netns])

    def move_in(self, host_index: int, name: str) -> None:
        self._change("move_in", [self._netns, host_index, name])

    def move_out(self, name: str, host_name: str) -> None:
        self._change("move_out", [self._netns, name, host_name])

    def create(self, name: str, kind: str, parent_index: int, mode: str) -> None:
        self._change("create", [self._netns, name, kind, parent_index, mode])

    def delete(self, name: str) -> None:
        self._change("delete", [self._netns, name])

    def configure(self, name: str, mtu: int | None, addresses: Sequence[str]) -> None:
        self._change("configure", [self._netns, name, mtu, list(addresses)])

    def restore(self, index: int, name: str, mtu: int, up: bool) -> None:
        self._change("restore", [index, name, mtu, up])


def _key(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(doc.get("seam")), str(doc.get("op")), repr(list(doc.get("args", []))))


def _effect(op: str, args: Sequence[Any]) -> str:
    return f"{op}({', '.join(map(repr, args))})"


_OS_ERRORS: dict[str, type[OSError]] = {
    "FileNotFoundError": FileNotFoundError,
    "PermissionError": PermissionError,
    "ProcessLookupError": ProcessLookupError,
    "NotADirectoryError": NotADirectoryError,
    "IsADirectoryError": IsADirectoryError,
}


def _error(doc: Mapping[str, Any]) -> BaseException:
    """The error a seam raised in the recording, raised again."""
    kind, message = str(doc.get("type")), str(doc.get("message", ""))
    if kind == "rpc":
        code = _CODES.get(str(doc.get("code")), grpc.StatusCode.UNKNOWN)
        return RuntimeCallFailed(Status(code, message))
    if kind == "ValueError":
        return ValueError(message)
    if kind in _OS_ERRORS or "errno" in doc:
        cls = _OS_ERRORS.get(kind, OSError)
        code = int(doc.get("errno", 0))
        # The recording kept str(exc), "[Errno N] what": `what` is the error's strerror again.
        return cls(code, message.removeprefix(f"[Errno {code}] "))
    return RuntimeError(f"{kind}: {message}")
