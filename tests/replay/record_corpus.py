"""Re-records the replay corpus: realistic node workloads, driven by the kubelet-like client
through crihook (`serve --record`) in front of the lab's real containerd.

    sudo .venv/bin/python -m tests.replay.record_corpus        # writes tests/replay/*.jsonl
    sudo .venv/bin/python -m tests.replay.record_corpus --workload colocated

Needs root and the containerd test bed (tests/lab/install.sh). Takes a few seconds each on the
project's VM.

`node` (containerd-node.jsonl), in kubelet's order:

- pods of the three QoS classes: BestEffort (`batch`, with an OOM score override inside its
  namespace's range), Burstable with an init container and a sidecar (`web`), Guaranteed
  with a fractional CPU (`cache`, shared pool) and with one whole CPU (`db`: an exclusive
  CPU on this 2-CPU machine; CPU 0 is reserved), all with pod-level budgets (kubelet puts
  them on every sandbox), and an exempt `kube-system` pod;
- device annotations (`train`, namespace `ml`): a device node, a read-only mount, env and a
  pooled device; and two requests the node's policy refuses (a device not allowed, an OOM
  override out of range);
- netdev annotations (`net-app`, namespace `net`, on the pod network): a macvlan on a veth
  parent and a veth end moved into the pod, given back when it goes; and two refusals (a pod
  on the host's network, a namespace the node's policy does not allow). crihook runs in a
  network namespace the script owns (`crihook-corpus`, entered with nsenter: only the
  network namespace changes), where the script makes those veths with fixed names and MAC
  addresses, so their indexes and addresses are the same in every re-recording;
- a plugin: the annotate example plugin as its own process (a drop-in), annotating every
  container of a pod that is not exempt;
- kubelet resizing a container, and a kubelet-restart burst of UpdateContainerResources for
  every running container;
- crihook restarted in the middle (the file gets a second part: header, synchronize);
- deletions (the exclusive CPU and the pooled device go back; the shared containers follow),
  a new Guaranteed pod on the freed CPU, then everything removed.

`colocated` (koordinator-colocated.jsonl): a Koordinator co-located node, the koordinator
hook alone placing CPUs (`cpu_manager = "none"`) on this 2-CPU machine:

- an LSR pod koord-scheduler gave CPU 1 (`resource-status`), an LS pod (label), a Burstable
  pod without a label (LS by its Kubernetes QoS class), a BE pod with batch resources for
  one of its two containers (`extended-resource-spec`), koordlet's own pod (skip label) and
  an exempt kube-system pod labelled BE; a BE pod with a malformed batch spec (refused);
- an in-place resize of the LSR container and a kubelet-restart burst of
  UpdateContainerResources (the scheduler's cpuset and the batch values stay);
- the LSR pod removed (the shared pool grows back), an LSE pod on CPU 1 (it leaves the BE
  pool too), then everything removed.

"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc

from crihook.api.cri.v1 import api_pb2
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import (
    CrihookProcess,
    release_staging,
    short_tmpdir,
    staging_dir_of,
)
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, PodStartError
from tests.lab.plugin_proc import Plugin

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "containerd-node.jsonl"
COLOCATED = HERE / "koordinator-colocated.jsonl"
MIB = 1 << 20
# Fixed paths, so a re-recorded corpus differs from the last only where behaviour does.
DEVICE_ROOT = Path("/tmp/crihook-corpus-host")
NETNS = "crihook-corpus"
"""The network namespace crihook runs in (its "host" for the netdev hook)."""
PARENT, VF = "cc-parent", "cc-vf0"
"""A macvlan parent and an interface to move in: veth ends (no dummy module here), whose
peers stay in crihook's namespace."""


def config(root: Path) -> str:
    dev = root / "dev"
    return f"""
[node]
topology_policy = "best-effort"

[hooks]
order = ["cpuset", "numa", "oom", "devices", "netdev"]
exempt_namespaces = ["kube-system"]

[hooks.cpuset]
reserved_cpus = "0"

[hooks.oom]
qos_scores = {{ BestEffort = 999 }}
override_ranges = {{ batch = "500..1000" }}

[hooks.devices]
namespaces = ["ml"]
devices = ["{dev}/ok-*"]
mounts = ["{root}/models", "{root}/models/**"]
env = ["MODEL_*"]

[hooks.netdev]
namespaces = ["net"]
interfaces = ["{VF}"]
parents = ["{PARENT}"]
timeout_ms = 5000

[hooks.devices.pools.gpu]
env = "GPU_VISIBLE_DEVICES"
devices = [
  {{ id = "0", path = "{dev}/gpu0", numa = 0 }},
  {{ id = "1", path = "{dev}/gpu1", numa = 0 }},
]
"""


