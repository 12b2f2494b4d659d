"""Which plugin drop-ins crihook reads (proxy/chain/dropin_files.py), on real files owned and
moded as an attacker or a careless admin would leave them: only what root (or crihook's uid)
could have written, as sshd's StrictModes. The watcher's side (logged once, counted, the
chain left alone) is in test_plugin_directory below; the end-to-end refusal of a user's
drop-in that would fail every call is in tests/integration/test_security.py."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.dropin_files import Distrust, read_dropins
from crihook.proxy.chain.plugins import PluginDirectory, crihook_sockets, load_dropins
from crihook.proxy.config import ChainSettings, Settings, apply_flags
from tests.lab.crihook_proc import short_tmpdir

NOBODY = 65534
DROPIN = 'name = "50-p"\nendpoint = "unix:///run/p.sock"\nfailure_policy = "fail"\n'


@pytest.fixture
def plugins() -> Iterator[Path]:
    """A plugins directory as an admin makes it: root's, 0755, in a root-owned 0755 parent."""
    parent = short_tmpdir("di-")
    parent.chmod(0o755)
    directory = parent / "hooks.d"
    directory.mkdir(mode=0o755)
    yield directory


def dropin(directory: Path, name: str = "50-p.toml", mode: int = 0o644) -> Path:
    path = directory / name
    path.write_text(DROPIN)
    path.chmod(mode)
    return path


def test_root_s_drop_ins_are_read(plugins: Path) -> None:
    path = dropin(plugins)
    listing = read_dropins(plugins)
    assert (listing.files, listing.refused, listing.refused_directory) == ({path: DROPIN}, {}, None)


@pytest.mark.parametrize(
    ("how", "distrust", "reason"),
    [
        ("owned by nobody", Distrust.OWNER, f"it is owned by uid {NOBODY}, not uid 0"),
        ("group-writable", Distrust.WRITABLE, "writable by group or others (mode 0664)"),
        ("world-writable", Distrust.WRITABLE, "writable by group or others (mode 0646)"),
        ("a fifo", Distrust.NOT_A_FILE, "is not a regular file"),
    ],
    ids=["owner", "group-writable", "world-writable", "fifo"],
)
def test_a_drop_in_someone_else_could_have_written_is_refused(
    plugins: Path, how: str, distrust: Distrust, reason: str
) -> None:
    good = dropin(plugins, "10-good.toml")
    path = plugins / "50-p.toml"
    if how == "a fifo":
        os.mkfifo(path, 0o644)
    else:
        dropin(plugins, mode={"group-writable": 0o664, "world-writable": 0o646}.get(how, 0o644))
        if how == "owned by nobody":
            os.chown(path, NOBODY, NOBODY)
    listing = read_dropins(plugins)
    assert list(listing.files) == [good]
    refusal = listing.refused[path]
    assert (refusal.distrust, refusal.path) == (distrust, path)
    assert reason in refusal.reason


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("world-writable", "the directory is writable by others (mode 0777)"),
        ("world-writable and sticky", "the directory is writable by others (mode 1777)"),
        ("owned by nobody", f"the directory is owned by uid {NOBODY}, not uid 0"),
        ("parent owned by nobody", "is owned by uid 65534"),
        ("parent world-writable", "is writable by others (mode 0777)"),
    ],
    ids=["mode", "sticky", "owner", "parent-owner", "parent-mode"],
)
def test_a_plugins_directory_others_could_write_is_refused_whole(
    plugins: Path, how: str, reason: str
) -> None:
    dropin(plugins)
    if how == "world-writable":
        plugins.chmod(0o777)
    elif how == "world-writable and sticky":
        plugins.chmod(0o1777)
    elif how == "owned by nobody":
        os.chown(plugins, NOBODY, NOBODY)
    elif how == "parent owned by nobody":
        os.chown(plugins.parent, NOBODY, NOBODY)
    else:
        plugins.parent.chmod(0o777)
    listing = read_dropins(plugins)
    assert listing.files == {} and listing.refused_directory is not None
    assert listing.refused_directory.distrust is Distrust.DIRECTORY
    assert reason in listing.refused_directory.reason


def test_a_sticky_world_writable_parent_is_fine(plugins: Path) -> None:
    """/tmp: others cannot rename or remove what is not theirs."""
    plugins.parent.chmod(0o1777)
    path = dropin(plugins)
    assert list(read_dropins(plugins).files) == [path]


