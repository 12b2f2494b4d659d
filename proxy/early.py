"""What start-up does before it loads anything: the state directory held, the kubelet socket
listening.

kubelet's gRPC client that finds no socket (or a stale one: crihook was killed) backs off
before it dials again, from 1 s up to 2 min. So crihook binds its socket first, before it
imports the data path, reads the node's topology, loads the store and builds the hooks: a
connection made meanwhile waits in the socket's backlog and is served when the server
starts, its calls answered UNAVAILABLE until crihook is ready, as before. The grpc data path
binds its own socket when its server starts (grpc core takes no bound socket).
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path

from crihook.proxy.config import Settings
from crihook.proxy.sockets import listen_unix
from crihook.proxy.state.directory import StateDirLock, hold_state_dir, secure_state_dir

__all__ = ["Claimed", "claim"]


@dataclass
class Claimed:
    state_lock: StateDirLock
    """Held until the process ends (proxy/state/directory.py)."""
    listener: socket.socket | None
    """The kubelet socket, bound and listening; None: the server binds it (grpc)."""
    path: Path

    def abandon(self) -> None:
        """Start-up failed before the server took the socket: none of ours is left."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            self.path.unlink(missing_ok=True)


def claim(settings: Settings) -> Claimed:
    """Hold the state directory (a second crihook is refused before it touches anything),
    then listen on the kubelet socket (h2 data path). Raises StateDirInUseError,
    SocketInUseError or ConfigError."""
    secure_state_dir(settings.state_dir)  # before anything is read from it or written
    lock = hold_state_dir(settings.state_dir)
    server = settings.server
    if server.data_path != "h2":
        return Claimed(lock, None, server.socket_path)
    try:
        listener = listen_unix(server.socket_path, server.socket_mode, server.socket_group)
    except BaseException:
        with contextlib.suppress(OSError):
            lock.close()
        raise
    return Claimed(lock, listener, server.socket_path)
