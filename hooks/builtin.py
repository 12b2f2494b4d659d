"""The hooks shipped with crihook, by name, with their default place in the chain.

`--hooks cpuset,numa,oom,devices,netdev,koordinator` (or `[hooks] order = ["cpuset", ...]`)
takes each built-in name at its default position; `NN-name` overrides the position. Each hook
lives in `hooks/<name>/` (installed as `crihook.hooks.<name>`) and is imported only when
configured.

What a hook tells of itself outside the call path (its part of node.json, its holdings for
`crihook state --cpus`, its facts for a recording's header, what its options need of the
host) is read through the readers named
here (`crihook.hooks.report`), so the proxy names no hook and imports none.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from crihook.hooks.report import HeaderFacts, HoldingsReader, HostCheck, NodeDocPart

__all__ = ["BUILTIN_HOOKS", "BUILTIN_ORDER", "BuiltinHook"]


@dataclass(frozen=True)
class BuiltinHook:
    name: str
    target: str
    """`package.module:Class`, imported when the hook is configured."""
    position: int
    """The NN of `NN-name` when the name is given alone."""
    summary: str
    node_doc: str | None = None
    """`package.module:function` giving its part of node.json (`report.NodeDocPart`)."""
    holdings: str | None = None
    """`package.module:function` reading what it holds from its state, for `crihook state
    --cpus` (`report.HoldingsReader`)."""
    facts: str | None = None
    """`package.module:function` giving its node facts for a recording's header
    (`report.HeaderFacts`)."""
    host_check: str | None = None
    """`package.module:function` checking its options against the host before crihook
    serves (`report.HostCheck`)."""
    uses_staging: bool = False
    """It pins host paths under `[node] staging_dir`, so `crihook check` looks at how that
    mount propagates."""

    # Each reader is imported as `target` is, when asked for: a node without the hook never
    # loads its code.
    def node_doc_part(self) -> NodeDocPart | None:
        return None if self.node_doc is None else cast("NodeDocPart", _load(self.node_doc))

    def holdings_reader(self) -> HoldingsReader | None:
        return None if self.holdings is None else cast("HoldingsReader", _load(self.holdings))

    def header_facts(self) -> HeaderFacts | None:
        return None if self.facts is None else cast("HeaderFacts", _load(self.facts))

    def host_checker(self) -> HostCheck | None:
        return None if self.host_check is None else cast("HostCheck", _load(self.host_check))


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


BUILTIN_HOOKS: Mapping[str, BuiltinHook] = MappingProxyType(
    {
        h.name: h
        for h in (
            BuiltinHook(
                "cpuset",
                "crihook.hooks.cpuset:CpusetHook",
                20,
                "exclusive CPUs as kubelet's static CPU manager picks them; a shared pool",
                node_doc="crihook.hooks.cpus.report:ledger_node_doc",
                holdings="crihook.hooks.cpus.report:ledger_holdings",
                host_check="crihook.hooks.cpus.report:ledger_host_check",
            ),
            BuiltinHook(
                "koordinator",
                "crihook.hooks.koordinator:KoordinatorHook",
                25,
                "Koordinator's QoS pools, scheduler-assigned CPUs and BE batch resources",
                node_doc="crihook.hooks.koordinator.report:node_doc",
                holdings="crihook.hooks.cpus.report:ledger_holdings",
            ),
            BuiltinHook(
                "numa",
                "crihook.hooks.numa:NumaHook",
                30,
                "cpuset.mems and per-NUMA memory accounting under the topology policy",
                node_doc="crihook.hooks.numa.report:node_doc",
                holdings="crihook.hooks.numa.report:holdings",
            ),
            BuiltinHook(
                "oom",
                "crihook.hooks.oom:OomHook",
                40,
                "kubelet's oom_score_adj, per-namespace overrides, kept on running containers",
            ),
            BuiltinHook(
                "guard",
                "crihook.hooks.examples.guard:GuardHook",
                90,
                "example validator: no privileged containers, host paths only from a list",
            ),
            BuiltinHook(
                "devices",
                "crihook.hooks.devices:DevicesHook",
                50,
                "device nodes, host mounts, env and NUMA-aligned pooled devices the node allows",
                node_doc="crihook.hooks.devices.report:node_doc",
                holdings="crihook.hooks.devices.report:holdings",
                facts="crihook.hooks.devices.report:device_pools",
                uses_staging=True,
            ),
            BuiltinHook(
                "netdev",
                "crihook.hooks.netdev:NetdevHook",
                60,
                "host interfaces moved into, or macvlan/ipvlan made in, a pod's netns",
            ),
            BuiltinHook(
                "annotate",
                "crihook.hooks.examples.annotate:AnnotateHook",
                80,
                "example: one configured annotation on every container",
            ),
        )
    }
)

BUILTIN_ORDER: tuple[BuiltinHook, ...] = tuple(
    sorted(BUILTIN_HOOKS.values(), key=lambda h: h.position)
)
"""The built-ins at their default positions: the order their readers are asked in, so which
hook gives a shared part (the cpuset hook's CPU ledger before Koordinator's) does not depend
on an `NN-name` override."""
