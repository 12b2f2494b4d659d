"""The resource hooks (cpuset, numa, oom) on machines this VM is not: a real crihook process
reads a sysfs fixture tree of a big NUMA machine (`--sysfs-root`) and fronts a stateful fake
runtime that records what it was asked to create.

Expected CPUs are kubelet's picks, computed by the ported picker from the same topology and
the CPUs free at that point; the picker itself is checked against kubelet's vectors in
tests/unit/test_cpuset_picker.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.hooks.cpus import take_cpus
from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list
from crihook.hooks.numa.saved import read_saved
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import (
    DUAL_SOCKET_SMT2_2NUMA,
    DUAL_SOCKET_SMT2_4NUMA,
    EPYC_256_8NUMA,
    GIB,
    OFFLINE_CPUS,
    MachineSpec,
)

MIB = 1 << 20
NODE_MEMORY = 256 * GIB


@dataclass
class Node:
    """A fixture machine: crihook in front of the memory runtime, and a kubelet-ish client."""

    topology: Topology
    runtime: MemoryRuntime
    proc: CrihookProcess
    stub: api_pb2_grpc.RuntimeServiceStub

    def run_pod(self, spec: PodSpec) -> str:
        request = api_pb2.RunPodSandboxRequest(config=sandbox_config(spec))
        return str(self.stub.RunPodSandbox(request, timeout=60).pod_sandbox_id)

    def create(self, spec: PodSpec, sandbox_id: str, container: ContainerSpec) -> str:
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox_id,
            config=container_config(spec, container, node_memory=NODE_MEMORY),
            sandbox_config=sandbox_config(spec),
        )
        cid = str(self.stub.CreateContainer(request, timeout=60).container_id)
        self.stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)
        return cid

    def pod(self, name: str, cpus: int | None, memory: int = GIB, **kw: object) -> tuple[str, str]:
        """A one-container pod: Guaranteed with `cpus` whole CPUs, or Burstable (None)."""
        milli = cpus * 1000 if cpus else None
        container = ContainerSpec(
            name="app",
            cpu_request=milli or 100,
            cpu_limit=milli,
            memory_request=memory,
            memory_limit=memory if cpus else None,
        )
        spec = PodSpec(name=name, containers=[container], **kw)  # type: ignore[arg-type]
        sandbox = self.run_pod(spec)
        return sandbox, self.create(spec, sandbox, container)

    def cpus(self, cid: str) -> frozenset[int]:
        return parse_cpu_list(self.runtime.cpuset_of(cid))

    def hook_state(self, name: str) -> dict[str, Any]:
        """A hook's state as written to disk, once crihook wrote what it had: reservations are
        written ahead, their confirmations behind (a fraction of a second later)."""

        def settled() -> bool:
            doc = self.proc.hook_state(name)
            return not any(k.startswith(("r:", "p:")) for k in doc)  # cpuset's, numa's

        wait_for(settled, PATIENCE, f"{name}'s state written")
        return self.proc.hook_state(name)


@pytest.fixture
def fixture_node(request: pytest.FixtureRequest) -> Iterator[Node]:
    """Parametrized with (MachineSpec, config TOML, hooks)."""
    spec, config, hooks = request.param
    with crihook_on_fixture(short_tmpdir("rh-"), spec, config=config, hooks=hooks) as m:
        yield Node(m.topology, m.runtime, m.proc, m.stub)


def machine(
    spec: MachineSpec, config: str = "", id: str = "", hooks: str = "cpuset,numa,oom"
) -> object:
    return pytest.param((spec, config, hooks), id=id or "machine")


# --- kubelet's picks, the shared pool, and the updates ----------------------------------------


@pytest.mark.parametrize(
    "fixture_node", [machine(DUAL_SOCKET_SMT2_2NUMA, id="dual-socket-2numa")], indirect=True
)
def test_exclusive_cpus_are_kubelets_pick_and_shared_containers_follow(fixture_node: Node) -> None:
    node = fixture_node
    topo = node.topology
    _, shared = node.pod("burstable", None)
    assert node.cpus(shared) == topo.online  # nothing exclusive yet: the whole machine

    free = set(topo.online)
    expected: list[frozenset[int]] = []
    pinned = []
    for i, size in enumerate((4, 2, 6)):
        want = take_cpus(topo, frozenset(free), size)
        _, cid = node.pod(f"g{i}", size)
        assert node.cpus(cid) == want, f"pod g{i}: not kubelet's pick"
        free -= want
        expected.append(want)
        pinned.append(cid)
        # The shared container is moved off the new exclusive CPUs after CreateContainer
        # returned (updates = "after-answer"), with one UpdateContainerResources per change.
        node.proc.updates_sent()
        assert node.cpus(shared) == frozenset(free)
    stored = node.runtime.containers[pinned[0]].resources
    assert stored.cpu_quota == -1  # no CFS quota on exclusive CPUs
    assert len(node.runtime.containers[shared].updates) == 3
    # Memory of a Guaranteed container sits on the NUMA nodes of its CPUs.
    for cid, cpus in zip(pinned, expected, strict=True):
        assert parse_cpu_list(node.runtime.mems_of(cid)) == topo.numa_of(cpus)
    assert parse_cpu_list(node.runtime.mems_of(shared)) == set(topo.numa_nodes)


@pytest.mark.parametrize(
    "fixture_node", [machine(DUAL_SOCKET_SMT2_2NUMA, id="dual-socket-2numa")], indirect=True
)
def test_an_update_left_at_a_stop_reaches_the_shared_container_after_the_restart(
    fixture_node: Node,
) -> None:
    """The runtime refuses the shared container's update until crihook stops (SIGTERM): the
    stop says what it leaves, and the restarted crihook's synchronize moves the container."""
    node = fixture_node
    online = node.topology.online
    _, shared = node.pod("burstable", None)
    node.runtime.fail_every("UpdateContainerResources", grpc.StatusCode.UNAVAILABLE)
    _, pinned = node.pod("g", 4)  # answered: its update goes out after the answer, and fails
    wait_for(lambda: node.runtime.calls("UpdateContainerResources"), PATIENCE, "the update tried")
    assert node.proc.stop() == 0
    assert "stopping with updates to 1 container(s) not sent" in node.proc.log()
    assert node.cpus(shared) == online  # never applied
    node.runtime.fail_every("UpdateContainerResources", None)
    node.proc.start()
    want = online - node.cpus(pinned)
    wait_for(lambda: node.cpus(shared) == want, PATIENCE, "the shared container moved")


