"""The hook contract: what a hook implements and what it is given.

A hook is a class with async methods named for the stages it handles:

    class Pin(Hook):
        async def pre_create_container(self, ctx: HookContext) -> Adjustment | None: ...
        async def post_remove_container(self, ctx: HookContext) -> Adjustment | None: ...

Its subscriptions follow from what it implements. Pre stages may return an Adjustment to the
call and updates to other containers; post stages run after the runtime answered OK and may
return only updates. A hook never blocks the event loop: blocking work goes to a thread
(`asyncio.to_thread`). Shared node resources (CPUs, devices) are the hook's to guard.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from google.protobuf.message import Message

from crihook.hooks.spec.adjustment import Adjustment
from crihook.hooks.spec.events import Event, Stage, stage_method_name
from crihook.hooks.spec.views import ContainerView, PodView

__all__ = ["ChainHook", "Hook", "HookContext", "HookState", "subscriptions_of"]


class HookState(Protocol):
    """A hook's private, persisted key-value namespace (JSON values). Survives restarts."""

    def get(self, key: str, default: Any = None) -> Any: ...
    def set(self, key: str, value: Any) -> None: ...
    def delete(self, key: str) -> None: ...
    def items(self) -> Iterator[tuple[str, Any]]: ...


class HookContext:
    """What one hook call sees. Read-only by contract; `request` is the hook's own copy of
    the CRI request as adjusted by earlier hooks (decoded on first use)."""

    __slots__ = (
        "_request",
        "_request_copy",
        "container",
        "event",
        "pod",
        "response",
        "stage",
        "state",
        "timeout",
    )

    def __init__(
        self,
        event: Event,
        stage: Stage,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        response: Message | None,
        state: HookState,
        timeout: float,
    ) -> None:
        self.event = event
        self.stage = stage
        self.pod = pod
        self.container = container
        self._request = request
        self._request_copy: Message | None = None
        self.response = response
        self.state = state
        self.timeout = timeout
        """Seconds this call may take (the hook's timeout or kubelet's remaining deadline)."""

    @property
    def request(self) -> Message:
        if self._request_copy is None:
            copy = type(self._request)()
            copy.CopyFrom(self._request)
            self._request_copy = copy
        return self._request_copy

    def request_bytes(self) -> bytes:
        """The request as adjusted so far, serialized: what an out-of-process plugin is sent
        (no decoded copy is made)."""
        data: bytes = self._request.SerializeToString()
        return data


class Hook:
    """Base class of in-process hooks (and of SDK plugins). `options` are the hook's own
    settings from `[hooks.<name>]` (or the plugin's command line)."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options: Mapping[str, Any] = dict(options or {})

    async def start(self) -> None:
        """Called once before the first event (open files, read sysfs, ...)."""

    async def close(self) -> None:
        """Called once at shutdown."""


def subscriptions_of(hook: object) -> frozenset[tuple[Event, Stage]]:
    """The (event, stage) pairs a hook implements, from its coroutine methods."""
    subs = set()
    for event in Event:
        for stage in Stage:
            method = getattr(hook, stage_method_name(event, stage), None)
            if method is not None and inspect.iscoroutinefunction(method):
                subs.add((event, stage))
    return frozenset(subs)


@runtime_checkable
class ChainHook(Protocol):
    """How the chain sees a hook, in-process or out-of-process alike.

    Optional attributes: `connected` (False: down, calls fail and the failure policy
    applies) and `bounds_own_calls` (True: `call` itself ends by `ctx.timeout`, so the
    chain sets no timer)."""

    name: str

    def subscriptions(self) -> frozenset[tuple[Event, Stage]]: ...
    async def call(self, ctx: HookContext) -> Adjustment | None: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...
