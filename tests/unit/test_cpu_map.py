"""`crihook state --cpus` on the sysfs fixtures of big machines: the picture says, CPU by CPU,
what the hooks' states say; it fits 100 columns; `--json` says the same; colour only where
asked for.

The states are written in the hooks' own formats (`Holder`, `Bubble`, `Allocation` and the
numa hook's memory entries), as the hooks persist them.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.cpus.pool import Bubble, Holder
from crihook.hooks.devices.pools import Allocation
from crihook.hooks.node import Topology, format_cpu_list, read_topology
from crihook.proxy.cli import main
from crihook.proxy.ops.cpu_map import MORE, CpuMap, MapError, build_map, load_map
from crihook.proxy.ops.cpu_map_cli import show_map
from crihook.proxy.ops.cpu_map_text import render_map, use_colour
from crihook.proxy.ops.state_cli import STALE_SECONDS
from tests.lab.map_reading import drawn
from tests.lab.sysfs import (
    EPYC_256_8NUMA,
    GIB,
    NAMED_SPECS,
    OFFLINE_CPUS,
    MachineSpec,
    write_sysfs,
)

NOW = 1_800_000_000.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


_TREES: dict[str, Topology] = {}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the fixture trees of this module go: written once each (a 256-CPU tree is
    thousands of files)."""
    yield tmp_path_factory.mktemp("sysfs")
    _TREES.clear()


def topology(root: Path, spec: MachineSpec) -> Topology:
    key = repr(spec)
    if key not in _TREES:
        _TREES[key] = read_topology(write_sysfs(root / f"m{len(_TREES)}", spec))
    return _TREES[key]


def node_doc(
    topo: Topology,
    reserved: str = "",
    *,
    strict: bool = False,
    cpus: bool = True,
    pools: Iterable[tuple[str, str, int | None]] = (),
) -> dict[str, Any]:
    return {
        "format": 1,
        "crihook": "0.1.0",
        "topology": topo.to_dict(),
        "cpus": (
            {"hook": "cpuset", "reserved": reserved, "strict_reservation": strict, "static": True}
            if cpus
            else None
        ),
        "memory": {"hook": "numa", "reserved": {"0": {"memory": 100 << 20}}},
        "device_pools": [{"pool": p, "id": i, "numa": n, "paths": []} for p, i, n in pools],
    }


class Node:
    """A state dir's documents, put together the way crihook writes them."""

    def __init__(self) -> None:
        self.pods: dict[str, Any] = {}
        self.containers: dict[str, Any] = {}
        self.cpuset: dict[str, Any] = {}
        self.numa: dict[str, Any] = {"memory": {"version": 1, "entries": {}}, "owners": {}}
        self.devices: dict[str, Any] = {}
        self.status: dict[str, Any] | None = {
            "version": "0.1.0",
            "running": True,
            "updated_at": NOW,
            "stopped_at": None,
        }

    def pod(self, pod_id: str, name: str, qos: str = "Guaranteed") -> None:
        view = {"id": pod_id, "uid": f"uid-{pod_id}", "name": name, "namespace": "default"}
        self.pods[pod_id] = {"view": {**view, "qos_class": qos}, "audit": {}}

    def container(
        self,
        cid: str,
        pod_id: str,
        name: str = "app",
        cpus: str = "",
        memory: Mapping[int, int] | None = None,
        devices: Mapping[str, list[str]] | None = None,
        state: str = "running",
    ) -> None:
        view = {"id": cid, "pod_id": pod_id, "name": name}
        self.containers[cid] = {"view": view, "audit": {}, "state": state}
        if cpus:
            holder = Holder(pod=pod_id, name=name, cpus=frozenset(_cpus(cpus)))
            self.cpuset[f"c:{cid}"] = holder.to_dict()
        if memory:
            blocks = [{"numaAffinity": [n], "type": "memory", "size": s} for n, s in memory.items()]
            self.numa["memory"]["entries"].setdefault(pod_id, {})[name] = blocks
            self.numa["owners"][cid] = [pod_id, name]
        if devices:
            allocation = Allocation(pod_id, name, {p: tuple(i) for p, i in devices.items()}, [cid])
            self.devices[f"a:{pod_id}/{name}"] = allocation.to_dict()

    def state(self) -> dict[str, Any]:
        hooks = {"cpuset": self.cpuset, "numa": self.numa, "devices": self.devices}
        return {
            "status": self.status,
            "pods": self.pods,
            "containers": self.containers,
            "hook_states": hooks,
        }


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        out |= set(range(int(first), int(last or first) + 1))
    return out


