"""The state directory is root's alone: made so at start, whatever an older crihook left.

store.json keeps each pod's annotations as kubelet sent them (an API token, a
`last-applied-configuration` with a password in it); the recorder redacts those, the store
cannot (a hook may need them). So the directory is 0700 and every file in it 0600
(`proxy/store.py` writes them so); this fixes a state directory an older crihook, a
`StateDirectory=` without `StateDirectoryMode=`, or a DaemonSet's hostPath made readable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from crihook.proxy.store import HOOKS_DIR, STATE_DIR_MODE, STATE_FILE_MODE

__all__ = ["secure_state_dir"]

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
