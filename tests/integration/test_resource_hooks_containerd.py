"""The resource hooks (cpuset, numa, oom) in a real crihook in front of the lab's containerd, on
this machine: what they decide is checked where it takes effect, in the host's cgroup files
(cpuset.cpus, cpuset.mems, cpu.cfs_quota_us) and in /proc (Cpus_allowed_list,
oom_score_adj) of the containers' processes, not only in what crihook sent.

Expected CPUs are kubelet's picks, computed with the ported picker (`take_cpus`) on this
machine's topology and the CPUs free at that point. The lab VM has cgroup v1 (hybrid) and no
CAP_SYS_RESOURCE: containerd runs with restrict_oom_score_adj, so only positive OOM scores are
applied as asked, and the pods here are Burstable where a score is checked.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.cpus import take_cpus
from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list, read_topology
from crihook.hooks.numa.saved import read_saved
from tests.lab import cgroups
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, PodStartError
from tests.lab.kubelet_encoding import pod_log_directory, qos_class
from tests.lab.runtime_lab import RuntimeLab

# On containerd 1.6 and 2.x by default (tests/lab/containerd_versions.py).
pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

MiB = 1024 * 1024
HOOKS = "cpuset,numa,oom"
CGROUP = Path("/sys/fs/cgroup")
SCORE_ANNOTATION = "oom.crihook.io/score-adj"
RESERVED_0 = '[hooks.cpuset]\nreserved_cpus = "0"\n'
# An image id containerd does not have (the lab never pulls).
MISSING_IMAGE = "sha256:" + "0" * 64

Start = Callable[[str], CrihookProcess]


# --- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
def start_crihook(containerd: RuntimeLab) -> Iterator[Start]:
    """Starts `crihook serve --hooks cpuset,numa,oom` (config TOML as given) in its own workdir;
    every process killed and every workdir removed at teardown."""
    procs: list[CrihookProcess] = []

    def start(config: str = "") -> CrihookProcess:
        proc = CrihookProcess(
            containerd.endpoint,
            workdir=short_tmpdir("rc-"),
            config=config,
            hooks=HOOKS,
        )
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        proc.kill()
    for proc in procs:
        shutil.rmtree(proc.workdir, ignore_errors=True)


@pytest.fixture
def topology() -> Topology:
    return read_topology("/sys")


def burstable(name: str, **kw: Any) -> PodSpec:
    app = ContainerSpec(
        name="app", cpu_request=250, cpu_limit=500, memory_request=256 * MiB, memory_limit=512 * MiB
    )
    return PodSpec(name=name, containers=[app], **kw)


def guaranteed(name: str, cpus: int = 1) -> PodSpec:
    app = ContainerSpec(
        name="app",
        cpu_request=cpus * 1000,
        cpu_limit=cpus * 1000,
        memory_request=64 * MiB,
        memory_limit=64 * MiB,
    )
    return PodSpec(name=name, containers=[app])


def kubelet_for(proc: CrihookProcess, containerd: RuntimeLab) -> KubeletClient:
    return KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir)


def cgroup_value(controller: str, handle: PodHandle, cid: str, name: str) -> str:
    container = cgroups.container_cgroup(handle.cgroup_parent, cid)
    path = CGROUP / controller / container.lstrip("/") / name
    return path.read_text().strip()


def cpuset_cpus(handle: PodHandle, cid: str) -> frozenset[int]:
    return parse_cpu_list(cgroup_value("cpuset", handle, cid, "cpuset.cpus"))


def status_field(status_text: str, name: str) -> str:
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"{name} missing from:\n{status_text}")


def cpus_allowed_of_pid(pid: int) -> frozenset[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return parse_cpu_list(status_field(status, "Cpus_allowed_list"))


def cpus_allowed_inside(kubelet: KubeletClient, cid: str) -> frozenset[int]:
    """What a process started in the container now may run on (ExecSync)."""
    out = kubelet.exec_sync(cid, ["cat", "/proc/self/status"])
    assert out.exit_code == 0, out.stderr
    return parse_cpu_list(status_field(out.stdout.decode(), "Cpus_allowed_list"))


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def hook_state(proc: CrihookProcess, name: str) -> dict[str, Any]:
    """A hook's state file once crihook wrote what it has: reservations are written ahead,
    their confirmations behind (a fraction of a second later)."""

    def settled() -> bool:
        doc = proc.hook_state(name)
        return not any(k.startswith(("r:", "p:")) for k in doc)  # cpuset's, numa's

    wait_for(settled, PATIENCE, f"{name}'s state written")
    return proc.hook_state(name)


def raw_hook_state(proc: CrihookProcess, name: str) -> dict[str, Any]:
    return proc.hook_state(name)


def state_when(
    proc: CrihookProcess, name: str, predicate: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """A hook's state file once `predicate` holds: changes of the post stage (a container's
    CPUs given back) are written behind the answer, a fraction of a second later."""
    wait_for(lambda: predicate(raw_hook_state(proc, name)), PATIENCE, f"{name}'s state: {what}")
    return raw_hook_state(proc, name)


def run_pod(
    kubelet: KubeletClient, spec: PodSpec, cleanup: PodCleanup
) -> tuple[PodHandle, str, int]:
    """The pod up through crihook: its handle, its `app` container and that one's pid."""
    try:
        handle = cleanup.add(kubelet.run_pod(spec))
    except PodStartError as exc:
        if exc.handle is not None:
            cleanup.add(exc.handle)
        raise
    cid = handle.container_ids["app"]
    return handle, cid, kubelet.container_pid(cid)


