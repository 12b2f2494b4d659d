"""Host paths pinned to what was checked: the seam through which the `devices` hook hands the
runtime a mount source or a device node that a later swap of the host path cannot change.

A path checked at CreateContainer and handed to the runtime as a path is looked up again by
runc at StartContainer: a directory renamed and replaced by a symlink in between (`mv race
race.d && ln -s /etc race`) gives the container whatever the symlink leads to. So the hook
checks the path (`HostFiles.resolve`, the allowlist), then asks `Staging` to pin it:

- the checked (resolved) path is opened with O_PATH, one component at a time, without
  following a symlink at any of them (`open_no_symlinks`); a component that is a symlink
  now (the path changed since it was checked) is ELOOP, and the path the kernel gives for
  the opened object (/proc/self/fd/N) must still be the checked one;
- a mount: that descriptor is bind-mounted (recursively, as the runtime binds a host path)
  onto `<root>/<key>/<name>`, then made read-only when asked, keeping the source's
  nosuid/nodev/noexec; the runtime is given that path, in a directory only root can write;
- a device node: its type, major and minor are read from the descriptor and must be the
  checked ones; a node with those numbers, mode and owner is made at `<root>/<key>/<name>`
  for the runtime to read them from (containerd and CRI-O stat the host path when they
  create the container, and give the container's node what they read).

`release(key)` unmounts everything under `<root>/<key>` and removes what pinning made there:
empty mount points and device nodes. It never deletes anything else: a directory that is
not empty, or a file with content, stops it with an error (a mount it could not undo).

Keys are `<pod id>` or `<pod id>/<entry>` (letters, digits, `_.-`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import stat
from typing import Protocol

from crihook.hooks.node.files import DeviceNode
from crihook.hooks.node.mounts import parse_mountinfo
from crihook.hooks.node.mounts import unescape_mountinfo as _unescape

__all__ = [
    "DEFAULT_STAGING_ROOT",
    "LinuxStaging",
    "Staging",
    "mount_points_below",
    "open_no_symlinks",
    "propagation_of",
    "staged_name",
]

DEFAULT_STAGING_ROOT = "/run/crihook/mounts"

_KEY_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_RELATIME = 0x200000
MNT_DETACH = 0x2

# statvfs f_flag bits → the mount flags a read-only remount must keep (else it clears them).
_KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)


class Staging(Protocol):
    """Where checked host paths are pinned for the runtime."""

    def pin_mount(self, key: str, name: str, path: str, readonly: bool) -> str:
        """Bind what `path` (resolved: no symlink, `.` or `..`) is now onto a staging path
        and return it. OSError: ELOOP/ENOTDIR/ESTALE when the path changed since it was
        checked, ENOENT when it is gone, others from the kernel."""
        ...

    def pin_device(self, key: str, name: str, path: str, node: DeviceNode) -> str:
        """A device node with the numbers of the one at `path` (resolved), which must still be
        `node`, on a staging path; returns the path. OSError as `pin_mount`."""
        ...

    def release(self, key: str) -> None:
        """Unmount and remove what was pinned under `key`; nothing there is not an error.
        OSError when a mount stays (nothing below it is then removed)."""
        ...

    def keys(self) -> list[str]:
        """What is staged now: `<pod>/<entry>` for each entry, `<pod>` for an empty pod."""
        ...


def staged_name(kind: str, index: int) -> str:
    """The name of a container's `index`th staged mount (`m`) or device node (`d`)."""
    return f"{kind}{index}"


def _check_key(key: str) -> list[str]:
    parts = key.split("/")
    if not 1 <= len(parts) <= 2 or not all(_KEY_PART.fullmatch(p) for p in parts):
        raise ValueError(f"not a staging key: {key!r}")
    return parts


