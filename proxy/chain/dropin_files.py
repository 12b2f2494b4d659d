"""Which plugin drop-in files crihook reads: only what root (or crihook's own user) could
have written, checked as sshd's StrictModes checks authorized_keys.

A drop-in decides which socket crihook sends every intercepted call to, and its failure
policy can fail every call: whoever can write one controls the node's containers. So:

- the plugins directory, and each directory above it, must be owned by root or crihook's
  uid; the plugins directory must not be writable by others, one above it only when sticky
  (/tmp: others cannot rename or remove what is not theirs);
- each drop-in must be a regular file owned by root or crihook's uid and not writable by
  group or others; it is read from the descriptor that was checked, so a file swapped after
  the check is not the one read. A symlinked drop-in (a ConfigMap's `..data/` links) is
  checked where it leads, and the directories of its target as above.

A refused directory or file is a `Refusal` naming it and the reason (`Distrust`): the
watcher logs it once and counts it (`crihook_plugin_dropins_refused_total{reason}`).
"""

from __future__ import annotations

import enum
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Distrust", "DropinListing", "Refusal", "read_dropins"]


class Distrust(enum.Enum):
    """Why a drop-in (or its directory) is not read: the `reason` label of the metric."""

    OWNER = "owner"
    """Owned by someone else than root or crihook's uid."""
    WRITABLE = "writable"
    """Writable by group or others (a directory: by others, and not sticky above)."""
    NOT_A_FILE = "not_a_file"
    """Not a regular file (a fifo would block the reader, a device is no config)."""
    DIRECTORY = "directory"
    """The plugins directory (or one above it) is refused: none of its files is read."""


@dataclass(frozen=True)
class Refusal:
    path: Path
    distrust: Distrust
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class DropinListing:
    """One scan of the plugins directory: each trusted drop-in's text; why the others, or
    the directory itself (`refused_directory`: then `files` is empty), are not read."""

    files: dict[Path, str] = field(default_factory=dict)
    refused: dict[Path, Refusal] = field(default_factory=dict)
    refused_directory: Refusal | None = None
    missing: bool = False
    """No plugins directory at all (no plugins)."""


def _trusted_uids() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def _owner_problem(st: os.stat_result, what: str) -> str | None:
    if st.st_uid not in _trusted_uids():
        owners = " or ".join(f"uid {u}" for u in sorted(_trusted_uids()))
        return f"{what} is owned by uid {st.st_uid}, not {owners}"
    return None


def _directory_problem(path: Path, plugins_dir: bool) -> Refusal | None:
    """The directory `path` and every one above it, as StrictModes checks them."""
    for directory in [path, *path.parents]:
        try:
            st = os.stat(directory)
        except OSError as exc:
            return Refusal(path, Distrust.DIRECTORY, f"cannot stat {directory}: {exc.strerror}")
        what = f"the directory {directory}" if directory != path else "the directory"
        problem = _owner_problem(st, what)
        if problem is not None:
            return Refusal(
                path, Distrust.DIRECTORY, f"{problem} (whoever owns it can add drop-ins)"
            )
        mode = stat.S_IMODE(st.st_mode)
        writable = mode & 0o002 and ((directory == path and plugins_dir) or not mode & stat.S_ISVTX)
        if writable:
            return Refusal(
                path,
                Distrust.DIRECTORY,
                f"{what} is writable by others (mode {mode:04o}): anyone could add drop-ins",
            )
    return None


def read_dropins(directory: Path) -> DropinListing:
    """The `*.toml` drop-ins of `directory` that may be trusted, read; the others refused."""
    listing = DropinListing()
    if not directory.is_dir():
        listing.missing = True
        return listing
    refused = _directory_problem(directory, plugins_dir=True)
    if refused is not None:
        listing.refused_directory = refused
        return listing
    try:
        paths = sorted(directory.glob("*.toml"))
    except OSError:
        return listing
    for path in paths:
        text_or_refusal = _read_trusted(path, directory)
        if isinstance(text_or_refusal, Refusal):
            listing.refused[path] = text_or_refusal
        elif text_or_refusal is not None:
            listing.files[path] = text_or_refusal
    return listing


def _read_trusted(path: Path, directory: Path) -> str | Refusal | None:
    """The file's text, a Refusal, or None when it cannot be read at all (gone, not UTF-8:
    not a trust problem, the same as before this check)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Refusal(path, Distrust.NOT_A_FILE, "is not a regular file")
        problem = _owner_problem(st, "it")
        if problem is not None:
            return Refusal(path, Distrust.OWNER, problem)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            return Refusal(
                path, Distrust.WRITABLE, f"it is writable by group or others (mode {mode:04o})"
            )
        target = Path(os.path.realpath(path)).parent
        if target != directory.resolve():
            elsewhere = _directory_problem(target, plugins_dir=False)
            if elsewhere is not None:
                return Refusal(
                    path, Distrust.DIRECTORY, f"it leads to {target}: {elsewhere.reason}"
                )
        with open(fd, "rb", closefd=False) as file:
            data = file.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None
