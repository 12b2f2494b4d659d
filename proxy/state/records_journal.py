"""The journal of pod and container records: what changed since store.json was last written.

store.json is the records' snapshot; it names the last journal file it holds (`"journal": n`).
Each write-behind appends one line to `records-<n>.jsonl` next to it: the records that
changed, each whole (`"id": {...}`) or `null` when removed:

    {"containers":{"c1":{...},"c2":null},"pods":{"s1":{...}}}

Replaying the files numbered above the snapshot's, oldest first, over the snapshot gives the
records as the last line left them. Read by the store at start and by `crihook state` (also
while crihook writes: `read_records` says in which order). A line a crash tore (the last of
its file) is skipped and named in the log; so is any other unreadable line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = [
    "RECORDS_PREFIX",
    "RECORDS_SUFFIX",
    "apply_records",
    "read_records",
    "records_files",
    "records_name",
]

log = logging.getLogger(__name__)

RECORDS_PREFIX = "records-"
RECORDS_SUFFIX = ".jsonl"
KINDS = ("pods", "containers")


def records_name(gen: int) -> str:
    return f"{RECORDS_PREFIX}{gen}{RECORDS_SUFFIX}"


def records_files(state_dir: Path) -> list[tuple[int, Path]]:
    """The records journal files in `state_dir`, oldest first."""
    found = []
    for path in state_dir.glob(f"{RECORDS_PREFIX}*{RECORDS_SUFFIX}"):
        number = path.name[len(RECORDS_PREFIX) : -len(RECORDS_SUFFIX)]
        if number.isdigit():
            found.append((int(number), path))
    return sorted(found)


def read_records(state_dir: Path) -> list[tuple[int, Path, list[bytes]]]:
    """Every records journal file's lines, oldest first. Read them before store.json when
    crihook may be running: a compaction in between then leaves lines the newer snapshot
    covers (skipped by their number), never a snapshot missing lines whose file is gone."""
    found = []
    for gen, path in records_files(state_dir):
        try:
            found.append((gen, path, path.read_bytes().splitlines()))
        except FileNotFoundError:
            continue  # a compaction took it into store.json meanwhile
        except OSError as exc:
            log.error("cannot read the records journal %s: %s", path, exc)
    return found


def apply_records(journal: list[tuple[int, Path, list[bytes]]], doc: dict[str, Any]) -> int:
    """Apply the lines of the files numbered above `doc["journal"]` (the snapshot's) to the
    snapshot `doc` (store.json's content, changed in place); returns the lines applied."""
    covered = doc.get("journal", 0)
    covered = covered if isinstance(covered, int) else 0
    tables = {kind: doc.setdefault(kind, {}) for kind in KINDS}
    applied = 0
    for gen, path, lines in journal:
        if gen <= covered:
            continue  # in the snapshot already
        for number, raw in enumerate(lines, 1):
            try:
                entry = json.loads(raw)
                changes = [(tables[kind], dict(entry.get(kind, {}))) for kind in KINDS]
            except (ValueError, TypeError, AttributeError) as exc:
                torn = " (the last line: torn by a crash)" if number == len(lines) else ""
                log.warning("%s line %d is unreadable%s: %s; skipped", path, number, torn, exc)
                continue
            for table, change in changes:
                for key, value in change.items():
                    if value is None:
                        table.pop(key, None)
                    else:
                        table[key] = value
            applied += 1
    return applied