@pytest.mark.parametrize(
    "fixture_node",
    [machine(OFFLINE_CPUS, "[hooks.cpuset]\nreserved_cpus = 2\n", id="offline-reserved")],
    indirect=True,
)
def test_offline_and_reserved_cpus_are_never_handed_out(fixture_node: Node) -> None:
    node = fixture_node
    topo = node.topology
    reserved = take_cpus(topo, topo.online, 2)
    taken: set[int] = set()
    for i in range(6):
        _, cid = node.pod(f"g{i}", 4)
        cpus = node.cpus(cid)
        assert len(cpus) == 4
        assert not cpus & topo.offline
        assert not cpus & reserved
        assert not cpus & taken
        taken |= cpus
    # 30 online - 2 reserved - 24 taken = 4 left: a fifth request of 6 cannot be met.
    with pytest.raises(grpc.RpcError) as info:
        node.pod("too-big", 6)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not enough cpus available" in info.value.details()
    assert not [k for k in node.hook_state("cpuset") if k.startswith("r:")]


# --- the topology policy ----------------------------------------------------------------------

SINGLE_NUMA = '[node]\ntopology_policy = "single-numa-node"\n'


@pytest.mark.parametrize(
    "fixture_node",
    [machine(DUAL_SOCKET_SMT2_4NUMA, SINGLE_NUMA, id="4numa-single-numa-node")],
    indirect=True,
)
def test_single_numa_node_policy_aligns_or_refuses(fixture_node: Node) -> None:
    node = fixture_node
    topo = node.topology
    for i in range(4):
        _, cid = node.pod(f"fits{i}", 8, memory=4 * GIB)
        cpus = node.cpus(cid)
        assert len(topo.numa_of(cpus)) == 1, "one NUMA node for CPUs"
        assert parse_cpu_list(node.runtime.mems_of(cid)) == topo.numa_of(cpus)
    before = dict(node.runtime.containers)
    # 24 CPUs cannot come from one node of 20.
    with pytest.raises(grpc.RpcError) as info:
        node.pod("spans", 24)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "single-numa-node" in info.value.details()
    assert node.runtime.containers.keys() == before.keys()  # never reached the runtime
    assert not [k for k in node.hook_state("cpuset") if k.startswith("r:")]


