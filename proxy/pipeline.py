"""The flow of one intercepted call, written once for all eight:

    decode → views (from the request or the store) → per-pod lock → pre stage (chain) →
    encode only if something changed → runtime → store (+ audit) → post stage →
    updates to other containers → the runtime's response bytes, unchanged.

With no hook adjusting anything the request bytes kubelet sent are forwarded as they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerUpdate, ContainerView, Event, PodView, Stage
from crihook.hooks.spec.adjustment import RESOURCE_FIELDS, Field, describe_key
from crihook.hooks.spec.views import (
    container_view_from_config,
    container_view_updated,
    pod_view_from_config,
    resources_view,
)
from crihook.proxy.chain import Chain
from crihook.proxy.errors import CrihookError
from crihook.proxy.merge import Merger, jsonable
from crihook.proxy.methods import INTERCEPTED, method_path
from crihook.proxy.passthrough import Readiness, abort_with, call_options
from crihook.proxy.runtime_client import RuntimeClient
from crihook.proxy.store import ContainerRecord, PodRecord, Store

__all__ = ["Pipeline", "build_update_request"]

log = logging.getLogger(__name__)

_UPDATE_PATH = method_path("RuntimeService", "UpdateContainerResources")
_UNKNOWN_POD = PodView(id="", uid="", name="", namespace="")


class _PodLocks:
    """Calls for one pod run one at a time, in arrival order; different pods in parallel."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def hold(self, key: str) -> _PodLock:
        return _PodLock(self._locks, key)


class _PodLock:
    """`async with` one pod's lock; the lock is dropped when its last user leaves. A plain
    class: a generator-based context manager costs several µs per call."""

    __slots__ = ("_key", "_lock", "_locks")

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], key: str) -> None:
        self._locks = locks
        self._key = key
        lock, users = locks.get(key) or (asyncio.Lock(), 0)
        locks[key] = (lock, users + 1)
        self._lock = lock

    async def __aenter__(self) -> None:
        try:
            await self._lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        lock, users = self._locks[self._key]
        if users == 1:
            del self._locks[self._key]
        else:
            self._locks[self._key] = (lock, users - 1)


class _Call:
    """What the pipeline knows about one intercepted call."""

    __slots__ = ("container", "container_record", "event", "pod", "pod_record", "request")

    def __init__(self, event: Event, request: Any) -> None:
        self.event = event
        self.request = request
        self.pod: PodView = _UNKNOWN_POD
        self.container: ContainerView | None = None
        self.pod_record: PodRecord | None = None
        self.container_record: ContainerRecord | None = None

    @property
    def lock_key(self) -> str:
        return self.pod.uid or self.pod.id or (self.container.id if self.container else "")

    def describe(self) -> dict[str, str]:
        extra = {"method": self.event.value, "pod": f"{self.pod.namespace}/{self.pod.name}"}
        if self.container is not None:
            extra["container"] = self.container.name or self.container.id[:12]
        return extra


