"""The parts of each intercepted request crihook cannot act without; pure.

Each checker takes its call's decoded request (`EventSpec.request`) and answers what is missing,
in words for the operator, or None. `crihook.proxy.core.validate` explains what is required
and why; the rows of `crihook.proxy.cri.events` name the checker of each call.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2

__all__ = [
    "MAX_KEPT_BYTES",
    "container_id",
    "create_container",
    "pod_sandbox_id",
    "run_pod_sandbox",
]

MAX_KEPT_BYTES = 512 * 1024
"""The most a pod's or a container's labels and annotations may hold together (keys and
values, in characters): crihook keeps them in its store for every later call of that pod, so a
request over it is refused (INVALID_ARGUMENT) before hooks or the runtime see it. Twice
Kubernetes' own bound on a pod's annotations (256 KiB), which the API server enforces: a
pod kubelet runs stays below it unless its labels alone are as large."""


def _empty(request: Message, name: str) -> str:
    return f"{request.DESCRIPTOR.name} {name} is empty"


def _missing(request: Message, name: str) -> str:
    return f"{request.DESCRIPTOR.name} has no {name}"


def run_pod_sandbox(request: api_pb2.RunPodSandboxRequest) -> str | None:
    if not request.HasField("config"):
        return _missing(request, "config")
    if not request.config.HasField("metadata"):
        return _missing(request, "config.metadata")
    if not request.config.metadata.uid:
        return _empty(request, "config.metadata.uid")
    return _kept(request, "config", request.config)


def create_container(request: api_pb2.CreateContainerRequest) -> str | None:
    if not request.pod_sandbox_id:
        return _empty(request, "pod_sandbox_id")
    for name, part in (("config", request.config), ("sandbox_config", request.sandbox_config)):
        if not request.HasField(name):
            return _missing(request, name)
        if not part.HasField("metadata"):
            return _missing(request, f"{name}.metadata")
        problem = _kept(request, name, part)
        if problem is not None:
            return problem
    return None


def _kept(request: Message, name: str, config: Any) -> str | None:
    """Labels and annotations over MAX_KEPT_BYTES, named with their size; None if within."""
    size = sum(len(k) + len(v) for k, v in config.labels.items())
    size += sum(len(k) + len(v) for k, v in config.annotations.items())
    if size <= MAX_KEPT_BYTES:
        return None
    return (
        f"{request.DESCRIPTOR.name} {name}.labels and {name}.annotations hold {size} characters "
        f"({len(config.labels)} labels, {len(config.annotations)} annotations): more than "
        f"the {MAX_KEPT_BYTES} crihook keeps per pod or container"
    )


def container_id(request: Any) -> str | None:
    """Any request whose target is `container_id`."""
    return None if request.container_id else _empty(request, "container_id")


def pod_sandbox_id(request: Any) -> str | None:
    """Any request whose target is `pod_sandbox_id`."""
    return None if request.pod_sandbox_id else _empty(request, "pod_sandbox_id")
