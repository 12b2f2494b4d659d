"""The device hooks (devices, netdev) in a real crihook in front of the lab's containerd: what
they inject is checked where it takes effect, inside the containers (ExecSync) and in the OCI
spec containerd made, and on the host's network interfaces.

Device nodes are made by the test with mknod under a temp dir (the numbers of /dev/null,
/dev/zero, ...: containerd recreates a node inside the container from the host node's type,
major and minor). The host interfaces are made by the test too: this kernel has no `dummy`
module, so a veth end stands in for an SR-IOV VF (a real interface to move, whose peer stays
on the host), and a bridge is the parent of macvlans. Everything is removed at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, PodStartError
from tests.lab.runtime_lab import RuntimeLab

# On containerd 1.6 and 2.x by default (tests/lab/containerd_versions.py).
pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

HOOKS = "devices,netdev"

Start = Callable[..., CrihookProcess]


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def start_crihook(containerd: RuntimeLab) -> Iterator[Start]:
    """`start(config)`: crihook with the device hooks in its own workdir; `start(config,
    workdir=...)` again on the same state. Every process killed, every workdir removed."""
    procs: list[CrihookProcess] = []

    def start(config: str, workdir: Path | None = None) -> CrihookProcess:
        proc = CrihookProcess(
            containerd.endpoint,
            workdir=workdir or short_tmpdir("dv-"),
            config=config,
            hooks=HOOKS,
        )
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        proc.kill()
    for workdir in {p.workdir for p in procs}:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def host_files() -> Iterator[Path]:
    """A temp dir with device nodes (`ok-null` c 1:3, `ok-zero` c 1:5, `gpu0..2` c 1:7..9,
    `secret` c 1:3 outside the allowlist, `ok-link` → `secret`) and `models/weights.txt`."""
    root = Path(tempfile.mkdtemp(prefix="crihook-dev-", dir="/tmp"))
    try:
        dev = root / "dev"
        dev.mkdir()
        for name, minor in [("ok-null", 3), ("ok-zero", 5), ("gpu0", 7), ("gpu1", 8),
                            ("gpu2", 9), ("secret", 3)]:  # fmt: skip
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, minor))  # S_IFCHR
        (dev / "ok-link").symlink_to(dev / "secret")
        (root / "models").mkdir()
        (root / "models" / "weights.txt").write_text("hello\n")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def devices_config(root: Path) -> str:
    dev = root / "dev"
    gpus = ", ".join(f'{{ id = "{i}", path = "{dev}/gpu{i}", numa = 0 }}' for i in range(3))
    return (
        "[hooks.devices]\n"
        'namespaces = ["devices-ok"]\n'
        f'devices = ["{dev}/ok-*"]\n'
        f'mounts = ["{root}/models", "{root}/models/**"]\n'
        'env = ["MODEL_*"]\n'
        "[hooks.devices.pools.gpu]\n"
        'env = "GPU_VISIBLE_DEVICES"\n'
        f"devices = [{gpus}]\n"
    )


def kubelet_for(proc: CrihookProcess, containerd: RuntimeLab) -> KubeletClient:
    return KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir)


def run_pod(kubelet: KubeletClient, spec: PodSpec, cleanup: PodCleanup) -> PodHandle:
    try:
        return cleanup.add(kubelet.run_pod(spec))
    except PodStartError as exc:
        if exc.handle is not None:
            cleanup.add(exc.handle)
        raise


def refused(kubelet: KubeletClient, spec: PodSpec, cleanup: PodCleanup) -> PodStartError:
    with pytest.raises(PodStartError) as info:
        run_pod(kubelet, spec, cleanup)
    return info.value


def sh(kubelet: KubeletClient, cid: str, script: str) -> tuple[int, str]:
    out = kubelet.exec_sync(cid, ["sh", "-c", script])
    return out.exit_code, (out.stdout + out.stderr).decode()


def runtime_spec(kubelet: KubeletClient, cid: str) -> dict[str, Any]:
    info = kubelet.container_status(cid, verbose=True).info
    spec: dict[str, Any] = json.loads(info["info"])["runtimeSpec"]
    return spec


def hook_state(
    proc: CrihookProcess, name: str, what: str, ok: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The hook's state file once `ok` holds (post-stage changes are written behind)."""
    wait_for(lambda: ok(proc.hook_state(name)), PATIENCE, f"{name}'s state: {what}")
    return proc.hook_state(name)


