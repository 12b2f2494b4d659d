"""Per-pod ordering in the pipeline: one call of a pod at a time, pods in parallel, no
lock left behind."""

from __future__ import annotations

import asyncio

from crihook.proxy.core.pipeline import _PodLocks


async def test_calls_of_one_pod_run_one_at_a_time_in_arrival_order() -> None:
    locks = _PodLocks()
    order: list[str] = []

    async def call(key: str, name: str) -> None:
        async with locks.hold(key):
            order.append(f"{name} in")
            await asyncio.sleep(0.01)
            order.append(f"{name} out")

    await asyncio.gather(call("pod-a", "a1"), call("pod-a", "a2"), call("pod-b", "b1"))
    a_events = [e for e in order if e.startswith("a")]
    assert a_events == ["a1 in", "a1 out", "a2 in", "a2 out"]
    # pod-b did not wait for pod-a
    assert order.index("b1 in") < order.index("a1 out")
    assert locks._locks == {}


async def test_a_cancelled_waiter_leaves_no_lock_behind() -> None:
    locks = _PodLocks()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("pod"):
            await release.wait()

    async def waiter() -> None:
        async with locks.hold("pod"):
            raise AssertionError("never gets the lock")

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    second = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    assert locks._locks["pod"][1] == 2
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert locks._locks["pod"][1] == 1
    release.set()
    await first
    assert locks._locks == {}
