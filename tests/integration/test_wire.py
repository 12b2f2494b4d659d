"""Bad input on the wire: malformed gRPC payloads and broken HTTP/2 on crihook's socket and on a
plugin's (the SDK's server), against real processes."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import pytest

from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fake_runtime import FakeRuntime
from tests.lab.h2_bytes import PREFACE, SETTINGS, frame, request
from tests.lab.plugin_proc import Plugin

PLUGIN = "/crihook.hook.v1.Plugin"


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    started = Plugin().start()
    yield started
    started.stop()


@pytest.mark.parametrize("method", ["Configure", "Synchronize", "PreCreateContainer"])
@pytest.mark.parametrize(
    "payload",
    [b"\xff\xff\xff", b"\x0a\xff\xff\xff\x0f", b"\x0d\x01"],
    ids=["garbage", "length-past-the-end", "truncated-fixed32"],
)
def test_a_plugin_refuses_a_malformed_message_clearly_and_serves_on(
    plugin: Plugin, method: str, payload: bytes
) -> None:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(f"{PLUGIN}/{method}")(payload, timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "bad " in info.value.details() and "Request" in info.value.details()
        assert channel.unary_unary(f"{PLUGIN}/Configure")(b"", timeout=60) is not None


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    yield runtime
    runtime.stop()


def test_when_grpcs_server_stops_serving_crihook_exits_1_to_be_restarted(
    fake: FakeRuntime,
) -> None:
    """grpcio's aio server ends its main loop on a method name that is not UTF-8 (found by
    the soak's bit flips): the listener and its socket file go, the process would stay up and
    deaf. crihook notices within a second, says so, and exits 1 for systemd to restart it."""
    proc = CrihookProcess(fake.endpoint, data_path="grpc").start()
    poisoned = b"/runtime.v1.RuntimeService\xafVersion"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.connect(str(proc.socket_path))
        peer.sendall(PREFACE + frame(SETTINGS, 0, 0) + request(poisoned, b""))
        assert proc.proc is not None
        wait_for(lambda: proc.proc.poll() is not None, PATIENCE, "crihook to exit")  # type: ignore[union-attr]
    assert proc.proc.returncode == 1
    assert "the gRPC server no longer serves; stopping, exit 1" in proc.log()


def test_on_h2_a_method_name_that_is_not_utf8_closes_only_its_connection(
    fake: FakeRuntime,
) -> None:
    """crihook's own HTTP/2 cannot decode that header block: GOAWAY (COMPRESSION_ERROR) on
    that connection, which closes; crihook serves on."""
    with CrihookProcess(fake.endpoint, data_path="h2") as proc:
        poisoned = b"/runtime.v1.RuntimeService\xafVersion"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.connect(str(proc.socket_path))
            peer.settimeout(10)
            peer.sendall(PREFACE + frame(SETTINGS, 0, 0) + request(poisoned, b""))
            rest = b""
            while chunk := peer.recv(4096):
                rest += chunk
        assert rest.endswith(b"\x00\x00\x00\x09")  # GOAWAY, COMPRESSION_ERROR, then closed
        with grpc.insecure_channel(proc.endpoint) as channel:
            assert channel.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=60) == b""
        assert proc.proc is not None and proc.proc.poll() is None