def run_sandbox(kubelet: KubeletClient, spec: PodSpec, cleanup: PodCleanup) -> PodHandle:
    """RunPodSandbox only: its containers are created by the test itself."""
    assert kubelet.log_root is not None
    Path(pod_log_directory(spec, kubelet.log_root)).mkdir(parents=True, exist_ok=True)
    config = kubelet.sandbox_config(spec)
    sandbox_id = kubelet.runtime.RunPodSandbox(
        api_pb2.RunPodSandboxRequest(config=config), timeout=30
    ).pod_sandbox_id
    return cleanup.add(
        PodHandle(
            spec=spec,
            sandbox_id=sandbox_id,
            sandbox_config=config,
            qos=qos_class(spec),
            cgroup_parent=config.linux.cgroup_parent,
        )
    )


def create_container(
    kubelet: KubeletClient, handle: PodHandle, image_ref: str | None = None
) -> str:
    """CreateContainer for the pod's `app` as kubelet sends it (with `image_ref` as the image
    id, default the image's real id), then StartContainer."""
    spec = handle.spec
    container = spec.containers[0]
    if image_ref is None:
        image_ref = kubelet.images.ImageStatus(
            api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=container.image)), timeout=60
        ).image.id
        assert image_ref, "the lab image is present"
    config = kubelet.container_config(spec, container, image_ref=image_ref)
    cid: str = kubelet.runtime.CreateContainer(
        api_pb2.CreateContainerRequest(
            pod_sandbox_id=handle.sandbox_id, config=config, sandbox_config=handle.sandbox_config
        ),
        timeout=30,
    ).container_id
    kubelet.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=30)
    handle.container_ids[container.name] = cid
    handle.container_configs[container.name] = config
    return cid


def update_resources(
    kubelet: KubeletClient, handle: PodHandle, cid: str, **changes: int | dict[str, str]
) -> None:
    """kubelet's UpdateContainerResources: the container's resources as kubelet computes them
    (what it sent at creation), with `changes` on top."""
    linux = api_pb2.LinuxContainerResources()
    linux.CopyFrom(handle.container_configs["app"].linux.resources)
    for name, value in changes.items():
        if isinstance(value, dict):
            getattr(linux, name).update(value)
        else:
            setattr(linux, name, value)
    kubelet.runtime.UpdateContainerResources(
        api_pb2.UpdateContainerResourcesRequest(container_id=cid, linux=linux), timeout=30
    )


