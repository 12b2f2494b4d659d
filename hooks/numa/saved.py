"""How the numa hook's state persists: a key per container, so a change writes what changed.

    m:<pod id>/<name>           → the container's memory blocks, as `MemoryState.to_dict`
                                  lists them ([{"numaAffinity", "type", "size"}, ...])
    o:<container id>            → [pod id, name]: the attempt that holds its name's memory
    p:<pod id>/<name>/<attempt> → {"ref": [pod id, name], "new": bool}: a reservation the
                                  runtime has not answered yet
    resizing                    → {container id: {"from", "to"}} while a resize is pending

The state before this layout kept the whole memory state under `memory`, and every owner and
reservation under `owners` and `pending`: rewritten whole on every Guaranteed container, it
grew with the node. `read_saved` reads both (the hook rewrites the old one at start), so
`crihook state --cpus` reads either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MEMORY_KEY",
    "OWNER_KEY",
    "PENDING_KEY",
    "RESIZING",
    "SavedNuma",
    "memory_key",
    "read_saved",
]

MEMORY_KEY, OWNER_KEY, PENDING_KEY = "m:", "o:", "p:"
RESIZING = "resizing"
OLD_KEYS = ("memory", "owners", "pending")
"""The whole-state keys of the layout before (read, then rewritten)."""
_FORMAT = 1


def memory_key(pod: str, name: str) -> str:
    return f"{MEMORY_KEY}{pod}/{name}"


@dataclass
class SavedNuma:
    """The numa hook's state as read back, whatever the layout it was written in."""

    memory: dict[str, Any] | None = None
    """As `MemoryState.to_dict` writes it ({"version", "entries"}); None: nothing saved."""
    owners: dict[str, list[str]] = field(default_factory=dict)
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    resizing: dict[str, dict[str, int]] = field(default_factory=dict)
    old_layout: bool = False
    """Some of it was in the layout before (whole-state keys)."""


def read_saved(items: Iterable[tuple[str, Any]]) -> SavedNuma:
    """The state from its keys (in the order they were written). ValueError for a
    container key that names no pod and name."""
    saved = SavedNuma()
    entries: dict[str, dict[str, Any]] = {}
    for key, value in items:
        if key.startswith(MEMORY_KEY):
            pod, slash, name = key[len(MEMORY_KEY) :].partition("/")
            if not slash or not pod or not name:
                raise ValueError(f"numa state key {key!r} names no pod and container")
            entries.setdefault(pod, {})[name] = value
        elif key.startswith(OWNER_KEY):
            saved.owners[key[len(OWNER_KEY) :]] = list(value)
        elif key.startswith(PENDING_KEY):
            saved.pending[key[len(PENDING_KEY) :]] = dict(value)
        elif key == RESIZING:
            saved.resizing = dict(value)
        elif key in OLD_KEYS and value:
            saved.old_layout = True
            if key == "memory":
                saved.memory = dict(value)
            elif key == "owners":
                saved.owners.update(value)
            else:
                saved.pending.update(value)
    if entries:
        old = (saved.memory or {}).get("entries") or {}
        saved.memory = {"version": _FORMAT, "entries": {**old, **entries}}
    return saved
