"""Host mounts pinned to what was checked (issue 28), on the lab's real runtimes: a host path
swapped for a symlink after crihook checked it never gives the container what the symlink
leads to, and the staging mounts crihook makes for it go when the container, its pod or the
call goes, or at the next start when the container went while crihook was away.

The attack: `[hooks.devices] writable_mounts = ["<tree>/**"]`; a pod asks for `<tree>/race`
read-only; after CreateContainer, `mv race race.d && ln -s /etc race`. runc mounts at
StartContainer: before the fix it followed the symlink and the container saw the host's /etc.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, PodStartError
from tests.lab.runtime_lab import RuntimeLab

pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

MARKER = "checked-by-crihook"
RACED_PODS = 10
"""Pods started while the path is swapped back and forth (each a create and a start)."""

Start = Callable[..., CrihookProcess]


@pytest.fixture
def tree() -> Iterator[Path]:
    """`<tree>/race/marker` (the directory the pod asks for)."""
    root = Path(tempfile.mkdtemp(prefix="crihook-tree-", dir="/tmp"))
    try:
        (root / "race").mkdir()
        (root / "race" / "marker").write_text(MARKER)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start_crihook(containerd: RuntimeLab, tree: Path) -> Iterator[Start]:
    """`start()`: crihook with the devices hook allowing `<tree>/**` read-write to `ml-*`;
    `start(workdir=...)` again on the same state and staging directory."""
    procs: list[CrihookProcess] = []
    config = (
        f'[hooks.devices]\nnamespaces = ["ml-*"]\nwritable_mounts = ["{tree}/**"]\n'
        f'devices = ["{tree}/dev/*"]\n'
    )

    def start(workdir: Path | None = None) -> CrihookProcess:
        proc = CrihookProcess(
            containerd.endpoint, workdir=workdir or short_tmpdir("mp-"), config=config,
            hooks="devices",
        )  # fmt: skip
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        proc.kill()


def pod_spec(name: str, tree: Path, containers: list[ContainerSpec] | None = None) -> PodSpec:
    mounts = json.dumps([{"host_path": f"{tree}/race", "container_path": "/race"}])
    return PodSpec(
        name=name,
        namespace="ml-test",
        annotations={"mounts.crihook.io/pod": mounts},
        containers=[app()] if containers is None else containers,
    )


def app() -> ContainerSpec:
    return ContainerSpec(name="app", command=["sleep", "3600"])


def kubelet_for(proc: CrihookProcess, containerd: RuntimeLab) -> KubeletClient:
    return KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir)


def create(kubelet: KubeletClient, handle: PodHandle, container: ContainerSpec) -> str:
    """CreateContainer as kubelet sends it, without the start."""
    image = kubelet.images.ImageStatus(
        api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=container.image))
    ).image
    config = kubelet.container_config(handle.spec, container, image_ref=image.id)
    Path(handle.sandbox_config.log_directory, config.log_path).parent.mkdir(
        parents=True, exist_ok=True
    )
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=handle.sandbox_id, config=config, sandbox_config=handle.sandbox_config
    )
    return str(kubelet.runtime.CreateContainer(request, timeout=PATIENCE).container_id)


def start(kubelet: KubeletClient, cid: str) -> None:
    kubelet.runtime.StartContainer(
        api_pb2.StartContainerRequest(container_id=cid), timeout=PATIENCE
    )


def swap_to_etc(tree: Path) -> None:
    os.rename(tree / "race", tree / "race.d")
    os.symlink("/etc", tree / "race")


def swap_back(tree: Path) -> None:
    os.unlink(tree / "race")
    os.rename(tree / "race.d", tree / "race")


def seen(kubelet: KubeletClient, cid: str) -> str:
    """What the container has at /race (its names, sorted)."""
    out = kubelet.exec_sync(cid, ["sh", "-c", "ls -A /race | sort"])
    assert out.exit_code == 0, (out.stdout + out.stderr).decode()
    return out.stdout.decode()


def staged_mounts(proc: CrihookProcess) -> list[str]:
    """Mount points under the crihook's staging directory, as this mount namespace has them."""
    below = f"{proc.staging_dir}/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(below)]


def staged_entries(proc: CrihookProcess) -> list[str]:
    root = proc.staging_dir
    if not root.is_dir():
        return []
    found = [p for pattern in ("*", "*/*", "*/*/*") for p in root.glob(pattern)]
    return sorted(str(p.relative_to(root)) for p in found)  # never into a staged mount


