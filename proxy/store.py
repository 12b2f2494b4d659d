"""Pods and containers crihook has seen, each hook's private state, and the audit.

Keyed by sandbox id and container id; entries are deleted on Remove (not Stop: a stopped
container can be inspected and restarted by kubelet). Everything is persisted under the
state directory with crash-safe writes (temp file, fsync, rename, fsync of the directory),
off the event loop; concurrent changes are coalesced into one write. At start the store is
loaded from disk and reconciled with the runtime: what the runtime no longer has is dropped,
what it has that the disk lacks is rebuilt from its verbose status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf import json_format

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerView, PodView
from crihook.hooks.spec.views import (
    container_view_from_config,
    pod_view_from_config,
    qos_from_cgroup_parent,
    resources_view,
)
from crihook.proxy.methods import method_path
from crihook.proxy.runtime_client import RuntimeClient

__all__ = ["ContainerRecord", "HookStateStore", "PodRecord", "Store", "write_atomic"]

log = logging.getLogger(__name__)

STORE_VERSION = 1
STORE_FILE = "store.json"
STATUS_FILE = "status.json"
HOOKS_DIR = "hooks"
WRITE_BEHIND_SECONDS = 0.2


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new file, never half.
    `durable=False` skips the fsyncs (for files that are rewritten every second anyway)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass
class PodRecord:
    view: PodView
    audit: dict[str, dict[str, Any]] = field(default_factory=dict)
    """field → {hook, value, event, at}: the last hook that set each field."""

    def to_dict(self) -> dict[str, Any]:
        return {"view": self.view.to_dict(), "audit": self.audit}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PodRecord:
        return cls(PodView.from_dict(doc["view"]), dict(doc.get("audit", {})))


@dataclass
class ContainerRecord:
    view: ContainerView
    audit: dict[str, dict[str, Any]] = field(default_factory=dict)
    update_errors: list[dict[str, Any]] = field(default_factory=list)
    """UpdateContainerResources that crihook sent for a hook and the runtime refused."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "view": self.view.to_dict(),
            "audit": self.audit,
            "update_errors": self.update_errors,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ContainerRecord:
        return cls(
            ContainerView.from_dict(doc["view"]),
            dict(doc.get("audit", {})),
            list(doc.get("update_errors", [])),
        )


class HookStateStore:
    """One hook's private key-value namespace (JSON values), persisted with the store."""

    def __init__(self, name: str, data: dict[str, Any], on_change: Any) -> None:
        self.name = name
        self._data = data
        self._on_change = on_change

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        json.dumps(value)  # refuse what cannot be persisted, at the hook's call site
        self._data[key] = value
        self._on_change(self.name)

    def delete(self, key: str) -> None:
        if key in self._data:
            del self._data[key]
            self._on_change(self.name)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self._data.items()))

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)


