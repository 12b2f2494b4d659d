"""Pod manifests for the node tests: one busybox container ``app``, host network (no CNI),
the lab's imported image, never pulled.

Sizes fit a 2-core node with CPU 0 reserved (allocatable: 1 CPU): the Guaranteed pod asks
for that one CPU; the Burstable one has a CPU limit but requests none, so both are admitted.
"""

from __future__ import annotations

from typing import Any

from tests.lab.images import BUSYBOX_REF

__all__ = ["QOS_RESOURCES", "pod_manifest"]

QOS_RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "besteffort": {},
    "burstable": {
        "requests": {"cpu": "0", "memory": "32Mi"},
        "limits": {"cpu": "500m", "memory": "64Mi"},
    },
    "guaranteed": {
        "requests": {"cpu": "1", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "64Mi"},
    },
}


def pod_manifest(
    name: str,
    qos: str,
    *,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    resize_policy: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "app",
        "image": BUSYBOX_REF,
        "imagePullPolicy": "Never",
        "command": ["sleep", "1000000"],
        "resources": QOS_RESOURCES[qos],
    }
    if resize_policy is not None:
        container["resizePolicy"] = resize_policy
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