def test_a_configmap_s_symlinks_are_followed_and_their_target_checked(plugins: Path) -> None:
    """A ConfigMap volume: `50-p.toml -> ..data/50-p.toml`, `..data -> ..2026_12_01/`."""
    version = plugins / "..2026_12_01"
    version.mkdir(mode=0o755)
    dropin(version)
    (plugins / "..data").symlink_to(version.name)
    (plugins / "50-p.toml").symlink_to("..data/50-p.toml")
    assert list(read_dropins(plugins).files) == [plugins / "50-p.toml"]
    # The same link into a directory someone else owns: they could swap the file.
    elsewhere = short_tmpdir("de-")
    elsewhere.chmod(0o755)
    dropin(elsewhere, "x.toml")
    os.chown(elsewhere, NOBODY, NOBODY)
    (plugins / "60-q.toml").symlink_to(elsewhere / "x.toml")
    refusal = read_dropins(plugins).refused[plugins / "60-q.toml"]
    assert refusal.reason.startswith(f"it leads to {elsewhere}: the directory is owned by uid")


def test_replay_leaves_out_what_serve_would_refuse(plugins: Path) -> None:
    dropin(plugins, "10-good.toml")
    os.chown(dropin(plugins, "50-p.toml"), NOBODY, NOBODY)
    loaded = load_dropins(plugins)
    assert loaded is not None
    settings, problems = loaded
    assert [s.name for s in settings] == ["50-p"]  # the good one: both files name 50-p
    assert problems == [f"drop-in refused: {plugins / '50-p.toml'}: it is owned by uid {NOBODY}, "
                        "not uid 0"]  # fmt: skip


# --- the watcher: logged once, counted, the chain left alone -----------------------------------


def _watcher(plugins: Path, sockets: dict[str, str] | None = None) -> PluginDirectory:
    chain = Chain(ChainSettings(), lambda name: None)  # type: ignore[arg-type,return-value]
    return PluginDirectory(
        plugins, chain, lambda: ([], [], {}), set(), sockets=sockets, interval=3600
    )


def test_a_refused_drop_in_is_logged_once_and_counted(
    plugins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = dropin(plugins, mode=0o666)
    watcher = _watcher(plugins)
    with caplog.at_level(logging.ERROR, "crihook.proxy.chain.plugins"):
        for _ in range(3):
            asyncio.run(watcher.scan())
    refused = [r.getMessage() for r in caplog.records]
    assert refused == [
        f"plugin drop-in refused: {path}: it is writable by group or others (mode 0666)"
    ]
    assert dict(watcher.refusals) == {Distrust.WRITABLE: 1}
    assert watcher.status()["errors"] == {str(path): refused[0].split(": ", 1)[1]}
    assert watcher.loaded == {}


def test_a_refused_directory_changes_nothing_and_is_logged_once(
    plugins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dropin(plugins)
    plugins.chmod(0o777)
    watcher = _watcher(plugins)
    with caplog.at_level(logging.WARNING, "crihook.proxy.chain.plugins"):
        asyncio.run(watcher.scan())
        asyncio.run(watcher.scan())
        plugins.chmod(0o755)
        os.unlink(plugins / "50-p.toml")  # nothing to load once it is trusted again
        asyncio.run(watcher.scan())
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"plugins directory refused: {plugins}: the directory is writable by others (mode "
        "0777): anyone could add drop-ins; no plugin is added, changed or removed until it is "
        "fixed",
        f"plugins directory {plugins} trusted again",
    ]
    assert dict(watcher.refusals) == {Distrust.DIRECTORY: 1}


def test_a_drop_in_naming_the_runtime_s_socket_is_refused(plugins: Path) -> None:
    """root owns containerd's socket too: the socket check alone lets it through."""
    runtime = plugins.parent / "containerd.sock"
    runtime.write_text("")
    (plugins / "50-p.toml").write_text(f'name = "50-p"\nendpoint = "unix://{runtime}"\n')
    settings = apply_flags(Settings(), {"runtime_endpoint": f"unix://{runtime}"})
    watcher = _watcher(plugins, crihook_sockets(settings))
    asyncio.run(watcher.scan())
    assert watcher.errors == {
        plugins / "50-p.toml": f"{plugins / '50-p.toml'} endpoint: {runtime} is the runtime's "
        "socket, not a plugin's"
    }
    assert watcher.loaded == {}
