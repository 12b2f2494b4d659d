"""`crihook state --cpus`: who holds which CPU, NUMA memory and pooled device, read from the
state dir (so it works while crihook runs and after it stopped, as `crihook state` does).

The node comes from `node.json` (`proxy.ops.node_doc`: the topology and what the resource hooks
place with); who holds what from the hooks' own state, read back by the hooks' own code (each
built-in's `holdings` reader in the registry, `crihook.hooks.builtin`): the CPU ledger's
`CpuPool` gives the shared pool and the exclusive holders exactly as the running hook computes
them, `MemoryState` the memory per NUMA node, the devices hook's allocations the pooled
devices. The store names the pods and containers.

`build_map` is pure (tests feed it documents); `load_map` reads a state dir; `CpuMap.to_json`
is `--json`. The picture is drawn by `proxy.ops.cpu_map_text`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crihook.hooks.builtin import BUILTIN_ORDER
from crihook.hooks.node import Topology, TopologyError, format_cpu_list, read_topology
from crihook.hooks.report import Holdings, MemoryBlock, NodeMemory
from crihook.proxy.ops.node_doc import NODE_FILE
from crihook.proxy.ops.state_cli import liveness, load_state

__all__ = [
    "GLYPHS",
    "MORE",
    "CpuMap",
    "DeviceEntry",
    "Holding",
    "MapError",
    "build_map",
    "cores_of",
    "load_map",
    "numa_nodes_of_socket",
    "socket_cpus",
]

GLYPHS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
"""One letter per holder on the map, in the order of their first CPU; past these, `+`."""
MORE = "+"
_LIVE = ("created", "running")


class MapError(Exception):
    """The state dir cannot be drawn (no topology anywhere); the message says why."""


@dataclass(frozen=True)
class Holding:
    """A container (or a pod, for its pod-level CPUs) holding CPUs, memory or devices."""

    glyph: str
    pod: str
    """`namespace/name`, or the sandbox id's start when the store does not know the pod."""
    pod_id: str
    container: str
    """Its name; empty for a pod's own CPUs (`topology_scope = "pod"`)."""
    container_id: str
    """Empty while the runtime has not answered its CreateContainer."""
    qos: str
    state: str
    """The container's state as crihook last saw it, `being created`, or `pod`."""
    cpus: frozenset[int] = frozenset()
    memory: tuple[MemoryBlock, ...] = ()
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.pod}/{self.container}" if self.container else f"{self.pod} (pod)"

    def to_json(self) -> dict[str, Any]:
        return {
            "glyph": self.glyph,
            "pod": self.pod,
            "pod_id": self.pod_id,
            "container": self.container,
            "container_id": self.container_id,
            "qos": self.qos,
            "state": self.state,
            "cpus": format_cpu_list(self.cpus),
            "memory": [
                {"numa": list(b.numa), "resource": b.resource, "bytes": b.size} for b in self.memory
            ],
            "devices": {pool: list(ids) for pool, ids in self.devices.items()},
        }


@dataclass(frozen=True)
class DeviceEntry:
    pool: str
    id: str
    numa: int | None
    holder: Holding | None