# --- 1. exclusive CPUs and the shared pool on the host --------------------------------------


def test_exclusive_cpus_and_the_shared_pool_reach_the_cgroups(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, start_crihook: Start, topology: Topology
) -> None:
    proc = start_crihook("")
    online = topology.online
    with kubelet_for(proc, containerd) as kubelet:
        shared_pod, shared, shared_pid = run_pod(kubelet, burstable("shared"), pod_cleanup)
        # Nothing is exclusive yet: the shared pool is every online CPU, all memory nodes.
        assert cpuset_cpus(shared_pod, shared) == online
        assert cgroup_value("cpuset", shared_pod, shared, "cpuset.mems") == format_cpu_list(
            frozenset(topology.numa_nodes)
        )
        assert cpus_allowed_of_pid(shared_pid) == online

        want = take_cpus(topology, online, 1)  # kubelet's pick from the free CPUs
        assert len(want) == 1
        pinned_pod, pinned, pinned_pid = run_pod(kubelet, guaranteed("pinned"), pod_cleanup)
        assert cpuset_cpus(pinned_pod, pinned) == want
        assert cgroup_value("cpu", pinned_pod, pinned, "cpu.cfs_quota_us") == "-1"
        assert cgroup_value("cpuset", pinned_pod, pinned, "cpuset.mems") == format_cpu_list(
            topology.numa_of(want)
        )
        assert cpus_allowed_of_pid(pinned_pid) == want
        assert cpus_allowed_inside(kubelet, pinned) == want
        # The shared container is moved off the exclusive CPU after CreateContainer returned
        # (updates = "after-answer").
        proc.updates_sent()
        assert cpuset_cpus(shared_pod, shared) == online - want
        assert cpus_allowed_of_pid(shared_pid) == online - want
        assert cpus_allowed_inside(kubelet, shared) == online - want
        # kubelet re-sends its resources (a CFS quota of 1 CPU, no cpuset): what crihook set
        # on the exclusive container stays.
        sent = pinned_pod.container_configs["app"].linux.resources
        assert sent.cpu_quota == 100_000 and not sent.cpuset_cpus
        update_resources(kubelet, pinned_pod, pinned, cpu_shares=1024)
        assert cgroup_value("cpu", pinned_pod, pinned, "cpu.cfs_quota_us") == "-1"
        assert cpuset_cpus(pinned_pod, pinned) == want

        kubelet.remove_pod(pinned_pod)
        # Given back at StopContainer/RemoveContainer: the shared pool grows back.
        proc.updates_sent()
        assert cpuset_cpus(shared_pod, shared) == online
        assert cpus_allowed_of_pid(shared_pid) == online
        state = state_when(
            proc, "cpuset", lambda s: f"c:{pinned}" not in s, "the removed container forgotten"
        )
        assert state == {}  # the shared container holds no CPUs: not written


