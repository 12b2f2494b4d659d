"""What the pipeline core takes and gives, with no transport in it.

The core (`proxy.core.pipeline.Pipeline.handle`) takes a method, the request bytes, the metadata
and a deadline, drives a `Runtime`, and returns an `Outcome`: what was forwarded (the bytes
kubelet sent when nothing changed), the runtime's answer or the status the call ends with,
each hook's verdict, adjustment and timing, and the updates to other containers it issued
(sent after the answer, or before it with `updates = "before-answer"`). The gRPC server,
recording and replay all sit on this value. The `Runtime` it drives, and the error a failed
runtime call raises, are in proxy/cri/runtime.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import grpc

from crihook.hooks.spec import ContainerView, Event, PodView, Stage
from crihook.proxy.cri.verdicts import Origin, Verdict

__all__ = [
    "HookRun",
    "Metadata",
    "Observation",
    "Outcome",
    "SentUpdate",
    "Status",
    "clean_metadata",
]

Metadata = tuple[tuple[str, str | bytes], ...]
"""gRPC metadata as (key, value) pairs; binary keys (`-bin`) carry bytes."""

_RESERVED_PREFIXES = ("grpc-", ":")
_HOP_BY_HOP = frozenset({"user-agent", "content-type", "te", "host"})


def clean_metadata(md: Any) -> Metadata | None:
    """Metadata to pass on to the other side: grpc's reserved and hop-by-hop keys left out;
    None when nothing is left."""
    if not md:
        return None
    kept = tuple(
        (k, v) for k, v in md if not k.startswith(_RESERVED_PREFIXES) and k not in _HOP_BY_HOP
    )
    return kept or None


class Status(NamedTuple):
    """How a call ended when it did not succeed: a gRPC status code, its message and the
    trailers to pass on (the runtime's own, when the runtime answered it)."""

    code: grpc.StatusCode
    details: str
    trailers: Metadata = ()


class HookRun(NamedTuple):
    """One hook's part in one stage of a call."""

    hook: str
    stage: Stage
    verdict: Verdict
    """`adjusted`, `nothing`, `hints`, `ok` (a validator), `told` (failed stage),
    `dry-run`, `ignored` (a failure under failure_policy=ignore), `rejected`, `failed`,
    `cancelled` (a Verdict: equal to these words)."""
    detail: str
    """Why: for `ignored`, `rejected`, `failed` and `dry-run` what went wrong; for `adjusted`
    and `nothing` the hook's own reason (`Adjustment.because`), or empty."""
    answer: Any
    """The Adjustment (pre/post), the hints (hints stage), or None; for a `failed` or
    `ignored` run, the Adjustment the chain refused (invalid, not permitted, in conflict)."""
    seconds: float


class SentUpdate(NamedTuple):
    """An UpdateContainerResources crihook issued for hooks after a call (or a synchronize):
    sent and answered (`status`), or queued to go out after the answer (status None)."""

    container_id: str
    resources: Mapping[str, Any]
    """The whole resources sent (the container's current ones with the delta on top)."""
    changed: Mapping[str, Any]
    """The fields the hooks asked to change, and their values."""
    hooks: Sequence[str]
    status: Status | None
    """None: the runtime applied it, or (issued after the answer) it is on its way."""


class Observation(NamedTuple):
    """One question a hook asked the node or the runtime through a seam, and its answer (or
    error), as JSON values: noted while recording (proxy.core.observe), written and read
    back by the recording."""

    seam: str
    """`host`, `files`, `staging`, `netlink` or `runtime`."""
    op: str
    args: list[Any]
    result: Any
    error: dict[str, Any] | None


class Outcome:
    """What happened to one intercepted call. `forwarded is received` when the request went
    to the runtime as kubelet sent it; None when it never reached the runtime.

    Built on every call: the attributes that most calls leave as they are stay class-level
    defaults."""

    seq = 0
    """Order in which calls entered the chain."""
    started = 0.0
    """Wall-clock time (epoch seconds) the call arrived (set when someone listens)."""
    elapsed = 0.0
    runtime_elapsed: float | None = None
    """Seconds from the request forwarded to the runtime's answer (or its error); None when
    the runtime gave neither: the call never reached it, or kubelet cancelled the call while
    it was there. `elapsed` less this is crihook's own part."""
    timeout: float | None = None
    """kubelet's remaining time when the call arrived (set when someone listens)."""
    ready = True
    """False: crihook was not ready yet and answered UNAVAILABLE itself."""
    pod: PodView | None = None
    container: ContainerView | None = None
    forwarded: bytes | None = None
    response: bytes | None = None
    status: Status | None = None
    status_origin: str = ""
    """Who ended the call with `status` (an Origin): `crihook`, `runtime` or `kubelet`
    (cancelled); empty while it has not failed."""
    updates: Sequence[SentUpdate] = ()
    observed: list[Any] | None = None
    """What hooks asked the node and the runtime through the seams (when recording)."""
    trace: list[HookRun] | None = None
    """The hooks' runs, kept when someone listens to the outcomes (recording, replay):
    serving alone pays nothing for them."""

    def __init__(self, event: Event, received: bytes, metadata: Metadata | None) -> None:
        self.event = event
        self.received = received
        self.metadata = metadata

    @property
    def hooks(self) -> list[HookRun]:
        """Each hook's part in the call, in the order they ran (when traced; also from a
        trace of plain tuples in HookRun's order)."""
        return [HookRun._make(run) for run in self.trace or ()]

    @property
    def changed(self) -> bool:
        """The request was forwarded with changes."""
        return self.forwarded is not None and self.forwarded is not self.received

    def fail(self, origin: Origin, status: Status) -> Outcome:
        self.status_origin = origin
        self.status = status
        return self
