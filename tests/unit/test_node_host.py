"""The Host seam: a container's processes found in fake cgroup trees (both drivers, v1 and v2)
and in a real cgroup, oom_score_adj written to a fake /proc and to a real process."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.hooks.node import Host, LinuxHost, expand_slice

UID = "0b0b0b0b-1111-2222-3333-444444444444"
UID_SYSTEMD = UID.replace("-", "_")  # systemd escapes the dashes of the uid
CID = "4f" * 32  # a containerd container id: 64 hex digits

CGROUPFS_PARENT = f"/kubepods/burstable/pod{UID}"
CGROUPFS_PATH = f"kubepods/burstable/pod{UID}/{CID}"
SYSTEMD_PARENT = f"kubepods-burstable-pod{UID_SYSTEMD}.slice"
SYSTEMD_PATH = (
    f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/"
    f"cri-containerd-{CID}.scope"
)


def _procs(directory: Path, *pids: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def _v2_root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return root


# --- finding a container's processes in fake trees ------------------------------------------


@pytest.mark.parametrize(
    ("hierarchy", "parent", "relative"),
    [
        ("pids", CGROUPFS_PARENT, CGROUPFS_PATH),
        ("memory", CGROUPFS_PARENT, CGROUPFS_PATH),
        ("cpu,cpuacct", CGROUPFS_PARENT, CGROUPFS_PATH),
        ("cpu", CGROUPFS_PARENT, CGROUPFS_PATH),
        ("pids", SYSTEMD_PARENT, SYSTEMD_PATH),
        ("memory", SYSTEMD_PARENT, SYSTEMD_PATH),
    ],
    ids=[
        "v1-cgroupfs-pids",
        "v1-cgroupfs-memory-only",
        "v1-cgroupfs-cpu-cpuacct-only",
        "v1-cgroupfs-cpu-only",
        "v1-systemd-pids",
        "v1-systemd-memory-only",
    ],
)
def test_v1_container_pids(tmp_path: Path, hierarchy: str, parent: str, relative: str) -> None:
    root = tmp_path / "cgroup"
    _procs(root / hierarchy / relative, 30, 12)
    (root / "unified").mkdir()  # hybrid: a v2 mount beside the v1 ones, not used
    assert LinuxHost(cgroup_root=root).container_pids(parent, CID) == [12, 30]


@pytest.mark.parametrize(
    ("parent", "relative"),
    [(CGROUPFS_PARENT, CGROUPFS_PATH), (SYSTEMD_PARENT, SYSTEMD_PATH)],
    ids=["v2-cgroupfs", "v2-systemd"],
)
def test_v2_container_pids(tmp_path: Path, parent: str, relative: str) -> None:
    root = _v2_root(tmp_path)
    _procs(root / relative, 7)
    assert LinuxHost(cgroup_root=root).container_pids(parent, CID) == [7]


def test_v1_first_hierarchy_wins(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _procs(root / "pids" / CGROUPFS_PATH, 1)
    _procs(root / "memory" / CGROUPFS_PATH, 2)
    assert LinuxHost(cgroup_root=root).container_pids(CGROUPFS_PARENT, CID) == [1]


def test_nested_cgroups_included(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    container = root / CGROUPFS_PATH
    _procs(container)  # a v2 cgroup with children holds no processes itself
    _procs(container / "init.scope", 40)
    _procs(container / "system.slice" / "sshd.service", 41, 42)
    assert LinuxHost(cgroup_root=root).container_pids(CGROUPFS_PARENT, CID) == [40, 41, 42]


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_missing_container_has_no_pids(tmp_path: Path, v2: bool) -> None:
    root = _v2_root(tmp_path) if v2 else tmp_path / "cgroup"
    _procs((root if v2 else root / "pids") / f"kubepods/burstable/pod{UID}", 5)
    host = LinuxHost(cgroup_root=root)
    assert host.container_pids(CGROUPFS_PARENT, CID) == []
    assert host.container_pids(SYSTEMD_PARENT, CID) == []


def test_empty_container_cgroup(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    _procs(root / CGROUPFS_PATH)
    assert LinuxHost(cgroup_root=root).container_pids(CGROUPFS_PARENT, CID) == []


def test_unreadable_procs_names_path(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    _procs(root / CGROUPFS_PATH)
    nested = root / CGROUPFS_PATH / "child"
    nested.mkdir()
    (nested / "cgroup.procs").symlink_to("cgroup.procs")  # a loop: ELOOP, not "gone"
    with pytest.raises(OSError) as info:
        LinuxHost(cgroup_root=root).container_pids(CGROUPFS_PARENT, CID)
    assert str(info.value) == (
        f"[Errno 40] cannot read {nested / 'cgroup.procs'}: Too many levels of symbolic links"
    )


def test_malformed_procs_names_path(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    (root / CGROUPFS_PATH).mkdir(parents=True)
    (root / CGROUPFS_PATH / "cgroup.procs").write_text("12\nnope\n")
    with pytest.raises(OSError, match=f"malformed pid list in {root / CGROUPFS_PATH}/cgroup"):
        LinuxHost(cgroup_root=root).container_pids(CGROUPFS_PARENT, CID)


@pytest.mark.parametrize("systemd", [False, True], ids=["cgroupfs", "systemd"])
def test_crio_container_found_under_its_own_name(tmp_path: Path, systemd: bool) -> None:
    """CRI-O names a container's cgroup crio-<id> (crio-<id>.scope), its conmon's
    crio-conmon-<id> beside it: the container's processes are found, never conmon's."""
    root = _v2_root(tmp_path)
    parent = SYSTEMD_PARENT if systemd else CGROUPFS_PARENT
    base = SYSTEMD_PATH.rsplit("/", 1)[0] if systemd else f"kubepods/burstable/pod{UID}"
    suffix = ".scope" if systemd else ""
    _procs(root / base / f"crio-conmon-{CID}{suffix}", 7)
    _procs(root / base / f"crio-{CID}{suffix}", 8, 9)
    host = LinuxHost(cgroup_root=root)
    assert host.container_pids(parent, CID) == [8, 9]
    assert host.container_cgroups(parent, CID)[1] == f"{base}/crio-{CID}{suffix}"


@pytest.mark.parametrize(
    ("parent", "container_id", "expected"),
    [
        (CGROUPFS_PARENT, CID, CGROUPFS_PATH),
        (CGROUPFS_PARENT + "/", CID, CGROUPFS_PATH),
        (f"/kubepods/pod{UID}", CID, f"kubepods/pod{UID}/{CID}"),
        (SYSTEMD_PARENT, CID, SYSTEMD_PATH),
        ("kubepods.slice", "abc", "kubepods.slice/cri-containerd-abc.scope"),
        ("-.slice", "abc", "cri-containerd-abc.scope"),
        ("", "abc", "abc"),
    ],
    ids=[
        "cgroupfs-burstable",
        "cgroupfs-trailing-slash",
        "cgroupfs-guaranteed",
        "systemd-burstable",
        "systemd-top-slice",
        "systemd-root-slice",
        "cgroupfs-root",
    ],
)
def test_container_cgroup(parent: str, container_id: str, expected: str) -> None:
    assert LinuxHost().container_cgroup(parent, container_id) == expected


@pytest.mark.parametrize(
    ("parent", "container_id", "message"),
    [
        (CGROUPFS_PARENT, "../../etc", "not a container id: '../../etc'"),
        (CGROUPFS_PARENT, "a/b", "not a container id: 'a/b'"),
        (CGROUPFS_PARENT, "", "not a container id: ''"),
        (
            "/kubepods/../../x",
            CID,
            "cgroup parent climbs out of the cgroup root: '/kubepods/../../x'",
        ),
        ("kubepods--x.slice", CID, "invalid systemd slice name: 'kubepods--x.slice'"),
    ],
    ids=["dotdot-id", "slash-id", "empty-id", "dotdot-parent", "bad-slice"],
)
def test_container_cgroup_refuses(parent: str, container_id: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        LinuxHost().container_cgroup(parent, container_id)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("kubepods.slice", "kubepods.slice"),
        ("kubepods-besteffort.slice", "kubepods.slice/kubepods-besteffort.slice"),
        (
            "kubepods-besteffort-pod1_2.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice",
        ),
        ("-.slice", ""),
    ],
    ids=["one", "two", "three", "root"],
)
def test_expand_slice(name: str, expected: str) -> None:
    assert expand_slice(name) == expected


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("kubepods", "not a systemd slice name: 'kubepods'"),
        ("a/b.slice", "not a systemd slice name: 'a/b.slice'"),
        ("a--b.slice", "invalid systemd slice name: 'a--b.slice'"),
        ("-a.slice", "invalid systemd slice name: '-a.slice'"),
        ("a-.slice", "invalid systemd slice name: 'a-.slice'"),
        (".slice", "invalid systemd slice name: '.slice'"),
    ],
    ids=["no-suffix", "slash", "double-dash", "leading-dash", "trailing-dash", "empty"],
)
def test_expand_slice_refuses(name: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        expand_slice(name)
    assert str(info.value) == message


# --- oom_score_adj on a fake /proc ----------------------------------------------------------


def _fake_proc(tmp_path: Path, pid: int, score: str) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "oom_score_adj").write_text(score)
    return proc


@pytest.mark.parametrize(
    ("before", "score", "after"),
    [("0\n", 500, "500"), ("-1000\n", 7, "7"), ("0\n", -1000, "-1000"), ("5\n", 1000, "1000")],
    ids=["raise", "shorter-than-before", "min", "max"],
)
def test_write_oom_score_adj(tmp_path: Path, before: str, score: int, after: str) -> None:
    host = LinuxHost(proc_root=_fake_proc(tmp_path, 42, before))
    host.write_oom_score_adj(42, score)
    assert (tmp_path / "proc/42/oom_score_adj").read_text() == after
    assert host.read_oom_score_adj(42) == score


def test_write_to_gone_process_is_skipped(tmp_path: Path) -> None:
    host = LinuxHost(proc_root=_fake_proc(tmp_path, 42, "0\n"))
    host.write_oom_score_adj(43, 500)
    assert not (tmp_path / "proc/43").exists()  # nothing created in its place


def test_read_gone_process(tmp_path: Path) -> None:
    host = LinuxHost(proc_root=_fake_proc(tmp_path, 42, "0\n"))
    with pytest.raises(ProcessLookupError, match="no process 43"):
        host.read_oom_score_adj(43)


@pytest.mark.parametrize("score", [-1001, 1001], ids=["below", "above"])
def test_write_out_of_range(tmp_path: Path, score: int) -> None:
    host = LinuxHost(proc_root=_fake_proc(tmp_path, 42, "0\n"))
    with pytest.raises(ValueError, match=f"oom_score_adj must be in -1000..1000, not {score}"):
        host.write_oom_score_adj(42, score)


def test_write_error_names_path(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42" / "oom_score_adj").mkdir(parents=True)
    with pytest.raises(IsADirectoryError) as info:
        LinuxHost(proc_root=proc).write_oom_score_adj(42, 1)
    assert str(proc / "42" / "oom_score_adj") in str(info.value)


def test_read_malformed(tmp_path: Path) -> None:
    host = LinuxHost(proc_root=_fake_proc(tmp_path, 42, "lots\n"))
    with pytest.raises(OSError) as info:
        host.read_oom_score_adj(42)
    path = tmp_path / "proc/42/oom_score_adj"
    assert str(info.value) == f"[Errno 22] malformed oom_score_adj 'lots\\n' in {path}"


def test_linux_host_is_a_host() -> None:
    host: Host = LinuxHost()
    assert isinstance(host, LinuxHost)


# --- the real kernel ------------------------------------------------------------------------

_PIDS_ROOT = Path("/sys/fs/cgroup/pids")


@pytest.fixture
def real_container_cgroup() -> Iterator[tuple[str, str, Path]]:
    """A fresh ``/crihook-test-<random>/<fake id>`` cgroup in the real v1 pids hierarchy,
    removed afterwards (the test must have ended its processes)."""
    if os.geteuid() != 0 or not (_PIDS_ROOT / "cgroup.procs").is_file():
        pytest.fail("needs root and a cgroup v1 pids hierarchy (the test bed has both)")
    parent = _PIDS_ROOT / f"crihook-test-{secrets.token_hex(4)}"
    container_id = secrets.token_hex(32)
    container = parent / container_id
    container.mkdir(parents=True)
    try:
        yield f"/{parent.name}", container_id, container
    finally:
        for directory in (container, parent):
            if directory.exists():
                directory.rmdir()


def test_real_container_pids_and_oom_score(real_container_cgroup: tuple[str, str, Path]) -> None:
    parent, container_id, cgroup = real_container_cgroup
    host = LinuxHost()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        assert host.container_pids(parent, container_id) == [sleeper.pid]

        host.write_oom_score_adj(sleeper.pid, 500)
        assert Path(f"/proc/{sleeper.pid}/oom_score_adj").read_text() == "500\n"
        assert host.read_oom_score_adj(sleeper.pid) == 500
    finally:
        sleeper.kill()
        sleeper.wait()
    # Exited and reaped: the cgroup is empty and a late write is skipped.
    assert host.container_pids(parent, container_id) == []
    host.write_oom_score_adj(sleeper.pid, 600)


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))  # CAP_SYS_RESOURCE = 24
    return False


def test_real_negative_score_needs_cap_sys_resource() -> None:
    """Without CAP_SYS_RESOURCE (this VM) a negative score is refused, naming the path;
    with it, it is written."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        if _has_cap_sys_resource():
            LinuxHost().write_oom_score_adj(sleeper.pid, -500)
            assert LinuxHost().read_oom_score_adj(sleeper.pid) == -500
        else:
            with pytest.raises(PermissionError) as info:
                LinuxHost().write_oom_score_adj(sleeper.pid, -500)
            assert f"/proc/{sleeper.pid}/oom_score_adj" in str(info.value)
    finally:
        sleeper.kill()
        sleeper.wait()


