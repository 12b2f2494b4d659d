"""The `method` and `path` labels of crihook's metrics, apart from the metrics themselves: the
data paths label every call with them, and need not load prometheus_client to do so (it is
loaded only when metrics are served)."""

from __future__ import annotations

from crihook.proxy.cri.methods import known_methods

__all__ = ["INTERCEPTED", "OTHER_METHOD", "PASSTHROUGH", "method_label"]

INTERCEPTED, PASSTHROUGH = "intercepted", "passthrough"
OTHER_METHOD = "other"
"""The `method` label of a method the compiled CRI API does not have (a newer kubelet's)."""

_KNOWN_METHODS = frozenset(m.name for m in known_methods())


def method_label(path: str) -> str:
    """`/runtime.v1.RuntimeService/ListContainers` → `ListContainers`; a method the compiled
    API does not have → `other` (a client must not create series at will)."""
    name = path.rpartition("/")[2]
    return name if name in _KNOWN_METHODS else OTHER_METHOD
