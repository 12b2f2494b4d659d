"""Updates to other containers that hooks ask for: UpdateContainerResources crihook sends.

Hooks return them with an adjustment (`update_container`), from any stage, or from
`synchronize` (repairs). A call *issues* them once it succeeded (`issue`): they are queued
per target container and sent in the background by `MAX_PARALLEL` workers at most, so the
call that caused them is answered without waiting for them (`updates = "after-answer"`, the
default; `"before-answer"` makes the call wait, as `send` does for synchronize's repairs).

Per target container, in order and coalesced: each update carries the order in which hooks
produced it (`PendingUpdate.seq`), and per container and field only the newest is due. A
container due several shared pools gets only the newest; one overtaken before it went out
is never sent. A target is in the queue once, and one worker at a time sends to it.

Each request carries the container's current resources (the store's record when it goes
out) with the due fields on top (a runtime may read an absent field as "set to zero").

A later call that names a target with an update due or on its way first waits (`settled`)
until that update was tried: sent, or failed. A failure is logged with the call that issued
it, counted and kept in the target's record (shown by `crihook state`); the fields go back to
due (unless something newer is due) and are sent again after a backoff (0.2 s doubling to
5 s), so the newest value always goes out in the end. NOT_FOUND is not retried: the
container is gone (the reconcile forgets it). An update is a whole set of resources, so
sending it again does what sending it once does.

A group update (`GroupUpdate`: every container of a shared pool) is issued in O(1): the
workers walk its members in the background, a few at a time, and ask the group for each
container's resources only when they send them, so a container due several of the group's
updates meanwhile is sent the newest only, and one whose record already shows it is sent
nothing. A later call for a container the walk has not reached yet waits as for any update:
its update is marked due at once, first in line.

`window`: seconds from when a container was due new resources until the runtime applied
them: the time a shared container can still run on a CPU just handed out exclusively.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, NamedTuple

import grpc

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerUpdate, ContainerView, GroupUpdate, ResourceDelta
from crihook.hooks.spec.views import ResourcesView, resources_updated
from crihook.proxy.chain.merge import PendingGroup, PendingUpdate, next_order
from crihook.proxy.core.histogram import Histogram
from crihook.proxy.cri.outcome import SentUpdate, Status
from crihook.proxy.cri.runtime import Runtime, RuntimeCallFailed, UnaryCall
from crihook.proxy.state.records import ContainerRecord
from crihook.proxy.state.store import Store
from crihook.proxy.state.unsettled import (
    UPDATE_PATH,
    ContainerUpdateCall,
    Unsettled,
    UnsettledRuntime,
)

__all__ = [
    "MAX_PARALLEL",
    "WAITED_PARALLEL",
    "WINDOW_BUCKETS",
    "ContainerUpdater",
    "build_update_request",
]

log = logging.getLogger(__name__)

MAX_PARALLEL = 4
"""Updates on their way at once in the background: enough to keep a runtime busy (containerd
applies one in about 12 ms), few enough that kubelet's calls do not queue behind them."""
WAITED_PARALLEL = 16
"""... when a call waits for them (`before-answer`): as many as before the background."""
UPDATE_TIMEOUT_SECONDS = 10.0
CALLS_FIRST_SECONDS = 0.02
"""How long after it became due an update nobody waits for lets intercepted calls in flight
go first."""
RETRY_FIRST_SECONDS = 0.2
RETRY_MAX_SECONDS = 5.0
REMEMBER_REMOVED = 4096
WINDOW_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Seconds: from due to applied; kubelet's own CPU manager lives with up to 10 s."""
WALK_STEP = 16
"""Members of a group update marked due at a time, as the queue runs dry."""


class _Due(NamedTuple):
    value: Any
    seq: int
    hook: str
    group: GroupUpdate | None = None
    """Set: the value is the group's, asked when it goes out (`value` is None until then)."""


@dataclass(eq=False)
class _Walk:
    """A group update whose members are being marked due, in the background."""

    hook: str
    group: GroupUpdate
    seq: int
    since: float
    """When its oldest update not walked yet was issued (the members' window starts there)."""
    extra: Mapping[str, str]
    members: list[str] | None = None
    """Taken when the walk begins (a worker's, not the call's, work)."""
    done: int = 0


