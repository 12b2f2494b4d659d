"""Pooled devices aligned with CPUs and memory by the topology policy, on a machine this VM is
not: a real crihook (cpuset, numa, devices) reads a sysfs fixture of a 4-NUMA-node machine
and fronts the stateful fake runtime. The pool's device nodes are made by the test (mknod in a
temp dir: crihook reads their type and numbers when a container asks)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import grpc
import pytest

from crihook.hooks.node import parse_cpu_list
from tests.integration.test_resource_hooks_fixtures import Node
from tests.lab.crihook_proc import PATIENCE, short_tmpdir, wait_for
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.lab.sysfs import DUAL_SOCKET_SMT2_4NUMA, GIB


@pytest.fixture
def gpu_node() -> Iterator[Node]:
    """4 NUMA nodes of 20 CPUs; a pool `gpu` of one device per NUMA node (ids 0-3);
    single-numa-node policy."""
    workdir = short_tmpdir("dn-")
    dev = workdir / "dev"
    dev.mkdir()
    for i in range(4):
        os.mknod(dev / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 7))  # S_IFCHR, /dev/full's
    gpus = ", ".join(f'{{ id = "{i}", path = "{dev}/gpu{i}", numa = {i} }}' for i in range(4))
    config = (
        '[node]\ntopology_policy = "single-numa-node"\n'
        f'[hooks.devices]\nnamespaces = ["default"]\n'
        f'[hooks.devices.pools.gpu]\nenv = "GPU_VISIBLE_DEVICES"\ndevices = [{gpus}]\n'
    )
    hooks = "cpuset,numa,devices"
    with crihook_on_fixture(workdir, DUAL_SOCKET_SMT2_4NUMA, config=config, hooks=hooks) as m:
        yield Node(m.topology, m.runtime, m.proc, m.stub)


def gpu_pod(node: Node, name: str, gpus: int, cpus: int | None = None) -> str:
    """A pod of one container `app` asking for `gpus` pooled devices; Guaranteed with `cpus`
    whole CPUs (4 GiB), or Burstable. Returns the container id."""
    milli = cpus * 1000 if cpus else None
    app = ContainerSpec(
        name="app",
        cpu_request=milli or 100,
        cpu_limit=milli,
        memory_request=4 * GIB,
        memory_limit=4 * GIB if cpus else None,
    )
    spec = PodSpec(
        name=name,
        containers=[app],
        annotations={"pools.crihook.io/container.app": json.dumps({"gpu": gpus})},
    )
    return node.create(spec, node.run_pod(spec), app)


def gpus_of(node: Node, cid: str) -> str:
    config = node.runtime.containers[cid].config
    env = {e.key: e.value.decode() for e in config.envs}
    devices = [d.host_path.rsplit("/", 1)[-1] for d in config.devices]
    assert devices == [f"gpu{i}" for i in env["GPU_VISIBLE_DEVICES"].split(",")]
    return env["GPU_VISIBLE_DEVICES"]


def test_cpus_memory_and_pooled_devices_land_on_one_numa_node(gpu_node: Node) -> None:
    node = gpu_node
    topo = node.topology
    # A Burstable pod takes a GPU: the first node's (no CPUs of its own to align).
    assert gpus_of(node, gpu_pod(node, "burstable", 1)) == "0"
    # Guaranteed with a GPU: CPUs, memory and the GPU on one node, one with a free GPU.
    small = gpu_pod(node, "small", 1, cpus=4)
    assert gpus_of(node, small) == "1"
    assert topo.numa_of(node.cpus(small)) == {1}
    assert parse_cpu_list(node.runtime.mems_of(small)) == {1}
    # 16 CPUs would still fit on node 1, but its GPU is taken: all of it goes to node 2.
    big = gpu_pod(node, "big", 1, cpus=16)
    assert gpus_of(node, big) == "2"
    assert topo.numa_of(node.cpus(big)) == {2} and len(node.cpus(big)) == 16
    assert parse_cpu_list(node.runtime.mems_of(big)) == {2}
    # Two more GPUs: one is left. Refused before anything is held, saying what each could do.
    before = dict(node.runtime.containers)
    with pytest.raises(grpc.RpcError) as info:
        gpu_pod(node, "two", 2, cpus=2)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "single-numa-node" in info.value.details()
    assert "50-devices can place devices/gpu on nowhere" in info.value.details()
    assert node.runtime.containers.keys() == before.keys()

    # What is held is on disk (confirmations are written a fraction of a second later).
    def held() -> list[str]:
        doc = node.hook_state("devices")
        return sorted(v["devices"]["gpu"][0] for k, v in doc.items() if k.startswith("a:"))

    wait_for(lambda: held() == ["0", "1", "2"], PATIENCE, "three holdings written")
    # The last GPU with CPUs that would fit anywhere: node 3, where it is.
    last = gpu_pod(node, "last", 1, cpus=2)
    assert gpus_of(node, last) == "3" and topo.numa_of(node.cpus(last)) == {3}
