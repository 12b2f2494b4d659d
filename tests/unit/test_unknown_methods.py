"""Methods the compiled API does not have are forwarded; made-up names do not pile up."""

from __future__ import annotations

from typing import Any

import grpc

from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.wire.grpc import server as server_module


class Runtime:
    """Only what building a handler asks of the runtime client: no call is made."""

    def stream_stream(self, path: str, image_service: bool) -> Any:
        return lambda *args, **kwargs: None


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[Any, ...] = ()


def test_handlers_are_kept_for_a_few_methods_not_for_every_name_a_client_sends() -> None:
    methods = server_module._UnknownMethods(Runtime(), Readiness())  # type: ignore[arg-type]
    first = methods.service(Details("/runtime.v1.RuntimeService/NewThing"))
    assert isinstance(first, grpc.RpcMethodHandler)
    assert methods.service(Details("/runtime.v1.RuntimeService/NewThing")) is first  # kept
    for n in range(3 * server_module.MAX_CACHED_METHODS):
        handler = methods.service(Details(f"/x.Y/M{n}"))
        assert handler is not None and handler.request_streaming and handler.response_streaming
    assert len(methods._cache) == server_module.MAX_CACHED_METHODS
    assert methods.service(Details("/runtime.v1.RuntimeService/NewThing")) is first
