"""Which plugin sockets crihook connects to (hooks/remote/client.py `check_socket`), on real
files: a plugin adjusts containers as root would, so a socket someone else made, or could
replace between the check and the connect, is refused. The end-to-end refusal (a plugin that
is never configured) is in tests/integration/test_remote_plugin.py."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.hooks.remote.client import check_socket
from tests.lab.crihook_proc import short_tmpdir

NOBODY = 65534


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tmpdir("sk-")
    path.chmod(0o755)
    yield path


def listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    path.chmod(0o660)
    return sock


def test_a_root_owned_socket_in_a_root_owned_directory_is_trusted(root: Path) -> None:
    with listening(root / "p.sock"):
        assert check_socket(str(root / "p.sock")) is None


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("world-writable socket", "world-writable (mode 0666)"),
        ("socket owned by nobody", f"owned by uid {NOBODY}, not uid 0"),
        ("world-writable directory", "its directory"),
        ("directory owned by nobody", "its directory"),
        ("not a socket", "is not a unix socket"),
    ],
    ids=["mode", "owner", "dir-mode", "dir-owner", "regular-file"],
)
def test_what_someone_else_made_or_could_replace_is_refused(
    root: Path, how: str, expected: str
) -> None:
    where = root / "d"
    where.mkdir(mode=0o755)
    path = where / "p.sock"
    if how == "not a socket":
        path.write_text("")
        assert expected in (check_socket(str(path)) or "")
        return
    with listening(path):
        if how == "world-writable socket":
            path.chmod(0o666)
        elif how == "socket owned by nobody":
            os.chown(path, NOBODY, -1)
        elif how == "world-writable directory":
            where.chmod(0o777)
        else:
            os.chown(where, NOBODY, -1)
        assert expected in (check_socket(str(path)) or "")


@pytest.mark.parametrize("where", ["world-writable", "owned-by-nobody"])
def test_a_symlink_to_a_socket_in_a_directory_others_control_is_refused(
    root: Path, where: str
) -> None:
    """The link sits in a root-owned directory and the socket it names is root's, but whoever
    controls the socket's own directory can swap the socket after the check: refused, as if
    the endpoint named the socket itself."""
    theirs = root / "theirs"
    theirs.mkdir(mode=0o755)
    if where == "world-writable":
        theirs.chmod(0o1777)
    else:
        os.chown(theirs, NOBODY, -1)
    link = root / "p.sock"
    with listening(theirs / "real.sock"):
        link.symlink_to(theirs / "real.sock")
        refusal = check_socket(str(link))
        assert refusal is not None and f"its directory {theirs}" in refusal


def test_a_symlink_to_a_trusted_socket_is_trusted(root: Path) -> None:
    (root / "run").mkdir(mode=0o755)
    with listening(root / "run" / "real.sock"):
        (root / "p.sock").symlink_to(root / "run" / "real.sock")
        assert check_socket(str(root / "p.sock")) is None
