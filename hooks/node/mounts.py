"""Which file systems a path lookup passes through, from the mount table: whether it can be
made on the event loop or must go to a worker thread.

A lookup on a local file system (ext4, xfs, tmpfs, devtmpfs, overlay, …) is a few
microseconds of kernel work; one that reaches a network or FUSE file system (nfs, cifs,
ceph, fuse.*) or an automount point can wait on a server that is away, for minutes. A hook's
lookup on the event loop would stop every CRI call for that long; in a worker thread it
costs a thread hop (~0.2 ms on a busy 2-core node) even when the path is local. So
`resolve_locally` walks the path itself, as realpath does, and before each lookup asks the
mount table whether the path lies on local file systems only; when it does not, it raises
`WouldBlock` and the caller asks again from a thread.

The table is /proc/self/mountinfo, read once and again only after the kernel says it
changed: the file is pollable, a mount or unmount marks it (POLLPRI), and a poll with no
timeout costs one system call.
"""

from __future__ import annotations

import errno
import os
import select
import stat

__all__ = ["LOCAL_TYPES", "MountTable", "WouldBlock", "resolve_locally", "unescape_mountinfo"]

LOCAL_TYPES = frozenset(
    {
        "btrfs",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "erofs",
        "ext2",
        "ext3",
        "ext4",
        "f2fs",
        "hugetlbfs",
        "iso9660",
        "mqueue",
        "nsfs",
        "overlay",
        "proc",
        "pstore",
        "ramfs",
        "rootfs",
        "securityfs",
        "squashfs",
        "sysfs",
        "tmpfs",
        "tracefs",
        "vfat",
        "xfs",
        "zfs",
    }
)
"""File systems whose lookups never wait on anything but this node's own disks. Anything
else, an unknown type included, goes to a thread: autofs (an automount can hang), nfs,
cifs, ceph, glusterfs, fuse.*."""

MAX_SYMLINKS = 40
"""As Linux: more links than this in one lookup is ELOOP."""


class WouldBlock(Exception):
    """The answer needs a file system that can block (named in the message): ask again off
    the event loop."""


class MountTable:
    """The mount points of this process's mount namespace and their file system types."""

    def __init__(self, mountinfo: str = "/proc/self/mountinfo") -> None:
        self._path = mountinfo
        self._fd: int | None = None
        self._poll = select.poll()
        self._types: dict[str, str] = {}
        self._blocking: tuple[tuple[str, str], ...] = ()
        """(mount point, type) of the file systems that can block; most nodes have none."""

    def close(self) -> None:
        if self._fd is not None:
            self._poll.unregister(self._fd)
            os.close(self._fd)
            self._fd = None

    def blocking_type(self, path: str) -> str | None:
        """The type of a file system a lookup of `path` (absolute, without `.`, `..` or
        symlinks) passes through that can block, or None when all of them are local."""
        self.refresh()
        return self.blocking_type_as_read(path)

    def require_local(self, path: str, refresh: bool = True) -> None:
        """Raise WouldBlock, naming the file system, when a lookup of `path` can block
        (`refresh=False`: from the table as last read)."""
        fstype = self.blocking_type(path) if refresh else self.blocking_type_as_read(path)
        if fstype is not None:
            raise WouldBlock(f"looking up {path} reaches a {fstype} file system")

    def blocking_type_as_read(self, path: str) -> str | None:
        """`blocking_type` from the table as last read (`refresh` first)."""
        for point, fstype in self._blocking:  # a lookup of `path` passes through each prefix
            if point == "/" or path == point or path.startswith(f"{point}/"):
                return fstype
        return None

    def refresh(self) -> None:
        """Read the table again if the kernel marked it changed since the last read."""
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            self._poll.register(self._fd, select.POLLPRI | select.POLLERR)
            self._read()
        elif self._poll.poll(0):  # the kernel marks it on every mount and unmount
            self._read()

    def _read(self) -> None:
        assert self._fd is not None
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 65536):
            chunks.append(chunk)
        self._types = parse_mountinfo(b"".join(chunks).decode("utf-8", "surrogateescape"))
        self._blocking = tuple(
            (point, fstype) for point, fstype in self._types.items() if fstype not in LOCAL_TYPES
        )


def parse_mountinfo(text: str) -> dict[str, str]:
    """Mount point → file system type; of several mounts on one point the last (on top)."""
    types: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        try:
            separator = fields.index("-", 6)
            point, fstype = fields[4], fields[separator + 1]
        except (ValueError, IndexError):
            continue
        types[unescape_mountinfo(point)] = fstype
    return types


def unescape_mountinfo(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal escapes."""
    if "\\" not in field:
        return field
    out = []
    i = 0
    while i < len(field):
        octal = field[i + 1 : i + 4]
        if field[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def resolve_locally(path: str, mounts: MountTable, refresh: bool = True) -> str:
    """`os.path.realpath(path, strict=True)`, looking only at local file systems: raises
    WouldBlock before a lookup that would reach another. FileNotFoundError, ELOOP and the
    other OSErrors as realpath raises them. `refresh=False`: by the table as last read."""
    if not path.startswith("/"):
        raise WouldBlock(f"{path} is relative")
    if refresh:
        mounts.refresh()  # once: a mount made during the walk is a race lost either way
    resolved = "/"
    pending = [c for c in reversed(path.split("/")) if c]
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            resolved = os.path.dirname(resolved)  # `resolved` has no symlinks: lexical is right
            continue
        candidate = f"{resolved.rstrip('/')}/{name}"
        mounts.require_local(candidate, refresh=False)
        if not stat.S_ISLNK(os.lstat(candidate).st_mode):
            resolved = candidate  # a file followed by more names: the next lstat says ENOTDIR
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = "/"
        pending.extend(c for c in reversed(target.split("/")) if c)
    return resolved
