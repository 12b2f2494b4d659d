"""A real kubelet registered with the test bed's API server, ready for pods: what the
kubelet corpus recorder (tests/replay/record_kubelet.py) and ``bench.run --kubelet`` put
together from the node harness (tests/lab/kubelet_node.py, tests/lab/apiserver.py).

:func:`registered_node` starts a :class:`KubeletNode` with a kubeconfig for the API server,
waits until its Node is Ready, and at the end cleans the node up and deletes its Node.
:func:`run_api_pod` creates a pod for that node and waits until the runtime runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.lab.apiserver import ApiClient, ApiError, ApiServer
from tests.lab.crihook_proc import PATIENCE
from tests.lab.kubelet_config import kubeconfig
from tests.lab.kubelet_node import KubeletNode, NodePod, wait_until

__all__ = ["on_node", "registered_node", "run_api_pod", "wait_containers"]


@contextlib.contextmanager
def registered_node(
    kubelet: Path,
    runtime_endpoint: str,
    api_server: ApiServer,
    *,
    endpoint: str | None = None,
    **options: Any,
) -> Iterator[KubeletNode]:
    """A kubelet on ``runtime_endpoint`` (talking to ``endpoint``: crihook's socket, or the
    runtime's by default), registered and Ready; cleaned up with its Node at the end.
    ``options`` go to :class:`KubeletNode` (``reserved_cpus``, ``feature_gates``, ...)."""
    node = KubeletNode(
        kubelet,
        runtime_endpoint,
        endpoint=endpoint,
        kubeconfig=kubeconfig(api_server.server, api_server.token),
        **options,
    )
    api = api_server.client()
    try:
        node.start()
        wait_until(lambda: api.node_ready(node.name), PATIENCE, f"node {node.name} Ready")
        yield node
    finally:
        try:
            node.cleanup()
        finally:
            with contextlib.suppress(ApiError, OSError):  # it may never have registered
                api.delete_node(node.name)


def run_api_pod(node: KubeletNode, api: ApiClient, manifest: Mapping[str, Any]) -> NodePod:
    """Create ``manifest`` on ``node`` (its ``spec.nodeName`` is set here) and wait until the
    runtime runs each of its (non-init) containers."""
    api.create_pod(on_node(manifest, node))
    return wait_containers(node, manifest)


def on_node(manifest: Mapping[str, Any], node: KubeletNode) -> dict[str, Any]:
    """``manifest`` with ``spec.nodeName`` set to ``node``'s."""
    return {**manifest, "spec": {**manifest["spec"], "nodeName": node.name}}


def wait_containers(node: KubeletNode, manifest: Mapping[str, Any]) -> NodePod:
    """Until the runtime runs each container of ``manifest`` by name: a running init
    container does not count, so nothing of the pod's start is still under way."""
    name = str(manifest["metadata"]["name"])
    wanted = {str(c["name"]) for c in manifest["spec"]["containers"]}

    def running() -> NodePod | None:
        pod = node.view.pod(name, "default")
        return pod if pod is not None and wanted <= set(pod.containers) else None

    found: NodePod = wait_until(running, PATIENCE, f"pod {name}'s containers {sorted(wanted)}")
    return found
