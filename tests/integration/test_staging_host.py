"""`LinuxStaging` on this host's kernel (root): what it mounts is what was opened, read-only
when asked without losing the source's nosuid/nodev/noexec, a swapped path or device is
refused, and a release removes only what staging made, never what a mount shows."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.hooks.node import DeviceNode
from crihook.hooks.node.staging import LinuxStaging


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[LinuxStaging, Path]]:
    """A staging root and a source tree `src/dir/f`, `src/file`, both in tmp_path; every
    mount under the root is undone at the end (before tmp_path is removed)."""
    if os.geteuid() != 0:
        pytest.fail("mounting needs root (run the tests as root)", pytrace=False)
    (tmp_path / "src" / "dir").mkdir(parents=True)
    (tmp_path / "src" / "dir" / "f").write_text("checked")
    (tmp_path / "src" / "file").write_text("a file")
    staging = LinuxStaging(str(tmp_path / "staging"))
    try:
        yield staging, tmp_path / "src"
    finally:
        for key in staging.keys():  # noqa: SIM118 - a method, not a dict
            staging.release(key.split("/")[0])
        assert mounted_below(tmp_path) == []


def mounted_below(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(f"{path}/")]


def test_a_directory_pinned_read_only_is_the_opened_one_whatever_the_path_becomes(
    host: tuple[LinuxStaging, Path],
) -> None:
    staging, src = host
    staged = staging.pin_mount("p1/app.0", "m0", f"{src}/dir", readonly=True)
    assert staged == f"{staging.root}/p1/app.0/m0"
    os.rename(src / "dir", src / "dir.d")
    os.symlink("/etc", src / "dir")
    assert os.listdir(staged) == ["f"]
    with pytest.raises(OSError) as info:
        Path(staged, "new").write_text("x")
    assert info.value.errno == errno.EROFS
    assert stat.S_IMODE(os.stat(staging.root).st_mode) == 0o711


def test_a_read_only_pin_keeps_the_sources_nosuid_nodev_noexec(
    host: tuple[LinuxStaging, Path], tmp_path: Path
) -> None:
    staging, _ = host
    restricted = tmp_path / "restricted"
    restricted.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "nosuid,nodev,noexec", "t", str(restricted)], check=True
    )
    try:
        staged = staging.pin_mount("p1/app.0", "m0", str(restricted), readonly=True)
        flags = os.statvfs(staged).f_flag
        assert flags & os.ST_RDONLY and flags & os.ST_NOSUID
        assert flags & os.ST_NODEV and flags & os.ST_NOEXEC
        staging.release("p1")
    finally:
        subprocess.run(["umount", "-l", str(restricted)], check=True)


def test_a_file_is_pinned_on_a_file(host: tuple[LinuxStaging, Path]) -> None:
    staging, src = host
    staged = staging.pin_mount("p1/app.0", "m0", f"{src}/file", readonly=False)
    assert Path(staged).read_text() == "a file"


@pytest.mark.parametrize(
    ("make", "asked"),
    [
        ("symlink-on-the-way", "dir/f"),
        ("symlink-at-the-end", "dir"),
        ("gone", "dir"),
    ],
    ids=["symlink-on-the-way", "symlink-at-the-end", "gone"],
)
def test_a_path_changed_since_the_check_is_refused_and_nothing_is_mounted(
    host: tuple[LinuxStaging, Path], make: str, asked: str
) -> None:
    staging, src = host
    if make == "gone":
        os.rename(src / "dir", src / "dir.d")
    else:
        os.rename(src / "dir", src / "dir.d")
        os.symlink(src / "dir.d", src / "dir")
    with pytest.raises(OSError) as info:
        staging.pin_mount("p1/app.0", "m0", f"{src}/{asked}", readonly=True)
    assert info.value.errno in (errno.ELOOP, errno.ENOENT)
    assert mounted_below(Path(staging.root)) == []


def test_a_device_is_made_with_the_numbers_of_the_opened_node(
    host: tuple[LinuxStaging, Path],
) -> None:
    staging, src = host
    os.mknod(src / "null", 0o640 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(src / "null", 0o640)
    os.chown(src / "null", 0, 5)
    staged = staging.pin_device("p1/app.0", "d0", f"{src}/null", DeviceNode("c", 1, 3))
    st = os.lstat(staged)
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    # The runtime gives the container's node the mode and owner it reads: the host node's.
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, 5)
    with pytest.raises(OSError) as info:  # swapped for another node since the check
        staging.pin_device("p1/app.0", "d1", f"{src}/null", DeviceNode("c", 1, 1))
    assert info.value.errno == errno.ESTALE
    staging.release("p1")
    assert staging.keys() == []


def test_a_release_never_deletes_what_staging_did_not_make(
    host: tuple[LinuxStaging, Path],
) -> None:
    staging, src = host
    staged = staging.pin_mount("p1/app.0", "m0", f"{src}/dir", readonly=False)
    staging.release("p1/app.0")
    assert (src / "dir" / "f").read_text() == "checked"  # the source is untouched
    assert staging.keys() == ["p1"]
    # Something else in a staging directory (not a mount point staging made) stays.
    os.makedirs(staged)
    Path(staged, "data").write_text("not staging's")
    with pytest.raises(OSError):
        staging.release("p1")
    assert Path(staged, "data").read_text() == "not staging's"
    os.unlink(Path(staged, "data"))