# --- concurrency and failures -----------------------------------------------------------------


@pytest.mark.parametrize("fixture_node", [machine(EPYC_256_8NUMA, id="epyc-256")], indirect=True)
def test_parallel_creates_never_overlap(fixture_node: Node) -> None:
    node = fixture_node
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda i: node.pod(f"p{i}", 1 + i % 7), range(40)))
    seen: set[int] = set()
    total = 0
    for i, (_, cid) in enumerate(results):
        cpus = node.cpus(cid)
        assert len(cpus) == 1 + i % 7
        assert not cpus & seen, f"container {i} overlaps an earlier one"
        seen |= cpus
        total += len(cpus)
    assert total == sum(1 + i % 7 for i in range(40))


@pytest.mark.parametrize(
    "fixture_node", [machine(DUAL_SOCKET_SMT2_2NUMA, id="dual-socket-2numa")], indirect=True
)
def test_a_runtime_failure_leaves_nothing_allocated(fixture_node: Node) -> None:
    node = fixture_node
    sandbox, first = node.pod("first", 4)
    held_before = node.hook_state("cpuset")
    memory_before = read_saved(node.hook_state("numa").items()).memory
    app = ContainerSpec("app", cpu_request=4000, cpu_limit=4000)
    app.memory_request = app.memory_limit = GIB
    spec = PodSpec(name="second", containers=[app])
    sandbox2 = node.run_pod(spec)
    node.runtime.fail_next("CreateContainer", grpc.StatusCode.INTERNAL, "disk on fire")
    with pytest.raises(grpc.RpcError) as info:
        node.create(spec, sandbox2, spec.containers[0])
    assert info.value.code() == grpc.StatusCode.INTERNAL  # the runtime's own status
    assert node.hook_state("cpuset") == held_before
    assert read_saved(node.hook_state("numa").items()).memory == memory_before
    # And the CPUs it had reserved go to the next container.
    cid = node.create(spec, sandbox2, spec.containers[0])
    assert node.cpus(cid) == take_cpus(node.topology, node.topology.online - node.cpus(first), 4)
    assert sandbox


@pytest.mark.parametrize(
    "fixture_node",
    [
        machine(
            DUAL_SOCKET_SMT2_2NUMA,
            '[hooks.cpuset]\npolicy_options = { "full-pcpus-only" = "true" }\n'
            '[hooks.oom]\noverride_ranges = { "batch" = "500..1000" }\n',
            id="full-pcpus",
        )
    ],
    indirect=True,
)
def test_bad_input_gets_a_clear_status_and_no_allocation(fixture_node: Node) -> None:
    node = fixture_node
    with pytest.raises(grpc.RpcError) as info:
        node.pod("odd", 3)  # not whole cores on SMT2
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "SMT Alignment Error" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        node.pod("bad-oom", None, annotations={"oom.crihook.io/score-adj": "lots"})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "oom.crihook.io/score-adj" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        node.pod("out-of-range", None, annotations={"oom.crihook.io/score-adj": "100"})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the range" in info.value.details()
    assert not [k for k in node.hook_state("cpuset") if k.startswith(("r:", "c:"))] or all(
        not v["cpus"]
        for v in node.hook_state("cpuset").values()  # type: ignore[index]
    )
    _, cid = node.pod(
        "batch-job", None, namespace="batch", annotations={"oom.crihook.io/score-adj": "800"}
    )
    assert node.runtime.containers[cid].resources.oom_score_adj == 800


# --- restart ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture_node", [machine(EPYC_256_8NUMA, id="epyc-256")], indirect=True)
def test_restart_mid_workload_keeps_every_allocation(fixture_node: Node) -> None:
    node = fixture_node
    pinned = {}
    for i in range(10):
        pinned[f"a{i}"] = node.pod(f"a{i}", 1 + i % 4)[1]
    node.proc.kill()  # SIGKILL: no clean shutdown
    node.proc.start()
    for i in range(10, 20):
        pinned[f"a{i}"] = node.pod(f"a{i}", 1 + i % 4)[1]
    seen: set[int] = set()
    for cid in pinned.values():
        cpus = node.cpus(cid)
        assert not cpus & seen
        seen |= cpus
    state = node.hook_state("cpuset")
    held = {k[2:]: v for k, v in state.items() if k.startswith("c:")}  # type: ignore[union-attr]
    assert {cid for cid in pinned.values()} <= held.keys()
    for cid in pinned.values():
        assert parse_cpu_list(held[cid]["cpus"]) == node.cpus(cid)  # type: ignore[index]


