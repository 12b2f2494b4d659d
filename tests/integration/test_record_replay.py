"""Record and replay through a real crihook process (`crihook serve --record`, `crihook
replay`), in front of the stateful fake runtime on a 48-CPU sysfs fixture: the CPUs this
2-CPU machine does not have are only in the recording's node facts, so the replay needs no
`--sysfs-root` (the fixture tree is gone by then). A plugin process is replayed from its
recorded answers, once it is gone.

The real containerd's recordings are the corpus in tests/replay/.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.hooks.node import Topology, parse_cpu_list, read_topology
from crihook.proxy.record.recorder import RESUME_SECONDS
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.plugin_proc import KEY, Plugin
from tests.lab.small_disk import small_disk
from tests.lab.sysfs import GIB, MachineSpec, write_sysfs

CPUS_48 = MachineSpec(sockets=2, cores_per_socket=12, threads_per_core=2, memory_per_numa=96 * GIB)
NODE_MEMORY = 192 * GIB
CONFIG = """
[node]
topology_policy = "best-effort"

[hooks]
order = ["cpuset", "numa", "oom"]

[hooks.oom]
qos_scores = { BestEffort = 900 }
"""
SECRET_ENV = "s3cr3t-env-value"
SECRET_ANNOTATION = "hunter2-password"


@dataclass
class Recorded:
    path: Path
    workdir: Path
    topology: Topology
    pinned: dict[str, frozenset[int]]
    """Pod name → the exclusive CPUs its container got."""


class Kubelet:
    """Just enough of kubelet for the fake runtime: sandboxes, containers, resizes."""

    def __init__(self, stub: api_pb2_grpc.RuntimeServiceStub) -> None:
        self.stub = stub

    def pod(self, spec: PodSpec) -> tuple[str, list[str]]:
        sandbox = self.sandbox(spec)
        ids = []
        for container in spec.containers:
            cid = self.create(spec, sandbox, container)
            self.stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)
            ids.append(cid)
        return sandbox, ids

    def sandbox(self, spec: PodSpec) -> str:
        request = api_pb2.RunPodSandboxRequest(config=sandbox_config(spec))
        return str(self.stub.RunPodSandbox(request, timeout=60).pod_sandbox_id)

    def create(self, spec: PodSpec, sandbox: str, container: ContainerSpec) -> str:
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            config=container_config(spec, container, node_memory=NODE_MEMORY),
            sandbox_config=sandbox_config(spec),
        )
        return str(self.stub.CreateContainer(request, timeout=60).container_id)

    def remove(self, sandbox: str, containers: list[str]) -> None:
        for cid in containers:
            self.stub.StopContainer(api_pb2.StopContainerRequest(container_id=cid), timeout=60)
            self.stub.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=cid), timeout=60)
        self.stub.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
        self.stub.RemovePodSandbox(
            api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60
        )


def guaranteed(name: str, cpus: int, **kw: Any) -> PodSpec:
    app = ContainerSpec("app", cpu_request=cpus * 1000, cpu_limit=cpus * 1000, **kw)
    app.memory_request = app.memory_limit = GIB
    return PodSpec(name=name, uid=f"00000000-0000-4000-8000-{name:0>12}", containers=[app])


def record(workdir: Path, extra_args: list[str]) -> Recorded:
    """The workload, recorded; crihook is restarted half-way (a second part of the file)."""
    root = write_sysfs(workdir / "sys", CPUS_48)
    topology = read_topology(root)
    path = workdir / "rec.jsonl"
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    args = ["--sysfs-root", str(root), "--record", str(path), *extra_args]
    pinned: dict[str, frozenset[int]] = {}
    proc = CrihookProcess(runtime.endpoint, workdir=workdir, config=CONFIG, hooks=None, args=args)
    try:
        proc.start()
        with grpc.insecure_channel(proc.endpoint) as channel:
            kubelet = Kubelet(api_pb2_grpc.RuntimeServiceStub(channel))
            burstable = PodSpec(
                name="burstable",
                containers=[ContainerSpec("web", cpu_request=500, memory_request=GIB)],
            )
            _, (web,) = kubelet.pod(burstable)
            kubelet.pod(PodSpec(name="besteffort", containers=[ContainerSpec("batch")]))
            g1, g1_containers = kubelet.pod(guaranteed("g1", 4))
            secret = guaranteed("g2", 2, env=[("TOKEN", SECRET_ENV)])
            secret.annotations["example.com/db-password"] = SECRET_ANNOTATION
            kubelet.pod(secret)
            # The runtime refuses a container: its reservation is released (failed stage).
            broken = guaranteed("broken", 8)
            broken_sandbox = kubelet.sandbox(broken)
            runtime.fail_next("CreateContainer", grpc.StatusCode.INTERNAL, "disk on fire")
            with pytest.raises(grpc.RpcError):
                kubelet.create(broken, broken_sandbox, broken.containers[0])
            kubelet.remove(broken_sandbox, [])
            for name, cid in (("g1", g1_containers[0]),):
                pinned[name] = parse_cpu_list(runtime.cpuset_of(cid))
            # kubelet resizes the burstable container (its shares and limit).
            resize = api_pb2.LinuxContainerResources(cpu_shares=1024, memory_limit_in_bytes=GIB)
            kubelet.stub.UpdateContainerResources(
                api_pb2.UpdateContainerResourcesRequest(container_id=web, linux=resize), timeout=60
            )
        assert proc.stop() == 0
        # A restart: the new crihook appends its own part, after its synchronize.
        proc.start()
        with grpc.insecure_channel(proc.endpoint) as channel:
            kubelet = Kubelet(api_pb2_grpc.RuntimeServiceStub(channel))
            kubelet.remove(g1, g1_containers)  # its CPUs go back to the shared pool
            _, (g3,) = kubelet.pod(guaranteed("g3", 6))
            pinned["g3"] = parse_cpu_list(runtime.cpuset_of(g3))
        assert proc.stop() == 0
    finally:
        proc.kill()
        runtime.stop()
    shutil.rmtree(root)  # the replay must not need it
    return Recorded(path, workdir, topology, pinned)


@pytest.fixture(scope="module")
def recorded() -> Iterator[Recorded]:
    workdir = short_tmpdir("rr-")
    yield record(workdir, [])


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crihook", "replay", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_recording_on_48_fixture_cpus_replays_identically_without_sysfs(
    recorded: Recorded,
) -> None:
    docs = lines(recorded.path)
    headers = [d for d in docs if d["kind"] == "header"]
    assert len(headers) == 2  # crihook was restarted half-way
    topology = Topology.from_dict(headers[0]["node"]["topology"])
    assert topology == recorded.topology
    assert len(topology.cpus) == 48
    assert [m.total_bytes for m in topology.memory.values()] == [96 * GIB, 96 * GIB]
    assert not (recorded.workdir / "sys").exists()
    # Exclusive CPUs that exist only on the fixture machine were handed out.
    assert max(recorded.pinned["g3"]) >= 2

    result = replay(recorded.path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "everything matches" in result.stdout
    assert "2 segment(s)" in result.stdout
    failed = next(d for d in docs_of(recorded, "CreateContainer") if d["pod"] == "default/broken")
    assert failed["status"] == {"code": "INTERNAL", "message": "disk on fire", "origin": "runtime"}
    assert [h["verdict"] for h in failed["hooks"] if h["stage"] == "failed"] == ["told", "told"]


def test_a_changed_hook_behaviour_is_a_readable_difference(
    recorded: Recorded, tmp_path: Path
) -> None:
    # The new configuration keeps CPUs 0-7 for the system: every pick moves.
    config = tmp_path / "new.toml"
    config.write_text(
        CONFIG.replace("[hooks.oom]", '[hooks.cpuset]\nreserved_cpus = "0-7"\n\n[hooks.oom]')
    )

    result = replay(recorded.path, "--config", str(config))

    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    g1 = next(d for d in docs_of(recorded, "CreateContainer") if d["pod"] == "default/g1")
    heading = f"line {g1['line']} (seq {g1['seq']}): CreateContainer, pod default/g1, container app"
    assert heading in out, out
    recorded_cpus = g1["forwarded"]["changes"]["config.linux.resources.cpuset_cpus"]
    assert f'forwarded config.linux.resources.cpuset_cpus: recorded "{recorded_cpus}"' in out
    assert out.rstrip().endswith("differ")


def docs_of(recorded: Recorded, method: str) -> list[dict[str, Any]]:
    out = []
    for number, doc in enumerate(lines(recorded.path), 1):
        if doc.get("method") == method:
            out.append({**doc, "line": number})
    return out


def test_update_rewrites_the_expectations(recorded: Recorded, tmp_path: Path) -> None:
    copy = tmp_path / "rec.jsonl"
    shutil.copy(recorded.path, copy)
    config = tmp_path / "new.toml"
    config.write_text(CONFIG.replace("BestEffort = 900", "BestEffort = 800"))
    assert replay(copy, "--config", str(config)).returncode == 1

    updated = replay(copy, "--config", str(config), "--update")

    assert updated.returncode == 0, updated.stdout
    assert "line(s) rewritten" in updated.stdout
    assert replay(copy, "--config", str(config)).returncode == 0
    assert replay(copy).returncode == 0  # the headers carry the new configuration now
    assert replay(recorded.path).returncode == 0  # the original is untouched


def test_secrets_are_redacted_and_the_replay_still_matches(recorded: Recorded) -> None:
    text = recorded.path.read_text()
    decoded = [text]
    for doc in lines(recorded.path):
        for value in doc.values():
            if isinstance(value, dict) and isinstance(value.get("b64"), str):
                decoded.append(base64.b64decode(value["b64"]).decode(errors="replace"))
    everything = "\n".join(decoded)
    assert SECRET_ENV not in everything
    assert SECRET_ANNOTATION not in everything
    g2 = next(d for d in docs_of(recorded, "CreateContainer") if d["pod"] == "default/g2")
    envs = {e["key"]: e.get("value") for e in g2["request"]["json"]["config"]["envs"]}
    assert envs["TOKEN"] == "<redacted>"
    annotations = g2["request"]["json"]["sandbox_config"]["annotations"]
    assert annotations["example.com/db-password"] == "<redacted>"
    assert replay(recorded.path).returncode == 0


def test_record_secrets_keeps_them() -> None:
    workdir = short_tmpdir("rr-")
    kept = record(workdir, ["--record-secrets", "--record-all"])
    text = kept.path.read_text()
    assert SECRET_ANNOTATION in text
    kinds = {d["kind"] for d in lines(kept.path)}
    assert "passthrough" in kinds  # --record-all: the Version probes, for one
    assert replay(kept.path).returncode == 0


@pytest.mark.parametrize("where", ["last-line", "middle"])
def test_a_truncated_or_corrupt_line_exits_2_naming_it(
    recorded: Recorded, tmp_path: Path, where: str
) -> None:
    text = recorded.path.read_bytes().split(b"\n")[:-1]
    bad = tmp_path / "bad.jsonl"
    if where == "last-line":
        bad.write_bytes(b"\n".join(text[:6]) + b"\n" + text[6][: len(text[6]) // 2])
        number = 7
    else:
        text[4] = text[4][:40] + b"#" + text[4][41:]
        bad.write_bytes(b"\n".join(text) + b"\n")
        number = 5

    result = replay(bad)

    assert result.returncode == 2
    assert f"{bad}:{number}: " in result.stdout
    assert replay(tmp_path / "missing.jsonl").returncode == 2


def test_a_full_disk_never_fails_a_call() -> None:
    workdir = short_tmpdir("rr-")
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    with small_disk(workdir / "rec", size="256k") as disk:
        path = disk.path / "rec.jsonl"
        proc = CrihookProcess(
            runtime.endpoint,
            workdir=workdir,
            config=CONFIG,
            hooks=None,
            args=[
                "--sysfs-root",
                str(write_sysfs(workdir / "sys", CPUS_48)),
                "--record",
                str(path),
            ],
        )
        try:
            proc.start()
            with grpc.insecure_channel(proc.endpoint) as channel:
                kubelet = Kubelet(api_pb2_grpc.RuntimeServiceStub(channel))
                kubelet.pod(guaranteed("before", 2))

                def written() -> bool:  # (lines go through the renderer process first)
                    return path.exists() and b'"kind":"call"' in path.read_bytes()

                wait_for(written, PATIENCE, "the first calls to be written")
                disk.fill()
                for i in range(3):  # every call succeeds, recorded or not
                    kubelet.pod(guaranteed(f"full{i}", 2))

                def dropped() -> bool:
                    path = proc.state_dir / "status.json"  # rewritten every second
                    if not path.exists():
                        return False
                    return bool(json.loads(path.read_text())["recording"]["dropped"])

                wait_for(dropped, PATIENCE, "the recording to count lost lines")
                status = json.loads((proc.state_dir / "status.json").read_text())
                assert status["recording"]["write_failures"] >= 1
                assert "No space left" in status["recording"]["last_error"]
                disk.free()
                # Within a second the writer asks for a snapshot to resume from (the next
                # line it drops makes it ask); the calls after that are recorded again.
                time.sleep(RESUME_SECONDS + 0.2)
                kubelet.pod(guaranteed("after", 2))

                def resumed() -> bool:
                    status = json.loads((proc.state_dir / "status.json").read_text())
                    return status["recording"]["failing_since"] is None

                wait_for(resumed, PATIENCE, "the recording to work again")
                kubelet.pod(guaranteed("later", 2))
            assert proc.stop() == 0
        finally:
            proc.kill()
            runtime.stop()
        docs = lines(path)
        kinds = [d["kind"] for d in docs]
        assert "gap" in kinds  # the hole is marked, and a new part starts behind it
        gap = kinds.index("gap")
        assert kinds[gap + 1 : gap + 3] == ["header", "snapshot"]
        assert docs[gap + 2]["breakers"] == {}  # no hook had failed: every breaker closed
        # Calls only from there on: the later pod's three, after whatever part of the "after"
        # pod came behind the snapshot (where the snapshot falls depends on the renderer).
        assert set(kinds[gap + 3 :]) == {"call"}
        later = [d["method"] for d in docs[gap + 3 :] if d["pod"].endswith("/later")]
        assert later == ["RunPodSandbox", "CreateContainer", "StartContainer"]
        result = replay(path)
        assert result.returncode == 0, result.stdout
        assert "lost" in result.stdout


def test_a_stopped_renderer_never_holds_a_call_back() -> None:
    """The renderer runs at idle priority: on a saturated node it may get no CPU for a
    while. Calls never wait for it; what it had not written yet is written once it runs."""
    workdir = short_tmpdir("rr-")
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    path = workdir / "rec.jsonl"
    proc = CrihookProcess(
        runtime.endpoint,
        workdir=workdir,
        config=CONFIG,
        hooks=None,
        args=["--sysfs-root", str(write_sysfs(workdir / "sys", CPUS_48)), "--record", str(path)],
    )
    try:
        proc.start()
        with grpc.insecure_channel(proc.endpoint) as channel:
            kubelet = Kubelet(api_pb2_grpc.RuntimeServiceStub(channel))
            kubelet.pod(guaranteed("before", 2))

            def first_written() -> bool:
                return path.exists() and b'"kind":"call"' in path.read_bytes()

            wait_for(first_written, PATIENCE, "the first calls to be written")
            renderer = _renderer_of(proc)
            assert _scheduling_policy(renderer) == "SCHED_IDLE"
            os.kill(renderer, signal.SIGSTOP)
            try:
                for i in range(3):  # every call is answered while the renderer is stopped
                    kubelet.pod(guaranteed(f"stopped{i}", 2))
                assert b"stopped" not in path.read_bytes()
            finally:
                os.kill(renderer, signal.SIGCONT)

            def written() -> bool:
                return path.read_bytes().count(b'"pod":"default/stopped') >= 9

            wait_for(written, PATIENCE, "the renderer to write what it held")
        assert proc.stop() == 0
    finally:
        proc.kill()
        runtime.stop()
    docs = lines(path)
    assert "gap" not in {d["kind"] for d in docs}  # below the bound: nothing lost
    stopped = [(d["pod"], d["method"]) for d in docs if "/stopped" in d.get("pod", "")]
    assert stopped == [
        (f"default/stopped{i}", method)
        for i in range(3)
        for method in ("RunPodSandbox", "CreateContainer", "StartContainer")
    ]
    assert replay(path).returncode == 0


def _renderer_of(proc: CrihookProcess) -> int:
    """crihook's renderer process (its only child running record_worker)."""
    assert proc.proc is not None
    found = []
    for task in Path(f"/proc/{proc.proc.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"crihook.proxy.record.worker" in cmdline:
                found.append(int(child))
    assert len(found) == 1, found
    return found[0]


def _scheduling_policy(pid: int) -> str:
    policy = os.sched_getscheduler(pid)
    return "SCHED_IDLE" if policy == os.SCHED_IDLE else str(policy)


# --- a plugin process -------------------------------------------------------------------------

PLUGIN_NAME = "50-annotate"


def record_with_plugin(workdir: Path) -> Path:
    """crihook with the annotate example plugin (its own process, by a drop-in) and the oom
    hook, one pod; the plugin is stopped before the replay, which does not need it."""
    path = workdir / "rec.jsonl"
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    plugin = Plugin(value="recorded").start()
    args = ["--sysfs-root", str(write_sysfs(workdir / "sys", CPUS_48)), "--record", str(path)]
    proc = CrihookProcess(runtime.endpoint, workdir=workdir, config=CONFIG, hooks=None, args=args)
    (proc.plugins_dir / "annotate.toml").write_text(plugin.dropin(PLUGIN_NAME, "fail"))
    try:
        proc.start()
        with grpc.insecure_channel(proc.endpoint) as channel:
            kubelet = Kubelet(api_pb2_grpc.RuntimeServiceStub(channel))
            _, (cid,) = kubelet.pod(guaranteed("annotated", 2))
            stored = runtime.containers[cid].config.annotations
            assert stored[KEY] == "recorded"  # the plugin's annotation reached the runtime
        assert proc.stop() == 0
    finally:
        proc.kill()
        plugin.stop()
        runtime.stop()
    return path


def test_a_plugin_is_replayed_from_its_recorded_answers(tmp_path: Path) -> None:
    path = record_with_plugin(short_tmpdir("rr-"))
    docs = lines(path)
    header = docs[0]
    assert header["plugins"] == []  # drop-ins load after the first synchronize
    (noted,) = [d for d in docs if d["kind"] == "plugins"]
    assert [p["name"] for p in noted["plugins"]] == [PLUGIN_NAME]
    create = next(d for d in docs_of_path(path, "CreateContainer"))
    run = next(h for h in create["hooks"] if h["hook"] == PLUGIN_NAME)
    assert run["verdict"] == "adjusted"
    assert run["answer"] == {"set": {f"annotation '{KEY}'": "recorded"}}

    result = replay(path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "everything matches" in result.stdout
    assert "warning" not in result.stdout

    # The plugin's recorded answer changed: the replay forwards what it says now.
    changed = tmp_path / "changed.jsonl"
    text = path.read_text().replace(
        f'"annotation \'{KEY}\'":"recorded"', f'"annotation \'{KEY}\'":"other"'
    )
    assert text != path.read_text()
    changed.write_text(text)

    result = replay(changed)

    assert result.returncode == 1, result.stdout + result.stderr
    heading = f"line {create['line']} (seq {create['seq']}): CreateContainer, pod default/annotated"
    assert heading in result.stdout
    assert f'forwarded config.annotations.{KEY}: recorded "recorded", replayed "other"' in (
        result.stdout
    )


def docs_of_path(path: Path, method: str) -> list[dict[str, Any]]:
    return [
        {**doc, "line": number}
        for number, doc in enumerate(lines(path), 1)
        if doc.get("method") == method
    ]


def test_pods_removed_without_crihook_are_forgotten_in_the_recording_and_the_replay() -> None:
    """crihook lists the runtime every `reconcile_seconds`: a pod removed on the runtime's
    own socket is dropped and its CPUs given back (a synchronize, recorded); the replay
    drops it at that line too, and the next pod gets those CPUs in both."""
    workdir = short_tmpdir("rr-")
    root = write_sysfs(workdir / "sys", CPUS_48)
    path = workdir / "rec.jsonl"
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    args = ["--sysfs-root", str(root), "--record", str(path)]
    config = "reconcile_seconds = 0.5\n" + CONFIG
    proc = CrihookProcess(runtime.endpoint, workdir=workdir, config=config, hooks=None, args=args)
    try:
        proc.start()
        with (
            grpc.insecure_channel(proc.endpoint) as channel,
            grpc.insecure_channel(runtime.endpoint) as direct,
        ):
            kubelet = Kubelet(api_pb2_grpc.RuntimeServiceStub(channel))
            g1, (c1,) = kubelet.pod(guaranteed("g1", 24))
            held = parse_cpu_list(runtime.cpuset_of(c1))
            Kubelet(api_pb2_grpc.RuntimeServiceStub(direct)).remove(g1, [c1])  # behind its back
            wait_for(lambda: "removed without crihook" in proc.log(), PATIENCE, "the pod forgotten")
            _, (c2,) = kubelet.pod(guaranteed("g2", 24))
            assert parse_cpu_list(runtime.cpuset_of(c2)) == held
        assert proc.stop() == 0
    finally:
        proc.kill()
        runtime.stop()
    syncs = [line for line in lines(path) if line.get("kind") == "sync"]
    assert [s["reason"] for s in syncs] == ["start", "reconcile"]
    assert [p["id"] for p in syncs[1]["pods"]] == []
    shutil.rmtree(root)
    result = replay(path)
    assert result.returncode == 0, result.stdout + result.stderr
