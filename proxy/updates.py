"""Updates to other containers that hooks ask for: UpdateContainerResources crihook sends.

Hooks return them with an adjustment (`update_container`), from any stage, or from
`synchronize` (repairs). They are sent after the call that produced them succeeded, together
(at most `MAX_PARALLEL` at once: one runtime call each, milliseconds on containerd), before
kubelet hears OK. Calls of different pods run in parallel, so two calls may update the same
container at once; each update carries the order in which hooks produced it, and per
container and field only the newest is applied: a shared pool computed earlier never
overwrites one computed later.

Each request carries the container's current resources with the delta on top (a runtime
may read an absent field as "set to zero"). A failure is logged, counted and kept in the
target's record (shown by `crihook state`); it never fails the call that produced it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import grpc

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerUpdate, ContainerView, ResourceDelta
from crihook.hooks.spec.views import resources_updated
from crihook.proxy.merge import PendingUpdate
from crihook.proxy.methods import method_path
from crihook.proxy.outcome import Runtime, RuntimeCallFailed, SentUpdate, Status
from crihook.proxy.store import Store

__all__ = ["ContainerUpdater", "build_update_request"]

log = logging.getLogger(__name__)

MAX_PARALLEL = 16
UPDATE_TIMEOUT_SECONDS = 10.0
_UPDATE_PATH = method_path("RuntimeService", "UpdateContainerResources")


@dataclass
class _Target:
    lock: asyncio.Lock
    applied: dict[str, int]
    """Field name → seq of the newest update applied."""


REMEMBER_REMOVED = 4096


class ContainerUpdater:
    def __init__(self, runtime: Runtime, store: Store) -> None:
        self._update = runtime.call(_UPDATE_PATH)
        self._store = store
        self._targets: dict[str, _Target] = {}
        self._slots = asyncio.Semaphore(MAX_PARALLEL)
        self._removed: dict[str, None] = {}
        """Ids of containers removed lately (oldest first, at most REMEMBER_REMOVED): an update
        still on its way to one is answered NOT_FOUND, and that is no failure."""
        self.failures = 0

    async def send(
        self, updates: Iterable[PendingUpdate], extra: Mapping[str, str]
    ) -> list[SentUpdate]:
        """Send every update (the newest per container and field); returns, once all were
        answered, what was sent, by container id. `extra`: the log fields of the call that
        produced them."""
        by_target: dict[str, list[PendingUpdate]] = {}
        for pending in updates:
            by_target.setdefault(pending.update.container_id, []).append(pending)
        sent = await asyncio.gather(
            *(self._send_one(cid, todo, extra) for cid, todo in sorted(by_target.items()))
        )
        return [update for update in sent if update is not None]

    def forget(self, container_id: str) -> None:
        """The container is gone: drop its ordering record."""
        self._targets.pop(container_id, None)
        self._removed[container_id] = None
        if len(self._removed) > REMEMBER_REMOVED:
            del self._removed[next(iter(self._removed))]

    async def _send_one(
        self, container_id: str, todo: list[PendingUpdate], extra: Mapping[str, str]
    ) -> SentUpdate | None:
        target = self._targets.setdefault(container_id, _Target(asyncio.Lock(), {}))
        async with target.lock, self._slots:
            fields: dict[str, tuple[Any, int, str]] = {}  # field → (value, seq, hook)
            for hook, update, seq in sorted(todo, key=lambda p: p.seq):
                for name, value in update.resources.items():
                    if seq > target.applied.get(name, 0):
                        fields[name] = (value, seq, hook)
            if not fields:
                return None  # everything here was overtaken by newer updates
            delta = ResourceDelta(**{name: value for name, (value, _, _) in fields.items()})
            hooks = sorted({hook for _, _, hook in fields.values()})
            record = self._store.container(container_id)
            request = build_update_request(
                ContainerUpdate(container_id, delta), record.view if record else None
            )
            changed = {name: value for name, (value, _, _) in fields.items()}
            try:
                await self._update(request.SerializeToString(), timeout=UPDATE_TIMEOUT_SECONDS)
            except RuntimeCallFailed as err:
                self._failed(container_id, hooks, delta, err.status, extra)
                self._forget_if_gone(container_id, target)
                return SentUpdate(container_id, _sent(request), changed, hooks, err.status)
            for name, (_, seq, _) in fields.items():
                target.applied[name] = seq
            sent = SentUpdate(container_id, _sent(request), changed, hooks, None)
            record = self._store.container(container_id)  # it may have changed meanwhile
            if record is None:
                self._forget_if_gone(container_id, target)
                return sent
            res = resources_updated(record.view.resources, request.linux)
            record.view = replace(record.view, resources=res)
            now = time.time()
            for name, (value, _, hook) in fields.items():
                record.audit[name] = {"hook": hook, "value": value, "event": "update", "at": now}
            self._store.put_container(record)
            return sent

    def _forget_if_gone(self, container_id: str, target: _Target) -> None:
        """An update computed before the container was removed can be sent after `forget`:
        its record must not outlive it (one per such race, kept for ever under churn)."""
        if (
            self._store.container(container_id) is None
            and self._targets.get(container_id) is target
        ):
            del self._targets[container_id]

    def _failed(
        self,
        container_id: str,
        hooks: list[str],
        delta: ResourceDelta,
        status: Status,
        extra: Mapping[str, str],
    ) -> None:
        record = self._store.container(container_id)
        if status.code is grpc.StatusCode.NOT_FOUND and container_id in self._removed:
            # kubelet removed it while the update was on its way: nothing is left to update
            log.debug(
                "update of container %s for hook %s: it was removed meanwhile",
                container_id[:12],
                ", ".join(hooks),
                extra=dict(extra),
            )
            return
        self.failures += 1
        log.error(
            "update of container %s for hook %s failed: %s: %s",
            container_id[:12],
            ", ".join(hooks),
            status.code.name,
            status.details,
            extra=dict(extra),
        )
        if record is None:
            return
        record.update_errors.append(
            {
                "hook": ", ".join(hooks),
                "code": status.code.name,
                "details": status.details,
                "at": time.time(),
                "resources": dict(delta.items()),
            }
        )
        self._store.put_container(record)


def _sent(request: api_pb2.UpdateContainerResourcesRequest) -> dict[str, Any]:
    """The resources an update request carries, by field name (what the runtime was sent)."""
    linux = request.linux
    return {field.name: value for field, value in linux.ListFields()}


def build_update_request(
    update: ContainerUpdate, current: ContainerView | None
) -> api_pb2.UpdateContainerResourcesRequest:
    """The full resources to send: the container's current ones with the delta on top
    (a runtime may read an absent field as "set to zero")."""
    linux = api_pb2.LinuxContainerResources()
    if current is not None:
        res = current.resources
        linux.cpu_shares = res.cpu_shares or 0
        linux.cpu_quota = res.cpu_quota or 0
        linux.cpu_period = res.cpu_period or 0
        linux.memory_limit_in_bytes = res.memory_limit_bytes or 0
        linux.cpuset_cpus = res.cpuset_cpus
        linux.cpuset_mems = res.cpuset_mems
        if res.oom_score_adj is not None:
            linux.oom_score_adj = res.oom_score_adj
    for name, value in update.resources.items():
        setattr(linux, name, value)
    return api_pb2.UpdateContainerResourcesRequest(container_id=update.container_id, linux=linux)
