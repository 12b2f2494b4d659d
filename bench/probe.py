"""`crihook serve` with a debug dump, for the soak and its tests (not for production).

    python -m bench.probe DUMP_FILE serve --listen ... (the usual `crihook serve` arguments)

On SIGUSR2 the process writes DUMP_FILE (JSON, replaced atomically): its asyncio tasks (name
and coroutine), its open file descriptors (what each points to), its threads, its RSS, and how
many Python objects survive a collection. What the soak compares before and after a workload,
to see leaks that /proc alone cannot show (a task left running holds no fd). It wraps
`crihook.proxy.app.run`, so the code that serves is crihook's own, unchanged.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["dump", "main"]


def _fds() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed in between (the listing's own fd)
            continue
    return out


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dump(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """What the process holds now (called on its event loop)."""
    tasks = []
    for task in asyncio.all_tasks(loop):
        coro = task.get_coro()
        tasks.append({"name": task.get_name(), "coro": getattr(coro, "__qualname__", repr(coro))})
    tasks.sort(key=lambda t: (t["coro"], t["name"]))
    gc.collect()  # what survives a collection: a leak of Python objects, not garbage
    # crihook freezes what start-up made (gc.freeze): these are the objects made since.
    objects = gc.get_objects()
    return {
        "pid": os.getpid(),
        "tasks": tasks,
        "fds": _fds(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "rss": _rss(),
        "objects": len(objects),
        "types": dict(Counter(type(o).__qualname__ for o in objects).most_common(30)),
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _wrap(run: Callable[..., Awaitable[int]], path: Path) -> Callable[..., Awaitable[int]]:
    """`app.run` with the dump handler installed first; its arguments passed on as given."""

    async def probed(*args: Any, **kwargs: Any) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR2, lambda: _write(path, dump(loop)))
        return await run(*args, **kwargs)

    return probed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m bench.probe DUMP_FILE serve ARGS...", file=sys.stderr)
        return 2
    from crihook.proxy import app, cli

    app.run = _wrap(app.run, Path(args[0]))  # type: ignore[assignment]
    return cli.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
