"""Lookups on the event loop only where they stay on local file systems: the mount table, the
resolver that checks it before each lookup, and the devices hook falling back to a thread."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.devices import DevicesHook
from crihook.hooks.devices import hook as devices_hook_module
from crihook.hooks.node import LinuxFiles, WouldBlock
from crihook.hooks.node.mounts import MountTable, parse_mountinfo, resolve_locally
from tests.lab.kubelet_encoding import PodSpec
from tests.unit.hook_harness import SMALL, Node, burstable, topology_of

MOUNTINFO = """\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw
40 22 0:41 / /srv/models rw,relatime shared:20 - nfs4 server:/models rw,vers=4.2
41 22 0:42 / /srv/my\\040share rw,relatime shared:21 - fuse.sshfs u@h:/ rw
42 22 0:43 / /net rw,relatime shared:22 master:9 - autofs auto.net rw
43 40 0:44 / /srv/models/cache rw shared:23 - tmpfs tmpfs rw
44 22 0:45 / /mnt rw shared:24 - nfs4 s:/x rw
45 22 0:46 / /mnt rw shared:25 - tmpfs tmpfs rw
"""


@pytest.fixture
def table(tmp_path: Path) -> Iterator[MountTable]:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    mounts = MountTable(str(path))
    yield mounts
    mounts.close()


def test_mountinfo_is_parsed_with_escapes_and_the_top_mount_of_a_point() -> None:
    types = parse_mountinfo(MOUNTINFO + "garbage line\n")
    assert types["/srv/my share"] == "fuse.sshfs"
    assert types["/net"] == "autofs"
    assert types["/mnt"] == "tmpfs"  # mounted over the nfs one
    assert types["/dev"] == "devtmpfs" and types["/"] == "ext4"
    assert len(types) == 7


def test_a_path_under_a_network_fuse_or_automount_file_system_is_blocking(
    table: MountTable,
) -> None:
    assert table.blocking_type("/usr/share") is None
    assert table.blocking_type("/dev/null") is None
    assert table.blocking_type("/srv") is None
    assert table.blocking_type("/srv/models") == "nfs4"  # its root is looked at
    assert table.blocking_type("/srv/models/x/y") == "nfs4"
    assert table.blocking_type("/srv/models/cache/z") == "nfs4"  # reached through the nfs
    assert table.blocking_type("/srv/my share/f") == "fuse.sshfs"
    assert table.blocking_type("/net/host") == "autofs"
    assert table.blocking_type("/mnt/x") is None


def test_the_resolver_raises_before_it_looks_at_a_blocking_file_system(
    table: MountTable,
) -> None:
    with pytest.raises(WouldBlock, match="/srv/models reaches a nfs4"):
        resolve_locally("/srv/models/never/looked/at", table)
    with pytest.raises(WouldBlock):
        resolve_locally("relative/path", table)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "file").write_text("x")
    (root / "c").mkdir()
    links = {
        "rel": "a/b",
        "abs": str(root / "a"),
        "chain": "rel",
        "up": "a/b/../..",
        "a/b/back": "../../c",
        "loop1": "loop2",
        "loop2": "loop1",
        "dangling": "nowhere",
        "tofile": "a/b/file",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    return root


CASES = [
    "a/b/file",
    "rel/file",
    "abs/b",
    "chain/file",
    "chain/back",
    "up/a",
    "a/./b/../b/file",
    "tofile",
    "a/b/back/..",
    "rel/../c",
    "missing",
    "dangling",
    "loop1",
    "tofile/x",
    "a/b/file/..",
]


@pytest.mark.parametrize("name", CASES)
def test_the_resolver_answers_as_realpath_on_local_file_systems(tree: Path, name: str) -> None:
    path = f"{tree}/{name}"
    mounts = MountTable()  # this machine's: the temp dir is on a local file system
    try:
        assert mounts.blocking_type(str(tree)) is None
        expected: Any
        try:
            expected = os.path.realpath(path, strict=True)
        except OSError as exc:
            expected = type(exc), exc.errno
        got: Any
        try:
            got = resolve_locally(path, mounts)
        except OSError as exc:
            got = type(exc), exc.errno
        assert got == expected
    finally:
        mounts.close()


def test_the_table_follows_mounts_made_after_it_was_read(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (run the tests as root)", pytrace=False)
    point = tmp_path / "mnt"
    point.mkdir()
    mounts = MountTable()
    try:
        assert mounts.blocking_type(str(point)) is None
        assert str(point) not in mounts._types
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)
        try:
            mounts.blocking_type(str(point))  # the kernel marked the table: read again
            assert mounts._types[str(point)] == "tmpfs"
        finally:
            subprocess.run(["umount", str(point)], check=True)
        mounts.blocking_type(str(point))
        assert str(point) not in mounts._types
    finally:
        mounts.close()


# --- the devices hook: on the loop, or in a thread --------------------------------------------


def files_for(tmp_path: Path, blocking: bool) -> LinuxFiles:
    """The real host, with a mount table where the temp dir is local or on nfs."""
    info = tmp_path / "mountinfo"
    kind = "nfs4 srv:/x" if blocking else "tmpfs tmpfs"
    info.write_text(
        f"22 1 252:1 / / rw - ext4 /dev/vda rw\n40 22 0:9 / {tmp_path} rw - {kind} rw\n"
    )
    return LinuxFiles(MountTable(str(info)))


@pytest.mark.parametrize("blocking", [False, True], ids=["local", "nfs"])
async def test_the_devices_hook_checks_on_the_loop_unless_a_lookup_may_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocking: bool
) -> None:
    (tmp_path / "models" / "v1").mkdir(parents=True)
    os.symlink("v1", tmp_path / "models" / "current")
    options = {"namespaces": ["ml"], "devices": ["/dev/null"], "mounts": [f"{tmp_path}/**"]}
    hook = DevicesHook(options, files=files_for(tmp_path, blocking))
    threads: list[str] = []
    real = devices_hook_module.asyncio.to_thread

    async def counted(func: Any, *args: Any) -> Any:
        threads.append(func.__name__)
        return await real(func, *args)

    monkeypatch.setattr(devices_hook_module.asyncio, "to_thread", counted)
    node = Node(hook, topology_of(SMALL))
    await node.sync()
    threads.clear()  # the pools' index is read in a thread at start
    annotations = {
        "devices.crihook.io/container.app": '[{"path": "/dev/null"}]',
        "mounts.crihook.io/container.app": f'{{"{tmp_path}/models/current": "/models"}}',
    }
    spec = PodSpec("p1", namespace="ml", containers=[burstable("app")], annotations=annotations)
    p = await node.run_pod(spec, "p1")
    created = await node.create(p, burstable("app"), "c1")
    config = created.request.config
    pinned = node.staging.host_path
    assert [(pinned(m.host_path), m.container_path) for m in config.mounts][-1] == (
        f"{tmp_path}/models/v1",
        "/models",
    )
    assert [pinned(d.host_path) for d in config.devices] == ["/dev/null"]
    # The check on the loop unless a lookup may block; pinning (mount calls) always in a thread.
    assert threads == (["check_ask", "_pin_all"] if blocking else ["_pin_all"])


def test_an_unresolvable_path_is_the_same_error_either_way(tmp_path: Path) -> None:
    files = files_for(tmp_path, blocking=False)
    with pytest.raises(FileNotFoundError) as on_loop:
        files.nonblocking().resolve(f"{tmp_path}/gone")
    with pytest.raises(FileNotFoundError) as in_thread:
        files.resolve(f"{tmp_path}/gone")
    assert on_loop.value.errno == in_thread.value.errno == errno.ENOENT
    with pytest.raises(WouldBlock):
        files_for(tmp_path, blocking=True).nonblocking().device(f"{tmp_path}/x")


def test_a_network_root_file_system_makes_every_lookup_blocking(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:20 / / rw - nfs4 srv:/root rw\n23 22 0:5 / /dev rw - devtmpfs d rw\n")
    mounts = MountTable(str(info))
    try:
        assert mounts.blocking_type("/usr/share") == "nfs4"
        assert mounts.blocking_type("/dev/null") == "nfs4"  # /dev is reached through /
    finally:
        mounts.close()