@dataclass(frozen=True)
class CpuMap:
    topology: Topology
    running: bool
    status_line: str
    """`running`, or why the state is what crihook last knew."""
    version: str | None
    cpu_hook: str | None
    """The hook whose CPU ledger placed the CPUs (`cpuset`, `koordinator`); None: none does."""
    reserved: frozenset[int]
    strict_reservation: bool
    shared: frozenset[int]
    holdings: tuple[Holding, ...]
    owners: Mapping[int, Holding]
    """Each CPU held exclusively → its holder (a container in a pod's CPUs wins)."""
    shared_containers: int
    """Live containers with no CPUs of their own: they run on the shared pool."""
    memory: tuple[NodeMemory, ...] = ()
    devices: tuple[DeviceEntry, ...] = ()
    notes: tuple[str, ...] = ()

    def use(self, cpu: int) -> str:
        """`reserved`, `exclusive`, `shared`, or `unused` (a reserved CPU under
        strict-cpu-reservation is `reserved`)."""
        if cpu in self.owners:
            return "exclusive"
        if cpu in self.reserved:
            return "reserved"
        return "shared" if cpu in self.shared else "unused"

    def free_for_exclusive(self) -> frozenset[int]:
        """What the next exclusive container could get: the shared pool less reserved CPUs."""
        return self.shared - self.reserved if self.cpu_hook else frozenset()

    def to_json(self) -> dict[str, Any]:
        topo = self.topology
        sockets = []
        for socket in topo.sockets:
            nodes = []
            for node in numa_nodes_of_socket(topo, socket):
                cores = []
                for core, threads in cores_of(topo, node, socket):
                    cores.append({"id": core, "cpus": [self._cpu_json(c) for c in threads]})
                here = topo.cpus_in_numa([node]) & socket_cpus(topo, socket)
                nodes.append(
                    {
                        "id": node,
                        "cpus": format_cpu_list(here),
                        "memory": [
                            {
                                "resource": m.resource,
                                "allocatable": m.allocatable,
                                "assigned": m.assigned,
                                "free": m.free,
                            }
                            for m in self.memory
                            if m.node == node
                        ],
                        "cores": cores,
                    }
                )
            sockets.append({"id": socket, "numa_nodes": nodes})
        return {
            "running": self.running,
            "status": self.status_line,
            "crihook": self.version,
            "cpu_hook": self.cpu_hook,
            "cpus": {
                "online": format_cpu_list(topo.online),
                "offline": format_cpu_list(topo.offline),
                "reserved": format_cpu_list(self.reserved),
                "strict_reservation": self.strict_reservation,
                "shared": format_cpu_list(self.shared),
                "exclusive": format_cpu_list(frozenset(self.owners)),
                "free_for_exclusive": format_cpu_list(self.free_for_exclusive()),
            },
            "shared_containers": self.shared_containers,
            "sockets": sockets,
            "memory_only_numa_nodes": [n for n in topo.numa_nodes if not topo.cpus_in_numa([n])],
            "holdings": [h.to_json() for h in self.holdings],
            "devices": [
                {
                    "pool": d.pool,
                    "id": d.id,
                    "numa": d.numa,
                    "held_by": d.holder.glyph if d.holder is not None else None,
                }
                for d in self.devices
            ],
            "notes": list(self.notes),
        }

    def _cpu_json(self, cpu: int) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": cpu, "use": self.use(cpu)}
        holder = self.owners.get(cpu)
        if holder is not None:
            doc["held_by"] = holder.glyph
        return doc


# --- the topology's shape, shared with the renderer -------------------------------------------


def socket_cpus(topo: Topology, socket: int) -> frozenset[int]:
    return frozenset(c.id for c in topo.cpus.values() if c.socket == socket)


def numa_nodes_of_socket(topo: Topology, socket: int) -> list[int]:
    """The NUMA nodes with CPUs on `socket` (a node spanning sockets appears under each)."""
    return sorted({c.numa for c in topo.cpus.values() if c.socket == socket})


def cores_of(topo: Topology, node: int, socket: int) -> Iterator[tuple[int, list[int]]]:
    """(core id, its CPUs ascending) of one NUMA node on one socket, by core id."""
    cores: dict[int, list[int]] = {}
    for cpu in topo.cpus.values():
        if cpu.numa == node and cpu.socket == socket:
            cores.setdefault(cpu.core, []).append(cpu.id)
    for core in sorted(cores):
        yield core, sorted(cores[core])


# --- reading ----------------------------------------------------------------------------------


def load_map(state_dir: Path, sysfs_root: Path = Path("/sys")) -> CpuMap:
    """The map of the state in `state_dir`. Without node.json (a state dir an older crihook
    wrote) the topology is read from `sysfs_root`, and the map says so. MapError when
    neither can be read."""
    state = load_state(state_dir)
    path = state_dir / NODE_FILE
    try:
        node: dict[str, Any] | None = json.loads(path.read_text())
    except FileNotFoundError:
        node = None
    except (OSError, ValueError) as exc:
        raise MapError(f"cannot read {path}: {exc}") from None
    fallback: Topology | None = None
    if node is None:
        try:
            fallback = read_topology(sysfs_root)
        except TopologyError as exc:
            raise MapError(f"no {path}, and this machine's topology: {exc}") from None
    return build_map(state, node, fallback)


