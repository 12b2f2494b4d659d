"""The numa hook's reports: its part of node.json (the memory reserved per NUMA node) and, for
`crihook state --cpus`, the memory each container holds and kubelet's memory manager table,
rebuilt by the hook's own code from its saved blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crihook.hooks.node import Topology
from crihook.hooks.numa.hook import parse_reserved_memory
from crihook.hooks.numa.memory import MemoryState
from crihook.hooks.numa.saved import SavedNuma, read_saved
from crihook.hooks.report import Holdings, MemoryBlock, NodeMemory

__all__ = ["holdings", "node_doc"]


def node_doc(
    name: str, options: Mapping[str, Any], topology: Topology, policy: str
) -> dict[str, Any]:
    """node.json's `memory` (`report.NodeDocPart`)."""
    try:
        reserved = parse_reserved_memory(options.get("reserved_memory"), topology)
    except ValueError as exc:
        return {"memory": {"hook": name, "error": str(exc)}}
    return {
        "memory": {
            "hook": name,
            "reserved": {str(node): dict(table) for node, table in sorted(reserved.items())},
        }
    }


def holdings(
    name: str,
    state: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None,
    holdings: Holdings,
) -> None:
    """Each container's memory blocks, and the memory per NUMA node and kind
    (`report.HoldingsReader`)."""
    _memory_holdings(state, holdings)
    holdings.memory = _node_memory(node, state, holdings.topology, holdings.notes)


def _memory_holdings(numa: Mapping[str, Any] | None, holdings: Holdings) -> None:
    if not numa:
        return
    try:
        saved = _numa_saved(numa)
    except ValueError:
        return  # said by _node_memory's note
    entries = (saved.memory or {}).get("entries") or {}
    owners = {(ref[0], ref[1]): cid for cid, ref in saved.owners.items()}
    pending = {tuple(p["ref"]) for p in saved.pending.values()}
    for pod_id, names in entries.items():
        for name, blocks in names.items():
            d = holdings.draft(pod_id, name)
            d.memory = [
                MemoryBlock(tuple(b["numaAffinity"]), str(b["type"]), int(b["size"]))
                for b in blocks
            ]
            cid = owners.get((pod_id, name))
            if cid:
                d.container_id = d.container_id or cid
            elif (pod_id, name) in pending:
                d.pending = True


def _numa_saved(numa: Mapping[str, Any]) -> SavedNuma:
    """The hook's state, whichever layout it was written in (ValueError: unreadable)."""
    return read_saved(numa.items())


def _node_memory(
    node: Mapping[str, Any] | None,
    numa: Mapping[str, Any] | None,
    topo: Topology,
    notes: list[str],
) -> tuple[NodeMemory, ...]:
    """Per NUMA node and kind: kubelet's memory manager table, rebuilt from the saved
    blocks."""
    config = (node or {}).get("memory")
    if not config or "error" in config or not topo.memory:
        return ()
    reserved = {
        int(n): {str(r): int(v) for r, v in table.items()}
        for n, table in config["reserved"].items()
    }
    try:
        saved = _numa_saved(numa).memory if numa else None
        memory = (
            MemoryState.from_dict(topo, reserved, saved)
            if saved
            else MemoryState.build(topo, reserved)
        )
    except ValueError as exc:
        notes.append(f"the numa hook's memory state cannot be read: {exc}")
        return ()
    return tuple(
        NodeMemory(n, resource, t.allocatable, t.reserved, t.free)
        for n, state in memory.nodes.items()
        for resource, t in sorted(state.memory.items())
    )
