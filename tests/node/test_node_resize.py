"""In-place resizes of a Guaranteed container through the API's ``resize`` subresource, with
crihook's resize settings on (kubelet's alpha gates for exclusive resources):

- ``[hooks.cpuset] resize_exclusive_cpus`` (InPlacePodVerticalScalingExclusiveCPUs): the
  exclusive CPUs grow onto the free CPU and shrink back to the CPU the container was
  created with, in place.
- ``[hooks.numa] resize_exclusive_memory`` (InPlacePodVerticalScalingExclusiveMemory): the
  memory placed for it grows within the NUMA nodes it holds, and a growth past their free
  memory is refused with crihook's message in kubelet's resize condition.

(Both refused with the settings off: test_node_pods.)

No CPU is reserved here (kubelet's ``reservedSystemCPUs`` and crihook's ``reserved_cpus``
are empty), so the 2-CPU node can admit a 2-CPU Guaranteed pod. This machine has one NUMA
node; ``reserved_memory`` leaves containers :data:`NUMA_ALLOCATABLE` of it, as kubelet's
``--reserved-memory`` would: a size that kubelet's node allocatable admits (it knows
nothing of NUMA nodes with its memory manager off) but the NUMA node the container holds
cannot take. (A growth that would fit on another NUMA node only is refused all the same:
tests/unit/test_numa_hook.py, on a 2-node fixture.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crihook.hooks.node.sysfs import read_topology
from tests.lab import cgroups
from tests.lab.apiserver import ApiClient
from tests.lab.crihook_proc import PATIENCE, CrihookProcess
from tests.lab.kubelet_node import KubeletNode, wait_until
from tests.lab.runtime_lab import RuntimeLab
from tests.node.conftest import (
    cpuset,
    placed_memory,
    resize,
    sized,
    start_crihook,
    wait_resize_refused,
)
from tests.node.manifests import pod_manifest

pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

MiB = 1024 * 1024
NUMA_ALLOCATABLE = 160 * MiB


def crihook_config() -> str:
    """Resizes on; NUMA node 0 keeps :data:`NUMA_ALLOCATABLE` for containers."""
    memory = read_topology("/sys").memory[0]
    pages = sum(kib * 1024 * count for kib, count in memory.hugepages.items())
    reserved = memory.total_bytes - pages - NUMA_ALLOCATABLE
    return (
        "[hooks.cpuset]\nreserved_cpus = 0\nresize_exclusive_cpus = true\n"
        f'[hooks.numa]\nresize_exclusive_memory = true\nreserved_memory = {{ "0" = {reserved} }}\n'
    )


@pytest.fixture(scope="module")
def crihook(containerd: RuntimeLab) -> Iterator[CrihookProcess]:
    proc = start_crihook(containerd, crihook_config())
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def reserved_cpus() -> str:
    return ""  # none: the 2-CPU node admits a 2-CPU Guaranteed pod


def test_exclusive_cpus_grow_and_shrink_in_place_through_the_api(
    node: KubeletNode, api: ApiClient
) -> None:
    api.create_pod(pod_manifest("grow", "guaranteed", node_name=node.name))
    app = node.wait_running("grow").containers["app"]
    first = cgroups.cgroup_value(app.cgroup, "cpuset.cpus")
    assert first in ("0", "1")

    def holds(cpus: str) -> bool:
        return cgroups.cgroup_value(app.cgroup, "cpuset.cpus") == cpus

    resize(api, "grow", sized("2", "64Mi"))
    wait_until(lambda: holds("0-1"), PATIENCE, "the container on both CPUs")
    resize(api, "grow", sized("1", "64Mi"))
    wait_until(lambda: holds(first), PATIENCE, f"the container back on CPU {first}")
    after = node.view.pod("grow", "default")
    assert after is not None and after.containers["app"].id == app.id  # in place


def test_placed_memory_grows_within_its_numa_node_and_no_further(
    node: KubeletNode, api: ApiClient, crihook: CrihookProcess
) -> None:
    api.create_pod(pod_manifest("numa-grow", "guaranteed", node_name=node.name))
    pod = node.wait_running("numa-grow")
    app = pod.containers["app"]
    assert placed_memory(crihook, pod.sandbox_id) == [64 * MiB]

    def limit() -> int | None:
        return cgroups.read_limits(app.cgroup).memory_limit

    resize(api, "numa-grow", sized("1", "96Mi"))
    wait_until(lambda: limit() == 96 * MiB, PATIENCE, "the container's memory limit at 96Mi")
    wait_until(
        lambda: placed_memory(crihook, pod.sandbox_id) == [96 * MiB],
        PATIENCE,
        "96Mi placed for it on NUMA node 0",
    )
    held = cpuset(pod)

    # Past what NUMA node 0 has free (64Mi of NUMA_ALLOCATABLE): kubelet admits it, crihook
    # refuses it, and kubelet keeps the pod at 96Mi.
    resize(api, "numa-grow", sized("1", "256Mi"))
    condition = wait_resize_refused(api, "numa-grow", "do not fit on NUMA node(s) 0 it holds")
    assert (
        f"resize of container 'app' to {256 * MiB} bytes of memory is infeasible"
        in (condition["message"])
    )
    assert limit() == 96 * MiB
    assert placed_memory(crihook, pod.sandbox_id) == [96 * MiB]
    # No resize left pending: the 96Mi one is settled once crihook saw the runtime's answer
    # (or, had that answer been lost, at its next synchronize). Read from the state files,
    # which follow crihook's memory by a write-behind: once, at load 9, they still showed it
    # right after the refusal.
    wait_until(
        lambda: not crihook.hook_state("numa").get("resizing"),
        PATIENCE,
        "no resize pending in the numa hook's state",
    )
    assert cpuset(pod) == held
    after = node.view.pod("numa-grow", "default")
    assert after is not None and after.containers["app"].id == app.id  # in place
