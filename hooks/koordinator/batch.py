"""The cgroup values of a BE pod's batch resources, computed as koordlet computes them.

koordlet's `batchresource` hook (containers and the pod sandbox alike):

- cpu shares from the batch-cpu request: ``milli * 1024 / 1000`` (integer division), at
  least 2; no request counts as 0;
- CFS quota from the batch-cpu limit: ``milli * 100000 / 1000`` over the base period of
  100 ms, at least 1000 µs; no limit (or not positive): -1, unlimited. With the node's
  batch CFS quota switched off (NodeSLO ``enableCFSQuota: false``, `batch_cfs_quota`) the
  quota is -1 whatever the limit;
- memory limit from the batch-memory limit; no limit: unlimited;
- for the pod: the sums over its containers' entries; the pod is unlimited (quota or
  memory) as soon as one container is.

crihook sets the CFS period with the quota (100 ms, the period the quota is computed for;
koordlet leaves kubelet's, which is the same unless kubelet's `cpuCFSQuotaPeriod` was
changed). An unlimited memory is left as kubelet sent it: BestEffort pods have none.
"""

from __future__ import annotations

from dataclasses import dataclass

from crihook.hooks.koordinator.protocol import BatchSpec, ContainerBatch
from crihook.hooks.spec import Adjustment

__all__ = ["BASE_PERIOD_US", "BatchResources", "container_resources", "pod_resources"]

BASE_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000
MIN_SHARES = 2


@dataclass(frozen=True)
class BatchResources:
    cpu_shares: int
    cpu_quota: int
    """µs per BASE_PERIOD_US; -1: unlimited."""
    memory_limit_bytes: int | None
    """None: unlimited (left as kubelet sent it)."""

    def describe(self) -> str:
        """`cpu quota 150000/100000 µs, 512 shares, memory 512Mi` (for a reason)."""
        quota = (
            "no CFS quota"
            if self.cpu_quota < 0
            else f"CFS quota {self.cpu_quota}/{BASE_PERIOD_US} µs"
        )
        memory = (
            "memory unlimited"
            if self.memory_limit_bytes is None
            else (f"memory {_bytes(self.memory_limit_bytes)}")
        )
        return f"{quota}, {self.cpu_shares} cpu shares, {memory}"

    def apply(self, adjustment: Adjustment) -> Adjustment:
        """Set these values on `adjustment` (container or pod-level resources)."""
        adjustment.set_cpu_shares(self.cpu_shares).set_cpu_quota(self.cpu_quota)
        if self.cpu_quota > 0:
            adjustment.set_cpu_period(BASE_PERIOD_US)
        if self.memory_limit_bytes is not None:
            adjustment.set_memory_limit(self.memory_limit_bytes)
        return adjustment


def _bytes(value: int) -> str:
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift}{suffix}"
    return str(value)


def _shares(milli: int) -> int:
    return max(milli * 1024 // 1000, MIN_SHARES)


def _quota(milli: int, enabled: bool) -> int:
    if not enabled:
        return -1
    quota = milli * BASE_PERIOD_US // 1000
    if quota <= 0:
        return -1
    return max(quota, MIN_QUOTA_US)


def container_resources(batch: ContainerBatch, *, cfs_quota: bool = True) -> BatchResources:
    """One container's values from its entry in the extended resource spec."""
    request = batch.cpu_request_milli or 0
    limit = batch.cpu_limit_milli or 0
    memory = batch.memory_limit_bytes
    return BatchResources(
        cpu_shares=_shares(max(request, 0)),
        cpu_quota=_quota(max(limit, 0), cfs_quota),
        memory_limit_bytes=memory if memory is not None and memory > 0 else None,
    )


def pod_resources(spec: BatchSpec, *, cfs_quota: bool = True) -> BatchResources:
    """The pod sandbox's values: the sums over the containers' entries."""
    request = sum(
        c.cpu_request_milli
        for c in spec.containers.values()
        if c.cpu_request_milli is not None and c.cpu_request_milli > 0
    )
    limit: int | None = 0
    memory: int | None = 0
    for c in spec.containers.values():
        if limit is not None:
            if not c.has_limits or c.cpu_limit_milli is None or c.cpu_limit_milli <= 0:
                limit = None  # a container without a limit: the pod is unlimited
            else:
                limit += c.cpu_limit_milli
        if memory is not None:
            if not c.has_limits or c.memory_limit_bytes is None or c.memory_limit_bytes <= 0:
                memory = None
            else:
                memory += c.memory_limit_bytes
    return BatchResources(
        cpu_shares=_shares(request),
        cpu_quota=_quota(limit or 0, cfs_quota),
        memory_limit_bytes=memory or None,
    )
