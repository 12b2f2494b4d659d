"""The store's files on disk: journal files appended to, state files replaced whole.

- `write_atomic` replaces a file so that a crash leaves the old or the new one, never half;
  its temp files (`.<name>.tmp-<pid>-<random>`) that a crash left behind are removed at the
  next start (`remove_leftover_temp_files`).
- `JournalFile` appends lines to a journal file kept open between lines; a short write is
  cut off again, so no torn line stays between two whole ones.
- The hook journal files are `hooks/journal-<n>.jsonl` (`journal_name`, `journal_files`);
  a compaction removes those its snapshot holds (`remove_files`).

What the lines and files hold, and when they are written, is the store's business
(proxy/state/store.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from pathlib import Path

from crihook.proxy.state.directory import STATE_DIR_MODE, STATE_FILE_MODE

__all__ = [
    "JOURNAL_PREFIX",
    "JOURNAL_SUFFIX",
    "STALE_TEMP_SECONDS",
    "TEMP_MARK",
    "JournalFile",
    "describe",
    "fsync_file",
    "journal_files",
    "journal_name",
    "remove_files",
    "remove_leftover_temp_files",
    "write_atomic",
]

log = logging.getLogger(__name__)

JOURNAL_PREFIX = "journal-"
JOURNAL_SUFFIX = ".jsonl"
"""Hook journal files: hooks/journal-<n>.jsonl, n counting up from 1 in each process life."""
TEMP_MARK = ".tmp-"
STALE_TEMP_SECONDS = 60.0
"""A temp file of a live process older than this is left over too (a write takes ms)."""


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new file, never half.
    `durable=False` skips the fsyncs (for files that are rewritten every second anyway).
    A failed step removes the temp file (a full disk stays no fuller) and raises OSError.
    The file is root's alone (STATE_FILE_MODE): pod annotations in it may carry secrets."""
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, STATE_FILE_MODE)
        with open(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def journal_name(gen: int) -> str:
    return f"{JOURNAL_PREFIX}{gen}{JOURNAL_SUFFIX}"


def journal_files(hooks_dir: Path) -> list[tuple[int, Path]]:
    """The hook journal files in `hooks_dir`, oldest first."""
    found = []
    for path in hooks_dir.glob(f"{JOURNAL_PREFIX}*{JOURNAL_SUFFIX}"):
        number = path.name[len(JOURNAL_PREFIX) : -len(JOURNAL_SUFFIX)]
        if number.isdigit():
            found.append((int(number), path))
    return sorted(found)


class JournalFile:
    """The journal file lines are appended to, kept open from one line to the next: opening
    it for every line was a path lookup and two more system calls on every call that
    reserves something. A file removed under it (its link count is 0) is made again."""

    def __init__(self) -> None:
        self._path: Path | None = None
        self._fd: int | None = None

    def append(self, path: Path, data: bytes) -> None:
        """Append `data` to `path` (created if missing), or raise OSError and leave the file
        as it was: a short write on a full disk is cut off again, so no torn line stays
        between two whole ones."""
        fd = self._fd
        # The store hands the same Path object for a whole generation: identity first
        # (pathlib's == builds both paths' parts on every line).
        if fd is None or (path is not self._path and path != self._path):
            fd = self._open(path)
        try:
            st = os.fstat(fd)
            if not st.st_nlink:  # removed under us (the state directory cleared)
                fd = self._open(path)
                st = os.fstat(fd)
        except OSError:
            self.close()
            raise
        size = st.st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                if size:
                    os.ftruncate(fd, size)
                else:
                    os.unlink(path)  # only this process writes it: the empty file is ours
            self.close()  # the next line opens (and makes) the file again
            raise

    def sync(self) -> None:
        """fsync what was appended (raises OSError)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._path = None

    def _open(self, path: Path) -> int:
        self.close()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, STATE_FILE_MODE)
        except FileNotFoundError:
            path.parent.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
            fd = os.open(path, flags, STATE_FILE_MODE)
        self._fd, self._path = fd, path
        return fd


def remove_files(files: list[tuple[int, Path]], covered: int) -> None:
    """Remove the journal files numbered up to `covered` (a snapshot holds what they hold)."""
    for gen, path in files:
        if gen <= covered:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # replaying it over a newer snapshot is harmless
                log.warning("cannot remove %s: %s", path, describe(exc))


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe(error: OSError) -> str:
    """`[Errno 28] No space left on device`, without the temp file's name."""
    if error.errno is not None and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}"
    return str(error)


def remove_leftover_temp_files(directory: Path) -> None:
    """Remove `.<name>.tmp-<pid>-…` files of writes a crash interrupted: those of a process
    that is gone (or of this pid, in an earlier life), or too old to be a write in progress."""
    now = time.time()
    for tmp in directory.glob(f".*{TEMP_MARK}*"):
        try:
            pid_text = tmp.name.rsplit(TEMP_MARK, 1)[1].split("-", 1)[0]
            pid = int(pid_text) if pid_text.isdigit() else 0
            writing = pid and pid != os.getpid() and _alive(pid)
            if writing and now - tmp.lstat().st_mtime < STALE_TEMP_SECONDS:
                continue  # another crihook is writing it right now
            tmp.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot remove the leftover temp file %s: %s", tmp, describe(exc))
            continue
        log.info("removed %s, left behind by an interrupted write", tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's
    return True
