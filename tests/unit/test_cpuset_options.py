"""`[hooks.cpuset]` policy options as kubelet takes them, and every option deciding on the sysfs
fixture machines.

Ported from kubelet's ``pkg/kubelet/cm/cpumanager`` tests (Kubernetes 1.35/1.36):
``policy_static_test.go`` (TestStaticPolicyOptions, TestStaticPolicyStart and
TestStaticPolicyStartWithResvList for strict-cpu-reservation) and ``policy_options_test.go``
(TestPolicyDefaultsAvailable, TestPolicyOptionsCompatibility, TestValidateStaticPolicyOptions),
plus the four pairs ``NewStaticPolicyOptions`` refuses. Each case keeps kubelet's description
as its id. kubelet's feature-gate rows (alpha and beta options refused without their gate) have
no counterpart: crihook has no feature gates, every option is taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.cpus import cpu_hints
from crihook.hooks.cpus.options import (
    POLICY_OPTIONS,
    CpusetOptions,
    check_node,
    node_reserved_cpus,
    parse_options,
)
from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.cpuset import CpusetHook
from crihook.hooks.node import Topology, parse_cpu_list, read_topology
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import Adjustment, Field, TopologyHint
from tests.lab.kubelet_encoding import PodSpec
from tests.lab.sysfs import NAMED_SPECS, write_sysfs
from tests.unit.hook_harness import Node, burstable, every_update, guaranteed
from tests.unit.kubelet_topologies import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT,
    MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT,
    cpuset,
)

# --- TestStaticPolicyOptions ----------------------------------------------------------------

STATIC_POLICY_OPTIONS = [
    ("nil args", None, CpusetOptions()),
    ("empty args", {}, CpusetOptions()),
    ("bad single arg", {"badValue1": ""}, "'badValue1' is not supported"),
    ("bad multiple arg", {"badValue1": "", "badvalue2": "aaaa"}, "is not supported"),
    ("good arg", {"full-pcpus-only": "true"}, CpusetOptions(full_pcpus_only=True)),
    ("good arg, bad value", {"full-pcpus-only": "enabled!"}, "'enabled!'"),
    ("bad arg intermixed", {"full-pcpus-only": "1", "badvalue2": "lorem ipsum"},
     "'badvalue2' is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "expected"), [pytest.param(*case[1:], id=case[0]) for case in STATIC_POLICY_OPTIONS]
)
def test_static_policy_options(
    policy: dict[str, Any] | None, expected: CpusetOptions | str
) -> None:
    options = {} if policy is None else {"policy_options": policy}
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=r"^cpuset: policy_options") as info:
            parse_options(options)
        assert expected in str(info.value)
    else:
        assert parse_options(options) == expected


# Every option, by kubelet's name, sets its own field and no other.
EACH_OPTION = [
    pytest.param("full-pcpus-only", CpusetOptions(full_pcpus_only=True), id="full-pcpus-only"),
    pytest.param(
        "distribute-cpus-across-numa",
        CpusetOptions(distribute_cpus_across_numa=True),
        id="distribute-cpus-across-numa",
    ),
    pytest.param("align-by-socket", CpusetOptions(align_by_socket=True), id="align-by-socket"),
    pytest.param(
        "distribute-cpus-across-cores",
        CpusetOptions(distribute_cpus_across_cores=True),
        id="distribute-cpus-across-cores",
    ),
    pytest.param(
        "strict-cpu-reservation",
        CpusetOptions(strict_cpu_reservation=True),
        id="strict-cpu-reservation",
    ),
    pytest.param(
        "prefer-align-cpus-by-uncorecache",
        CpusetOptions(prefer_align_cpus_by_uncorecache=True),
        id="prefer-align-cpus-by-uncorecache",
    ),
]


@pytest.mark.parametrize(("name", "expected"), EACH_OPTION)
def test_each_kubelet_option_sets_its_field(name: str, expected: CpusetOptions) -> None:
    assert parse_options({"policy_options": {name: "true"}}) == expected
    assert parse_options({"policy_options": {name: "false"}}) == CpusetOptions()


def test_every_kubelet_option_is_known() -> None:
    assert sorted(POLICY_OPTIONS) == sorted(p.values[0] for p in EACH_OPTION)


# Values as Go's strconv.ParseBool reads them (kubelet parses option values so), and TOML
# booleans.
@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True", True])
def test_true_values(value: object) -> None:
    assert parse_options({"policy_options": {"full-pcpus-only": value}}).full_pcpus_only


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE", "false", "False", False])
def test_false_values(value: object) -> None:
    assert not parse_options({"policy_options": {"full-pcpus-only": value}}).full_pcpus_only


@pytest.mark.parametrize("value", ["yes", "tRuE", "", "2", 1, None])
def test_values_parse_bool_refuses(value: object) -> None:
    with pytest.raises(ValueError, match="policy_options 'full-pcpus-only' must be"):
        parse_options({"policy_options": {"full-pcpus-only": value}})


# --- TestPolicyDefaultsAvailable --------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "available"),
    [
        pytest.param("this-option-does-not-exist", False, id="this-option-does-not-exist"),
        pytest.param("full-pcpus-only", True, id="full-pcpus-only"),
    ],
)
def test_policy_defaults_available(option: str, available: bool) -> None:
    options = {"policy_options": {option: "true"}}
    if available:
        parse_options(options)
    else:
        with pytest.raises(ValueError, match=f"'{option}' is not supported"):
            parse_options(options)


# --- TestPolicyOptionsCompatibility and NewStaticPolicyOptions' pairs ---------------------------

COMPATIBILITY = [
    ("FullPhysicalCPUsOnly set to true only", {"full-pcpus-only": "true"}, None),
    ("DistributeCPUsAcrossCores set to true only", {"distribute-cpus-across-cores": "true"},
     None),
    ("FullPhysicalCPUsOnly and DistributeCPUsAcrossCores options can not coexist",
     {"full-pcpus-only": "true", "distribute-cpus-across-cores": "true"},
     ("full-pcpus-only", "distribute-cpus-across-cores")),
    # The other pairs NewStaticPolicyOptions refuses (no kubelet test rows of their own).
    ("DistributeCPUsAcrossNUMA and DistributeCPUsAcrossCores can not coexist",
     {"distribute-cpus-across-numa": "true", "distribute-cpus-across-cores": "true"},
     ("distribute-cpus-across-numa", "distribute-cpus-across-cores")),
    ("PreferAlignByUncoreCache and DistributeCPUsAcrossCores can not coexist",
     {"prefer-align-cpus-by-uncorecache": "true", "distribute-cpus-across-cores": "true"},
     ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores")),
    ("PreferAlignByUncoreCache and DistributeCPUsAcrossNUMA can not coexist",
     {"prefer-align-cpus-by-uncorecache": "true", "distribute-cpus-across-numa": "true"},
     ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa")),
    # Pairs kubelet takes (TestStaticPolicyAddWithUncoreAlignment runs the first two).
    ("FullPhysicalCPUsOnly with PreferAlignByUncoreCache",
     {"full-pcpus-only": "true", "prefer-align-cpus-by-uncorecache": "true"}, None),
    ("StrictCPUReservation with PreferAlignByUncoreCache",
     {"strict-cpu-reservation": "true", "prefer-align-cpus-by-uncorecache": "true"}, None),
    ("FullPhysicalCPUsOnly with DistributeCPUsAcrossNUMA and AlignBySocket",
     {"full-pcpus-only": "true", "distribute-cpus-across-numa": "true",
      "align-by-socket": "true"}, None),
    ("a refused pair with one of them false is fine",
     {"full-pcpus-only": "false", "distribute-cpus-across-cores": "true"}, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "refused"), [pytest.param(*case[1:], id=case[0]) for case in COMPATIBILITY]
)
def test_policy_options_compatibility(
    policy: dict[str, str], refused: tuple[str, str] | None
) -> None:
    options = {"policy_options": policy}
    if refused is None:
        parse_options(options)
        return
    with pytest.raises(ValueError, match=r"^cpuset: policy_options: ") as info:
        CpusetHook(options)  # a config error at load
    first, second = refused
    assert f"{first!r} and {second!r} can not be used at the same time" in str(info.value)


# --- TestValidateStaticPolicyOptions ----------------------------------------------------------

MULTI = DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT
FAKE = MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT

VALIDATE = [
    ("Align by socket not enabled", {"full-pcpus-only": "true"}, MULTI, "single-numa-node",
     None),
    ("Align by socket enabled with topology manager single numa node",
     {"align-by-socket": "true"}, MULTI, "single-numa-node", "single-numa-node topology policy"),
    ("Align by socket enabled with num_sockets > num_numa", {"align-by-socket": "true"}, FAKE,
     "none", "more sockets (4) than NUMA nodes (2)"),
    ("Align by socket enabled: with topology manager None policy", {"align-by-socket": "true"},
     MULTI, "none", None),
    ("Align by socket enabled: with topology manager best-effort policy",
     {"align-by-socket": "true"}, MULTI, "best-effort", None),
    ("Align by socket enabled: with topology manager restricted policy",
     {"align-by-socket": "true"}, MULTI, "restricted", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "topology", "topology_policy", "error"),
    [pytest.param(*case[1:], id=case[0]) for case in VALIDATE],
)
def test_validate_static_policy_options(
    policy: dict[str, str], topology: Topology, topology_policy: str, error: str | None
) -> None:
    config = parse_options({"policy_options": policy})
    if error is None:
        check_node(config, topology, topology_policy)
        return
    with pytest.raises(ValueError, match=r"^cpuset: policy_options: 'align-by-socket'") as info:
        check_node(config, topology, topology_policy)
    assert error in str(info.value)


@pytest.mark.parametrize(
    ("topology", "topology_policy", "error"),
    [
        pytest.param(MULTI, "single-numa-node", "single-numa-node", id="single-numa-node"),
        pytest.param(FAKE, "none", "more sockets", id="more-sockets-than-numa-nodes"),
    ],
)
async def test_an_option_this_node_refuses_fails_synchronize(
    topology: Topology, topology_policy: str, error: str
) -> None:
    node = Node(
        CpusetHook({"policy_options": {"align-by-socket": "true"}}),
        topology,
        policy=topology_policy,
    )
    with pytest.raises(ValueError, match="'align-by-socket'") as info:
        await node.sync()
    assert error in str(info.value)


# --- strict-cpu-reservation: TestStaticPolicyStart / TestStaticPolicyStartWithResvList -----------

STRICT_START = [
    # (description, reserved (count or cpulist), strict, kubelet's default cpuset at start)
    ("empty cpuset", 1, False, cpuset("0-11")),
    ("WithResvList: empty cpuset", "0-1", False, cpuset("0-11")),
    ("WithResvList: empty cpuset with StrictCPUReservationOption enabled", "0-1", True,
     cpuset("2-11")),
    # kubelet's "some of reserved cores are present in available cpuset" rows check a saved
    # default cpuset against the reserved CPUs; crihook keeps no such set (its shared pool is
    # derived), so they have no counterpart. Their reserved pick, 2 on DualSocketHT, is {0, 6}.
    ("strict reservation of a count, as kubelet picks it", 2, True, cpuset("1-5,7-11")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("reserved", "strict", "shared"), [pytest.param(*case[1:], id=case[0]) for case in STRICT_START]
)
def test_static_policy_start_shared_pool(
    reserved: str | int, strict: bool, shared: frozenset[int]
) -> None:
    config = parse_options(
        {"reserved_cpus": reserved, "policy_options": {"strict-cpu-reservation": str(strict)}}
    )
    picked = node_reserved_cpus(DUAL_SOCKET_HT, config)
    pool = CpuPool(DUAL_SOCKET_HT, picked, MemoryState(), strict_reservation=strict)
    assert pool.shared_pool() == shared
    assert pool.free() == DUAL_SOCKET_HT.online - picked  # never handed out, either way


# --- every option on the sysfs fixtures, through the hook ---------------------------------------


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Topology]]:
    root = tmp_path_factory.mktemp("machines")
    yield {
        name: read_topology(write_sysfs(Path(root) / name, spec))
        for name, spec in NAMED_SPECS.items()
    }


def exclusive(adjustment: Adjustment | None) -> frozenset[int]:
    assert adjustment is not None
    return parse_cpu_list(adjustment.changes[(Field.CPUSET_CPUS, "")])


T = "true"

# (id, machine, reserved_cpus (what is not available), policy options, request, NUMA hint of
# the topology merge or None, the CPUs kubelet would pick). Each machine's rows share its
# reserved CPUs, so the options are what differs.
#
# UNCORE_SMALL_L3: core k = CPUs k, k+32; NUMA k // 8; L3 k // 4 (2 per NUMA node). Cores 0-2
# reserved leave L3 0 one free core: packed takes cores 3 and 4 (two L3s); uncore alignment
# takes L3 1's first two cores; spreading over cores takes 3-6 (one thread each); spreading
# over NUMA nodes takes the emptiest node's first cores (NUMA 1, cores 8-9).
# EPYC_256_8NUMA: core k = CPUs k, k+128; NUMA k // 16; L3 k // 8. Cores 0-5 reserved.
# DUAL_SOCKET_SMT2_4NUMA: core k = CPUs k, k+40; NUMA k // 10; one L3 per socket. CPU 0
# reserved: its sibling 40 keeps L3 0 from fitting 4 CPUs in 2 cores, so the uncore pick moves
# to socket 1.
# OFFLINE_CPUS: core k = CPUs k, k+16, CPUs 3, 19, 28 offline.
SMALL_L3_RESERVED = "0-2,32-34"
EPYC_RESERVED = "0-5,128-133"
FIXTURE_PICKS = [
    ("small-l3/default", "UNCORE_SMALL_L3", SMALL_L3_RESERVED, {}, 4, None, "3,4,35,36"),
    ("small-l3/full-pcpus-only", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"full-pcpus-only": T}, 4, None, "3,4,35,36"),
    ("small-l3/full-pcpus-only/partial-core", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"full-pcpus-only": T}, 3, None,
     "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"),
    ("small-l3/prefer-align-cpus-by-uncorecache", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"prefer-align-cpus-by-uncorecache": T}, 4, None, "4,5,36,37"),
    ("small-l3/uncorecache+full-pcpus-only", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"prefer-align-cpus-by-uncorecache": T, "full-pcpus-only": T}, 8, None, "4-7,36-39"),
    ("small-l3/distribute-cpus-across-cores", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"distribute-cpus-across-cores": T}, 4, None, "3-6"),
    ("small-l3/distribute-cpus-across-numa", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"distribute-cpus-across-numa": T}, 4, None, "8,9,40,41"),
    ("small-l3/strict-cpu-reservation", "UNCORE_SMALL_L3", SMALL_L3_RESERVED,
     {"strict-cpu-reservation": T}, 4, None, "3,4,35,36"),
    # Socket 1 mostly reserved: with a hint for NUMA node 1, the rest of the request goes to
    # socket 1's last free cores; by socket, it stays on socket 0 (all of NUMA 0 first, as
    # packing a whole free node comes first within the widened set).
    ("small-l3/hint/default", "UNCORE_SMALL_L3", "16-29,48-61", {}, 20, {1},
     "8-15,40-47,30,31,62,63"),
    ("small-l3/hint/align-by-socket", "UNCORE_SMALL_L3", "16-29,48-61",
     {"align-by-socket": T}, 20, {1}, "0-9,32-41"),
    ("epyc/default", "EPYC_256_8NUMA", EPYC_RESERVED, {}, 8, None, "6-9,134-137"),
    ("epyc/prefer-align-cpus-by-uncorecache", "EPYC_256_8NUMA", EPYC_RESERVED,
     {"prefer-align-cpus-by-uncorecache": T}, 8, None, "8-11,136-139"),
    ("epyc/distribute-cpus-across-cores", "EPYC_256_8NUMA", EPYC_RESERVED,
     {"distribute-cpus-across-cores": T}, 8, None, "6-13"),
    ("epyc/distribute-cpus-across-numa", "EPYC_256_8NUMA", EPYC_RESERVED,
     {"distribute-cpus-across-numa": T}, 8, None, "16-19,144-147"),
    ("epyc/full-pcpus-only/partial-core", "EPYC_256_8NUMA", EPYC_RESERVED,
     {"full-pcpus-only": T}, 7, None,
     "SMT Alignment Error: requested 7 cpus not multiple cpus per core = 2"),
    ("4numa/default", "DUAL_SOCKET_SMT2_4NUMA", "0", {}, 4, None, "1,2,41,42"),
    ("4numa/prefer-align-cpus-by-uncorecache", "DUAL_SOCKET_SMT2_4NUMA", "0",
     {"prefer-align-cpus-by-uncorecache": T}, 4, None, "20,21,60,61"),
    ("4numa/distribute-cpus-across-cores", "DUAL_SOCKET_SMT2_4NUMA", "0",
     {"distribute-cpus-across-cores": T}, 4, None, "1-4"),
    ("4numa/distribute-cpus-across-numa", "DUAL_SOCKET_SMT2_4NUMA", "0",
     {"distribute-cpus-across-numa": T}, 4, None, "10,11,50,51"),
    ("4numa/align-by-socket", "DUAL_SOCKET_SMT2_4NUMA", "0", {"align-by-socket": T}, 4, {1},
     "1,2,41,42"),
    ("2numa/align-by-socket", "DUAL_SOCKET_SMT2_2NUMA", "0", {"align-by-socket": T}, 2, {1},
     "10,30"),
    ("offline/prefer-align-cpus-by-uncorecache", "OFFLINE_CPUS", "",
     {"prefer-align-cpus-by-uncorecache": T}, 4, None, "0,1,16,17"),
    ("offline/distribute-cpus-across-cores", "OFFLINE_CPUS", "",
     {"distribute-cpus-across-cores": T}, 4, None, "0-2,4"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("machine", "reserved", "policy", "count", "hint", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in FIXTURE_PICKS],
)
async def test_every_option_on_the_sysfs_fixtures(
    machines: dict[str, Topology],
    machine: str,
    reserved: str,
    policy: dict[str, str],
    count: int,
    hint: set[int] | None,
    expected: str,
) -> None:
    node = Node(
        CpusetHook({"reserved_cpus": reserved, "policy_options": policy}), machines[machine]
    )
    await node.sync()
    p = await node.run_pod(PodSpec("sb", containers=[guaranteed("app", count * 1000)]), "sb")
    affinity = None if hint is None else TopologyHint(frozenset(hint), True)
    if expected.startswith("SMT"):
        with pytest.raises(Exception, match=expected):
            await node.create(p, guaranteed("app", count * 1000), "c1", affinity=affinity)
        return
    created = await node.create(p, guaranteed("app", count * 1000), "c1", affinity=affinity)
    assert exclusive(created.pre) == parse_cpu_list(expected)


@pytest.mark.parametrize("strict", [False, True], ids=["shared-reserved", "strict"])
async def test_strict_reservation_keeps_shared_containers_off_reserved_cpus(
    machines: dict[str, Topology], strict: bool
) -> None:
    topology = machines["UNCORE_SMALL_L3"]
    options = {"reserved_cpus": "0,32", "policy_options": {"strict-cpu-reservation": str(strict)}}
    node = Node(CpusetHook(options), topology)
    await node.sync()
    p = await node.run_pod(PodSpec("sb", containers=[burstable("web")]), "sb")
    created = await node.create(p, burstable("web"), "c1")
    shared = exclusive(created.pre)
    assert shared == (topology.online - {0, 32} if strict else topology.online)
    # An exclusive container never gets a reserved CPU, and the shared one follows its pool.
    q = await node.run_pod(PodSpec("sq", containers=[guaranteed("app", 4000)]), "sq")
    app = await node.create(q, guaranteed("app", 4000), "c2")
    assert exclusive(app.pre) == parse_cpu_list("1,2,33,34")
    assert app.pre is not None
    moved = {
        u.container_id: parse_cpu_list(u.resources.cpuset_cpus or "") for u in every_update(app.pre)
    }
    assert moved == {"c1": shared - parse_cpu_list("1,2,33,34")}


async def test_hints_follow_align_by_socket(machines: dict[str, Topology]) -> None:
    topology = machines["UNCORE_SMALL_L3"]
    for align in (False, True):
        options = {
            "reserved_cpus": "16-29,48-61",
            "policy_options": {"align-by-socket": str(align)},
        }
        node = Node(CpusetHook(options), topology)
        await node.sync()
        p = await node.run_pod(PodSpec("sb", containers=[guaranteed("app", 10000)]), "sb")
        created = await node.begin_create(p, guaranteed("app", 10000))
        assert created.hints is not None
        hints = list(created.hints["cpu"])
        free = topology.online - parse_cpu_list("16-29,48-61")
        assert hints == cpu_hints(topology, free, frozenset(), 10, align_socket=align)
        # NUMA nodes 0 and 1 share socket 0: preferred by socket, not otherwise.
        assert TopologyHint(frozenset({0, 1}), align) in hints
