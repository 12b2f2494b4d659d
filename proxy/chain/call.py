"""What the chain is told about one intercepted call: one object instead of loose arguments.

The pipeline makes a `ChainCall` and hands it to each stage (`Chain.hints`, `pre`,
`validate`, `post`, `failed`); the chain builds every hook's `HookContext` from it, in one
place (`Chain._context`).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from crihook.hooks.spec import ContainerView, Event, PodView, TopologyHint
from crihook.proxy.cri.events import EVENTS, EventSpec

__all__ = ["ChainCall"]


class ChainCall:
    """One call as its hooks see it. `request` is what the pre stage adjusts (in global
    dry-run, a copy); `ran` collects the hooks whose pre or post stage was called (told in
    the failed stage); `trace` each hook's run, for the call's log line and recording."""

    # Made on every call that has hooks: slots, no dataclass machinery.
    __slots__ = (
        "affinity",
        "container",
        "deadline",
        "event",
        "exempt",
        "pod",
        "ran",
        "request",
        "response",
        "spec",
        "trace",
    )

    def __init__(
        self,
        event: Event,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        *,
        spec: EventSpec | None = None,
        response: Message | None = None,
        deadline: float | None = None,
        exempt: bool = False,
        affinity: TopologyHint | None = None,
        ran: list[str] | None = None,
        trace: list[Any] | None = None,
    ) -> None:
        self.event = event
        self.spec = EVENTS[event] if spec is None else spec
        self.pod = pod
        self.container = container
        self.request = request
        self.response = response
        """The runtime's answer: set by `Chain.post`, read by the post stage only."""
        self.deadline = deadline
        """kubelet's deadline (monotonic), or None: bounds each hook's timeout."""
        self.exempt = exempt
        self.affinity = affinity
        """The NUMA placement the topology policy chose from the hints, for the pre stage."""
        self.ran = ran
        self.trace = trace
