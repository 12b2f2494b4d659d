"""Give the heap back to the system after a large message.

A 15 MiB request is decoded, copied and encoded again on its way through crihook; once the
call ends Python frees those buffers, but glibc's malloc keeps the pages (its mmap threshold
grows with every large block freed, so later large blocks come from the heap, and a heap
shrinks only from its top). `malloc_trim(0)` hands every free page back. It walks the whole
heap, so it runs only after a call whose message reached LARGE_MESSAGE_BYTES, TRIM_DELAY
seconds later (several large calls in a row: once), in a worker thread. Without glibc (musl,
another OS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

__all__ = ["LARGE_MESSAGE_BYTES", "MemoryTrim"]

log = logging.getLogger(__name__)

LARGE_MESSAGE_BYTES = 1 << 20
"""A message at least this large is followed by a trim."""
TRIM_DELAY = 0.2
"""Seconds after such a call ends; the calls ending meanwhile share the trim."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MemoryTrim:
    """`after(size)` at the end of each call whose message had `size` bytes."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._pending: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.trims = 0
        """Trims run so far (for tests and status)."""

    def after(self, size: int) -> None:
        if size < LARGE_MESSAGE_BYTES or self._trim is None or self._pending is not None:
            return
        self._pending = asyncio.get_running_loop().call_later(TRIM_DELAY, self._start)

    def _start(self) -> None:
        self._pending = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="crihook-memory-trim"
            )

    async def _run(self) -> None:
        trim = self._trim
        assert trim is not None
        try:
            await asyncio.to_thread(trim, 0)
            self.trims += 1
        finally:
            self._task = None

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        task = self._task
        if task is not None:
            await task
