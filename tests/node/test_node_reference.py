"""crihook's placement against kubelet's own: the same static pods on the same node, run once
by a kubelet with its static CPU manager on the runtime directly (the reference), then by a
kubelet with the CPU manager off through crihook (``--hooks cpuset,numa,oom``). Both reserve
CPU 0 (``reservedSystemCPUs`` / ``[hooks.cpuset] reserved_cpus``).

What must be equal: each container's cpuset, the CFS quota of the containers and of the
Guaranteed pod's cgroup, and each container's OOM score as the runtime applied it (the
runtime clamps kubelet's -997 to its own score here: no CAP_SYS_RESOURCE, and the lab's
``restrict_oom_score_adj``). The two kubelets run one after the other: a kubelet stops the
pods on its runtime that it does not know of.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.lab import cgroups
from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.kubelet_node import KubeletNode, oom_score_adj_of
from tests.lab.runtime_lab import RuntimeLab
from tests.node.conftest import CRIHOOK_CONFIG, NodeBinaries, start_crihook
from tests.node.manifests import pod_manifest

pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


@dataclass(frozen=True)
class Placed:
    cpuset: str
    quota: str  # the container cgroup's cpu.cfs_quota_us
    pod_quota: str  # the pod cgroup's
    oom_score_adj: int


@pytest.fixture
def crihook(containerd: RuntimeLab) -> Iterator[CrihookProcess]:
    proc = start_crihook(containerd)
    try:
        yield proc
    finally:
        proc.kill()


def run_static_pods(node: KubeletNode) -> dict[str, Placed]:
    """Start the node, run one static pod of each QoS class (the Guaranteed one first, so
    the others start on the narrowed shared pool), read what the runtime applied."""
    with node:
        placed = {}
        for qos in QOS_CLASSES:
            pod = node.wait_running(node.write_static_pod(pod_manifest(f"ref-{qos}", qos)))
            app = pod.containers["app"]
            placed[qos] = Placed(
                cpuset=cgroups.cgroup_value(app.cgroup, "cpuset.cpus"),
                quota=cgroups.cgroup_value(app.cgroup, "cpu.cfs_quota_us"),
                pod_quota=cgroups.cgroup_value(pod.cgroup_parent, "cpu.cfs_quota_us"),
                oom_score_adj=oom_score_adj_of(app.pid),
            )
        return placed


def test_crihook_places_as_kubelets_static_policy_does(
    containerd: RuntimeLab, crihook: CrihookProcess, node_binaries: NodeBinaries
) -> None:
    reference = run_static_pods(
        KubeletNode(node_binaries.kubelet, containerd.endpoint, cpu_manager_policy="static")
    )
    through_crihook = run_static_pods(
        KubeletNode(node_binaries.kubelet, containerd.endpoint, endpoint=crihook.endpoint)
    )
    assert through_crihook == reference
    # What the two agree on is the static policy's pick on this 2-CPU node, not "no pick".
    assert reference["guaranteed"].cpuset == "1"
    assert reference["besteffort"].cpuset == "0"
    assert reference["besteffort"].oom_score_adj == 1000


def test_koordinators_cpuset_reaches_the_container_through_a_real_kubelet(
    containerd: RuntimeLab, node_binaries: NodeBinaries
) -> None:
    """koord-scheduler's pick, as an annotation on the pod, comes through kubelet's sandbox
    config to ``--hooks koordinator``: an LSR pod runs on the CPU it names. CPU 0 is one
    kubelet's static policy (and crihook's cpuset hook) would never give it: it is reserved."""
    koordinator = CrihookProcess(
        containerd.endpoint, workdir=short_tmpdir("ko-"), config="", hooks="koordinator"
    )
    with (
        koordinator,
        KubeletNode(
            node_binaries.kubelet, containerd.endpoint, endpoint=koordinator.endpoint
        ) as node,
    ):
        manifest = pod_manifest(
            "koord-lsr",
            "guaranteed",
            labels={"koordinator.sh/qosClass": "LSR"},
            annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0"})},
        )
        app = node.wait_running(node.write_static_pod(manifest)).containers["app"]
        assert cgroups.cgroup_value(app.cgroup, "cpuset.cpus") == "0"


def test_a_pod_with_pod_level_resources_gets_crihooks_pod_scope_placement(
    containerd: RuntimeLab, node_binaries: NodeBinaries
) -> None:
    """kubelet's PodLevelResources (beta, on by default): a Guaranteed pod whose budget is
    set for the pod (1 CPU), not per container. With ``topology_scope = "pod"`` crihook
    gives the pod a bubble of one CPU at RunPodSandbox, and its container, which asks for half
    a CPU, runs on that bubble, not on the shared pool as it would on its own."""
    config = CRIHOOK_CONFIG + '[node]\ntopology_scope = "pod"\n'
    proc = start_crihook(containerd, config)
    with (
        proc,
        KubeletNode(node_binaries.kubelet, containerd.endpoint, endpoint=proc.endpoint) as node,
    ):
        manifest = pod_manifest("pod-level", "besteffort")
        budget = {"cpu": "1", "memory": "64Mi"}
        manifest["spec"]["resources"] = {"requests": budget, "limits": budget}
        # Half a CPU of the budget: on its own (container scope) it would share the pool.
        half = {"cpu": "500m", "memory": "32Mi"}
        manifest["spec"]["containers"][0]["resources"] = {"requests": half, "limits": half}
        app = node.wait_running(node.write_static_pod(manifest)).containers["app"]
        assert cgroups.cgroup_value(app.cgroup, "cpuset.cpus") == "1"
