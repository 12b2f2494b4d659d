"""Exclusive CPUs for Guaranteed containers, picked and hinted as kubelet's static policy does.

``take_cpus`` chooses the CPUs (``picker``), ``cpu_hints`` says which NUMA nodes could hold
them (``hints``); both are pure functions of a ``Topology`` and the free CPUs. ``pool`` keeps
who holds what, ``reconcile`` checks it against the runtime, ``CpusetHook`` (``hook``) is the
built-in hook `cpuset`.
"""

from crihook.hooks.cpuset.hints import cpu_hints
from crihook.hooks.cpuset.hook import CpusetHook
from crihook.hooks.cpuset.picker import CPUAllocationError, SMTAlignmentError, take_cpus

__all__ = ["CPUAllocationError", "CpusetHook", "SMTAlignmentError", "cpu_hints", "take_cpus"]
