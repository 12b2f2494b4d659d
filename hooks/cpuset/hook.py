"""The built-in `cpuset` hook: exclusive CPUs as kubelet's static CPU manager picks them, and a
shared pool for every other container (`[hooks.cpuset]`, see docs/hooks.md).

The hook is the node's CPU ledger (``crihook.hooks.cpus.CpuLedger``) with its options: what
it does at each stage, how it reconciles at start and how it honours Koordinator's CPU
signals is the ledger's. The ledger lives below the hooks because the `koordinator` hook
runs the same one when it places CPUs itself (`cpu_manager = "none"`).
"""

from __future__ import annotations

from crihook.hooks.cpus import CpuLedger

__all__ = ["CpusetHook"]


class CpusetHook(CpuLedger):
    """kubelet's CPU manager as a hook: `[hooks.cpuset]` options (`policy`, `reserved_cpus`,
    `policy_options`, ...) as ``crihook.hooks.cpus.options`` reads them."""