def build_map(
    state: Mapping[str, Any], node: Mapping[str, Any] | None, fallback: Topology | None = None
) -> CpuMap:
    """The map of `state` (what `load_state` reads) on the node `node` describes (node.json);
    with `node` None, on `fallback`'s topology, reserved CPUs unknown. MapError when
    neither gives a topology."""
    notes: list[str] = []
    if node is not None:
        try:
            topo = Topology.from_dict(node["topology"])
        except (KeyError, TopologyError) as exc:
            raise MapError(f"{NODE_FILE} holds no usable topology: {exc}") from None
    elif fallback is not None:
        topo = fallback
        notes.append(
            f"no {NODE_FILE} in the state dir (a crihook that predates it wrote this state): "
            "drawn on this machine's CPUs, reserved CPUs unknown"
        )
    else:
        raise MapError(f"no {NODE_FILE} and no topology to draw on")
    held = _holdings(state.get("hook_states") or {}, node, topo, notes)
    ledger = held.ledger  # None: no CPU ledger, every online CPU is shared

    pods: Mapping[str, Any] = state.get("pods") or {}
    containers: Mapping[str, Any] = state.get("containers") or {}
    by_name = {(c["view"]["pod_id"], c["view"]["name"]): cid for cid, c in containers.items()}
    ordered = sorted(
        held.drafts.values(),
        key=lambda d: (min(d.cpus) if d.cpus else math.inf, d.pod_id, d.name),
    )
    holdings: list[Holding] = []
    for index, d in enumerate(ordered):
        cid = d.container_id or ("" if d.pending else by_name.get((d.pod_id, d.name), ""))
        record = containers.get(cid) if cid else None
        pod_view = (pods.get(d.pod_id) or {}).get("view") or {}
        if not d.name:
            what = "pod"
        elif d.pending:
            what = "being created"
        else:
            what = str(record.get("state", "unknown")) if record else "unknown"
        holdings.append(
            Holding(
                glyph=GLYPHS[index] if index < len(GLYPHS) else MORE,
                pod=_pod_label(pod_view, d.pod_id),
                pod_id=d.pod_id,
                container=d.name,
                container_id=cid,
                qos=str(pod_view.get("qos_class", "Unknown")),
                state=what,
                cpus=d.cpus,
                memory=tuple(d.memory),
                devices=dict(d.devices),
            )
        )
    owners: dict[int, Holding] = {}
    for holding in holdings:  # pods' own CPUs first: their containers' slices win
        if not holding.container:
            owners.update(dict.fromkeys(holding.cpus, holding))
    for holding in holdings:
        if holding.container:
            owners.update(dict.fromkeys(holding.cpus, holding))
    exclusive_ids = {h.container_id for h in holdings if h.cpus and h.container_id}
    shared_containers = sum(
        1
        for cid, c in containers.items()
        if c.get("state") in _LIVE
        and cid not in exclusive_ids
        and (ledger is None or c["view"]["pod_id"] not in ledger.bubbles)
    )
    status = state.get("status")
    process = state.get("process")  # the state dir's lock holder: it decides when known
    if status is None and process is None:
        running, line = False, "crihook has not written its status here"
    else:
        down = liveness(status, process=process)
        running, line = down is None, "running" if down is None else down
    devices = tuple(
        DeviceEntry(
            str(d["pool"]),
            str(d["id"]),
            d.get("numa"),
            _device_holder(holdings, str(d["pool"]), str(d["id"])),
        )
        for d in (node or {}).get("device_pools", [])
    )
    return CpuMap(
        topology=topo,
        running=running,
        status_line=line,
        version=(status or {}).get("version") or (node or {}).get("crihook"),
        cpu_hook=ledger.hook if ledger else None,
        reserved=ledger.reserved if ledger else frozenset(),
        strict_reservation=ledger.strict if ledger else False,
        shared=ledger.shared if ledger else topo.online,
        holdings=tuple(holdings),
        owners=owners,
        shared_containers=shared_containers,
        memory=held.memory,
        devices=devices,
        notes=tuple(notes),
    )


def _pod_label(view: Mapping[str, Any], pod_id: str) -> str:
    if view.get("name"):
        return f"{view.get('namespace', '')}/{view['name']}"
    return pod_id[:13]


def _device_holder(holdings: list[Holding], pool: str, device: str) -> Holding | None:
    for holding in holdings:
        if device in holding.devices.get(pool, ()):
            return holding
    return None


def _holdings(
    hooks: Mapping[str, Any], node: Mapping[str, Any] | None, topo: Topology, notes: list[str]
) -> Holdings:
    """What the hooks' states hold, read by each built-in's own reader (the registry's
    `holdings`) at its default position: the CPU ledger first, then memory, then devices.
    A hook is read when it has state, or node.json names it (the ledger's or the memory's
    hook)."""
    if node is not None:  # node.json names the CPU ledger's hook, or says why there is none
        config = node.get("cpus")
        if config is None:
            notes.append("no CPU ledger: the cpuset hook is not in the chain")
        elif "error" in config:
            notes.append(f"the {config.get('hook')} hook cannot start: {config['error']}")
    named = {part.get("hook") for part in (node or {}).values() if isinstance(part, Mapping)}
    held = Holdings(topo, notes)
    for builtin in BUILTIN_ORDER:
        if builtin.name not in hooks and builtin.name not in named:
            continue
        reader = builtin.holdings_reader()
        if reader is not None:
            reader(builtin.name, hooks.get(builtin.name), node, held)
    return held
