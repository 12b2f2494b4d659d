"""Durability under disk faults and hostile input: crihook never tells kubelet a call failed
after the runtime did it.

A real crihook process (no hooks) keeps its state on a 64 KiB tmpfs in front of the lab's
containerd: the disk fills up, calls go on succeeding, nothing is left half-written, SIGTERM
stops it cleanly, a fresh one starts on the full disk, and once space returns the state on
disk catches up with containerd by itself. Against the recording fake runtime: a request
over the size limit is refused by crihook and never reaches the runtime; answers are not
limited. And `Store.reconcile_pod` against containerd: a pod crihook did not hear of is
found by kubelet's uid label and rebuilt.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.proxy.config import RuntimeSettings
from crihook.proxy.ops.state_cli import STALE_SECONDS
from crihook.proxy.state.store import Store
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fake_runtime import FakeRuntime, Reply
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import KubeletClient
from tests.lab.kubelet_encoding import burstable_pod
from tests.lab.runtime_lab import RuntimeLab
from tests.lab.small_disk import SmallDisk, small_disk

# On containerd 1.6 and 2.x by default (tests/lab/containerd_versions.py).
pytestmark = [pytest.mark.both_containerds, pytest.mark.on_crio]

RUNTIME = "/runtime.v1.RuntimeService/"
MiB = 1024 * 1024


# --- the state directory on a disk that fills up ---------------------------------------------


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir("dur-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def disk(workdir: Path) -> Iterator[SmallDisk]:
    with small_disk(workdir / "state") as mounted:  # CrihookProcess's --state-dir
        yield mounted


def _store_on_disk(state_dir: Path) -> tuple[set[str], set[str]]:
    doc = json.loads((state_dir / "store.json").read_bytes())
    return set(doc["pods"]), set(doc["containers"])


def _in_containerd(client: KubeletClient) -> tuple[set[str], set[str]]:
    pods = {p.id for p in client.list_pods()}
    containers = client.runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=30)
    return pods, {c.id for c in containers.containers}


def _matches(state_dir: Path, direct: KubeletClient) -> bool:
    try:
        return _store_on_disk(state_dir) == _in_containerd(direct)
    except (FileNotFoundError, ValueError):
        return False


def _status(state_dir: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((state_dir / "status.json").read_bytes())
    except (FileNotFoundError, ValueError):
        return {}
    return doc


def _store_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line and "proxy.state.store" in line]


def test_a_full_state_disk_never_fails_a_call_and_the_state_catches_up(
    containerd: RuntimeLab, pod_cleanup: PodCleanup, workdir: Path, disk: SmallDisk
) -> None:
    state = disk.path
    direct = KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir)
    first = CrihookProcess(containerd.endpoint, workdir=workdir).start()
    second: CrihookProcess | None = None
    try:
        with KubeletClient(first.endpoint, log_root=containerd.pod_log_dir) as via:
            before = via.run_pod(burstable_pod("before-full"))
            wait_for(lambda: _matches(state, direct), PATIENCE, "store.json to have the first pod")

            disk.fill()
            during = via.run_pod(burstable_pod("while-full"))  # Run, Create, Start: all OK
            wait_for(
                lambda: _store_errors(first.log()), PATIENCE, f"the failed write\n{first.log()}"
            )
            via.remove_pod(before)  # Stop and Remove too, with the store degraded
            assert {p.id for p in via.list_pods()} >= {during.sandbox_id}
        assert disk.temp_files() == []
        assert before.sandbox_id in _store_on_disk(state)[0]  # the disk is behind: full

        # SIGTERM during the fault: a clean stop, the unwritten state named in the log.
        assert first.stop() == 0
        log = first.log()
        errors = [e for e in _store_errors(log) if "crihook stops with state" not in e]
        assert len(errors) == 1, errors  # logged once on entering, not on every retry
        assert "No space left on device" in errors[0]
        assert "crihook stops with state not written" in log
        assert "Traceback" not in log
        assert log.rstrip().splitlines()[-1].endswith("stopped")
        assert disk.temp_files() == []

        # A fresh crihook on the still-full disk becomes ready and serves.
        second = CrihookProcess(containerd.endpoint, workdir=workdir).start()
        with KubeletClient(second.endpoint, log_root=containerd.pod_log_dir) as via:
            via.stop_pod(during)
        assert "serving with the state not written" in second.log()

        disk.free()
        wait_for(lambda: _matches(state, direct), PATIENCE, "store.json to match containerd again")
        wait_for(
            lambda: (
                (_status(state).get("store") or {}).get("write_failures", 0) > 0
                and _status(state)["store"]["degraded"] is None
            ),
            PATIENCE,
            "status.json to show the store recovered",
        )
        assert disk.temp_files() == []
        shown = subprocess.run(
            [sys.executable, "-m", "crihook", "state", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert "  store ok again after " in shown
        assert "No space left on device" in shown

        assert second.stop() == 0
        assert "Traceback" not in second.log()
        assert "state written to " in second.log()  # the recovery, logged once
    finally:
        first.kill()
        if second is not None:
            second.kill()
        direct.close()


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    try:
        yield runtime
    finally:
        runtime.stop()
        shutil.rmtree(runtime.socket_path.parent, ignore_errors=True)


def _state(proc: CrihookProcess) -> dict[str, Any]:
    shown = subprocess.run(
        [sys.executable, "-m", "crihook", "state", "--state-dir", str(proc.state_dir), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    doc: dict[str, Any] = json.loads(shown.stdout)
    return doc


def test_crihook_state_says_running_while_a_full_disk_keeps_its_status_unwritten(
    fake: FakeRuntime, workdir: Path, disk: SmallDisk
) -> None:
    """status.json is rewritten every second; on a full disk it is not, and goes stale. Yet
    crihook runs, and `crihook state` says so (from the lock it holds), with its pid."""
    proc = CrihookProcess(fake.endpoint, workdir=workdir).start()
    try:
        assert proc.proc is not None
        wait_for(lambda: _status(disk.path), 60, "the first status.json")
        disk.fill()
        wait_for(
            lambda: f"cannot write {disk.path / 'status.json'}: [Errno 28]" in proc.log(),
            60,
            "the status write to fail",
        )
        written = _status(disk.path)["updated_at"]
        stale = STALE_SECONDS + 1
        wait_for(lambda: time.time() - written > stale, stale + 60, "the status to go stale")
        doc = _state(proc)
        assert (doc["running"], doc["process"]) == (True, {"pid": proc.proc.pid})
        assert proc.stop() == 0
        assert (_state(proc)["running"], _state(proc)["process"]) == (False, {"pid": None})
    finally:
        proc.kill()


# --- limits on kubelet's socket ---------------------------------------------------------------


def _length_delimited(number: int, size: int) -> bytes:
    """A field the CRI schema does not have (`number` < 16), padding a request to `size`
    bytes."""
    header = bytes([(number << 3) | 2])
    length = size - len(header) - 5
    varint = bytes([(length >> (7 * i) & 0x7F) | (0x80 if i < 4 else 0) for i in range(5)])
    return header + varint + b"x" * length


def _call(endpoint: str, method: str, request: bytes) -> bytes:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(endpoint, options=options) as channel:
        return channel.unary_unary(method)(request, timeout=30)  # type: ignore[no-any-return]


def _received(fake: FakeRuntime) -> list[tuple[str, int]]:
    return [(r.method.rsplit("/", 1)[-1], len(r.request)) for r in fake.received]


@pytest.mark.parametrize(
    "method",
    ["FutureMethod", "ListContainers", "CreateContainer"],
    ids=["unknown-method", "pass-through", "intercepted"],
)
def test_a_request_over_the_default_limit_is_refused_and_not_forwarded(
    fake: FakeRuntime, workdir: Path, method: str
) -> None:
    with CrihookProcess(fake.endpoint, workdir=workdir) as proc:
        seen = len(fake.received)  # crihook's own start-up calls
        with pytest.raises(grpc.RpcError) as info:
            _call(proc.endpoint, RUNTIME + method, _length_delimited(15, 25 * MiB))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (info.value.details() or "")
        # crihook goes on serving, and nothing of the big request reached the runtime (for
        # an unknown method the catch-all opened a call, which ended without a message: the
        # runtime's handler never ran).
        _call(proc.endpoint, RUNTIME + "Version", b"")
        assert _received(fake)[seen:] == [("Version", 0)]
        assert proc.proc is not None and proc.proc.poll() is None


def test_the_limit_is_configurable_and_answers_are_not_limited(
    fake: FakeRuntime, workdir: Path
) -> None:
    limit = 2 * MiB
    answer = api_pb2.ListContainersResponse(
        containers=[api_pb2.Container(id="c" * 64, labels={"pad": "x" * (3 * MiB)})]
    ).SerializeToString()
    fake.script["ListContainers"] = Reply(response=answer)
    args = ["--max-message-bytes", str(limit)]
    with CrihookProcess(fake.endpoint, workdir=workdir, args=args) as proc:
        seen = len(fake.received)
        fits = _length_delimited(15, limit)
        assert _call(proc.endpoint, RUNTIME + "ListContainers", fits) == answer  # 3 MiB back
        with pytest.raises(grpc.RpcError) as info:
            _call(proc.endpoint, RUNTIME + "ListContainers", _length_delimited(15, limit + 1))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _received(fake)[seen:] == [("ListContainers", limit)]
        assert fake.calls("ListContainers")[-1].request == fits


# --- malformed requests ------------------------------------------------------------------------

SANDBOX = api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(name="p", uid="u1"))


@pytest.mark.parametrize(
    ("method", "request_", "details"),
    [
        (
            "RunPodSandbox",
            b"\x0d\x01\x02\x03\x04" + b"\x12\x04runc",  # config (field 1) as fixed32
            "crihook: RunPodSandboxRequest field 1 (config) has wire type 5, expected 2 "
            "(length-delimited)",
        ),
        (
            # containerd 1.6 dereferences the missing sandbox metadata and crashes
            "CreateContainer",
            api_pb2.CreateContainerRequest(
                pod_sandbox_id="p1",
                config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app")),
            ).SerializeToString(),
            "crihook: CreateContainerRequest has no sandbox_config",
        ),
        (
            "StopPodSandbox",
            api_pb2.StopPodSandboxRequest().SerializeToString(),
            "crihook: StopPodSandboxRequest pod_sandbox_id is empty",
        ),
    ],
    ids=["wrong-wire-type", "no-sandbox-config", "no-id"],
)
def test_a_malformed_intercepted_request_is_refused_and_not_forwarded(
    fake: FakeRuntime, workdir: Path, method: str, request_: bytes, details: str
) -> None:
    with CrihookProcess(fake.endpoint, workdir=workdir) as proc:
        seen = len(fake.received)
        with pytest.raises(grpc.RpcError) as info:
            _call(proc.endpoint, RUNTIME + method, request_)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            details,
        )
        assert _received(fake)[seen:] == []
        assert proc.stop() == 0
        stored = proc.state_dir / "store.json"  # written only if something was recorded
        assert not stored.exists() or json.loads(stored.read_bytes())["pods"] == {}


def _create(resources: api_pb2.LinuxContainerResources, guaranteed: bool = False) -> bytes:
    parent = "/kubepods/podu1" if guaranteed else "/kubepods/burstable/podu1"
    sandbox = api_pb2.PodSandboxConfig(
        metadata=SANDBOX.metadata, linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent=parent)
    )
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="app"),
        linux=api_pb2.LinuxContainerConfig(resources=resources),
    )
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id="p1", config=config, sandbox_config=sandbox
    )
    return request.SerializeToString()


R = api_pb2.LinuxContainerResources
GIB = 1 << 30


@pytest.mark.parametrize(
    ("method", "request_", "details"),
    [
        ("CreateContainer", _create(R(cpu_period=-100_000, cpu_quota=50_000)),
         "config.linux.resources.cpu_period = -100000: the kernel takes a CFS period of 1000 "
         "to 1000000 µs (1 ms to 1 s); 0 leaves it unset"),
        ("CreateContainer", _create(R(oom_score_adj=1 << 40)),
         "config.linux.resources.oom_score_adj = 1099511627776: the kernel takes -1000 to 1000"),
        ("CreateContainer", _create(R(cpu_shares=256, memory_limit_in_bytes=-GIB)),
         "config.linux.resources.memory_limit_in_bytes = -1073741824: a memory limit is a "
         "number of bytes, or -1 for no limit; 0 leaves it unset"),
        # Through cpuset, numa and oom, which crashed (INTERNAL) on it: none of them sees it.
        ("CreateContainer", _create(R(cpu_shares=1024, cpu_quota=100_000, cpu_period=100_000,
                                      memory_limit_in_bytes=-GIB), guaranteed=True),
         "config.linux.resources.memory_limit_in_bytes = -1073741824"),
        ("UpdateContainerResources", api_pb2.UpdateContainerResourcesRequest(
            container_id="c1", linux=R(cpu_quota=500)).SerializeToString(),
         "linux.cpu_quota = 500: the kernel takes a CFS quota of 1000 to 17592186044415 µs"),
        ("UpdatePodSandboxResources", api_pb2.UpdatePodSandboxResourcesRequest(
            pod_sandbox_id="p1", resources=R(cpuset_cpus="0-3,")).SerializeToString(),
         "resources.cpuset_cpus = '0-3,': malformed cpu list"),
    ],
    ids=["cpu-period", "oom-score-adj", "memory-limit", "memory-limit-through-the-hooks",
         "update-container-quota", "update-pod-cpuset"],
)  # fmt: skip
def test_values_the_kernel_refuses_are_refused_at_the_door_and_not_forwarded(
    fake: FakeRuntime, workdir: Path, method: str, request_: bytes, details: str
) -> None:
    """Issue 28: each of these was forwarded, and failed at StartContainer without naming
    the problem (or crashed the numa hook). Now INVALID_ARGUMENT naming the field and the
    value, before any hook or the runtime."""
    with CrihookProcess(fake.endpoint, workdir=workdir, hooks="cpuset,numa,oom") as proc:
        seen = len(fake.received)
        with pytest.raises(grpc.RpcError) as info:
            _call(proc.endpoint, RUNTIME + method, request_)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details in (info.value.details() or "")
        assert (info.value.details() or "").startswith("crihook: ")
        assert _received(fake)[seen:] == []
        assert "Traceback" not in proc.log()
        assert proc.stop() == 0


# --- reconcile_pod against containerd ----------------------------------------------------------


async def test_reconcile_pod_finds_a_pod_crihook_did_not_hear_of(
    containerd: RuntimeLab, kubelet_direct: KubeletClient, tmp_path: Path
) -> None:
    handle = kubelet_direct.run_pod(burstable_pod("unheard-of"))
    other = kubelet_direct.run_pod(burstable_pod("someone-else"))
    store = Store(tmp_path)
    store.load()
    runtime = RuntimeClient(RuntimeSettings(endpoint=containerd.endpoint))
    try:
        pods, containers = await store.reconcile_pod(runtime, handle.spec.uid)
        assert [p.view.id for p in pods] == [handle.sandbox_id]
        assert [c.view.id for c in containers] == [handle.container_ids["app"]]
        view = pods[0].view
        assert (view.uid, view.name, view.namespace) == (
            handle.spec.uid,
            "unheard-of",
            "default",
        )
        assert view.cgroup_parent == handle.cgroup_parent  # from containerd's verbose status
        assert containers[0].view.pod_id == handle.sandbox_id
        assert containers[0].view.name == "app"
        assert other.sandbox_id not in store.pods
        assert await store.reconcile_pod(runtime, handle.spec.uid) == ([], [])
    finally:
        await store.close()
        await runtime.close()


def test_the_status_writer_survives_its_errors_and_sigterm_exits_0(
    fake: FakeRuntime, workdir: Path
) -> None:
    """status.json cannot be written (a directory stands in its place): logged once, retried
    every second until it can be, and the stop is clean."""
    status = workdir / "state" / "status.json"
    status.mkdir(parents=True)
    proc = CrihookProcess(fake.endpoint, workdir=workdir).start()
    try:
        wait_for(lambda: "status.json" in proc.log(), PATIENCE, "the status write to fail")
        status.rmdir()
        wait_for(status.is_file, PATIENCE, "the status writer to write it after all")
        assert json.loads(status.read_bytes())["ready"] is True
        assert proc.stop() == 0
        log = proc.log()
        assert "Traceback" not in log
        assert log.count("cannot write") == 1, log
        assert "status.json written again (" in log
        assert log.rstrip().splitlines()[-1].endswith("stopped")
    finally:
        proc.kill()
