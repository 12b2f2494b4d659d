"""Records the kubelet corpus: a real kubelet (v1.37, tests/lab/kubelet_node.py) registered
with the test bed's kube-apiserver on kine, talking to crihook (`serve --record`, hooks
cpuset, numa, oom and devices, CPU 0 reserved) in front of one lab runtime.

    sudo .venv/bin/python -m tests.replay.record_kubelet --runtime 1.6  # kubelet-containerd-1.6
    sudo .venv/bin/python -m tests.replay.record_kubelet --runtime 2    # kubelet-containerd-2
    sudo .venv/bin/python -m tests.replay.record_kubelet --runtime crio # kubelet-crio

bench/kubelet_captured/ holds requests of the 1.6 file: re-take them after re-recording it
(`python -m bench.kubelet_capture`; tests/unit/test_bench_kubelet.py says when they differ).

Needs root, the runtime and the node's binaries in the peer cache (sh deploy/setup.sh).
Takes a little over a minute: much of it waiting for kubelet's garbage collector (once a
minute) to remove what it stopped. Only what crihook intercepts is recorded (kubelet's
List and Status calls pass through unrecorded), and each recording differs from the last
in its ids, names and times: the replay compares what crihook did with them.

The workload, in this order, all pods through the API (``spec.nodeName``, no scheduler) but
the first:

- a static BestEffort pod (a manifest in kubelet's static pod dir);
- a BestEffort, a Burstable (with an init container) and a Guaranteed pod of one whole
  CPU: an exclusive CPU (CPU 1) for it, the shared pool (CPU 0) for the others;
- an allowlisted device for one pod, and a device the node does not allow, which kubelet
  shows as CreateContainerError and retries until the pod is deleted;
- in-place resizes through the API (``resize`` subresource): the Burstable pod's CPU and
  memory (applied), the Guaranteed pod's memory (the numa hook refuses it; kubelet shows
  crihook's message in the pod's conditions until the resize is undone);
- crihook restarted with SIGTERM under the running kubelet (the file's second part);
  kubelet finds it again by itself and starts a new pod;
- the Guaranteed pod deleted (the shared pool widens to 0-1), a new Guaranteed pod on the
  freed CPU (it narrows again), then every pod deleted and removed by kubelet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from crihook.proxy.log import configure_logging
from crihook.proxy.replay.file import read_recording
from crihook.proxy.replay.runner import replay
from tests.lab import cgroups, peers
from tests.lab.apiserver import ApiClient, ApiError, ApiServer
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.kubelet_node import KubeletNode, wait_until
from tests.lab.node_bed import on_node, registered_node, run_api_pod
from tests.lab.runtime_lab import LabError
from tests.node.manifests import pod_manifest

HERE = Path(__file__).resolve().parent
RUNTIMES = {"1.6": "kubelet-containerd-1.6", "2": "kubelet-containerd-2", "crio": "kubelet-crio"}
HOOKS = "cpuset,numa,oom,devices"
DEVICE_DIR = Path("/tmp/crihook-kubelet-corpus-dev")  # fixed: the same in every recording
GC_PATIENCE = 240.0  # kubelet's container and sandbox GC runs once a minute
CONFIG = f"""
[hooks.cpuset]
reserved_cpus = "0"

