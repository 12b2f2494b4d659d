"""The node's binaries from the peer cache: the pinned versions, stamped as a release build
stamps them (a kubelet without the stamp registers its Node as v0.0.0-master)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.lab import peers
from tests.node.conftest import NodeBinaries


def _version(path: Path) -> str:
    proc = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    return (proc.stdout + proc.stderr).strip()


@pytest.mark.parametrize(
    ("binary", "expected"),
    [
        ("kubelet", f"Kubernetes {peers.KUBERNETES_VERSION}"),
        ("kube_apiserver", f"Kubernetes {peers.KUBERNETES_VERSION}"),
        ("kine", f"kine version {peers.KINE_VERSION}"),
    ],
)
def test_the_pinned_versions(node_binaries: NodeBinaries, binary: str, expected: str) -> None:
    path: Path = getattr(node_binaries, binary)
    assert path.is_relative_to(peers.cache_root())
    assert _version(path).startswith(expected)


def test_found_in_the_cache_the_second_time(node_binaries: NodeBinaries) -> None:
    for name in ("kubernetes", "kine"):
        found = peers.install(peers.BUNDLES[name], quiet=True)
        assert not found.built
        timed = {binary for key in found.seconds for binary in key.split("+")}
        assert timed == {b.binary for b in found.bundle.builds}
