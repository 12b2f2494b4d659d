"""Await a coroutine with a time budget, paying for the timer only if it has to wait.

Most hook calls finish without suspending: an in-process hook computes an adjustment and
returns. Arming and cancelling an asyncio.timeout for each of them is the biggest part of
their cost. `bounded()` runs the coroutine's first step inline; only when it suspends does it
arm a timeout, for what is left of the budget, and drive the rest of the coroutine from the
calling task exactly as `await` would have (so no extra task either).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["BudgetExpired", "bounded", "first_step", "resume"]

T = TypeVar("T")


class BudgetExpired(TimeoutError):
    """The budget ran out (as opposed to a TimeoutError raised by the coroutine itself)."""


async def bounded(coro: Coroutine[Any, Any, T], budget: float | None) -> T:
    """`await coro`, ended by BudgetExpired after `budget` seconds (None: no limit).

    Time spent before the first suspension counts against the budget, although it cannot
    be interrupted: a coroutine that blocks is never preempted by asyncio."""
    started = time.perf_counter()
    done, value = first_step(coro)
    if done:
        result: T = value
        return result
    return await resume(coro, value, budget, started)


def first_step(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run `coro` up to its first suspension: (True, its result) if it finished (an
    exception it raised propagates), else (False, what it suspended on) for `resume`.
    Synchronous, so a hot path can try a coroutine without a coroutine of its own."""
    try:
        return False, coro.send(None)
    except StopIteration as finished:
        return True, finished.value


async def resume(
    coro: Coroutine[Any, Any, T], yielded: Any, budget: float | None, started: float
) -> T:
    """The rest of `bounded()` for a caller that ran `first_step` itself (at `started`, a
    perf_counter reading) and saw the coroutine suspend on `yielded`."""
    if budget is None:
        result = await _Resume(coro, yielded)
        return result
    timer = asyncio.timeout(budget - (time.perf_counter() - started))
    try:
        async with timer:
            result = await _Resume(coro, yielded)
            return result
    except TimeoutError as exc:
        if timer.expired():
            raise BudgetExpired(f"no answer within {budget * 1000:.0f} ms") from exc
        raise


class _Resume(Generic[T]):
    """`await` for a coroutine that already ran its first step and suspended on `yielded`:
    drives the rest of it from the awaiting task, exactly as awaiting it would have."""

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, T], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, T]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # the task throws in only its cancellation
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    thrown: T = done.value
                    return thrown
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as done:
                    sent_result: T = done.value
                    return sent_result
