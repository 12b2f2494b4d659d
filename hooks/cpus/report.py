"""The CPU ledger's reports, for the hook whose state holds it (the cpuset hook, or Koordinator
with `cpu_manager = "none"`): its part of node.json and its holders for `crihook state
--cpus`, computed by the ledger's own code (`CpuPool`), so they are what the hook uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crihook.hooks.cpus.options import (
    CpusetOptions,
    host_problems,
    node_reserved_cpus,
    parse_options,
)
from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list
from crihook.hooks.report import Holdings, SavedLedger
from crihook.hooks.spec.hook import DictState

__all__ = ["ledger_doc", "ledger_holdings", "ledger_host_check", "ledger_node_doc"]


def ledger_host_check(
    options: Mapping[str, Any], cgroup_version: int | None
) -> list[tuple[str, str]]:
    """What the cpuset hook's options need of the host (`report.HostCheck`); options it
    refuses are refused when the hook is built, not here."""
    try:
        config = parse_options(options)
    except ValueError:
        return []
    return host_problems(config, cgroup_version)


def ledger_node_doc(
    name: str, options: Mapping[str, Any], topology: Topology, policy: str
) -> dict[str, Any]:
    """node.json's `cpus` of a hook that is the ledger (`report.NodeDocPart`)."""
    return {"cpus": ledger_doc(name, dict(options), topology, policy)}


def ledger_doc(
    name: str, options: Mapping[str, Any], topology: Topology, policy: str
) -> dict[str, Any]:
    """node.json's `cpus`: the reserved CPUs as the ledger of `name` with the cpuset hook's
    `options` picks them; `{"hook", "error"}` when they do not fit the node."""
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


def ledger_holdings(
    name: str,
    state: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None,
    holdings: Holdings,
) -> None:
    """The ledger of `name`, when node.json names it (or, in a state dir without node.json,
    when no hook before it gave one): each holder drafted (`report.HoldingsReader`)."""
    if node is not None:
        config = node.get("cpus")
        if not config or "error" in config or config.get("hook") != name:
            return  # another hook's ledger, or none (the map says which)
        reserved = parse_cpu_list(str(config.get("reserved", "")))
        strict = bool(config.get("strict_reservation", False))
    elif holdings.ledger is not None:
        return  # one ledger per node: the first hook's in the chain
    else:
        reserved, strict = frozenset(), False
    topo, draft = holdings.topology, holdings.draft
    pool = CpuPool(topo, reserved, DictState(state or {}), strict_reservation=strict)
    dropped = pool.load()
    if dropped:
        holdings.notes.append(
            f"unreadable {name} state entries left out: {', '.join(sorted(dropped))}"
        )
    for cid, holder in pool.containers.items():
        if holder.cpus and not holder.stopped:
            d = draft(holder.pod, holder.name)
            d.container_id, d.cpus = cid, holder.cpus
    for holder in pool.pending.values():
        if holder.cpus:
            d = draft(holder.pod, holder.name)
            d.pending, d.cpus = True, holder.cpus
    bubbles = set()
    for key, bubble in pool.bubbles.items():
        pod_id = key.removeprefix("uid:") if bubble.pending else key
        draft(pod_id, "").cpus = bubble.cpus
        bubbles.add(pod_id)
    holdings.ledger = SavedLedger(name, reserved, strict, pool.shared_pool(), frozenset(bubbles))
