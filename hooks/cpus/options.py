"""The cpuset hook's options (`[hooks.cpuset]`), validated once at load.

    [hooks.cpuset]
    reserved_cpus = "0-1"            # or a count: 2 (picked the way kubelet picks them)
    policy_options = { "full-pcpus-only" = "true", "distribute-cpus-across-numa" = "true" }
    disable_cfs_quota = true         # exclusive containers run without a CFS quota
    policy = "static"                # or "none": no exclusive CPUs but koord-scheduler's
    resize_exclusive_cpus = false    # kubelet's InPlacePodVerticalScalingExclusiveCPUs gate
    shared_pool_in = "containers"    # or "qos-cgroups" (cgroup v2): see SHARED_POOL_IN

`policy_options` takes kubelet's own `cpuManagerPolicyOptions` keys and string values, so a
kubelet configuration carries over as it is, and refuses what kubelet refuses
(`NewStaticPolicyOptions`): an unknown option, a value `strconv.ParseBool` does not read, and
these pairs:

- `full-pcpus-only` with `distribute-cpus-across-cores`;
- `distribute-cpus-across-numa` with `distribute-cpus-across-cores`;
- `prefer-align-cpus-by-uncorecache` with `distribute-cpus-across-cores`;
- `prefer-align-cpus-by-uncorecache` with `distribute-cpus-across-numa`.

What needs the node is checked when the hook builds its pool (`node_reserved_cpus`, kubelet's
`ValidateStaticPolicyOptions`): `align-by-socket` is refused under the `single-numa-node`
topology policy and on machines with more sockets than NUMA nodes. kubelet's feature gates
(alpha and beta options) are the operator's to set on kubelet; crihook takes every option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crihook.hooks.cpus.picker import CPUAllocationError, take_reserved
from crihook.hooks.node import Topology, parse_cpu_list
from crihook.hooks.spec.options import reject_unknown

__all__ = [
    "POLICY_OPTIONS",
    "SHARED_POOL_IN",
    "CpusetOptions",
    "check_node",
    "host_problems",
    "node_reserved_cpus",
    "parse_options",
    "reserved_cpus",
]

FULL_PCPUS_ONLY = "full-pcpus-only"
DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
ALIGN_BY_SOCKET = "align-by-socket"
DISTRIBUTE_ACROSS_CORES = "distribute-cpus-across-cores"
STRICT_RESERVATION = "strict-cpu-reservation"
ALIGN_BY_UNCORECACHE = "prefer-align-cpus-by-uncorecache"

POLICY_OPTIONS = (
    FULL_PCPUS_ONLY,
    DISTRIBUTE_ACROSS_NUMA,
    ALIGN_BY_SOCKET,
    DISTRIBUTE_ACROSS_CORES,
    STRICT_RESERVATION,
    ALIGN_BY_UNCORECACHE,
)
"""kubelet's static policy options, in the order kubelet declares them."""

EXCLUSIVE_PAIRS = (
    (FULL_PCPUS_ONLY, DISTRIBUTE_ACROSS_CORES),
    (DISTRIBUTE_ACROSS_NUMA, DISTRIBUTE_ACROSS_CORES),
    (ALIGN_BY_UNCORECACHE, DISTRIBUTE_ACROSS_CORES),
    (ALIGN_BY_UNCORECACHE, DISTRIBUTE_ACROSS_NUMA),
)
"""Options kubelet refuses together, in the order it checks them."""

_KEYS = {
    "reserved_cpus",
    "policy_options",
    "disable_cfs_quota",
    "policy",
    "resize_exclusive_cpus",
    "shared_pool_in",
}
IN_CONTAINERS = "containers"
IN_QOS_CGROUPS = "qos-cgroups"
SHARED_POOL_IN = (IN_CONTAINERS, IN_QOS_CGROUPS)
"""Where the shared pool is held: in each shared container's own cpuset (an update per
container when it changes), or in kubelet's Burstable and BestEffort QoS cgroups, whose
pods' containers inherit it (two file writes; cgroup v2 only)."""
_POLICIES = ("static", "none")
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
"""What Go's strconv.ParseBool reads, which is what kubelet reads option values with."""


