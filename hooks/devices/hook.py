"""The built-in `devices` hook: device nodes, host mounts, env and pooled devices that pods ask
for by annotation, injected only as far as the node's policy allows.

    CreateContainer  hints: the NUMA nodes whose free (or reusable) pooled devices could serve
                          the request
                     pre: the request checked (see `policy`), the host paths and device
                          nodes asked by path pinned on staging paths (`staged`, written
                          ahead in the hook's state), pooled devices reserved (the pod's
                          exited init containers' first; written ahead in the hook's state
                          and recorded in the container's annotation
                          pools.crihook.io/assigned), devices, mounts and env added; a refusal
                          names the annotation and the entry, and leaves nothing reserved or
                          staged
                     post: the reservation and the staging key tied to the container's id
                     failed: the reservation and the staged paths released
    RemoveContainer  post: the container's staged paths released; its pooled devices go back
                     once no container of its name is left in the pod
    RemovePodSandbox post: everything of the pod goes back

Pooled devices are held per pod and container name, as kubelet's device manager holds them:
a restarted container gets the same ones, and a later container of the pod reuses those of
its init containers (`pools`). At start (and after a reconcile) the holdings are checked
against the containers the runtime has: a reservation the runtime made the container for is
confirmed, one it did not is released, and a container that carries devices crihook has no
record of (its state was lost) is adopted; staged paths of containers the runtime does not
have are released. Pinning and releasing (mount system calls) run in a worker thread.
Exempt pods are not called: what they ask for is not injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from crihook.hooks.devices.annotations import AnnotationError, ContainerAsk, PodAsks
from crihook.hooks.devices.host import HostFiles, LinuxFiles, WouldBlock
from crihook.hooks.devices.policy import (
    DevicePolicy,
    Granted,
    Pool,
    PoolDevice,
    PooledIndex,
    check_ask,
    parse_policy,
)
from crihook.hooks.devices.pools import (
    ASSIGNED,
    PoolBook,
    assigned_value,
    device_hints,
    preference_order,
)
from crihook.hooks.devices.staged import StagedEntry, StagingBook
from crihook.hooks.node.staging import LinuxStaging, Staging, staged_name
from crihook.hooks.spec import (
    Adjustment,
    ContainerState,
    ContainerUpdate,
    ContainerView,
    Hook,
    HookContext,
    InvalidRequest,
    PodView,
    PoolUsage,
    Reject,
    ResourceHints,
    RuntimeQueries,
    SyncContext,
)

__all__ = ["DevicesHook"]

log = logging.getLogger(__name__)

_POD_ASKS_KEPT = 4096
"""Pods whose annotations' reading is kept (far more than a node runs)."""


