"""The state directory: root's alone, and held by the crihook that uses it.

store.json keeps each pod's annotations as kubelet sent them (an API token, a
`last-applied-configuration` with a password in it); the recorder redacts those, the store
cannot (a hook may need them). So the directory is 0700 and every file in it 0600
(`proxy/state/store.py` writes them so); `secure_state_dir` fixes at start a state directory an
older crihook, a `StateDirectory=` without `StateDirectoryMode=`, or a DaemonSet's hostPath
made readable.

A running crihook holds `<state-dir>/crihook.lock` for its whole life (`hold_state_dir`): the
kernel drops its locks when the process ends, however it ends, and keeping them needs no disk
space. Two locks on one read-only descriptor (one open for writing would keep the file system
from being remounted read-only): an exclusive `flock`, so a second crihook on the same state
directory is refused before it reads or writes anything there, and a POSIX read lock, which
`F_GETLK` reports with its holder's pid. So `crihook state` learns whether crihook runs, and
its pid, from the process itself (`state_dir_holder`), not from a status.json that a full disk
may have kept from being written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
from pathlib import Path

from crihook.proxy.errors import StateDirInUseError

__all__ = [
    "HOOKS_DIR",
    "LOCK_FILE",
    "STATE_DIR_MODE",
    "STATE_FILE_MODE",
    "StateDirLock",
    "hold_state_dir",
    "secure_state_dir",
    "state_dir_holder",
]

HOOKS_DIR = "hooks"
STATE_DIR_MODE = 0o700
STATE_FILE_MODE = 0o600
"""The state directory and its files are root's alone (`secure_state_dir` fixes older ones).
Defined here, below the store: held and secured before the store is even imported."""

log = logging.getLogger(__name__)


def secure_state_dir(state_dir: Path) -> list[str]:
    """Make `state_dir` (created when missing) and its hooks/ 0700, and every regular file in
    them 0600; what was changed, as "path 0644 -> 0600", logged once. Symlinks and other
    entries are left alone (never followed). Raises OSError when the directory cannot be
    made or opened."""
    state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    changed: list[str] = []
    for directory in (state_dir, state_dir / HOOKS_DIR):
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            _restrict(dir_fd, directory, STATE_DIR_MODE, changed)
            for entry in os.scandir(dir_fd):
                if entry.is_file(follow_symlinks=False):
                    _restrict_file(dir_fd, entry.name, directory / entry.name, changed)
        finally:
            os.close(dir_fd)
    if changed:
        log.warning(
            "the state directory was readable by others; made root's alone: %s",
            ", ".join(changed),
        )
    return changed


def _restrict_file(dir_fd: int, name: str, path: Path, changed: list[str]) -> None:
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:  # gone since the listing, or swapped for a symlink: not ours to change
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _restrict(fd, path, STATE_FILE_MODE, changed)
    finally:
        os.close(fd)


def _restrict(fd: int, path: Path, mode: int, changed: list[str]) -> None:
    """Take away every permission bit beyond `mode` (the owner's own are left as they are)."""
    current = stat.S_IMODE(os.fstat(fd).st_mode)
    wanted = current & mode
    if wanted != current:
        with contextlib.suppress(OSError):
            os.fchmod(fd, wanted)
            changed.append(f"{path} {current:04o} -> {wanted:04o}")


# --- who uses the state directory -------------------------------------------------------------
LOCK_FILE = "crihook.lock"
_FLOCK = struct.Struct("hhqqi")  # struct flock: l_type, l_whence, l_start, l_len, l_pid


class StateDirLock:
    """The lock a running crihook holds on its state directory; `close` gives it up."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the last descriptor of the file: the lock goes with it
            self._fd = None


def hold_state_dir(state_dir: Path) -> StateDirLock:
    """Take the state directory's lock for this process's life; StateDirInUseError naming the
    other crihook's pid when a live one has it."""
    path = state_dir / LOCK_FILE
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, STATE_FILE_MODE)
    except OSError as exc:  # serving matters more: `crihook state` falls back on status.json
        log.warning("cannot hold %s (%s): crihook runs without it", path, exc.strerror or exc)
        return StateDirLock(None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one crihook per state directory
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        raise StateDirInUseError(
            f"the state directory {state_dir} is in use by another crihook (pid {holder}); "
            "refusing to share it"
        ) from None
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # who holds it: F_GETLK names this pid
    return StateDirLock(fd)


def state_dir_holder(state_dir: Path) -> int | None:
    """The pid of the live process that holds the state directory's lock (as this process's
    pid namespace sees it), or None when none does. Raises FileNotFoundError when there is
    no lock file (a crihook older than the lock: only its status file can tell)."""
    fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return _holder(fd)
    finally:
        os.close(fd)


def _holder(fd: int) -> int | None:
    """Who holds a POSIX lock on the file (F_GETLK for a write lock, which any lock of
    another process conflicts with; the query needs no write access, and a lock of this
    process never conflicts with itself)."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    kind, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
    return None if kind == fcntl.F_UNLCK else pid