@dataclass(frozen=True)
class CpusetOptions:
    reserved: str | int = 0
    """A cpulist (kubelet's reservedSystemCPUs), or a number of CPUs picked as kubelet picks
    reserved CPUs."""
    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    """Reserved CPUs leave the shared pool too: no container runs on them."""
    prefer_align_cpus_by_uncorecache: bool = False
    disable_cfs_quota: bool = True
    static: bool = True
    """kubelet's `static` policy: Guaranteed containers with whole CPUs get exclusive ones.
    `none`: only the CPUs koord-scheduler gave a pod are its own, every other container runs
    on a pool (as on a Koordinator node with kubelet's `none` policy)."""
    resize_exclusive_cpus: bool = False
    """kubelet's InPlacePodVerticalScalingExclusiveCPUs feature gate (alpha, off by default):
    an in-place resize of a container with exclusive CPUs grows or shrinks them, keeping the
    CPUs it was created with. Off: such a resize is refused, as kubelet refuses it. Set it as
    kubelet's gate is set."""
    shared_pool_in: str = IN_CONTAINERS
    """`containers`: every shared container is given the pool as its cpuset. `qos-cgroups`:
    the pool is written to kubelet's Burstable and BestEffort QoS cgroups' `cpuset.cpus`,
    and their pods' containers get no cpuset of their own (cgroup v2 only; the shared
    containers of Guaranteed pods keep theirs)."""

    @property
    def pool_in_qos_cgroups(self) -> bool:
        return self.shared_pool_in == IN_QOS_CGROUPS


def parse_options(options: Mapping[str, Any]) -> CpusetOptions:
    """ValueError naming the option and what is wrong with it."""
    reject_unknown("cpuset", options, _KEYS)
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
    for first, second in EXCLUSIVE_PAIRS:
        if flags.get(first) and flags.get(second):
            raise ValueError(
                f"cpuset: policy_options: {first!r} and {second!r} can not be used at the same "
                "time (kubelet refuses them together)"
            )
    quota = options.get("disable_cfs_quota", True)
    if not isinstance(quota, bool):
        raise ValueError(f"cpuset: disable_cfs_quota must be true or false, not {quota!r}")
    resize = options.get("resize_exclusive_cpus", False)
    if not isinstance(resize, bool):
        raise ValueError(f"cpuset: resize_exclusive_cpus must be true or false, not {resize!r}")
    pool_in = options.get("shared_pool_in", IN_CONTAINERS)
    if pool_in not in SHARED_POOL_IN:
        raise ValueError(
            f'cpuset: shared_pool_in must be "containers" or "qos-cgroups", not {pool_in!r}'
        )
    policy_name = options.get("policy", "static")
    if policy_name not in _POLICIES:
        raise ValueError(f'cpuset: policy must be "static" or "none", not {policy_name!r}')
    return CpusetOptions(
        reserved=reserved,
        full_pcpus_only=flags.get(FULL_PCPUS_ONLY, False),
        distribute_cpus_across_numa=flags.get(DISTRIBUTE_ACROSS_NUMA, False),
        align_by_socket=flags.get(ALIGN_BY_SOCKET, False),
        distribute_cpus_across_cores=flags.get(DISTRIBUTE_ACROSS_CORES, False),
        strict_cpu_reservation=flags.get(STRICT_RESERVATION, False),
        prefer_align_cpus_by_uncorecache=flags.get(ALIGN_BY_UNCORECACHE, False),
        disable_cfs_quota=quota,
        static=policy_name == "static",
        resize_exclusive_cpus=resize,
        shared_pool_in=pool_in,
    )


