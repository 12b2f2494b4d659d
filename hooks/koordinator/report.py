"""Koordinator's part of node.json: with `cpu_manager = "none"` it runs the CPU ledger
itself (`crihook.hooks.cpus`), with the options `cpuset_options` gives it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crihook.hooks.cpus.report import ledger_doc
from crihook.hooks.koordinator.options import cpuset_options, parse_options
from crihook.hooks.node import Topology

__all__ = ["node_doc"]


def node_doc(
    name: str, options: Mapping[str, Any], topology: Topology, policy: str
) -> dict[str, Any]:
    """node.json's `cpus` when this hook places CPUs; nothing when the cpuset hook does
    (`report.NodeDocPart`)."""
    try:
        koordinator = parse_options(options)
    except ValueError as exc:
        return {"cpus": {"hook": name, "error": str(exc)}}
    if not koordinator.places_cpus:
        return {}
    return {"cpus": ledger_doc(name, cpuset_options(koordinator), topology, policy)}