def staging_keys(proc: CrihookProcess) -> list[str]:
    """The staging keys in the devices hook's persisted state."""
    return [k for k in proc.hook_state("devices") or {} if k.startswith("s:")]


# --- the swap -----------------------------------------------------------------------------------


def test_a_path_swapped_between_create_and_start_gives_the_checked_directory(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook()
    with kubelet_for(proc, containerd) as kubelet:
        handle = pod_cleanup.add(kubelet.run_pod(pod_spec("race", tree, containers=[])))
        cid = create(kubelet, handle, app())
        swap_to_etc(tree)
        try:
            start(kubelet, cid)
            assert seen(kubelet, cid) == "marker\n"  # the host's /etc: group, hostname, passwd
            assert kubelet.exec_sync(cid, ["cat", "/race/marker"]).stdout.decode() == MARKER
            # What the runtime mounts is crihook's staging path, never the pod's.
            assert [m for m in staged_mounts(proc) if m.startswith(str(proc.staging_dir))]
        finally:
            swap_back(tree)


def test_no_container_sees_the_target_while_the_path_is_swapped_as_pods_start(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook()
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        while not stop.is_set():
            swap_to_etc(tree)
            stop.wait(0.002)
            swap_back(tree)
            swaps += 1
            stop.wait(0.005)

    thread = threading.Thread(target=swapper, name="swapper")
    started: list[str] = []
    refused: list[str] = []
    with kubelet_for(proc, containerd) as kubelet:
        thread.start()
        try:
            for i in range(RACED_PODS):
                try:
                    handle = pod_cleanup.add(kubelet.run_pod(pod_spec(f"raced-{i}", tree)))
                except PodStartError as exc:
                    if exc.handle is not None:
                        pod_cleanup.add(exc.handle)
                    refused.append(str(exc))  # the check (or the pin) saw the symlink
                    continue
                started.append(handle.container_ids["app"])
        finally:
            stop.set()
            thread.join()
        assert swaps > 0
        assert started, f"every pod was refused: {refused}"
        saw = {cid[:12]: seen(kubelet, cid) for cid in started}
        assert {c: s for c, s in saw.items() if s != "marker\n"} == {}
        # Refused: the check saw the symlink (or no path mid-swap), or the pin saw it changed.
        assert all(f"{tree}/race" in r for r in refused), refused


def test_a_pod_with_a_writable_mount_of_the_tree_cannot_swap_another_pods_mount(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook()
    shared = tree / "shared"  # the attacker's writable mount: allowed by `<tree>/**`
    (shared / "race").mkdir(parents=True)
    (shared / "race" / "marker").write_text(MARKER)
    writable = json.dumps([{"host_path": str(shared), "container_path": "/shared",
                            "readonly": False}])  # fmt: skip
    # The swap, from inside: the symlink's /etc is the host's once runc follows it there.
    # A symlink for ~2 ms in every ~12: most creates find the directory, and run into a swap.
    loop = (
        "cd /shared; while true; do mv race race.d && ln -s /etc race && usleep 2000; "
        "rm race && mv race.d race; usleep 10000; done"
    )
    attacker = PodSpec(
        name="swapper",
        namespace="ml-attacker",
        annotations={"mounts.crihook.io/pod": writable},
        containers=[ContainerSpec(name="app", command=["sh", "-c", loop])],
    )
    started: list[str] = []
    refused: list[str] = []
    with kubelet_for(proc, containerd) as kubelet:
        swapper = pod_cleanup.add(kubelet.run_pod(attacker))
        try:
            for i in range(RACED_PODS):
                try:
                    handle = pod_cleanup.add(kubelet.run_pod(pod_spec(f"victim-{i}", shared)))
                except PodStartError as exc:
                    if exc.handle is not None:
                        pod_cleanup.add(exc.handle)
                    refused.append(str(exc))
                    continue
                started.append(handle.container_ids["app"])
        finally:
            kubelet.remove_pod(swapper)  # the swapping stops
        assert started, f"every pod was refused: {refused}"
        saw = {cid[:12]: seen(kubelet, cid) for cid in started}
        assert {c: s for c, s in saw.items() if s != "marker\n"} == {}
        assert all(f"{shared}/race" in r for r in refused), refused


def test_a_device_node_swapped_after_create_changes_nothing(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    """The runtime reads a device's numbers at CreateContainer (into the OCI spec; runc makes
    the node from them): a swap after it is too late, pinned or not. The pin closes the
    window before it, between crihook's check and the runtime's own look."""
    proc = start_crihook()
    (tree / "dev").mkdir()
    node = tree / "dev" / "dev0"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    os.chmod(node, 0o666)
    asked = json.dumps([{"path": str(node), "container_path": "/dev/asked"}])
    spec = PodSpec(name="device", namespace="ml-test", containers=[],
                   annotations={"devices.crihook.io/pod": asked})  # fmt: skip
    with kubelet_for(proc, containerd) as kubelet:
        handle = pod_cleanup.add(kubelet.run_pod(spec))
        cid = create(kubelet, handle, app())
        os.unlink(node)
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's, swapped in
        start(kubelet, cid)
        out = kubelet.exec_sync(cid, ["stat", "-c", "%t:%T %a", "/dev/asked"])
        assert out.stdout.decode().strip() == "1:3 666"  # the host node's, mode included


# --- staging mounts go with what they were made for ----------------------------------------------


def test_staging_goes_at_remove_container_and_remove_pod_sandbox(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook()
    with kubelet_for(proc, containerd) as kubelet:
        handle = pod_cleanup.add(kubelet.run_pod(pod_spec("removed", tree)))
        cid = handle.container_ids["app"]
        pod = handle.sandbox_id
        assert staged_mounts(proc) == [f"{proc.staging_dir}/{pod}/app.0/m0"]
        assert seen(kubelet, cid) == "marker\n"
        kubelet.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=cid, timeout=0))
        kubelet.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=cid))
        assert staged_mounts(proc) == []
        assert staged_entries(proc) == [pod]  # the pod's directory, emptied
        kubelet.remove_pod(handle)
        assert staged_entries(proc) == []
        wait_for(lambda: staging_keys(proc) == [], PATIENCE, "the staging keys forgotten")


def test_staging_of_a_container_gone_while_crihook_was_away_goes_at_start(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook()
    with kubelet_for(proc, containerd) as kubelet:
        kept = pod_cleanup.add(kubelet.run_pod(pod_spec("kept", tree)))
        gone = pod_cleanup.add(kubelet.run_pod(pod_spec("gone", tree)))
    assert len(staged_mounts(proc)) == 2
    proc.signal(signal.SIGKILL)
    proc.proc.wait()  # type: ignore[union-attr]
    with KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir) as direct:
        direct.remove_pod(gone)  # behind crihook's back
    again = start_crihook(workdir=proc.workdir)
    wait_for(
        lambda: staged_mounts(again) == [f"{again.staging_dir}/{kept.sandbox_id}/app.0/m0"],
        PATIENCE,
        f"the staging of pod {gone.sandbox_id[:12]} released, {kept.sandbox_id[:12]}'s kept",
    )
    assert staged_entries(again) == [
        kept.sandbox_id, f"{kept.sandbox_id}/app.0", f"{kept.sandbox_id}/app.0/m0"
    ]  # fmt: skip
    with kubelet_for(again, containerd) as kubelet:
        assert seen(kubelet, kept.container_ids["app"]) == "marker\n"
        kubelet.remove_pod(kept)
    assert staged_mounts(again) == [] and staged_entries(again) == []


def test_a_create_the_runtime_fails_leaves_nothing_staged(
    containerd: RuntimeLab, start_crihook: Start, tree: Path, pod_cleanup: PodCleanup
) -> None:
    proc = start_crihook()
    with kubelet_for(proc, containerd) as kubelet:
        handle = pod_cleanup.add(kubelet.run_pod(pod_spec("failing", tree, containers=[])))
        config = kubelet.container_config(handle.spec, app(), image_ref="sha256:" + "0" * 64)
        with pytest.raises(grpc.RpcError) as info:
            kubelet.runtime.CreateContainer(
                api_pb2.CreateContainerRequest(
                    pod_sandbox_id=handle.sandbox_id,
                    config=config,
                    sandbox_config=handle.sandbox_config,
                ),
                timeout=PATIENCE,
            )
        assert info.value.code() != grpc.StatusCode.OK
        assert "hook '" not in (info.value.details() or "")  # the runtime's own, not a hook's
        assert staged_mounts(proc) == []
        assert [e for e in staged_entries(proc) if "/" in e] == []
        wait_for(lambda: staging_keys(proc) == [], PATIENCE, "the staging key forgotten")
