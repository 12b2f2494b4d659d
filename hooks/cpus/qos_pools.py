"""`QosPools`: the node pools held in kubelet's QoS cgroups (`shared_pool_in = "qos-cgroups"`).

On cgroup v2 a cgroup whose own `cpuset.cpus` is empty runs on its parent's effective CPUs,
and a parent may be narrowed whatever its children ask (their effective set is cut to it).
So the containers of Burstable and BestEffort pods are created without a cpuset, and the
pool they run on is written once, into their QoS cgroup (`kubepods/burstable` holds the
shared pool, `kubepods/besteffort` the BE pool, which is the shared pool unless Koordinator
lends CPUs to BE pods): a change of the pool is a file write per QoS cgroup, not an update
per container.

This module only keeps the books: which QoS cgroups there are (kubelet's default paths for
either driver, and the parents of the pods seen), what each was last given, which were not
there yet. `QosWriter` (qos_writer.py) writes what `due` lists, through the `PodCgroups`
seam, in a thread, and every `QOS_VERIFY_SECONDS` reads back what it wrote (`written`): one
found holding other CPUs (`same_cpus`) was reset behind crihook's back and is due again
(`reset_found`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crihook.hooks.cpus.koordinator import BE_POOL, SHARED_POOL
from crihook.hooks.cpus.pool import CpuPool
from crihook.hooks.node import parse_cpu_list
from crihook.hooks.node.qos import DEFAULT_QOS_CGROUPS, QOS_BESTEFFORT, QosCgroup, qos_cgroup

__all__ = ["QosPools", "pool_of_qos", "same_cpus"]


def pool_of_qos(qos: str) -> str:
    """The node pool a QoS cgroup holds: a BestEffort pod's containers run on the BE pool,
    every other's on the shared pool (`koordinator.member_pool`)."""
    return BE_POOL if qos == QOS_BESTEFFORT else SHARED_POOL


def same_cpus(held: str, written: str) -> bool:
    """Whether a QoS cgroup's `cpuset.cpus` as read back holds the cpulist written there,
    compared as sets of CPUs (the kernel prints ranges: "0-3" is "0,1,2,3"). Text that is
    no cpulist differs."""
    try:
        return parse_cpu_list(held) == parse_cpu_list(written)
    except ValueError:
        return False


@dataclass
class QosPools:
    known: dict[str, str] = field(
        default_factory=lambda: {c.path: c.qos for c in DEFAULT_QOS_CGROUPS}
    )
    """QoS cgroup path → its class (`burstable`, `besteffort`)."""
    written: dict[str, str] = field(default_factory=dict)
    """Path → the cpulist it was last given (what it holds, unless someone else wrote)."""
    absent: dict[str, str] = field(default_factory=dict)
    """Path → the cpulist it was to get when it did not exist: tried again only when the
    pool changes or a pod in it is seen (kubelet made it by then), not on every call."""
    failures: int = 0
    """Writes that failed (logged; retried)."""
    repairs: int = 0
    """QoS cgroups found holding other CPUs than they were given (reset behind crihook's
    back: systemd, an operator, another tool), and written again."""
    read_failures: int = 0
    """Reads back that failed (logged; read again at the next check)."""

    def learn(self, cgroup_parent: str, *, appeared: bool = False) -> QosCgroup | None:
        """The QoS cgroup a pod's cgroup sits in (None: a Guaranteed pod, or a parent that
        is no kubelet pod cgroup), known from now on. `appeared`: kubelet made the pod's
        cgroup (RunPodSandbox, a running pod), so its QoS cgroup is there: one found absent
        before is tried again."""
        found = qos_cgroup(cgroup_parent)
        if found is not None:
            self.know(found)
            if appeared:
                self.absent.pop(found.path, None)
        return found

    def know(self, found: QosCgroup) -> None:
        """A QoS cgroup, known from now on (written whenever its pool changes)."""
        self.known.setdefault(found.path, found.qos)

    def due(self, pool: CpuPool) -> list[tuple[str, str]]:
        """(path, cpulist) for each QoS cgroup whose pool is not what it was last given. An
        empty pool is never due: on cgroup v2 an empty `cpuset.cpus` is every CPU (the
        ledger refuses to empty a pool containers run on; one nobody runs on may empty)."""
        out = []
        for path, qos in self.known.items():
            text = pool.node_pool_text(pool_of_qos(qos))  # kept by the pool: no walk
            if text and self.written.get(path) != text and self.absent.get(path) != text:
                out.append((path, text))
        return out

    def done(self, path: str, text: str, existed: bool) -> None:
        if existed:
            self.written[path] = text
            self.absent.pop(path, None)
        else:
            self.absent[path] = text

    def reset_found(self, path: str) -> None:
        """`path` was read back holding other CPUs than it was given: due again."""
        self.repairs += 1
        self.written.pop(path, None)

    def failed(self, path: str) -> None:
        self.failures += 1
        self.written.pop(path, None)  # unknown now: due again

    def rewrite(self) -> None:
        """Everything due again (start, synchronize): what a QoS cgroup holds is not taken
        on trust from an earlier write (another crihook, systemd, an operator)."""
        self.written.clear()
        self.absent.clear()