@dataclass(eq=False)
class _Target:
    """One container's updates: what is due, what went out, who waits."""

    container_id: str
    applied: dict[str, int] = field(default_factory=dict)
    """Field name → seq of the newest value the runtime applied (crihook's or a call's)."""
    due: dict[str, _Due] = field(default_factory=dict)
    due_since: float = 0.0
    """time.monotonic() when the oldest due field became due (0.0: nothing due)."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """The log fields of the newest call that issued an update to it."""
    queued: bool = False
    sending: int = 0
    """The highest seq on its way now (0: nothing is)."""
    tried: int = 0
    """The highest seq an attempt covered (applied, failed or overtaken)."""
    result: SentUpdate | None = None
    """The last attempt's, for `send` (kept only while someone waits)."""
    settled: asyncio.Event | None = None
    """Set (and dropped) when an attempt ends; made only when someone waits."""
    retry_delay: float = 0.0
    retry: asyncio.TimerHandle | None = None
    gone: bool = False

    def newest_due(self) -> int:
        return max((d.seq for d in self.due.values()), default=0)

    def busy(self) -> bool:
        return bool(self.due) or self.sending > 0


class ContainerUpdater:
    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        retry: bool = True,
        calls_idle: asyncio.Event | None = None,
        parallel: int = MAX_PARALLEL,
    ) -> None:
        """`retry`: send a failed update again later (a replay, which answers as the
        recording did, does not). `calls_idle`: set while no intercepted call is in the
        pipeline; an update nobody waits for lets calls go first (until CALLS_FIRST_SECONDS
        after it became due), so that the node's updates slow kubelet's calls less."""
        self._retry = retry
        self._calls_idle = calls_idle
        self._parallel = parallel
        self._update: ContainerUpdateCall
        self._ahead: Unsettled | None = None
        """Where a walk step names its members in one append before they are sent."""
        if isinstance(runtime, UnsettledRuntime):  # it marks by the id we know: no decode
            self._update = runtime.container_update()
            self._ahead = runtime.unsettled
        else:
            self._update = _by_request(runtime.call(UPDATE_PATH))
        self._store = store
        self._targets: dict[str, _Target] = {}
        self._queue: collections.deque[_Target] = collections.deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._names = itertools.count(1)
        self._closing = False
        """Closing: nothing more is queued."""
        self._closed = False
        """Closed: nobody waits for an update any more."""
        self._removed: dict[str, None] = {}
        """Ids of containers removed lately (oldest first, at most REMEMBER_REMOVED): an update
        still on its way to one is answered NOT_FOUND, and that is no failure."""
        self._starting: dict[str, asyncio.Event] = {}
        """Containers the runtime is starting now: their updates wait (`starting`)."""
        self._walks: dict[tuple[str, str], _Walk] = {}
        """(hook, group key) → the newest update of that group whose members are not all
        marked due yet."""
        self.built = 0
        """Update requests built (sent, or described): what a group update saves is counted."""
        self.failures = 0
        self.window = Histogram(WINDOW_BUCKETS)

    @contextlib.contextmanager
    def starting(self, container_id: str) -> Iterator[None]:
        """While the runtime starts `container_id`, updates to it wait. An update that lands
        while containerd or CRI-O makes the container's task changes the stored spec only:
        the started process keeps the old cpuset, and the status reports the new one, so no
        reconcile sees it (found through a real kubelet). Sent after the start answered, it
        reaches the process."""
        done = asyncio.Event()
        self._starting[container_id] = done
        try:
            yield
        finally:
            if self._starting.get(container_id) is done:
                del self._starting[container_id]
            done.set()

    async def _start_answered(self, container_id: str) -> None:
        """Until the runtime answered a start of `container_id` in flight (at most as long as
        an update may take)."""
        started = self._starting.get(container_id)
        if started is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(UPDATE_TIMEOUT_SECONDS):
                    await started.wait()

    # --- issuing ---------------------------------------------------------------------------
    def issue(
        self,
        updates: Iterable[PendingUpdate],
        extra: Mapping[str, str],
        describe: bool = True,
        groups: Iterable[PendingGroup] = (),
    ) -> list[SentUpdate]:
        """Queue every update (the newest per container and field) and every group update
        (walked later) and return at once what was issued: per target, the request as it
        would go out now, status None (with `describe` False, nothing: no one reads it; a
        group is described member by member). `extra`: the log fields of the call that
        produced them."""
        now = time.monotonic()
        described: dict[str, SentUpdate] = {}
        for pending in groups:
            walk = self._walk(pending, extra, now)
            if describe:
                described.update(self._described_group(walk))
        issued: dict[str, dict[str, _Due]] = {}
        for hook, update, seq in sorted(updates, key=lambda p: p.seq):
            cid = update.container_id
            target = self._targets.get(cid)
            if target is None:
                target = self._targets[cid] = _Target(cid)
            for name, value in update.resources.items():
                if seq <= target.applied.get(name, 0):
                    continue  # overtaken: a newer value is already in place
                current = target.due.get(name)
                if current is not None and current.seq >= seq:
                    continue
                if not target.due:
                    target.due_since = target.due_since or now
                target.due[name] = _Due(value, seq, hook)
                issued.setdefault(cid, {})[name] = target.due[name]
            if cid in issued:
                target.extra = extra
                self._enqueue(target)
        if not describe:
            return []
        described.update(
            (cid, self._as_issued(self._targets[cid], fields)) for cid, fields in issued.items()
        )
        return [described[cid] for cid in sorted(described)]

    def _walk(self, pending: PendingGroup, extra: Mapping[str, str], now: float) -> _Walk:
        """A group update issued: its walk (begun anew when the group had one going)."""
        hook, group, seq = pending
        key = (hook, group.key)
        before = self._walks.get(key)
        since = before.since if before is not None and before.seq < seq else now
        walk = self._walks[key] = _Walk(hook, group, seq, since, extra)
        if before is not None and before.seq > seq:
            self._walks[key] = before  # issued out of order: the newer stays
            return walk
        self._wake()
        return walk

    def _described_group(self, walk: _Walk) -> Iterator[tuple[str, SentUpdate]]:
        """A group update as the per-container updates it stands for now (a recording's)."""
        for cid in walk.group.members():
            target = self._targets.get(cid)
            applied = target.applied if target is not None else {}
            delta = walk.group.delta(cid)
            if delta is None:
                continue
            changed = {n: v for n, v in delta.items() if applied.get(n, 0) < walk.seq}
            if not changed:
                continue
            due = {n: d.value for n, d in target.due.items() if d.group is None} if target else {}
            record = self._store.container(cid)
            request = self._build(cid, {**due, **changed}, record)
            yield cid, SentUpdate(cid, _sent(request), changed, [walk.hook], None)

    async def send(
        self,
        updates: Iterable[PendingUpdate],
        extra: Mapping[str, str],
        groups: Iterable[PendingGroup] = (),
    ) -> list[SentUpdate]:
        """Issue every update and wait until each target's was tried; returns what was sent
        (the runtime's answer in `status`), by container id. For a start's or a reconcile's
        repairs, and the `before-answer` setting (a group's members are all marked due at
        once: the call waits for each)."""
        walks = [self._walk(pending, extra, time.monotonic()) for pending in groups]
        issued = self.issue(updates, extra)
        ids = {u.container_id for u in issued}
        for walk in walks:
            ids.update(self._walk_all(walk))
        waits = [
            (target, max(target.newest_due(), target.sending))
            for target in (self._targets.get(cid) for cid in sorted(ids))
            if target is not None and target.busy()
        ]
        for target, _ in waits:  # waited for from now: each attempt keeps what it sent
            if target.settled is None:
                target.settled = asyncio.Event()
        sent = []
        for target, want in waits:
            await self._settled(target, want)
            if target.result is not None:
                sent.append(target.result)
        return sent

    def _as_issued(self, target: _Target, fields: Mapping[str, _Due]) -> SentUpdate:
        """What goes out for these fields: the record with everything due on top (what an
        update issued earlier and not sent yet sets, too), as it will be once sent."""
        container_id = target.container_id
        due = {n: d.value for n, d in target.due.items() if d.group is None}
        record = self._store.container(container_id)
        request = self._build(container_id, due, record)
        changed = {name: due.value for name, due in fields.items()}
        hooks = sorted({due.hook for due in fields.values()})
        return SentUpdate(container_id, _sent(request), changed, hooks, None)

    def _build(
        self, container_id: str, changes: Mapping[str, Any], record: ContainerRecord | None
    ) -> api_pb2.UpdateContainerResourcesRequest:
        """The request for `changes` (ResourceDelta fields, checked when the hook made
        them) on top of the container's record (None: unknown)."""
        self.built += 1
        return _request(container_id, changes, record.view if record is not None else None)

    # --- what later calls wait for ---------------------------------------------------------
    def pending(self, container_id: str) -> bool:
        """An update to this container is due or on its way (a group's not walked to it yet
        included)."""
        target = self._targets.get(container_id)
        if target is not None and target.busy():
            return True
        return any(self._unwalked(walk, container_id, target) for walk in self._walks.values())

    def due(self) -> int:
        """How many containers have an update due or on its way (status.json), the members
        group updates have not walked to yet included (0: nothing is left to send)."""
        busy = sum(1 for target in self._targets.values() if target.busy())
        for walk in self._walks.values():
            members = walk.members if walk.members is not None else walk.group.members()
            busy += len(members) - walk.done
        return busy

    async def settled(self, container_id: str) -> None:
        """Until every update due to this container now was tried (applied, or failed and
        due again later). Returns at once when none is."""
        target = self._targets.get(container_id)
        for walk in list(self._walks.values()):
            if self._unwalked(walk, container_id, target):
                target = self._mark(walk, container_id, first=True)
        if target is not None and target.busy():
            await self._settled(target, max(target.newest_due(), target.sending))

    @staticmethod
    def _unwalked(walk: _Walk, container_id: str, target: _Target | None) -> bool:
        """`walk`'s group is due to this container and has not marked it yet."""
        applied = target.applied if target is not None else {}
        if all(applied.get(name, 0) >= walk.seq for name in walk.group.fields):
            return False
        if target is not None and all(
            name in target.due and target.due[name].seq >= walk.seq for name in walk.group.fields
        ):
            return False
        return walk.group.delta(container_id) is not None

    async def _settled(self, target: _Target, want: int) -> None:
        while target.tried < want and (target.sending or not target.gone) and not self._closed:
            if target.retry is not None:  # someone waits: try again now, not after the backoff
                target.retry.cancel()
                target.retry = None
                self._enqueue(target)
            if target.settled is None:
                target.settled = asyncio.Event()
            await target.settled.wait()

    def applied_by_call(self, container_id: str, linux: api_pb2.LinuxContainerResources) -> None:
        """The runtime applied an UpdateContainerResources kubelet sent (as the hooks
        adjusted it): the fields it set are newer than any update issued before, which must
        not overwrite them when they go out (a retry after a failure)."""
        target = self._targets.get(container_id)
        if target is None:
            return
        seq = next_order()
        for desc, value in linux.ListFields():
            if not value:
                continue  # 0 or empty: containerd keeps the field
            target.applied[desc.name] = seq
            target.due.pop(desc.name, None)
        if not target.due and not target.sending:
            target.due_since = 0.0

    def forget(self, container_id: str) -> None:
        """The container is gone: nothing more goes out to it; who waits for it goes on."""
        target = self._targets.pop(container_id, None)
        if target is not None:
            self._drop(target)
        self._removed[container_id] = None
        if len(self._removed) > REMEMBER_REMOVED:
            del self._removed[next(iter(self._removed))]

    def _drop(self, target: _Target) -> None:
        target.gone = True
        target.due.clear()
        if target.retry is not None:
            target.retry.cancel()
            target.retry = None
        self._attempt_ended(target)

    # --- the workers -----------------------------------------------------------------------
    def _enqueue(self, target: _Target, first: bool = False) -> None:
        if target.queued or target.sending or target.retry is not None or self._closing:
            return  # queued, or its worker / its retry takes the new fields along
        target.queued = True
        if first:
            self._queue.appendleft(target)
        else:
            self._queue.append(target)
        self._wake()

    def _wake(self) -> None:
        """A worker more, while there is work (queued targets, or walks) no worker has."""
        work = len(self._queue) + len(self._walks)
        if self._closing or len(self._workers) >= min(self._parallel, work):
            return
        task = asyncio.create_task(self._work(), name=f"crihook-updates-{next(self._names)}")
        self._workers.add(task)
        task.add_done_callback(self._workers.discard)

    # --- group updates: their members marked due a few at a time ---------------------------
    def _mark(self, walk: _Walk, container_id: str, first: bool = False) -> _Target:
        """`walk`'s group due to this container: its value is asked when it goes out."""
        target = self._targets.get(container_id)
        if target is None:
            target = self._targets[container_id] = _Target(container_id)
        marked = False
        for name in walk.group.fields:
            if walk.seq <= target.applied.get(name, 0):
                continue
            current = target.due.get(name)
            if current is not None and current.seq >= walk.seq:
                continue
            target.due[name] = _Due(None, walk.seq, walk.hook, walk.group)
            marked = True
        if marked:
            target.due_since = min(walk.since, target.due_since or walk.since)
            target.extra = walk.extra
            if first and target.queued:  # somebody waits: it goes next
                with contextlib.suppress(ValueError):
                    self._queue.remove(target)
                target.queued = False
            self._enqueue(target, first)
        return target

    def _walk_some(self) -> None:
        """Mark the next WALK_STEP members of the oldest walk due."""
        key, walk = next(iter(self._walks.items()))
        if walk.members is None:
            walk.members = walk.group.members()
        end = min(walk.done + WALK_STEP, len(walk.members))
        marked = [cid for cid in walk.members[walk.done : end] if self._mark(walk, cid).due]
        walk.done = end
        if self._ahead is not None:
            self._ahead.ahead(marked)  # one append for the step, not one per member
        if end >= len(walk.members) and self._walks.get(key) is walk:
            del self._walks[key]

    def _walk_all(self, walk: _Walk) -> list[str]:
        """Every member of `walk` marked due now (a call that waits for them all)."""
        members = walk.group.members()
        marked = [cid for cid in members if self._mark(walk, cid).due]
        if self._ahead is not None:
            self._ahead.ahead(marked)
        key = (walk.hook, walk.group.key)
        if self._walks.get(key) is walk:
            del self._walks[key]
        return members

    def _resolved(self, target: _Target) -> dict[str, _Due]:
        """What is due to `target` with the groups' values asked now (from the newest update
        of each group): fields a group no longer sets for it are dropped."""
        fields: dict[str, _Due] = {}
        asked: dict[int, ResourceDelta | None] = {}
        for name, due in target.due.items():
            group = due.group
            if group is not None:
                newest = self._walks.get((due.hook, group.key))
                if newest is not None and newest.seq > due.seq:
                    group, due = newest.group, due._replace(seq=newest.seq, group=newest.group)
                if id(group) not in asked:
                    asked[id(group)] = group.delta(target.container_id)
                delta = asked[id(group)]
                value = getattr(delta, name) if delta is not None else None
                if value is None:
                    continue
                due = _Due(value, due.seq, due.hook)
            if due.seq > target.applied.get(name, 0):
                fields[name] = due
        return fields

    async def _work(self) -> None:
        """Send to queued targets until the queue is empty and every walk is done."""
        idle = self._calls_idle
        try:
            while self._queue or self._walks:
                if not self._queue:
                    self._walk_some()
                    continue
                # Still marked queued while it lets calls go first: what is due meanwhile
                # goes out with it. One somebody waits for goes at once.
                target = self._queue.popleft()
                if idle is not None and not idle.is_set() and target.settled is None:
                    # At most CALLS_FIRST_SECONDS after it became due: the calls' turn adds
                    # that much to the window at most, however many containers wait.
                    left = target.due_since + CALLS_FIRST_SECONDS - time.monotonic()
                    if left > 0:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(left):
                                await idle.wait()
                await self._start_answered(target.container_id)  # still queued meanwhile
                target.queued = False
                if not target.gone:
                    await self._attempt(target)
        finally:
            # Gone from the workers now, not when the done callback runs: what is queued
            # from here on gets a worker of its own.
            task = asyncio.current_task()
            if task is not None:
                self._workers.discard(task)

    async def _attempt(self, target: _Target) -> None:
        cid = target.container_id
        grouped = any(d.group is not None for d in target.due.values())
        fields = self._resolved(target)
        covered = max([target.newest_due(), *(d.seq for d in fields.values())])
        since, extra = target.due_since, target.extra
        target.due = {}
        target.due_since = 0.0
        record = self._store.container(cid)
        if grouped and fields and record is not None and _shows(record.view, fields):
            for name, due in fields.items():  # it has them already (created with them)
                target.applied[name] = max(target.applied.get(name, 0), due.seq)
            fields = {}
        if not fields:  # everything due was overtaken meanwhile
            target.tried = max(target.tried, covered)
            target.result = None
            self._attempt_ended(target)
            return
        target.sending = covered
        hooks = sorted({due.hook for due in fields.values()})
        changed = {name: due.value for name, due in fields.items()}
        request = self._build(cid, changed, record)
        status: Status | None = None
        try:
            await self._update(cid, request.SerializeToString(), timeout=UPDATE_TIMEOUT_SECONDS)
        except RuntimeCallFailed as err:
            status = err.status
        except Exception as exc:  # a bug below: said, and the update is tried again later
            log.exception("sending the update of container %s failed", cid[:12])
            status = Status(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:  # shutting down: due again, for the log of the close
            self._due_again(target, fields, since)
            target.sending = 0
            raise
        target.sending = 0
        target.tried = max(target.tried, covered)
        target.result = (  # kept while someone waits: `send` reads what went out
            SentUpdate(cid, _sent(request), changed, hooks, status)
            if target.settled is not None
            else None
        )
        if status is None:
            self._applied(target, fields, request, since)
        else:
            delay = None
            if (
                self._retry
                and not self._closing
                and not target.gone
                and self._worth_retrying(target, status)
            ):
                self._due_again(target, fields, since)
                delay = self._retry_later(target)
            if self._closing and self._store.container(cid) is not None:
                self._due_again(target, fields, since)  # left: counted by close()
            self._failed(target, hooks, changed, status, extra, delay)
        self._attempt_ended(target)
        if target.due and target.retry is None:
            self._enqueue(target)  # issued while this one was on its way

    def _applied(
        self,
        target: _Target,
        fields: Mapping[str, _Due],
        request: api_pb2.UpdateContainerResourcesRequest,
        since: float,
    ) -> None:
        target.retry_delay = 0.0
        if since:
            self.window.observe(time.monotonic() - since)
        for name, due in fields.items():
            target.applied[name] = max(target.applied.get(name, 0), due.seq)
        record = self._store.container(target.container_id)  # it may have changed meanwhile
        if record is None:
            self._forget_if_gone(target)
            return
        res = resources_updated(record.view.resources, request.linux)
        record.view = _with_resources(record.view, res)
        now = time.time()
        for name, due in fields.items():
            record.audit[name] = {
                "hook": due.hook,
                "value": due.value,
                "event": "update",
                "at": now,
            }
        self._store.put_container(record)
        if not target.busy():
            self._store.write_behind()

    def _worth_retrying(self, target: _Target, status: Status) -> bool:
        """A container the runtime does not have is not retried (the reconcile forgets it);
        nor is one crihook does not know of (a hook named an id nobody created)."""
        if status.code is grpc.StatusCode.NOT_FOUND:
            self._forget_if_gone(target)
            return False
        if self._store.container(target.container_id) is None:
            self._forget_if_gone(target)
            return False
        return True

    def _due_again(self, target: _Target, fields: Mapping[str, _Due], since: float) -> None:
        """A failed attempt's fields are due again, unless something newer is due."""
        for name, due in fields.items():
            newer = target.due.get(name)
            if newer is None or newer.seq < due.seq:
                target.due[name] = due
        if since:
            target.due_since = min(since, target.due_since or since)

    def _retry_later(self, target: _Target) -> float:
        delay = min(max(target.retry_delay * 2, RETRY_FIRST_SECONDS), RETRY_MAX_SECONDS)
        target.retry_delay = delay

        def again() -> None:
            target.retry = None
            if not target.gone and target.due:
                self._enqueue(target)

        target.retry = asyncio.get_running_loop().call_later(delay, again)
        return delay

    def _attempt_ended(self, target: _Target) -> None:
        settled, target.settled = target.settled, None
        if settled is not None:
            settled.set()

    def _forget_if_gone(self, target: _Target) -> None:
        """An update issued before the container was removed can be sent after `forget`:
        its record must not outlive it (one per such race, kept for ever under churn)."""
        cid = target.container_id
        if self._store.container(cid) is None and self._targets.get(cid) is target:
            del self._targets[cid]

    def _failed(
        self,
        target: _Target,
        hooks: list[str],
        changed: Mapping[str, Any],
        status: Status,
        extra: Mapping[str, str],
        retry_in: float | None,
    ) -> None:
        container_id = target.container_id
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
            "update of container %s for hook %s failed: %s: %s (container %s)%s",
            container_id[:12],
            ", ".join(hooks),
            status.code.name,
            status.details,
            _name(record.view if record else None),
            "" if retry_in is None else f"; sent again in {retry_in:g}s",
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
                "resources": {n: changed[n] for n in _DELTA_NAMES if n in changed},
            }
        )
        self._store.put_container(record)

    # --- shutdown --------------------------------------------------------------------------
    async def close(self, timeout: float) -> int:
        """Let what is due go out for up to `timeout` seconds, then stop the workers. Returns
        how many containers were left with an update not sent (logged): the next start's
        synchronize derives them again from the hooks' state."""
        for walk in list(self._walks.values()):  # what they stand for is due now
            self._walk_all(walk)
        for target in self._targets.values():
            if target.retry is not None:  # a last try now, rather than never
                target.retry.cancel()
                target.retry = None
                self._enqueue(target)
        self._closing = True
        if self._workers:
            await asyncio.wait(set(self._workers), timeout=timeout)
        workers = list(self._workers)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        left = sorted(t.container_id for t in self._targets.values() if t.due)
        if left:
            log.warning(
                "stopping with updates to %d container(s) not sent (%s): the next start "
                "sends what the hooks hold for them",
                len(left),
                ", ".join(cid[:12] for cid in left[:8]) + (", ..." if len(left) > 8 else ""),
            )
        self._queue.clear()
        self._closed = True
        for target in list(self._targets.values()):
            self._attempt_ended(target)  # nobody waits on a closed updater
        return len(left)


