"""The koordinator hook in a real crihook in front of the lab's containerd, on this machine:
what it decides is read back where it takes effect, in the containers' cgroup files and the
pod's own (the lab VM has cgroup v1: /sys/fs/cgroup/<controller>/<pod cgroup>/<container
id>/...; the pod's checks read cgroup v2 files where the host has the unified tree).

A BE pod is BestEffort for kubelet: without the hook its containers would run with 2 cpu
shares, no CFS quota and no memory limit. Koordinator moved its requests and limits to
`kubernetes.io/batch-cpu` / `batch-memory` in the extended resource spec annotation; the
hook turns them into the container's cgroup limits, and their sums into the pod cgroup's,
as koordlet does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import parse_cpu_list, read_topology
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, PodStartError

MiB = 1024 * 1024
CGROUP = Path("/sys/fs/cgroup")
BATCH = {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"},
    "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "512Mi"},
}
Start = Callable[[], CrihookProcess]


@pytest.fixture
def start_crihook(containerd: Containerd) -> Iterator[Start]:
    """`crihook serve --hooks koordinator` (it places CPUs itself); every process killed and
    every workdir removed at teardown."""
    procs: list[CrihookProcess] = []

    def start() -> CrihookProcess:
        proc = CrihookProcess(
            containerd.endpoint, workdir=short_tmpdir("kc-"), config="", hooks="koordinator"
        )
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        proc.kill()
    for proc in procs:
        shutil.rmtree(proc.workdir, ignore_errors=True)


def cgroup(controller: str, handle: PodHandle, cid: str, name: str) -> str:
    path = CGROUP / controller / handle.cgroup_parent.lstrip("/") / cid / name
    return path.read_text().strip()


def pod_cgroup(handle: PodHandle) -> dict[str, str]:
    """The pod's own cgroup limits, by their v1 names, read from either cgroup version."""
    parent = handle.cgroup_parent.lstrip("/")
    if (CGROUP / "cgroup.controllers").is_file():  # v2: one tree
        quota, period = (CGROUP / parent / "cpu.max").read_text().split()
        memory = (CGROUP / parent / "memory.max").read_text().strip()
        return {
            "cpu.cfs_quota_us": "-1" if quota == "max" else quota,
            "cpu.cfs_period_us": period,
            "cpu.weight": (CGROUP / parent / "cpu.weight").read_text().strip(),
            "memory.limit_in_bytes": "-1" if memory == "max" else memory,
        }
    cpu = CGROUP / "cpu" / parent
    return {
        "cpu.cfs_quota_us": (cpu / "cpu.cfs_quota_us").read_text().strip(),
        "cpu.cfs_period_us": (cpu / "cpu.cfs_period_us").read_text().strip(),
        "cpu.shares": (cpu / "cpu.shares").read_text().strip(),
        "memory.limit_in_bytes": (CGROUP / "memory" / parent / "memory.limit_in_bytes")
        .read_text()
        .strip(),
    }


def run(kubelet: KubeletClient, spec: PodSpec, cleanup: PodCleanup) -> PodHandle:
    try:
        return cleanup.add(kubelet.run_pod(spec))
    except PodStartError as exc:
        if exc.handle is not None:
            cleanup.add(exc.handle)
        raise


def be_pod(name: str) -> PodSpec:
    """Two containers: `job` has batch resources, `helper` is not in the spec."""
    spec = json.dumps({"containers": {"job": BATCH}})
    return PodSpec(
        name=name,
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={"node.koordinator.sh/extended-resource-spec": spec},
        containers=[ContainerSpec(name="job"), ContainerSpec(name="helper")],
    )


