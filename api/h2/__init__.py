"""crihook's own HTTP/2: a sans-IO connection (`connection`), gRPC's wire rules
(`grpc_wire`) and the asyncio adapter (`protocol`). Shared by the kubelet-facing server and
the runtime client (crihook.proxy) and by the plugin transport (crihook.hooks.remote), so it
sits below both."""

from crihook.api.h2.connection import (
    CANCEL,
    NO_ERROR,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    Connection,
    Data,
    Event,
    Failed,
    Flushed,
    GoAway,
    Header,
    Headers,
    PingAcked,
    Reset,
    Settled,
    frame,
)

__all__ = [
    "CANCEL",
    "NO_ERROR",
    "PREFACE",
    "PROTOCOL_ERROR",
    "REFUSED_STREAM",
    "Connection",
    "Data",
    "Event",
    "Failed",
    "Flushed",
    "GoAway",
    "Header",
    "Headers",
    "PingAcked",
    "Reset",
    "Settled",
    "frame",
]
