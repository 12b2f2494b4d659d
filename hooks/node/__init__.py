"""The node as hooks see it: CPU/NUMA topology (read once from sysfs), cpulists, the host's
processes behind the :class:`Host` seam, its files behind the :class:`HostFiles` seam,
pods' own cgroups behind the :class:`PodCgroups` seam, network interfaces behind the
:class:`Netlink` seam and checked host paths pinned for the runtime behind the
:class:`Staging` seam.

    from crihook.hooks.node import read_topology, parse_cpu_list, format_cpu_list, LinuxHost
"""

from crihook.hooks.node.cgroups import LinuxPodCgroups, PodCgroups, PodLimits
from crihook.hooks.node.cpulist import format_cpu_list, parse_cpu_list
from crihook.hooks.node.files import DeviceNode, HostFiles, LinuxFiles, WouldBlock
from crihook.hooks.node.host import (
    Host,
    LinuxHost,
    cgroup_version,
    expand_slice,
    pod_cgroup_path,
)
from crihook.hooks.node.netlink import LinkInfo, Netlink, NetlinkSession, PyrouteNetlink
from crihook.hooks.node.staging import DEFAULT_STAGING_ROOT, LinuxStaging, Staging
from crihook.hooks.node.sysfs import read_topology
from crihook.hooks.node.topology import CPUInfo, NUMAMemory, Topology, TopologyError

__all__ = [
    "DEFAULT_STAGING_ROOT",
    "CPUInfo",
    "DeviceNode",
    "Host",
    "HostFiles",
    "LinkInfo",
    "LinuxFiles",
    "LinuxHost",
    "LinuxPodCgroups",
    "LinuxStaging",
    "NUMAMemory",
    "Netlink",
    "NetlinkSession",
    "PodCgroups",
    "PodLimits",
    "PyrouteNetlink",
    "Staging",
    "Topology",
    "TopologyError",
    "WouldBlock",
    "cgroup_version",
    "expand_slice",
    "format_cpu_list",
    "parse_cpu_list",
    "pod_cgroup_path",
    "read_topology",
]