class Pipeline:
    def __init__(
        self, runtime: RuntimeClient, chain: Chain, store: Store, readiness: Readiness
    ) -> None:
        self.runtime = runtime
        self.chain = chain
        self.store = store
        self.readiness = readiness
        self._locks = _PodLocks()
        self._forward = {e: runtime.unary(spec.path) for e, spec in INTERCEPTED.items()}
        self._update = runtime.unary(_UPDATE_PATH)
        self.update_failures = 0

    def handler(self, event: Event) -> grpc.RpcMethodHandler:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await self.handle(event, raw, context)

        return grpc.unary_unary_rpc_method_handler(handle)

    # --- the flow --------------------------------------------------------------------------
    async def handle(
        self, event: Event, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        if not self.readiness.ready:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, self.readiness.reason)
        started = time.perf_counter()
        options = call_options(context)
        deadline = None if options["timeout"] is None else time.monotonic() + options["timeout"]
        spec = INTERCEPTED[event]
        try:
            request = spec.request.FromString(raw)
        except DecodeError as exc:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"cannot decode {spec.request.__name__}: {exc}",
            )
        call = _Call(event, request)
        self._views(call)
        async with self._locks.hold(call.lock_key):
            try:
                merger, changed = await self._pre(call, deadline)
            except CrihookError as exc:
                log.warning("%s refused: %s", event.value, exc, extra=call.describe())
                await _abort(context, exc.status, f"{exc} ({_who(call)})")
            forwarded = request.SerializeToString() if changed else raw
            if deadline is not None:
                options["timeout"] = max(deadline - time.monotonic(), 0.0)
            try:
                response_raw: bytes = await self._forward[event](forwarded, **options)
            except grpc.aio.AioRpcError as err:
                log.info(
                    "%s failed in the runtime: %s",
                    event.value,
                    err.code().name,
                    extra=call.describe(),
                )
                await abort_with(context, err)
            response = spec.response.FromString(response_raw)
            self._record(call, response, merger)
            await self._post(call, response, merger, deadline)
            if self.store.hook_states_dirty:
                await self.store.flush()  # allocations are on disk before kubelet hears OK
            else:
                self.store.schedule()  # records can be rebuilt from the runtime
        if log.isEnabledFor(logging.INFO):  # don't build the record's extras for nothing
            log.info(
                "%s ok%s",
                event.value,
                " (adjusted)" if changed else "",
                extra={
                    **call.describe(),
                    "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
                },
            )
        return response_raw

    def _views(self, call: _Call) -> None:
        """Views from the request where it carries the config, from the store where it only
        carries an id."""
        req = call.request
        store = self.store
        if call.event is Event.RUN_POD_SANDBOX:
            call.pod = pod_view_from_config("", req.config, req.runtime_handler)
        elif call.event is Event.CREATE_CONTAINER:
            call.pod_record = store.pod(req.pod_sandbox_id)
            call.pod = (
                call.pod_record.view
                if call.pod_record
                else pod_view_from_config(req.pod_sandbox_id, req.sandbox_config)
            )
            call.container = container_view_from_config("", call.pod, req.config)
        elif call.event in (Event.STOP_POD_SANDBOX, Event.REMOVE_POD_SANDBOX):
            call.pod_record = store.pod(req.pod_sandbox_id)
            call.pod = (
                call.pod_record.view
                if call.pod_record
                else PodView(id=req.pod_sandbox_id, uid="", name="", namespace="")
            )
        else:
            call.container_record = store.container(req.container_id)
            if call.container_record is not None:
                call.container = call.container_record.view
                call.pod_record = store.pod(call.container.pod_id)
            else:
                call.container = ContainerView(id=req.container_id, pod_id="", name="")
            if call.pod_record is not None:
                call.pod = call.pod_record.view

    async def _pre(self, call: _Call, deadline: float | None) -> tuple[Merger | None, bool]:
        changed = False
        if call.event is Event.CREATE_CONTAINER and call.pod_record is not None:
            # containerd places the container under the cgroup parent of the sandbox config
            # in this request: keep it equal to what the sandbox was really created with.
            sandbox_linux = call.request.sandbox_config.linux
            if sandbox_linux.cgroup_parent != call.pod_record.view.cgroup_parent:
                sandbox_linux.cgroup_parent = call.pod_record.view.cgroup_parent
                changed = True
        if not self.chain.entries or self.chain.exempt(call.pod):
            return None, changed
        if self.chain.settings.dry_run:
            if not self.chain.wants(call.event, Stage.PRE):
                return None, changed
            # Every hook runs on a copy: the log shows what the chain would do, the runtime
            # and the store get what kubelet sent.
            scratch = type(call.request)()
            scratch.CopyFrom(call.request)
            await self.chain.run(
                call.event, Stage.PRE, call.pod, call.container, scratch, None, deadline
            )
            return None, changed
        merger = await self.chain.run(
            call.event, Stage.PRE, call.pod, call.container, call.request, None, deadline
        )
        return merger, changed or merger.changed

    def _record(self, call: _Call, response: Any, merger: Merger | None) -> None:
        """Keep the store true to what the runtime now has."""
        event, req = call.event, call.request
        audit = _audit(event, merger) if merger else {}
        if event is Event.RUN_POD_SANDBOX:
            pod_view = pod_view_from_config(
                response.pod_sandbox_id, req.config, req.runtime_handler
            )
            self.store.put_pod(PodRecord(pod_view, audit))
        elif event is Event.CREATE_CONTAINER:
            pod = call.pod
            if call.pod_record is None:
                pod = pod_view_from_config(req.pod_sandbox_id, req.sandbox_config)
                self.store.put_pod(PodRecord(pod))
            assert call.container is not None
            changed = {key[0] for key in merger.owners} if merger else set()
            view = container_view_updated(
                call.container,
                response.container_id,
                req.config,
                labels=Field.LABEL in changed,
                annotations=Field.ANNOTATION in changed,
                resources=not changed.isdisjoint(RESOURCE_FIELDS),
            )
            self.store.put_container(ContainerRecord(view, audit))
        elif event is Event.UPDATE_CONTAINER_RESOURCES and call.container_record is not None:
            record = call.container_record
            res = resources_view(req.linux, call.pod.qos_class)
            record.view = ContainerView(**{**record.view.__dict__, "resources": res})
            record.audit.update(audit)
            self.store.put_container(record)
        elif event is Event.REMOVE_CONTAINER:
            self.store.remove_container(req.container_id)
        elif event is Event.REMOVE_POD_SANDBOX:
            self.store.remove_pod(req.pod_sandbox_id)

    async def _post(
        self, call: _Call, response: Message, pre: Merger | None, deadline: float | None
    ) -> None:
        updates = list(pre.updates) if pre else []
        if (
            self.chain.entries
            and not self.chain.exempt(call.pod)
            and self.chain.wants(call.event, Stage.POST)
        ):
            try:
                post = await self.chain.run(
                    call.event,
                    Stage.POST,
                    call.pod,
                    call.container,
                    call.request,
                    response,
                    deadline,
                )
                updates.extend(post.updates)
            except CrihookError as exc:
                # The runtime already did it: a post-stage failure is reported, never undone.
                log.error("post-%s: %s", call.event.value, exc, extra=call.describe())
        if updates and not self.chain.settings.dry_run:
            await self._send_updates(call, updates)

    async def _send_updates(self, call: _Call, updates: list[tuple[str, ContainerUpdate]]) -> None:
        """UpdateContainerResources for other containers, after the call succeeded. A failure
        is logged, counted and kept in the target's record (shown by `crihook state`)."""
        for hook, update in updates:
            target = self.store.container(update.container_id)
            request = build_update_request(update, target.view if target else None)
            try:
                await self._update(request.SerializeToString(), timeout=10)
            except grpc.aio.AioRpcError as err:
                self.update_failures += 1
                log.error(
                    "update of container %s for hook %s failed: %s: %s",
                    update.container_id[:12],
                    hook,
                    err.code().name,
                    err.details(),
                    extra=call.describe(),
                )
                if target is not None:
                    target.update_errors.append(
                        {
                            "hook": hook,
                            "code": err.code().name,
                            "details": err.details(),
                            "at": time.time(),
                            "resources": dict(update.resources.items()),
                        }
                    )
                    self.store.put_container(target)
                continue
            if target is not None:
                res = resources_view(request.linux, target.view.resources.qos_class)
                target.view = ContainerView(**{**target.view.__dict__, "resources": res})
                for name, value in update.resources.items():
                    target.audit[name] = {
                        "hook": hook,
                        "value": value,
                        "event": "update",
                        "at": time.time(),
                    }
                self.store.put_container(target)


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


def _audit(event: Event, merger: Merger) -> dict[str, dict[str, Any]]:
    """The store's audit entries of one call: per field, who set it to what (the dicts of
    FieldChange.to_dict plus the call), built directly: this runs on every adjusted call."""
    now, name, values = time.time(), event.value, merger.values
    entries = {}
    for key, hook in merger.owners.items():
        label = describe_key(key)
        value = jsonable(values[key])
        entries[label] = {"hook": hook, "field": label, "value": value, "event": name, "at": now}
    return entries


def _who(call: _Call) -> str:
    pod = f"pod {call.pod.namespace}/{call.pod.name}" if call.pod.name else f"pod {call.pod.id}"
    if call.container is not None:
        return f"{pod}, container {call.container.name or call.container.id}"
    return pod


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, message: str
) -> NoReturn:
    await context.abort(code, f"crihook: {message}")
    raise AssertionError("unreachable: abort raises")  # pragma: no cover
