"""The seam through which hooks look at the host's files: where a path really leads, and
what device node is there. crihook hands hooks a :class:`LinuxFiles` (``SyncContext.files``);
tests and replays hand them their own.

Both calls are what the request is checked against, made when the request is made: a device
node's type, major and minor are the host's, never the annotation's, and a path is allowed
only where it leads once every symlink, `.` and `..` is resolved.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Protocol

from crihook.hooks.node.mounts import MountTable, WouldBlock, resolve_locally

__all__ = ["DeviceNode", "HostFiles", "LinuxFiles", "LocalFiles", "WouldBlock"]


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A character (`c`) or block (`b`) device node."""

    kind: str
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.kind} {self.major}:{self.minor}"


class HostFiles(Protocol):
    def resolve(self, path: str) -> str:
        """`path` with every symlink, `.` and `..` resolved. FileNotFoundError when it (or a
        link on the way) does not exist; another OSError (a symlink loop, no permission)
        when it cannot be resolved."""
        ...

    def device(self, path: str) -> DeviceNode | None:
        """The device node at `path` (a resolved path; a symlink is not followed), None when
        it is something else. FileNotFoundError when nothing is there."""
        ...

    def nonblocking(self) -> HostFiles:
        """The same answers, for calls on the event loop: where a lookup would reach a file
        system that can block (network, FUSE, automount) it raises WouldBlock instead, and
        the caller asks again from a worker thread. Seams that never block return
        themselves."""
        ...


class LinuxFiles:
    """The real host. `resolve` and `device` look wherever a path leads: off the event loop
    unless the path is known to be local (device nodes on devtmpfs); `nonblocking()` checks
    the mount table before each lookup (`crihook.hooks.node.mounts`)."""

    def __init__(self, mounts: MountTable | None = None) -> None:
        self._mounts = mounts

    def resolve(self, path: str) -> str:
        return os.path.realpath(path, strict=True)

    def device(self, path: str) -> DeviceNode | None:
        return _device_node(path)

    def nonblocking(self) -> HostFiles:
        if self._mounts is None:
            self._mounts = MountTable()  # opened at the first use, kept for the process
        return LocalFiles(self._mounts)


class LocalFiles:
    """`LinuxFiles.nonblocking()`: lookups on local file systems only, by the mount table as
    it is when this view is made (one request's checks: one look at whether it changed)."""

    def __init__(self, mounts: MountTable) -> None:
        mounts.refresh()
        self._mounts = mounts

    def resolve(self, path: str) -> str:
        return resolve_locally(path, self._mounts, refresh=False)

    def device(self, path: str) -> DeviceNode | None:
        self._mounts.require_local(path, refresh=False)
        return _device_node(path)

    def nonblocking(self) -> HostFiles:
        return self


def _device_node(path: str) -> DeviceNode | None:
    st = os.lstat(path)
    if stat.S_ISCHR(st.st_mode):
        return DeviceNode("c", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISBLK(st.st_mode):
        return DeviceNode("b", os.major(st.st_rdev), os.minor(st.st_rdev))
    return None
