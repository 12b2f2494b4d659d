"""What a real kubelet's (and crictl's) later calls leave as they were, through crihook in front
of the lab's containerd, checked against the same pods run on containerd directly.

Found by a trial run of kubelet v1.37.2 through crihook (issue 26):

- kubelet's static CPU manager sends UpdateContainerResources with only a cpuset, and
  `crictl update --cpu-share 4` only the shares: every other number reads 0, "unset" to
  containerd. The oom hook read the 0 as a score and wrote it to the processes (a BestEffort
  container went from 1000 to 0); the store took the 0s as the container's resources.
- containerd with restrict_oom_score_adj (the lab's, as this VM lacks CAP_SYS_RESOURCE)
  raises a Guaranteed container's -997 to its own score. The oom hook recorded -997, and a
  restarted crihook found the container "with other resources than recorded".
- `crihook state` kept pods removed behind crihook's back (`pods: 11  containers: 0`), and
  the hooks what they held for them; and it showed every container as `kind=unknown`
  (kubelet's CreateContainer says nothing of init containers).
- The numa hook refused every memory resize of a Guaranteed pod, where kubelet with its
  memory manager None (the default) resizes in place. By default it still refuses, as
  kubelet's Static policy does; `resize_exclusive_memory` resizes within the NUMA nodes the
  container holds (this VM has one) and refuses past them.

The reference is containerd itself: the same pods, started by the same kubelet-like client on
containerd's own socket, get the same scores, and the same updates change nothing there.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.numa.saved import read_saved
from tests.lab.containerd import Containerd
from tests.lab.crictl import Crictl
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec
from tests.lab.kubelet_encoding import burstable_pod, cpu_manager_update, resize_update

pytestmark = pytest.mark.both_containerds

MiB = 1024 * 1024
HOOKS = "cpuset,numa,oom"
CONFIG = '[hooks.cpuset]\nreserved_cpus = "0"\n'  # kubelet's static policy needs one reserved

Start = Callable[[str], CrihookProcess]


@pytest.fixture
def start_crihook(containerd: Containerd) -> Iterator[Start]:
    """`crihook serve --hooks cpuset,numa,oom` with the config given; killed and its workdir
    removed at teardown."""
    procs: list[CrihookProcess] = []

    def start(config: str) -> CrihookProcess:
        proc = CrihookProcess(
            containerd.endpoint, workdir=short_tmpdir("ku-"), config=config, hooks=HOOKS
        )
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        proc.kill()
    for proc in procs:
        shutil.rmtree(proc.workdir, ignore_errors=True)


# The three QoS classes kubelet encodes, one container `app` each.
PODS = {
    "besteffort": ContainerSpec(name="app"),
    "burstable": burstable_pod("burstable").containers[0],  # 250m/500m, 32/64 MiB
    "guaranteed": ContainerSpec(
        name="app", cpu_request=1000, cpu_limit=1000, memory_request=64 * MiB, memory_limit=64 * MiB
    ),
}


@dataclasses.dataclass
class Running:
    handle: PodHandle
    cid: str
    pid: int

    @property
    def spec(self) -> PodSpec:
        return self.handle.spec


def run(kubelet: KubeletClient, qos: str, suffix: str, cleanup: PodCleanup) -> Running:
    spec = PodSpec(name=f"{qos}-{suffix}", containers=[dataclasses.replace(PODS[qos])])
    handle = cleanup.add(kubelet.run_pod(spec))
    cid = handle.container_ids["app"]
    return Running(handle, cid, kubelet.container_pid(cid))


def score(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def cpuset(pod: Running) -> str:
    path = Path("/sys/fs/cgroup/cpuset") / pod.handle.cgroup_parent.lstrip("/") / pod.cid
    return (path / "cpuset.cpus").read_text().strip()


def sent_score(pod: Running) -> int:
    return pod.handle.container_configs["app"].linux.resources.oom_score_adj


def update(kubelet: KubeletClient, cid: str, linux: api_pb2.LinuxContainerResources) -> None:
    kubelet.runtime.UpdateContainerResources(
        api_pb2.UpdateContainerResourcesRequest(container_id=cid, linux=linux), timeout=30
    )


def cpu_resize(kubelet: KubeletClient, pod: Running) -> None:
    """kubelet's in-place resize of a Burstable container's CPU (250m/500m → 300m/600m):
    its whole resources again, the memory request, so the score, unchanged."""
    app = dataclasses.replace(pod.spec.containers[0], cpu_request=300, cpu_limit=600)
    spec = dataclasses.replace(pod.spec, containers=[app])
    update(kubelet, pod.cid, resize_update(spec, app, node_memory=kubelet.node_memory))


def oom_state_when(
    proc: CrihookProcess, predicate: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    wait_for(lambda: predicate(proc.hook_state("oom")), PATIENCE, f"oom's state: {what}")
    return proc.hook_state("oom")


def later_calls(kubelet: KubeletClient, crictl: Crictl, pods: dict[str, Running]) -> None:
    """What comes after the pods started: kubelet's static CPU manager (a cpuset only, the
    container's own), crictl update, a resize of the Burstable container's CPU."""
    for pod in pods.values():
        update(kubelet, pod.cid, cpu_manager_update(cpuset(pod)))
    for qos in ("besteffort", "burstable"):  # the Guaranteed one holds its CPU: not resized
        crictl.ok("update", "--cpu-share", "4", pods[qos].cid)
    cpu_resize(kubelet, pods["burstable"])


def test_oom_scores_are_containerds_and_no_later_update_changes_them(
    containerd: Containerd,
    pod_cleanup: PodCleanup,
    kubelet_direct: KubeletClient,
    start_crihook: Start,
) -> None:
    # The reference: containerd alone (its pods gone before crihook starts).
    workdir = short_tmpdir("ku-")
    direct = {qos: run(kubelet_direct, qos, "direct", pod_cleanup) for qos in PODS}
    applied = {qos: score(pod.pid) for qos, pod in direct.items()}
    later_calls(kubelet_direct, Crictl(containerd.endpoint, workdir), direct)
    assert {qos: score(pod.pid) for qos, pod in direct.items()} == applied
    for pod in direct.values():
        kubelet_direct.remove_pod(pod.handle)

    proc = start_crihook(CONFIG)
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        through = {qos: run(kubelet, qos, "crihook", pod_cleanup) for qos in PODS}
        assert {qos: sent_score(pod) for qos, pod in through.items()} == {
            qos: sent_score(pod) for qos, pod in direct.items()
        }
        assert {qos: score(pod.pid) for qos, pod in through.items()} == applied
        later_calls(kubelet, Crictl(proc.endpoint, workdir), through)
        assert {qos: score(pod.pid) for qos, pod in through.items()} == applied
        for qos, pod in through.items():  # a process started in the container inherits it
            out = kubelet.exec_sync(pod.cid, ["cat", "/proc/self/oom_score_adj"])
            assert int(out.stdout.decode()) == applied[qos]

        # The state records what kubelet asked for and what containerd applied.
        want = {
            f"c:{pod.cid}": {
                "pod": pod.handle.sandbox_id,
                "asked": sent_score(pod),
                "score": applied[qos],
                "sticky": False,
            }
            for qos, pod in through.items()
        }
        oom_state_when(proc, lambda s: want.items() <= s.items(), "the scores")

    # A restart finds every container as recorded: the Guaranteed one's raised score, and
    # the resources of every one the partial updates left. (SIGTERM: a SIGKILL may take the
    # last 0.2 s of record changes along, which the restart then learns from containerd.)
    assert proc.stop() == 0
    proc.start()
    counts = re.findall(r"(\d+) container\(s\) run with other resources than recorded", proc.log())
    assert counts[1:] == ["0"], proc.log()
    assert proc.hook_state("oom") == want


# --- an in-place memory resize of a Guaranteed container (the numa hook) ------------------------

RESIZE_MEMORY = CONFIG + "[hooks.numa]\nresize_exclusive_memory = true\n"


def memory_limit(pod: Running) -> int:
    path = Path("/sys/fs/cgroup/memory") / pod.handle.cgroup_parent.lstrip("/") / pod.cid
    return int((path / "memory.limit_in_bytes").read_text())


def memory_resize(kubelet: KubeletClient, pod: Running, memory: int) -> None:
    """kubelet's in-place resize of the Guaranteed container's memory (request = limit)."""
    app = dataclasses.replace(pod.spec.containers[0], memory_request=memory, memory_limit=memory)
    spec = dataclasses.replace(pod.spec, containers=[app])
    update(kubelet, pod.cid, resize_update(spec, app, node_memory=kubelet.node_memory))


def placed(proc: CrihookProcess, pod: Running) -> list[dict[str, Any]]:
    """The numa hook's blocks for the pod's container, as written so far."""
    saved = read_saved(proc.hook_state("numa").items())
    entries = (saved.memory or {}).get("entries", {})
    return entries.get(pod.handle.sandbox_id, {}).get("app", [])  # type: ignore[no-any-return]


def numa_state_when(proc: CrihookProcess, pod: Running, size: int) -> None:
    wait_for(
        lambda: (
            [b["size"] for b in placed(proc, pod)] == [size]
            and not proc.hook_state("numa").get("resizing")
        ),
        PATIENCE,
        f"numa's state: {size} bytes placed, no resize pending",
    )


def test_a_guaranteed_memory_resize_is_refused_by_default_as_kubelets_static_policy_does(
    containerd: Containerd,
    pod_cleanup: PodCleanup,
    kubelet_direct: KubeletClient,
    start_crihook: Start,
) -> None:
    # kubelet with its memory manager None (the default) resizes in place on containerd.
    direct = run(kubelet_direct, "guaranteed", "direct", pod_cleanup)
    memory_resize(kubelet_direct, direct, 128 * MiB)
    assert memory_limit(direct) == 128 * MiB
    kubelet_direct.remove_pod(direct.handle)

    proc = start_crihook(CONFIG)
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        pod = run(kubelet, "guaranteed", "crihook", pod_cleanup)
        numa_state_when(proc, pod, 64 * MiB)
        before = proc.hook_state("numa")
        with pytest.raises(grpc.RpcError) as refused:
            memory_resize(kubelet, pod, 128 * MiB)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details() or ""
        assert "resize of container 'app' to 134217728 bytes of memory is infeasible" in details
        assert "[hooks.numa] resize_exclusive_memory = true" in details
        assert "(pod default/guaranteed-crihook, container app)" in details
        assert memory_limit(pod) == 64 * MiB
        assert proc.hook_state("numa") == before


def test_with_resize_exclusive_memory_memory_resizes_within_its_numa_node_and_no_further(
    containerd: Containerd, pod_cleanup: PodCleanup, start_crihook: Start
) -> None:
    proc = start_crihook(RESIZE_MEMORY)
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        pod = run(kubelet, "guaranteed", "crihook", pod_cleanup)
        numa_state_when(proc, pod, 64 * MiB)
        applied = score(pod.pid)
        memory_resize(kubelet, pod, 128 * MiB)
        assert memory_limit(pod) == 128 * MiB
        numa_state_when(proc, pod, 128 * MiB)
        memory_resize(kubelet, pod, 96 * MiB)
        assert memory_limit(pod) == 96 * MiB
        numa_state_when(proc, pod, 96 * MiB)

        # Past the node's free memory: refused, nothing changed on the host or in the state.
        before = proc.hook_state("numa")
        node_memory = kubelet.node_memory
        with pytest.raises(grpc.RpcError) as refused:
            memory_resize(kubelet, pod, node_memory)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details() or ""
        assert f"resize of container 'app' to {node_memory} bytes of memory" in details
        assert "do not fit on NUMA node(s) 0 it holds" in details
        assert memory_limit(pod) == 96 * MiB
        assert proc.hook_state("numa") == before
        # The resizes re-sent kubelet's -997: the score is still what containerd applied.
        assert score(pod.pid) == applied


# --- pods removed without crihook ---------------------------------------------------------------

RECONCILE_OFTEN = "reconcile_seconds = 0.5\n" + CONFIG


def crihook_state(proc: CrihookProcess, *args: str) -> str:
    """`crihook state` as an operator runs it, on the running crihook's state dir."""
    out = subprocess.run(
        [sys.executable, "-m", "crihook", "state", "--state-dir", str(proc.state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def test_a_pod_removed_without_crihook_is_forgotten_and_what_it_held_given_back(
    containerd: Containerd,
    pod_cleanup: PodCleanup,
    kubelet_direct: KubeletClient,
    start_crihook: Start,
) -> None:
    """The trial's `pods: 11  containers: 0`: pods removed on containerd directly (another
    client, an operator's crictl, a test bed's clean-up) stayed in crihook's store for as
    long as it ran, and the CPUs they held stayed held."""
    proc = start_crihook(RECONCILE_OFTEN)
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        shared = run(kubelet, "besteffort", "crihook", pod_cleanup)
        pinned = run(kubelet, "guaranteed", "crihook", pod_cleanup)
        assert cpuset(pinned) == "1"
        proc.updates_sent()  # the shared pool shrinks after kubelet's answer
        assert cpuset(shared) == "0"
        # The container removed through crihook, its sandbox behind crihook's back.
        kubelet.runtime.StopContainer(
            api_pb2.StopContainerRequest(container_id=pinned.cid, timeout=0), timeout=30
        )
        kubelet.runtime.RemoveContainer(
            api_pb2.RemoveContainerRequest(container_id=pinned.cid), timeout=30
        )
        wait_for(
            lambda: "pods: 2  containers: 1" in crihook_state(proc),
            PATIENCE,
            "the removed container written",
            interval=0.2,
        )
        kubelet_direct.remove_pod(pinned.handle)

        def forgotten() -> bool:
            doc = json.loads(crihook_state(proc, "--json"))
            return set(doc["pods"]) == {shared.handle.sandbox_id}

        wait_for(forgotten, PATIENCE, "the removed pod forgotten", interval=0.2)
        shown = crihook_state(proc)
        assert "pods: 1  containers: 1" in shown
        # What kubelet tells the runtime of a container: no kind (init or not) to print.
        assert f"  container app {shared.cid[:13]} running attempt=0\n" in shown
        assert "kind=" not in shown
        assert "removed without crihook" in proc.log()
        # Nothing holds CPU 1 any more: the shared pool has it back.
        wait_for(lambda: cpuset(shared) == "0-1", PATIENCE, "the shared pool widened")
        taken = run(kubelet, "guaranteed", "again", pod_cleanup)
        assert cpuset(taken) == "1"
