"""The node topology read from sysfs: fixture machines round-tripped, errors, cpulists."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crihook.hooks.node import (
    Topology,
    TopologyError,
    format_cpu_list,
    parse_cpu_list,
    read_topology,
)
from tests.lab.sysfs import (
    DUAL_SOCKET_SMT2_2NUMA,
    DUAL_SOCKET_SMT2_4NUMA,
    EPYC_256_8NUMA,
    GIB,
    NAMED_SPECS,
    OFFLINE_CPUS,
    MachineSpec,
    Numbering,
    write_sysfs,
)

SPECS = list(NAMED_SPECS.items())
# For tests that edit the tree: 16 cpus, 2 sockets (node0 0-3,8-11; node1 4-7,12-15).
SMALL = MachineSpec(sockets=2, cores_per_socket=4, threads_per_core=2, memory_per_numa=GIB)
SPEC_IDS = [name for name, _ in SPECS]


def _read(tmp_path: Path, spec: MachineSpec) -> Topology:
    return read_topology(write_sysfs(tmp_path / "sys", spec))


@pytest.fixture(scope="module")
def named() -> Iterator[Callable[[MachineSpec], Topology]]:
    """Each named machine written once and read once for this module's read-only tests. A
    256-cpu tree is ~4500 files, so it goes to tmpfs when there is one: on a busy disk it
    takes seconds."""
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="crihook-sysfs-", dir=shm) as tmp:
        cache: dict[int, Topology] = {}

        def read(spec: MachineSpec) -> Topology:
            if id(spec) not in cache:
                cache[id(spec)] = _read(Path(tmp) / str(len(cache)), spec)
            return cache[id(spec)]

        yield read


# --- named machines round-tripped -----------------------------------------------------------


@pytest.mark.parametrize(("name", "spec"), SPECS, ids=SPEC_IDS)
def test_named_machine_round_trip(
    named: Callable[[MachineSpec], Topology], name: str, spec: MachineSpec
) -> None:
    topo = named(spec)
    expected = spec.online_cpus()

    assert topo.online == frozenset(c.id for c in expected)
    assert len(topo.cpus) == spec.cpu_count - len(spec.offline)
    assert topo.offline == spec.offline
    assert topo.sockets == tuple(range(spec.sockets))
    assert topo.numa_nodes == tuple(range(spec.numa_count))
    assert topo.threads_per_core == spec.threads_per_core
    for node in range(spec.numa_count):
        assert topo.cpus_in_numa([node]) == {c.id for c in expected if c.numa == node}
    for c in expected:
        info = topo.cpus[c.id]
        online_siblings = {s.id for s in expected if s.core == c.core}
        assert (info.socket, info.die, info.numa, info.l3) == (c.socket, c.die, c.numa, c.l3)
        assert info.core == min(online_siblings)
    assert sorted(topo.memory) == list(range(spec.numa_count))
    for mem in topo.memory.values():
        assert mem.total_bytes == spec.memory_per_numa
        assert dict(mem.hugepages) == dict(spec.hugepages)


# Facts about each machine written out by hand, so the round trip is not only checked against
# the same layout code that wrote the tree.
@pytest.mark.parametrize(
    ("spec", "node", "cpulist"),
    [
        (DUAL_SOCKET_SMT2_2NUMA, 0, "0-9,20-29"),
        (DUAL_SOCKET_SMT2_2NUMA, 1, "10-19,30-39"),
        # kubelet's topoDualSocketMultiNumaPerSocketHT (lscpu of a dual Xeon Gold 6230).
        (DUAL_SOCKET_SMT2_4NUMA, 0, "0-9,40-49"),
        (DUAL_SOCKET_SMT2_4NUMA, 1, "10-19,50-59"),
        (DUAL_SOCKET_SMT2_4NUMA, 2, "20-29,60-69"),
        (DUAL_SOCKET_SMT2_4NUMA, 3, "30-39,70-79"),
        (EPYC_256_8NUMA, 0, "0-15,128-143"),
        (EPYC_256_8NUMA, 5, "80-95,208-223"),
        (EPYC_256_8NUMA, 7, "112-127,240-255"),
        (OFFLINE_CPUS, 0, "0-2,4-7,16-18,20-23"),
        (OFFLINE_CPUS, 1, "8-15,24-27,29-31"),
    ],
    ids=[
        "2numa-node0",
        "2numa-node1",
        "4numa-node0",
        "4numa-node1",
        "4numa-node2",
        "4numa-node3",
        "epyc-node0",
        "epyc-node5",
        "epyc-node7",
        "offline-node0",
        "offline-node1",
    ],
)
def test_numa_cpulists_by_hand(
    named: Callable[[MachineSpec], Topology], spec: MachineSpec, node: int, cpulist: str
) -> None:
    assert format_cpu_list(named(spec).cpus_in_numa([node])) == cpulist


def test_dual_socket_4numa_matches_kubelet_shape(named: Callable[[MachineSpec], Topology]) -> None:
    topo = named(DUAL_SOCKET_SMT2_4NUMA)
    # kubelet's fixture: NumCPUs 80, NumSockets 2, NumCores 40, 4 NUMA nodes.
    assert (len(topo.cpus), len(topo.sockets), len({c.core for c in topo.cpus.values()})) == (
        80,
        2,
        40,
    )
    assert (topo.cpus[40].core, topo.cpus[40].socket, topo.cpus[40].numa) == (0, 0, 0)
    assert (topo.cpus[79].core, topo.cpus[79].socket, topo.cpus[79].numa) == (39, 1, 3)
    assert {c.l3 for c in topo.cpus.values()} == {0, 1}  # one L3 per socket


def test_epyc_l3_per_eight_cores(named: Callable[[MachineSpec], Topology]) -> None:
    topo = named(EPYC_256_8NUMA)
    by_l3: dict[int, set[int]] = {}
    for c in topo.cpus.values():
        by_l3.setdefault(c.l3, set()).add(c.id)
    assert sorted(by_l3) == list(range(16))
    assert format_cpu_list(by_l3[0]) == "0-7,128-135"
    assert format_cpu_list(by_l3[9]) == "72-79,200-207"
    assert all(len(cpus) == 16 for cpus in by_l3.values())
    assert topo.threads_per_core == 2
    assert topo.memory[7].total_bytes == 128 * GIB
    assert dict(topo.memory[7].hugepages) == {2048: 512, 1048576: 2}


def test_offline_cpus_excluded_and_lone_sibling_is_a_core(
    named: Callable[[MachineSpec], Topology],
) -> None:
    topo = named(OFFLINE_CPUS)
    assert topo.offline == {3, 19, 28}
    assert not topo.online & {3, 19, 28}
    assert len(topo.cpus) == 29
    # cpu 12's sibling 28 is offline: cpu 12 is a core of one thread, named 12.
    assert [c.id for c in topo.cpus.values() if c.core == 12] == [12]
    # cpu 3's core is gone entirely; its neighbours keep their pairs.
    assert not [c for c in topo.cpus.values() if c.core == 3]
    assert [c.id for c in topo.cpus.values() if c.core == 4] == [4, 20]
    assert topo.threads_per_core == 2  # the widest core


def test_adjacent_numbering(tmp_path: Path) -> None:
    spec = MachineSpec(
        sockets=1, cores_per_socket=4, threads_per_core=2, numbering=Numbering.ADJACENT
    )
    topo = _read(tmp_path, spec)
    assert [topo.cpus[i].core for i in range(8)] == [0, 0, 2, 2, 4, 4, 6, 6]


def test_string_root_accepted(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    assert read_topology(str(root)) == read_topology(root)


# --- what older or smaller kernels show -----------------------------------------------------


def test_no_die_id_file_means_die_0(tmp_path: Path) -> None:
    spec = MachineSpec(sockets=1, cores_per_socket=4, dies_per_socket=2)
    root = write_sysfs(tmp_path / "sys", spec)
    assert {c.die for c in read_topology(root).cpus.values()} == {0, 1}
    for path in root.glob("devices/system/cpu/cpu*/topology/die_id"):
        path.unlink()
    assert {c.die for c in read_topology(root).cpus.values()} == {0}


def test_kernel_without_numa(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    shutil.rmtree(root / "devices/system/node")
    for link in root.glob("devices/system/cpu/cpu*/node*"):
        link.unlink()
    topo = read_topology(root)
    assert {c.numa for c in topo.cpus.values()} == {0}
    assert dict(topo.memory) == {}  # unknown, not zero
    assert topo.numa_nodes == (0,)


def test_no_l3(tmp_path: Path) -> None:
    topo = _read(tmp_path, MachineSpec(sockets=1, cores_per_socket=4, l3_cores=0))
    assert {c.l3 for c in topo.cpus.values()} == {-1}


def test_no_cache_dir(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path / "sys", MachineSpec(sockets=1, cores_per_socket=2))
    for cache in root.glob("devices/system/cpu/cpu*/cache"):
        shutil.rmtree(cache)
    assert {c.l3 for c in read_topology(root).cpus.values()} == {-1}


def test_l3_without_id_named_by_lowest_shared_cpu(tmp_path: Path) -> None:
    spec = MachineSpec(sockets=1, cores_per_socket=8, threads_per_core=2, l3_cores=4)
    root = write_sysfs(tmp_path / "sys", spec)
    for path in root.glob("devices/system/cpu/cpu*/cache/index3/id"):
        path.unlink()
    topo = read_topology(root)
    assert {c.id: c.l3 for c in topo.cpus.values() if c.id in (0, 5, 8, 13)} == {
        0: 0,
        5: 4,
        8: 0,
        13: 4,
    }


def test_cpu_only_linked_to_its_node(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    (root / "devices/system/node/node1/cpulist").write_text("4-7,12-14\n")
    assert read_topology(root).cpus[15].numa == 1  # found by cpu15/node1


def test_memory_only_node(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    node2 = root / "devices/system/node/node2"
    node2.mkdir()
    (node2 / "cpulist").write_text("\n")
    (node2 / "meminfo").write_text("Node 2 MemTotal:       1048576 kB\nNode 2 MemFree: 1 kB\n")
    topo = read_topology(root)
    assert topo.memory[2].total_bytes == GIB
    assert dict(topo.memory[2].hugepages) == {}
    assert topo.numa_nodes == (0, 1, 2)
    assert topo.cpus_in_numa([2]) == frozenset()


# --- errors name the path -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "content", "message"),
    [
        ("cpu/online", "0-", "malformed cpu list '0-' (bad element '0-') in {path}"),
        ("cpu/online", "", "no online cpus in {path}"),
        ("cpu/present", "0-10", "cpus 11-15 are online but not in {path}"),
        ("cpu/present", "0-9,x", "malformed cpu list '0-9,x' (bad element 'x') in {path}"),
        (
            "cpu/cpu3/topology/thread_siblings_list",
            "3-1",
            "malformed cpu list '3-1' (descending range '3-1') in {path}",
        ),
        ("cpu/cpu3/topology/physical_package_id", "zero", "malformed integer 'zero' in {path}"),
        ("cpu/cpu3/topology/die_id", "1_0", "malformed integer '1_0' in {path}"),
        ("cpu/cpu3/cache/index3/level", "", "malformed integer '' in {path}"),
        ("cpu/cpu3/cache/index3/id", "-", "malformed integer '-' in {path}"),
        (
            "node/node0/meminfo",
            "Node 0 MemFree: 1 kB",
            "no 'Node 0 MemTotal: <n> kB' line in {path}",
        ),
        ("node/node1/meminfo", "Node 0 MemTotal: 1 kB", "{path} describes node 0, not node 1"),
        (
            "node/node0/hugepages/hugepages-2048kB/nr_hugepages",
            "many",
            "malformed integer 'many' in {path}",
        ),
        ("node/node1/cpulist", "0,4-7,12-15", "cpu 0 is in two NUMA nodes: 0 and 1 ({path})"),
    ],
    ids=[
        "online-dangling-dash",
        "online-empty",
        "online-not-present",
        "present-garbage",
        "siblings-descending",
        "package-id-word",
        "die-id-underscore",
        "cache-level-empty",
        "l3-id-dash",
        "meminfo-no-total",
        "meminfo-other-node",
        "hugepages-word",
        "cpu-in-two-nodes",
    ],
)
def test_malformed_file_names_path(
    tmp_path: Path, relative: str, content: str, message: str
) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    path = root / "devices/system" / relative
    path.write_text(content + "\n")
    with pytest.raises(TopologyError) as info:
        read_topology(root)
    assert str(info.value) == message.format(path=path)


@pytest.mark.parametrize(
    "relative",
    [
        "cpu/online",
        "cpu/present",
        "cpu/cpu3/topology/physical_package_id",
        "cpu/cpu3/topology/thread_siblings_list",
        "cpu/cpu3/cache/index3/level",
        "node/node1/cpulist",
        "node/node1/meminfo",
    ],
    ids=["online", "present", "package-id", "siblings", "cache-level", "node-cpulist", "meminfo"],
)
def test_missing_file_names_path(tmp_path: Path, relative: str) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    path = root / "devices/system" / relative
    path.unlink()
    with pytest.raises(TopologyError) as info:
        read_topology(root)
    assert str(info.value) == f"cannot read {path}: No such file or directory"


def test_cpu_in_no_node(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path / "sys", SMALL)
    system = root / "devices/system"
    (system / "node/node1/cpulist").write_text("4-7,12-14\n")
    (system / "cpu/cpu15/node1").unlink()
    with pytest.raises(TopologyError) as info:
        read_topology(root)
    assert str(info.value) == (
        f"cpu 15 is online but in no NUMA node: not in {system}/node/node*/cpulist "
        f"and no {system}/cpu/cpu15/node* entry"
    )


def test_topology_error_is_a_value_error() -> None:
    assert issubclass(TopologyError, ValueError)


# --- this machine's own sysfs ---------------------------------------------------------------


def test_real_sysfs() -> None:
    online_file = Path("/sys/devices/system/cpu/online")
    topo = read_topology("/sys")
    assert 0 in topo.online
    assert topo.online == parse_cpu_list(online_file.read_text())
    assert not topo.online & topo.offline
    for c in topo.cpus.values():
        assert c.numa in topo.numa_nodes
        assert c.core <= c.id
        assert topo.cpus[c.core].core == c.core  # a core is named by one of its own cpus
    assert topo.threads_per_core >= 1
    if Path("/sys/devices/system/node").is_dir():
        assert set(topo.memory) >= {c.numa for c in topo.cpus.values()}
        assert all(m.total_bytes > 0 for n, m in topo.memory.items() if topo.cpus_in_numa([n]))


# --- cpulists -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", set()),
        ("\n", set()),
        ("0", {0}),
        ("0\n", {0}),
        ("  7  ", {7}),
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8-11", {0, 1, 2, 3, 8, 9, 10, 11}),
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        ("5-5", {5}),
        ("3,1,2", {1, 2, 3}),
        ("0-1,1-2", {0, 1, 2}),
        ("255", {255}),
    ],
    ids=[
        "empty",
        "newline",
        "zero",
        "zero-newline",
        "spaces",
        "range",
        "two-ranges",
        "mixed",
        "one-wide-range",
        "unordered",
        "overlapping",
        "large",
    ],
)
def test_parse_cpu_list(text: str, expected: set[int]) -> None:
    assert parse_cpu_list(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-", "malformed cpu list '0-' (bad element '0-')"),
        ("-1", "malformed cpu list '-1' (bad element '-1')"),
        ("3-1", "malformed cpu list '3-1' (descending range '3-1')"),
        ("1,,2", "malformed cpu list '1,,2' (bad element '')"),
        (",", "malformed cpu list ',' (bad element '')"),
        ("0, 1", "malformed cpu list '0, 1' (bad element ' 1')"),
        ("1 2", "malformed cpu list '1 2' (bad element '1 2')"),
        ("a", "malformed cpu list 'a' (bad element 'a')"),
        ("0x3", "malformed cpu list '0x3' (bad element '0x3')"),
        ("0-7:2/4", "malformed cpu list '0-7:2/4' (bad element '0-7:2/4')"),
        ("\u0661", "malformed cpu list '\u0661' (bad element '\u0661')"),  # ARABIC-INDIC ONE
    ],
    ids=[
        "dangling-dash",
        "negative",
        "descending",
        "empty-element",
        "only-comma",
        "inner-space",
        "space-separated",
        "word",
        "hex",
        "stride-form",
        "non-ascii-digit",
    ],
)
def test_parse_cpu_list_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cpu_list(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        (set(), ""),
        ({0}, "0"),
        ({0, 1}, "0-1"),
        ({0, 1, 2, 3, 8}, "0-3,8"),
        ({8, 0, 3, 1, 2}, "0-3,8"),
        ({0, 2, 4}, "0,2,4"),
        ({0, 1, 2, 3, 8, 9, 10, 11}, "0-3,8-11"),
        ([3, 3, 4], "3-4"),
    ],
    ids=["empty", "one", "pair", "range-and-one", "unordered", "gaps", "two-ranges", "dupes"],
)
def test_format_cpu_list(cpus: set[int] | list[int], expected: str) -> None:
    assert format_cpu_list(cpus) == expected


def test_format_cpu_list_rejects_negative() -> None:
    with pytest.raises(ValueError, match="cpu ids are not negative: -1"):
        format_cpu_list({-1, 2})


@pytest.mark.parametrize("text", ["0-3,8", "0", "", "1,3,5-9,200-255"], ids=str)
def test_cpu_list_round_trip(text: str) -> None:
    assert format_cpu_list(parse_cpu_list(text)) == text