def busy_epyc(trees: Path) -> tuple[Topology, Node]:
    """The 256-CPU, 8-NUMA-node fixture with holders on both sockets and several nodes."""
    topo = topology(trees, EPYC_256_8NUMA)
    node = Node()
    placements = [
        ("db", "1-2,129-130", {0: GIB}),  # NUMA 0, two whole cores
        ("trainer", "16-23,144-151", {1: 8 * GIB}),  # all of one L3 on NUMA 1
        ("cache", "64,192", {4: GIB // 2}),  # socket 1
        ("odd", "127", {7: GIB}),  # a single thread, the last core
    ]
    for i, (name, cpus, memory) in enumerate(placements):
        node.pod(f"p{i}", name)
        node.container(f"c{i}", f"p{i}", cpus=cpus, memory=memory)
    node.pod("pb", "batch", "BestEffort")
    node.container("cb", "pb")
    node.pod("pg", "gpu-job", "Burstable")
    node.container("cg", "pg", name="train", devices={"gpu": ["1"]})
    return topo, node


def test_each_cpu_is_drawn_as_the_hooks_hold_it_on_256_cpus_and_8_numa_nodes(
    trees: Path,
) -> None:
    topo, node = busy_epyc(trees)
    doc = node_doc(topo, "0,128", pools=[("gpu", str(i), 2 * i) for i in range(4)])
    cpu_map = build_map(node.state(), doc)
    text = render_map(cpu_map)

    holders = {h.label: h for h in cpu_map.holdings}
    assert [h.glyph for h in cpu_map.holdings] == ["A", "B", "C", "D", "E"]
    expected = dict.fromkeys(topo.online, ".")
    expected |= {0: "#", 128: "#"}
    for label, glyph, cpus in [
        ("default/db/app", "A", "1-2,129-130"),
        ("default/trainer/app", "B", "16-23,144-151"),
        ("default/cache/app", "C", "64,192"),
        ("default/odd/app", "D", "127"),
    ]:
        assert holders[label].glyph == glyph
        expected |= dict.fromkeys(_cpus(cpus), glyph)
    assert drawn(text) == expected
    assert max(len(line) for line in text.splitlines()) <= 100, text
    # The list says who, what and where; the pools whose devices are held, by whom.
    assert re.search(
        r"A  default/db/app\s+Guaranteed  4 CPUs 1-2,129-130\s+memory 1 GiB on NUMA 0", text
    )
    assert "E  default/gpu-job/train  Burstable   shared pool" in text
    assert (
        "gpu  NUMA 0: 0=free   NUMA 2: 1=E   NUMA 4: 2=free   NUMA 6: 3=free   (3 of 4 free)"
        in text
    )
    # 256 - 2 reserved - 23 held; NUMA 0 holds 32 CPUs, of which 2 reserved and 4 held.
    assert "231 free for exclusive use" in " ".join(text.split())
    assert "NUMA 0  free: 26/32 CPUs" in text
    assert cpu_map.shared_containers == 2  # batch and the gpu job run on the shared pool


def test_the_memory_a_container_holds_is_taken_from_its_numa_node(trees: Path) -> None:
    topo, node = busy_epyc(trees)
    cpu_map = build_map(node.state(), node_doc(topo, "0"))
    free = {(m.node, m.resource): m for m in cpu_map.memory}
    allocatable = free[(2, "memory")].allocatable
    assert free[(1, "memory")].assigned == 8 * GIB
    assert free[(1, "memory")].free == free[(1, "memory")].allocatable - 8 * GIB
    assert free[(2, "memory")].free == allocatable and free[(2, "memory")].assigned == 0


@pytest.mark.parametrize("name", sorted(NAMED_SPECS))
def test_every_fixture_machine_fits_100_columns_with_more_holders_than_letters(
    trees: Path, name: str
) -> None:
    spec = NAMED_SPECS[name]
    topo = topology(trees, spec)
    node = Node()
    cpus = sorted(topo.online)[1:]
    for i, cpu in enumerate(cpus[:70]):  # one CPU each: past z the holders share `+`
        node.pod(f"p{i}", f"pod-with-a-long-name-{i}")
        node.container(f"c{i}", f"p{i}", cpus=str(cpu), memory={topo.cpus[cpu].numa: GIB // 4})
    cpu_map = build_map(node.state(), node_doc(topo, str(cpus[0] - 1)))
    text = render_map(cpu_map)
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= 100, text
    cells = drawn(text) if spec.offline == frozenset() else {}
    if cells:
        assert set(cells) == set(topo.online)
    if len(cpus) > 52:
        assert MORE in text and "held by a holder past z" in " ".join(text.split())


def test_a_node_wider_than_a_line_is_cut_into_row_blocks(trees: Path) -> None:
    """128 cores on one NUMA node (a one-socket, NPS1 machine): the rows are cut where the
    L3 groups end, every CPU is drawn once, and nothing is wider than 100 columns."""
    spec = MachineSpec(sockets=1, cores_per_socket=128, threads_per_core=2, l3_cores=8)
    topo = topology(trees, spec)
    cpu_map = build_map(Node().state(), node_doc(topo, "0"))
    text = render_map(cpu_map)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert drawn(text) == {**dict.fromkeys(topo.online, "."), 0: "#"}
    assert "     0-39  # . . . . . . .  . . . . . . . ." in text  # 5 L3s of 8 cores a row


def test_offline_cpus_are_named_and_a_lone_thread_leaves_a_gap(trees: Path) -> None:
    topo = topology(trees, OFFLINE_CPUS)  # 3 and 19 (all of core 3) and 28 offline
    text = render_map(build_map(Node().state(), node_doc(topo, "")))
    assert "offline 3,19,28" in text
    assert "24..31  . . . . - . . ." in text  # core 12 has CPU 12 only
    assert "- thread offline" in text


def test_strict_reservation_keeps_the_reserved_cpus_out_of_the_shared_pool(trees: Path) -> None:
    topo = topology(trees, EPYC_256_8NUMA)
    cpu_map = build_map(Node().state(), node_doc(topo, "0,128", strict=True))
    assert cpu_map.shared == topo.online - {0, 128}
    assert cpu_map.use(0) == "reserved"
    text = " ".join(render_map(cpu_map).split())
    assert "reserved 0,128 kept out (strict-cpu-reservation)" in text
    assert "# reserved (no container runs there)" in text


def test_a_pods_own_cpus_and_a_reservation_in_flight(trees: Path) -> None:
    """`topology_scope = "pod"`: the pod's bubble is its holder, its exclusive container a
    holder of a slice of it; a CreateContainer the runtime has not answered holds its CPUs."""
    topo = topology(trees, EPYC_256_8NUMA)
    node = Node()
    node.pod("pod-b", "bubbly")
    node.cpuset["b:pod-b"] = Bubble("uid-pod-b", frozenset(range(4, 8))).to_dict()
    node.container("cx", "pod-b", cpus="4-5")
    node.cpuset["c:cx"] = Holder("pod-b", "app", cpus=frozenset({4, 5}), in_bubble=True).to_dict()
    node.pod("pod-n", "new")
    node.cpuset["r:pod-n/app/0"] = Holder("pod-n", "app", cpus=frozenset({9})).to_dict()
    cpu_map = build_map(node.state(), node_doc(topo, "0"))
    by_label = {h.label: h for h in cpu_map.holdings}
    pod = by_label["default/bubbly (pod)"]
    app = by_label["default/bubbly/app"]
    new = by_label["default/new/app"]
    assert {c: cpu_map.owners[c].glyph for c in (4, 5, 6, 7, 9)} == {
        4: app.glyph,
        5: app.glyph,
        6: pod.glyph,
        7: pod.glyph,
        9: new.glyph,
    }
    assert new.state == "being created"
    assert "default/new/app (being created)" in render_map(cpu_map)
    assert cpu_map.shared == topo.online - set(range(4, 8)) - {9}


def test_json_is_the_same_map(trees: Path) -> None:
    topo, node = busy_epyc(trees)
    cpu_map = build_map(node.state(), node_doc(topo, "0,128", pools=[("gpu", "1", 2)]))
    doc = json.loads(json.dumps(cpu_map.to_json()))
    seen = {}
    for socket in doc["sockets"]:
        for numa in socket["numa_nodes"]:
            for core in numa["cores"]:
                for cpu in core["cpus"]:
                    assert topo.cpus[cpu["id"]].socket == socket["id"]
                    assert topo.cpus[cpu["id"]].numa == numa["id"]
                    assert topo.cpus[cpu["id"]].core == core["id"]
                    seen[cpu["id"]] = cpu
    assert set(seen) == set(topo.online)
    assert {c: s["use"] for c, s in seen.items()} == {c: cpu_map.use(c) for c in topo.online}
    assert seen[1]["held_by"] == "A" and "held_by" not in seen[3]
    assert doc["cpus"]["reserved"] == "0,128" and doc["cpus"]["exclusive"] == format_cpu_list(
        cpu_map.owners
    )
    db = doc["holdings"][0]
    assert (db["pod"], db["container"], db["cpus"]) == ("default/db", "app", "1-2,129-130")
    assert db["memory"] == [{"numa": [0], "resource": "memory", "bytes": GIB}]
    assert doc["devices"] == [{"pool": "gpu", "id": "1", "numa": 2, "held_by": "E"}]
    assert doc["running"] is True


def test_without_a_cpu_ledger_every_cpu_is_shared(trees: Path) -> None:
    topo = topology(trees, OFFLINE_CPUS)
    cpu_map = build_map(Node().state(), node_doc(topo, cpus=False))
    assert cpu_map.cpu_hook is None and cpu_map.shared == topo.online
    text = render_map(cpu_map)
    assert "no CPU ledger: containers run where kubelet puts them" in text
    assert "NUMA 0  14 CPUs" in text


def test_a_stopped_crihook_is_said_and_its_last_state_drawn(trees: Path) -> None:
    topo, node = busy_epyc(trees)
    node.status = {"version": "0.1.0", "running": False, "stopped_at": NOW, "updated_at": NOW}
    cpu_map = build_map(node.state(), node_doc(topo, "0"))
    assert not cpu_map.running
    assert cpu_map.status_line.startswith("crihook is not running: it stopped at")
    assert "A  default/db/app" in render_map(cpu_map)


def test_a_running_crihook_whose_status_file_is_old_is_drawn_running(trees: Path) -> None:
    """On a loaded machine status.json can be older than STALE_SECONDS; the lock's holder
    says crihook runs, as `crihook state` has it."""
    topo, node = busy_epyc(trees)
    assert node.status is not None
    node.status["updated_at"] = time.time() - 10 * STALE_SECONDS
    state = {**node.state(), "process": {"pid": 4242}}
    cpu_map = build_map(state, node_doc(topo, "0"))
    assert (cpu_map.running, cpu_map.status_line) == (True, "running")
    gone = build_map({**state, "process": {"pid": None}}, node_doc(topo, "0"))
    assert not gone.running
    assert gone.status_line.startswith("crihook is not running: no process holds")


def test_the_state_dir_without_node_json_is_drawn_on_this_machine(tmp_path: Path) -> None:
    """A state dir an older crihook wrote: the topology comes from --sysfs-root's tree, and
    the map says that reserved CPUs are not known."""
    spec_root = write_sysfs(tmp_path / "sys", OFFLINE_CPUS)
    state = tmp_path / "state"
    (state / "hooks").mkdir(parents=True)
    (state / "hooks" / "cpuset.json").write_text(
        json.dumps({"c:c1": Holder("p1", "app", cpus=frozenset({1})).to_dict()})
    )
    cpu_map = load_map(state, spec_root)
    assert cpu_map.owners[1].pod == "p1"
    assert "no node.json in the state dir" in render_map(cpu_map)
    with pytest.raises(MapError, match=r"no .*node\.json, and this machine's topology"):
        load_map(state, tmp_path / "nowhere")


def test_the_command_reads_the_state_dir(
    trees: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo, node = busy_epyc(trees)
    state = tmp_path / "state"
    (state / "hooks").mkdir(parents=True)
    docs = node.state()
    (state / "node.json").write_text(json.dumps(node_doc(topo, "0,128")))
    (state / "store.json").write_text(
        json.dumps({"version": 1, "pods": docs["pods"], "containers": docs["containers"]})
    )
    for name, hook in docs["hook_states"].items():
        (state / "hooks" / f"{name}.json").write_text(json.dumps(hook))
    assert main(["state", "--cpus", "--state-dir", str(state)]) == 0
    text = capsys.readouterr().out
    assert "A  default/db/app" in text and "\x1b[" not in text  # not a terminal: no colour
    assert main(["state", "--cpus", "--json", "--state-dir", str(state)]) == 0
    assert json.loads(capsys.readouterr().out)["cpus"]["reserved"] == "0,128"
    assert main(["state", "--cpus", "--state-dir", str(tmp_path / "none")]) == 1


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "env", "colour"),
    [
        (Tty(), {}, True),
        (io.StringIO(), {}, False),
        (Tty(), {"NO_COLOR": "1"}, False),
        (Tty(), {"NO_COLOR": ""}, True),  # no-color.org: set to something non-empty
        (Tty(), {"TERM": "dumb"}, False),
    ],
    ids=["terminal", "pipe", "NO_COLOR", "empty NO_COLOR", "dumb terminal"],
)
def test_colour_only_on_a_terminal(stream: io.StringIO, env: dict[str, str], colour: bool) -> None:
    assert use_colour(stream, env) is colour


def test_the_command_colours_a_terminal_unless_no_color(
    trees: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo, node = busy_epyc(trees)
    state = tmp_path / "state"
    (state / "hooks").mkdir(parents=True)
    (state / "node.json").write_text(json.dumps(node_doc(topo, "0,128")))
    (state / "hooks" / "cpuset.json").write_text(json.dumps(node.state()["hook_states"]["cpuset"]))
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    terminal = Tty()
    assert show_map(state, False, terminal) == 0
    assert "\x1b[" in terminal.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = Tty()
    assert show_map(state, False, plain) == 0
    assert "\x1b[" not in plain.getvalue()
    assert plain.getvalue() == ANSI.sub("", terminal.getvalue())


def test_colour_changes_no_character(trees: Path) -> None:
    topo, node = busy_epyc(trees)
    cpu_map: CpuMap = build_map(node.state(), node_doc(topo, "0,128", pools=[("gpu", "1", 2)]))
    coloured = render_map(cpu_map, colour=True)
    assert "\x1b[" in coloured
    assert ANSI.sub("", coloured) == render_map(cpu_map)