def host_files(root: Path) -> None:
    """Device nodes (the numbers of /dev/null, /dev/zero, ...) and a model directory."""
    shutil.rmtree(root, ignore_errors=True)
    dev = root / "dev"
    dev.mkdir(parents=True)
    for name, minor in [("ok-null", 3), ("ok-zero", 5), ("gpu0", 7), ("gpu1", 8), ("forbidden", 3)]:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, minor))  # S_IFCHR
    (root / "models").mkdir()
    (root / "models" / "weights.txt").write_text("hello\n")


def uid(n: int) -> str:
    return f"c0ffee00-0000-4000-8000-{n:012d}"


def app(
    name: str, cpu: int | None = None, memory: int | None = None, **kw: object
) -> ContainerSpec:
    """`cpu` (milli-CPU) and `memory` as request and limit: Guaranteed when both are set."""
    spec = ContainerSpec(name, command=["sleep", "3600"], **kw)  # type: ignore[arg-type]
    spec.cpu_request = spec.cpu_limit = cpu
    spec.memory_request = spec.memory_limit = memory
    return spec


def workload_pods(root: Path) -> dict[str, PodSpec]:
    web_app = ContainerSpec("app", cpu_request=200, memory_request=64 * MIB)
    proxy = ContainerSpec("proxy", cpu_request=100, memory_request=32 * MIB)
    init = ContainerSpec("init", command=["true"])
    train = app("app", env=[("MODEL_TOKEN", "do-not-record")])
    devices = root / "dev"
    return {
        "coredns": PodSpec(
            name="coredns", namespace="kube-system", uid=uid(1), containers=[ContainerSpec("dns")]
        ),
        "batch": PodSpec(
            name="batch-0",
            namespace="batch",
            uid=uid(2),
            containers=[ContainerSpec("job")],
            annotations={"oom.crihook.io/score-adj": "700"},
        ),
        "web": PodSpec(
            name="web-0",
            uid=uid(3),
            init_containers=[init],
            containers=[web_app, proxy],
            annotations={
                "crihook.io/init-containers": "init",
                "crihook.io/sidecar-containers": "proxy",
                "example.com/api-token": "do-not-record",
            },
        ),
        "cache": PodSpec(name="cache-0", uid=uid(4), containers=[app("redis", 500, 64 * MIB)]),
        "db": PodSpec(name="db-0", uid=uid(5), containers=[app("postgres", 1000, 128 * MIB)]),
        "train": PodSpec(
            name="train-0",
            namespace="ml",
            uid=uid(6),
            containers=[train],
            annotations={
                "devices.crihook.io/pod": json.dumps([{"path": f"{devices}/ok-null"}]),
                "mounts.crihook.io/container.app": json.dumps({f"{root}/models": "/models"}),
                "env.crihook.io/pod": json.dumps([{"name": "MODEL_DIR", "value": "/models"}]),
                "pools.crihook.io/container.app": json.dumps({"gpu": 1}),
            },
        ),
        "not-allowed": PodSpec(
            name="sneaky-0",
            namespace="ml",
            uid=uid(7),
            containers=[app("app")],
            annotations={"devices.crihook.io/pod": json.dumps([{"path": f"{devices}/forbidden"}])},
        ),
        "out-of-range": PodSpec(
            name="batch-1",
            namespace="batch",
            uid=uid(8),
            containers=[ContainerSpec("job")],
            annotations={"oom.crihook.io/score-adj": "-900"},
        ),
        "db-1": PodSpec(name="db-1", uid=uid(9), containers=[app("postgres", 1000, 128 * MIB)]),
        "net": net_pod("net-app", 10, NETDEVS),
        "net-host": net_pod("net-host", 11, NETDEVS[:1], host_network=True),
        "net-other": net_pod("net-other", 12, NETDEVS[:1], namespace="default"),
    }


NETDEVS = [
    {"name": "net1", "type": "macvlan", "parent": PARENT, "addresses": ["10.99.0.2/24"]},
    {"name": "net2", "interface": VF, "mtu": 1400},
]


def net_pod(
    name: str,
    n: int,
    links: list[dict[str, object]],
    namespace: str = "net",
    host_network: bool = False,
) -> PodSpec:
    return PodSpec(
        name=name,
        namespace=namespace,
        uid=uid(n),
        host_network=host_network,
        annotations={"netdevs.crihook.io/pod": json.dumps(links)},
        containers=[app("app")],
    )


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def network_namespace() -> Iterator[Path]:
    """`crihook-corpus` with the veths netdev hands out; removed (with them) at the end."""
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)
    ip("netns", "add", NETNS)
    try:
        for n, name in enumerate((PARENT, VF), 1):
            mac, peer_mac = f"02:cc:00:00:00:{n:02x}", f"02:cc:00:00:01:{n:02x}"
            ip("-n", NETNS, "link", "add", name, "address", mac, "type", "veth",
               "peer", "name", f"{name}-p", "address", peer_mac)  # fmt: skip
            ip("-n", NETNS, "link", "set", name, "up")
            ip("-n", NETNS, "link", "set", f"{name}-p", "up")
        yield Path("/var/run/netns") / NETNS
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)


