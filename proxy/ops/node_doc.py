"""`<state-dir>/node.json`: the node as crihook placed containers on it, for `crihook state
--cpus` (and any tool) to draw without the machine or the config at hand.

Written once at start, after the hooks are built: the CPU and NUMA topology read from
`--sysfs-root`, and what the built-in resource hooks place with, worked out from their
settings by their own functions (so it is what they use; each built-in's `node_doc` reader in
the registry, `crihook.hooks.builtin`, asked at its default position):

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
from crihook.hooks.builtin import BUILTIN_ORDER
from crihook.hooks.node import Topology, TopologyError
from crihook.hooks.node import read_topology as read_sysfs_topology
from crihook.proxy.config import Settings
from crihook.proxy.errors import ConfigError
from crihook.proxy.state.journal import write_atomic

__all__ = ["NODE_FILE", "NODE_FORMAT", "node_doc", "read_topology", "write_node_doc"]

NODE_FILE = "node.json"
NODE_FORMAT = 1


def read_topology(settings: Settings) -> Topology:
    """The node's topology from `[node] sysfs_root`; a ConfigError naming the path if it
    cannot be read (exit 2 at start)."""
    try:
        return read_sysfs_topology(settings.node.sysfs_root)
    except TopologyError as exc:
        raise ConfigError("--sysfs-root", str(exc)) from None


def node_doc(settings: Settings, topology: Topology, now: float | None = None) -> dict[str, Any]:
    """The document `write_node_doc` writes (plain JSON types)."""
    hooks = {h.base_name: h for h in settings.chain.hooks if h.module is None}
    policy = settings.node.topology_policy
    doc: dict[str, Any] = {
        "format": NODE_FORMAT,
        "crihook": __version__,
        "written_at": round(time.time() if now is None else now, 3),
        "topology": topology.to_dict(),
        "topology_policy": policy,
        "cpus": None,
        "memory": None,
        "device_pools": [],
    }
    parts: dict[str, Any] = {}
    for builtin in BUILTIN_ORDER:  # the first hook to give a part keeps it
        hook = hooks.get(builtin.name)
        if hook is None or (part := builtin.node_doc_part()) is None:
            continue
        for key, value in part(builtin.name, hook.options, topology, policy).items():
            if value is not None:
                parts.setdefault(key, value)
    return {**doc, **parts}


def write_node_doc(state_dir: Path, doc: dict[str, Any]) -> None:
    """Replace node.json (durable: it is written once). OSError when it cannot be."""
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    write_atomic(state_dir / NODE_FILE, data)
