"""What Koordinator tells the runtime on a pod, read as Koordinator reads it: pure functions.

Koordinator's control plane speaks to a node through the pod's labels and annotations,
which kubelet passes to the runtime on every sandbox config:

- ``koordinator.sh/qosClass`` (label): the pod's QoS class, ``LSE``, ``LSR``, ``LS``, ``BE`` or
  ``SYSTEM``. Without it (or with a value Koordinator does not know) the class follows the
  Kubernetes QoS class, as Koordinator's ``GetPodQoSClassWithDefault``: Guaranteed → LSR,
  Burstable → LS, BestEffort → BE;
- ``scheduling.koordinator.sh/resource-status`` (annotation): the CPUs koord-scheduler gave
  the pod (``crihook.hooks.cpus.koordinator``, shared with the CPU ledger);
- ``node.koordinator.sh/extended-resource-spec`` (annotation): per container, the requests
  and limits of the batch resources a BE pod asked for, which its Kubernetes spec no longer
  carries (the webhook moved them out, so kubelet sees a BestEffort pod)::

      {"containers": {"app": {"requests": {"kubernetes.io/batch-cpu": "500",
                                          "kubernetes.io/batch-memory": "1Gi"},
                              "limits":   {"kubernetes.io/batch-cpu": "1000",
                                          "kubernetes.io/batch-memory": "2Gi"}}}}

  ``batch-cpu`` is in milli-cores (``"1000"`` is one core; a fractional quantity such as
  ``"500m"`` is read as cores, as Koordinator tolerates it), ``batch-memory`` in bytes;
- ``runtimeproxy.koordinator.sh/skip-hookserver: "true"`` (label): koord-runtime-proxy does not
  call the hook server for the pod (koordlet's own pods carry it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType

from crihook.hooks.cpus.koordinator import KoordinatorQoS, raw_qos
from crihook.hooks.koordinator.quantity import ceil_milli, ceil_value, parse_quantity
from crihook.hooks.spec import PodView, QoSClass

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "EXTENDED_RESOURCE_SPEC_ANNOTATION",
    "SKIP_LABEL",
    "BatchSpec",
    "ContainerBatch",
    "batch_spec",
    "is_batch",
    "parse_extended_resource_spec",
    "qos_class",
    "skipped",
]

EXTENDED_RESOURCE_SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"

_BY_KUBE_QOS = {
    QoSClass.GUARANTEED: KoordinatorQoS.LSR,
    QoSClass.BURSTABLE: KoordinatorQoS.LS,
    QoSClass.BEST_EFFORT: KoordinatorQoS.BE,
}


def qos_class(pod: PodView) -> KoordinatorQoS | None:
    """The pod's Koordinator QoS class: its label, else from its Kubernetes QoS class (None
    for a pod whose cgroup parent is not kubelet's)."""
    return raw_qos(pod) or _BY_KUBE_QOS.get(pod.qos_class)


def skipped(pod: PodView) -> bool:
    """koord-runtime-proxy's skip label (value exactly "true", as it compares)."""
    return pod.labels.get(SKIP_LABEL) == "true"


def is_batch(pod: PodView) -> bool:
    """Batch resources apply to pods labelled BE (koordlet reads the label, not a default)."""
    return raw_qos(pod) is KoordinatorQoS.BE


@dataclass(frozen=True)
class ContainerBatch:
    """One container's batch resources; None: not given (koordlet's -1)."""

    cpu_request_milli: int | None = None
    cpu_limit_milli: int | None = None
    memory_limit_bytes: int | None = None
    has_requests: bool = False
    """The entry has a `requests` map at all."""
    has_limits: bool = False
    """The entry has a `limits` map at all (a container without one makes the pod
    unlimited)."""


@dataclass(frozen=True)
class BatchSpec:
    """The annotation's value: each container's batch resources, by container name."""

    containers: Mapping[str, ContainerBatch]


def batch_spec(pod: PodView) -> BatchSpec | None:
    """The pod's extended resource spec, None when it has none. ValueError naming the
    annotation when it is malformed. Parsed once per distinct value."""
    text = pod.annotations.get(EXTENDED_RESOURCE_SPEC_ANNOTATION)
    if text is None:
        return None
    try:
        return _parsed(text)
    except ValueError as exc:
        raise ValueError(f"annotation {EXTENDED_RESOURCE_SPEC_ANNOTATION}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> BatchSpec:
    return parse_extended_resource_spec(text)


def parse_extended_resource_spec(text: str) -> BatchSpec:
    """The annotation's value parsed; ValueError saying what is wrong (the caller names the
    annotation). Resources other than the batch ones are ignored, as koordlet ignores them."""
    try:
        doc = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise ValueError(f"must be a JSON object, not {text!r}")
    containers = doc.get("containers")
    if containers is None:
        containers = {}
    if not isinstance(containers, Mapping):
        raise ValueError('"containers" must be an object of container name → resources')
    out = {}
    for name, entry in containers.items():
        if not isinstance(entry, Mapping):
            raise ValueError(f"container {name!r}: must be an object with requests/limits")
        requests = _resource_list(name, "requests", entry.get("requests"))
        limits = _resource_list(name, "limits", entry.get("limits"))
        out[name] = ContainerBatch(
            cpu_request_milli=_batch_milli_cpu(requests),
            cpu_limit_milli=_batch_milli_cpu(limits),
            memory_limit_bytes=_batch_bytes(limits),
            has_requests=requests is not None,
            has_limits=limits is not None,
        )
    return BatchSpec(MappingProxyType(out))


def _resource_list(container: str, what: str, value: object) -> dict[str, Fraction] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"container {container!r}: {what} must be an object of quantities")
    out = {}
    for name, raw in value.items():
        if isinstance(raw, bool) or not isinstance(raw, str | Decimal):
            raise ValueError(f"container {container!r}: {what} {name}: {raw!r} is no quantity")
        try:
            out[name] = parse_quantity(str(raw))
        except ValueError as exc:
            raise ValueError(f"container {container!r}: {what} {name}: {exc}") from None
    return out


def _batch_milli_cpu(resources: Mapping[str, Fraction] | None) -> int | None:
    """koordlet's `GetBatchMilliCPUFromResourceList`: the value is integer milli-cores; a
    quantity whose value is not whole (`500m`) is read as cores (its milli-value)."""
    if resources is None or BATCH_CPU not in resources:
        return None
    quantity = resources[BATCH_CPU]
    value = ceil_value(quantity)
    milli = ceil_milli(quantity)
    return value if value * 1000 == milli else milli


def _batch_bytes(resources: Mapping[str, Fraction] | None) -> int | None:
    if resources is None or BATCH_MEMORY not in resources:
        return None
    return ceil_value(resources[BATCH_MEMORY])
