"""grpc core settings crihook's processes (the proxy, SDK plugins) run with.

grpc's EventEngine-based endpoints cost ~100 µs more CPU per call on each side of a unix
socket hop than the classic iomgr ones (bench/README.md). They are chosen when grpc loads,
so the entry points set GRPC_EXPERIMENTS to CLASSIC_ENDPOINTS (unless the operator set it)
before their first `import grpc`.
"""

from __future__ import annotations

__all__ = ["CLASSIC_ENDPOINTS"]

CLASSIC_ENDPOINTS = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)
