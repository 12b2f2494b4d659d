"""The koordinator hook in a real crihook process on a 48-CPU machine (a sysfs fixture tree,
`--sysfs-root`), in front of the stateful fake runtime that records what it was asked.

A mixed Koordinator workload: LS pods on the share pool, BE pods with batch resources on the
BE pool, LSR pods on the CPUs koord-scheduler gave them (`resource-status`), then an LSE pod,
pods going away, kubelet's updates and a restart. Run twice: the koordinator hook placing
CPUs itself (instead of the cpuset hook), and alongside the cpuset hook, which then places
them with Koordinator's rules and kubelet's static policy for the other pods.

The fixture: 2 sockets of 12 cores of 2 threads, CPU n's sibling is n+24; socket 0 holds
CPUs 0-11 and 24-35 (NUMA node 0), socket 1 holds 12-23 and 36-47.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.hooks.cpus import take_cpus
from crihook.hooks.node import Topology, format_cpu_list, parse_cpu_list
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import GIB, MachineSpec

MACHINE_48 = MachineSpec(
    sockets=2, cores_per_socket=12, threads_per_core=2, memory_per_numa=64 * GIB
)
NODE_MEMORY = 128 * GIB
MIB = 1 << 20
QOS = "koordinator.sh/qosClass"
STATUS = "scheduling.koordinator.sh/resource-status"
SPEC = "node.koordinator.sh/extended-resource-spec"
BATCH = {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"},
    "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "2Gi"},
}
INSTEAD = ("koordinator,numa,oom", "")
ALONGSIDE = ("cpuset,koordinator,numa,oom", '[hooks.koordinator]\ncpu_manager = "cpuset"\n')


@dataclass
class Pod:
    spec: PodSpec
    sandbox: str
    containers: dict[str, str]
    """Container name → id."""


@dataclass
class Node:
    topology: Topology
    runtime: MemoryRuntime
    proc: CrihookProcess
    stub: api_pb2_grpc.RuntimeServiceStub
    alongside: bool

    def run(self, spec: PodSpec) -> Pod:
        request = api_pb2.RunPodSandboxRequest(config=sandbox_config(spec))
        sandbox = self.stub.RunPodSandbox(request, timeout=60).pod_sandbox_id
        pod = Pod(spec, sandbox, {})
        for container in spec.containers:
            create = api_pb2.CreateContainerRequest(
                pod_sandbox_id=sandbox,
                config=container_config(spec, container, node_memory=NODE_MEMORY),
                sandbox_config=sandbox_config(spec),
            )
            cid = self.stub.CreateContainer(create, timeout=60).container_id
            self.stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)
            pod.containers[container.name] = cid
        return pod

    def remove(self, pod: Pod) -> None:
        """As kubelet tears a pod down: containers stopped and removed, then the sandbox."""
        for cid in pod.containers.values():
            self.stub.StopContainer(api_pb2.StopContainerRequest(container_id=cid), timeout=60)
            self.stub.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=cid), timeout=60)
        self.stub.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox))
        self.stub.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox))

    def cpus(self, pod: Pod, name: str | None = None) -> frozenset[int]:
        cid = pod.containers[name] if name else next(iter(pod.containers.values()))
        return parse_cpu_list(self.runtime.cpuset_of(cid))

    def resources(self, pod: Pod) -> api_pb2.LinuxContainerResources:
        return self.runtime.containers[next(iter(pod.containers.values()))].resources

    def updates(self, pod: Pod) -> int:
        return len(self.runtime.containers[next(iter(pod.containers.values()))].updates)

    def sandbox_resources(self, pod: Pod) -> api_pb2.LinuxContainerResources:
        return self.runtime.pods[pod.sandbox].config.linux.resources

    def ledger_state(self, until: Callable[[dict[str, Any]], bool] = bool) -> dict[str, Any]:
        """The CPU ledger on disk once `until` holds for it: reservations are written ahead,
        what post stages change (a container's CPUs given back) behind the answer."""
        name = "cpuset" if self.alongside else "koordinator"
        wait_for(lambda: until(self.proc.hook_state(name)), PATIENCE, f"{name}'s state written")
        return self.proc.hook_state(name)


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    hooks, config = request.param
    with crihook_on_fixture(short_tmpdir("kf-"), MACHINE_48, config=config, hooks=hooks) as m:
        yield Node(m.topology, m.runtime, m.proc, m.stub, "cpuset," in hooks)


MODES = [
    pytest.param(INSTEAD, id="instead-of-cpuset"),
    pytest.param(ALONGSIDE, id="alongside-cpuset"),
]


# --- pods as Koordinator leaves them ------------------------------------------------------------


def ls_pod(name: str) -> PodSpec:
    app = ContainerSpec("app", cpu_request=500, cpu_limit=2000, memory_request=256 * MIB)
    return PodSpec(name, labels={QOS: "LS"}, containers=[app])


def be_pod(name: str, batch: object = None) -> PodSpec:
    """A BE pod: BestEffort for kubelet, its batch resources in the annotation."""
    spec = json.dumps({"containers": {"job": BATCH}}) if batch is None else str(batch)
    return PodSpec(
        name, labels={QOS: "BE"}, annotations={SPEC: spec}, containers=[ContainerSpec("job")]
    )


def scheduled_pod(name: str, cpus: str, qos: str = "LSR") -> PodSpec:
    count = len(parse_cpu_list(cpus))
    app = ContainerSpec(
        "app",
        cpu_request=count * 1000,
        cpu_limit=count * 1000,
        memory_request=GIB,
        memory_limit=GIB,
    )
    annotations = {STATUS: json.dumps({"cpuset": cpus})}
    return PodSpec(name, labels={QOS: qos}, annotations=annotations, containers=[app])


def guaranteed_pod(name: str, cpus: int) -> PodSpec:
    app = ContainerSpec(
        "app", cpu_request=cpus * 1000, cpu_limit=cpus * 1000, memory_request=GIB, memory_limit=GIB
    )
    return PodSpec(name, containers=[app])


LSR_CPUS = ("0-1,24-25", "2-5,26-29", "12-13,36-37")
LSE_CPUS = "14-15,38-39"


# --- the workload ---------------------------------------------------------------------------------


@pytest.mark.parametrize("node", MODES, indirect=True)
def test_a_mixed_lsr_ls_be_workload_on_48_cpus(node: Node) -> None:
    online = node.topology.online
    assert len(online) == 48
    ls = [node.run(ls_pod(f"ls-{i}")) for i in range(2)]
    be = [node.run(be_pod(f"be-{i}")) for i in range(2)]
    lsr = [node.run(scheduled_pod(f"lsr-{i}", cpus)) for i, cpus in enumerate(LSR_CPUS)]
    held = [node.cpus(p) for p in lsr]
    assert held == [parse_cpu_list(c) for c in LSR_CPUS]
    lsr_cpus = frozenset().union(*held)
    assert len(lsr_cpus) == sum(len(c) for c in held)  # disjoint
    for i, cpus in enumerate(held):
        assert node.resources(lsr[i]).cpu_quota == -1  # no CFS quota on its own CPUs
        sandbox = node.sandbox_resources(lsr[i])  # the pod sandbox got them too
        assert (parse_cpu_list(sandbox.cpuset_cpus), sandbox.cpu_quota) == (cpus, -1)

    # A plain Guaranteed pod: kubelet's static pick, from what the scheduler left, when the
    # cpuset hook is in the chain (Koordinator's "K8s Guaranteed"); the LS pool when
    # Koordinator's rules alone place CPUs (kubelet's `none` policy).
    free = online - lsr_cpus
    exclusive = take_cpus(node.topology, free, 4) if node.alongside else frozenset()
    plain = node.run(guaranteed_pod("plain", 4))
    assert node.cpus(plain) == (exclusive or free)
    node.proc.updates_sent()  # the pools move after kubelet's answers

    # LS pods on the share pool (every CPU but LSR/LSE and exclusive ones), BE pods on the BE
    # pool (LSR CPUs included), all moved as each LSR pod arrived.
    for p in ls:
        assert node.cpus(p) == online - lsr_cpus - exclusive
    for p in be:
        assert node.cpus(p) == online - exclusive
        res = node.resources(p)
        assert (res.cpu_shares, res.cpu_quota, res.cpu_period) == (512, 100_000, 100_000)
        assert res.memory_limit_in_bytes == 2 * GIB
        pod_res = node.sandbox_resources(p)
        assert (pod_res.cpu_shares, pod_res.cpu_quota, pod_res.memory_limit_in_bytes) == (
            512,
            100_000,
            2 * GIB,
        )
    # An LSE pod: its CPUs leave both pools.
    lse = node.run(scheduled_pod("lse", LSE_CPUS, qos="LSE"))
    lse_cpus = parse_cpu_list(LSE_CPUS)
    assert node.cpus(lse) == lse_cpus
    node.proc.updates_sent()
    for p in ls:
        assert node.cpus(p) == online - lsr_cpus - exclusive - lse_cpus
    for p in be:
        assert node.cpus(p) == online - exclusive - lse_cpus

    # Another pod claiming LSE CPUs is refused, naming both.
    with pytest.raises(grpc.RpcError) as info:
        node.run(scheduled_pod("greedy", "15,39", qos="LSE"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "default/greedy" in info.value.details() and "default/lse" in info.value.details()

    # Pods go: an LSR pod's CPUs return to the LS pool (BE pods had them all along, and get no
    # update), the LSE pod's to both.
    node.proc.updates_sent()
    be_updates = node.updates(be[0])
    node.remove(lsr[0])
    gone = parse_cpu_list(LSR_CPUS[0])
    node.proc.updates_sent()  # sent after kubelet's answers (updates = "after-answer")
    for p in ls:
        assert node.cpus(p) == online - (lsr_cpus - gone) - exclusive - lse_cpus
    assert node.updates(be[0]) == be_updates
    node.remove(lse)
    node.proc.updates_sent()
    for p in be:
        assert node.cpus(p) == online - exclusive
    for p in ls:
        assert node.cpus(p) == online - (lsr_cpus - gone) - exclusive

    # kubelet re-sends a BE container's BestEffort resources: the batch values and the pool stay.
    job = be[1].containers["job"]
    kubelet = api_pb2.LinuxContainerResources(cpu_shares=2, cpu_period=100_000)
    node.stub.UpdateContainerResources(
        api_pb2.UpdateContainerResourcesRequest(container_id=job, linux=kubelet), timeout=60
    )
    res = node.runtime.containers[job].resources
    assert (res.cpu_shares, res.cpu_quota, res.memory_limit_in_bytes) == (512, 100_000, 2 * GIB)
    assert parse_cpu_list(res.cpuset_cpus) == online - exclusive

    # The ledger on disk: each LSR pod holds its CPUs; the containers of the pools (BE and
    # LS, which followed the pools above) hold none and are not written: a restart adopts
    # them from the runtime.
    def holders(state: dict[str, Any]) -> dict[str, frozenset[int]]:
        return {
            v["pod_name"]: parse_cpu_list(v["cpus"]) for v in state.values() if v.get("scheduled")
        }

    want = {"default/lsr-1": held[1], "default/lsr-2": held[2]}
    state = node.ledger_state(lambda s: holders(s) == want)
    assert all(parse_cpu_list(v["cpus"]) for v in state.values())
    assert not {v["pod"] for v in state.values()} & {p.sandbox for p in be + ls}


@pytest.mark.parametrize("node", [pytest.param(INSTEAD, id="instead-of-cpuset")], indirect=True)
def test_malformed_annotations_are_invalid_arguments_naming_them(node: Node) -> None:
    with pytest.raises(grpc.RpcError) as info:
        node.run(
            be_pod(
                "bad-spec",
                batch='{"containers": {"job": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}',
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert SPEC in info.value.details() and "default/bad-spec" in info.value.details()
    bad = scheduled_pod("bad-status", "0-1")
    bad.annotations[STATUS] = '{"cpuset": 1}'
    with pytest.raises(grpc.RpcError) as info:
        node.run(bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert STATUS in info.value.details()


@pytest.mark.parametrize("node", [pytest.param(INSTEAD, id="instead-of-cpuset")], indirect=True)
def test_a_restart_keeps_the_pools(node: Node) -> None:
    online = node.topology.online
    lsr = node.run(scheduled_pod("lsr", "6-7,30-31"))
    ls = node.run(ls_pod("ls"))
    be = node.run(be_pod("be"))
    before = node.ledger_state(lambda s: [k[:2] for k in s] == ["c:"])  # the LSR pod's CPUs
    node.proc.stop()
    node.proc.start()
    assert node.ledger_state() == before
    # Counted after the restart: a new LS pod starts on the same pool, the LSR pod's removal
    # still gives its CPUs back to the pods that were running.
    with grpc.insecure_channel(node.proc.endpoint) as channel:
        node.stub = api_pb2_grpc.RuntimeServiceStub(channel)
        later = node.run(ls_pod("later"))
        node.proc.updates_sent()
        assert node.cpus(later) == node.cpus(ls) == online - {6, 7, 30, 31}
        node.remove(lsr)
        node.proc.updates_sent()
        assert node.cpus(ls) == node.cpus(later) == online
        assert node.cpus(be) == online
    assert format_cpu_list(online) == "0-47"
