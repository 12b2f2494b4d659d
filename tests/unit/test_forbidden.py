"""A hook's refusal because the node's policy does not allow what a pod asks (`Forbidden`):
PERMISSION_DENIED whatever the hook's failure policy, named as the hook's, and carried as
such across the plugin protocol (`reject_forbidden`; an SDK plugin end to end:
tests/integration/test_remote_plugin.py)."""

from __future__ import annotations

import grpc
import pytest

from crihook.api.hook.v1 import hook_pb2
from crihook.hooks.remote.client import _result
from crihook.hooks.spec import Forbidden, InvalidRequest, Reject
from crihook.proxy.errors import HookForbidden, HookRejected
from tests.unit.test_chain import make_chain
from tests.unit.test_chain_stages import reserving, run


async def test_forbidden_is_permission_denied_whatever_the_policy() -> None:
    log: list[tuple[str, str, str]] = []
    refusal = Forbidden("devices.crihook.io/pod [0]: device /dev/mem is not allowed")
    chain = make_chain(
        [reserving(log, "50-devices", pre=refusal, settings={"failure_policy": "ignore"})]
    )
    with pytest.raises(HookForbidden) as info:
        await run(chain)
    assert isinstance(info.value, HookRejected)  # a refusal: the failed stage tells the others
    assert info.value.status == grpc.StatusCode.PERMISSION_DENIED
    assert str(info.value) == (
        "hook '50-devices': CreateContainer not allowed: devices.crihook.io/pod [0]: "
        "device /dev/mem is not allowed"
    )
    assert chain.entries[0].counters["rejected"] == 1


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (hook_pb2.StageResponse(reject_reason="no"), Reject),
        (hook_pb2.StageResponse(reject_reason="no", reject_invalid=True), InvalidRequest),
        (hook_pb2.StageResponse(reject_reason="no", reject_forbidden=True), Forbidden),
    ],
    ids=["reject", "invalid", "forbidden"],
)
def test_the_plugin_protocol_carries_the_kind_of_refusal(
    response: hook_pb2.StageResponse, error: type[Reject]
) -> None:
    with pytest.raises(Reject) as info:
        _result(response)
    assert type(info.value) is error and info.value.reason == "no"
