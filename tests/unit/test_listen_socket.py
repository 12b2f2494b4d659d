"""The listen socket is never open to every local user, not even before its mode is set."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from crihook.proxy.sockets import owner_only, secure_socket
from tests.lab.crihook_proc import short_tmpdir


def test_a_socket_made_owner_only_gets_its_configured_mode_after() -> None:
    directory = short_tmpdir("sock-")
    path = Path(directory) / "crihook.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    before = os.umask(0o022)
    try:
        with owner_only():
            listener.bind(str(path))  # as grpc and asyncio create it
        assert stat.S_IMODE(path.stat().st_mode) == 0o700  # with the umask 022: 0755, for all
        assert os.umask(0o022) == 0o022  # put back
        secure_socket(path, 0o660, None)
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
    finally:
        os.umask(before)
        listener.close()
        path.unlink(missing_ok=True)
        os.rmdir(directory)
