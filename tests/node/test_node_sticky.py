"""Sticky fields: kubelet's own static CPU manager through crihook's cpuset hook, the set-up
``crihook check`` warns about. crihook's cpusets hold against kubelet's reconcile.

The two disagree on purpose. kubelet reserves CPU 0 (``reservedSystemCPUs``), crihook CPU 1
(``reserved_cpus``): kubelet's static policy pins the Guaranteed container to CPU 1 and
keeps its shared pool on CPU 0; crihook pins it to CPU 0 and runs the shared pool on CPU 1.
kubelet's reconcile loop (every second here) sends each running container the cpuset its
policy chose, alone in an UpdateContainerResources, whenever that differs from what it last
sent: a shared container when its pool changes, and every container after a kubelet restart
(what it last sent is kept in memory only). The test waits for those calls in crihook's call
log, then reads the cgroups: still crihook's cpusets.
"""

from __future__ import annotations

import time

import pytest

from tests.lab.crihook_proc import PATIENCE
from tests.lab.kubelet_node import KubeletNode, wait_until
from tests.lab.runtime_lab import RuntimeLab
from tests.node.conftest import (
    JSON_LOG,
    NodeBinaries,
    calls,
    cpuset,
    held_cpus,
    start_crihook,
    wait_cpuset,
)
from tests.node.manifests import pod_manifest

pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

CONFIG = '[hooks.cpuset]\nreserved_cpus = "1"\n'
PINNED, SHARED = "0", "1"  # crihook's; kubelet's static policy would give "1" and "0"
UPDATE = "UpdateContainerResources"


def test_crihooks_cpusets_hold_against_kubelets_static_policy_reconcile(
    containerd: RuntimeLab, node_binaries: NodeBinaries
) -> None:
    proc = start_crihook(containerd, CONFIG, args=JSON_LOG)
    node = KubeletNode(
        node_binaries.kubelet,
        containerd.endpoint,
        endpoint=proc.endpoint,
        cpu_manager_policy="static",
        cpu_manager_reconcile_period="1s",
    )
    with proc, node:
        shared = node.write_static_pod(pod_manifest("sticky-shared", "besteffort"))
        node.wait_running(shared)
        pinned = node.write_static_pod(pod_manifest("sticky-pinned", "guaranteed"))
        node.wait_running(pinned)
        wait_cpuset(node, shared, SHARED)  # crihook's own update, once the pin was taken
        # kubelet's reconcile moved the shared container onto its pool (CPU 0): crihook kept
        # it on its own.
        wait_until(
            lambda: calls(proc, UPDATE, f"default/{shared}"),
            PATIENCE,
            f"kubelet's reconcile updating {shared}",
        )

        restarted = time.time()
        node.restart()
        # Now kubelet re-sends both: the pinned container its CPU 1, the shared one CPU 0.
        for name in (pinned, shared):
            wait_until(
                lambda name=name: calls(proc, UPDATE, f"default/{name}", since=restarted),
                PATIENCE,
                f"kubelet's reconcile updating {name} after its restart",
            )
        for name, cpus in ((pinned, PINNED), (shared, SHARED)):
            pod = node.view.pod(name, "default")
            assert pod is not None, f"{name} is not running"
            assert cpuset(pod) == cpus, f"{name}: kubelet's cpuset, not crihook's"
        assert held_cpus(proc) == [PINNED]
