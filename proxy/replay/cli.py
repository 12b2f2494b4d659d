"""`crihook replay FILE [--config F] [--hooks NAMES|none] [--update] [--explain HOOK]`: the
command around `proxy.replay.runner`: read the file (exit 2 naming the line when it cannot be
replayed), replay it, print each differing call with its fields, exit 0 when everything
matches and 1 otherwise; `--update` rewrites the recording's expectations with what the replay
did; `--explain HOOK` also prints, per container, what that hook set and why
(`replay_explain`), whatever the exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from crihook.proxy.config import Settings, load_config
from crihook.proxy.config_doc import plugin_docs, settings_doc
from crihook.proxy.record.file import FILE_MODE
from crihook.proxy.record.lines import encode_line
from crihook.proxy.replay.explain import explain_all
from crihook.proxy.replay.file import CallEntry, RecordingError, SyncEntry, read_recording
from crihook.proxy.replay.runner import ReplayReport, replay, settings_for

__all__ = ["replay_command", "write_updated"]


# --- --update --------------------------------------------------------------------------------


def write_updated(report: ReplayReport, config: Settings | None, hooks: str | None) -> int:
    """Rewrite the recording with the replay's expectations (atomically); how many lines
    changed. With `--config`, its configuration (and its plugins) go into the headers."""
    recording = report.recording
    by_line = {r.entry.line: r.updated for r in report.results if r.updated is not None}
    changed = 0
    lines: list[dict[str, Any]] = []
    segment_headers = {s.line: s for s in recording.segments}
    for number, doc in enumerate(recording.lines, 1):
        new = by_line.get(number, doc)
        segment = segment_headers.get(number)
        if segment is not None and (config is not None or hooks is not None):
            new = {**doc, "config": settings_doc(settings_for(segment, config, hooks))}
        if report.dropins is not None and doc.get("kind") in ("header", "plugins"):
            new = {**new, "plugins": plugin_docs(report.dropins)}  # --config's plugins
        if new != doc:
            changed += 1
        lines.append(new)
    data = b"".join(encode_line(line) for line in lines)
    tmp = recording.path.with_name(f".{recording.path.name}.replay-{os.getpid()}")
    try:
        # As private as crihook writes a recording (proxy/record/file.py FILE_MODE).
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb") as out:
            out.write(data)
        os.replace(tmp, recording.path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return changed


# --- the command -----------------------------------------------------------------------------


def replay_command(
    path: Path,
    config_path: Path | None,
    hooks: str | None,
    update: bool,
    out: TextIO,
    explain: Sequence[str] = (),
) -> int:
    """`crihook replay`: 0 everything matches (or --update rewrote it), 1 a difference,
    2 a file that cannot be replayed or a bad configuration. `explain` (hook names) adds
    what those hooks set and why; it does not change the exit status."""
    try:
        recording = read_recording(path)
    except RecordingError as exc:
        print(f"crihook replay: {exc}", file=out)
        return 2
    config = load_config(config_path) if config_path is not None else None  # ConfigError: 2
    report = asyncio.run(replay(recording, config, hooks))
    for warning in report.warnings:
        print(f"warning: {warning}", file=out)
    for line in explain_all(report, explain):
        print(line, file=out)
    for result in report.results:
        if not result.differences:
            continue
        print(_heading(result.entry), file=out)
        for difference in result.differences:
            print(f"  {difference.describe()}", file=out)
        for note in result.notes:
            print(f"  note: {note}", file=out)
    print(report.summary(), file=out)
    if update:
        changed = write_updated(report, config, hooks)
        print(f"updated {path}: {changed} line(s) rewritten", file=out)
        return 0
    return 1 if report.differing else 0


def _heading(entry: CallEntry | SyncEntry) -> str:
    if isinstance(entry, CallEntry):
        return f"line {entry.line} (seq {entry.seq}): {entry.label}"
    return f"line {entry.line} (seq {entry.seq}): synchronize ({entry.reason})"