class NetnsCrihook(CrihookProcess):
    """crihook in the script's network namespace (nsenter execs it: the pid is crihook's)."""

    netns: Path

    def command(self) -> list[str]:
        return ["nsenter", f"--net={self.netns}", *super().command()]


def refused(kubelet: KubeletClient, spec: PodSpec) -> None:
    try:
        kubelet.run_pod(spec)
    except PodStartError as exc:
        if exc.handle is not None:  # the sandbox was made: kubelet removes it
            kubelet.remove_pod(exc.handle)
        return
    raise AssertionError(f"pod {spec.name} was not refused")


def update_burst(kubelet: KubeletClient, handles: list[PodHandle]) -> None:
    """What a restarted kubelet does: UpdateContainerResources for every running container,
    with the resources it computes for it."""
    for handle in handles:
        for name, cid in handle.container_ids.items():
            linux = handle.container_configs[name].linux.resources
            kubelet.runtime.UpdateContainerResources(
                api_pb2.UpdateContainerResourcesRequest(container_id=cid, linux=linux), timeout=30
            )


def record(out: Path, workload: str = "node") -> None:
    host_files(DEVICE_ROOT)
    images = build_images(DEFAULT_CACHE_DIR)
    workdir = short_tmpdir("corpus-")
    path = workdir / "record.jsonl"
    proc: CrihookProcess
    with contextlib.ExitStack() as cleanup:  # (in reverse: crihook, the lab, the namespace)
        cleanup.callback(shutil.rmtree, DEVICE_ROOT, ignore_errors=True)
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        cleanup.callback(release_staging, staging_dir_of(workdir))  # before the device root
        lab = Containerd(tempfile.mkdtemp(prefix="crihook-lab-", dir="/tmp"), images)
        args = ["--record", str(path)]
        if workload == "node":
            netns = cleanup.enter_context(network_namespace())
            cleanup.callback(lab.cleanup)
            lab.start()
            plugin = Plugin().start()
            cleanup.callback(plugin.stop)
            proc = NetnsCrihook(
                lab.endpoint, workdir=workdir, config=config(DEVICE_ROOT), hooks=None, args=args
            )
            proc.netns = netns
            dropin = plugin.dropin("70-annotate", "fail")
            (proc.plugins_dir / "annotate.toml").write_text(dropin)
        else:
            cleanup.callback(lab.cleanup)
            lab.start()
            proc = CrihookProcess(
                lab.endpoint, workdir=workdir, config=COLOCATED_CONFIG, hooks=None, args=args
            )
        cleanup.callback(proc.kill)
        proc.start()
        if workload == "node":
            run_node(lab, proc)
        else:
            run_colocated(lab, proc)
        assert proc.stop() == 0, proc.log()
        out.write_bytes(path.read_bytes())
        print(f"wrote {out} ({out.stat().st_size} bytes)")


def run_node(lab: Containerd, proc: CrihookProcess) -> None:
    """The `node` workload (see the module docstring); crihook restarted midway."""
    pods = workload_pods(DEVICE_ROOT)
    with KubeletClient(proc.endpoint, log_root=lab.pod_log_dir) as kubelet:
        handles = {
            name: kubelet.run_pod(pods[name])
            for name in ("coredns", "batch", "web", "cache", "db", "train", "net")
        }
        for name in ("not-allowed", "out-of-range", "net-host", "net-other"):
            refused(kubelet, pods[name])
        # kubelet resizes web-0's app container (in place: more CPU, more memory).
        web = handles["web"]
        resized = api_pb2.LinuxContainerResources()
        resized.CopyFrom(web.container_configs["app"].linux.resources)
        resized.cpu_shares, resized.memory_limit_in_bytes = 512, 256 * MIB
        kubelet.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(
                container_id=web.container_ids["app"], linux=resized
            ),
            timeout=30,
        )
        update_burst(kubelet, list(handles.values()))
    assert proc.stop() == 0, proc.log()
    proc.start()  # a crihook restart: the file gets its second part
    with KubeletClient(proc.endpoint, log_root=lab.pod_log_dir) as kubelet:
        update_burst(kubelet, list(handles.values()))
        for name in ("db", "train", "net"):
            kubelet.remove_pod(handles.pop(name))
        handles["db-1"] = kubelet.run_pod(pods["db-1"])
        for handle in handles.values():
            kubelet.remove_pod(handle)


