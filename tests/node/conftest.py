"""Fixtures of the node tests: a real kubelet (tests/lab/kubelet_node.py) on the lab runtime,
through crihook, with an API server on kine for the pods created through the API.

The binaries come from the peer cache (tests/lab/peers.py); a fresh machine builds them in
``sh deploy/setup.sh``'s background build, which these fixtures wait for. One API server
serves the whole session (each node registers under its own name); each module runs its
own kubelet(s) on the runtime, one at a time: a kubelet stops the pods on its runtime that
it does not know of.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab import peers
from tests.lab.apiserver import ApiServer
from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.runtime_lab import LabError, RuntimeLab

HOOKS = "cpuset,numa,oom"
# CPU 0 is reserved, as kubelet's reservedSystemCPUs "0" reserves it (tests/lab/kubelet_config).
CRIHOOK_CONFIG = '[hooks.cpuset]\nreserved_cpus = "0"\n'


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_apiserver: Path
    kine: Path


@pytest.fixture(scope="session")
def node_binaries() -> NodeBinaries:
    for name in ("kubernetes", "kine"):
        bundle = peers.BUNDLES[name]
        if peers.cached(bundle.builds[0].binary) is None:
            print(
                f"\nnode tests: waiting for {name} {bundle.version} (built once into "
                f"{peers.cache_root()}; log of a background build: slow-build.log there)",
                file=sys.stderr,
                flush=True,
            )
    try:
        return NodeBinaries(peers.kubelet(), peers.kube_apiserver(), peers.kine())
    except peers.PeerError as exc:
        pytest.fail(f"the node's binaries are not available: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def api_server(node_binaries: NodeBinaries) -> Iterator[ApiServer]:
    server = ApiServer(node_binaries.kube_apiserver, node_binaries.kine)
    try:
        server.start()
    except LabError as exc:
        server.cleanup()
        pytest.fail(f"the API server did not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.cleanup()


def start_crihook(
    runtime: RuntimeLab, config: str = CRIHOOK_CONFIG, hooks: str = HOOKS
) -> CrihookProcess:
    """crihook with the resource hooks in front of ``runtime`` (killed by the caller, or at
    the end of the scope that started it)."""
    proc = CrihookProcess(runtime.endpoint, workdir=short_tmpdir("kn-"), config=config, hooks=hooks)
    return proc.start()