@pytest.mark.parametrize(
    "fixture_node", [machine(DUAL_SOCKET_SMT2_2NUMA, id="dual-socket-2numa")], indirect=True
)
def test_a_call_with_an_unknown_outcome_keeps_its_cpus_until_the_runtime_says(
    fixture_node: Node,
) -> None:
    """kubelet's deadline passes while the runtime creates the container: the container
    exists, kubelet does not know it. Its CPUs stay reserved (released, they could go to
    another container while this one runs on them) until the pod is reconciled, then are
    confirmed under the id the runtime gave it; one whose container the runtime never made
    is released."""
    node = fixture_node
    app = ContainerSpec("app", cpu_request=4000, cpu_limit=4000)
    app.memory_request = app.memory_limit = GIB
    spec = PodSpec(name="late", containers=[app])
    sandbox = node.run_pod(spec)
    node.runtime.slow_next("CreateContainer", 1.0)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        config=container_config(spec, app, node_memory=NODE_MEMORY),
        sandbox_config=sandbox_config(spec),
    )
    with pytest.raises(grpc.RpcError) as info:
        node.stub.CreateContainer(request, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    (created,) = [c for c in node.runtime.containers.values() if c.pod_id == sandbox]
    # Meanwhile nobody else gets those CPUs.
    _, other = node.pod("other", 4)
    assert not node.cpus(other) & parse_cpu_list(created.resources.cpuset_cpus)

    def confirmed() -> bool:
        state = node.hook_state("cpuset")
        return f"c:{created.id}" in state

    wait_for(confirmed, PATIENCE, "the late container confirmed")
    held = node.hook_state("cpuset")[f"c:{created.id}"]
    assert parse_cpu_list(held["cpus"]) == parse_cpu_list(created.resources.cpuset_cpus)

    # The runtime went away before acting: nothing was made, the reservation goes.
    node.runtime.fail_next("CreateContainer", grpc.StatusCode.UNAVAILABLE, "connection reset")
    spec2 = PodSpec(name="lost", containers=[app])
    sandbox2 = node.run_pod(spec2)
    with pytest.raises(grpc.RpcError):
        node.create(spec2, sandbox2, app)
    wait_for(
        lambda: not any(k.startswith("r:") for k in node.proc.hook_state("cpuset")),
        PATIENCE,
        "the lost reservation released",
    )


# --- restore ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture_node", [machine(DUAL_SOCKET_SMT2_2NUMA, id="dual-socket-2numa")], indirect=True
)
def test_a_restored_pod_is_known_placed_and_counted(fixture_node: Node) -> None:
    """RestorePod brings a pod and its containers back without any CreateContainer. crihook
    learns them from the runtime; the cpuset hook counts them, and a restored container whose
    exclusive CPUs another container took meanwhile gets free ones: never an overlap."""
    node = fixture_node
    _, holder = node.pod("holder", 4)
    taken = node.cpus(holder)
    app = ContainerSpec("app", cpu_request=4000, cpu_limit=4000)
    app.memory_request = app.memory_limit = GIB
    spec = PodSpec(name="restored", containers=[app])
    config = container_config(spec, app, node_memory=NODE_MEMORY)
    config.linux.resources.cpuset_cpus = format_cpu_list(taken)  # as checkpointed
    request = api_pb2.RestorePodRequest(
        path="/var/lib/checkpoints/pod", config=sandbox_config(spec), container_configs=[config]
    )
    sandbox = node.stub.RestorePod(request, timeout=60).pod_sandbox_id
    (restored,) = [c for c in node.runtime.containers.values() if c.pod_id == sandbox]

    def placed() -> bool:
        state = node.hook_state("cpuset")
        held = state.get(f"c:{restored.id}")
        return held is not None and bool(held["cpus"])

    wait_for(placed, PATIENCE, "the restored container placed")
    cpus = parse_cpu_list(node.hook_state("cpuset")[f"c:{restored.id}"]["cpus"])
    assert len(cpus) == 4 and not cpus & taken
    # The runtime was told: the container now runs on its new CPUs.
    wait_for(lambda: node.cpus(restored.id) == cpus, PATIENCE, "the restored container moved")
    # And counted: the next pod does not get them either.
    _, after = node.pod("after", 4)
    assert not node.cpus(after) & (cpus | taken)
    state = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "crihook",
                "state",
                "--state-dir",
                str(node.proc.state_dir),
                "--json",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert sandbox in state["pods"]


