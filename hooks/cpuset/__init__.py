"""The built-in hook `cpuset`: kubelet's CPU manager (`CpusetHook`, ``hook``), on the CPU ledger
of ``crihook.hooks.cpus`` (shared with the `koordinator` hook, which runs one too when it places
CPUs itself).

``take_cpus``, ``cpu_hints`` and their errors are public here too, where the resource hooks
issue pinned them (tools import ``crihook.hooks.cpuset.take_cpus``); they live in
``crihook.hooks.cpus``.
"""

from crihook.hooks.cpus import CPUAllocationError, SMTAlignmentError, cpu_hints, take_cpus
from crihook.hooks.cpuset.hook import CpusetHook

__all__ = ["CPUAllocationError", "CpusetHook", "SMTAlignmentError", "cpu_hints", "take_cpus"]