# --- a pod's CFS quota ------------------------------------------------------------------------

POD_PATH = f"kubepods/burstable/pod{UID}"
SYSTEMD_POD_PATH = (
    f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice"
)


@pytest.mark.parametrize(
    ("hierarchy", "parent", "relative"),
    [
        ("cpu,cpuacct", CGROUPFS_PARENT, POD_PATH),
        ("cpu", CGROUPFS_PARENT, POD_PATH),
        ("cpu,cpuacct", SYSTEMD_PARENT, SYSTEMD_POD_PATH),
    ],
    ids=["v1-cpu-cpuacct", "v1-cpu", "v1-systemd"],
)
def test_v1_pod_quota_lifted(tmp_path: Path, hierarchy: str, parent: str, relative: str) -> None:
    pod = tmp_path / hierarchy / relative
    pod.mkdir(parents=True)
    (pod / "cpu.cfs_quota_us").write_text("250000\n")
    assert LinuxHost(cgroup_root=tmp_path).unlimit_cpu_quota(parent) is True
    assert (pod / "cpu.cfs_quota_us").read_text() == "-1"


def test_v2_pod_quota_lifted_keeping_the_period(tmp_path: Path) -> None:
    root = _v2_root(tmp_path)
    pod = root / POD_PATH
    pod.mkdir(parents=True)
    (pod / "cpu.max").write_text("250000 100000\n")
    assert LinuxHost(cgroup_root=root).unlimit_cpu_quota(CGROUPFS_PARENT) is True
    assert (pod / "cpu.max").read_text() == "max 100000"


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_missing_pod_cgroup_is_not_an_error(tmp_path: Path, v2: bool) -> None:
    root = _v2_root(tmp_path) if v2 else tmp_path
    assert LinuxHost(cgroup_root=root).unlimit_cpu_quota(CGROUPFS_PARENT) is False
    assert not (root / POD_PATH).exists()  # nothing created


@pytest.mark.parametrize("parent", ["", "/", "/kubepods/../etc"], ids=["empty", "root", "climbs"])
def test_pod_quota_refuses_odd_parents(tmp_path: Path, parent: str) -> None:
    with pytest.raises(ValueError, match="not a pod cgroup parent"):
        LinuxHost(cgroup_root=tmp_path).unlimit_cpu_quota(parent)


def test_real_pod_quota_lifted() -> None:
    """In the real v1 cpu hierarchy: a pod cgroup with kubelet's quota gets none."""
    cpu = Path("/sys/fs/cgroup/cpu,cpuacct")
    if not cpu.is_dir():
        cpu = Path("/sys/fs/cgroup/cpu")
    parent = f"/crihook-test-{secrets.token_hex(4)}"
    pod = cpu / parent.lstrip("/")
    pod.mkdir()
    try:
        (pod / "cpu.cfs_quota_us").write_text("150000")
        assert (pod / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert LinuxHost().unlimit_cpu_quota(parent) is True
        assert (pod / "cpu.cfs_quota_us").read_text().strip() == "-1"
    finally:
        pod.rmdir()
