"""Bad input on the wire: malformed gRPC payloads and broken HTTP/2 on crihook's socket and on a
plugin's (the SDK's server), against real processes."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

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
            channel.unary_unary(f"{PLUGIN}/{method}")(payload, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "bad " in info.value.details() and "Request" in info.value.details()
        assert channel.unary_unary(f"{PLUGIN}/Configure")(b"", timeout=10) is not None