class DevicesHook(Hook):
    sets = ("device", "mount", "env", f"annotation:{ASSIGNED}")

    def __init__(
        self,
        options: Mapping[str, Any] | None = None,
        *,
        files: HostFiles | None = None,
        staging: Staging | None = None,
    ) -> None:
        super().__init__(options)
        self.policy: DevicePolicy = parse_policy(self.options)
        self.files: HostFiles = files if files is not None else LinuxFiles()
        self._own_files = files is not None
        self.staging: Staging | None = staging
        self._own_staging = staging is not None
        self._staged: StagingBook | None = None
        self._book: PoolBook | None = None
        self._numa_nodes: tuple[int, ...] = ()
        self._pooled = PooledIndex()
        self._runtime: RuntimeQueries | None = None
        self._finished: dict[str, Mapping[str, bool]] = {}
        """Pod id → which of its containers have exited, asked once per CreateContainer."""
        self._pod_asks: dict[str, tuple[Mapping[str, str], PodAsks]] = {}
        """Pod id → its annotations object and their reading (`_ask`)."""

    # --- start-up ----------------------------------------------------------------------------
    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        if sync.files is not None and not self._own_files:
            self.files = sync.files  # crihook's seam: recorded, or answered by a replay
        if self._book is None:
            book = PoolBook(self.policy.pools, sync.state)
            dropped = book.load()
            for what in dropped:
                log.error("devices: saved holding dropped: %s", what)
            self._book = book
        self._numa_nodes = sync.node.numa_nodes
        self._runtime = sync.runtime
        await self._reconcile_staged(sync)
        freed, problems = self._book.reconcile(sync.containers)
        for allocation in freed:
            log.info(
                "devices: %s of pod %s is gone; its pooled devices %s go back",
                allocation.name,
                allocation.pod[:12],
                _describe(allocation.devices),
            )
        for problem in problems:
            log.error("devices: not adopted: %s", problem)
        self._pooled = await asyncio.to_thread(pooled_index, self.policy, self.files)
        for pool in self.policy.pools.values():
            stray = {d.numa for d in pool.devices if d.numa is not None} - set(self._numa_nodes)
            if stray:
                log.warning(
                    "devices: pool %s names NUMA node(s) %s this node does not have",
                    pool.name,
                    ", ".join(map(str, sorted(stray))),
                )
            free = len(self._book.available(pool.name))
            log.info(
                "devices: pool %s: %d of %d device(s) free", pool.name, free, len(pool.devices)
            )
        return ()

    async def _reconcile_staged(self, sync: SyncContext) -> None:
        if not self._own_staging:
            # crihook's seam (recorded, or answered by a replay), else the real host's
            self.staging = sync.staging if sync.staging is not None else LinuxStaging()
        if self._staged is None:
            self._staged = StagingBook(sync.state)
            for key in self._staged.load():
                log.error("devices: saved staging key dropped (unreadable): %s", key)
        staged = await asyncio.to_thread(self.pins.keys)
        gone, strays = self._staged.reconcile(staged, sync.containers)
        for entry in gone:
            log.info(
                "devices: %s of pod %s is gone; its staged paths are released",
                entry.name,
                entry.pod[:12],
            )
            await self._release(entry)
        for key in strays:
            log.info("devices: %s staged, and no container has it: released", key)
            await self._release_key(key)

    @property
    def pins(self) -> Staging:
        if self.staging is None:
            raise RuntimeError("devices: called before synchronize (crihook starts hooks so)")
        return self.staging

    @property
    def staged(self) -> StagingBook:
        if self._staged is None:
            raise RuntimeError("devices: called before synchronize (crihook starts hooks so)")
        return self._staged

    def usage(self) -> list[PoolUsage]:
        """Per device pool: devices held by containers (or reserved for one being created)
        and free."""
        if self._book is None:
            return []
        figures = []
        for pool in self.policy.pools.values():
            free = len(self._book.available(pool.name))
            figures.append(PoolUsage("device", pool.name, "held", value=len(pool.devices) - free))
            figures.append(PoolUsage("device", pool.name, "free", value=free))
        return figures

    @property
    def book(self) -> PoolBook:
        if self._book is None:
            raise RuntimeError("devices: called before synchronize (crihook starts hooks so)")
        return self._book

    # --- CreateContainer ---------------------------------------------------------------------
    async def hints_create_container(self, ctx: HookContext) -> ResourceHints | None:
        if not self.policy.pools:
            return None
        container = _container(ctx)
        try:
            asked = self._ask(ctx.pod, container).pools
        except AnnotationError:
            return None  # the pre stage refuses it, naming what is wrong
        self._finished.pop(ctx.pod.id, None)  # asked anew for every call
        pools = self.policy.pools
        # A pool without NUMA information has no preference: nothing to offer for it.
        located = [
            (pools[n], count) for n, count in asked.items() if n in pools and pools[n].aligned
        ]
        if not located:
            return None
        held = self.book.of(ctx.pod.id, container.name)
        reusable = {} if held is not None else await self._reusable(ctx.pod, container)
        hints: dict[str, Any] = {}
        for pool, count in located:
            name = pool.name
            if held is not None and name in held.devices:  # a restart keeps its devices
                available = frozenset(held.devices[name])
            else:
                available = self.book.available(name)
            hints[f"devices/{name}"] = device_hints(
                pool.devices, available, count, self._numa_nodes, reusable.get(name, frozenset())
            )
        return hints or None

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        try:
            ask = self._ask(ctx.pod, container)
        except AnnotationError as exc:
            raise InvalidRequest(str(exc)) from None
        if not ask:
            return None
        try:  # on the loop while the lookups stay on local file systems: no thread hop
            granted = check_ask(
                self.policy, ctx.pod.namespace, ask, self.files.nonblocking(), self._pooled
            )
        except WouldBlock:  # a host path leads to a network file system: it may hang
            granted = await asyncio.to_thread(
                check_ask, self.policy, ctx.pod.namespace, ask, self.files, self._pooled
            )
        adjustment = Adjustment()
        staged: StagedEntry | None = None
        if granted.devices or granted.mounts:
            staged, devices, mounts = await self._pin(ctx.pod, container, granted)
            for device, path in zip(granted.devices, devices, strict=True):
                adjustment.add_device(device[0].container_path, path, device[0].permissions)
            for mount, path in zip(granted.mounts, mounts, strict=True):
                adjustment.add_mount(mount[0].container_path, path, readonly=mount[0].readonly)
        for entry in granted.env:
            adjustment.set_env(entry.name, entry.value)
        if ask.pools:
            try:
                reusable = await self._reusable(ctx.pod, container)
                # From here on nothing awaits: the pick and the reservation see one book.
                self._finished.pop(ctx.pod.id, None)
                self._add_pooled(ctx, container, ask, adjustment, reusable)
            except BaseException:
                if staged is not None:  # a refusal leaves nothing staged
                    await self._release(staged)
                raise
        return adjustment

    async def post_create_container(self, ctx: HookContext) -> Adjustment | None:
        container = _container(ctx)
        assert ctx.response is not None
        cid: str = ctx.response.container_id  # type: ignore[attr-defined]
        self.book.confirm(ctx.pod.id, container.name, cid)
        staged = self.staged.pending(ctx.pod.id, container.name, container.attempt)
        if staged is not None:
            earlier = self.staged.of_container(cid)
            if earlier is not None:  # an id handed out again: the container that had it is gone
                await self._release(earlier)
            self.staged.confirm(staged, cid)
        return None

    async def failed_create_container(self, ctx: HookContext) -> None:
        container = _container(ctx)
        self._finished.pop(ctx.pod.id, None)
        if self.book.release_pending(ctx.pod.id, container.name):
            log.debug("devices: reservation of %s released (%s)", container.name, ctx.failure)
        staged = self.staged.pending(ctx.pod.id, container.name, container.attempt)
        if staged is not None:
            await self._release(staged)

    # --- pinning what was checked ------------------------------------------------------------
    async def _pin(
        self, pod: PodView, container: ContainerView, granted: Granted
    ) -> tuple[StagedEntry, list[str], list[str]]:
        """The staged paths of the granted devices and mounts (`staging`): what the runtime
        gets instead of the host paths. Saved (pending) before anything is mounted; a path
        that changed since it was checked is refused, and nothing stays staged."""
        entry = self.staged.stage(pod.id, container.name, container.attempt)
        pinning = asyncio.ensure_future(asyncio.to_thread(self._pin_all, entry.key, granted))
        try:
            devices, mounts = await asyncio.shield(pinning)
        except OSError as exc:
            await self._release(entry)
            raise InvalidRequest(
                f"{exc.strerror or exc} (it changed on the host after it was checked; "
                "nothing was mounted)"
            ) from None
        except BaseException:  # cancelled: the thread mounts on; released once it is done
            with contextlib.suppress(Exception):
                await pinning
            await self._release(entry)
            raise
        return entry, devices, mounts

    def _pin_all(self, key: str, granted: Granted) -> tuple[list[str], list[str]]:
        pins = self.pins
        devices, mounts = [], []
        for i, (device, path, node) in enumerate(granted.devices):
            with _naming(device.source, "device", path):
                devices.append(pins.pin_device(key, staged_name("d", i), path, node))
        for i, (mount, path) in enumerate(granted.mounts):
            with _naming(mount.source, "host path", path):
                mounts.append(pins.pin_mount(key, staged_name("m", i), path, mount.readonly))
        return devices, mounts

    async def _release(self, entry: StagedEntry) -> None:
        """Release what `entry` pinned and forget it; a failure is logged, and the key kept
        for the next start's reconcile."""
        if await self._release_key(entry.key):
            self.staged.drop(entry)

    async def _release_key(self, key: str) -> bool:
        try:
            await asyncio.to_thread(self.pins.release, key)
        except OSError as exc:
            log.error("devices: staged %s not released: %s", key, exc.strerror or exc)
            return False
        return True

    # --- giving devices back -----------------------------------------------------------------
    async def post_remove_container(self, ctx: HookContext) -> Adjustment | None:
        cid = _container(ctx).id
        freed = self.book.remove_container(cid)
        if freed is not None:
            log.debug("devices: %s gave back %s", freed.name, _describe(freed.devices))
        staged = self.staged.of_container(cid)
        if staged is not None:
            await self._release(staged)
        return None

    async def post_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        self.book.remove_pod(ctx.pod.id)
        self._pod_asks.pop(ctx.pod.id, None)
        if self.staged.has_pod(ctx.pod.id) and await self._release_key(ctx.pod.id):
            self.staged.drop_pod(ctx.pod.id)  # all its containers' staged paths, and its directory
        return None

    def _ask(self, pod: PodView, container: ContainerView) -> ContainerAsk:
        """What the container asks for. The pod's annotations are read once while the pod's
        view (its annotations object) stays the same: every container of the pod, and the
        hints and pre stages of one call, share that reading."""
        held = self._pod_asks.get(pod.id)
        if held is not None and held[0] is pod.annotations:
            return held[1].container(container.name)
        asks = PodAsks(pod.annotations)  # AnnotationError: not kept
        if len(self._pod_asks) >= _POD_ASKS_KEPT:
            self._pod_asks.clear()  # pods removed while crihook was away: never told
        self._pod_asks[pod.id] = (pod.annotations, asks)
        return asks.container(container.name)

    # --- pooled devices ----------------------------------------------------------------------
    async def _reusable(
        self, pod: PodView, container: ContainerView
    ) -> Mapping[str, frozenset[str]]:
        """Pool → devices of the pod's exited init containers the container may take. Asks
        the runtime (once per call) only when the pod has containers of unknown kind."""
        book = self.book
        finished = self._finished.get(pod.id)
        if finished is None:
            finished = {}
            if self._runtime is not None and book.undecided(pod.id):
                states = await self._runtime.container_states(pod.id)
                finished = {cid: s is ContainerState.EXITED for cid, s in states.items()}
            self._finished[pod.id] = finished
        return book.reusable(pod.id, container.name, finished)

    def _add_pooled(
        self,
        ctx: HookContext,
        container: ContainerView,
        ask: ContainerAsk,
        out: Adjustment,
        reusable: Mapping[str, frozenset[str]],
    ) -> None:
        """Pick (or keep, for a restart) the pooled devices and add them; reserves them last,
        once nothing can refuse the request any more."""
        pools: list[tuple[Pool, int]] = []
        for name, count in ask.pools.items():
            where = ask.pools_from[name]
            pool = self.policy.pools.get(name)
            if pool is None:
                known = ", ".join(sorted(self.policy.pools)) or "none"
                raise InvalidRequest(f"{where}: this node has no pool {name!r} (pools: {known})")
            if count > len(pool.devices):
                raise InvalidRequest(
                    f"{where}: {count} device(s) of pool {name} asked; it has {len(pool.devices)}"
                )
            pools.append((pool, count))
        book = self.book
        held = book.of(ctx.pod.id, container.name)
        if held is not None:
            wanted = {p.name: n for p, n in pools}
            have = {p: len(ids) for p, ids in held.devices.items()}
            if have != wanted:
                raise Reject(
                    f"{', '.join(sorted(set(ask.pools_from.values())))}: {container.name} of pod "
                    f"{_pod(ctx.pod)} holds "
                    f"{_describe(held.devices)} from an earlier attempt, not what it asks now; "
                    "recreate the pod"
                )
            chosen = dict(held.devices)
        else:
            affinity = ctx.affinity.numa if ctx.affinity is not None else None
            chosen = {
                p.name: self._pick(
                    p, n, affinity, ask.pools_from[p.name], reusable.get(p.name, frozenset())
                )
                for p, n in pools
            }
        taken = {c.container_path for c in ask.devices}
        for pool, _ in pools:
            by_id = pool.by_id
            for ident in chosen[pool.name]:
                for path in by_id[ident].paths:
                    if path in taken:
                        raise InvalidRequest(
                            f"{ask.pools_from[pool.name]}: {path} (pool {pool.name}) is also "
                            "asked by path"
                        )
                    out.add_device(path, path, pool.permissions)
            if pool.env:
                out.set_env(pool.env, ",".join(chosen[pool.name]))
        out.set_annotation(ASSIGNED, assigned_value(chosen))
        if held is None:
            book.reserve(ctx.pod.id, container.name, chosen, container.kind.value)

    def _pick(
        self,
        pool: Pool,
        count: int,
        affinity: frozenset[int] | None,
        where: str,
        reusable: frozenset[str] = frozenset(),
    ) -> tuple[str, ...]:
        """`count` devices of `pool` whose nodes are on the host now: the reusable ones (an
        exited init container's) first, as kubelet takes them, then free ones; Reject when
        the pool cannot serve it."""
        book = self.book
        if affinity is None and pool.aligned:  # no topology policy: still few NUMA nodes
            available = book.available(pool.name)
            hints = device_hints(pool.devices, available, count, self._numa_nodes, reusable) or []
            best = min((h for h in hints if h.preferred), key=_width, default=None)
            affinity = best.numa if best is not None else None
        chosen: list[str] = []
        missing: list[str] = []
        ordered = preference_order(pool.devices, affinity)
        if reusable:
            reused = [d for d in ordered if d.id in reusable]
            ordered = reused + [d for d in ordered if d.id not in reusable]
        for device in ordered:
            if device.id not in reusable and book.held(pool.name, device.id):
                continue
            if not self._present(pool, device):
                missing.append(device.id)
                continue
            chosen.append(device.id)
            if len(chosen) == count:
                return tuple(chosen)
        held = len(pool.devices) - len(book.available(pool.name))
        absent = f", {len(missing)} missing on the host ({', '.join(missing)})"
        raise Reject(
            f"{where}: pool {pool.name} cannot give {count} device(s): {held} of "
            f"{len(pool.devices)} are held by other containers" + (absent if missing else "")
        )

    def _present(self, pool: Pool, device: PoolDevice) -> bool:
        for path in device.paths:
            try:
                node = self.files.device(path)
            except OSError:
                node = None
            if node is None:
                log.warning("devices: pool %s device %s: %s is missing", pool.name, device.id, path)
                return False
        return True