class Store:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.pods: dict[str, PodRecord] = {}
        self.containers: dict[str, ContainerRecord] = {}
        self._hook_states: dict[str, HookStateStore] = {}
        self._dirty_store = False
        self._dirty_hooks: set[str] = set()
        self._generation = 0
        self._written = 0
        self._write_lock = asyncio.Lock()
        self.status_provider: Any = None
        self._pending: asyncio.TimerHandle | None = None
        # Each record's JSON, kept between writes so a flush joins them instead of
        # re-encoding the whole store. None: changed, encoded at the next write (off the
        # call path, and once however often it changed in between).
        self._pod_json: dict[str, str | None] = {}
        self._container_json: dict[str, str | None] = {}
        self._background: set[asyncio.Task[None]] = set()

    # --- records -------------------------------------------------------------------------------
    def pod(self, sandbox_id: str) -> PodRecord | None:
        return self.pods.get(sandbox_id)

    def container(self, container_id: str) -> ContainerRecord | None:
        return self.containers.get(container_id)

    def put_pod(self, record: PodRecord) -> None:
        """Add or replace a pod record; call again after changing a record in place."""
        self.pods[record.view.id] = record
        self._pod_json[record.view.id] = None
        self._touch()

    def put_container(self, record: ContainerRecord) -> None:
        """Add or replace a container record; call again after changing it in place."""
        self.containers[record.view.id] = record
        self._container_json[record.view.id] = None
        self._touch()

    def remove_container(self, container_id: str) -> ContainerRecord | None:
        record = self.containers.pop(container_id, None)
        self._container_json.pop(container_id, None)
        if record is not None:
            self._touch()
        return record

    def remove_pod(self, sandbox_id: str) -> PodRecord | None:
        """Remove a pod and every container of it."""
        record = self.pods.pop(sandbox_id, None)
        self._pod_json.pop(sandbox_id, None)
        for cid in [c for c, r in self.containers.items() if r.view.pod_id == sandbox_id]:
            self.remove_container(cid)
        if record is not None:
            self._touch()
        return record

    def snapshot(self) -> tuple[list[PodView], list[ContainerView]]:
        return ([r.view for r in self.pods.values()], [r.view for r in self.containers.values()])

    def hook_state(self, name: str) -> HookStateStore:
        state = self._hook_states.get(name)
        if state is None:
            state = HookStateStore(name, {}, self._hook_touched)
            self._hook_states[name] = state
        return state

    def hook_states(self) -> dict[str, dict[str, Any]]:
        return {n: s.to_dict() for n, s in self._hook_states.items()}

    def _touch(self) -> None:
        self._dirty_store = True
        self._generation += 1

    def _hook_touched(self, name: str) -> None:
        self._dirty_hooks.add(name)
        self._generation += 1

    # --- persistence ---------------------------------------------------------------------------
    def load(self) -> None:
        """Read what an earlier crihook persisted. A corrupt file is set aside, not fatal."""
        (self.state_dir / HOOKS_DIR).mkdir(parents=True, exist_ok=True)
        path = self.state_dir / STORE_FILE
        doc = _read_json(path)
        if doc is not None:
            if doc.get("version") != STORE_VERSION:
                _set_aside(path, f"version {doc.get('version')!r}, expected {STORE_VERSION}")
            else:
                for doc_pod in doc.get("pods", {}).values():
                    self.put_pod(PodRecord.from_dict(doc_pod))
                for doc_container in doc.get("containers", {}).values():
                    self.put_container(ContainerRecord.from_dict(doc_container))
                self._dirty_store = False
        for file in sorted((self.state_dir / HOOKS_DIR).glob("*.json")):
            data = _read_json(file)
            if data is not None:
                self._hook_states[file.stem] = HookStateStore(file.stem, data, self._hook_touched)

    def _encode(self) -> tuple[bytes | None, dict[str, bytes]]:
        store = None
        if self._dirty_store:
            pods = ", ".join(_fragments(self._pod_json, self.pods))
            containers = ", ".join(_fragments(self._container_json, self.containers))
            store = (
                f'{{"containers": {{{containers}}}, "pods": {{{pods}}}, '
                f'"version": {STORE_VERSION}}}'
            ).encode()
        hooks = {
            n: json.dumps(self._hook_states[n].to_dict(), sort_keys=True).encode()
            for n in self._dirty_hooks
        }
        self._dirty_store = False
        self._dirty_hooks = set()
        return store, hooks

    @property
    def hook_states_dirty(self) -> bool:
        return bool(self._dirty_hooks)

    def schedule(self) -> None:
        """Persist soon, off the request path. Pod and container records can be rebuilt from
        the runtime after a crash, so they need not be on disk before kubelet's answer; hook
        states (allocations) cannot, and are flushed before answering."""
        if self._generation <= self._written or self._pending is not None:
            return
        self._pending = asyncio.get_running_loop().call_later(
            WRITE_BEHIND_SECONDS, self._start_background_flush
        )

    def _start_background_flush(self) -> None:
        self._pending = None
        task = asyncio.get_running_loop().create_task(self.flush(), name="crihook-store-flush")
        self._background.add(task)
        task.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("persisting the store failed: %s", task.exception())

    async def flush(self) -> None:
        """Persist every change made so far; returns once it is on disk. Callers that arrive
        while a write is running are served by the next write, together."""
        wanted = self._generation
        async with self._write_lock:
            if self._written >= wanted:
                return
            generation = self._generation
            dirty_hooks = set(self._dirty_hooks)
            store, hooks = self._encode()
            status = self._status_bytes()
            try:
                await asyncio.to_thread(self._write, store, hooks, status)
            except OSError:
                # Nothing is lost: the changes stay marked and the next flush retries them.
                self._dirty_store = self._dirty_store or store is not None
                self._dirty_hooks |= dirty_hooks
                raise
            self._written = generation

    async def close(self) -> None:
        """Write everything still pending; no background work is left behind."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.flush()
        await self.write_status()

    def _status_bytes(self) -> bytes | None:
        if self.status_provider is None:
            return None
        return json.dumps(self.status_provider(), sort_keys=True, default=str).encode()

    def _write(self, store: bytes | None, hooks: dict[str, bytes], status: bytes | None) -> None:
        (self.state_dir / HOOKS_DIR).mkdir(parents=True, exist_ok=True)
        if store is not None:
            write_atomic(self.state_dir / STORE_FILE, store)
        for name, data in hooks.items():
            write_atomic(self.state_dir / HOOKS_DIR / f"{name}.json", data)
        if status is not None:
            write_atomic(self.state_dir / STATUS_FILE, status, durable=False)

    async def write_status(self) -> None:
        status = self._status_bytes()
        if status is not None:
            async with self._write_lock:
                await asyncio.to_thread(write_atomic, self.state_dir / STATUS_FILE, status, False)

    # --- reconcile with the runtime ------------------------------------------------------------
    async def reconcile(self, runtime: RuntimeClient) -> tuple[int, int, int]:
        """Drop what the runtime no longer has, rebuild what it has that the disk lacks.
        Returns (kept, rebuilt, dropped) counts over pods and containers."""
        sandboxes = await _call(
            runtime,
            "ListPodSandbox",
            api_pb2.ListPodSandboxRequest(),
            api_pb2.ListPodSandboxResponse,
        )
        containers = await _call(
            runtime,
            "ListContainers",
            api_pb2.ListContainersRequest(),
            api_pb2.ListContainersResponse,
        )
        live_pods = {s.id: s for s in sandboxes.items}
        live_containers = {c.id: c for c in containers.containers}
        kept = rebuilt = dropped = 0
        for cid in list(self.containers):
            if cid not in live_containers:
                self.remove_container(cid)
                dropped += 1
        for sid in list(self.pods):
            if sid not in live_pods:
                self.remove_pod(sid)
                dropped += 1
        for sid, sandbox in live_pods.items():
            if sid in self.pods:
                kept += 1
                continue
            self.put_pod(PodRecord(await _rebuild_pod(runtime, sandbox)))
            rebuilt += 1
        for cid, container in live_containers.items():
            if cid in self.containers:
                kept += 1
                continue
            pod = self.pods.get(container.pod_sandbox_id)
            if pod is None:
                continue  # a container of a sandbox the runtime did not list: nothing to hang it on
            self.put_container(
                ContainerRecord(await _rebuild_container(runtime, container, pod.view))
            )
            rebuilt += 1
        if dropped or rebuilt:
            self._touch()
        return kept, rebuilt, dropped


async def _call(runtime: RuntimeClient, name: str, request: Any, response_type: Any) -> Any:
    raw = await runtime.unary(method_path("RuntimeService", name))(
        request.SerializeToString(), timeout=30
    )
    return response_type.FromString(raw)


def _verbose_config(info: Any, message: Any) -> Any | None:
    """containerd's verbose status carries the original config as JSON under info["info"]."""
    try:
        doc = json.loads(info.get("info", "{}")).get("config")
    except (ValueError, AttributeError):
        return None
    if not isinstance(doc, dict):
        return None
    doc.pop("envs", None)  # Go marshals env values as text, protobuf JSON expects base64
    try:
        return json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        log.debug("cannot parse verbose config: %s", exc)
        return None


