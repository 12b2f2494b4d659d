"""bounded(): await with a budget, a timer only for coroutines that wait."""

from __future__ import annotations

import asyncio

import pytest

from crihook.hooks.eager import BudgetExpired, bounded


async def answer_now(value: int) -> int:
    return value


async def answer_later(value: int) -> int:
    await asyncio.sleep(0.01)
    return value


async def raise_now() -> None:
    raise LookupError("at once")


async def own_timeout() -> None:
    await asyncio.sleep(0)
    raise TimeoutError("the hook's own")


async def forever() -> None:
    await asyncio.sleep(3600)


@pytest.mark.parametrize("budget", [None, 5.0])
async def test_results_and_errors_come_through(budget: float | None) -> None:
    assert await bounded(answer_now(1), budget) == 1
    assert await bounded(answer_later(2), budget) == 2
    with pytest.raises(LookupError, match="at once"):
        await bounded(raise_now(), budget)
    with pytest.raises(TimeoutError, match="the hook's own") as info:
        await bounded(own_timeout(), budget)
    assert not isinstance(info.value, BudgetExpired)  # not ours: the hook raised it


async def test_an_answer_without_waiting_arms_no_timer() -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def spy(when: float, *args: object, **kwargs: object) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, *args, **kwargs)  # type: ignore[arg-type]

    loop.call_at = spy  # type: ignore[method-assign]
    try:
        assert await bounded(answer_now(7), 1.0) == 7
        assert armed == []
        assert await bounded(answer_later(8), 1.0) == 8
        assert len(armed) >= 1  # the timeout (and the sleep)
    finally:
        loop.call_at = call_at  # type: ignore[method-assign]


async def test_the_budget_ends_a_waiting_coroutine_and_cancels_it() -> None:
    cancelled: list[bool] = []

    async def noting() -> None:
        try:
            await forever()  # an hour: only the budget ends it
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(BudgetExpired, match="within 50 ms"):
        await bounded(noting(), 0.05)
    assert cancelled == [True]
