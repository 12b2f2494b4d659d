"""The flow of one intercepted call, written once for all nine, with no transport in it:

    decode → views (from the request or the store) → per-pod lock → pre stage (chain) →
    encode only if something changed → runtime → store (+ audit) → post stage →
    updates to other containers issued (sent in the background, proxy.core.updates) → the
    runtime's response bytes, unchanged.

`Pipeline.handle(method, request bytes, metadata, deadline)` drives a `Runtime` and returns an
`Outcome` (see `proxy.cri.outcome`): the gRPC server is a thin adapter that turns it into an
answer or a status, a recording writes it down, and a replay compares it with a recording.
With no hook adjusting anything the request bytes kubelet sent are forwarded as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Mapping
from dataclasses import replace
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerState, ContainerView, Event, PodView, Stage
from crihook.hooks.spec.adjustment import RESOURCE_FIELDS, Field
from crihook.hooks.spec.views import (
    container_view_from_config,
    container_view_updated,
    pod_view_from_config,
    resources_updated,
    resources_view,
)
from crihook.proxy.chain.call import ChainCall
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.merge import Audit, Merged
from crihook.proxy.core import observe
from crihook.proxy.core.memory_trim import LARGE_MESSAGE_BYTES
from crihook.proxy.core.placement import Placement
from crihook.proxy.core.readback import ReadBack
from crihook.proxy.core.updates import MAX_PARALLEL, WAITED_PARALLEL, ContainerUpdater
from crihook.proxy.core.validate import check_request, check_resources, check_wire
from crihook.proxy.cri.events import EVENTS, EventSpec, StoreEffect, Target
from crihook.proxy.cri.methods import method_path
from crihook.proxy.cri.outcome import Metadata, Outcome, Status
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.cri.runtime import Runtime, RuntimeCallFailed
from crihook.proxy.cri.verdicts import Origin
from crihook.proxy.errors import CrihookError, HookRejected
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.store import Store

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)

_UNDO_TIMEOUT = 30.0  # stopping a sandbox tears down its network: give it time
_UNKNOWN_POD = PodView(id="", uid="", name="", namespace="")
# Statuses after which the runtime may have carried the call out or not: the connection
# broke, or the deadline passed while it acted. (containerd answers UNKNOWN for errors it
# did not classify, after cleaning up: a failure.)
_UNKNOWN_OUTCOME = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


_StoreEffect = Callable[["_Call", Any, "Merged | None", Audit], None]
"""What the store keeps of a call the runtime answered OK: (call, response, merger, audit)."""


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


class _Gate:
    """Calls pass in parallel; `quiesced()` waits until none is inside and keeps new ones
    out meanwhile: hooks synchronize with the runtime while no call holds a reservation the
    runtime has not answered yet. A call enters after taking its pod's lock and waits for no
    other lock inside, so closing the gate cannot deadlock. `idle` is set while no call is
    inside (updates to other containers let calls go first)."""

    __slots__ = ("_closing", "_inside", "_open", "idle")

    def __init__(self) -> None:
        self._inside = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._closing = asyncio.Lock()

    async def __aenter__(self) -> None:
        while not self._open.is_set():
            await self._open.wait()
        self._inside += 1
        self.idle.clear()

    async def __aexit__(self, *exc: object) -> None:
        self._inside -= 1
        if not self._inside:
            self.idle.set()

    @contextlib.asynccontextmanager
    async def quiesced(self) -> AsyncIterator[None]:
        async with self._closing:
            self._open.clear()
            try:
                await self.idle.wait()
                yield
            finally:
                self._open.set()


class _Call:
    """What the pipeline knows about one intercepted call."""

    __slots__ = (
        "container",
        "container_record",
        "event",
        "exempt",
        "hooked",
        "pod",
        "pod_record",
        "request",
        "spec",
    )

    def __init__(self, spec: EventSpec, request: Any) -> None:
        self.spec = spec
        self.event = spec.event
        self.request = request
        self.pod: PodView = _UNKNOWN_POD
        self.container: ContainerView | None = None
        self.pod_record: PodRecord | None = None
        self.container_record: ContainerRecord | None = None
        self.exempt: bool | None = None
        """Whether the pod is exempt from the hooks: worked out once, for both stages."""
        self.hooked: ChainCall | None = None
        """The call as the chain sees it: made once, for the pre and the post stage."""

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
        self,
        runtime: Runtime,
        chain: Chain,
        store: Store,
        readiness: Readiness,
        placement: Placement | None = None,
        hugepage_sizes: Collection[str] = (),
        read_back: bool = False,
        updates_after_answer: bool = True,
        updater: ContainerUpdater | None = None,
        events: Mapping[Event, EventSpec] = EVENTS,
        *,
        on_outcome: Callable[[Outcome], None] | None = None,
        on_unknown_outcome: Callable[[PodView], None] | None = None,
        after_large: Callable[[int], None] | None = None,
        describe_updates: bool = True,
    ) -> None:
        """`read_back`: after each CreateContainer a hook adjusted, compare what the runtime
        made with what the hooks set (proxy.core.readback), in the background.
        `updates_after_answer`: updates to other containers go out after the call is
        answered (issued, sent in the background); False: the call waits for them.
        `events`: the calls intercepted, one row each (crihook.proxy.cri.events); a call
        with no row is refused, never given to the hooks (the servers forward it instead).
        The callbacks and `describe_updates` are the attributes below; they stay assignable,
        for listeners built from the pipeline itself (a recorder takes its `quiesced`)."""
        self.runtime = runtime
        self.hugepage_sizes = frozenset(hugepage_sizes)
        """The node's hugepage sizes as runc names them ("2MB", ...): a request for another
        is refused at the door (none known: any well-formed size passes)."""
        self.chain = chain
        self.store = store
        self.readiness = readiness
        self.placement = placement or Placement("none", ())
        self._locks = _PodLocks()
        self.events = events
        self._forward = {e: runtime.call(spec.path) for e, spec in events.items()}
        self._views_of = {
            Target.NEW_POD: self._new_pod_views,
            Target.NEW_CONTAINER: self._new_container_views,
            Target.POD: self._pod_views,
            Target.CONTAINER: self._container_views,
        }
        self._store_effects: dict[StoreEffect, _StoreEffect] = {
            StoreEffect.PUT_POD: self._put_pod,
            StoreEffect.PUT_CONTAINER: self._put_container,
            StoreEffect.CONTAINER_RESOURCES: self._container_resources,
            StoreEffect.POD_RESOURCES: self._pod_resources,
            StoreEffect.RUNNING: self._running,
            StoreEffect.EXITED: self._exited,
            StoreEffect.REMOVE_CONTAINER: self._remove_container,
            StoreEffect.REMOVE_POD: self._remove_pod,
            StoreEffect.NOTHING: _nothing,
        }
        self._gate = _Gate()
        self.quiesced = self._gate.quiesced
        self.updater = updater or ContainerUpdater(
            runtime,
            store,
            calls_idle=self._gate.idle if updates_after_answer else None,
            parallel=MAX_PARALLEL if updates_after_answer else WAITED_PARALLEL,
        )
        self.updates_after_answer = updates_after_answer
        self.describe_updates = describe_updates
        """Describe the updates a call issued in its outcome (`Outcome.updates`): for who
        reads them (a recording, a replay); O(members) for a group update."""
        self.read_back = ReadBack(runtime, store) if read_back else None
        self._undo = {
            m: runtime.call(method_path("RuntimeService", m))
            for m in ("StopPodSandbox", "RemovePodSandbox")
        }
        self._seq = itertools.count(1)
        self.on_unknown_outcome = on_unknown_outcome
        """Called when a call failed in a way that leaves the runtime's outcome unknown (the
        runtime went away, kubelet's deadline passed): the pod is reconciled soon after."""
        self.on_outcome = on_outcome
        """Told every call's outcome, with each hook's run and what the hooks asked the node
        (recording, replay); also when kubelet cancelled the call. Called on the event loop;
        must not block."""
        self.after_large = after_large
        """Told the size of each request of LARGE_MESSAGE_BYTES or more, once its call
        ended (proxy/core/memory_trim.py gives the memory back)."""

    def next_seq(self) -> int:
        """The next number in the order calls enter the chain (a synchronize takes one too)."""
        return next(self._seq)

    # --- the flow --------------------------------------------------------------------------
    def handle(
        self,
        event: Event,
        raw: bytes,
        metadata: Metadata | None = None,
        deadline: float | None = None,
    ) -> Coroutine[Any, Any, Outcome]:
        """Run one intercepted call. `deadline`: kubelet's, on the time.monotonic() clock.
        Returns how it ended; raises only CancelledError (kubelet gave up) and bugs. (A
        plain function returning the flow's own coroutine: no wrapper coroutine per call.)"""
        outcome = Outcome(event, raw, metadata)
        if self.on_outcome is None:
            flow = self._handle(outcome, deadline)
        else:
            flow = self._handle_and_tell(outcome, deadline, self.on_outcome)
        if self.after_large is not None and len(raw) >= LARGE_MESSAGE_BYTES:
            return _then(flow, self.after_large, len(raw))
        return flow

    async def _handle_and_tell(
        self, outcome: Outcome, deadline: float | None, tell: Callable[[Outcome], None]
    ) -> Outcome:
        outcome.started = time.time()
        if deadline is not None:
            outcome.timeout = max(deadline - time.monotonic(), 0.0)
        outcome.trace = []
        outcome.observed, token = observe.begin()
        try:
            await self._handle(outcome, deadline)
        except asyncio.CancelledError:
            outcome.fail(
                Origin.KUBELET, Status(grpc.StatusCode.CANCELLED, "kubelet cancelled the call")
            )
            self._tell(tell, outcome)
            raise
        finally:
            observe.end(token)
        self._tell(tell, outcome)
        return outcome

    def _tell(self, tell: Callable[[Outcome], None], outcome: Outcome) -> None:
        if not outcome.seq:
            outcome.seq = next(self._seq)  # ended before it entered the chain
        outcome.elapsed = time.time() - outcome.started
        tell(outcome)

    async def _handle(self, outcome: Outcome, deadline: float | None) -> Outcome:
        event = outcome.event
        raw = outcome.received
        if not self.readiness.ready:
            outcome.ready = False
            return _refused(outcome, grpc.StatusCode.UNAVAILABLE, self.readiness.reason)
        spec = self.events.get(event)
        if spec is None:  # a wiring bug: the servers route only what the table holds
            return _refused(outcome, grpc.StatusCode.INTERNAL, f"{event.value} is not intercepted")
        try:
            request = spec.request.FromString(raw)
        except DecodeError as exc:
            return _refused(
                outcome,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"cannot decode {spec.request.__name__}: {exc}",
            )
        problem = (
            check_wire(event, raw)
            or check_request(event, request)
            or check_resources(event, request, self.hugepage_sizes)
        )
        if problem is not None:
            return _refused(outcome, grpc.StatusCode.INVALID_ARGUMENT, problem)
        call = _Call(spec, request)
        self._views(call)
        outcome.pod = call.pod
        outcome.container = call.container
        trace = outcome.trace
        async with self._locks.hold(call.lock_key), self._gate:
            if (
                spec.waits_for_updates
                and call.container is not None
                and self.updater.pending(call.container.id)
            ):
                await self.updater.settled(call.container.id)
                self._views(call)  # the update changed the container's record
                outcome.container = call.container
            outcome.seq = next(self._seq)
            ran: list[str] = []  # hooks whose pre stage ran: told if the call fails
            try:
                merger, changed = await self._pre(call, deadline, ran, trace)
            except CrihookError as exc:
                log.warning("%s refused: %s", event.value, exc, extra=call.describe())
                await self._failed(call, ran, str(exc), trace)
                return _refused(outcome, exc.status, f"{exc} ({_who(call)})")
            except BaseException as exc:  # cancelled by kubelet, or a bug: release all the same
                await self._failed(call, ran, _gone(exc, "before the call was forwarded"), trace)
                raise
            forwarded = request.SerializeToString() if changed else raw
            outcome.forwarded = forwarded
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            starting = (
                self.updater.starting(request.container_id)  # type: ignore[attr-defined]
                if spec.starts_container
                else contextlib.nullcontext()
            )
            sent = time.monotonic()
            try:
                with starting:
                    response_raw = await self._forward[event](
                        forwarded, timeout=timeout, metadata=outcome.metadata
                    )
            except RuntimeCallFailed as err:
                outcome.runtime_elapsed = time.monotonic() - sent
                code = err.status.code  # logged with the call (proxy.ops.call_log)
                if code in _UNKNOWN_OUTCOME:
                    self._outcome_unknown(call)
                else:
                    failure = f"the runtime answered {code.name}: {err.status.details}"
                    await self._failed(call, ran, failure, trace)
                return outcome.fail(Origin.RUNTIME, err.status)
            except BaseException:
                # kubelet gave up while the runtime was acting: it may have done it or not.
                self._outcome_unknown(call)
                raise
            outcome.runtime_elapsed = time.monotonic() - sent
            outcome.response = response_raw
            response = spec.response.FromString(response_raw)
            self._update_store(call, response, merger)
            if merger is not None and merger.unapplied:
                await self._not_applied(call, merger.unapplied, trace)
            try:
                await self._post(call, response, merger, deadline, ran, outcome)
            except HookRejected as exc:  # a sandbox a hook cannot set up: undone, then failed
                await self._undo_sandbox(call, response.pod_sandbox_id)  # type: ignore[attr-defined]
                await self._failed(call, ran, str(exc), trace)
                self.store.write_behind()
                return _refused(outcome, exc.status, f"{exc} ({_who(call)})")
            # After the runtime acted a write failure never turns its success into an error:
            # the store keeps it in memory and retries in the background.
            self.store.write_behind()
        return outcome  # its log line: proxy.ops.call_log

    async def _failed(
        self, call: _Call, ran: list[str], failure: str, trace: list[Any] | None = None
    ) -> None:
        """Tell every hook whose pre stage ran that the call failed, so nothing stays
        allocated for it. Runs to its end even if kubelet's call is cancelled meanwhile:
        the pod lock is still held, so a retry cannot overtake the release."""
        if not ran:
            return
        told = ChainCall(
            call.event, call.pod, call.container, call.request, spec=call.spec, ran=ran, trace=trace
        )
        task = asyncio.ensure_future(self.chain.failed(told, failure))
        cancelled = False
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        if self.store.hook_states_dirty:
            self.store.write_behind()

    async def _not_applied(
        self, call: _Call, unapplied: Mapping[str, str], trace: list[Any] | None
    ) -> None:
        """Hooks whose adjustment was not applied (dry-run, an ignored failure) release what
        they took, as for a failed call."""
        for name, why in unapplied.items():
            await self._failed(call, [name], why, trace)

    async def _undo_sandbox(self, call: _Call, sandbox_id: str) -> None:
        """A hook refused the sandbox the runtime just made (its post stage could not set it
        up): stop and remove it, so kubelet, told the call failed, is left nothing to leak."""
        for method in ("StopPodSandbox", "RemovePodSandbox"):
            request = getattr(api_pb2, f"{method}Request")(pod_sandbox_id=sandbox_id)
            try:
                await self._undo[method](request.SerializeToString(), timeout=_UNDO_TIMEOUT)
            except RuntimeCallFailed as err:
                # Left to kubelet's garbage collection, which lists what the runtime has.
                log.error(
                    "undoing sandbox %s: %s failed: %s: %s",
                    sandbox_id[:12],
                    method,
                    err.status.code.name,
                    err.status.details,
                    extra=call.describe(),
                )
        self.store.remove_pod(sandbox_id)

    def _outcome_unknown(self, call: _Call) -> None:
        """The runtime may or may not have done it: what the hooks reserved stays reserved
        until the pod is reconciled with the runtime (soon after); the hooks' synchronize
        then confirms what the runtime kept and releases the rest. Releasing now could hand
        the CPUs of a container that does exist to another one."""
        if self.on_unknown_outcome is not None:
            self.on_unknown_outcome(call.pod)

    def _views(self, call: _Call) -> None:
        """Views from the request where it carries the config, from the store where it only
        carries an id (what the call names: its row's `target`)."""
        self._views_of[call.spec.target](call)

    def _new_pod_views(self, call: _Call) -> None:
        req = call.request
        call.pod = pod_view_from_config("", req.config, req.runtime_handler)

    def _new_container_views(self, call: _Call) -> None:
        req = call.request
        call.pod_record = self.store.pod(req.pod_sandbox_id)
        call.pod = (
            call.pod_record.view
            if call.pod_record
            else pod_view_from_config(req.pod_sandbox_id, req.sandbox_config)
        )
        call.container = container_view_from_config("", call.pod, req.config)

    def _pod_views(self, call: _Call) -> None:
        req = call.request
        call.pod_record = self.store.pod(req.pod_sandbox_id)
        call.pod = (
            call.pod_record.view
            if call.pod_record
            else PodView(id=req.pod_sandbox_id, uid="", name="", namespace="")
        )

    def _container_views(self, call: _Call) -> None:
        req = call.request
        store = self.store
        call.container_record = store.container(req.container_id)
        if call.container_record is not None:
            call.container = call.container_record.view
            call.pod_record = store.pod(call.container.pod_id)
        else:
            call.container = ContainerView(id=req.container_id, pod_id="", name="")
        if call.pod_record is not None:
            call.pod = call.pod_record.view

    async def _pre(
        self, call: _Call, deadline: float | None, ran: list[str], trace: list[Any] | None
    ) -> tuple[Merged | None, bool]:
        """Hints, placement and the pre stage. The merger (None when no hook ran) and
        whether the request changed. What the hooks reserved is on disk before this
        returns (StateWriteError if it cannot be)."""
        changed = False
        if call.spec.carries_pod_cgroup and call.pod_record is not None:
            # containerd places the container under the cgroup parent of the sandbox config
            # in this request: keep it equal to what the sandbox was really created with.
            sandbox_linux = call.request.sandbox_config.linux
            if sandbox_linux.cgroup_parent != call.pod_record.view.cgroup_parent:
                sandbox_linux.cgroup_parent = call.pod_record.view.cgroup_parent
                changed = True
        chain = self.chain
        required = chain.requires(call.event, call.pod)
        if not chain.entries and not required:
            return None, changed
        exempt = self._exempt(call)
        validate = chain.wants(call.event, Stage.VALIDATE, exempt)
        if not (validate or required or chain.wants(call.event, Stage.PRE, exempt)):
            return None, changed
        hooked = self._hooked(call, deadline, ran, trace)
        hooked.affinity = await self._place(hooked)
        dry_run = chain.settings.dry_run
        # Global dry-run: every hook runs on a copy; the log shows what the chain would do,
        # the runtime and the store get what kubelet sent.
        if dry_run:
            target = type(call.request)()
            target.CopyFrom(call.request)
            hooked.request = target
        try:
            with self.store.track_changes() as changes:
                merger = await chain.pre(hooked)
            if validate or required:
                await self._validate(call, hooked, merger, dry_run)
        finally:
            hooked.request = call.request  # the post stage sees what the runtime got
        if changes.last:
            await self.store.write_ahead(changes.last)  # on disk before the runtime acts
        if dry_run:
            return merger, changed
        return merger, changed or merger.changed

    def _exempt(self, call: _Call) -> bool:
        if call.exempt is None:
            call.exempt = self.chain.exempt(call.pod)
        return call.exempt

    def _hooked(
        self, call: _Call, deadline: float | None, ran: list[str], trace: list[Any] | None
    ) -> ChainCall:
        if call.hooked is None:
            call.hooked = ChainCall(
                call.event,
                call.pod,
                call.container,
                call.request,
                spec=call.spec,
                deadline=deadline,
                exempt=self._exempt(call),
                ran=ran,
                trace=trace,
            )
        return call.hooked

    async def _validate(
        self, call: _Call, hooked: ChainCall, merger: Merged, dry_run: bool
    ) -> None:
        """Validators see the request as it would be forwarded and who set what; a refusal
        fails the call before anything reaches the runtime (in dry-run it is logged)."""
        try:
            await self.chain.validate(hooked, merger)
        except HookRejected as exc:
            if not dry_run:
                raise
            log.info("dry-run: %s would refuse the call", exc, extra=call.describe())

    async def _place(self, hooked: ChainCall) -> Any:
        """The NUMA placement the topology policy picks from every hook's hints, or None."""
        if (
            self.placement.policy == "none"
            or not hooked.spec.hints
            or not self.chain.wants(hooked.event, Stage.HINTS, hooked.exempt)
        ):
            return None  # no alignment asked: hints would change nothing
        return self.placement.choose(await self.chain.hints(hooked))

    def _update_store(self, call: _Call, response: Any, merger: Merged | None) -> None:
        """Keep the store true to what the runtime now has (what changes: the call's row's
        `store`). An answer without the id it must carry is not stored (the store never
        holds an empty id)."""
        audit = merger.audit() if merger is not None else {}
        self._store_effects[call.spec.store](call, response, merger, audit)

    def _put_pod(self, call: _Call, response: Any, merger: Merged | None, audit: Audit) -> None:
        req = call.request
        if not response.pod_sandbox_id:
            log.error("RunPodSandbox answered without a sandbox id; not stored")
            return
        pod_view = pod_view_from_config(response.pod_sandbox_id, req.config, req.runtime_handler)
        self.store.put_pod(PodRecord(pod_view, audit))

    def _put_container(
        self, call: _Call, response: Any, merger: Merged | None, audit: Audit
    ) -> None:
        req = call.request
        if not response.container_id:
            log.error("CreateContainer answered without a container id; not stored")
            return
        if call.pod_record is None:
            # A pod crihook had not seen: its view, made from this request's sandbox
            # config before the hooks ran (they cannot change that config), is kept.
            self.store.put_pod(PodRecord(call.pod))
        assert call.container is not None
        changed = merger.changed_fields() if merger is not None else set()
        view = container_view_updated(
            call.container,
            response.container_id,
            req.config,
            labels=Field.LABEL in changed,
            annotations=Field.ANNOTATION in changed,
            resources=not changed.isdisjoint(RESOURCE_FIELDS),
            cdi_devices=Field.CDI_DEVICE in changed,
        )
        self.store.put_container(ContainerRecord(view, audit, state=ContainerState.CREATED))
        if self.read_back is not None and merger is not None and merger.changed:
            self.read_back.after_create(response.container_id, *merger.owned())

    def _container_resources(
        self, call: _Call, response: Any, merger: Merged | None, audit: Audit
    ) -> None:
        req = call.request
        self.updater.applied_by_call(req.container_id, req.linux)
        record = call.container_record
        if record is None:
            return
        # As containerd applies it: what the update leaves unset stays as it was.
        res = resources_updated(record.view.resources, req.linux)
        record.view = replace(record.view, resources=res)
        record.audit.update(audit)
        self.store.put_container(record)

    def _pod_resources(
        self, call: _Call, response: Any, merger: Merged | None, audit: Audit
    ) -> None:
        pod_record = call.pod_record
        if pod_record is None:
            return
        res = resources_view(call.request.resources, call.pod.qos_class)
        pod_record.view = replace(pod_record.view, resources=res)
        pod_record.audit.update(audit)
        self.store.put_pod(pod_record)

    def _running(self, call: _Call, response: Any, merger: Merged | None, audit: Audit) -> None:
        self.store.set_state(call.request.container_id, ContainerState.RUNNING)

    def _exited(self, call: _Call, response: Any, merger: Merged | None, audit: Audit) -> None:
        self.store.set_state(call.request.container_id, ContainerState.EXITED)

    def _remove_container(
        self, call: _Call, response: Any, merger: Merged | None, audit: Audit
    ) -> None:
        container_id = call.request.container_id
        self.store.remove_container(container_id)
        self.updater.forget(container_id)

    def _remove_pod(self, call: _Call, response: Any, merger: Merged | None, audit: Audit) -> None:
        pod_id = call.request.pod_sandbox_id
        for cid in [c.id for c in self.store.containers_of(pod_id)]:
            self.updater.forget(cid)
        self.store.remove_pod(pod_id)

    async def _post(
        self,
        call: _Call,
        response: Message,
        pre: Merged | None,
        deadline: float | None,
        ran: list[str],
        outcome: Outcome,
    ) -> None:
        """The post stage and the updates (noted in `outcome`). Raises HookRejected when a
        hook refuses a sandbox the runtime made (post-RunPodSandbox: setting it up failed);
        `ran` then names the hooks to tell. Any other post-stage failure is reported, never
        undone."""
        updates = list(pre.updates) if pre else []
        groups = list(pre.groups) if pre else []
        if self.chain.entries and self.chain.wants(call.event, Stage.POST, self._exempt(call)):
            try:
                hooked = self._hooked(call, deadline, ran, outcome.trace)
                post = await self.chain.post(hooked, response)
                updates.extend(post.updates)
                groups.extend(post.groups)
            except HookRejected:
                if call.spec.undo_on_post_reject:
                    raise
                log.error("post-%s refused after the runtime acted", call.event.value)
            except CrihookError as exc:
                # The runtime already did it: a post-stage failure is reported, never undone.
                log.error("post-%s: %s", call.event.value, exc, extra=call.describe())
        if (updates or groups) and not self.chain.settings.dry_run:
            if self.updates_after_answer:
                # What was issued is described only for who reads it (recording, replay):
                # a group's description is one update per member.
                outcome.updates = self.updater.issue(
                    updates, call.describe(), self.describe_updates, groups
                )
            else:
                outcome.updates = await self.updater.send(updates, call.describe(), groups)


def _nothing(call: _Call, response: Any, merger: Merged | None, audit: Audit) -> None:
    """StopPodSandbox: the pod stays (until RemovePodSandbox)."""


async def _then(
    flow: Coroutine[Any, Any, Outcome], tell: Callable[[int], None], size: int
) -> Outcome:
    try:
        return await flow
    finally:
        tell(size)


def _gone(exc: BaseException, when: str) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return f"kubelet cancelled the call {when}"
    return f"the call failed {when}: {type(exc).__name__}: {exc}"


def _who(call: _Call) -> str:
    pod = f"pod {call.pod.namespace}/{call.pod.name}" if call.pod.name else f"pod {call.pod.id}"
    if call.container is not None:
        return f"{pod}, container {call.container.name or call.container.id}"
    return pod


def _refused(outcome: Outcome, code: grpc.StatusCode, message: str) -> Outcome:
    """crihook ends the call itself (the runtime never saw it, or its answer is undone)."""
    return outcome.fail(Origin.CRIHOOK, Status(code, f"crihook: {message}"))
