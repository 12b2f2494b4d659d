"""The devices hook's reports: its pools in node.json and in a recording's header (with what
the host's files say of every path in them), and, for `crihook state --cpus`, the pooled
devices each container holds, read from its allocations."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from crihook.hooks.devices.policy import DevicePolicy, parse_policy
from crihook.hooks.devices.pools import Allocation
from crihook.hooks.node import HostFiles, Topology
from crihook.hooks.report import Holdings

__all__ = ["device_pools", "holdings", "node_doc"]


def node_doc(
    name: str, options: Mapping[str, Any], topology: Topology, policy: str
) -> dict[str, Any]:
    """node.json's `device_pools` (`report.NodeDocPart`)."""
    try:
        parsed = parse_policy(options)
    except ValueError:
        return {"device_pools": []}  # the hook refuses to load: crihook does not start
    return {"device_pools": _pools(parsed)}


def device_pools(options: Mapping[str, Any], files: HostFiles) -> list[dict[str, Any]]:
    """The pools, each path looked up through `files` (`report.HeaderFacts`)."""
    policy = parse_policy(options)
    for pool in policy.pools.values():
        for device in pool.devices:
            for path in device.paths:
                with contextlib.suppress(OSError):
                    files.device(files.resolve(path))
    return _pools(policy)


def _pools(policy: DevicePolicy) -> list[dict[str, Any]]:
    return [
        {"pool": pool.name, "id": device.id, "numa": device.numa, "paths": list(device.paths)}
        for pool in policy.pools.values()
        for device in pool.devices
    ]


def holdings(
    name: str,
    state: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None,
    holdings: Holdings,
) -> None:
    """The pooled devices of each container (`report.HoldingsReader`)."""
    for key, doc in (state or {}).items():
        if not key.startswith("a:"):
            continue
        try:
            allocation = Allocation.from_dict(doc)
        except (KeyError, TypeError, ValueError):
            holdings.notes.append(f"unreadable {name} state entry left out: {key}")
            continue
        d = holdings.draft(allocation.pod, allocation.name)
        d.devices = dict(allocation.devices)
        if allocation.pending:
            d.pending = True
        elif allocation.containers:
            d.container_id = d.container_id or allocation.containers[-1]