def test_the_last_free_cpu_is_refused_while_shared_containers_run_on_it(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, start_crihook: Start, topology: Topology
) -> None:
    """No reserved CPUs (the hook's default): a Guaranteed container that would take the last
    CPU of the shared pool while a shared container runs on it must be refused, as the hook
    already refuses it inside a pod's bubble. Granting it leaves the shared containers an
    empty cpuset, which the runtime cannot apply (containerd reads an empty cpuset_cpus in
    UpdateContainerResources as "unchanged"): they go on running on the new exclusive CPU."""
    proc = start_crihook("")
    online = topology.online
    with kubelet_for(proc, containerd) as kubelet:
        shared_pod, shared, _ = run_pod(kubelet, burstable("shared"), pod_cleanup)
        first_pod, first, _ = run_pod(kubelet, guaranteed("first"), pod_cleanup)
        first_cpus = cpuset_cpus(first_pod, first)
        left = online - first_cpus
        proc.updates_sent()
        assert cpuset_cpus(shared_pod, shared) == left
        try:
            second_pod, second, _ = run_pod(
                kubelet, guaranteed("second", cpus=len(left)), pod_cleanup
            )
        except PodStartError as exc:
            refused = exc
        else:
            asked = [line for line in proc.log().splitlines() if "{'cpuset_cpus': ''}" in line]
            pytest.fail(
                f"pod second was given cpus {format_cpu_list(cpuset_cpus(second_pod, second))} "
                "exclusively while the shared container still runs on cpus "
                f"{format_cpu_list(cpuset_cpus(shared_pod, shared))}; crihook asked for an "
                f"empty cpuset: {asked}"
            )
        assert refused.code == grpc.StatusCode.FAILED_PRECONDITION, refused
        assert "shared pool" in refused.details
        # Nothing was reserved for it; the shared container kept its CPUs.
        state = state_when(proc, "cpuset", lambda s: not _reservations(s), "no reservation")
        assert parse_cpu_list(state[f"c:{first}"]["cpus"]) == first_cpus
        assert cpuset_cpus(shared_pod, shared) == left
        assert cpuset_cpus(first_pod, first) == first_cpus


# --- 2. oom_score_adj of the containers' processes --------------------------------------------

OOM_RANGES = '[hooks.oom]\noverride_ranges = { "*" = "0..1000" }\n'


def test_oom_score_override_kubelets_value_and_updates_reach_the_processes(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, start_crihook: Start
) -> None:
    proc = start_crihook(OOM_RANGES)
    with kubelet_for(proc, containerd) as kubelet:
        annotated = burstable("annotated", annotations={SCORE_ANNOTATION: "700"})
        over_pod, over, over_pid = run_pod(kubelet, annotated, pod_cleanup)
        plain_pod, plain, plain_pid = run_pod(kubelet, burstable("plain"), pod_cleanup)
        kubelets = plain_pod.container_configs["app"].linux.resources.oom_score_adj
        assert kubelets == over_pod.container_configs["app"].linux.resources.oom_score_adj
        assert kubelets not in (700, 800, 300)  # the values below tell who set the score
        assert oom_score_adj(over_pid) == 700
        assert oom_score_adj(plain_pid) == kubelets

        # containerd ignores oom_score_adj on update; crihook writes it to the processes.
        update_resources(kubelet, plain_pod, plain, oom_score_adj=800)
        assert oom_score_adj(plain_pid) == 800
        out = kubelet.exec_sync(plain, ["cat", "/proc/1/oom_score_adj"])
        assert out.stdout.decode().strip() == "800"
        # The override is sticky: kubelet's update carrying its own value leaves it.
        update_resources(kubelet, over_pod, over, oom_score_adj=300)
        assert oom_score_adj(over_pid) == 700
        assert oom_score_adj(plain_pid) == 800
        state = state_when(
            proc, "oom", lambda s: s.get(f"c:{plain}", {}).get("score") == 800, "the new score"
        )
        assert state[f"c:{over}"] == {
            "pod": over_pod.sandbox_id,
            "asked": 700,
            "score": 700,
            "sticky": True,
        }
        assert state[f"c:{plain}"] == {
            "pod": plain_pod.sandbox_id,
            "asked": 800,
            "score": 800,
            "sticky": False,
        }


# --- 3. restart: the allocation comes back from the state dir --------------------------------


