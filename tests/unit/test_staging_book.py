"""The pure parts of pinning host paths (issue 28): staging keys, which staged keys a start
releases, the mount points below a staging directory, the no-symlink open; and the devices
hook's staging lifecycle on a table of host files and a staging table."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from crihook.hooks.devices import DevicesHook
from crihook.hooks.devices.host import DeviceNode
from crihook.hooks.devices.staged import StagingBook, container_key
from crihook.hooks.node.staging import mount_points_below, open_no_symlinks
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import ContainerView, InvalidRequest
from crihook.proxy.config import Settings, apply_flags
from crihook.proxy.ops.check import staging_findings
from tests.lab.kubelet_encoding import PodSpec
from tests.unit.devices_fakes import FakeFiles
from tests.unit.hook_harness import SMALL, Node, burstable, topology_of

# --- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("taken", "key"),
    [
        ((), "p1/app.0"),
        (("p1/app.1",), "p1/app.0"),
        (("p1/app.0",), "p1/app.0.1"),
        (("p1/app.0", "p1/app.0.1"), "p1/app.0.2"),
    ],
    ids=["free", "another-attempt", "taken", "taken-twice"],
)
def test_a_key_is_the_pod_name_and_attempt_made_unique(taken: tuple[str, ...], key: str) -> None:
    assert container_key("p1", "app", 0, taken) == key


# --- what a start releases -----------------------------------------------------------------------


class Saved(NamedTuple):
    key: str
    name: str
    attempt: int
    container: str  # "" pending


class Case(NamedTuple):
    saved: list[Saved]
    on_disk: list[str]
    runtime: list[tuple[str, str, str, int]]  # (id, pod, name, attempt)
    gone: list[str]
    strays: list[str]
    tied: dict[str, str]  # key → container after


RECONCILE = {
    "all-present": Case(
        [Saved("p1/app.0", "app", 0, "c1")], ["p1/app.0"], [("c1", "p1", "app", 0)],
        [], [], {"p1/app.0": "c1"},
    ),
    "container-gone": Case(
        [Saved("p1/app.0", "app", 0, "c1")], ["p1/app.0"], [],
        ["p1/app.0"], ["p1"], {},
    ),
    "one-of-two-gone": Case(
        [Saved("p1/app.0", "app", 0, "c1"), Saved("p1/side.0", "side", 0, "c2")],
        ["p1/app.0", "p1/side.0"], [("c2", "p1", "side", 0)],
        ["p1/app.0"], [], {"p1/side.0": "c2"},
    ),
    "pending-made-by-the-runtime": Case(
        [Saved("p1/app.0", "app", 0, "")], ["p1/app.0"], [("c9", "p1", "app", 0)],
        [], [], {"p1/app.0": "c9"},
    ),
    "pending-never-made": Case(
        [Saved("p1/app.0", "app", 0, "")], ["p1/app.0"], [("c9", "p1", "app", 1)],
        ["p1/app.0"], ["p1"], {},
    ),
    "on-disk-unknown": Case(
        [], ["p7/app.0", "p8"], [],
        [], ["p7/app.0", "p8"], {},
    ),
    "unknown-entry-of-a-kept-pod": Case(
        [Saved("p1/app.0", "app", 0, "c1")], ["p1/app.0", "p1/app.0.1"],
        [("c1", "p1", "app", 0)],
        [], ["p1/app.0.1"], {"p1/app.0": "c1"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", RECONCILE.values(), ids=RECONCILE.keys())
def test_a_start_releases_what_no_container_has(case: Case) -> None:
    state = MemoryState()
    for saved in case.saved:
        pod = saved.key.split("/")[0]
        doc = {"pod": pod, "name": saved.name, "attempt": saved.attempt}
        state.set(f"s:{saved.key}", {**doc, "container": saved.container})
    book = StagingBook(state)
    assert book.load() == []
    containers = [ContainerView(id=c, pod_id=p, name=n, attempt=a) for c, p, n, a in case.runtime]
    gone, strays = book.reconcile(case.on_disk, containers)
    assert [e.key for e in gone] == case.gone
    assert strays == case.strays
    kept = {k: e.container for k, e in book.entries.items() if k not in case.gone}
    assert kept == case.tied


def test_an_unreadable_saved_key_is_dropped() -> None:
    state = MemoryState()
    state.set("s:p1/app.0", {"pod": "p1"})
    book = StagingBook(state)
    assert book.load() == ["s:p1/app.0"]
    assert dict(state.items()) == {}


# --- the host's side, pure -----------------------------------------------------------------------

MOUNTINFO = (
    "22 1 252:1 / / rw - ext4 /dev/vda rw\n"
    "40 22 0:5 / /run rw - tmpfs tmpfs rw\n"
    "41 40 252:1 /srv/a /run/crihook/mounts/p1/app.0/m0 ro - ext4 /dev/vda rw\n"
    "42 41 0:9 / /run/crihook/mounts/p1/app.0/m0/sub rw - tmpfs t rw\n"
    "43 40 252:1 /srv/b /run/crihook/mounts/p2/app.0/m0 rw - ext4 /dev/vda rw\n"
    "44 40 252:1 /srv/c /run/crihook/mounts/p1x/app.0/m0 rw - ext4 /dev/vda rw\n"
    "45 40 252:1 /srv/d /run/crihook/mounts/p1/with\\040space/m0 rw - ext4 /dev/vda rw\n"
)


@pytest.mark.parametrize(
    ("base", "points"),
    [
        ("/run/crihook/mounts/p1/app.0", [
            "/run/crihook/mounts/p1/app.0/m0/sub", "/run/crihook/mounts/p1/app.0/m0"]),
        ("/run/crihook/mounts/p1", [
            "/run/crihook/mounts/p1/app.0/m0/sub", "/run/crihook/mounts/p1/app.0/m0",
            "/run/crihook/mounts/p1/with space/m0"]),
        ("/run/crihook/mounts/p3", []),
    ],
    ids=["container", "pod-not-its-prefix-twin", "none"],
)  # fmt: skip
def test_the_mount_points_below_a_key_deepest_first(base: str, points: list[str]) -> None:
    assert mount_points_below(MOUNTINFO, base) == points


@pytest.mark.parametrize(
    ("link", "asked", "code"),
    [
        (None, "a/b/c", None),
        ("a", "a/b/c", errno.ELOOP),
        ("a/b", "a/b/c", errno.ELOOP),
        ("a/b/c", "a/b/c", errno.ELOOP),
        (None, "a/b/c/f/x", errno.ENOTDIR),
    ],
    ids=["no-symlink", "first", "middle", "last", "file-on-the-way"],
)
def test_no_component_is_followed(tmp_path: Path, link: str | None, asked: str, code: int) -> None:
    (tmp_path / "real" / "b" / "c").mkdir(parents=True)
    (tmp_path / "real" / "b" / "c" / "f").write_text("x")
    os.symlink(tmp_path / "real", tmp_path / "a")
    if link is None:  # the checked path is the real one
        asked = asked.replace("a/", "real/", 1)
    else:
        target = tmp_path / link.replace("a", "real", 1)
        os.rename(target, f"{target}.d")  # swapped: a symlink where the directory was
        os.symlink(f"{target}.d", target)
        asked = asked.replace("a", "real", 1)
    if code is None:
        fd = open_no_symlinks(f"{tmp_path}/{asked}")
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") == f"{tmp_path}/{asked}"
        finally:
            os.close(fd)
        return
    with pytest.raises(OSError) as info:
        open_no_symlinks(f"{tmp_path}/{asked}")
    assert info.value.errno == code


@pytest.mark.parametrize("path", ["relative/x", "/a/../b", "/a//b", "/a/./b"])
def test_only_resolved_paths_are_opened(path: str) -> None:
    with pytest.raises(ValueError, match="normalized"):
        open_no_symlinks(path)


# --- the hook's lifecycle ---------------------------------------------------------------------


POLICY: dict[str, Any] = {
    "namespaces": ["ml"],
    "devices": ["/dev/fuse"],
    "mounts": ["/srv/models/**"],
}
ANNOTATIONS = {
    "devices.crihook.io/container.app": json.dumps([{"path": "/dev/fuse"}]),
    "mounts.crihook.io/container.app": json.dumps({"/srv/models/a": "/a", "/srv/models/b": "/b"}),
}


def files() -> FakeFiles:
    return FakeFiles(
        nodes={"/dev/fuse": DeviceNode("c", 10, 229)},
        links={"/srv/models/b": "/srv/models/b.real"},
    ).add_dir("/srv/models/a", "/srv/models/b.real")


async def started() -> Node:
    node = Node(DevicesHook(POLICY, files=files()), topology_of(SMALL))
    await node.sync()
    return node


async def a_pod(node: Node, sandbox: str = "p1") -> Any:
    spec = PodSpec(sandbox, namespace="ml", containers=[burstable("app")], annotations=ANNOTATIONS)
    return await node.run_pod(spec, sandbox)


def staged_keys(node: Node) -> list[str]:
    return sorted(k for k, _ in node.state.items() if k.startswith("s:"))


async def test_the_runtime_gets_staged_paths_pinning_the_checked_ones() -> None:
    node = await started()
    created = await node.create(await a_pod(node), burstable("app"), "c1")
    config = created.request.config
    staging = node.staging
    assert [(d.host_path, staging.source[d.host_path]) for d in config.devices] == [
        ("/staged/p1/app.0/d0", "/dev/fuse")
    ]
    mounts = [(m.host_path, staging.source[m.host_path]) for m in config.mounts][-2:]
    assert mounts == [
        ("/staged/p1/app.0/m0", "/srv/models/a"),
        ("/staged/p1/app.0/m1", "/srv/models/b.real"),  # the resolved path, pinned
    ]
    assert node.state.get("s:p1/app.0") == {
        "pod": "p1", "name": "app", "attempt": 0, "container": "c1"
    }  # fmt: skip


async def test_a_path_changed_after_the_check_is_refused_and_nothing_stays_staged() -> None:
    node = await started()
    node.staging.changed.add("/srv/models/b.real")
    with pytest.raises(InvalidRequest, match=r"mounts\.crihook\.io/container\.app.*changed"):
        await node.begin_create(await a_pod(node), burstable("app"))
    assert node.staging.source == {}
    assert node.staging.done[-1] == ("release", "p1/app.0")
    assert staged_keys(node) == []


async def test_released_at_remove_container_and_remove_pod_sandbox() -> None:
    node = await started()
    pod = await a_pod(node)
    await node.create(pod, burstable("app"), "c1")
    await node.remove("c1")
    assert node.staging.done[-1] == ("release", "p1/app.0")
    assert node.staging.source == {} and staged_keys(node) == []
    await node.create(pod, burstable("app"), "c2", attempt=1)
    await node.remove_pod("p1")
    assert node.staging.done[-1] == ("release", "p1")
    assert node.staging.source == {} and staged_keys(node) == []


async def test_a_failed_create_releases_its_staging() -> None:
    node = await started()
    pod = await a_pod(node)
    await node.fail_create(pod, await node.begin_create(pod, burstable("app")))
    assert node.staging.done[-1] == ("release", "p1/app.0")
    assert node.staging.source == {} and staged_keys(node) == []


async def test_a_release_that_fails_keeps_the_key_for_the_next_start() -> None:
    node = await started()
    await node.create(await a_pod(node), burstable("app"), "c1")
    node.staging.fail_release.add("p1/app.0")
    await node.remove("c1")
    assert staged_keys(node) == ["s:p1/app.0"]
    node.staging.fail_release.clear()
    await node.sync()  # the runtime has no c1: released now
    assert staged_keys(node) == [] and node.staging.source == {}


# --- crihook check: the staging directory's propagation ----------------------------------------

PROPAGATION = {
    "host-shared": (
        "22 1 252:1 / / rw shared:1 - ext4 /dev/vda rw\n"
        "25 22 0:23 / /run rw,nosuid shared:5 - tmpfs tmpfs rw\n",
        "ok", "/run, shared:5",
    ),
    "bidirectional": (
        "900 800 0:50 / / rw master:1 - overlay overlay rw\n"
        "901 900 0:23 /crihook /run/crihook rw shared:5 master:5 - tmpfs tmpfs rw\n",
        "ok", "/run/crihook, shared:5",
    ),
    "host-to-container": (
        "900 800 0:50 / / rw master:1 - overlay overlay rw\n"
        "901 900 0:23 /crihook /run/crihook rw master:5 - tmpfs tmpfs rw\n",
        "error", "slave mount (HostToContainer)",
    ),
    "none": (
        "900 800 0:50 / / rw - overlay overlay rw\n"
        "901 900 0:23 /crihook /run/crihook rw - tmpfs tmpfs rw\n",
        "warning", "a private mount",
    ),
    "prefix-twin-is-not-above": (
        "22 1 252:1 / / rw - ext4 /dev/vda rw\n"
        "26 22 0:24 / /run/crihook/mountsX rw shared:7 - tmpfs t rw\n",
        "warning", "is on /, a private mount",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("mountinfo", "level", "fragment"), PROPAGATION.values(), ids=PROPAGATION.keys()
)
def test_check_says_whether_staging_mounts_reach_the_runtime(
    mountinfo: str, level: str, fragment: str, tmp_path: Path
) -> None:
    settings = apply_flags(Settings(), {"hooks": "devices", "staging_dir": "/run/crihook/mounts"})
    [finding] = staging_findings(settings, mountinfo)
    assert (finding.level.value, finding.topic) == (level, "staging")
    assert fragment in finding.message
    if level != "ok":
        assert "Bidirectional" in finding.message


def test_check_says_nothing_of_staging_without_the_devices_hook() -> None:
    settings = apply_flags(Settings(), {"hooks": "oom"})
    assert staging_findings(settings, PROPAGATION["none"][0]) == []


def test_check_refuses_a_staging_directory_others_may_write(tmp_path: Path) -> None:
    (tmp_path / "mounts").mkdir(mode=0o777)
    os.chmod(tmp_path / "mounts", 0o777)
    settings = apply_flags(
        Settings(), {"hooks": "devices", "staging_dir": str(tmp_path / "mounts")}
    )
    found = staging_findings(settings, PROPAGATION["host-shared"][0])
    assert [(f.level.value, "mode 0777" in f.message) for f in found] == [
        ("ok", False),
        ("error", True),
    ]


async def test_a_pool_that_refuses_after_the_pins_leaves_nothing_staged() -> None:
    pools = {"gpu": {"devices": [{"id": "0", "path": "/dev/fuse"}]}}
    node = Node(
        DevicesHook({**POLICY, "devices": [], "pools": pools}, files=files()), topology_of(SMALL)
    )
    await node.sync()
    annotations = {
        "mounts.crihook.io/container.app": json.dumps({"/srv/models/a": "/a"}),
        "pools.crihook.io/container.app": json.dumps({"gpu": 2}),
    }
    spec = PodSpec("p1", namespace="ml", containers=[burstable("app")], annotations=annotations)
    pod = await node.run_pod(spec, "p1")
    with pytest.raises(InvalidRequest, match="2 device"):
        await node.begin_create(pod, burstable("app"))
    assert node.staging.done == [("pin", "/staged/p1/app.0/m0"), ("release", "p1/app.0")]
    assert node.staging.source == {} and staged_keys(node) == []
