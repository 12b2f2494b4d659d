"""Koordinator compatibility: the built-in hook `koordinator` (``KoordinatorHook``) gives
Koordinator's pods what koordlet's runtime hooks give them, from their labels and
annotations: CPUs on Koordinator's pools (with the CPU ledger, ``crihook.hooks.cpus``), the
scheduler's CPUs, and BE pods' batch resources.

``protocol`` reads the signals, ``quantity`` Kubernetes quantities, ``batch`` computes the
cgroup values, ``options`` the configuration, ``hook`` is the hook.
"""

from crihook.hooks.koordinator.batch import BatchResources, container_resources, pod_resources
from crihook.hooks.koordinator.hook import KoordinatorHook
from crihook.hooks.koordinator.protocol import (
    EXTENDED_RESOURCE_SPEC_ANNOTATION,
    SKIP_LABEL,
    parse_extended_resource_spec,
    qos_class,
)

__all__ = [
    "EXTENDED_RESOURCE_SPEC_ANNOTATION",
    "SKIP_LABEL",
    "BatchResources",
    "KoordinatorHook",
    "container_resources",
    "parse_extended_resource_spec",
    "pod_resources",
    "qos_class",
]
