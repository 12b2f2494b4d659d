"""The CPU ledger, below the hooks that place CPUs (`cpuset`, and `koordinator` when it places
them itself): one per node, so exclusive CPUs, koord-scheduler's CPUs and the shared and BE
pools are counted in one place.

``take_cpus`` chooses the CPUs (``picker``), ``cpu_hints`` says which NUMA nodes could hold
them (``hints``); both are pure functions of a ``Topology`` and the free CPUs. ``rules`` says
how many CPUs a container gets, ``options`` reads the CPU manager's options, ``pool`` keeps who
holds what, ``reconcile`` checks it against the runtime, ``koordinator`` reads the CPU signals
Koordinator puts on pods, and ``CpuLedger`` (``ledger``) drives all of it through the hook
stages.
"""

from crihook.hooks.cpus.hints import cpu_hints
from crihook.hooks.cpus.ledger import CpuLedger
from crihook.hooks.cpus.picker import CPUAllocationError, SMTAlignmentError, take_cpus

__all__ = ["CPUAllocationError", "CpuLedger", "SMTAlignmentError", "cpu_hints", "take_cpus"]