def _shows(view: ContainerView, fields: Mapping[str, _Due]) -> bool:
    """The container's record already has every due value (nothing to send)."""
    res = view.resources
    return all(
        getattr(res, _VIEW_NAMES.get(name, name), None) == due.value for name, due in fields.items()
    )


_DELTA_NAMES = tuple(f.name for f in dataclass_fields(ResourceDelta))
"""ResourceDelta's fields in order (a failure's record lists them so)."""
_VIEW_NAMES = {"memory_limit_in_bytes": "memory_limit_bytes"}
"""ResourceDelta field → ResourcesView field, where the names differ."""


def _name(view: ContainerView | None) -> str:
    return (view.name or "?") if view is not None else "unknown to crihook"


def _sent(request: api_pb2.UpdateContainerResourcesRequest) -> dict[str, Any]:
    """The resources an update request carries, by field name (what the runtime was sent)."""
    linux = request.linux
    return {field.name: value for field, value in linux.ListFields()}


def _by_request(call: UnaryCall) -> ContainerUpdateCall:
    """A runtime's UpdateContainerResources called as the updater calls it."""

    async def update(container_id: str, request: bytes, *, timeout: float | None = None) -> bytes:
        return await call(request, timeout=timeout)

    return update


def _with_resources(view: ContainerView, resources: ResourcesView) -> ContainerView:
    """`dataclasses.replace(view, resources=resources)` at a seventh of its cost (an update's
    record; ContainerView has no __post_init__ and no slots): every other field carried."""
    new = object.__new__(ContainerView)
    new.__dict__.update(view.__dict__)
    new.__dict__["resources"] = resources
    return new


def build_update_request(
    update: ContainerUpdate, current: ContainerView | None
) -> api_pb2.UpdateContainerResourcesRequest:
    """The full resources to send: the container's current ones with the delta on top
    (a runtime may read an absent field as "set to zero")."""
    return _request(update.container_id, dict(update.resources.items()), current)


def _request(
    container_id: str, changes: Mapping[str, Any], current: ContainerView | None
) -> api_pb2.UpdateContainerResourcesRequest:
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
    for name, value in changes.items():
        setattr(linux, name, value)
    return api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux)
