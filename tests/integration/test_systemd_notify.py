"""crihook under a systemd-like supervisor: READY=1 once serving, then WATCHDOG=1 keepalives
for as long as it runs, STOPPING=1 on SIGTERM; over a real notify socket, as systemd's."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.fake_runtime import FakeRuntime


@pytest.fixture
def notify_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = short_tmpdir("nt-") / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    # crihook (a child) inherits these, as it would from systemd with WatchdogSec=0.3.
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "300000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    try:
        yield sock
    finally:
        sock.close()


def test_ready_then_keepalives_then_stopping(notify_socket: socket.socket) -> None:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    try:
        with CrihookProcess(runtime.endpoint) as proc:
            messages = []
            while messages.count(b"WATCHDOG=1") < 3:
                messages.append(notify_socket.recv(4096))
            assert messages[0] == b"READY=1"
            code = proc.stop()
        after = []
        while b"STOPPING=1" not in after:
            after.append(notify_socket.recv(4096))
    finally:
        runtime.stop()
    assert code == 0
    assert set(messages[1:]) <= {b"WATCHDOG=1", b"STATUS=serving"}
