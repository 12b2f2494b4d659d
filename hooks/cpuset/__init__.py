"""Exclusive CPUs for Guaranteed containers, picked and hinted as kubelet's static policy does.

``take_cpus`` chooses the CPUs (``picker``), ``cpu_hints`` says which NUMA nodes could hold
them (``hints``); both are pure functions of a ``Topology`` and the free CPUs. ``pool`` keeps
who holds what, ``reconcile`` checks it against the runtime, ``koordinator`` reads the CPU
signals Koordinator puts on pods, ``CpusetHook`` (``hook``) is the built-in hook `cpuset` (and
the CPU ledger the `koordinator` hook runs).
"""

from crihook.hooks.cpuset.hints import cpu_hints
from crihook.hooks.cpuset.hook import CpusetHook
from crihook.hooks.cpuset.picker import CPUAllocationError, SMTAlignmentError, take_cpus

__all__ = ["CPUAllocationError", "CpusetHook", "SMTAlignmentError", "cpu_hints", "take_cpus"]
