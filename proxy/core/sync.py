"""Hooks kept in step with the runtime: `synchronize` at start and after a reconcile.

At start, once the store is reconciled with the runtime, every in-process hook is given its
persisted state, the node facts and the pods and containers the runtime has (with the
resources the runtime reports for them now), before the first call is served; plugins get
the same snapshot in their Synchronize when they connect. After a call whose outcome is
unknown (the runtime went away mid-call, kubelet gave up), the pod is reconciled shortly
after, and if the runtime kept something crihook did not know of, every hook is
synchronized again. Repairs the hooks ask for are sent as container updates.

While crihook runs, the runtime is listed every `reconcile_seconds` (10 s, kubelet's CPU
manager's reconcile period): pods and containers removed without crihook seeing it (another
client, an operator's crictl, the runtime's own clean-up) are dropped, and every hook is
synchronized to give back what it held for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import Host, HostFiles, Netlink, PodCgroups, Staging, Topology
from crihook.hooks.spec import ContainerState, ContainerView, PodView, RuntimeQueries, SyncContext
from crihook.hooks.spec.views import container_state, resources_view
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.merge import stamp
from crihook.proxy.core import observe
from crihook.proxy.core.updates import ContainerUpdater
from crihook.proxy.cri.methods import method_path
from crihook.proxy.cri.outcome import Observation, SentUpdate
from crihook.proxy.cri.runtime import Runtime, RuntimeCallFailed
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.store import Store

__all__ = [
    "RuntimeView",
    "SyncQueries",
    "SyncReport",
    "Synchronizer",
    "netns_from_verbose_info",
]

log = logging.getLogger(__name__)

REFRESH_IN_FLIGHT = 16
"""ContainerStatus calls in flight while the resources are refreshed at start."""
SYNC_TIMEOUT_SECONDS = 30.0
Found = tuple[list[PodRecord], list[ContainerRecord]]
"""What a reconcile of some pods added to the store: their new pod and container records."""
RECONCILE_DELAY_SECONDS = 1.0
"""After a call with an unknown outcome: the runtime may need a moment to come back."""
_QUERY_TIMEOUT = 10.0


class SyncQueries(RuntimeQueries, Protocol):
    """What the synchronizer asks the runtime, besides what hooks may ask it."""

    async def all_container_states(self) -> dict[str, ContainerState]: ...

    async def resources(self, container_id: str) -> api_pb2.LinuxContainerResources | None: ...


class SyncReport(NamedTuple):
    """One synchronize of every hook: what they were given and the repairs sent (recorded)."""

    reason: str
    pods: Sequence[PodView]
    containers: Sequence[ContainerView]
    container_states: Mapping[str, ContainerState]
    hook_states: Mapping[str, Any]
    """Each hook's state as it was handed over (a copy)."""
    updates: Sequence[SentUpdate]
    observed: Sequence[Observation]


class RuntimeView:
    """The runtime as hooks may query it on the call path (`RuntimeQueries`)."""

    def __init__(self, runtime: Runtime) -> None:
        self._list = runtime.control(method_path("RuntimeService", "ListContainers"))
        self._status = runtime.control(method_path("RuntimeService", "ContainerStatus"))
        self._pod_status = runtime.control(method_path("RuntimeService", "PodSandboxStatus"))

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        return await self._states(api_pb2.ContainerFilter(pod_sandbox_id=pod_id))

    async def all_container_states(self) -> dict[str, ContainerState]:
        return await self._states(None)

    async def _states(self, flt: api_pb2.ContainerFilter | None) -> dict[str, ContainerState]:
        request = api_pb2.ListContainersRequest(filter=flt)
        raw = await self._list(request.SerializeToString(), timeout=_QUERY_TIMEOUT)
        listed = api_pb2.ListContainersResponse.FromString(raw).containers
        return {c.id: container_state(c.state) for c in listed}

    async def sandbox_netns(self, pod_id: str) -> str | None:
        request = api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True)
        raw = await self._pod_status(request.SerializeToString(), timeout=_QUERY_TIMEOUT)
        info = api_pb2.PodSandboxStatusResponse.FromString(raw).info
        return netns_from_verbose_info(info)

    async def oom_score_adj(self, container_id: str) -> int | None:
        linux = await self.resources(container_id)
        return None if linux is None else linux.oom_score_adj

    async def resources(self, container_id: str) -> api_pb2.LinuxContainerResources | None:
        """What the runtime reports the container runs with now, if it says."""
        request = api_pb2.ContainerStatusRequest(container_id=container_id)
        raw = await self._status(request.SerializeToString(), timeout=_QUERY_TIMEOUT)
        status = api_pb2.ContainerStatusResponse.FromString(raw).status
        if status.HasField("resources") and status.resources.HasField("linux"):
            return status.resources.linux
        return None


