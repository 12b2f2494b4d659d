"""A real kubelet through crihook (``--hooks cpuset,numa,oom`` and ``devices``, CPU 0
reserved): its pods run,
static and through the API server; crihook places them; its scores stay; and kubelet,
crihook and the runtime each restart under it without losing a pod or a pin.

One kubelet for the module (registered with the session's API server, static pods too),
kubelet's own CPU manager off (``none``): the set-up crihook is for. The node has 2 CPUs
with CPU 0 reserved, so a Guaranteed 1-CPU container holds CPU 1 and the shared pool is CPU
0 while it runs, both CPUs when it does not.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import cgroups
from tests.lab.apiserver import ApiClient
from tests.lab.crictl import Crictl
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir
from tests.lab.kubelet_node import (
    COVERED_SYSCTLS,
    KubeletNode,
    NodePod,
    oom_score_adj_of,
    wait_until,
)
from tests.lab.runtime_lab import RuntimeLab
from tests.node.conftest import (
    CRIHOOK_CONFIG,
    HOOKS,
    cpuset,
    held_cpus,
    placed_memory,
    resize,
    sized,
    start_crihook,
    wait_cpuset,
    wait_resize_refused,
)
from tests.node.manifests import pod_manifest

pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

ALL_CPUS = "0-1"
SHARED_WITH_GUARANTEED = "0"
EXCLUSIVE = "1"
QOS_ORDER = ("guaranteed", "burstable", "besteffort")


@pytest.fixture(scope="module")
def host_devices() -> Path:
    """Device nodes for the devices hook: ``ok-null`` (c 1:3) on its allowlist, ``secret``
    (c 1:3 too) not."""
    dev = short_tmpdir("kd-")
    for name in ("ok-null", "secret"):
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return dev


@pytest.fixture(scope="module")
def crihook(containerd: RuntimeLab, host_devices: Path) -> Iterator[CrihookProcess]:
    devices = f'[hooks.devices]\nnamespaces = ["default"]\ndevices = ["{host_devices}/ok-*"]\n'
    proc = start_crihook(containerd, CRIHOOK_CONFIG + devices, f"{HOOKS},devices")
    try:
        yield proc
    finally:
        proc.kill()


def oom_score(pod: NodePod) -> int:
    return oom_score_adj_of(pod.containers["app"].pid)


def run_api_pod(node: KubeletNode, api: ApiClient, name: str, qos: str) -> NodePod:
    api.create_pod(pod_manifest(name, qos, node_name=node.name))
    pod = node.wait_running(name)
    wait_until(
        lambda: api.pod(name)["status"].get("phase") == "Running", PATIENCE, f"{name} Running"
    )
    return pod


# --- the host -------------------------------------------------------------------------------

# Read at collection, before any kubelet of the session started.
HOST_SYSCTLS = {e: (Path("/proc/sys") / e).read_text() for e in COVERED_SYSCTLS}
HOST_LOG_LINKS = Path("/var/log/containers").exists()  # where kubelet links container logs


# --- pods run -------------------------------------------------------------------------------


def test_static_pods_of_each_qos_class_run_through_crihook(node: KubeletNode) -> None:
    names = {}
    try:
        for qos in ("guaranteed", "burstable", "besteffort"):
            names[qos] = node.write_static_pod(pod_manifest(f"static-{qos}", qos))
        pods = {qos: node.wait_running(name) for qos, name in names.items()}
        assert cpuset(pods["guaranteed"]) == EXCLUSIVE
        # kubelet starts the three in any order: one started before the Guaranteed one
        # narrows to the shared pool when crihook updates it, just after.
        wait_cpuset(node, names["besteffort"], SHARED_WITH_GUARANTEED)
        wait_cpuset(node, names["burstable"], SHARED_WITH_GUARANTEED)
        assert oom_score(pods["besteffort"]) == 1000
    finally:
        for qos in names:
            node.remove_static_pod(f"static-{qos}")
        for name in names.values():
            node.view.wait_gone(name, "default", PATIENCE)


def test_api_pods_of_each_qos_class_run_through_crihook(node: KubeletNode, api: ApiClient) -> None:
    pods = {qos: run_api_pod(node, api, f"api-{qos}", qos) for qos in QOS_ORDER}
    assert cpuset(pods["guaranteed"]) == EXCLUSIVE
    assert cpuset(pods["besteffort"]) == SHARED_WITH_GUARANTEED
    # The container cgroup runs without a CFS quota, as kubelet's static policy leaves an
    # exclusive container; the Burstable one keeps its limit (500m of a 100 ms period).
    assert (
        cgroups.cgroup_value(pods["guaranteed"].containers["app"].cgroup, "cpu.cfs_quota_us")
        == "-1"
    )
    assert (
        cgroups.cgroup_value(pods["burstable"].containers["app"].cgroup, "cpu.cfs_quota_us")
        == "50000"
    )


# --- the shared pool --------------------------------------------------------------------------


def test_shared_pool_narrows_when_a_guaranteed_pod_comes_and_widens_when_it_goes(
    node: KubeletNode, api: ApiClient
) -> None:
    shared = run_api_pod(node, api, "pool-besteffort", "besteffort")
    assert cpuset(shared) == ALL_CPUS
    guaranteed = run_api_pod(node, api, "pool-guaranteed", "guaranteed")
    assert cpuset(guaranteed) == EXCLUSIVE
    wait_cpuset(node, "pool-besteffort", SHARED_WITH_GUARANTEED)
    api.delete_pod("pool-guaranteed")
    node.view.wait_gone("pool-guaranteed", "default", PATIENCE)
    wait_cpuset(node, "pool-besteffort", ALL_CPUS)


# --- OOM scores -----------------------------------------------------------------------------


def test_oom_scores_stay_through_crictl_updates(
    node: KubeletNode, api: ApiClient, crihook: CrihookProcess
) -> None:
    pods = {qos: run_api_pod(node, api, f"oom-{qos}", qos) for qos in QOS_ORDER}
    before = {qos: oom_score(p) for qos, p in pods.items()}
    assert before["besteffort"] == 1000
    assert 2 <= before["burstable"] <= 999
    crictl = Crictl(crihook.endpoint, short_tmpdir("kc-"))
    # An update with only the shares: every other number reads 0 ("unset") on the wire.
    for qos in ("burstable", "besteffort"):
        crictl.ok("update", "--cpu-share", "4", pods[qos].containers["app"].id)
    # The Guaranteed container holds CPU 1: crihook refuses to shrink it (to 4m), as
    # kubelet's static policy refuses such a resize, and changes nothing.
    refused = crictl.run("update", "--cpu-share", "4", pods["guaranteed"].containers["app"].id)
    assert refused.code != 0 and "holds 1 exclusive CPUs" in refused.stderr
    assert {qos: oom_score(p) for qos, p in pods.items()} == before
    assert cpuset(pods["guaranteed"]) == EXCLUSIVE


# --- restarts -------------------------------------------------------------------------------


def _placement(node: KubeletNode, names: list[str]) -> dict[str, tuple[str, str, str, int]]:
    """Per pod: sandbox id, container id, cpuset, OOM score."""
    out = {}
    for name in names:
        pod = node.view.pod(name, "default")
        assert pod is not None, f"{name} is not running"
        out[name] = (pod.sandbox_id, pod.containers["app"].id, cpuset(pod), oom_score(pod))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_crihook_restarts_under_a_running_kubelet(
    node: KubeletNode, api: ApiClient, crihook: CrihookProcess, sig: signal.Signals
) -> None:
    names = ["rs-guaranteed", "rs-besteffort"]
    run_api_pod(node, api, names[0], "guaranteed")
    run_api_pod(node, api, names[1], "besteffort")
    before = _placement(node, names)
    assert held_cpus(crihook) == [EXCLUSIVE]
    crihook.signal(sig)
    assert crihook.proc is not None
    crihook.proc.wait(PATIENCE)
    crihook.start()
    # kubelet finds the runtime again by itself: a new pod runs, the old ones kept their ids.
    run_api_pod(node, api, "rs-after", "besteffort")
    assert _placement(node, names) == before
    assert held_cpus(crihook) == [EXCLUSIVE]


def test_kubelet_restart_leaves_pins_and_scores(
    node: KubeletNode, api: ApiClient, crihook: CrihookProcess
) -> None:
    names = ["kr-guaranteed", "kr-burstable", "kr-besteffort"]
    for name, qos in zip(names, QOS_ORDER, strict=True):
        run_api_pod(node, api, name, qos)
    before = _placement(node, names)
    node.restart()
    run_api_pod(node, api, "kr-after", "besteffort")
    assert _placement(node, names) == before
    assert held_cpus(crihook) == [EXCLUSIVE]


def test_runtime_restart_brings_the_pods_back(
    node: KubeletNode, api: ApiClient, containerd: RuntimeLab
) -> None:
    names = ["rr-guaranteed", "rr-besteffort"]
    run_api_pod(node, api, names[0], "guaranteed")
    run_api_pod(node, api, names[1], "besteffort")
    before = _placement(node, names)
    containerd.restart()
    for name in names:
        node.wait_running(name)
    after = _placement(node, names)
    assert {n: p[0] for n, p in after.items()} == {n: p[0] for n, p in before.items()}
    assert after[names[0]][2] == EXCLUSIVE
    assert after[names[1]][2] == SHARED_WITH_GUARANTEED


# --- in-place resize through the API --------------------------------------------------------

MiB = 1024 * 1024


def test_a_burstable_resize_through_the_api_is_applied_in_place(
    node: KubeletNode, api: ApiClient
) -> None:
    pod = run_api_pod(node, api, "rz-burstable", "burstable")
    app = pod.containers["app"]
    resize(
        api,
        "rz-burstable",
        {"requests": {"cpu": "0", "memory": "32Mi"}, "limits": {"cpu": "800m", "memory": "96Mi"}},
    )

    def applied() -> bool:
        limits = cgroups.read_limits(app.cgroup)
        return limits.cpu_quota == 80000 and limits.memory_limit == 96 * MiB

    wait_until(applied, PATIENCE, "the resize in rz-burstable's cgroup")
    after = node.view.pod("rz-burstable", "default")
    assert after is not None and after.containers["app"].id == app.id  # in place
    assert oom_score_adj_of(app.pid) == oom_score(pod)


@pytest.mark.parametrize(
    ("size", "refusal"),
    [
        # The cpuset hook (resize_exclusive_cpus off): 1 CPU to half of one, refused at the
        # pod's UpdatePodSandboxResources, before kubelet writes the pod's cgroup. (Growing
        # to 2 CPUs is kubelet's own refusal here: CPU 0 is reserved, 1 CPU allocatable.)
        pytest.param(
            sized("500m", "64Mi"),
            "to 500m CPU is infeasible: its containers hold 1 exclusive CPUs",
            id="cpu",
        ),
        # The numa hook (resize_exclusive_memory off).
        pytest.param(
            sized("1", "96Mi"),
            "[hooks.numa] resize_exclusive_memory = true resizes within its NUMA nodes",
            id="memory",
        ),
    ],
)
def test_a_guaranteed_resize_is_refused_with_crihooks_message_and_leaves_nothing_half_done(
    node: KubeletNode,
    api: ApiClient,
    crihook: CrihookProcess,
    size: dict[str, dict[str, str]],
    refusal: str,
) -> None:
    """kubelet (CPU and memory managers off) resizes in place; crihook refuses as kubelet's
    static policies would with their gates off, and kubelet shows the refusal in the pod's
    resize condition. The refused call changed nothing crihook controls: the container's
    cgroup (cpuset, quota, shares, memory limit), the pod cgroup's CFS quota (crihook lifted
    it), the CPU it holds, the memory placed."""
    pod = run_api_pod(node, api, "rz-guaranteed", "guaranteed")
    app = pod.containers["app"]
    limits = cgroups.read_limits(app.cgroup)
    pod_quota = cgroups.cgroup_value(pod.cgroup_parent, "cpu.cfs_quota_us")  # crihook lifted it
    placed = placed_memory(crihook, pod.sandbox_id)
    assert placed == [64 * MiB]
    resize(api, "rz-guaranteed", size)
    wait_resize_refused(api, "rz-guaranteed", refusal)
    assert cgroups.read_limits(app.cgroup) == limits
    assert cgroups.cgroup_value(pod.cgroup_parent, "cpu.cfs_quota_us") == pod_quota
    assert cpuset(pod) == EXCLUSIVE
    assert held_cpus(crihook) == [EXCLUSIVE]
    assert placed_memory(crihook, pod.sandbox_id) == placed
    assert not crihook.hook_state("numa").get("resizing")
    after = node.view.pod("rz-guaranteed", "default")
    assert after is not None and after.containers["app"].id == app.id


# --- devices through the API ----------------------------------------------------------------


def _device_annotation(path: Path) -> dict[str, str]:
    ask = [{"path": str(path), "container_path": "/dev/crihook-null"}]
    return {"devices.crihook.io/container.app": json.dumps(ask)}


def _waiting(api: ApiClient, name: str) -> dict[str, Any] | None:
    for status in api.pod(name)["status"].get("containerStatuses", []):
        waiting: dict[str, Any] | None = status.get("state", {}).get("waiting")
        if waiting and waiting.get("message"):
            return waiting
    return None


def test_an_allowlisted_device_reaches_the_container_and_a_refused_one_shows_in_its_status(
    node: KubeletNode, api: ApiClient, containerd: RuntimeLab, host_devices: Path
) -> None:
    manifest = pod_manifest(
        "dev-ok",
        "besteffort",
        node_name=node.name,
        annotations=_device_annotation(host_devices / "ok-null"),
    )
    api.create_pod(manifest)
    app = node.wait_running("dev-ok").containers["app"]
    crictl = Crictl(containerd.endpoint, short_tmpdir("kc-"))
    inside = crictl.ok("exec", app.id, "stat", "-c", "%F %t:%T", "/dev/crihook-null").stdout
    assert inside.strip() == "character special file 1:3"

    refused = pod_manifest(
        "dev-refused",
        "besteffort",
        node_name=node.name,
        annotations=_device_annotation(host_devices / "secret"),
    )
    api.create_pod(refused)
    waiting = wait_until(lambda: _waiting(api, "dev-refused"), PATIENCE, "dev-refused waiting")
    assert waiting["reason"] == "CreateContainerError"
    assert "devices.crihook.io/container.app [0]" in waiting["message"]
    assert f"{host_devices}/secret is not allowed" in waiting["message"]


# Last: by now kubelet has run pods (and linked their logs in its /var/log).
def test_kubelet_changes_nothing_on_the_host(node: KubeletNode) -> None:
    assert {e: (Path("/proc/sys") / e).read_text() for e in COVERED_SYSCTLS} == HOST_SYSCTLS
    assert Path("/var/log/containers").exists() == HOST_LOG_LINKS
    # ...though it set what it sets, in its own mount namespace:
    assert (node.dir / "sysctl/vm.overcommit_memory").read_text().strip() == "1"
    assert (node.dir / "var-log/containers").is_dir()
