"""NUMA placement of container memory, as kubelet's memory manager (Static policy) does it.

from crihook.hooks.numa import MemoryState, memory_hints, allocate, release

`NumaHook` (`hook`) is the built-in hook `numa`.
"""

from crihook.hooks.numa.hook import NumaHook
from crihook.hooks.numa.memory import (
    HUGEPAGES_PREFIX,
    MEMORY,
    Allocation,
    Block,
    ContainerRef,
    InitContainer,
    MemoryAllocationError,
    MemoryState,
    MemoryTable,
    NodeState,
    allocate,
    hugepage_resource,
    memory_hints,
    pod_memory_requests,
    release,
    resize,
)

__all__ = [
    "HUGEPAGES_PREFIX",
    "MEMORY",
    "Allocation",
    "Block",
    "ContainerRef",
    "InitContainer",
    "MemoryAllocationError",
    "MemoryState",
    "MemoryTable",
    "NodeState",
    "NumaHook",
    "allocate",
    "hugepage_resource",
    "memory_hints",
    "pod_memory_requests",
    "release",
    "resize",
]
