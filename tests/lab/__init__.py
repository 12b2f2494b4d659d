"""A test bed with a real containerd: local images, a private containerd, a kubelet-like client.

Public surface (see each module for details):

- :mod:`tests.lab.images`: ``build_images()`` -> ``LabImages`` (pause and busybox OCI archives).
- :mod:`tests.lab.containerd`: ``Containerd`` (start/stop/kill/restart/cleanup), ``LabError``.
- :mod:`tests.lab.kubelet`: ``KubeletClient``, ``PodSpec``, ``ContainerSpec``, ``PodHandle``.
- :mod:`tests.lab.kubelet_encoding`: the pure kubelet encoding rules (QoS, cgroups, resources).
- :mod:`tests.lab.cgroups`: reading limits and removing pod cgroups on the host.
- :mod:`tests.lab.fixtures`: the pytest fixtures (registered by tests/conftest.py).
"""

from tests.lab.containerd import Containerd, LabError
from tests.lab.images import BUSYBOX_REF, PAUSE_REF, ImageArchive, LabImages, build_images
from tests.lab.kubelet import (
    ContainerSpec,
    Device,
    KubeletClient,
    Mount,
    PodHandle,
    PodSpec,
    PodStartError,
    QOSClass,
    node_memory_capacity,
)

__all__ = [
    "BUSYBOX_REF",
    "PAUSE_REF",
    "ContainerSpec",
    "Containerd",
    "Device",
    "ImageArchive",
    "KubeletClient",
    "LabError",
    "LabImages",
    "Mount",
    "PodHandle",
    "PodSpec",
    "PodStartError",
    "QOSClass",
    "build_images",
    "node_memory_capacity",
]
