"""`<state-dir>/node.json`: the node as crihook placed containers on it, for `crihook state
--cpus` (and any tool) to draw without the machine or the config at hand.

Written once at start, after the hooks are built: the CPU and NUMA topology read from
`--sysfs-root`, and what the built-in resource hooks place with, worked out from their
settings by their own functions (so it is what they use):

    {"format": 1, "crihook": "0.1.0", "written_at": 1796...,
     "topology": {...},                       # Topology.to_dict()
     "topology_policy": "none",
     "cpus": {"hook": "cpuset", "reserved": "0", "strict_reservation": false,
              "static": true} | null,         # the CPU ledger (cpuset, or koordinator's)
     "memory": {"hook": "numa", "reserved": {"0": {"memory": 104857600}}} | null,
     "device_pools": [{"pool": "gpu", "id": "0", "numa": 0, "paths": ["/dev/nvidia0"]}]}

Who holds what is not here: that is in the hooks' state files, which change with every call.
A hook whose settings do not fit the node (a reserved CPU that is not online) fails its own
start; here its part says `"error"` instead.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from crihook import __version__
from crihook.hooks.node import Topology, TopologyError, format_cpu_list
from crihook.proxy.config import HookSettings, Settings
from crihook.proxy.errors import ConfigError
from crihook.proxy.state.journal import write_atomic

__all__ = ["NODE_FILE", "NODE_FORMAT", "node_doc", "read_topology", "write_node_doc"]

NODE_FILE = "node.json"
NODE_FORMAT = 1


def read_topology(settings: Settings) -> Topology:
    """The node's topology from `[node] sysfs_root`; a ConfigError naming the path if it
    cannot be read (exit 2 at start)."""
    try:
        return Topology.from_sysfs(settings.node.sysfs_root)
    except TopologyError as exc:
        raise ConfigError("--sysfs-root", str(exc)) from None


def node_doc(settings: Settings, topology: Topology, now: float | None = None) -> dict[str, Any]:
    """The document `write_node_doc` writes (plain JSON types)."""
    hooks = {h.base_name: h for h in settings.chain.hooks if h.module is None}
    policy = settings.node.topology_policy
    return {
        "format": NODE_FORMAT,
        "crihook": __version__,
        "written_at": round(time.time() if now is None else now, 3),
        "topology": topology.to_dict(),
        "topology_policy": policy,
        "cpus": _cpus(hooks, topology, policy),
        "memory": _memory(hooks.get("numa"), topology),
        "device_pools": _device_pools(hooks.get("devices")),
    }


def write_node_doc(state_dir: Path, doc: dict[str, Any]) -> None:
    """Replace node.json (durable: it is written once). OSError when it cannot be."""
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    write_atomic(state_dir / NODE_FILE, data)


def _cpus(hooks: dict[str, HookSettings], topology: Topology, policy: str) -> dict[str, Any] | None:
    # Imported here, as the hooks are: a node without them never loads their code.
    from crihook.hooks.cpus.options import CpusetOptions, node_reserved_cpus, parse_options

    name, options = "cpuset", None
    if "cpuset" in hooks:
        options = dict(hooks["cpuset"].options)
    elif "koordinator" in hooks:  # it runs the ledger itself when no cpuset hook does
        from crihook.hooks.koordinator.options import cpuset_options
        from crihook.hooks.koordinator.options import parse_options as koordinator_options

        try:
            koordinator = koordinator_options(hooks["koordinator"].options)
        except ValueError as exc:
            return {"hook": "koordinator", "error": str(exc)}
        if koordinator.places_cpus:
            name, options = "koordinator", cpuset_options(koordinator)
    if options is None:
        return None
    try:
        config: CpusetOptions = parse_options(options)
        reserved = node_reserved_cpus(topology, config, policy)
    except ValueError as exc:
        return {"hook": name, "error": str(exc)}
    return {
        "hook": name,
        "reserved": format_cpu_list(reserved),
        "strict_reservation": config.strict_cpu_reservation,
        "static": config.static,
    }


def _memory(hook: HookSettings | None, topology: Topology) -> dict[str, Any] | None:
    if hook is None:
        return None
    from crihook.hooks.numa.hook import parse_reserved_memory

    try:
        reserved = parse_reserved_memory(hook.options.get("reserved_memory"), topology)
    except ValueError as exc:
        return {"hook": "numa", "error": str(exc)}
    return {
        "hook": "numa",
        "reserved": {str(node): dict(table) for node, table in sorted(reserved.items())},
    }


def _device_pools(hook: HookSettings | None) -> list[dict[str, Any]]:
    if hook is None:
        return []
    from crihook.hooks.devices.policy import parse_policy

    try:
        policy = parse_policy(hook.options)
    except ValueError:
        return []  # the hook refuses to load: crihook does not start
    return [
        {"pool": pool.name, "id": device.id, "numa": device.numa, "paths": list(device.paths)}
        for pool in policy.pools.values()
        for device in pool.devices
    ]
