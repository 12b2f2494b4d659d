"""sd_notify client against real AF_UNIX datagram sockets (path and abstract)."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.proxy.ops import sdnotify

# sun_path holds 108 bytes including the NUL; deep pytest tmp dirs can exceed it.
_SUN_PATH_MAX = 107


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2.0)
    return sock


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify.sock"
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        path = Path(tempfile.mkdtemp(prefix="crihook-")) / "n.sock"
    sock = _receiver(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    try:
        yield sock
    finally:
        sock.close()
        path.unlink(missing_ok=True)


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    name = f"crihook-test-{uuid.uuid4().hex}"
    sock = _receiver("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        yield sock
    finally:
        sock.close()


def test_ready_sends_exact_bytes(path_socket: socket.socket) -> None:
    assert sdnotify.ready() is True
    assert path_socket.recv(4096) == b"READY=1"


def test_stopping_sends_exact_bytes(path_socket: socket.socket) -> None:
    assert sdnotify.stopping() is True
    assert path_socket.recv(4096) == b"STOPPING=1"


def test_status_sends_exact_bytes(path_socket: socket.socket) -> None:
    assert sdnotify.status("serving; runtime connected") is True
    assert path_socket.recv(4096) == b"STATUS=serving; runtime connected"


def test_status_folds_newlines_so_no_extra_assignment(path_socket: socket.socket) -> None:
    assert sdnotify.status("waiting\nREADY=1") is True
    assert path_socket.recv(4096) == b"STATUS=waiting READY=1"


def test_notify_multiline_state_is_one_datagram(path_socket: socket.socket) -> None:
    assert sdnotify.notify("READY=1\nSTATUS=up") is True
    assert path_socket.recv(4096) == b"READY=1\nSTATUS=up"


def test_watchdog_ping(path_socket: socket.socket) -> None:
    assert sdnotify.watchdog() is True
    assert path_socket.recv(4096) == b"WATCHDOG=1"


def test_abstract_socket(abstract_socket: socket.socket) -> None:
    assert sdnotify.ready() is True
    assert abstract_socket.recv(4096) == b"READY=1"
    assert sdnotify.status("ok") is True
    assert abstract_socket.recv(4096) == b"STATUS=ok"


def test_unset_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.ready() is False
    assert sdnotify.stopping() is False
    assert sdnotify.status("x") is False


@pytest.mark.parametrize("value", ["", "relative/notify.sock", "@", "vsock:2:1234"])
def test_unusable_address_returns_false(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert sdnotify.ready() is False


def test_missing_socket_returns_false_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "absent.sock"))
    assert sdnotify.ready() is False


def test_full_receiver_does_not_block(path_socket: socket.socket) -> None:
    # Fill the receiver's queue; a blocking client would hang here instead of returning.
    results = [sdnotify.notify("STATUS=" + "x" * 1024) for _ in range(2000)]
    assert results[0] is True
    assert False in results


def test_empty_state_is_not_sent(path_socket: socket.socket) -> None:
    assert sdnotify.notify("") is False
    path_socket.settimeout(0.05)
    with pytest.raises(TimeoutError):
        path_socket.recv(4096)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "2000000"}, 2.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "<self>"}, 2.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "<other>"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "nope"}, None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: float | None
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    for key, value in env.items():
        value = value.replace("<self>", str(os.getpid())).replace("<other>", str(os.getpid() + 1))
        monkeypatch.setenv(key, value)
    assert sdnotify.watchdog_interval() == expected
