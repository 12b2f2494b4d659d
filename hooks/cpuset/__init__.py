"""The built-in hook `cpuset`: kubelet's CPU manager (`CpusetHook`, ``hook``), on the CPU ledger
of ``crihook.hooks.cpus`` (shared with the `koordinator` hook, which runs one too when it places
CPUs itself).
"""

from crihook.hooks.cpuset.hook import CpusetHook

__all__ = ["CpusetHook"]
