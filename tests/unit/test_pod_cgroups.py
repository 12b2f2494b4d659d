"""LinuxPodCgroups on fake cgroup trees (temp dirs shaped as /sys/fs/cgroup): cgroup v2 and
v1 (cpu co-mounted with cpuacct or alone), the cgroupfs and the systemd driver."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crihook.hooks.node import LinuxPodCgroups, PodLimits, pod_cgroup_path
from crihook.hooks.node.cgroups import shares_to_weight

UID = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
CGROUPFS = f"/kubepods/besteffort/pod{UID}"
SYSTEMD = f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
SYSTEMD_PATH = f"kubepods.slice/kubepods-besteffort.slice/{SYSTEMD}"
LIMITS = PodLimits(
    cpu_shares=512, cpu_quota_us=150_000, cpu_period_us=100_000, memory_limit_bytes=512 << 20
)
UNLIMITED = PodLimits(cpu_shares=2, cpu_quota_us=-1, memory_limit_bytes=-1)

V2_FILES = {"cpu.weight": "1", "cpu.max": "max 100000", "memory.max": "max"}
V1_FILES = {
    "cpu": {"cpu.shares": "2", "cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"},
    "memory": {"memory.limit_in_bytes": "9223372036854771712"},
}


def v2_tree(root: Path, pod: str) -> Path:
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    cgroup = root / pod
    cgroup.mkdir(parents=True)
    for name, value in V2_FILES.items():
        (cgroup / name).write_text(value)
    return cgroup


def v1_tree(root: Path, pod: str, cpu_dir: str) -> dict[str, Path]:
    dirs = {}
    for controller, files in V1_FILES.items():
        cgroup = root / (cpu_dir if controller == "cpu" else controller) / pod
        cgroup.mkdir(parents=True)
        for name, value in files.items():
            (cgroup / name).write_text(value)
        dirs[controller] = cgroup
    return dirs


def read(cgroup: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(cgroup.iterdir())}


@pytest.mark.parametrize(
    ("parent", "path"),
    [
        (CGROUPFS, CGROUPFS.lstrip("/")),
        ("kubepods/burstable/podx/", "kubepods/burstable/podx"),
        (SYSTEMD, SYSTEMD_PATH),
        ("kubepods.slice", "kubepods.slice"),
    ],
    ids=["cgroupfs", "cgroupfs-relative", "systemd", "systemd-top"],
)
def test_the_pod_cgroup_path_for_either_driver(parent: str, path: str) -> None:
    assert pod_cgroup_path(parent) == path


@pytest.mark.parametrize("parent", ["", "/", "/kubepods/../etc", "a--b.slice"])
def test_a_parent_that_is_no_pod_cgroup_is_refused(parent: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"slice|pod cgroup"):
        LinuxPodCgroups(tmp_path).write_limits(parent, LIMITS)


@pytest.mark.parametrize(
    ("shares", "weight"),
    [(2, 1), (1024, 39), (512, 20), (262144, 10000), (0, 1), (10**7, 10000)],
    ids=["min", "one-cpu", "half-cpu", "max", "below", "above"],
)
def test_shares_as_cgroup_v2_weight(shares: int, weight: int) -> None:
    assert shares_to_weight(shares) == weight


@pytest.mark.parametrize(("parent", "path"), [(CGROUPFS, CGROUPFS[1:]), (SYSTEMD, SYSTEMD_PATH)])
def test_cgroup_v2_gets_weight_cpu_max_and_memory_max(
    tmp_path: Path, parent: str, path: str
) -> None:
    cgroup = v2_tree(tmp_path, path)
    written = LinuxPodCgroups(tmp_path).write_limits(parent, LIMITS)
    assert read(cgroup) == {
        "cpu.max": "150000 100000",
        "cpu.weight": "20",
        "memory.max": str(512 << 20),
    }
    assert written == [str(cgroup / n) for n in ("cpu.weight", "cpu.max", "memory.max")]


def test_cgroup_v2_unlimited_is_max(tmp_path: Path) -> None:
    cgroup = v2_tree(tmp_path, CGROUPFS[1:])
    (cgroup / "cpu.max").write_text("50000 100000")
    LinuxPodCgroups(tmp_path).write_limits(CGROUPFS, UNLIMITED)
    assert read(cgroup) == {"cpu.max": "max 100000", "cpu.weight": "1", "memory.max": "max"}


@pytest.mark.parametrize("cpu_dir", ["cpu,cpuacct", "cpu"], ids=["co-mounted", "cpu-alone"])
@pytest.mark.parametrize(("parent", "path"), [(CGROUPFS, CGROUPFS[1:]), (SYSTEMD, SYSTEMD_PATH)])
def test_cgroup_v1_gets_shares_cfs_quota_and_memory_limit(
    tmp_path: Path, parent: str, path: str, cpu_dir: str
) -> None:
    dirs = v1_tree(tmp_path, path, cpu_dir)
    written = LinuxPodCgroups(tmp_path).write_limits(parent, LIMITS)
    assert read(dirs["cpu"]) == {
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "150000",
        "cpu.shares": "512",
    }
    assert read(dirs["memory"]) == {"memory.limit_in_bytes": str(512 << 20)}
    cpu = dirs["cpu"]
    assert written == [  # the period before the quota it is for
        str(cpu / "cpu.shares"),
        str(cpu / "cpu.cfs_period_us"),
        str(cpu / "cpu.cfs_quota_us"),
        str(dirs["memory"] / "memory.limit_in_bytes"),
    ]


def test_cgroup_v1_unlimited_is_minus_one(tmp_path: Path) -> None:
    dirs = v1_tree(tmp_path, CGROUPFS[1:], "cpu")
    (dirs["cpu"] / "cpu.cfs_quota_us").write_text("50000")
    (dirs["memory"] / "memory.limit_in_bytes").write_text("1048576")
    LinuxPodCgroups(tmp_path).write_limits(CGROUPFS, UNLIMITED)
    assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "-1"
    assert (dirs["memory"] / "memory.limit_in_bytes").read_text() == "-1"


def test_only_the_limits_given_are_written(tmp_path: Path) -> None:
    cgroup = v2_tree(tmp_path, CGROUPFS[1:])
    LinuxPodCgroups(tmp_path).write_limits(CGROUPFS, PodLimits(memory_limit_bytes=1 << 30))
    assert read(cgroup) == {**V2_FILES, "memory.max": str(1 << 30)}


@pytest.mark.parametrize("version", [1, 2])
def test_a_pod_cgroup_that_does_not_exist_is_not_made(tmp_path: Path, version: int) -> None:
    if version == 2:
        (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    else:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "memory").mkdir()
    before = sorted(tmp_path.rglob("*"))
    assert LinuxPodCgroups(tmp_path).write_limits(CGROUPFS, LIMITS) == []
    assert sorted(tmp_path.rglob("*")) == before


def test_a_missing_controller_file_is_an_error_naming_it(tmp_path: Path) -> None:
    cgroup = v2_tree(tmp_path, CGROUPFS[1:])
    (cgroup / "memory.max").unlink()  # the memory controller not enabled for the pod
    with pytest.raises(FileNotFoundError, match=re.escape(str(cgroup / "memory.max"))):
        LinuxPodCgroups(tmp_path).write_limits(CGROUPFS, LIMITS)
    assert not (cgroup / "memory.max").exists()  # never created
    assert (cgroup / "cpu.max").read_text() == "150000 100000"  # what came before is written
