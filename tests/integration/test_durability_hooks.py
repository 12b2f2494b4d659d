"""Durability with a hook that keeps state, against the lab's real containerd (issue 16).

A real crihook runs the built-in `cpuset` hook with CPU 0 reserved, so on this 2-CPU node a
Guaranteed 1-CPU container reserves CPU 1 in its pre stage: a call whose reservation must be
on disk before containerd acts on it. The state directory is a 64 KiB tmpfs that fails in
two ways (full, read-only), each in two phases:

- during the fault, the Guaranteed CreateContainer is refused before containerd acts
  (RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE for a read-only one, the state directory
  named) while calls that write no state ahead go through; SIGTERM exits 0, and a new crihook
  starts on the faulty directory and serves;
- once the disk is back, the same crihook (no restart) creates the Guaranteed container on
  CPU 1, `crihook state --json` catches up with containerd, nothing of the refused attempt
  stays reserved, and SIGTERM exits 0.

Two calls at once during a full disk, one held in its pre stage by `Gate` (a hook of this
module that waits as a plugin call would): whether a call is refused depends on its own
hook state changes, not on those of the other call.

And the store gap: containerd killed while it carries out a RunPodSandbox keeps the sandbox
(NOTREADY) though the call failed; crihook learns of it within a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Hook, HookContext
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, qos_class
from tests.lab.kubelet_encoding import burstable_pod
from tests.lab.runtime_lab import RuntimeLab
from tests.lab.small_disk import SmallDisk, small_disk

# On containerd 1.6 and 2.x by default (tests/lab/containerd_versions.py).
pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

MiB = 1024 * 1024
CPUSET = '[hooks.cpuset]\nreserved_cpus = "0"\n'
"""CPU 0 reserved: the one CPU a Guaranteed 1-CPU container can get here is CPU 1."""


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir("durh-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def disk(workdir: Path) -> Iterator[SmallDisk]:
    with small_disk(workdir / "state") as mounted:  # CrihookProcess's --state-dir
        yield mounted


def _crihook(
    containerd: RuntimeLab, workdir: Path, hooks: str = "cpuset", config: str = CPUSET
) -> CrihookProcess:
    return CrihookProcess(containerd.endpoint, workdir=workdir, config=config, hooks=hooks)


# --- the two faults ----------------------------------------------------------------------------


def _remount(disk: SmallDisk, mode: str) -> None:
    """remount fails with EBUSY while a file on the mount is open for writing (crihook
    rewrites status.json every second): try again."""
    deadline = time.monotonic() + 10
    while True:
        try:
            disk.remount(mode)
            return
        except subprocess.CalledProcessError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass(frozen=True)
class Fault:
    code: grpc.StatusCode
    """What a call that must write ahead gets during the fault."""
    reason: str
    """The OS error's text, which crihook's message carries."""
    apply: Callable[[SmallDisk], None]
    clear: Callable[[SmallDisk], None]


FAULTS = [
    Fault(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "No space left on device",
        SmallDisk.fill,
        SmallDisk.free,
    ),
    Fault(
        grpc.StatusCode.UNAVAILABLE,
        "Read-only file system",
        lambda disk: _remount(disk, "ro"),
        lambda disk: _remount(disk, "rw"),
    ),
]


# --- what containerd and crihook have ----------------------------------------------------------


def guaranteed_pod(name: str) -> PodSpec:
    """One container with 1 CPU and 64 MiB, requests equal to limits: Guaranteed, and the
    cpuset hook gives it one exclusive CPU."""
    app = ContainerSpec(
        name="app", cpu_request=1000, cpu_limit=1000, memory_request=64 * MiB, memory_limit=64 * MiB
    )
    return PodSpec(name=name, containers=[app])


def _run_sandbox(client: KubeletClient, spec: PodSpec) -> PodHandle:
    """RunPodSandbox only, as kubelet sends it."""
    config = client.sandbox_config(spec)
    if client.log_root is not None:
        Path(config.log_directory).mkdir(parents=True, exist_ok=True)
    request = api_pb2.RunPodSandboxRequest(config=config, runtime_handler=spec.runtime_handler)
    answer = client.runtime.RunPodSandbox(request, timeout=30)
    return PodHandle(
        spec=spec,
        sandbox_id=answer.pod_sandbox_id,
        sandbox_config=config,
        qos=qos_class(spec),
        cgroup_parent=config.linux.cgroup_parent,
    )


def _create_and_start(client: KubeletClient, handle: PodHandle, container: ContainerSpec) -> str:
    """kubelet's CreateContainer (with the image id from ImageStatus), then StartContainer."""
    image = client.images.ImageStatus(
        api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=container.image)), timeout=30
    ).image
    config = client.container_config(handle.spec, container, image_ref=image.id)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=handle.sandbox_id, config=config, sandbox_config=handle.sandbox_config
    )
    cid: str = client.runtime.CreateContainer(request, timeout=30).container_id
    client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=30)
    handle.container_ids[container.name] = cid
    return cid


