"""`QosWriter`: the cpuset hook's pools written to kubelet's QoS cgroups
(`shared_pool_in = "qos-cgroups"`), kept written, and read back.

`QosPools` (qos_pools.py) keeps the books: which QoS cgroups there are and what each was
given. This writes what is due through the `PodCgroups` seam, in a worker thread: unlike the
CFS quota lift, narrowing a QoS cgroup makes the kernel walk every cgroup below it and re-pin
each of their tasks (cpuset_mutex held), which grows with the node (how the kernel does it;
not measured here, where cgroup v2 has no cpuset controller), and the loop keeps serving
meanwhile. The hop costs the few calls that change a pool ~0.5 ms.

- One write at a time: one queued behind another writes the newest pool.
- A write that fails is logged, counted and tried again (0.2 s doubling to 5 s, and at every
  later stage that changes a pool).
- Every `QOS_VERIFY_SECONDS` each QoS cgroup written is read back and given the pool again
  if someone reset it behind crihook's back (systemd re-applying a slice's empty
  `AllowedCPUs=`, an operator, another tool): logged and counted.

The retry and the check run in an empty context: what they note belongs to no recorded call.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.cpus.qos_pools import QosPools, pool_of_qos, same_cpus
from crihook.hooks.node import PodCgroups
from crihook.hooks.node.qos import qos_cgroup
from crihook.hooks.spec import PodView

__all__ = [
    "QOS_RETRY_FIRST_SECONDS",
    "QOS_RETRY_MAX_SECONDS",
    "QOS_VERIFY_SECONDS",
    "QosWriter",
]

log = logging.getLogger(__name__)

_Item = TypeVar("_Item")
_R = TypeVar("_R")

QOS_RETRY_FIRST_SECONDS = 0.2
QOS_RETRY_MAX_SECONDS = 5.0
QOS_VERIFY_SECONDS = 10.0
"""How often the QoS cgroups' `cpuset.cpus` are read back and written again where someone
reset them: kubelet's default `cpuManagerReconcilePeriod`, the bound kubelet keeps on a
container's cpuset."""


