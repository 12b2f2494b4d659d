"""What the built-in hooks tell of themselves through the registry (`hooks/builtin.py`,
`hooks/report.py`): every reader it names loads, and where two hooks can give the same part
(the CPU ledger: the cpuset hook's or Koordinator's) the one at the earlier default position
gives it, whatever the `NN-` override. The recording header's device pools and what the host's
files said of them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.builtin import BUILTIN_HOOKS, BUILTIN_ORDER
from crihook.hooks.cpus.pool import Holder
from crihook.hooks.node import LinuxFiles, Topology, read_topology
from crihook.proxy.config import settings_from_toml
from crihook.proxy.ops.cpu_map import build_map
from crihook.proxy.ops.node_doc import node_doc
from crihook.proxy.record.recorder import device_pool_facts
from tests.lab.sysfs import DUAL_SOCKET_SMT2_2NUMA, write_sysfs
from tests.unit.test_cpu_map import Node
from tests.unit.test_cpu_map import node_doc as node_json


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    return read_topology(write_sysfs(tmp_path_factory.mktemp("sys"), DUAL_SOCKET_SMT2_2NUMA))


@pytest.mark.parametrize("name", sorted(BUILTIN_HOOKS))
def test_every_reader_the_registry_names_loads(name: str) -> None:
    builtin = BUILTIN_HOOKS[name]
    readers = [builtin.node_doc_part(), builtin.holdings_reader(), builtin.header_facts()]
    targets = [builtin.node_doc, builtin.holdings, builtin.facts]
    assert [callable(r) for r in readers] == [t is not None for t in targets]


def test_the_readers_are_asked_at_the_default_positions() -> None:
    assert [h.position for h in BUILTIN_ORDER] == sorted(h.position for h in BUILTIN_HOOKS.values())
    names = [h.name for h in BUILTIN_ORDER]
    assert names.index("cpuset") < names.index("koordinator")


def test_the_cpuset_hooks_ledger_wins_over_koordinators_at_any_position(topo: Topology) -> None:
    config = (
        '[hooks]\norder = ["30-cpuset", "25-koordinator"]\n'
        '[hooks.koordinator]\ncpu_manager = "none"\nreserved_cpus = "3"\n'
    )
    doc = node_doc(settings_from_toml(tomllib.loads(config)), topo, now=1.0)
    assert doc["cpus"] == {"hook": "cpuset", "reserved": "", "strict_reservation": False,
                           "static": True}  # fmt: skip


def _ledger_state(hooks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    node = Node()
    node.pod("p1", "db")
    node.container("c1", "p1")
    return {**node.state(), "hook_states": hooks}


def test_the_state_dirs_ledger_is_the_one_node_json_names_or_the_first_hooks(
    topo: Topology,
) -> None:
    held = {"c:c1": Holder("p1", "app", cpus=frozenset({1})).to_dict()}
    other = {"c:c9": Holder("p9", "app", cpus=frozenset({2})).to_dict()}
    koordinator = node_json(topo, "0")
    koordinator["cpus"]["hook"] = "koordinator"
    cases = [
        ({"koordinator": held, "cpuset": other}, None, "cpuset", {2}),
        ({"koordinator": held}, None, "koordinator", {1}),
        ({"cpuset": other, "koordinator": held}, koordinator, "koordinator", {1}),
    ]
    for hooks, node, hook, cpus in cases:
        cpu_map = build_map(_ledger_state(hooks), node, None if node else topo)
        assert (cpu_map.cpu_hook, set(cpu_map.owners)) == (hook, cpus)


def test_the_headers_device_pools_and_what_the_files_said(tmp_path: Path) -> None:
    device = tmp_path / "gpu0"
    device.write_text("")
    config = (
        '[hooks]\norder = ["20-cpuset", "50-devices"]\n[hooks.devices.pools.gpu]\n'
        f'devices = [{{ id = "0", path = "{device}", numa = 0 }}, '
        '{ id = "1", path = "/dev/null", numa = 1 }, { id = "2", path = "/nonexistent/x" }]\n'
    )
    pools, facts = device_pool_facts(settings_from_toml(tomllib.loads(config)), LinuxFiles())
    assert pools == [
        {"pool": "gpu", "id": "0", "numa": 0, "paths": [str(device)]},
        {"pool": "gpu", "id": "1", "numa": 1, "paths": ["/dev/null"]},
        {"pool": "gpu", "id": "2", "numa": None, "paths": ["/nonexistent/x"]},
    ]
    assert [(f.op, f.args, f.result) for f in facts] == [
        ("resolve", [str(device)], str(device)),
        ("device", [str(device)], None),
        ("resolve", ["/dev/null"], "/dev/null"),
        ("device", ["/dev/null"], ["c", 1, 3]),
        ("resolve", ["/nonexistent/x"], None),
    ]
    assert facts[-1].error is not None and facts[-1].error["type"] == "FileNotFoundError"
    assert device_pool_facts(settings_from_toml({}), LinuxFiles()) == ([], [])