def _in_containerd(direct: KubeletClient) -> tuple[set[str], set[str]]:
    containers = direct.runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=30)
    return {p.id for p in direct.list_pods()}, {c.id for c in containers.containers}


def _containers(direct: KubeletClient) -> set[str]:
    return _in_containerd(direct)[1]


def _cpus(direct: KubeletClient, container_id: str) -> str:
    """The cpuset containerd gave the container (its OCI spec)."""
    info = direct.container_status(container_id, verbose=True).info["info"]
    spec = json.loads(info)["runtimeSpec"]
    return str(spec["linux"]["resources"]["cpu"]["cpus"])


def _state(state_dir: Path) -> dict[str, Any]:
    """`crihook state --json`, as an operator runs it."""
    shown = subprocess.run(
        [sys.executable, "-m", "crihook", "state", "--state-dir", str(state_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    doc: dict[str, Any] = json.loads(shown)
    return doc


def _matches(state_dir: Path, direct: KubeletClient) -> bool:
    doc = _state(state_dir)
    return (set(doc["pods"]), set(doc["containers"])) == _in_containerd(direct)


def _reservations(doc: dict[str, Any]) -> list[str]:
    return [k for k in (doc["hook_states"].get("cpuset") or {}) if k.startswith("r:")]


def _clean_stop(proc: CrihookProcess, since: int = 0) -> str:
    """SIGTERM: exit code 0, no traceback, "stopped" last. Returns this process' log."""
    assert proc.stop() == 0, proc.log()[since:]
    log = proc.log()[since:]
    assert "Traceback" not in log, log
    assert log.rstrip().splitlines()[-1].endswith("stopped"), log
    return log


# --- a full or read-only state disk with a hook that keeps state -------------------------------


@pytest.mark.parametrize("fault", FAULTS, ids=["full", "read-only"])
def test_a_call_whose_hook_keeps_state_fails_before_the_runtime_acts_and_recovers(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, workdir: Path, disk: SmallDisk, fault: Fault
) -> None:
    state = disk.path
    app = guaranteed_pod("pinned").containers[0]
    direct = KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir)
    first = _crihook(containerd, workdir).start()
    second: CrihookProcess | None = None
    try:
        # --- phase 1: the state directory refuses every write ---------------------------------
        fault.apply(disk)
        with KubeletClient(first.endpoint, log_root=containerd.pod_log_dir) as via:
            pinned = pod_cleanup.add(_run_sandbox(via, guaranteed_pod("pinned")))  # no state
            before = _containers(direct)
            with pytest.raises(grpc.RpcError) as refused:
                _create_and_start(via, pinned, app)
            assert refused.value.code() == fault.code, refused.value.details()
            details = refused.value.details() or ""
            assert f"cannot write its state to {state} ({fault.reason})" in details, details
            assert "the call was not forwarded" in details, details
            assert _containers(direct) == before  # containerd never saw it

            # Calls that write nothing ahead go through: RunPodSandbox, a shared-pool
            # CreateContainer (the cpuset hook records it after containerd acted), Start.
            shared = pod_cleanup.add(via.run_pod(burstable_pod("shared")))
            assert _containers(direct) == before | {shared.container_ids["app"]}
        assert disk.temp_files() == []
        _clean_stop(first)

        # A new crihook on the faulty directory becomes ready, serves, and refuses as well.
        since = len(first.log())  # both processes log to the same file
        second = _crihook(containerd, workdir).start()
        with KubeletClient(second.endpoint, log_root=containerd.pod_log_dir) as via:
            with pytest.raises(grpc.RpcError) as refused:
                _create_and_start(via, pinned, app)
            assert refused.value.code() == fault.code, refused.value.details()
            assert _containers(direct) == before | {shared.container_ids["app"]}
            assert "serving with the state not written" in second.log()[since:]

            # --- phase 2: the disk is back; the same crihook, no restart ----------------------
            fault.clear(disk)
            cid = _create_and_start(via, pinned, app)
            assert _cpus(direct, cid) == "1"

        wait_for(lambda: _matches(state, direct), PATIENCE, "`crihook state` to match containerd")
        wait_for(
            lambda: (_state(state)["status"] or {}).get("store", {}).get("degraded", "?") is None,
            PATIENCE,
            "status.json to show the store recovered",
        )
        doc = _state(state)
        assert _reservations(doc) == []  # nothing held for the refused attempts
        cpuset = doc["hook_states"]["cpuset"]
        assert cpuset[f"c:{cid}"]["cpus"] == "1"
        held = {k: v["cpus"] for k, v in cpuset.items() if k.startswith("c:") and v["cpus"]}
        assert held == {f"c:{cid}": "1"}
        assert doc["status"]["store"]["write_failures"] > 0
        assert disk.temp_files() == []

        log = _clean_stop(second, since)
        assert "state written to " in log  # the recovery, logged
    finally:
        first.kill()
        if second is not None:
            second.kill()
        direct.close()


# --- two calls at once: each is judged by its own hook state ----------------------------------

GATE = "test.crihook.io/gate"
"""Pod annotation: the file `Gate` waits for."""


class Gate(Hook):
    """A hook the tests below load into crihook (`GATED`). In CreateContainer's pre stage for
    a pod annotated `GATE`: touches `<file>.entered`, then waits, suspended as a plugin call
    is, until `<file>` exists. Keeps no state."""

    async def pre_create_container(self, ctx: HookContext) -> None:
        gate = ctx.pod.annotations.get(GATE)
        if gate:
            Path(f"{gate}.entered").touch()
            while not Path(gate).exists():
                await asyncio.sleep(0.01)


GATED = """
[hooks.gate]
module = "tests.integration.test_durability_hooks:Gate"
timeout_ms = 20000
"""
SEEN = """
[hooks.seen]
module = "tests.lab.sample_hooks:SetState"
"""


class _Held(threading.Thread):
    """kubelet's CreateContainer + StartContainer for a gated pod, in the background: its
    pre stage waits at the gate until `release()`."""

    def __init__(self, client: KubeletClient, handle: PodHandle, gate: Path) -> None:
        super().__init__(name="held-create", daemon=True)
        self.client, self.handle, self.gate = client, handle, gate
        self.container = handle.spec.containers[0]
        self.error: grpc.RpcError | None = None
        self.container_id: str | None = None

    def run(self) -> None:
        try:
            self.container_id = _create_and_start(self.client, self.handle, self.container)
        except grpc.RpcError as exc:
            self.error = exc

    def wait_entered(self) -> None:
        entered = Path(f"{self.gate}.entered")
        wait_for(entered.exists, PATIENCE, "the held call to reach the gate")

    def release(self) -> None:
        self.gate.touch()
        self.join(30)
        assert not self.is_alive(), "the held call did not finish"


def _gated(spec: PodSpec, gate: Path) -> PodSpec:
    spec.annotations[GATE] = str(gate)
    return spec


def test_a_call_that_writes_nothing_ahead_is_not_refused_for_another_calls_change(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, workdir: Path, disk: SmallDisk
) -> None:
    """A shared-pool container is created while a Guaranteed one is refused (the disk is
    full) and the cpuset hook releases that one's reservation: the shared one changed no
    hook state, so it must go through, as it does when the two do not overlap."""
    proc = _crihook(containerd, workdir, "cpuset,90-gate", CPUSET + GATED).start()
    direct = KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir)
    try:
        with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as via:
            disk.fill()
            gate = workdir / "gate"
            shared = pod_cleanup.add(_run_sandbox(via, _gated(burstable_pod("shared"), gate)))
            pinned = pod_cleanup.add(_run_sandbox(via, guaranteed_pod("pinned")))
            held = _Held(via, shared, gate)
            held.start()
            try:
                held.wait_entered()
                with pytest.raises(grpc.RpcError) as refused:
                    _create_and_start(via, pinned, pinned.spec.containers[0])
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            finally:
                held.release()
            assert held.error is None, held.error.details()
            assert held.container_id in _containers(direct)
        _clean_stop(proc)
    finally:
        proc.kill()
        direct.close()


def test_a_call_whose_change_another_call_was_told_about_is_still_refused(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, workdir: Path, disk: SmallDisk
) -> None:
    """`SetState` records every container in its pre stage (and has no failed stage). Call B
    records its container, then waits at the gate; call A records its own and writes ahead:
    the write (with both changes) fails, A is refused. B's change is not on disk either, so
    B must be refused too, before containerd acts."""
    proc = _crihook(containerd, workdir, "10-seen,90-gate", SEEN + GATED).start()
    direct = KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir)
    try:
        with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as via:
            disk.fill()
            gate = workdir / "gate"
            b = pod_cleanup.add(_run_sandbox(via, _gated(burstable_pod("b"), gate)))
            a = pod_cleanup.add(_run_sandbox(via, burstable_pod("a")))
            before = _containers(direct)
            held = _Held(via, b, gate)
            held.start()
            try:
                held.wait_entered()
                with pytest.raises(grpc.RpcError) as refused:
                    _create_and_start(via, a, a.spec.containers[0])
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            finally:
                held.release()
            assert held.error is not None, "B was forwarded with its hook state not on disk"
            assert held.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _containers(direct) == before
        _clean_stop(proc)
    finally:
        proc.kill()
        direct.close()


