"""An in-place resize of a Guaranteed container's exclusive CPUs through the API, with
``[hooks.cpuset] resize_exclusive_cpus = true`` (kubelet's InPlacePodVerticalScalingExclusive
CPUs): it grows onto the free CPU and shrinks back to the CPU it was created with, in place.

No CPU is reserved here (kubelet's ``reservedSystemCPUs`` and crihook's ``reserved_cpus``
are empty), so the 2-CPU node can admit a 2-CPU Guaranteed pod.
"""

from __future__ import annotations

import contextlib

import pytest

from tests.lab import cgroups
from tests.lab.apiserver import ApiError, ApiServer
from tests.lab.crihook_proc import PATIENCE
from tests.lab.kubelet_config import kubeconfig
from tests.lab.kubelet_node import KubeletNode, wait_until
from tests.lab.runtime_lab import RuntimeLab
from tests.node.conftest import NodeBinaries, start_crihook
from tests.node.manifests import pod_manifest

pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

CONFIG = "[hooks.cpuset]\nreserved_cpus = 0\nresize_exclusive_cpus = true\n"


def test_exclusive_cpus_grow_and_shrink_in_place_through_the_api(
    containerd: RuntimeLab, node_binaries: NodeBinaries, api_server: ApiServer
) -> None:
    api = api_server.client()
    proc = start_crihook(containerd, CONFIG)
    node = KubeletNode(
        node_binaries.kubelet,
        containerd.endpoint,
        endpoint=proc.endpoint,
        reserved_cpus="",
        kubeconfig=kubeconfig(api_server.server, api_server.token),
    )
    try:
        with proc, node:
            wait_until(lambda: api.node_ready(node.name), PATIENCE, "the node Ready")
            api.create_pod(pod_manifest("grow", "guaranteed", node_name=node.name))
            app = node.wait_running("grow").containers["app"]
            first = cgroups.cgroup_value(app.cgroup, "cpuset.cpus")
            assert first in ("0", "1")

            def resize_to(cpus: str) -> None:
                size = {"cpu": cpus, "memory": "64Mi"}
                patch = {"resources": {"requests": size, "limits": size}}
                api.resize_pod("grow", {"spec": {"containers": [{"name": "app", **patch}]}})

            def holds(cpus: str) -> bool:
                return cgroups.cgroup_value(app.cgroup, "cpuset.cpus") == cpus

            resize_to("2")
            wait_until(lambda: holds("0-1"), PATIENCE, "the container on both CPUs")
            resize_to("1")
            wait_until(lambda: holds(first), PATIENCE, f"the container back on CPU {first}")
            after = node.view.pod("grow", "default")
            assert after is not None and after.containers["app"].id == app.id  # in place
            api.delete_pod("grow")
            node.view.wait_gone("grow", "default", PATIENCE)
    finally:
        with contextlib.suppress(ApiError, OSError):
            api.delete_node(node.name)
        with contextlib.suppress(ApiError, OSError):
            api.delete_pod("grow")