def netns_from_verbose_info(info: Mapping[str, str]) -> str | None:
    """containerd's verbose sandbox status: the OCI spec's network namespace path, under
    info["info"] → runtimeSpec.linux.namespaces; None when it names none (host network)."""
    try:
        doc = json.loads(info.get("info", "{}"))
        namespaces = doc["runtimeSpec"]["linux"]["namespaces"]
    except (ValueError, KeyError, TypeError):
        return None
    for namespace in namespaces if isinstance(namespaces, list) else ():
        if isinstance(namespace, dict) and namespace.get("type") == "network":
            path = namespace.get("path")
            return path if isinstance(path, str) and path else None
    return None


@contextlib.asynccontextmanager
async def _no_calls() -> AsyncIterator[None]:
    """No pipeline to wait for (a Synchronizer on its own, in tests)."""
    yield


class Synchronizer:
    def __init__(
        self,
        chain: Chain,
        store: Store,
        runtime: SyncQueries,
        runtime_client: Runtime | None,
        updater: ContainerUpdater,
        node: Topology,
        host: Host,
        topology_policy: str = "none",
        topology_scope: str = "container",
        files: HostFiles | None = None,
        cgroups: PodCgroups | None = None,
        netlink: Netlink | None = None,
        staging: Staging | None = None,
        *,
        on_sync: Callable[[SyncReport], None] | None = None,
        quiesced: Callable[[], AbstractAsyncContextManager[None]] = _no_calls,
    ) -> None:
        self.chain = chain
        self.topology_policy = topology_policy
        self.topology_scope = topology_scope
        self.store = store
        self.runtime = runtime
        self._runtime_client = runtime_client
        self.updater = updater
        self.node = node
        self.host = host
        self.files = files
        self.cgroups = cgroups
        self.netlink = netlink
        self.staging = staging
        self.on_sync = on_sync
        """Told every synchronize (recording)."""
        self._pending: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.failures = 0
        self.quiesced = quiesced
        """Waits until no intercepted call is in flight (the pipeline's), around a sync."""

    async def refresh_resources(self, only: Collection[str] | None = None) -> int:
        """Take the resources of the known containers in `only` (None: all) from the runtime
        (what they run with now, updates included). Returns how many differed from the
        store's record. Asked REFRESH_IN_FLIGHT at a time: one after another, 1,000
        containers kept crihook from being ready for as many runtime round trips."""
        differed = 0
        records = [r for cid, r in self.store.containers.items() if only is None or cid in only]
        queue = iter(records)

        async def worker() -> None:
            nonlocal differed
            for record in queue:
                differed += await self._refresh(record)

        workers = [worker() for _ in range(min(REFRESH_IN_FLIGHT, len(records)))]
        await asyncio.gather(*workers)
        return differed

    async def _refresh(self, record: ContainerRecord) -> int:
        try:
            linux = await self.runtime.resources(record.view.id)
        except RuntimeCallFailed:
            return 0  # gone meanwhile: the next reconcile drops it
        if self.store.container(record.view.id) is not record:
            return 0  # removed, or replaced by a call, while we waited
        self.store.unsettled.confirmed(record.view.id)
        if linux is None:
            return 0
        recorded = record.view.resources
        res = resources_view(linux, recorded.qos_class)
        if res == recorded:
            return 0
        record.view = replace(record.view, resources=res)
        self.store.put_container(record)
        # The runtime reports the score it applied at creation, which containerd may have
        # raised (restrict_oom_score_adj); nothing changes it after: no drift.
        return int(replace(res, oom_score_adj=recorded.oom_score_adj) != recorded)

    async def synchronize(
        self, reason: str, states: Mapping[str, ContainerState] | None = None
    ) -> None:
        """Every hook's synchronize; their repairs sent. A hook that fails is logged and
        counted (it keeps serving: its failure policy applies to calls, not to this).
        `states`: the containers' states as the runtime listed them just now (None: it is
        asked)."""
        if states is None:
            states = await self.runtime.all_container_states()
        pods, containers = self.store.snapshot()
        report = self.on_sync
        hook_states: dict[str, Any] = {}
        if report is not None:
            for entry in self.chain.entries:
                copied = json.dumps(self.store.hook_state(entry.base_name).to_dict())
                hook_states[entry.base_name] = json.loads(copied)
        observed, token = observe.begin() if report is not None else ([], None)
        try:
            pending = await self._synchronize_hooks(reason, states, pods, containers)
        finally:
            if token is not None:
                observe.end(token)
        self.store.write_behind()
        sent: list[SentUpdate] = []
        if pending:
            log.info("synchronize (%s): %d repair update(s)", reason, len(pending))
            sent = await self.updater.send(pending, {"method": f"synchronize ({reason})"})
        if report is not None:
            report(SyncReport(reason, pods, containers, states, hook_states, sent, observed))

    async def _synchronize_hooks(
        self,
        reason: str,
        states: Mapping[str, ContainerState],
        pods: Sequence[PodView],
        containers: Sequence[ContainerView],
    ) -> list[Any]:
        pending = []
        for entry in list(self.chain.entries):
            sync = SyncContext(
                state=self.store.hook_state(entry.base_name),
                node=self.node,
                host=self.host,
                runtime=self.runtime,
                pods=pods,
                containers=containers,
                container_states=states,
                reason=reason,
                topology_policy=self.topology_policy,
                topology_scope=self.topology_scope,
                files=self.files,
                cgroups=self.cgroups,
                netlink=self.netlink,
                staging=self.staging,
                exempt=self.chain.exempt,
            )
            try:
                async with asyncio.timeout(SYNC_TIMEOUT_SECONDS):
                    updates = await entry.hook.synchronize(sync)
            except Exception as exc:
                self.failures += 1
                log.error(
                    "hook %s: synchronize (%s) failed: %s: %s",
                    entry.name,
                    reason,
                    type(exc).__name__,
                    exc,
                    exc_info=not isinstance(exc, TimeoutError | ConnectionError),
                )
                continue
            pending.extend(stamp(entry.name, self.chain.permitted_updates(entry.name, updates)))
        return pending

    async def forget_removed_every(self, period: float) -> None:
        """Every `period` seconds, `forget_removed`; until cancelled. A runtime that does not
        answer is asked again at the next round."""
        while True:
            await asyncio.sleep(period)
            try:
                await self.forget_removed()
            except RuntimeCallFailed as exc:
                log.debug("reconcile: the runtime did not answer (%s)", exc.status.code.name)
            except Exception:  # a bug: said, and the next round runs all the same
                log.exception("reconcile with the runtime failed")

    async def forget_removed(self) -> tuple[int, int]:
        """Drop the pods and containers the runtime no longer has (removed without crihook
        seeing RemovePodSandbox or RemoveContainer), then synchronize every hook, so that
        what they held for them is given back. Returns how many (sandboxes, containers)
        went. Costs two list calls when nothing went; with no call in flight otherwise."""
        if self._runtime_client is None:
            return 0, 0
        pods, containers = await self.store.missing_from(self._runtime_client)
        if not pods and not containers:
            return 0, 0
        async with self.quiesced():  # the calls in flight have finished: ask again
            gone = await self._forget(reason="reconcile")
        return gone

    async def _forget(self, reason: str) -> tuple[int, int]:
        """With no call in flight: drop what the runtime no longer has; synchronize the
        hooks if anything went."""
        assert self._runtime_client is not None
        pods, containers = await self.store.missing_from(self._runtime_client)
        for sid in pods:
            containers += [c.id for c in self.store.containers_of(sid) if c.id not in containers]
        for cid in containers:
            self.store.remove_container(cid)
            self.updater.forget(cid)
        for sid in pods:
            self.store.remove_pod(sid)
        if not pods and not containers:
            return 0, 0
        log.info(
            "the runtime no longer has %d sandbox(es) and %d container(s) crihook knew of "
            "(removed without crihook): forgotten, and what hooks held for them given back",
            len(pods),
            len(containers),
        )
        self.store.write_behind()
        await self.synchronize(reason)
        return len(pods), len(containers)

    def reconcile_soon(self, pod: PodView) -> None:
        """After a call with an unknown outcome for `pod`: learn what the runtime kept, then
        let every hook confirm or release what it reserved for the call."""
        label = f"pod {pod.namespace}/{pod.name}"

        async def find() -> Found:
            if not pod.uid or self._runtime_client is None:
                return [], []
            return await self.store.reconcile_pod(self._runtime_client, pod.uid)

        self._schedule(pod.uid or pod.id or "?", label, find, "reconcile", "kept")

    def restored(self, sandbox_id: str) -> None:
        """After the runtime restored a pod from a checkpoint (RestorePod): its sandbox and
        containers came back without a CreateContainer. Learn them, and let every hook place
        and count them."""

        async def find() -> Found:
            if self._runtime_client is None:
                return [], []
            return await self.store.reconcile_sandbox(self._runtime_client, sandbox_id)

        label = f"restored sandbox {sandbox_id[:12]}"
        self._schedule(sandbox_id, label, find, "restore", "restored")

    def _schedule(
        self, key: str, label: str, find: Callable[[], Awaitable[Found]], reason: str, verb: str
    ) -> None:
        if key in self._pending:
            return
        self._pending.add(key)
        task = asyncio.get_running_loop().create_task(
            self._reconcile(key, label, find, reason, verb), name=f"crihook-{reason}-{key[:12]}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile(
        self,
        key: str,
        label: str,
        find: Callable[[], Awaitable[Found]],
        reason: str,
        verb: str,
    ) -> None:
        """Retried until the runtime answers (with backoff up to 5 s): a reservation kept for
        a call with an unknown outcome is released only by this."""
        delay = RECONCILE_DELAY_SECONDS if reason == "reconcile" else 0.0
        attempt = 0
        try:
            while True:
                await asyncio.sleep(delay)
                try:
                    pods, containers = await find()
                    async with self.quiesced():  # no reservation in flight meanwhile
                        # A removal whose answer crihook did not see may have happened.
                        forgot = (0, 0)
                        if self._runtime_client is not None:
                            forgot = await self._forget(reason)
                        if forgot == (0, 0):
                            await self.synchronize(reason)
                    break
                except RuntimeCallFailed as exc:
                    attempt += 1
                    if attempt in (1, 10) or attempt % 60 == 0:
                        log.warning("%s waits for the runtime: %s", label, exc.status.code.name)
                    delay = min(max(delay, RECONCILE_DELAY_SECONDS) * 2, 5.0)
            if pods or containers:
                log.info(
                    "%s: the runtime %s %d sandbox(es) and %d container(s) crihook did not know of",
                    label,
                    verb,
                    len(pods),
                    len(containers),
                )
        finally:
            self._pending.discard(key)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
