"""The recording's file, as the renderer process (`record_worker`) writes it.

Lines arrive rendered, in the order crihook queued them, and are appended in batches. Nothing
is fsynced until the end: a recording is a diagnostic, not state.

The file is bounded: past `max_bytes` it is rotated (FILE → FILE.1 → ... → FILE.<keep>), and
the new file starts with a header and a snapshot of what the hooks hold, which crihook takes
on its loop when asked (`asking`), so every file replays on its own.

A disk that fails (full, gone, read-only) loses lines, counted; the failure is logged when it
starts and when it ends. A file never goes on past a hole as if nothing were missing: once a
line is lost (here, or in crihook: told with `lose(count, told=True)`), every line is dropped
until a `gap` line, a new header and a snapshot (asked for at most once a second) are written,
from which a replay starts afresh. A file moved or removed under the writer (by hand, by
logrotate) is reopened at its path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from crihook.proxy.record.lines import encode_line

__all__ = ["RESUME_SECONDS", "RecordFile"]

log = logging.getLogger(__name__)

RESUME_SECONDS = 1.0
"""After lost lines, how often the writer asks for a snapshot to resume from."""
FILE_MODE = 0o600
"""A recording is root's alone, like the state directory: even redacted it shows every pod's
labels, annotations and mounts (an older crihook's file is made so when it is opened)."""


class RecordFile:
    """Appends rendered lines to `path`; `asking` is set when a new part (a header and a
    snapshot, from crihook) is wanted, and cleared by whoever passes the question on."""

    def __init__(self, path: Path, max_bytes: int, keep: int, whole: bool = False) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.asking = False
        self.lines = 0
        self.bytes = 0
        self.dropped = 0
        """Lines lost here (crihook counts those it lost itself)."""
        self.write_failures = 0
        self.rotations = 0
        self.last_error: str | None = None
        self.failing_since: float | None = None
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._size = 0
        self._part_asked = False
        self._lost = 0
        """Lines lost since the file was last whole: the gap line says how many."""
        self._resuming = not whole
        """Lines are dropped until a header (at start) or a header and a snapshot are written
        (`whole`: the file is whole as it is, the lines go on in its last part)."""
        self._asked_at = -RESUME_SECONDS

    def stats(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "bytes": self.bytes,
            "dropped": self.dropped,
            "write_failures": self.write_failures,
            "rotations": self.rotations,
            "last_error": self.last_error,
            "failing_since": self.failing_since,
            "resuming": self._resuming,
        }

    def take(self, items: list[tuple[str, Any]]) -> None:
        """One batch of rendered items, in order: `("header", line)`, `("part", (header,
        snapshot))`, `("line", line or None)` (None: it could not be rendered), `("lost", n)`
        (n lines crihook lost: its count, not ours)."""
        out: list[bytes] = []
        for kind, encoded in items:
            if kind == "lost":
                self.lose(encoded, told=True)
            elif kind == "header":  # the first line of a crihook process's part
                self._write(out)
                out = []
                self._resuming = not self._write([encoded])
            elif kind == "part":
                self._write(out)
                out = []
                self._new_part(*encoded)
            elif encoded is None or self._resuming:
                self.lose(1)
            else:
                out.append(encoded)
        self._write(out)

    def lose(self, count: int, told: bool = False) -> None:
        """Lines that will not be in the file: drop everything until a snapshot is written."""
        if not told:
            self.dropped += count
        self._lost += count
        self._resuming = True
        now = time.monotonic()
        if now - self._asked_at >= RESUME_SECONDS:
            self._asked_at = now
            self._part_asked = False  # the last ask went unanswered (the disk still failed)
            self._ask_for_part()

    def close(self) -> None:
        """At the end: fsync (never on the request path) and close."""
        self._close_file(sync=True)

    # --- writing ---------------------------------------------------------------------------
    def _write(self, lines: list[bytes]) -> bool:
        if not lines:
            return True
        data = b"".join(lines)
        try:
            self._ensure_open()
            assert self._fd is not None
            _append(self._fd, data)
        except OSError as exc:
            self._failed(exc, len(lines))
            return False
        self.lines += len(lines)
        self.bytes += len(data)
        self._size += len(data)
        if self._size > self.max_bytes:
            self._ask_for_part()
        return True

    def _ensure_open(self) -> None:
        """Open the file; reopen it when what is at its path is no longer it."""
        if self._fd is not None:
            try:
                seen = os.stat(self.path)
                if (seen.st_dev, seen.st_ino) == self._inode:
                    return
            except FileNotFoundError:
                pass
            self._close_file(sync=False)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, FILE_MODE)
        opened = os.fstat(self._fd)
        if stat.S_IMODE(opened.st_mode) & ~FILE_MODE:  # an older crihook's file
            os.fchmod(self._fd, stat.S_IMODE(opened.st_mode) & FILE_MODE)
        self._inode = (opened.st_dev, opened.st_ino)
        self._size = opened.st_size

    def _failed(self, exc: OSError, count: int) -> None:
        self.write_failures += 1
        self.last_error = f"{self.path}: {exc.strerror or exc}"
        if self.failing_since is None:
            self.failing_since = time.time()
            log.error(
                "recording: cannot write %s; calls go on unrecorded (dropped lines are "
                "counted in `crihook state`)",
                self.last_error,
            )
        self._close_file(sync=False)
        self.lose(count)

    def _ask_for_part(self) -> None:
        """Ask crihook (once until it answers) for a header and a snapshot to start a new
        part from."""
        if not self._part_asked:
            self._part_asked = True
            self.asking = True

    def _new_part(self, header: bytes, snapshot: bytes) -> None:
        """Start a new part of the recording: after lost lines, appended to the file behind
        a gap line; past max_bytes, in a new file once the old ones moved up."""
        self._part_asked = False
        lines = [header, snapshot]
        if self._resuming:
            try:
                self._ensure_open()
            except OSError as exc:
                self._failed(exc, 0)
                return
            if self._lost and self._size:  # the end of the part the lines are missing from
                gap = {"kind": "gap", "time": time.time(), "dropped": self._lost}
                lines.insert(0, encode_line(gap))
        elif self._size > self.max_bytes:
            self._rotate_files()
        else:
            return  # nothing to start anew
        if not self._write(lines):
            return
        if self._resuming and self.failing_since is not None:
            log.warning(
                "recording to %s works again after %.1f s (%d line(s) lost meanwhile)",
                self.path,
                time.time() - self.failing_since,
                self._lost,
            )
        self.failing_since = None
        self._resuming = False
        self._lost = 0

    def _rotate_files(self) -> None:
        self._close_file(sync=False)
        try:
            for index in range(self.keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
            if self.path.exists():
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        except OSError as exc:
            self.last_error = f"{self.path}: rotating: {exc.strerror or exc}"
            log.error("recording: %s; the file keeps growing", self.last_error)
            return
        self.rotations += 1

    def _close_file(self, sync: bool) -> None:
        if self._fd is None:
            return
        try:
            if sync:  # at the end only, never on the request path
                os.fsync(self._fd)
        except OSError as exc:
            self.last_error = f"{self.path}: {exc.strerror or exc}"
        finally:
            os.close(self._fd)
            self._fd = None
            self._inode = None


def _append(fd: int, data: bytes) -> None:
    """Write all of `data` at the end of the file, or none of it: after a failed or short
    write the file is cut back, so it stays readable to its last whole line."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise
