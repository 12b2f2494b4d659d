"""The cpuset hook's options (`[hooks.cpuset]`), validated once at load.

    [hooks.cpuset]
    reserved_cpus = "0-1"            # or a count: 2 (picked the way kubelet picks them)
    policy_options = { "full-pcpus-only" = "true", "distribute-cpus-across-numa" = "true" }
    disable_cfs_quota = true         # exclusive containers run without a CFS quota

`policy_options` takes kubelet's own `cpuManagerPolicyOptions` keys and string values, so a
kubelet configuration carries over as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crihook.hooks.cpuset.picker import CPUAllocationError, SMTAlignmentError, take_cpus
from crihook.hooks.node import Topology, parse_cpu_list

__all__ = ["POLICY_OPTIONS", "CpusetOptions", "parse_options", "reserved_cpus"]

POLICY_OPTIONS = ("full-pcpus-only", "distribute-cpus-across-numa")
_KEYS = {"reserved_cpus", "policy_options", "disable_cfs_quota"}


@dataclass(frozen=True)
class CpusetOptions:
    reserved: str | int = 0
    """A cpulist, or a number of CPUs picked as kubelet picks reserved CPUs."""
    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    disable_cfs_quota: bool = True


def parse_options(options: Mapping[str, Any]) -> CpusetOptions:
    """ValueError naming the option and what is wrong with it."""
    unknown = sorted(set(options) - _KEYS)
    if unknown:
        raise ValueError(f"cpuset: unknown option(s) {', '.join(unknown)}")
    reserved = options.get("reserved_cpus", 0)
    if isinstance(reserved, bool) or not isinstance(reserved, int | str):
        raise ValueError(f"cpuset: reserved_cpus must be a cpulist or a count, not {reserved!r}")
    if isinstance(reserved, int) and reserved < 0:
        raise ValueError(f"cpuset: reserved_cpus must be >= 0, not {reserved}")
    if isinstance(reserved, str):
        try:
            parse_cpu_list(reserved)
        except ValueError as exc:
            raise ValueError(f"cpuset: reserved_cpus: {exc}") from None
    policy = options.get("policy_options", {})
    if not isinstance(policy, Mapping):
        raise ValueError("cpuset: policy_options must be a table of kubelet option = value")
    flags = {}
    for name, value in policy.items():
        if name not in POLICY_OPTIONS:
            raise ValueError(
                f"cpuset: policy_options: {name!r} is not supported "
                f"(supported: {', '.join(POLICY_OPTIONS)})"
            )
        flags[name] = _bool(f"policy_options {name!r}", value)
    quota = options.get("disable_cfs_quota", True)
    if not isinstance(quota, bool):
        raise ValueError(f"cpuset: disable_cfs_quota must be true or false, not {quota!r}")
    return CpusetOptions(
        reserved=reserved,
        full_pcpus_only=flags.get("full-pcpus-only", False),
        distribute_cpus_across_numa=flags.get("distribute-cpus-across-numa", False),
        disable_cfs_quota=quota,
    )


def _bool(what: str, value: object) -> bool:
    # kubelet's option values are strings ("true"); TOML booleans are accepted too.
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f'cpuset: {what} must be "true" or "false", not {value!r}')


def reserved_cpus(
    topology: Topology,
    reserved: str | int,
    *,
    spread_numa: bool = False,
    full_cores: bool = False,
) -> frozenset[int]:
    """The reserved CPUs on this node; ValueError when they do not fit it.

    A count is picked by kubelet's `takeByTopology`, which follows the policy options:
    `spread_numa` (distribute-cpus-across-numa) spreads it, in whole cores with `full_cores`
    (full-pcpus-only) when the count is whole cores, else packed."""
    if isinstance(reserved, int):
        if reserved == 0:
            return frozenset()
        try:
            try:
                return take_cpus(
                    topology,
                    topology.online,
                    reserved,
                    spread_numa=spread_numa,
                    full_cores=full_cores and spread_numa,
                )
            except SMTAlignmentError:
                # kubelet's distributed pick falls back to packed when the count is not
                # whole groups; and it never refuses reserved CPUs for SMT alignment.
                return take_cpus(topology, topology.online, reserved)
        except CPUAllocationError as exc:
            raise ValueError(f"cpuset: reserved_cpus = {reserved}: {exc}") from None
    cpus = parse_cpu_list(reserved)
    offline = cpus - topology.online
    if offline:
        raise ValueError(
            f"cpuset: reserved_cpus {reserved!r} names CPUs that are not online: {sorted(offline)}"
        )
    return cpus