def test_a_be_pod_gets_its_batch_limits_in_its_cgroups(
    containerd: Containerd, pod_cleanup: PodCleanup, start_crihook: Start
) -> None:
    proc = start_crihook()
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        pod = run(kubelet, be_pod("batch"), pod_cleanup)
        assert pod.cgroup_parent.startswith("/kubepods/besteffort/")  # BestEffort for kubelet
        job, helper = pod.container_ids["job"], pod.container_ids["helper"]
        # batch-cpu limit 1500 milli-cores: 150 ms per 100 ms; request 500: 512 shares.
        assert cgroup("cpu", pod, job, "cpu.cfs_quota_us") == "150000"
        assert cgroup("cpu", pod, job, "cpu.cfs_period_us") == "100000"
        assert cgroup("cpu", pod, job, "cpu.shares") == "512"
        assert cgroup("memory", pod, job, "memory.limit_in_bytes") == str(512 * MiB)
        # Not in the spec: kubelet's BestEffort values, unlimited.
        assert cgroup("cpu", pod, helper, "cpu.cfs_quota_us") == "-1"
        assert cgroup("cpu", pod, helper, "cpu.shares") == "2"
        assert int(cgroup("memory", pod, helper, "memory.limit_in_bytes")) > 1 << 50
        # The pod's own cgroup, which kubelet leaves unlimited for a BestEffort pod: the sums
        # over the spec's containers (only `job`), as koordlet writes it.
        shares = (
            {"cpu.weight": "20"}
            if (CGROUP / "cgroup.controllers").is_file()
            else {"cpu.shares": "512"}
        )
        assert pod_cgroup(pod) == {
            "cpu.cfs_quota_us": "150000",
            "cpu.cfs_period_us": "100000",
            "memory.limit_in_bytes": str(512 * MiB),
            **shares,
        }

        # kubelet re-sends the BestEffort resources: the limits stay.
        besteffort = api_pb2.LinuxContainerResources(cpu_shares=2, cpu_period=100_000)
        kubelet.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=job, linux=besteffort), timeout=30
        )
        assert cgroup("cpu", pod, job, "cpu.cfs_quota_us") == "150000"
        assert cgroup("cpu", pod, job, "cpu.shares") == "512"
        assert cgroup("memory", pod, job, "memory.limit_in_bytes") == str(512 * MiB)


def test_a_restarted_crihook_writes_a_be_pods_cgroup_again(
    containerd: Containerd, pod_cleanup: PodCleanup, start_crihook: Start
) -> None:
    """A pod cgroup set back (by hand here; a write that failed, or a pod made while crihook
    was down) gets its batch limits again when crihook starts and learns the pod."""
    proc = start_crihook()
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        pod = run(kubelet, be_pod("batch"), pod_cleanup)
        assert pod_cgroup(pod)["cpu.cfs_quota_us"] == "150000"
    proc.kill()
    parent = pod.cgroup_parent.lstrip("/")
    if (CGROUP / "cgroup.controllers").is_file():
        (CGROUP / parent / "cpu.max").write_text("max 100000")
    else:
        (CGROUP / "cpu" / parent / "cpu.cfs_quota_us").write_text("-1")
    assert pod_cgroup(pod)["cpu.cfs_quota_us"] == "-1"
    start_crihook()  # a new state dir: it learns the pod from containerd; ready once synced
    assert pod_cgroup(pod)["cpu.cfs_quota_us"] == "150000"


def test_an_lsr_pod_runs_on_its_scheduler_cpu_and_ls_pods_move_off_it(
    containerd: Containerd, pod_cleanup: PodCleanup, start_crihook: Start
) -> None:
    online = read_topology("/sys").online
    mine = max(online)
    proc = start_crihook()
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        ls_app = ContainerSpec(name="app", cpu_request=100, memory_request=64 * MiB)
        ls = run(
            kubelet,
            PodSpec("ls", labels={"koordinator.sh/qosClass": "LS"}, containers=[ls_app]),
            pod_cleanup,
        )
        be = run(kubelet, be_pod("be"), pod_cleanup)
        lsr_app = ContainerSpec(
            name="app",
            cpu_request=1000,
            cpu_limit=1000,
            memory_request=64 * MiB,
            memory_limit=64 * MiB,
        )
        lsr = run(
            kubelet,
            PodSpec(
                "lsr",
                labels={"koordinator.sh/qosClass": "LSR"},
                annotations={
                    "scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": str(mine)})
                },
                containers=[lsr_app],
            ),
            pod_cleanup,
        )
        cid = lsr.container_ids["app"]
        assert parse_cpu_list(cgroup("cpuset", lsr, cid, "cpuset.cpus")) == {mine}
        assert cgroup("cpu", lsr, cid, "cpu.cfs_quota_us") == "-1"
        ls_cpus = parse_cpu_list(cgroup("cpuset", ls, ls.container_ids["app"], "cpuset.cpus"))
        be_cpus = parse_cpu_list(cgroup("cpuset", be, be.container_ids["job"], "cpuset.cpus"))
        assert ls_cpus == online - {mine}  # the LS share pool lost it
        assert be_cpus == online  # an LSR pod's CPU stays usable by BE pods
        kubelet.remove_pod(lsr)
        ls_cpus = parse_cpu_list(cgroup("cpuset", ls, ls.container_ids["app"], "cpuset.cpus"))
        assert ls_cpus == online