# --- containerd killed during RunPodSandbox ------------------------------------------------------


class _KillOnNewSandbox(threading.Thread):
    """SIGKILLs containerd as soon as a new sandbox root directory appears in its CRI root.

    containerd 1.6 creates that directory right after it committed the sandbox container to
    its metadata (`NewContainer`), and before it starts the sandbox task (shim, runc, then
    the answer): killed there, it keeps a sandbox it never answered for, as after a crash.
    containerd 2.x keeps its CRI root at the same path and does the same."""

    def __init__(self, containerd: RuntimeLab) -> None:
        super().__init__(name="kill-on-new-sandbox", daemon=True)
        self.pid = containerd.pid
        self.root = containerd.dir / "root" / "io.containerd.grpc.v1.cri" / "sandboxes"
        if containerd.is_crio:
            # CRI-O's sandbox (infra) container in containers/storage, made before its
            # network and namespaces are set up.
            self.root = containerd.dir / "storage" / "overlay-containers"
        self.known = self._listing()
        self.done = threading.Event()
        self.killed: str | None = None
        """The id of the sandbox whose creation was cut off."""

    def _listing(self) -> set[str]:
        try:
            return {n for n in os.listdir(self.root) if re.fullmatch("[0-9a-f]{64}", n)}
        except FileNotFoundError:
            return set()

    def run(self) -> None:
        assert self.pid is not None
        while not self.done.is_set():
            new = self._listing() - self.known
            if new:
                os.kill(self.pid, signal.SIGKILL)
                self.killed = new.pop()
                return
            time.sleep(0.0002)


