"""node.json (`proxy.ops.node_doc`): what the resource hooks place with, worked out from their
settings by their own functions, on the node's topology."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from crihook.hooks.node import Topology, read_topology
from crihook.proxy.config import settings_from_toml
from crihook.proxy.ops.node_doc import NODE_FILE, node_doc, write_node_doc
from tests.lab.sysfs import DUAL_SOCKET_SMT2_2NUMA, write_sysfs


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    return read_topology(write_sysfs(tmp_path_factory.mktemp("sys"), DUAL_SOCKET_SMT2_2NUMA))


def doc_for(topo: Topology, config: str) -> dict[str, object]:
    return node_doc(settings_from_toml(tomllib.loads(config)), topo, now=1.0)


def test_the_cpuset_hooks_reserved_cpus_are_kubelets_pick(topo: Topology) -> None:
    doc = doc_for(
        topo,
        '[hooks]\norder = ["20-cpuset", "30-numa"]\n[hooks.cpuset]\nreserved_cpus = 2\n'
        '[hooks.cpuset.policy_options]\n"strict-cpu-reservation" = "true"\n'
        '[hooks.numa]\nreserved_memory = { "1" = "1Gi" }\n',
    )
    # 2 CPUs picked as kubelet picks reserved CPUs: one whole core (CPU 0 and its sibling 20).
    assert doc["cpus"] == {
        "hook": "cpuset",
        "reserved": "0,20",
        "strict_reservation": True,
        "static": True,
    }
    assert doc["memory"] == {"hook": "numa", "reserved": {"1": {"memory": 1 << 30}}}
    assert Topology.from_dict(doc["topology"]) == topo  # type: ignore[arg-type]
    assert doc["device_pools"] == [] and doc["written_at"] == 1.0


def test_koordinator_places_cpus_without_a_cpuset_hook(topo: Topology) -> None:
    doc = doc_for(
        topo,
        '[hooks]\norder = ["25-koordinator"]\n[hooks.koordinator]\ncpu_manager = "none"\n'
        'reserved_cpus = "3"\n',
    )
    assert doc["cpus"] == {
        "hook": "koordinator",
        "reserved": "3",
        "strict_reservation": True,
        "static": False,
    }
    assert doc["memory"] is None


def test_settings_that_do_not_fit_the_node_are_named_not_fatal(topo: Topology) -> None:
    doc = doc_for(topo, '[hooks]\norder = ["20-cpuset"]\n[hooks.cpuset]\nreserved_cpus = "99"\n')
    assert doc["cpus"] == {
        "hook": "cpuset",
        "error": "cpuset: reserved_cpus '99' names CPUs that are not online: [99]",
    }


def test_pools_and_no_cpu_hook(topo: Topology, tmp_path: Path) -> None:
    doc = doc_for(
        topo,
        '[hooks]\norder = ["50-devices"]\n[hooks.devices.pools.gpu]\n'
        'devices = [{ id = "0", path = "/dev/nvidia0", numa = 1 }]\n',
    )
    assert doc["cpus"] is None
    assert doc["device_pools"] == [{"pool": "gpu", "id": "0", "numa": 1, "paths": ["/dev/nvidia0"]}]
    write_node_doc(tmp_path, doc)
    assert json.loads((tmp_path / NODE_FILE).read_text()) == doc
