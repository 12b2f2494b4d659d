"""The koordinator hook's options (`[hooks.koordinator]`), validated once at load.

    [hooks.koordinator]
    cpu_manager = "none"       # "none": this hook places every container's CPUs;
                               # "cpuset": the cpuset hook does (it must come before it)
    reserved_cpus = "0-1"      # Koordinator's node reservation: out of the LS and BE pools
    batch_cfs_quota = true     # NodeSLO enableCFSQuota: false gives batch pods no CFS quota

`cpu_manager` says who else manages CPUs on the node, as koordlet reads kubelet's CPU manager
policy: with `none` (kubelet's `none` policy, no cpuset hook) this hook places every
container on Koordinator's pools with the cpuset hook's ledger, run in kubelet's `none`
mode; with `cpuset` the cpuset hook in the chain is the node's CPU manager (kubelet's
static policy), honours Koordinator's CPU signals itself, and this hook sets no container
cpuset. `reserved_cpus` (only with `none`; the cpuset hook has its own) is a cpulist or a
count, as `node.koordinator.sh/reservation` gives it; those CPUs leave both pools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crihook.hooks.node import parse_cpu_list
from crihook.hooks.spec.options import reject_unknown

__all__ = ["KoordinatorOptions", "cpuset_options", "parse_options"]

_KEYS = {"cpu_manager", "reserved_cpus", "batch_cfs_quota"}
_MANAGERS = ("none", "cpuset")


@dataclass(frozen=True)
class KoordinatorOptions:
    cpu_manager: str = "none"
    """`none`: this hook places CPUs; `cpuset`: the cpuset hook in the chain does."""
    reserved_cpus: str | int = 0
    batch_cfs_quota: bool = True

    @property
    def places_cpus(self) -> bool:
        return self.cpu_manager == "none"


def parse_options(options: Mapping[str, Any]) -> KoordinatorOptions:
    """ValueError naming the option and what is wrong with it."""
    reject_unknown("koordinator", options, _KEYS)
    manager = options.get("cpu_manager", "none")
    if manager not in _MANAGERS:
        raise ValueError(f'koordinator: cpu_manager must be "none" or "cpuset", not {manager!r}')
    reserved = options.get("reserved_cpus", 0)
    if isinstance(reserved, bool) or not isinstance(reserved, int | str):
        raise ValueError(
            f"koordinator: reserved_cpus must be a cpulist or a count, not {reserved!r}"
        )
    if isinstance(reserved, int) and reserved < 0:
        raise ValueError(f"koordinator: reserved_cpus must be >= 0, not {reserved}")
    if isinstance(reserved, str):
        try:
            parse_cpu_list(reserved)
        except ValueError as exc:
            raise ValueError(f"koordinator: reserved_cpus: {exc}") from None
    if reserved and manager != "none":
        raise ValueError(
            'koordinator: reserved_cpus is for cpu_manager = "none"; with the cpuset hook '
            "reserve CPUs with [hooks.cpuset] reserved_cpus"
        )
    quota = options.get("batch_cfs_quota", True)
    if not isinstance(quota, bool):
        raise ValueError(f"koordinator: batch_cfs_quota must be true or false, not {quota!r}")
    return KoordinatorOptions(manager, reserved, quota)


def cpuset_options(options: KoordinatorOptions) -> dict[str, Any]:
    """The options of the cpuset ledger this hook runs with `cpu_manager = "none"`:
    kubelet's `none` policy; Koordinator's reserved CPUs leave every pool (kubelet's
    `strict-cpu-reservation`)."""
    out: dict[str, Any] = {"policy": "none"}
    if options.reserved_cpus:
        out["reserved_cpus"] = options.reserved_cpus
        out["policy_options"] = {"strict-cpu-reservation": "true"}
    return out