def host_problems(config: CpusetOptions, cgroup_version: int | None) -> list[tuple[str, str]]:
    """What this host cannot do of the options: (option, problem). `qos-cgroups` needs
    cgroup v2: on v1 a cpuset cgroup's `cpuset.cpus` must hold every CPU its children ask
    for (a QoS cgroup could not be narrowed under its containers' cpusets), and an empty
    one is not inherited, so the containers could not simply leave theirs unset."""
    if config.pool_in_qos_cgroups and cgroup_version != 2:
        found = f"cgroup v{cgroup_version}" if cgroup_version else "no cgroup file system"
        return [
            (
                "shared_pool_in",
                f'"qos-cgroups" needs cgroup v2 (the unified hierarchy), and this host has '
                f'{found}; use "containers" here',
            )
        ]
    return []


def _bool(what: str, value: object) -> bool:
    # kubelet's option values are strings read by strconv.ParseBool; TOML booleans too.
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _TRUE + _FALSE:
        return value in _TRUE
    raise ValueError(
        f'cpuset: {what} must be "true" or "false" (or another value Go\'s strconv.ParseBool '
        f"reads, as kubelet does), not {value!r}"
    )


def check_node(config: CpusetOptions, topology: Topology, topology_policy: str = "none") -> None:
    """kubelet's ``ValidateStaticPolicyOptions``: ValueError when an option does not fit this
    node or its topology policy."""
    if not config.align_by_socket:
        return
    if topology_policy == "single-numa-node":
        raise ValueError(
            f"cpuset: policy_options: {ALIGN_BY_SOCKET!r} is incompatible with the "
            "single-numa-node topology policy ([node] topology_policy)"
        )
    sockets = len(topology.sockets)
    numa_nodes = len({c.numa for c in topology.cpus.values()})
    if sockets > numa_nodes:
        raise ValueError(
            f"cpuset: policy_options: {ALIGN_BY_SOCKET!r} is not compatible with this node: it "
            f"has more sockets ({sockets}) than NUMA nodes ({numa_nodes})"
        )


def node_reserved_cpus(
    topology: Topology, config: CpusetOptions, topology_policy: str = "none"
) -> frozenset[int]:
    """The options checked against this node (``check_node``), then its reserved CPUs picked
    with the policy options; ValueError naming the option that does not fit."""
    check_node(config, topology, topology_policy)
    return reserved_cpus(
        topology,
        config.reserved,
        spread_numa=config.distribute_cpus_across_numa,
        full_cores=config.full_pcpus_only,
        uncore_cache=config.prefer_align_cpus_by_uncorecache,
        spread_cores=config.distribute_cpus_across_cores,
        align_socket=config.align_by_socket,
    )


def reserved_cpus(
    topology: Topology,
    reserved: str | int,
    *,
    spread_numa: bool = False,
    full_cores: bool = False,
    uncore_cache: bool = False,
    spread_cores: bool = False,
    align_socket: bool = False,
) -> frozenset[int]:
    """The reserved CPUs on this node; ValueError when they do not fit it.

    A cpulist is kubelet's `reservedSystemCPUs`, taken as it is. A count is picked by
    kubelet's `takeByTopology` over all CPUs, which follows the policy options (`take_reserved`:
    distributed with `spread_numa`, in whole cores with `full_cores` when the count is whole
    cores; spread over cores; uncore-cache aligned)."""
    if isinstance(reserved, int):
        if reserved == 0:
            return frozenset()
        try:
            return take_reserved(
                topology,
                reserved,
                spread_numa=spread_numa,
                full_cores=full_cores,
                uncore_cache=uncore_cache,
                spread_cores=spread_cores,
                align_socket=align_socket,
            )
        except CPUAllocationError as exc:
            raise ValueError(f"cpuset: reserved_cpus = {reserved}: {exc}") from None
    cpus = parse_cpu_list(reserved)
    offline = cpus - topology.online
    if offline:
        raise ValueError(
            f"cpuset: reserved_cpus {reserved!r} names CPUs that are not online: {sorted(offline)}"
        )
    return cpus
