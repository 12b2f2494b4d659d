"""The watchdog keepalive runs on the event loop: pings stop when the loop stops turning."""

from __future__ import annotations

import asyncio
import threading

import pytest

from crihook.proxy.ops.watchdog import keep_alive
from tests.lab.crihook_proc import PATIENCE


async def test_pings_come_from_the_event_loop_until_cancelled() -> None:
    loop = asyncio.get_running_loop()
    seen: list[tuple[int, asyncio.AbstractEventLoop | None]] = []
    three = asyncio.Event()

    def ping() -> bool:
        seen.append((threading.get_ident(), asyncio.get_running_loop()))
        if len(seen) == 3:
            three.set()
        return True

    task = asyncio.create_task(keep_alive(0.03, ping), name="test-watchdog")
    await asyncio.wait_for(three.wait(), PATIENCE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    count = len(seen)
    await asyncio.sleep(0.05)
    assert len(seen) == count  # nothing pings once the task is gone
    assert set(seen) == {(threading.get_ident(), loop)}


async def test_no_watchdog_no_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    pings: list[bool] = []
    await asyncio.wait_for(keep_alive(None, lambda: pings.append(True) or True), PATIENCE)
    assert pings == []


async def test_the_timeout_comes_from_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "60000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    first = asyncio.Event()
    task = asyncio.create_task(keep_alive(None, lambda: first.set() or True), name="test-wd")
    await asyncio.wait_for(first.wait(), PATIENCE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
