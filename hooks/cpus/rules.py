"""Who gets exclusive CPUs: kubelet's static-policy rules, read from what CRI carries.

- A container gets exclusive CPUs when its pod is Guaranteed (the sandbox cgroup parent says
  so) and its CPU request is whole CPUs (kubelet's `guaranteedCPUs`); the request is decoded
  from `cpu_shares`, exactly as kubelet encodes it. Its CPU limit must equal the request (or
  be absent: no CFS quota): in a pod made Guaranteed by pod-level resources only containers
  that are Guaranteed themselves get exclusive CPUs (kubelet 1.36, container scope); in any
  other Guaranteed pod every container's limit equals its request anyway.
- With the `pod` topology scope, a Guaranteed pod whose pod-level CPU budget
  (`LinuxPodSandboxConfig.resources`) is whole CPUs gets a bubble of that many CPUs at
  RunPodSandbox. Its containers whose own CPU request is whole CPUs and equals their limit
  take exclusive slices of it; the others share what is left of it (the pod's shared pool).
"""

from __future__ import annotations

from crihook.hooks.spec import ContainerView, PodView, QoSClass

__all__ = ["bubble_cpus", "exclusive_cpus", "slice_cpus"]


def exclusive_cpus(container: ContainerView) -> int | None:
    """Whole CPUs a container of a Guaranteed pod asks for, or None (shared pool)."""
    res = container.resources
    if res.cpu_limit_milli is not None and res.cpu_limit_milli != res.cpu_request_milli:
        return None
    return res.integer_cpus or None


def bubble_cpus(pod: PodView, scope: str) -> int | None:
    """The CPUs of a pod's bubble under the `pod` scope, or None (no bubble)."""
    if scope != "pod" or pod.qos_class is not QoSClass.GUARANTEED or pod.resources is None:
        return None
    return pod.resources.integer_cpus or None


def slice_cpus(container: ContainerView) -> int | None:
    """Inside a bubble: whole CPUs a container asks for with request == limit (or no CFS
    limit at all), or None (the pod's shared pool)."""
    res = container.resources
    request, limit = res.cpu_request_milli, res.cpu_limit_milli
    if not request or request % 1000 or (limit is not None and limit != request):
        return None
    return request // 1000
