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

__all__ = ["DeviceNode", "HostFiles", "LinuxFiles"]


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


class LinuxFiles:
    """The real host. Device paths live on devtmpfs and local filesystems: both calls are
    a few microseconds and are made on the event loop."""

    def resolve(self, path: str) -> str:
        return os.path.realpath(path, strict=True)

    def device(self, path: str) -> DeviceNode | None:
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode):
            return DeviceNode("c", os.major(st.st_rdev), os.minor(st.st_rdev))
        if stat.S_ISBLK(st.st_mode):
            return DeviceNode("b", os.major(st.st_rdev), os.minor(st.st_rdev))
        return None
