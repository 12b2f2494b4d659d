"""Koordinator's CPU signals, as the CPU ledger honours them: pure functions of a pod.

Koordinator's scheduler and webhook put their CPU decisions on the pod, and kubelet passes
the pod's labels and annotations to the runtime, so the cpuset hook (and the koordinator
hook, which places CPUs with the same ledger) can follow them without the API server:

- the label ``koordinator.sh/qosClass`` (``LSE``, ``LSR``, ``LS``, ``BE``, ``SYSTEM``); any
  other value counts as no class, as Koordinator's ``GetPodQoSClassByName`` reads it;
- the annotation ``scheduling.koordinator.sh/resource-status``, koord-scheduler's allocation:
  ``{"cpuset": "2,54"}`` names the pod's CPUs (LSE/LSR pods), ``{"numaNodeResources":
  [{"node": 0, ...}]}`` the NUMA nodes an LS pod's share pool is narrowed to.

Koordinator's CPU orchestration rules (koordlet ``runtimehooks/hooks/cpuset`` and the node
topology reporter that computes the pools) on crihook's ledger:

- a pod with a scheduler ``cpuset`` runs on exactly those CPUs, whatever its class; they
  leave the shared pool ("LS share pool") like exclusive CPUs do, and leave the BE pool too
  when the pod is ``LSE``; other pods' scheduler CPUs (``LSR``) stay usable by BE pods;
- ``LS`` and ``BE`` pods never get exclusive CPUs of their own: koordlet moves them to the
  share pools even when kubelet's static policy pinned them;
- a Kubernetes BestEffort pod (every ``BE`` pod is one) runs on the BE pool: every CPU but
  the exclusive ones and the ``LSE`` pods'; any other pod on the shared pool, unless kubelet's
  static policy (crihook's cpuset hook) gives it exclusive CPUs.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass

from crihook.hooks.node import Topology, parse_cpu_list
from crihook.hooks.spec import PodView, QoSClass

__all__ = [
    "BE_POOL",
    "QOS_LABEL",
    "RESOURCE_STATUS_ANNOTATION",
    "SHARED_POOL",
    "KoordinatorQoS",
    "ScheduledResources",
    "be_may_share",
    "check_on_node",
    "member_pool",
    "parse_resource_status",
    "raw_qos",
    "scheduled_resources",
    "shuns_exclusive_cpus",
]

QOS_LABEL = "koordinator.sh/qosClass"
RESOURCE_STATUS_ANNOTATION = "scheduling.koordinator.sh/resource-status"

SHARED_POOL = "shared"
"""The node's shared pool: Koordinator's LS share pool."""
BE_POOL = "be"
"""The shared pool plus the CPUs of scheduler-placed pods that BE pods may use (LSR)."""


class KoordinatorQoS(enum.Enum):
    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"


_BY_NAME = {q.value: q for q in KoordinatorQoS}


def raw_qos(pod: PodView) -> KoordinatorQoS | None:
    """The class the pod's label names, or None (no label, or a value Koordinator does not
    know, which it reads as no class)."""
    value = pod.labels.get(QOS_LABEL)
    return None if value is None else _BY_NAME.get(value)


@dataclass(frozen=True)
class ScheduledResources:
    """What koord-scheduler allocated a pod (``resource-status``)."""

    cpus: frozenset[int] = frozenset()
    """The pod's own CPUs; empty: none allocated."""
    numa_nodes: frozenset[int] = frozenset()
    """NUMA nodes its share pool is narrowed to; empty: no narrowing."""


_NONE = ScheduledResources()


def parse_resource_status(text: str) -> ScheduledResources:
    """The annotation's value parsed; ValueError saying what is wrong with it (not naming the
    annotation: the caller does)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise ValueError(f"must be a JSON object, not {text!r}")
    cpuset = doc.get("cpuset", "")
    if not isinstance(cpuset, str):
        raise ValueError(f'"cpuset" must be a cpu list string like "2,54", not {cpuset!r}')
    cpus = parse_cpu_list(cpuset)
    numa: set[int] = set()
    entries = doc.get("numaNodeResources")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise ValueError('"numaNodeResources" must be a list of {"node": N, ...}')
    for entry in entries:
        node = entry.get("node") if isinstance(entry, Mapping) else None
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise ValueError(f'"numaNodeResources": {entry!r} has no NUMA node number "node"')
        numa.add(node)
    if not cpus and not numa:
        return _NONE
    return ScheduledResources(cpus, frozenset(numa))


def scheduled_resources(pod: PodView) -> ScheduledResources:
    """The pod's allocation from koord-scheduler (empty when it carries none). ValueError
    naming the annotation when it is malformed. Parsed once per distinct value."""
    text = pod.annotations.get(RESOURCE_STATUS_ANNOTATION)
    if text is None:
        return _NONE
    try:
        return _parsed(text)
    except ValueError as exc:
        raise ValueError(f"annotation {RESOURCE_STATUS_ANNOTATION}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> ScheduledResources:
    # A pod's annotation is read on each of its calls; the value never changes.
    return parse_resource_status(text)


def check_on_node(scheduled: ScheduledResources, topology: Topology) -> None:
    """ValueError naming the annotation when it names CPUs or NUMA nodes this node lacks."""
    missing = scheduled.cpus - topology.online
    if missing:
        raise ValueError(
            f"annotation {RESOURCE_STATUS_ANNOTATION}: cpus {sorted(missing)} are not online "
            "on this node"
        )
    nodes = scheduled.numa_nodes - set(topology.numa_nodes)
    if nodes:
        raise ValueError(
            f"annotation {RESOURCE_STATUS_ANNOTATION}: NUMA nodes {sorted(nodes)} are not on "
            "this node"
        )


def shuns_exclusive_cpus(pod: PodView) -> bool:
    """LS and BE pods run on the share pools, never on exclusive CPUs of their own."""
    return raw_qos(pod) in (KoordinatorQoS.LS, KoordinatorQoS.BE)


def member_pool(pod: PodView) -> str:
    """The pool a container without CPUs of its own runs on: BE for Kubernetes BestEffort
    pods, the shared pool for every other."""
    return BE_POOL if pod.qos_class is QoSClass.BEST_EFFORT else SHARED_POOL


def be_may_share(pod: PodView) -> bool:
    """Whether BE pods may run on this pod's scheduler CPUs (all but LSE pods')."""
    return raw_qos(pod) is not KoordinatorQoS.LSE
