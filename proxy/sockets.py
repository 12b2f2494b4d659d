"""The listen socket: refuse a live one, replace a stale one, set mode and group."""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from crihook.proxy.errors import ConfigError, SocketInUseError

__all__ = ["LISTEN_BACKLOG", "listen_unix", "owner_only", "prepare_listen_path", "secure_socket"]

LISTEN_BACKLOG = 128
"""Connections the kernel takes before the server accepts them (asyncio's own is 100)."""


def prepare_listen_path(path: Path) -> None:
    """Make the directory; remove a stale socket file; refuse a live one or a non-socket."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUseError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketInUseError(f"cannot tell whether {path} is in use: {exc}") from exc
        path.unlink(missing_ok=True)  # stale: left by a crashed process
        return
    finally:
        probe.close()
    raise SocketInUseError(
        f"{path} is in use by a live process (another crihook?); stop it or choose --listen"
    )


def secure_socket(path: Path, mode: int, group: str | None) -> None:
    """Apply the configured mode and group to the socket file grpc created."""
    if group is not None:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise ConfigError("socket_group", f"no such group {group!r}") from None
        os.chown(path, -1, gid)
    os.chmod(path, mode)


@contextlib.contextmanager
def owner_only() -> Iterator[None]:
    """Files (the listen socket) created within are the owner's only (umask 077) until
    `secure_socket` gives them the configured mode and group: no moment where any local
    user may connect. At start-up, before anything else creates files."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def listen_unix(path: Path, mode: int, group: str | None) -> socket.socket:
    """A unix socket at `path`, listening, with the configured mode and group (never any
    wider before). Connections wait in its backlog until a server accepts them. Raises
    SocketInUseError (a live socket there) or ConfigError (no such group); then no socket
    of ours is left at `path`."""
    prepare_listen_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = False
    try:
        with owner_only():
            sock.bind(str(path))
        bound = True
        secure_socket(path, mode, group)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        if bound:
            path.unlink(missing_ok=True)
        raise
    return sock