async def _rebuild_pod(runtime: RuntimeClient, sandbox: Any) -> PodView:
    try:
        status = await _call(
            runtime,
            "PodSandboxStatus",
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id, verbose=True),
            api_pb2.PodSandboxStatusResponse,
        )
        config = _verbose_config(status.info, api_pb2.PodSandboxConfig())
    except grpc.aio.AioRpcError:
        config = None
    if config is None:
        config = api_pb2.PodSandboxConfig(
            metadata=sandbox.metadata, labels=sandbox.labels, annotations=sandbox.annotations
        )
    return pod_view_from_config(sandbox.id, config, sandbox.runtime_handler)


async def _rebuild_container(runtime: RuntimeClient, container: Any, pod: PodView) -> ContainerView:
    config = None
    resources = None
    try:
        status = await _call(
            runtime,
            "ContainerStatus",
            api_pb2.ContainerStatusRequest(container_id=container.id, verbose=True),
            api_pb2.ContainerStatusResponse,
        )
        config = _verbose_config(status.info, api_pb2.ContainerConfig())
        if status.status.HasField("resources") and status.status.resources.HasField("linux"):
            resources = status.status.resources.linux
    except grpc.aio.AioRpcError:
        pass
    if config is None:
        config = api_pb2.ContainerConfig(
            metadata=container.metadata,
            image=container.image,
            labels=container.labels,
            annotations=container.annotations,
        )
    view = container_view_from_config(container.id, pod, config)
    if resources is not None:
        # The runtime's view of the resources is the current one (updates included).
        qos = qos_from_cgroup_parent(pod.cgroup_parent)
        view = ContainerView(**{**view.__dict__, "resources": resources_view(resources, qos)})
    return view


def _fragments(
    cache: dict[str, str | None], records: Mapping[str, PodRecord] | Mapping[str, ContainerRecord]
) -> list[str]:
    """Every record's JSON fragment, encoding those changed since the last write."""
    out = []
    for key, fragment in cache.items():
        if fragment is None:
            fragment = cache[key] = _fragment(key, records[key].to_dict())
        out.append(fragment)
    return out


def _fragment(key: str, doc: dict[str, Any]) -> str:
    return f"{json.dumps(key)}: {json.dumps(doc, sort_keys=True)}"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _set_aside(path, str(exc))
        return None
    if not isinstance(data, dict):
        _set_aside(path, "not a JSON object")
        return None
    return data


def _set_aside(path: Path, why: str) -> None:
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    log.error(
        "state file %s is unusable (%s); moved to %s, rebuilding from the runtime", path, why, aside
    )
    os.replace(path, aside)