def app(name: str = "app") -> ContainerSpec:
    return ContainerSpec(name=name, command=["sleep", "3600"])


# --- devices -------------------------------------------------------------------------------------


def test_allowlisted_devices_mounts_and_env_reach_the_container_and_its_spec(
    containerd: RuntimeLab, start_crihook: Start, host_files: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook(devices_config(host_files))
    dev, models = host_files / "dev", host_files / "models"
    annotations = {
        "devices.crihook.io/container.app": json.dumps(
            [
                {"path": f"{dev}/ok-null", "container_path": "/dev/crihook-null"},
                {"path": f"{dev}/ok-zero", "permissions": "r"},
            ]
        ),
        "mounts.crihook.io/pod": json.dumps({str(models): "/models"}),
        "env.crihook.io/container.app": json.dumps([{"name": "MODEL_DIR", "value": "/models"}]),
    }
    spec = PodSpec(name="dev-app", namespace="devices-ok", annotations=annotations,
                   containers=[app()])  # fmt: skip
    with kubelet_for(proc, containerd) as kubelet:
        cid = run_pod(kubelet, spec, pod_cleanup).container_ids["app"]
        # Inside: the nodes as the host has them, usable; the mount read-only; the env.
        assert sh(kubelet, cid, "stat -c '%F %t:%T' /dev/crihook-null")[1].strip() == (
            "character special file 1:3"
        )
        assert sh(kubelet, cid, f"stat -c '%t:%T' {dev}/ok-zero")[1].strip() == "1:5"
        assert sh(
            kubelet, cid, "echo hi > /dev/crihook-null && head -c 3 /dev/crihook-null | wc -c"
        ) == (0, "0\n")
        assert sh(kubelet, cid, "cat /models/weights.txt") == (0, "hello\n")
        code, out = sh(kubelet, cid, "touch /models/new")
        assert code != 0 and "Read-only file system" in out
        assert sh(kubelet, cid, "echo $MODEL_DIR") == (0, "/models\n")
        # The OCI spec containerd made: devices with the host's numbers, the cgroup rules.
        oci = runtime_spec(kubelet, cid)
        devices = {d["path"]: (d["type"], d["major"], d["minor"]) for d in oci["linux"]["devices"]}
        assert devices["/dev/crihook-null"] == ("c", 1, 3)
        assert devices[f"{dev}/ok-zero"] == ("c", 1, 5)
        rules = [(r.get("type"), r.get("major"), r.get("minor"), r.get("access"))
                 for r in oci["linux"]["resources"]["devices"] if r.get("allow")]  # fmt: skip
        assert ("c", 1, 3, "rw") in rules and ("c", 1, 5, "r") in rules
        mount = next(m for m in oci["mounts"] if m["destination"] == "/models")
        # The source is crihook's staging path pinning the checked directory, not the path.
        assert mount["source"].startswith(f"{proc.staging_dir}/") and "ro" in mount["options"]
    assert not (models / "new").exists()


@pytest.mark.parametrize(
    ("namespace", "annotation", "code", "fragments"),
    [
        ("devices-ok", "devices.crihook.io/container.app", grpc.StatusCode.PERMISSION_DENIED,
         ["devices.crihook.io/container.app [0]", "/secret is not allowed"]),
        ("devices-ok", "symlink", grpc.StatusCode.PERMISSION_DENIED,
         ["devices.crihook.io/container.app [0]", "/ok-link leads to", "/secret"]),
        ("default", "devices.crihook.io/container.app", grpc.StatusCode.PERMISSION_DENIED,
         ["namespace 'default' may not ask"]),
        ("devices-ok", "missing", grpc.StatusCode.INVALID_ARGUMENT,
         ["/ok-gone does not exist on this node"]),
        ("devices-ok", "mount", grpc.StatusCode.PERMISSION_DENIED,
         ['mounts.crihook.io/container.app ["/etc"]', "mounting /etc read-only is not allowed"]),
    ],
    ids=["not-allowlisted", "symlink-out", "namespace", "missing", "mount"],
)  # fmt: skip
def test_a_forbidden_request_is_refused_and_nothing_is_created(
    containerd: RuntimeLab,
    start_crihook: Start,
    host_files: Path,
    pod_cleanup: PodCleanup,
    namespace: str,
    annotation: str,
    code: grpc.StatusCode,
    fragments: list[str],
) -> None:
    proc = start_crihook(devices_config(host_files))
    dev = host_files / "dev"
    key = "devices.crihook.io/container.app"
    value = {
        "symlink": [{"path": f"{dev}/ok-link"}],
        "missing": [{"path": f"{dev}/ok-gone"}],
    }.get(annotation, [{"path": f"{dev}/secret"}])
    annotations = {key: json.dumps(value)}
    if annotation == "mount":
        annotations = {"mounts.crihook.io/container.app": json.dumps({"/etc": "/host-etc"})}
    annotations["pools.crihook.io/container.app"] = '{"gpu": 1}'
    spec = PodSpec(name="dev-refused", namespace=namespace, annotations=annotations,
                   containers=[app()])  # fmt: skip
    with kubelet_for(proc, containerd) as kubelet:
        error = refused(kubelet, spec, pod_cleanup)
        assert error.code == code, error
        for fragment in fragments:
            assert fragment in error.details
        assert error.handle is not None  # the sandbox was made; the container was not
        listed = kubelet.runtime.ListContainers(
            api_pb2.ListContainersRequest(
                filter=api_pb2.ContainerFilter(pod_sandbox_id=error.handle.sandbox_id)
            ),
            timeout=60,
        ).containers
        assert list(listed) == []
    # Nothing reserved: the pool's state has no holding.
    assert not [k for k in proc.hook_state("devices") if k.startswith("a:")]


def test_pooled_devices_are_exclusive_freed_on_removal_and_survive_a_restart(
    containerd: RuntimeLab, start_crihook: Start, host_files: Path, pod_cleanup: PodCleanup
) -> None:
    config = devices_config(host_files)
    proc = start_crihook(config)
    dev = host_files / "dev"

    def gpu_pod(name: str) -> PodSpec:
        return PodSpec(
            name=name,
            namespace="devices-ok",
            annotations={"pools.crihook.io/container.app": '{"gpu": 1}'},
            containers=[app()],
        )

    given: dict[str, tuple[PodHandle, str]] = {}
    with kubelet_for(proc, containerd) as kubelet:
        for i in range(3):
            handle = run_pod(kubelet, gpu_pod(f"gpu-{i}"), pod_cleanup)
            cid = handle.container_ids["app"]
            ident = sh(kubelet, cid, "echo $GPU_VISIBLE_DEVICES")[1].strip()
            # Its device node, and no other pool device.
            assert (
                sh(kubelet, cid, f"stat -c %T {dev}/gpu{ident}")[1].strip() == f"{7 + int(ident)}"
            )
            others = [f"{dev}/gpu{j}" for j in range(3) if str(j) != ident]
            assert sh(kubelet, cid, f"ls {' '.join(others)}")[0] != 0
            given[ident] = (handle, cid)
        assert sorted(given) == ["0", "1", "2"]
        error = refused(kubelet, gpu_pod("gpu-3"), pod_cleanup)
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "pool gpu cannot give 1 device(s): 3 of 3 are held" in error.details
    hook_state(
        proc, "devices", "3 holdings", lambda d: len([k for k in d if k.startswith("a:")]) == 3
    )

    # A new crihook on the same state: the pool is still full.
    proc.stop()
    proc = start_crihook(config, workdir=proc.workdir)
    with kubelet_for(proc, containerd) as kubelet:
        assert (
            refused(kubelet, gpu_pod("gpu-4"), pod_cleanup).code
            == grpc.StatusCode.FAILED_PRECONDITION
        )
        # Removing a pod gives its device back: the next pod gets it.
        handle, _ = given["1"]
        kubelet.remove_pod(handle)
        hook_state(
            proc, "devices", "one freed", lambda d: len([k for k in d if k.startswith("a:")]) == 2
        )
        again = run_pod(kubelet, gpu_pod("gpu-5"), pod_cleanup)
        assert sh(kubelet, again.container_ids["app"], "echo $GPU_VISIBLE_DEVICES") == (0, "1\n")


@pytest.mark.parametrize("annotated", [True, False], ids=["init-annotation", "exited"])
def test_an_app_container_reuses_its_init_containers_device(
    containerd: RuntimeLab,
    start_crihook: Start,
    host_files: Path,
    pod_cleanup: PodCleanup,
    annotated: bool,
) -> None:
    """kubelet's device manager: an init container's devices go to the pod's later containers
    first. The init container takes 2 of the 3 devices, another pod the third; the app
    container asks for 2 and gets the init container's (known from kubelet's annotation, or
    from the runtime: it exited)."""
    proc = start_crihook(devices_config(host_files))
    annotations = {
        "pools.crihook.io/container.init": '{"gpu": 2}',
        "pools.crihook.io/container.app": '{"gpu": 2}',
    }
    if annotated:
        annotations["crihook.io/init-containers"] = "init"
    spec = PodSpec(
        name="trainer",
        namespace="devices-ok",
        annotations=annotations,
        init_containers=[ContainerSpec(name="init", command=["sh", "-c", "true"])],
        containers=[app()],
    )
    other = PodSpec(
        name="other",
        namespace="devices-ok",
        annotations={"pools.crihook.io/container.app": '{"gpu": 1}'},
        containers=[app()],
    )
    with kubelet_for(proc, containerd) as kubelet:
        handle = run_pod(kubelet, spec, pod_cleanup)
        theirs = run_pod(kubelet, other, pod_cleanup)
        mine = sh(kubelet, handle.container_ids["app"], "echo $GPU_VISIBLE_DEVICES")[1].strip()
        assert sh(kubelet, theirs.container_ids["app"], "echo $GPU_VISIBLE_DEVICES") == (0, "2\n")
    assert mine == "0,1"
    state = hook_state(
        proc, "devices", "3 holdings", lambda d: len([k for k in d if k.startswith("a:")]) == 3
    )
    sandbox = handle.sandbox_id
    assert state[f"a:{sandbox}/init"]["devices"] == state[f"a:{sandbox}/app"]["devices"]


# --- network devices ---------------------------------------------------------------------------


class HostLinks:
    """Interfaces the test makes on the host (a veth pair, a bridge), removed at the end."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.vf, self.peer, self.bridge = f"chv{tag}", f"chp{tag}", f"chb{tag}"
        ip("link", "add", self.vf, "type", "veth", "peer", "name", self.peer)
        ip("link", "add", self.bridge, "type", "bridge")
        for name in (self.vf, self.peer, self.bridge):
            ip("link", "set", name, "up")
        ip("addr", "add", "10.77.0.1/24", "dev", self.peer)

    def link(self, name: str) -> str:
        """`ip -o link show` of a host interface ("" when it is not on the host)."""
        out = subprocess.run(["ip", "-o", "link", "show", name], capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else ""

    def remove(self) -> None:
        for name in (self.vf, self.peer, self.bridge):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def host_links() -> Iterator[HostLinks]:
    links = HostLinks()
    try:
        yield links
    finally:
        links.remove()


def netdev_config(links: HostLinks) -> str:
    return (
        "[hooks.netdev]\n"
        'namespaces = ["net-ok"]\n'
        'interfaces = ["chv*"]\n'
        'parents = ["chb*"]\n'
        "timeout_ms = 5000\n"
    )


def net_pod(
    name: str, links: list[dict[str, Any]], namespace: str = "net-ok", **kw: Any
) -> PodSpec:
    return PodSpec(
        name=name,
        namespace=namespace,
        host_network=kw.pop("host_network", False),
        annotations={"netdevs.crihook.io/pod": json.dumps(links)},
        containers=[app()],
    )


def netns_of(kubelet: KubeletClient, sandbox_id: str) -> str:
    info = json.loads(kubelet.pod_status(sandbox_id, verbose=True).info["info"])
    return next(
        n["path"] for n in info["runtimeSpec"]["linux"]["namespaces"] if n["type"] == "network"
    )


def test_a_host_interface_moves_into_the_pod_and_back_and_a_macvlan_comes_and_goes(
    containerd: RuntimeLab, start_crihook: Start, host_links: HostLinks, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook(netdev_config(host_links))
    asked = [
        {"name": "net1", "interface": host_links.vf, "addresses": ["10.77.0.2/24"], "mtu": 1400},
        {"name": "net2", "type": "macvlan", "parent": host_links.bridge,
         "addresses": ["10.78.0.2/24"]},
    ]  # fmt: skip
    with kubelet_for(proc, containerd) as kubelet:
        handle = run_pod(kubelet, net_pod("net-app", asked), pod_cleanup)
        cid = handle.container_ids["app"]
        code, out = sh(kubelet, cid, "ip -o link show net1")
        assert code == 0 and "mtu 1400" in out and ",UP" in out, out
        assert "inet 10.77.0.2/24" in sh(kubelet, cid, "ip -o addr show net1")[1]
        # It is the host's interface: its peer on the host answers. From the container on
        # containerd; CRI-O's default capabilities lack NET_RAW (ping's raw socket), so there
        # from the pod's network namespace, which the container is in.
        netns = netns_of(kubelet, handle.sandbox_id)
        ping = ["ping", "-c", "1", "-W", "3", "10.77.0.1"]
        if containerd.is_crio:
            pinged = subprocess.run(["nsenter", f"--net={netns}", "busybox", *ping], check=False)
            assert pinged.returncode == 0
            assert sh(kubelet, cid, " ".join(ping))[0] != 0  # no NET_RAW in the container
        else:
            assert sh(kubelet, cid, " ".join(ping))[0] == 0
        assert host_links.link(host_links.vf) == ""
        details = subprocess.run(
            ["nsenter", f"--net={netns}", "ip", "-d", "-o", "link", "show", "net2"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "macvlan mode bridge" in details
        assert "inet 10.78.0.2/24" in sh(kubelet, cid, "ip -o addr show net2")[1]

        kubelet.stop_pod(handle)
        back = host_links.link(host_links.vf)
        assert back and "mtu 1500" in back and ",UP" in back, back  # its name, MTU and state
    hook_state(proc, "netdev", "nothing held", lambda d: d == {})
    assert "pod net-ok/net-app gave its interfaces back" in proc.log()


def test_interfaces_the_node_does_not_allow_are_refused_before_anything_is_made(
    containerd: RuntimeLab, start_crihook: Start, host_links: HostLinks, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook(netdev_config(host_links))
    with kubelet_for(proc, containerd) as kubelet:
        before = {p.id for p in kubelet.list_pods()}
        error = refused(
            kubelet,
            net_pod("net-peer", [{"name": "net1", "interface": host_links.peer}]),
            pod_cleanup,
        )
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert f"interface {host_links.peer} may not be moved into a pod" in error.details
        error = refused(
            kubelet,
            net_pod("net-host", [{"name": "net1", "interface": host_links.vf}], host_network=True),
            pod_cleanup,
        )
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "runs on the host's network" in error.details
        error = refused(
            kubelet,
            net_pod("net-ns", [{"name": "net1", "interface": host_links.vf}], "default"),
            pod_cleanup,
        )
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert {p.id for p in kubelet.list_pods()} == before  # no sandbox was made
    assert host_links.link(host_links.vf) and host_links.link(host_links.peer)


def test_a_failure_midway_undoes_everything_and_the_sandbox(
    containerd: RuntimeLab, start_crihook: Start, host_links: HostLinks, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook(netdev_config(host_links))
    asked = [
        {"name": "net2", "type": "macvlan", "parent": host_links.bridge},
        {"name": "eth0", "interface": host_links.vf},  # the CNI's interface is eth0 there
    ]
    with kubelet_for(proc, containerd) as kubelet:
        before = {p.id for p in kubelet.list_pods()}
        error = refused(kubelet, net_pod("net-half", asked), pod_cleanup)
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "netdevs.crihook.io/pod [1]" in error.details and "File exists" in error.details
        # crihook stopped and removed the sandbox it could not set up.
        assert {p.id for p in kubelet.list_pods()} == before
    back = host_links.link(host_links.vf)
    assert back and "mtu 1500" in back and ",UP" in back
    hook_state(proc, "netdev", "nothing held", lambda d: d == {})
