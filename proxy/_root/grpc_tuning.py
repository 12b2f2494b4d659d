"""grpc core settings `crihook serve` runs with.

grpc's EventEngine-based endpoints cost ~100 µs more CPU per call on each side of a unix
socket hop than the classic iomgr ones (bench/README.md). They are chosen when grpc loads,
so the CLI sets GRPC_EXPERIMENTS to CLASSIC_ENDPOINTS (unless the operator set it) before
its first `import grpc`; the bench's tools use the same value.
"""

from __future__ import annotations

__all__ = ["CLASSIC_ENDPOINTS"]

CLASSIC_ENDPOINTS = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)