[hooks.devices]
namespaces = ["default"]
devices = ["{DEVICE_DIR}/ok-*"]
"""


def corpus_path(runtime: str) -> Path:
    return HERE / f"{RUNTIMES[runtime]}.jsonl"


def device_nodes() -> None:
    """``ok-null`` (c 1:3) on the devices hook's allowlist, ``secret`` (c 1:3 too) not."""
    shutil.rmtree(DEVICE_DIR, ignore_errors=True)
    DEVICE_DIR.mkdir(parents=True)
    for name in ("ok-null", "secret"):
        os.mknod(DEVICE_DIR / name, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR


def with_device(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    ask = [{"path": str(DEVICE_DIR / name), "container_path": "/dev/crihook-null"}]
    manifest["metadata"]["annotations"] = {"devices.crihook.io/container.app": json.dumps(ask)}
    return manifest


def with_init_container(manifest: dict[str, Any]) -> dict[str, Any]:
    app = manifest["spec"]["containers"][0]
    init = {**app, "name": "init", "command": ["true"]}
    manifest["spec"]["initContainers"] = [init]
    return manifest


def guaranteed_size(memory: str) -> dict[str, dict[str, str]]:
    return {"requests": {"cpu": "1", "memory": memory}, "limits": {"cpu": "1", "memory": memory}}


def resize(api: ApiClient, name: str, resources: dict[str, dict[str, str]]) -> None:
    api.resize_pod(name, {"spec": {"containers": [{"name": "app", "resources": resources}]}})


def cpuset_of(node: KubeletNode, name: str) -> str:
    pod = node.view.pod(name, "default")
    if pod is None or "app" not in pod.containers:
        return ""
    return cgroups.cgroup_value(pod.containers["app"].cgroup, "cpuset.cpus")


def wait_cpuset(node: KubeletNode, name: str, cpus: str) -> None:
    wait_until(lambda: cpuset_of(node, name) == cpus, PATIENCE, f"{name} on CPUs {cpus}")


def resize_message(api: ApiClient, name: str) -> str:
    for condition in api.pod(name)["status"].get("conditions", []):
        if condition["type"] in ("PodResizeInProgress", "PodResizePending"):
            return str(condition.get("message", ""))
    return ""


def waiting_reason(api: ApiClient, name: str) -> str:
    for status in api.pod(name)["status"].get("containerStatuses", []):
        waiting = status.get("state", {}).get("waiting") or {}
        if waiting.get("message"):
            return str(waiting.get("reason", ""))
    return ""


def delete(api: ApiClient, node: KubeletNode, *names: str) -> None:
    """One pod at a time, each gone from the runtime before the next: a replay runs calls
    one after another, so calls of two pods that overlapped (the CPUs one gives back, the
    other's update) could replay otherwise than they ran."""
    for name in names:
        api.delete_pod(name)
        node.view.wait_gone(name, "default", PATIENCE)


def run_workload(node: KubeletNode, api: ApiClient, crihook: CrihookProcess) -> None:
    """The workload of the module docstring."""
    static = node.write_static_pod(pod_manifest("static-besteffort", "besteffort"))
    node.wait_running(static)
    run_api_pod(node, api, pod_manifest("besteffort", "besteffort"))
    run_api_pod(node, api, with_init_container(pod_manifest("burstable", "burstable")))
    run_api_pod(node, api, pod_manifest("guaranteed", "guaranteed"))
    wait_cpuset(node, "guaranteed", "1")
    wait_cpuset(node, "besteffort", "0")
    run_api_pod(node, api, with_device(pod_manifest("device", "besteffort"), "ok-null"))
    refused = with_device(pod_manifest("device-refused", "besteffort"), "secret")
    api.create_pod(on_node(refused, node))
    wait_until(
        lambda: waiting_reason(api, "device-refused") == "CreateContainerError",
        PATIENCE,
        "device-refused's CreateContainerError",
    )
    delete(api, node, "device-refused")

    burstable = node.view.pod("burstable", "default")
    assert burstable is not None
    resize(
        api,
        "burstable",
        {"requests": {"cpu": "0", "memory": "32Mi"}, "limits": {"cpu": "800m", "memory": "96Mi"}},
    )
    app = burstable.containers["app"]
    wait_until(
        lambda: cgroups.read_limits(app.cgroup).cpu_quota == 80000,
        PATIENCE,
        "burstable's resize applied",
    )
    resize(api, "guaranteed", guaranteed_size("96Mi"))
    wait_until(
        lambda: "resize_exclusive_memory" in resize_message(api, "guaranteed"),
        PATIENCE,
        "guaranteed's resize refused with crihook's message",
    )
    resize(api, "guaranteed", guaranteed_size("64Mi"))  # undone: kubelet stops retrying
    wait_until(lambda: not resize_message(api, "guaranteed"), PATIENCE, "the resize undone")

    crihook.signal(signal.SIGTERM)
    assert crihook.proc is not None and crihook.proc.wait(PATIENCE) == 0, crihook.log()
    crihook.start()
    run_api_pod(node, api, pod_manifest("after-restart", "burstable"))

    delete(api, node, "guaranteed")
    wait_cpuset(node, "besteffort", "0-1")
    run_api_pod(node, api, pod_manifest("guaranteed-2", "guaranteed"))
    wait_cpuset(node, "guaranteed-2", "1")
    wait_cpuset(node, "besteffort", "0")

    delete(api, node, "besteffort", "burstable", "device", "after-restart", "guaranteed-2")
    node.remove_static_pod("static-besteffort")
    node.view.wait_gone(static, "default", PATIENCE)
    # kubelet's garbage collector removes the containers and sandboxes it stopped.
    wait_until(lambda: not node.view.sandbox_ids(), GC_PATIENCE, "kubelet's GC removing all")


def record(runtime: str, out: Path) -> None:
    images = build_images(DEFAULT_CACHE_DIR)
    device_nodes()
    workdir = short_tmpdir("kcorpus-")
    path = workdir / "record.jsonl"
    with contextlib.ExitStack() as cleanup:  # in reverse: kubelet, crihook, runtime, API
        cleanup.callback(shutil.rmtree, DEVICE_DIR, ignore_errors=True)
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        api_server = cleanup.enter_context(ApiServer(peers.kube_apiserver(), peers.kine()))
        lab = peers.lab_runtime(
            runtime, tempfile.mkdtemp(prefix="crihook-lab-", dir="/tmp"), images
        )
        cleanup.callback(lab.cleanup)
        lab.start()
        crihook = CrihookProcess(
            lab.endpoint, workdir=workdir, config=CONFIG, hooks=HOOKS, args=["--record", str(path)]
        )
        cleanup.callback(crihook.kill)
        crihook.start()
        with registered_node(
            peers.kubelet(), lab.endpoint, api_server, endpoint=crihook.endpoint
        ) as node:
            run_workload(node, api_server.client(), crihook)
            node.stop()
        assert crihook.stop() == 0, crihook.log()
        out.write_bytes(path.read_bytes())
        print(f"wrote {out} ({out.stat().st_size} bytes)")
    check_replay(out)


def check_replay(path: Path) -> None:
    """The new recording replays as it ran (what tests/replay/test_corpus.py asks of it)."""
    configure_logging("plain", "error")  # not the refusals the replay repeats
    report = asyncio.run(replay(read_recording(path)))
    problems = [
        f"line {r.entry.line}: " + "; ".join(d.describe() for d in r.differences)
        for r in report.differing
    ] + [str(w) for w in report.warnings]
    if problems:
        raise AssertionError(f"{path} does not replay as recorded:\n" + "\n".join(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.replay.record_kubelet")
    parser.add_argument("--runtime", choices=tuple(RUNTIMES), default="1.6")
    parser.add_argument("--out", type=Path, help="default tests/replay/kubelet-<runtime>.jsonl")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("record_kubelet: needs root (the runtime, kubelet)", file=sys.stderr)
        return 2
    try:
        record(args.runtime, args.out or corpus_path(args.runtime))
    except (LabError, peers.PeerError, ApiError, AssertionError) as exc:
        print(f"record_kubelet: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