def test_restart_keeps_the_allocation_and_refuses_what_does_not_fit(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, start_crihook: Start, topology: Topology
) -> None:
    """reserved_cpus = "0" (kubelet's static policy needs at least one reserved CPU): the
    reserved CPU stays in the shared pool and is never handed out."""
    online = topology.online
    reserved = frozenset({0})
    proc = start_crihook(RESERVED_0)
    with kubelet_for(proc, containerd) as kubelet:
        shared_pod, shared, shared_pid = run_pod(kubelet, burstable("shared"), pod_cleanup)
        assert cpuset_cpus(shared_pod, shared) == online
        want = take_cpus(topology, online - reserved, 1)
        pinned_pod, pinned, pinned_pid = run_pod(kubelet, guaranteed("pinned"), pod_cleanup)
        assert cpuset_cpus(pinned_pod, pinned) == want
        proc.updates_sent()
        assert cpuset_cpus(shared_pod, shared) == online - want == reserved
        cpuset_before, numa_before = hook_state(proc, "cpuset"), hook_state(proc, "numa")
        assert parse_cpu_list(cpuset_before[f"c:{pinned}"]["cpus"]) == want

    proc.kill()  # SIGKILL: no clean shutdown
    proc.start()
    with kubelet_for(proc, containerd) as kubelet:
        # The same allocation, read back from the state dir (not rebuilt by adoption).
        assert hook_state(proc, "cpuset") == cpuset_before
        assert hook_state(proc, "numa") == numa_before
        log = proc.log()
        assert "adopted container" not in log
        summary = (
            f"cpuset: 2 container(s), 1 exclusive; shared pool {format_cpu_list(reserved)}, "
            f"reserved {format_cpu_list(reserved)}"
        )
        assert log.count(summary) == 1  # the second start's synchronize, not the first's
        with pytest.raises(PodStartError) as err:
            run_pod(kubelet, guaranteed("no-room"), pod_cleanup)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION, err.value
        assert "not enough cpus available" in err.value.details
        assert not _reservations(hook_state(proc, "cpuset"))
        assert hook_state(proc, "numa") == numa_before
        assert cpuset_cpus(pinned_pod, pinned) == want
        assert cpus_allowed_of_pid(pinned_pid) == want
        assert cpuset_cpus(shared_pod, shared) == reserved
        # The restarted crihook knows the shared container: it follows the pool.
        kubelet.remove_pod(pinned_pod)
        proc.updates_sent()
        assert cpuset_cpus(shared_pod, shared) == online
        assert cpus_allowed_of_pid(shared_pid) == online


# --- 4. a runtime failure after the hooks reserved --------------------------------------------


def test_a_create_that_containerd_refuses_leaves_nothing_allocated(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, start_crihook: Start, topology: Topology
) -> None:
    """The hooks reserve CPUs and memory in the pre stage (on disk before containerd acts);
    containerd then refuses the container (an image it does not have): the failed stage gives
    everything back, and the next container gets what the refused one would have had."""
    proc = start_crihook("")
    online = topology.online
    cpuset_before = raw_hook_state(proc, "cpuset")
    numa_before = raw_hook_state(proc, "numa")
    assert not _reservations(cpuset_before) and not read_saved(numa_before.items()).pending
    want = take_cpus(topology, online, 1)
    with kubelet_for(proc, containerd) as kubelet:
        handle = run_sandbox(kubelet, guaranteed("refused"), pod_cleanup)
        with pytest.raises(grpc.RpcError) as err:
            create_container(kubelet, handle, image_ref=MISSING_IMAGE)
        # The runtime's own answer, passed back as it is: containerd NOT_FOUND, CRI-O
        # UNKNOWN ("reference ... does not resolve to an image ID").
        code, prefix = (
            (grpc.StatusCode.UNKNOWN, "reference ")
            if containerd.is_crio
            else (grpc.StatusCode.NOT_FOUND, "failed to resolve image")
        )
        assert err.value.code() == code
        assert (err.value.details() or "").startswith(prefix), err.value.details()
        # The hooks had reserved for it: CPUs and memory.
        log = proc.log()
        assert (
            f"20-cpuset pre-CreateContainer -> Adjustment(cpuset_cpus='{format_cpu_list(want)}'"
            in log
        )
        assert "30-numa pre-CreateContainer -> Adjustment(cpuset_mems='0')" in log
        assert f"CreateContainer failed in the runtime: {code.name}" in log
        # Released (written behind the failure): nothing reserved, nothing held.
        cpuset = state_when(proc, "cpuset", lambda s: not _reservations(s), "reservation released")
        numa = state_when(
            proc, "numa", lambda s: not read_saved(s.items()).pending, "reservation released"
        )
        assert cpuset == cpuset_before
        assert numa == numa_before
        cid = create_container(kubelet, handle)
        assert cpuset_cpus(handle, cid) == want
        assert cpus_allowed_of_pid(kubelet.container_pid(cid)) == want
        numa = state_when(
            proc, "numa", lambda s: cid in read_saved(s.items()).owners, "the container's memory"
        )
        assert (read_saved(numa.items()).memory or {})["entries"] == {
            handle.sandbox_id: {"app": [{"numaAffinity": [0], "size": 64 * MiB, "type": "memory"}]}
        }


