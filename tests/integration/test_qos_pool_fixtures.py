"""`[hooks.cpuset] shared_pool_in = "qos-cgroups"` through a real crihook process: the memory
runtime behind it, a sysfs fixture, and a fake cgroup v2 tree (`--cgroup-root`) with the QoS
cgroups kubelet makes. The shared pool is read back from the tree's `cpuset.cpus` files and
the runtime says which containers were updated."""

from __future__ import annotations

from pathlib import Path

import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.hooks.node import cgroup_version, parse_cpu_list
from crihook.proxy.chain.local_hooks import host_problems
from crihook.proxy.config import HookSettings
from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.fake_cgroup_tree import QOS_PATHS, qos_cpus, write_qos_tree, write_v1_tree
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import DUAL_SOCKET_SMT2_2NUMA, GIB

QOS_CONFIG = '[hooks.cpuset]\nreserved_cpus = "0"\nshared_pool_in = "qos-cgroups"\n'
BURSTABLE, BESTEFFORT = QOS_PATHS["cgroupfs"]


def _pod(
    stub: api_pb2_grpc.RuntimeServiceStub, name: str, milli: int | None, guaranteed: bool = False
) -> tuple[str, str]:
    container = ContainerSpec(
        name="app",
        cpu_request=milli,
        cpu_limit=milli if guaranteed else None,
        memory_request=GIB if milli else None,
        memory_limit=GIB if guaranteed else None,
    )
    spec = PodSpec(name=name, containers=[container])
    config = sandbox_config(spec)
    sandbox = stub.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=60)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox.pod_sandbox_id,
        config=container_config(spec, container, node_memory=256 * GIB),
        sandbox_config=config,
    )
    cid = stub.CreateContainer(request, timeout=60).container_id
    stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)
    return sandbox.pod_sandbox_id, cid


def test_the_pool_is_held_in_the_qos_cgroups() -> None:
    workdir = short_tmpdir("qp-")
    root = write_qos_tree(workdir / "cgroup")
    with crihook_on_fixture(
        workdir,
        DUAL_SOCKET_SMT2_2NUMA,
        config=QOS_CONFIG,
        hooks="cpuset,numa,oom",
        args=["--cgroup-root", str(root)],
    ) as node:
        online = node.topology.online
        # Written at start, before crihook answered its first call.
        assert qos_cpus(root, BURSTABLE) == online
        assert qos_cpus(root, BESTEFFORT) == online
        _, burstable = _pod(node.stub, "b", 100)
        _, besteffort = _pod(node.stub, "e", None)
        _, half = _pod(node.stub, "h", 500, guaranteed=True)  # in kubepods: its own cpuset
        assert node.runtime.cpuset_of(burstable) == ""
        assert node.runtime.cpuset_of(besteffort) == ""
        assert node.runtime.cpuset_of(half) != ""

        _, pinned = _pod(node.stub, "g", 4000, guaranteed=True)
        exclusive = parse_cpu_list(node.runtime.cpuset_of(pinned))
        assert len(exclusive) == 4
        # Narrowed before CreateContainer was answered: no waiting here.
        assert qos_cpus(root, BURSTABLE) == online - exclusive
        assert qos_cpus(root, BESTEFFORT) == online - exclusive
        node.proc.updates_sent()
        assert node.runtime.containers[burstable].updates == []
        assert node.runtime.containers[besteffort].updates == []
        assert len(node.runtime.containers[half].updates) == 1  # still per container

        node.stub.StopContainer(api_pb2.StopContainerRequest(container_id=pinned), timeout=60)
        node.stub.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=pinned), timeout=60)
        assert qos_cpus(root, BURSTABLE) == online
        assert qos_cpus(root, BESTEFFORT) == online
        assert node.runtime.containers[burstable].updates == []

        # A restart writes the pool again from the ledger (an operator reset it meanwhile).
        _, pinned = _pod(node.stub, "g2", 2000, guaranteed=True)
        assert node.proc.stop() == 0
        (root / BURSTABLE / "cpuset.cpus").write_text("")
        node.proc.start()
        held = parse_cpu_list(node.runtime.cpuset_of(pinned))
        assert qos_cpus(root, BURSTABLE) == online - held


@pytest.mark.parametrize("host", ["fake v1 tree", "this host"])
def test_crihook_refuses_qos_cgroups_on_cgroup_v1(host: str) -> None:
    workdir = short_tmpdir("qp1-")
    if host == "this host":
        root = Path("/sys/fs/cgroup")
        if cgroup_version(root) == 2:
            # Nothing to refuse on a v2 host; crihook is not served on its real QoS cgroups.
            hooks = [HookSettings(name="20-cpuset", options={"shared_pool_in": "qos-cgroups"})]
            assert host_problems(hooks, root) == []
            return
    else:
        root = write_v1_tree(workdir / "cgroup")
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    proc = CrihookProcess(
        runtime.endpoint,
        workdir=workdir,
        config=QOS_CONFIG,
        hooks="cpuset",
        args=["--cgroup-root", str(root)],
    )
    try:
        proc.start(wait=False)
        assert proc.proc is not None
        assert proc.proc.wait(60) == 2
        assert "[hooks.cpuset] shared_pool_in" in proc.log()
        assert "cgroup v1" in proc.log()
        assert not proc.socket_path.exists()
        assert runtime.calls("RunPodSandbox") == []
    finally:
        proc.kill()
        runtime.stop()
