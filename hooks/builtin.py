"""The hooks shipped with crihook, by name, with their default place in the chain.

`--hooks cpuset,numa,oom,devices,netdev,koordinator` (or `[hooks] order = ["cpuset", ...]`)
takes each built-in name at its default position; `NN-name` overrides the position. Each hook
lives in `hooks/<name>/` (installed as `crihook.hooks.<name>`) and is imported only when
configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["BUILTIN_HOOKS", "BuiltinHook"]


@dataclass(frozen=True)
class BuiltinHook:
    name: str
    target: str
    """`package.module:Class`, imported when the hook is configured."""
    position: int
    """The NN of `NN-name` when the name is given alone."""
    summary: str


BUILTIN_HOOKS: Mapping[str, BuiltinHook] = MappingProxyType(
    {
        h.name: h
        for h in (
            BuiltinHook(
                "cpuset",
                "crihook.hooks.cpuset:CpusetHook",
                20,
                "exclusive CPUs as kubelet's static CPU manager picks them; a shared pool",
            ),
            BuiltinHook(
                "koordinator",
                "crihook.hooks.koordinator:KoordinatorHook",
                25,
                "Koordinator's QoS pools, scheduler-assigned CPUs and BE batch resources",
            ),
            BuiltinHook(
                "numa",
                "crihook.hooks.numa:NumaHook",
                30,
                "cpuset.mems and per-NUMA memory accounting under the topology policy",
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