def _reservations(state: dict[str, Any]) -> list[str]:
    return [k for k in state if k.startswith("r:")]


# --- 3. in-place resize (kubelet 1.35+) ----------------------------------------------------------


def test_resizes_grow_and_shrink_on_the_host_and_exclusive_ones_are_refused(
    containerd: RuntimeLab,
    containerd_version: str,
    pod_cleanup: PodCleanup,
    start_crihook: Start,
    topology: Topology,
) -> None:
    """A resize is UpdateContainerResources per container and UpdatePodSandboxResources for
    the pod. A shared container grows and shrinks in its cgroup; a container with exclusive
    CPUs cannot change its CPUs (kubelet's static policy calls that infeasible) and nothing
    changes on the host, while kubelet's revert to what it has goes through."""
    proc = start_crihook(RESERVED_0)
    online = topology.online
    with kubelet_for(proc, containerd) as kubelet:
        shared_pod, shared, _ = run_pod(kubelet, burstable("resized"), pod_cleanup)
        pinned_pod, pinned, _ = run_pod(kubelet, guaranteed("pinned"), pod_cleanup)
        held = cpuset_cpus(pinned_pod, pinned)
        proc.updates_sent()
        assert cpuset_cpus(shared_pod, shared) == online - held

        # The Burstable container grows from 500m to 1 CPU and shrinks to 200m: the CFS
        # quota follows in the host's cgroup, and it stays on the shared pool.
        for quota, shares in ((100_000, 512), (20_000, 102)):
            update_resources(kubelet, shared_pod, shared, cpu_quota=quota, cpu_shares=shares)
            assert cgroup_value("cpu", shared_pod, shared, "cpu.cfs_quota_us") == str(quota)
            assert cgroup_value("cpu", shared_pod, shared, "cpu.shares") == str(shares)
            assert cpuset_cpus(shared_pod, shared) == online - held

        # The Guaranteed container asks for 2 CPUs, then for half of one: both infeasible.
        for quota, shares in ((200_000, 2048), (50_000, 512)):
            with pytest.raises(grpc.RpcError) as info:
                update_resources(kubelet, pinned_pod, pinned, cpu_quota=quota, cpu_shares=shares)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "infeasible" in info.value.details(), info.value.details()
            assert cpuset_cpus(pinned_pod, pinned) == held
            assert cgroup_value("cpu", pinned_pod, pinned, "cpu.cfs_quota_us") == "-1"
        update_resources(kubelet, pinned_pod, pinned)  # kubelet's revert: what it has
        assert cpuset_cpus(pinned_pod, pinned) == held

        # The pod-level call, after the container-level ones: without a pod-level CPU bubble
        # (topology_scope = "pod", checked on the sysfs fixtures) crihook passes it on.
        # containerd 2.x implements it (and tells NRI plugins); 1.6 answers UNIMPLEMENTED,
        # which kubelet tolerates.
        for handle, resources in (
            (shared_pod, api_pb2.LinuxContainerResources(cpu_shares=102, cpu_quota=20_000)),
            (pinned_pod, api_pb2.LinuxContainerResources(cpu_shares=1024, cpu_quota=100_000)),
        ):
            request = api_pb2.UpdatePodSandboxResourcesRequest(
                pod_sandbox_id=handle.sandbox_id, resources=resources
            )
            if containerd_version == "1.6":
                with pytest.raises(grpc.RpcError) as info:
                    kubelet.runtime.UpdatePodSandboxResources(request, timeout=30)
                assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            else:
                kubelet.runtime.UpdatePodSandboxResources(request, timeout=30)
        assert cpuset_cpus(pinned_pod, pinned) == held
        assert cpuset_cpus(shared_pod, shared) == online - held