def test_a_sandbox_containerd_kept_after_a_kill_mid_run_pod_sandbox_reaches_the_store(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, workdir: Path
) -> None:
    """How the kill is timed: a thread watches containerd's CRI root for the new sandbox's
    directory, which containerd creates right after committing the sandbox container and
    before it starts its task (tens of ms, the bulk of a RunPodSandbox here), and SIGKILLs
    containerd the moment it appears. That leaves what a crash mid-call leaves, every time:
    the client's call fails (crihook reports UNAVAILABLE, an unknown outcome), and the
    restarted containerd lists the sandbox as NOTREADY. Should the call win the race after
    all, the attempt is repeated with a new pod (at most 3)."""
    proc = _crihook(containerd, workdir).start()
    direct = KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir)
    try:
        with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as via:
            for attempt in range(3):
                spec = burstable_pod(f"cut-off-{attempt}")
                killer = _KillOnNewSandbox(containerd)
                killer.start()
                try:
                    _run_sandbox(via, spec)
                    failure = None
                except grpc.RpcError as exc:
                    failure = exc
                finally:
                    killer.done.set()
                    killer.join(PATIENCE)
                if killer.killed is None and failure is not None:
                    raise failure  # failed with containerd alive: not what this test is about
                if killer.killed is not None:
                    containerd.kill()  # waits for the killed process to be gone
                containerd.ensure_running()  # on the same root: it recovers what it kept
                if failure is not None:
                    break
            else:
                pytest.fail("RunPodSandbox answered before containerd could be killed, 3 times")
        assert failure is not None
        assert failure.code() == grpc.StatusCode.UNAVAILABLE, failure.details()

        kept = [p for p in direct.list_pods() if p.metadata.uid == spec.uid]
        if containerd.is_crio:
            # CRI-O keeps nothing of a RunPodSandbox it was killed in: at start it removes
            # the sandbox container it had put in storage. crihook's store has no such pod,
            # and the node goes on (the next pod runs through crihook).
            assert kept == []
            with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as after:
                handle = after.run_pod(burstable_pod("after-the-cut"))
            wait_for(
                lambda: handle.sandbox_id in _state(proc.state_dir)["pods"],
                15,
                "crihook's store to hold the next pod",
            )
            pods = _state(proc.state_dir)["pods"]
            assert killer.killed not in pods and handle.sandbox_id in pods
            assert spec.uid not in {p["view"]["uid"] for p in pods.values()}
            _clean_stop(proc)
            return
        assert [(p.id, p.state) for p in kept] == [(killer.killed, api_pb2.SANDBOX_NOTREADY)]
        wait_for(
            lambda: killer.killed in _state(proc.state_dir)["pods"],
            PATIENCE,
            "crihook's store to learn of the sandbox containerd kept",
        )
        view = _state(proc.state_dir)["pods"][killer.killed]["view"]
        assert (view["uid"], view["name"], view["namespace"]) == (spec.uid, spec.name, "default")
        assert "the runtime kept 1 sandbox(es) and 0 container(s)" in proc.log()
        _clean_stop(proc)
    finally:
        proc.kill()
        direct.close()
        containerd.ensure_running()