# --- resize -----------------------------------------------------------------------------------

POD_SCOPE = '[node]\ntopology_scope = "pod"\n'


@pytest.mark.parametrize(
    "fixture_node", [machine(DUAL_SOCKET_SMT2_2NUMA, POD_SCOPE, id="pod-scope")], indirect=True
)
def test_resizes_of_exclusive_cpus_are_refused_and_reverts_pass(fixture_node: Node) -> None:
    """kubelet's rules: with exclusive CPUs (a container's, a pod bubble's) a resize is
    infeasible; it never reaches the runtime. kubelet's revert goes through."""
    node = fixture_node
    _, cid = node.pod("g", 4)
    held = node.cpus(cid)

    def update(milli: int) -> None:
        linux = api_pb2.LinuxContainerResources(
            cpu_shares=milli * 1024 // 1000, cpu_quota=milli * 100, cpu_period=100_000
        )
        node.stub.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=cid, linux=linux), timeout=60
        )

    with pytest.raises(grpc.RpcError) as info:
        update(6000)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "infeasible" in info.value.details()
    assert not node.runtime.calls("UpdateContainerResources")
    update(4000)  # the revert
    assert node.cpus(cid) == held and node.runtime.containers[cid].resources.cpu_quota == -1

    # A Guaranteed pod with a pod-level budget gets a bubble; its pod-level resize is refused.
    app = ContainerSpec("app", cpu_request=2000, cpu_limit=2000)
    app.memory_request = app.memory_limit = GIB
    spec = PodSpec(name="bubble", containers=[app])
    sandbox = node.run_pod(spec)
    grow = api_pb2.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=sandbox, resources=api_pb2.LinuxContainerResources(cpu_shares=4096)
    )
    with pytest.raises(grpc.RpcError) as info:
        node.stub.UpdatePodSandboxResources(grow, timeout=60)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not node.runtime.calls("UpdatePodSandboxResources")
    same = api_pb2.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=sandbox, resources=api_pb2.LinuxContainerResources(cpu_shares=2048)
    )
    node.stub.UpdatePodSandboxResources(same, timeout=60)
    assert len(node.runtime.calls("UpdatePodSandboxResources")) == 1


# --- a sandbox a hook cannot set up -----------------------------------------------------------


@pytest.mark.parametrize(
    "fixture_node",
    [
        machine(
            DUAL_SOCKET_SMT2_2NUMA,
            '[hooks.refuse]\nmodule = "tests.lab.sample_hooks:RefuseSandbox"\n',
            id="refusing-hook",
            hooks="cpuset,numa,oom,50-refuse",
        )
    ],
    indirect=True,
)
def test_a_sandbox_refused_after_the_runtime_made_it_is_undone(fixture_node: Node) -> None:
    """A hook whose post-RunPodSandbox cannot set the sandbox up (a network device, say):
    crihook stops and removes the sandbox the runtime made, tells the hooks the call failed,
    and kubelet gets the hook's status: nothing is left for kubelet to leak."""
    node = fixture_node
    node.run_pod(PodSpec(name="fine"))
    with pytest.raises(grpc.RpcError) as info:
        node.run_pod(PodSpec(name="broken", annotations={"refuse": "yes"}))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot set up the network of pod broken" in info.value.details()
    assert [p.config.metadata.name for p in node.runtime.pods.values()] == ["fine"]
    assert len(node.runtime.calls("RemovePodSandbox")) == 1

    def released() -> bool:  # the release is written behind
        return len(node.proc.hook_state("refuse")["held"]) == 1  # only the pod that runs

    wait_for(released, PATIENCE, "the refused pod's reservation released")
    assert "cannot set up the network" in node.proc.hook_state("refuse")["told"][0]