def test_with_resize_exclusive_cpus_an_exclusive_container_grows_and_shrinks_on_the_host(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, start_crihook: Start, topology: Topology
) -> None:
    """kubelet's InPlacePodVerticalScalingExclusiveCPUs: a Guaranteed container created with
    1 CPU grows to every CPU of this machine and back to the CPU it was created with (never
    below it: checked on the fixtures); half a CPU is refused, and a resize the runtime refuses
    leaves its CPUs as they were."""
    proc = start_crihook("[hooks.cpuset]\nresize_exclusive_cpus = true\n")
    online = topology.online
    with kubelet_for(proc, containerd) as kubelet:
        handle, cid, _ = run_pod(kubelet, guaranteed("grows"), pod_cleanup)
        held = cpuset_cpus(handle, cid)
        pid = kubelet.container_pid(cid)
        assert len(held) == 1

        count = len(online)
        update_resources(kubelet, handle, cid, cpu_quota=count * 100_000, cpu_shares=count * 1024)
        assert cpuset_cpus(handle, cid) == online
        assert cpus_allowed_of_pid(pid) == online
        assert cgroup_value("cpu", handle, cid, "cpu.cfs_quota_us") == "-1"
        holder = hook_state(proc, "cpuset")[f"c:{cid}"]
        assert (holder["cpus"], holder["promised"]) == (
            format_cpu_list(online),
            format_cpu_list(held),
        )

        with pytest.raises(grpc.RpcError) as info:  # half a CPU: not exclusive any more
            update_resources(kubelet, handle, cid, cpu_quota=50_000, cpu_shares=512)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "by whole CPUs only" in (info.value.details() or "")
        assert cpuset_cpus(handle, cid) == online

        # The runtime refuses a resize, under containerd and CRI-O alike: a cgroup below the
        # container's holds the CPUs it would give up, so runc cannot narrow its cpuset (EBUSY),
        # a refusal crihook's door cannot foresee. The cpuset hook had moved it in its pre
        # stage, and takes it back.
        pin = CGROUP / "cpuset" / cgroups.container_cgroup(handle.cgroup_parent, cid).lstrip("/")
        pin = pin / "crihook-test-pin"
        pin.mkdir()
        try:
            (pin / "cpuset.mems").write_text((pin.parent / "cpuset.mems").read_text())
            (pin / "cpuset.cpus").write_text(format_cpu_list(online - held))
            with pytest.raises(grpc.RpcError) as info:
                update_resources(kubelet, handle, cid)  # back to 1 CPU
        finally:
            pin.rmdir()
        assert info.value.code() not in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.INVALID_ARGUMENT,  # refused by the runtime, not by crihook
        ), info.value.details()
        state = state_when(
            proc, "cpuset", lambda s: s[f"c:{cid}"]["cpus"] == format_cpu_list(online), "put back"
        )
        assert (state[f"c:{cid}"]["cpus"], state[f"c:{cid}"]["promised"]) == (
            format_cpu_list(online),
            format_cpu_list(held),
        )
        assert cpuset_cpus(handle, cid) == online

        # kubelet's retry, with nothing below the container now: back to the CPU it was
        # created with.
        update_resources(kubelet, handle, cid)
        assert cpuset_cpus(handle, cid) == held
        assert cpus_allowed_of_pid(pid) == held