KOORD_QOS = "koordinator.sh/qosClass"
KOORD_STATUS = "scheduling.koordinator.sh/resource-status"
KOORD_SPEC = "node.koordinator.sh/extended-resource-spec"
KOORD_SKIP = "runtimeproxy.koordinator.sh/skip-hookserver"
BATCH = {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "128Mi"},
    "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "256Mi"},
}

COLOCATED_CONFIG = """
[hooks]
order = ["koordinator"]
exempt_namespaces = ["kube-system"]

[hooks.koordinator]
cpu_manager = "none"
"""


def koord_pod(
    name: str,
    n: int,
    *containers: ContainerSpec,
    qos: str | None = None,
    cpus: str | None = None,
    batch: dict[str, object] | None = None,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> PodSpec:
    """A pod as Koordinator's webhook and scheduler leave it."""
    all_labels = dict(labels or {})
    if qos is not None:
        all_labels[KOORD_QOS] = qos
    all_annotations = dict(annotations or {})
    if cpus is not None:
        all_annotations[KOORD_STATUS] = json.dumps({"cpuset": cpus})
    if batch is not None:
        all_annotations[KOORD_SPEC] = json.dumps({"containers": batch})
    return PodSpec(
        name=name,
        namespace=namespace,
        uid=uid(100 + n),
        labels=all_labels,
        annotations=all_annotations,
        containers=list(containers),
    )


def colocated_pods() -> dict[str, PodSpec]:
    burstable = {"cpu_request": 100, "memory_request": 32 * MIB}
    return {
        "koordlet": koord_pod(
            "koordlet-x7k2p",
            1,
            ContainerSpec("koordlet", **burstable),  # type: ignore[arg-type]
            qos="SYSTEM",
            namespace="koordinator-system",
            labels={KOORD_SKIP: "true"},
        ),
        "coredns": koord_pod(
            "coredns-0",
            2,
            ContainerSpec("coredns", **burstable),  # type: ignore[arg-type]
            qos="BE",
            batch={"coredns": BATCH},
            namespace="kube-system",
        ),
        "lsr": koord_pod("lsr-0", 3, app("server", 1000, 64 * MIB), qos="LSR", cpus="1"),
        "ls": koord_pod("ls-0", 4, ContainerSpec("web", **burstable), qos="LS"),  # type: ignore[arg-type]
        "web": koord_pod("api-0", 5, ContainerSpec("api", **burstable)),  # type: ignore[arg-type]
        "be": koord_pod(
            "spark-0",
            6,
            ContainerSpec("executor"),
            ContainerSpec("log"),
            qos="BE",
            batch={"executor": BATCH},
        ),
        "be-bad": koord_pod(
            "spark-1",
            7,
            ContainerSpec("executor"),
            qos="BE",
            annotations={KOORD_SPEC: '{"containers": {"executor": {"limits": 4}}}'},
        ),
        "lse": koord_pod("lse-0", 8, app("server", 1000, 64 * MIB), qos="LSE", cpus="1"),
    }


def run_colocated(lab: Containerd, proc: CrihookProcess) -> None:
    """The `colocated` workload (see the module docstring)."""
    pods = colocated_pods()
    with KubeletClient(proc.endpoint, log_root=lab.pod_log_dir) as kubelet:
        order = ("koordlet", "coredns", "lsr", "ls", "web", "be")
        handles = {name: kubelet.run_pod(pods[name]) for name in order}
        refused(kubelet, pods["be-bad"])
        # kubelet resizes the LSR container in place (more CPU time): its cpuset stays.
        lsr = handles["lsr"]
        resized = api_pb2.LinuxContainerResources()
        resized.CopyFrom(lsr.container_configs["server"].linux.resources)
        resized.cpu_shares, resized.cpu_quota = 1536, 150_000
        kubelet.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(
                container_id=lsr.container_ids["server"], linux=resized
            ),
            timeout=30,
        )
        update_burst(kubelet, list(handles.values()))
        kubelet.remove_pod(handles.pop("lsr"))
        handles["lse"] = kubelet.run_pod(pods["lse"])
        for handle in handles.values():
            kubelet.remove_pod(handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.replay.record_corpus")
    parser.add_argument("--workload", choices=("node", "colocated"), default="node")
    parser.add_argument("--out", type=Path, help=f"default {CORPUS} or {COLOCATED}")
    args = parser.parse_args(argv)
    out = args.out or (CORPUS if args.workload == "node" else COLOCATED)
    if os.geteuid() != 0:
        print("record_corpus: needs root (containerd, device nodes)", file=sys.stderr)
        return 2
    try:
        record(out, args.workload)
    except (grpc.RpcError, PodStartError, AssertionError) as exc:
        print(f"record_corpus: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
