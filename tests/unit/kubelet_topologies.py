"""kubelet's CPU manager test machines, as crihook Topology objects.

Transcribed from kubelet's ``pkg/kubelet/cm/cpumanager/policy_test.go`` (the ``topo*``
fixtures, ``CPUDetails`` tables) and ``topology_hints_test.go`` (``returnMachineInfo``).
Every CPU keeps kubelet's ``CoreID``, ``SocketID`` and ``NUMANodeID``; kubelet's core ids
are unique keys but not always the lowest sibling (``QUAD_SOCKET_FOUR_WAY_HT``), and the
picker only relies on them being unique and consistent, so they are kept as given. The
fixtures set no ``UncoreCacheID``: ``l3`` is kubelet's zero value, 0. ``die`` is 0.

Where kubelet's table follows a rule (one row per CPU, all alike), the builder below states
the rule instead of repeating the rows; the rules were checked row by row against kubelet's
table.

The uncore-cache machines of the ``prefer-align-cpus-by-uncorecache`` tests (``*Uncore*``,
``policy_test.go`` and the ``topoUncore*`` of ``cpu_assignment_test.go``) carry kubelet's
``UncoreCacheID`` as ``l3``. Three differ from kubelet's tables on purpose, because crihook
reads what a topology is rather than a header kubelet's test author typed:

- ``topoSingleSocketSingleNumaPerSocketNoSMTSmallUncore``: kubelet's header says 128 CPUs for
  the 64 it lists, so kubelet's averages there are 2 CPUs per core and 8 per uncore cache;
  crihook counts 1 and 4. The vectors on it come out the same.
- ``topoDualSocketMultiNumaPerSocketUncore``: kubelet numbers socket 1's cores from 0 again
  (core ids repeat across sockets, which kubelet's ``CPUsInCores`` then merges); crihook needs
  unique core ids, so core = CPU id here (no SMT).
- ``topoUncoreSingleSocketNoSMT``, ``topoUncoreSingleSocketSMT`` and
  ``topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore``: their tables were not in the sources
  read; they are rebuilt from kubelet's descriptions ("8 cpus per uncore", "multi uncore cache
  single socket - SMT enabled") and from the vectors on them, which pin the layout down.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from crihook.hooks.node.topology import CPUInfo, Topology

__all__ = [
    "DUAL_SOCKET_HT",
    "DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT",
    "DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT_LARGE",
    "DUAL_SOCKET_MULTI_NUMA_UNCORE",
    "DUAL_SOCKET_NO_HT",
    "DUAL_SOCKET_SMT_UNCORE",
    "DUAL_SOCKET_SUB_NUMA_MONO_UNCORE",
    "HINTS_MACHINE",
    "LARGE_SINGLE_SOCKET_SMT_UNCORE",
    "LARGE_SINGLE_SOCKET_UNCORE",
    "MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT",
    "PCORE_ECORE_MONO_UNCORE",
    "QUAD_SOCKET_FOUR_WAY_HT",
    "SINGLE_SOCKET_HT",
    "SINGLE_SOCKET_MONO_UNCORE",
    "SINGLE_SOCKET_NO_SMT_SMALL_UNCORE",
    "SINGLE_SOCKET_SMT_SMALL_UNCORE",
    "SMALL_DUAL_SOCKET_NO_SMT_UNCORE",
    "SMALL_DUAL_SOCKET_SMT_UNCORE",
    "SMALL_SINGLE_SOCKET_NO_SMT_UNCORE",
    "TOPOLOGIES",
    "TRIPLE_SOCKET_HT",
    "UNCORE_DUAL_SOCKET_NO_SMT",
    "UNCORE_SINGLE_SOCKET_MULTI_NUMA",
    "UNCORE_SINGLE_SOCKET_NO_SMT",
    "UNCORE_SINGLE_SOCKET_SMT",
    "UNCORE_TOPOLOGIES",
    "cores",
    "cpuset",
    "uncore_cores",
]


def cpuset(spec: str) -> frozenset[int]:
    """kubelet's mustParseCPUSet: "0-3,8" -> {0, 1, 2, 3, 8}; "" -> the empty set."""
    out: set[int] = set()
    for part in filter(None, spec.split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return frozenset(out)


def cores(rows: Iterable[tuple[int, int, int, Sequence[int]]]) -> Topology:
    """Build a topology from (core id, socket id, NUMA node id, the core's CPUs) rows."""
    return uncore_cores((core, socket, numa, 0, threads) for core, socket, numa, threads in rows)


def uncore_cores(rows: Iterable[tuple[int, int, int, int, Sequence[int]]]) -> Topology:
    """Build a topology from (core id, socket id, NUMA node id, uncore cache id, the core's
    CPUs) rows."""
    cpus: list[CPUInfo] = []
    for core, socket, numa, uncore, threads in rows:
        cpus.extend(CPUInfo(cpu, socket, 0, core, numa, uncore) for cpu in threads)
    ids = [c.id for c in cpus]
    if len(ids) != len(set(ids)):
        raise ValueError("a CPU appears in two cores")
    return Topology.build(cpus)


def _regular(
    n_cores: int,
    *,
    threads: int,
    per_socket: int,
    per_numa: int,
    per_uncore: int,
) -> Topology:
    """Cores 0..n-1, core k being CPUs k, k+n, ... (Linux's numbering), sockets, NUMA nodes
    and uncore caches splitting the cores into consecutive groups of the given sizes."""
    return uncore_cores(
        (
            k,
            k // per_socket,
            k // per_numa,
            k // per_uncore,
            tuple(k + t * n_cores for t in range(threads)),
        )
        for k in range(n_cores)
    )


def _smt2(n_cores: int, cores_per_numa: int, numas_per_socket: int) -> Topology:
    """CPU i and i + n_cores form core i; NUMA node i // cores_per_numa; sockets in order."""
    return cores(
        (
            i,
            i // (cores_per_numa * numas_per_socket),
            i // cores_per_numa,
            (i, i + n_cores),
        )
        for i in range(n_cores)
    )


# topoSingleSocketHT: 1 socket, 1 NUMA node, 4 cores, CPUs i and i+4 on core i.
SINGLE_SOCKET_HT = cores((i, 0, 0, (i, i + 4)) for i in range(4))

# topoDualSocketHT: core i is CPUs i and i+6; even cores on socket/NUMA 0, odd on 1.
DUAL_SOCKET_HT = cores((i, i % 2, i % 2, (i, i + 6)) for i in range(6))

# topoTripleSocketHT (fake): CPUs 2k and 2k+1 form core k; cores 0-2 on socket/NUMA 1,
# cores 3-5 on socket/NUMA 0, cores 6-8 on socket/NUMA 2.
TRIPLE_SOCKET_HT = cores(
    (k, (1, 0, 2)[k // 3], (1, 0, 2)[k // 3], (2 * k, 2 * k + 1)) for k in range(9)
)

# topoDualSocketNoHT: CPU i is core i; CPUs 0-3 on socket/NUMA 0, 4-7 on socket/NUMA 1.
DUAL_SOCKET_NO_HT = cores((i, i // 4, i // 4, (i,)) for i in range(8))

# topoQuadSocketFourWayHT (KNL SNC4, hwloc's KNL.SNC4.H50 picture): 4 sockets = 4 NUMA
# nodes, 18 cores each, 4 threads per core. Rows: kubelet's core id, then its 4 CPUs.
_QUAD_SOCKET_CORES: dict[int, tuple[tuple[int, tuple[int, int, int, int]], ...]] = {
    0: (
        (0, (0, 169, 109, 229)),
        (1, (50, 170, 110, 230)),
        (64, (1, 25, 13, 38)),
        (65, (2, 26, 14, 39)),
        (72, (9, 33, 21, 46)),
        (73, (10, 34, 22, 47)),
        (8, (57, 177, 117, 237)),
        (9, (58, 178, 118, 238)),
        (24, (71, 191, 131, 251)),
        (25, (72, 192, 132, 252)),
        (32, (79, 199, 139, 259)),
        (33, (80, 200, 140, 260)),
        (40, (87, 207, 147, 267)),
        (41, (88, 208, 148, 268)),
        (48, (95, 215, 155, 275)),
        (49, (96, 216, 156, 276)),
        (56, (103, 223, 163, 283)),
        (57, (104, 224, 164, 284)),
    ),
    1: (
        (66, (3, 27, 15, 40)),
        (67, (4, 28, 16, 41)),
        (74, (11, 35, 23, 48)),
        (75, (12, 36, 24, 49)),
        (2, (51, 171, 111, 231)),
        (3, (52, 172, 112, 232)),
        (10, (59, 179, 119, 239)),
        (11, (60, 180, 120, 240)),
        (18, (65, 185, 125, 245)),
        (19, (66, 186, 126, 246)),
        (26, (73, 193, 133, 253)),
        (27, (74, 194, 134, 254)),
        (34, (81, 201, 141, 261)),
        (35, (82, 202, 142, 262)),
        (42, (89, 209, 149, 269)),
        (43, (90, 210, 150, 270)),
        (50, (97, 217, 157, 277)),
        (51, (98, 218, 158, 278)),
    ),
    2: (
        (68, (5, 29, 17, 42)),
        (69, (6, 30, 18, 43)),
        (4, (53, 173, 113, 233)),
        (5, (54, 174, 114, 234)),
        (12, (61, 181, 121, 241)),
        (13, (62, 182, 122, 242)),
        (20, (67, 187, 127, 247)),
        (21, (68, 188, 128, 248)),
        (28, (75, 195, 135, 255)),
        (29, (76, 196, 136, 256)),
        (36, (83, 203, 143, 263)),
        (37, (84, 204, 144, 264)),
        (44, (91, 211, 151, 271)),
        (45, (92, 212, 152, 272)),
        (52, (99, 219, 159, 279)),
        (53, (100, 220, 160, 280)),
        (60, (105, 225, 165, 285)),
        (61, (106, 226, 166, 286)),
    ),
    3: (
        (70, (7, 31, 19, 44)),
        (71, (8, 32, 20, 45)),
        (63, (37, 168, 108, 228)),
        (62, (107, 227, 167, 287)),
        (6, (55, 175, 115, 235)),
        (7, (56, 176, 116, 236)),
        (14, (63, 183, 123, 243)),
        (15, (64, 184, 124, 244)),
        (22, (69, 189, 129, 249)),
        (23, (70, 190, 130, 250)),
        (30, (77, 197, 137, 257)),
        (31, (78, 198, 138, 258)),
        (38, (85, 205, 145, 265)),
        (39, (86, 206, 146, 266)),
        (46, (93, 213, 153, 273)),
        (47, (94, 214, 154, 274)),
        (54, (101, 221, 161, 281)),
        (55, (102, 222, 162, 282)),
    ),
}
QUAD_SOCKET_FOUR_WAY_HT = cores(
    (core, socket, socket, cpus)
    for socket, rows in _QUAD_SOCKET_CORES.items()
    for core, cpus in rows
)

# topoDualSocketMultiNumaPerSocketHT (dual Xeon Gold 6230): NUMA n holds CPUs 10n..10n+9
# and 40+10n..40+10n+9; NUMA 0-1 on socket 0, 2-3 on socket 1; core i is CPUs i and i+40.
DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT = _smt2(n_cores=40, cores_per_numa=10, numas_per_socket=2)

# fakeTopoMultiSocketDualSocketPerNumaHT: the same CPUs and cores with NUMA nodes and
# sockets flipped: socket i // 10, NUMA node i // 20 (4 sockets, 2 NUMA nodes).
MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT = cores((i, i // 10, i // 20, (i, i + 40)) for i in range(40))

# topoDualSocketMultiNumaPerSocketHTLarge (dual AMD EPYC 7742, NPS=4): NUMA n holds CPUs
# 16n..16n+15 and 128+16n..; NUMA 0-3 on socket 0, 4-7 on socket 1; core i is i and i+128.
DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT_LARGE = _smt2(
    n_cores=128, cores_per_numa=16, numas_per_socket=4
)

# topology_hints_test.go returnMachineInfo(), through kubelet's topology.Discover (a core's
# id is its lowest thread): NUMA/socket 0 cores (0,6) (1,7) (2,8); NUMA/socket 1 (3,9)
# (4,10) (5,11).
HINTS_MACHINE = cores((i, i // 3, i // 3, (i, i + 6)) for i in range(6))

# --- uncore-cache machines ------------------------------------------------------------------

# topoUncoreSingleSocketNoSMT: 16 CPUs, one socket and NUMA node, an uncore cache per 4 cores.
UNCORE_SINGLE_SOCKET_NO_SMT = _regular(16, threads=1, per_socket=16, per_numa=16, per_uncore=4)

# topoUncoreDualSocketNoSMT: 16 CPUs, a socket (= NUMA node) per 8, an uncore cache per 4.
UNCORE_DUAL_SOCKET_NO_SMT = _regular(16, threads=1, per_socket=8, per_numa=8, per_uncore=4)

# topoUncoreSingleSocketMultiNuma: 16 CPUs, one socket, NUMA nodes 0-7 and 8-15, an uncore
# cache per 4 CPUs.
UNCORE_SINGLE_SOCKET_MULTI_NUMA = _regular(16, threads=1, per_socket=16, per_numa=8, per_uncore=4)

# topoUncoreSingleSocketSMT: 8 cores of 2 threads (k, k+8), two uncore caches of 4 cores.
UNCORE_SINGLE_SOCKET_SMT = _regular(8, threads=2, per_socket=8, per_numa=8, per_uncore=4)

# topoDualSocketSingleNumaPerSocketSMTUncore (dual AMD EPYC 9654): 192 cores (k, k+192), a
# socket = NUMA node per 96 cores, an uncore cache per 8 cores (24 of 16 CPUs).
DUAL_SOCKET_SMT_UNCORE = _regular(192, threads=2, per_socket=96, per_numa=96, per_uncore=8)

# topoSingleSocketSingleNumaPerSocketSMTSmallUncore (AMD EPYC 7702P): 64 cores (k, k+64),
# an uncore cache per 4 cores (16 of 8 CPUs).
SINGLE_SOCKET_SMT_SMALL_UNCORE = _regular(64, threads=2, per_socket=64, per_numa=64, per_uncore=4)

# topoSingleSocketSingleNumaPerSocketNoSMTSmallUncore (EPYC 7702P without SMT): 64 CPUs, an
# uncore cache per 4.
SINGLE_SOCKET_NO_SMT_SMALL_UNCORE = _regular(
    64, threads=1, per_socket=64, per_numa=64, per_uncore=4
)

# topoSmallDualSocketSingleNumaPerSocketSMTUncore (dual AMD EPYC 7303): 64 cores (k, k+64), a
# socket = NUMA node per 32 cores, an uncore cache per 8 cores.
SMALL_DUAL_SOCKET_SMT_UNCORE = _regular(64, threads=2, per_socket=32, per_numa=32, per_uncore=8)

# topoSmallDualSocketSingleNumaPerSocketNoSMTUncore: the same without SMT (64 CPUs).
SMALL_DUAL_SOCKET_NO_SMT_UNCORE = _regular(64, threads=1, per_socket=32, per_numa=32, per_uncore=8)

# topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore: 32 CPUs, an uncore cache per 8.
SMALL_SINGLE_SOCKET_NO_SMT_UNCORE = _regular(
    32, threads=1, per_socket=32, per_numa=32, per_uncore=8
)

# topoLargeSingleSocketSingleNumaPerSocketSMTUncore: 128 cores (k, k+128), an uncore cache
# per 8 cores (16 of 16 CPUs).
LARGE_SINGLE_SOCKET_SMT_UNCORE = _regular(
    128, threads=2, per_socket=128, per_numa=128, per_uncore=8
)

# topoDualSocketMultiNumaPerSocketUncore (dual EPYC 9654, NPS=2, no SMT): 192 CPUs, a NUMA
# node per 48, a socket per 96, an uncore cache per 8 (core ids unique, see above).
DUAL_SOCKET_MULTI_NUMA_UNCORE = _regular(192, threads=1, per_socket=96, per_numa=48, per_uncore=8)

# topoDualSocketSubNumaPerSocketHTMonolithicUncore (dual Xeon Platinum 8490H, SNC): 120 cores
# (k, k+120), a NUMA node per 30 cores, a socket per 60, one uncore cache per socket.
DUAL_SOCKET_SUB_NUMA_MONO_UNCORE = _regular(
    120, threads=2, per_socket=60, per_numa=30, per_uncore=60
)

# topoSingleSocketSingleNumaPerSocketPCoreHTMonolithicUncore (Core i7-12850HX): 8 E-cores of
# one thread (CPUs 0-7) and 8 P-cores of two (core k = CPUs k and k+8 for k in 8-15), one
# uncore cache.
PCORE_ECORE_MONO_UNCORE = uncore_cores(
    [(k, 0, 0, 0, (k,)) for k in range(8)] + [(k, 0, 0, 0, (k, k + 8)) for k in range(8, 16)]
)

# topoLargeSingleSocketSingleNumaPerSocketUncore (Ampere Altra 128C): 128 CPUs, an uncore
# cache per 8.
LARGE_SINGLE_SOCKET_UNCORE = _regular(128, threads=1, per_socket=128, per_numa=128, per_uncore=8)

# topoSingleSocketSingleNumaPerSocketUncore (AWS Graviton3): 64 CPUs, one uncore cache.
SINGLE_SOCKET_MONO_UNCORE = _regular(64, threads=1, per_socket=64, per_numa=64, per_uncore=64)

UNCORE_TOPOLOGIES: dict[str, Topology] = {
    "topoUncoreSingleSocketNoSMT": UNCORE_SINGLE_SOCKET_NO_SMT,
    "topoUncoreDualSocketNoSMT": UNCORE_DUAL_SOCKET_NO_SMT,
    "topoUncoreSingleSocketMultiNuma": UNCORE_SINGLE_SOCKET_MULTI_NUMA,
    "topoUncoreSingleSocketSMT": UNCORE_SINGLE_SOCKET_SMT,
    "topoDualSocketSingleNumaPerSocketSMTUncore": DUAL_SOCKET_SMT_UNCORE,
    "topoSingleSocketSingleNumaPerSocketSMTSmallUncore": SINGLE_SOCKET_SMT_SMALL_UNCORE,
    "topoSingleSocketSingleNumaPerSocketNoSMTSmallUncore": SINGLE_SOCKET_NO_SMT_SMALL_UNCORE,
    "topoSmallDualSocketSingleNumaPerSocketSMTUncore": SMALL_DUAL_SOCKET_SMT_UNCORE,
    "topoSmallDualSocketSingleNumaPerSocketNoSMTUncore": SMALL_DUAL_SOCKET_NO_SMT_UNCORE,
    "topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore": SMALL_SINGLE_SOCKET_NO_SMT_UNCORE,
    "topoLargeSingleSocketSingleNumaPerSocketSMTUncore": LARGE_SINGLE_SOCKET_SMT_UNCORE,
    "topoDualSocketMultiNumaPerSocketUncore": DUAL_SOCKET_MULTI_NUMA_UNCORE,
    "topoDualSocketSubNumaPerSocketHTMonolithicUncore": DUAL_SOCKET_SUB_NUMA_MONO_UNCORE,
    "topoSingleSocketSingleNumaPerSocketPCoreHTMonolithicUncore": PCORE_ECORE_MONO_UNCORE,
    "topoLargeSingleSocketSingleNumaPerSocketUncore": LARGE_SINGLE_SOCKET_UNCORE,
    "topoSingleSocketSingleNumaPerSocketUncore": SINGLE_SOCKET_MONO_UNCORE,
}
"""kubelet's uncore-cache fixture name -> the machine."""

TOPOLOGIES: dict[str, Topology] = {
    "topoSingleSocketHT": SINGLE_SOCKET_HT,
    "topoDualSocketHT": DUAL_SOCKET_HT,
    "topoTripleSocketHT": TRIPLE_SOCKET_HT,
    "topoDualSocketNoHT": DUAL_SOCKET_NO_HT,
    "topoQuadSocketFourWayHT": QUAD_SOCKET_FOUR_WAY_HT,
    "topoDualSocketMultiNumaPerSocketHT": DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT,
    "fakeTopoMultiSocketDualSocketPerNumaHT": MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT,
    "topoDualSocketMultiNumaPerSocketHTLarge": DUAL_SOCKET_MULTI_NUMA_PER_SOCKET_HT_LARGE,
    "returnMachineInfo": HINTS_MACHINE,
    **UNCORE_TOPOLOGIES,
}
"""kubelet's fixture name -> the machine."""