class QosWriter:
    """The node pools of `pool()` (the ledger's, as it is at each write) in the QoS cgroups."""

    def __init__(self, pool: Callable[[], CpuPool]) -> None:
        self.books = QosPools()
        self.cgroups: PodCgroups | None = None
        """The seam, given at synchronize."""
        self._pool = pool
        self._lock = asyncio.Lock()
        self._retry: asyncio.Task[None] | None = None
        self._verify: asyncio.Task[None] | None = None

    def follows(self, pod: PodView, pool: str, numa: frozenset[int]) -> bool:
        """Whether a container of `pod` on the node pool `pool` runs on its QoS cgroup's
        cpuset instead of its own: a Burstable or BestEffort pod whose cgroup is where
        kubelet puts it, on its class's pool, not narrowed to NUMA nodes by koord-scheduler
        (a QoS cgroup holds one set for all its pods)."""
        if numa:
            return False
        found = qos_cgroup(pod.cgroup_parent)
        if found is None or pool_of_qos(found.qos) != pool:
            return False
        self.books.know(found)
        return True

    def learn(self, cgroup_parent: str, *, appeared: bool = False) -> None:
        """A pod's QoS cgroup, known from now on (`QosPools.learn`)."""
        self.books.learn(cgroup_parent, appeared=appeared)

    async def start(self, cgroups: PodCgroups | None) -> None:
        """At synchronize, before crihook is ready: every QoS cgroup written whole from the
        pools (nothing is taken on trust from an earlier write), and the check started."""
        if cgroups is None:
            log.error("cpuset: shared_pool_in = qos-cgroups, but no cgroups are given")
        self.cgroups = cgroups
        self.books.rewrite()
        await self.follow()
        if self._verify is None or self._verify.done():
            self._verify = _background(self._verify_every_period(), "crihook-cpuset-qos-verify")

    async def follow(self) -> None:
        """Write the pools to the QoS cgroups whose pool changed (nothing when none did,
        which is a few dict look-ups: no thread)."""
        if not self.books.due(self._pool()):
            return
        async with self._lock:
            await self._write_due()

    def failures(self) -> Mapping[str, int]:
        """QoS cgroup writes that failed (each tried again), QoS cgroups found reset behind
        crihook's back (each written again), and reads back that failed (read again at the
        next check)."""
        books = self.books
        return {
            "qos_cgroup_writes": books.failures,
            "qos_cgroup_repairs": books.repairs,
            "qos_cgroup_reads": books.read_failures,
        }

    async def close(self) -> None:
        tasks = [t for t in (self._retry, self._verify) if t is not None]
        self._retry = self._verify = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _write_due(self) -> None:
        """Write what is due, the pool as it is now (after any write before this one);
        holding `_lock`."""
        books = self.books
        due = books.due(self._pool())
        if not due:
            return
        results = await asyncio.to_thread(_on_each, self.cgroups, due, _write_one)
        failed = False
        for (path, text), result in zip(due, results, strict=True):
            if isinstance(result, Exception):
                failed = True
                books.failed(path)
                log.warning(
                    "cpuset: QoS cgroup %s keeps its cpuset.cpus, not the pool %s: %s "
                    "(tried again)",
                    path,
                    text,
                    result,
                )
                continue
            books.done(path, text, existed=result)
            log.debug("cpuset: QoS cgroup %s: %s", path, text if result else "not there yet")
        if failed and (self._retry is None or self._retry.done()):
            self._retry = _background(self._retry_with_backoff(), "crihook-cpuset-qos-retry")

    async def _retry_with_backoff(self) -> None:
        delay = QOS_RETRY_FIRST_SECONDS
        while True:
            await asyncio.sleep(delay)
            before = self.books.failures
            await self.follow()
            if self.books.failures == before:
                return
            delay = min(delay * 2, QOS_RETRY_MAX_SECONDS)

    async def _verify_every_period(self) -> None:
        while True:
            await asyncio.sleep(QOS_VERIFY_SECONDS)
            await self.verify()

    async def verify(self) -> None:
        """Read back each QoS cgroup crihook wrote and that is there (one thread hop for
        all), and write the pool again to each found holding other CPUs. Under `_lock`, so
        no write of crihook's own lands between the read and the comparison with what it
        wrote."""
        books = self.books
        async with self._lock:
            given = dict(books.written)
            if not given:
                return
            found = await asyncio.to_thread(_on_each, self.cgroups, list(given), _read_one)
            reset: dict[str, str] = {}
            for (path, text), held in zip(given.items(), found, strict=True):
                if isinstance(held, Exception):
                    books.read_failures += 1
                    log.warning(
                        "cpuset: QoS cgroup %s: its cpuset.cpus could not be checked: %s "
                        "(read again in %g s)",
                        path,
                        held,
                        QOS_VERIFY_SECONDS,
                    )
                elif held is not None and not same_cpus(held, text):
                    books.reset_found(path)
                    reset[path] = held
            if not reset:
                return
            due = dict(books.due(self._pool()))
            for path, held in reset.items():
                log.warning(
                    "cpuset: QoS cgroup %s held cpuset.cpus %s, not the pool %s crihook gave "
                    "it (reset behind its back): given %s again",
                    path,
                    held or '"" (every CPU of its parent)',
                    given[path],
                    due.get(path, "nothing (the pool is empty)"),
                )
            await self._write_due()


def _background(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    # An empty context: what the task notes belongs to no call being recorded.
    return asyncio.get_running_loop().create_task(work, name=name, context=contextvars.Context())


def _on_each(
    cgroups: PodCgroups | None, items: Sequence[_Item], call: Callable[[PodCgroups, _Item], _R]
) -> list[_R | Exception]:
    """`call` on each QoS cgroup item, in a thread: its answer, or the error."""
    out: list[_R | Exception] = []
    for item in items:
        if cgroups is None:
            out.append(RuntimeError("no cgroups seam given to the hook"))
            continue
        try:
            out.append(call(cgroups, item))
        except (OSError, ValueError) as exc:
            out.append(exc)
    return out


def _write_one(cgroups: PodCgroups, due: tuple[str, str]) -> bool:
    """True, or False when the QoS cgroup is not there yet."""
    return cgroups.write_qos_cpus(*due)


def _read_one(cgroups: PodCgroups, path: str) -> str | None:
    """What it holds, or None when it is not there (any more)."""
    return cgroups.read_qos_cpus(path)
