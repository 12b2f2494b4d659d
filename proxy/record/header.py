"""The lines of a recording that carry more than one call: the `header` (crihook, its
configuration, the node facts and the plugins), `plugins`, `sync` and the `snapshot` a rotated
file starts from. Built by crihook itself (app) from its settings, chain and store; the
renderer process only encodes them, so it loads `record.lines` and not this module (nor the
chain, the store and the config documents it needs). The format is drawn in `record.lines`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crihook import __version__
from crihook.hooks.node import Topology
from crihook.hooks.spec import ContainerView, PodView
from crihook.proxy.chain.breaker import BreakerRecord
from crihook.proxy.chain.chain import Chain
from crihook.proxy.config import HookSettings, Settings
from crihook.proxy.config_doc import plugin_docs, settings_doc
from crihook.proxy.cri.outcome import Observation, SentUpdate
from crihook.proxy.record.lines import FORMAT, observation_docs, update_docs
from crihook.proxy.record.redact import Redactor
from crihook.proxy.state.store import Store

__all__ = ["header_line", "plugins_line", "snapshot_line", "sync_line", "view_docs"]


def header_line(
    settings: Settings,
    topology: Topology,
    device_pools: Sequence[Mapping[str, Any]],
    files: Iterable[Observation],
    time: float,
    redacted: bool,
    plugins: Sequence[HookSettings] = (),
) -> dict[str, Any]:
    """The line every recorded file (and every crihook process's part of it) starts with."""
    return {
        "kind": "header",
        "format": FORMAT,
        "crihook": __version__,
        "time": round(time, 6),
        "redacted": redacted,
        "config": settings_doc(settings),
        "node": {
            "topology": topology.to_dict(),
            "device_pools": [dict(p) for p in device_pools],
            "files": observation_docs(files),
        },
        "plugins": plugin_docs(plugins),
    }


def plugins_line(seq: int, time: float, plugins: Sequence[HookSettings]) -> dict[str, Any]:
    """The plugins in the chain from `seq` on (the drop-in directory changed them)."""
    return {"kind": "plugins", "seq": seq, "time": round(time, 6), "plugins": plugin_docs(plugins)}


def sync_line(
    kind: str,
    seq: int,
    time: float,
    reason: str,
    pods: Sequence[PodView],
    containers: Sequence[ContainerView],
    states: Mapping[str, Any],
    hook_states: Mapping[str, Any],
    updates: Sequence[SentUpdate],
    observed: Iterable[Observation],
    redactor: Redactor,
    breakers: Mapping[str, BreakerRecord] | None = None,
) -> dict[str, Any]:
    """A synchronize of every hook (`sync`), or the state a rotated file starts from
    (`snapshot`): what the hooks were given, and the repairs sent; a snapshot also has the
    breakers that had counted failures (a replay of the file takes them up)."""
    doc = {
        "kind": kind,
        "seq": seq,
        "time": round(time, 6),
        "reason": reason,
        "pods": view_docs(pods, redactor),
        "containers": view_docs(containers, redactor),
        "container_states": {k: getattr(v, "value", v) for k, v in states.items()},
        "hook_states": dict(hook_states),
        "updates": update_docs(updates),
        "observed": observation_docs(observed),
    }
    if breakers is not None:
        doc["breakers"] = {name: record._asdict() for name, record in breakers.items()}
    return doc


def snapshot_line(
    seq: int, time: float, store: Store, chain: Chain, redactor: Redactor
) -> dict[str, Any]:
    """What a rotated file starts from (taken while no call is in flight): the pods,
    containers and hook states now, and the breakers that had counted failures."""
    pods, containers = store.snapshot()
    hook_states = json.loads(json.dumps(store.hook_states()))  # a copy, frozen as it is now
    return sync_line(
        "snapshot", seq, time, "rotate", pods, containers, store.container_states(),
        hook_states, [], [], redactor, chain.breakers(time),
    )  # fmt: skip


def view_docs(
    views: Sequence[PodView] | Sequence[ContainerView], redactor: Redactor
) -> list[dict[str, Any]]:
    out = []
    for view in views:
        doc = view.to_dict()
        doc["annotations"] = redactor.annotations(view.annotations)
        out.append(doc)
    return out
