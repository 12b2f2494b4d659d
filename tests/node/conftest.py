"""Fixtures of the node tests: a real kubelet (tests/lab/kubelet_node.py) on the lab runtime,
through crihook, with an API server on kine for the pods created through the API.

The binaries come from the peer cache (tests/lab/peers.py); a fresh machine builds them in
``sh deploy/setup.sh``'s background build, which these fixtures wait for. One API server
serves the whole session (each node registers under its own name); each module runs its
own kubelet(s) on the runtime, one at a time: a kubelet stops the pods on its runtime that
it does not know of. A module that defines a module-scoped ``crihook`` fixture gets a
registered kubelet through it as ``node`` (``reserved_cpus`` overridable) and ``api``,
which deletes the pods a test created. The helpers below read what crihook and kubelet did:
cgroups, crihook's hook state and call log, kubelet's resize condition.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.numa.saved import memory_key
from tests.lab import cgroups, peers
from tests.lab.apiserver import ApiClient, ApiServer
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir
from tests.lab.kubelet_node import KubeletNode, NodePod, wait_until
from tests.lab.node_bed import registered_node
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


@pytest.fixture(scope="module")
def reserved_cpus() -> str:
    """kubelet's ``reservedSystemCPUs`` on the module's ``node`` (a module overrides it)."""
    return "0"


@pytest.fixture(scope="module")
def node(
    containerd: RuntimeLab,
    crihook: CrihookProcess,
    node_binaries: NodeBinaries,
    api_server: ApiServer,
    reserved_cpus: str,
) -> Iterator[KubeletNode]:
    """One kubelet for the module, through the module's ``crihook`` fixture, registered
    with the API server and Ready; cleaned up, its Node object deleted, at the end."""
    with registered_node(
        node_binaries.kubelet,
        containerd.endpoint,
        api_server,
        endpoint=crihook.endpoint,
        reserved_cpus=reserved_cpus,
    ) as kubelet:
        yield kubelet


@pytest.fixture
def api(api_server: ApiServer, node: KubeletNode) -> Iterator[ApiClient]:
    """The API client, for a module whose ``node`` fixture is a registered node; the pods a
    test created through it are deleted (and gone from the runtime) at teardown, so the next
    test starts on an empty node."""
    client = api_server.client()
    before = _pod_names(client)
    yield client
    created = _pod_names(client) - before
    for name in created:
        client.delete_pod(name)
    for name in created:  # gone from the API at once (no grace); from the runtime soon after
        node.view.wait_gone(name, "default", PATIENCE)


def _pod_names(client: ApiClient) -> set[str]:
    items = client.request("GET", "/api/v1/namespaces/default/pods")["items"]
    return {p["metadata"]["name"] for p in items if not _is_mirror(p)}


def _is_mirror(pod: dict[str, Any]) -> bool:
    return "kubernetes.io/config.mirror" in pod["metadata"].get("annotations", {})


def start_crihook(
    runtime: RuntimeLab,
    config: str = CRIHOOK_CONFIG,
    hooks: str = HOOKS,
    args: Sequence[str] = (),
) -> CrihookProcess:
    """crihook with the resource hooks in front of ``runtime`` (killed by the caller, or at
    the end of the scope that started it)."""
    workdir = short_tmpdir("kn-")
    proc = CrihookProcess(runtime.endpoint, workdir=workdir, args=args, config=config, hooks=hooks)
    return proc.start()


def held_cpus(proc: CrihookProcess) -> list[str]:
    """The exclusive CPUs crihook's cpuset hook holds, one entry per holder."""
    state = proc.hook_state("cpuset")
    return sorted(
        str(v.get("cpus"))
        for k, v in state.items()
        if k.startswith("c:") and isinstance(v, dict) and v.get("cpus") and not v.get("stopped")
    )


def placed_memory(proc: CrihookProcess, sandbox_id: str) -> list[int]:
    """The bytes of each block of memory the numa hook placed for the pod's container
    ``app``, as its state has them."""
    blocks = proc.hook_state("numa").get(memory_key(sandbox_id, "app"), [])
    return [int(b["size"]) for b in blocks]


def cpuset(pod: NodePod) -> str:
    """The cpuset.cpus of the pod's container ``app``, as its cgroup has it."""
    return cgroups.cgroup_value(pod.containers["app"].cgroup, "cpuset.cpus")


def wait_cpuset(node: KubeletNode, name: str, cpus: str) -> None:
    def holds() -> bool:
        pod = node.view.pod(name, "default")
        return pod is not None and cpuset(pod) == cpus

    wait_until(holds, PATIENCE, f"{name}'s cpuset {cpus}")


JSON_LOG = ("--log-format", "json")
"""crihook's ``args`` for a log :func:`calls` reads."""


def calls(proc: CrihookProcess, method: str, pod: str, since: float = 0.0) -> int:
    """How many ``method`` calls for ``namespace/name`` crihook answered after ``since``
    (``time.time()``), from its call log (one line per intercepted call, written once the
    call is answered: what it did is applied). crihook runs with :data:`JSON_LOG`."""
    count = 0
    for line in proc.log().splitlines():
        if not line.startswith("{"):
            continue
        doc = json.loads(line)
        if (
            doc.get("logger") == "crihook.proxy.call_log"
            and doc.get("method") == method
            and doc.get("pod") == pod
            and doc["ts"] > since
        ):
            count += 1
    return count


# --- in-place resize through the API --------------------------------------------------------


def sized(cpu: str, memory: str) -> dict[str, dict[str, str]]:
    """A Guaranteed container's resources: requests = limits."""
    size = {"cpu": cpu, "memory": memory}
    return {"requests": size, "limits": dict(size)}


def resize(api: ApiClient, name: str, resources: dict[str, dict[str, str]]) -> None:
    """Resize container ``app`` of pod ``name`` through the ``resize`` subresource."""
    patch = {"spec": {"containers": [{"name": "app", "resources": resources}]}}
    api.resize_pod(name, patch)


def resize_condition(api: ApiClient, name: str) -> dict[str, Any] | None:
    """kubelet's resize condition of the pod: where it reports the runtime's error."""
    for condition in api.pod(name)["status"].get("conditions", []):
        if condition["type"] in ("PodResizeInProgress", "PodResizePending"):
            found: dict[str, Any] = condition
            return found
    return None


def wait_resize_refused(api: ApiClient, name: str, words: str) -> dict[str, Any]:
    """Until kubelet's resize condition of the pod carries ``words`` (crihook's refusal):
    ``PodResizeInProgress``, reason ``Error``, the message the runtime's gRPC status."""
    found: dict[str, Any] = wait_until(
        lambda: (c := resize_condition(api, name)) and words in c.get("message", "") and c,
        PATIENCE,
        f"kubelet's resize condition of {name} saying {words!r}",
    )
    # kubelet's word for a runtime that failed the resize (it retries it)
    assert (found["type"], found.get("reason")) == ("PodResizeInProgress", "Error"), found
    return found