def open_no_symlinks(path: str) -> int:
    """An O_PATH descriptor of what `path` names, looked up one component at a time without
    following any symlink. ELOOP when a component is a symlink, ENOTDIR when a component
    before the last is not a directory, ValueError for a path that is not absolute and
    normalized (resolved paths are)."""
    if not path.startswith("/") or os.path.normpath(path) != path:
        raise ValueError(f"not an absolute, normalized path: {path!r}")
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags | os.O_DIRECTORY)
    try:
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise OSError(errno.ELOOP, f"{'/' + '/'.join(parts[: i + 1])} is a symlink")
            if i < len(parts) - 1 and not stat.S_ISDIR(mode):
                raise OSError(errno.ENOTDIR, f"{'/' + '/'.join(parts[: i + 1])} not a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def mount_points_below(mountinfo: str, base: str) -> list[str]:
    """Mount points at or below `base`, deepest first."""
    inside = [p for p in parse_mountinfo(mountinfo) if p == base or p.startswith(base + "/")]
    return sorted(inside, key=lambda p: (-p.count("/"), p))


def propagation_of(mountinfo: str, path: str) -> tuple[str, tuple[str, ...]]:
    """The mount `path` lies on (the deepest mount point above it; of several mounts on one
    point, the last) and its propagation tags from mountinfo's optional fields: `shared:N`
    (mounts made below it reach its peers: the host's namespace for a Bidirectional mount),
    `master:N` (a slave: they reach nobody), none (private)."""
    found: tuple[str, tuple[str, ...]] = ("/", ())
    for line in mountinfo.splitlines():
        fields = line.split()
        try:
            separator = fields.index("-", 6)
        except ValueError:
            continue
        point = _unescape(fields[4])
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(found[0]):
            found = (point, tuple(fields[6:separator]))
    return found


class LinuxStaging:
    """The real host: bind mounts and device nodes under `root` (made 0711, root's)."""

    def __init__(self, root: str = DEFAULT_STAGING_ROOT, mountinfo: str = "/proc/self/mountinfo"):
        self.root = root.rstrip("/") or "/"
        self._mountinfo = mountinfo
        self._libc = ctypes.CDLL(None, use_errno=True)

    # --- pinning -------------------------------------------------------------------------------
    def pin_mount(self, key: str, name: str, path: str, readonly: bool) -> str:
        fd = self._open_checked(path)
        try:
            target = self._target(key, name)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target, 0o700)
            else:
                os.close(
                    os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
                )
            self._mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
            if readonly:
                kept = os.fstatvfs(fd).f_flag
                flags = MS_REMOUNT | MS_BIND | MS_RDONLY
                flags |= sum(ms for st, ms in _KEPT_FLAGS if kept & st)
                try:
                    self._mount(None, target, flags)
                except OSError:
                    self._umount(target)
                    raise
            return target
        finally:
            os.close(fd)

    def pin_device(self, key: str, name: str, path: str, node: DeviceNode) -> str:
        fd = self._open_checked(path)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else ""
        found = DeviceNode(kind, os.major(st.st_rdev), os.minor(st.st_rdev)) if kind else None
        if found != node:
            raise OSError(errno.ESTALE, f"{path} is {found or 'not a device node'} now, not {node}")
        target = self._target(key, name)
        # The runtime copies the node's mode and owner into the container's node (OCI
        # fileMode, uid, gid) as it copies its numbers: all as the host's. Only root can
        # reach it here (the directories above are root's, 0700).
        os.mknod(target, stat.S_IFMT(st.st_mode) | 0o600, st.st_rdev)
        os.chown(target, st.st_uid, st.st_gid)
        os.chmod(target, stat.S_IMODE(st.st_mode))
        return target

    def _open_checked(self, path: str) -> int:
        fd = open_no_symlinks(path)
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            os.close(fd)
            raise
        if where != path:  # renamed between the walk and now
            os.close(fd)
            raise OSError(errno.ESTALE, f"{path} is at {where} now")
        return fd

    def _target(self, key: str, name: str) -> str:
        _check_key(key)
        if not _KEY_PART.fullmatch(name):
            raise ValueError(f"not a staging name: {name!r}")
        directory = self.root
        os.makedirs(directory, 0o711, exist_ok=True)
        for part in key.split("/"):
            directory = f"{directory}/{part}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
        return f"{directory}/{name}"

    # --- releasing -----------------------------------------------------------------------------
    def release(self, key: str) -> None:
        depth = len(_check_key(key))
        base = f"{self.root}/{key}"
        for _ in range(16):  # stacked mounts come off one at a time
            points = mount_points_below(self._read_mountinfo(), base)
            if not points:
                break
            for point in points:
                self._umount(point)
        else:
            raise OSError(errno.EBUSY, f"mounts under {base} stay: {', '.join(points)}")
        _remove_staged(base, 4 - depth)

    def keys(self) -> list[str]:
        found: list[str] = []
        try:
            pods = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return found
        for pod in pods:
            if not _KEY_PART.fullmatch(pod) or not os.path.isdir(f"{self.root}/{pod}"):
                continue
            entries = sorted(e for e in os.listdir(f"{self.root}/{pod}") if _KEY_PART.fullmatch(e))
            found.extend([f"{pod}/{e}" for e in entries] or [pod])
        return found

    # --- system calls --------------------------------------------------------------------------
    def _read_mountinfo(self) -> str:
        with open(self._mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()

    def _mount(self, source: str | None, target: str, flags: int) -> None:
        src = source.encode() if source is not None else None
        if self._libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"mount {source or '(remount)'} on {target}: {os.strerror(code)}")

    def _umount(self, target: str) -> None:
        if self._libc.umount2(target.encode(), MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EINVAL, errno.ENOENT):  # not a mount (any more)
                raise OSError(code, f"umount {target}: {os.strerror(code)}")


def _remove_staged(path: str, levels: int) -> None:
    """Remove `path`, `levels` deep: directories `rmdir`ed (so only empty ones go), and at
    the bottom empty files and device nodes (mount points and pinned devices)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if levels > 1:
            for entry in os.listdir(path):
                _remove_staged(f"{path}/{entry}", levels - 1)
        os.rmdir(path)  # ENOTEMPTY: something staging did not make is there: left alone
        return
    placeholder = stat.S_ISREG(st.st_mode) and st.st_size == 0
    if levels != 1 or not (placeholder or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise OSError(errno.ENOTEMPTY, f"{path} is not what staging made: left alone")
    os.unlink(path)
