"""The CRI method table: which methods exist and their shapes (which ones crihook
intercepts: crihook.proxy.cri.events).

Known methods come from the compiled CRI descriptors, so a regenerated api.proto updates the
table with no code change. Methods not in the table (a newer kubelet) are still forwarded, by
the server's catch-all handler.
"""

from __future__ import annotations

from dataclasses import dataclass

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.events import Event

__all__ = [
    "CRI_PACKAGE",
    "Event",
    "KnownMethod",
    "known_methods",
    "method_path",
]

CRI_PACKAGE = "runtime.v1"
IMAGE_SERVICE = f"{CRI_PACKAGE}.ImageService"


@dataclass(frozen=True)
class KnownMethod:
    service: str  # "runtime.v1.RuntimeService"
    name: str  # "ListContainers"
    server_streaming: bool
    client_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def is_image_service(self) -> bool:
        return self.service == IMAGE_SERVICE


def method_path(service: str, name: str) -> str:
    return f"/{CRI_PACKAGE}.{service}/{name}"


def known_methods() -> tuple[KnownMethod, ...]:
    """Every method of every service in the compiled CRI API."""
    out = []
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            out.append(
                KnownMethod(service.full_name, m.name, m.server_streaming, m.client_streaming)
            )
    return tuple(out)