def pooled_index(policy: DevicePolicy, files: HostFiles) -> PooledIndex:
    """The pools' device nodes as they are on the host now (missing ones are logged)."""
    by_path: dict[str, tuple[str, str]] = {}
    by_node = {}
    for pool in policy.pools.values():
        for device in pool.devices:
            owner = (pool.name, device.id)
            for path in device.paths:
                by_path[path] = owner
                try:
                    resolved = files.resolve(path)
                    node = files.device(resolved)
                except OSError as exc:
                    log.warning(
                        "devices: pool %s device %s: %s: %s",
                        pool.name,
                        device.id,
                        path,
                        exc.strerror or exc,
                    )
                    continue
                by_path[resolved] = owner
                if node is None:
                    log.warning(
                        "devices: pool %s device %s: %s is not a device node",
                        pool.name,
                        device.id,
                        path,
                    )
                    continue
                by_node[node] = owner
    return PooledIndex(by_path, by_node)


@contextlib.contextmanager
def _naming(source: str, what: str, path: str) -> Iterator[None]:
    """An OSError of pinning `path`, its message naming the annotation and the path."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, f"{source}: {what} {path}: {exc.strerror or exc}") from None


def _width(hint: Any) -> tuple[int, int]:
    nodes = hint.numa or frozenset()
    return (len(nodes), min(nodes, default=0))


def _describe(devices: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{pool} {','.join(ids)}" for pool, ids in devices.items()) or "nothing"


def _container(ctx: HookContext) -> ContainerView:
    assert ctx.container is not None, "container stages always carry the container"
    return ctx.container


def _pod(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}" if pod.name else pod.id[:12]
