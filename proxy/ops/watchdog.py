"""systemd's watchdog (`WatchdogSec=` in systemd/crihook.service): keepalives sent by a task
on crihook's event loop, so they stop when the loop stops turning.

A thread could keep pinging while the loop is blocked or deadlocked and every CRI call hangs;
pinging from the loop itself means systemd restarts such a crihook. Off when systemd set no
watchdog for this process (`$WATCHDOG_USEC`, `$WATCHDOG_PID`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from crihook.proxy.ops import sdnotify

__all__ = ["PINGS_PER_TIMEOUT", "keep_alive"]

log = logging.getLogger(__name__)

# sd_watchdog_enabled(3) asks for a ping every half timeout; a third leaves room for a
# sleep that wakes late on a loaded node.
PINGS_PER_TIMEOUT = 3


async def keep_alive(
    timeout: float | None = None, ping: Callable[[], bool] = sdnotify.watchdog
) -> None:
    """Ping until cancelled; returns at once when there is no watchdog (`timeout` None:
    read from the environment)."""
    if timeout is None:
        timeout = sdnotify.watchdog_interval()
    if timeout is None:
        return
    log.info("systemd watchdog: %gs, pinging from the event loop", timeout)
    while True:
        ping()
        await asyncio.sleep(timeout / PINGS_PER_TIMEOUT)
