"""A node that fills up (issue 27): the state on disk across SIGKILL at any point while calls
run, `crihook state` reading the journal layout while crihook runs and after it stopped,
and the memory a large message took given back. crihook on the 256-CPU fixture in front of
the memory runtime (what a real containerd cannot show here: the machine)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from bench.procfs import rss_bytes
from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.proxy.ops.state_cli import load_state
from crihook.proxy.state.records_journal import records_files
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.kubelet_encoding import container_config, one_container_pod, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import EPYC_256_8NUMA, GIB, write_sysfs

MiB = 1 << 20


class Node:
    def __init__(self, workdir: Path, data_path: str | None = None) -> None:
        self.sysfs = write_sysfs(workdir / "sys", EPYC_256_8NUMA)
        self.runtime = MemoryRuntime(workdir / "rt.sock").start()
        self.proc = CrihookProcess(
            self.runtime.endpoint,
            workdir=workdir,
            hooks="cpuset,numa,oom",
            args=["--sysfs-root", str(self.sysfs)],
            data_path=data_path,
        )
        self.count = 0

    def pod(self, channel: grpc.Channel, guaranteed: bool = False, env_bytes: int = 0) -> str:
        stub = api_pb2_grpc.RuntimeServiceStub(channel)
        self.count += 1
        spec, container = one_container_pod(f"p{self.count}", guaranteed, env_bytes)
        sandbox = sandbox_config(spec)
        sid = stub.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=sandbox), timeout=60)
        config = container_config(spec, container, node_memory=1024 * GIB)
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sid.pod_sandbox_id, config=config, sandbox_config=sandbox
        )
        cid = str(stub.CreateContainer(request, timeout=60).container_id)
        stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)
        return cid


@pytest.fixture
def node() -> Iterator[Node]:
    made = Node(short_tmpdir("sc-"))
    try:
        yield made
    finally:
        made.proc.kill()
        made.runtime.stop()


def _channel(proc: CrihookProcess) -> grpc.Channel:
    return grpc.insecure_channel(
        proc.endpoint, options=[("grpc.max_send_message_length", 64 << 20)]
    )


def _on_disk(proc: CrihookProcess) -> tuple[set[str], set[str]]:
    state = load_state(proc.state_dir)
    return set(state["pods"]), set(state["containers"])


def _runtime(runtime: MemoryRuntime) -> tuple[set[str], set[str]]:
    return set(runtime.pods), set(runtime.containers)


def _calls(node: Node, stop: threading.Event, errors: list[BaseException]) -> None:
    """Pod after pod until `stop` or crihook goes away; every 10th Guaranteed."""
    with _channel(node.proc) as channel:
        while not stop.is_set():
            try:
                node.pod(channel, guaranteed=node.count % 10 == 0)
            except grpc.RpcError as exc:  # the kill cut a call short
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    errors.append(exc)
                return


def test_the_state_survives_sigkill_at_any_point_while_calls_run(node: Node) -> None:
    """Calls keep coming; crihook is SIGKILLed at a random moment, five times. After each
    kill what `crihook state` reads is whole (every record on disk is one the runtime
    has), and the crihook started again holds exactly what the runtime has, with the
    exclusive CPUs it had handed out still held (written ahead). Some kill must leave
    records journal lines behind, replayed over the snapshot at the next start: on a loaded
    machine a kill can keep landing after a compaction, so it kills again (20 times at
    most) until one did."""
    rng = random.Random(27)
    node.proc.start()
    replayed = 0
    for kill in range(20):
        if kill >= 5 and replayed:
            break
        stop = threading.Event()
        errors: list[BaseException] = []
        worker = threading.Thread(target=_calls, args=(node, stop, errors))
        worker.start()
        until = node.count + 5 + rng.randrange(30)
        wait_for(lambda until=until: node.count >= until, PATIENCE, "calls")
        node.proc.kill()  # SIGKILL, mid-call or mid-write
        stop.set()
        worker.join(PATIENCE)
        assert not errors, errors
        pods, containers = _on_disk(node.proc)
        live_pods, live_containers = _runtime(node.runtime)
        assert pods <= live_pods and containers <= live_containers
        replayed += bool(records_files(node.proc.state_dir))  # lines the snapshot lacks
        node.proc.start()  # reconciled with the runtime before it answers
        wait_for(lambda: _on_disk(node.proc) == _runtime(node.runtime), PATIENCE, "the store")
        cpus = node.proc.hook_state("cpuset")
        held = {k for k in cpus if k.startswith("c:")}
        guaranteed = {
            cid
            for cid, c in node.runtime.containers.items()
            if c.config.linux.resources.cpu_quota == -1  # the Guaranteed ones: no quota
        }
        assert {f"c:{cid}" for cid in guaranteed} <= held | {
            k for k in cpus if k.startswith("r:")
        }, "an exclusive allocation was lost"
    assert replayed, "no kill left a records journal to replay: the layout went untested"


def test_crihook_state_reads_the_journal_while_running_and_after_stop(node: Node) -> None:
    node.proc.start()
    with _channel(node.proc) as channel:
        for _ in range(30):
            node.pod(channel)
        # A compaction after 2 s at most; a change on a node this size is a journal line.
        wait_for(lambda: _on_disk(node.proc) == _runtime(node.runtime), PATIENCE, "compaction")
        last = [node.pod(channel)]

        def read_from_the_journal() -> bool:
            """`crihook state` shows the newest container, which only the journal has."""
            if not records_files(node.proc.state_dir):  # compacted already: change again
                last.append(node.pod(channel))
                return False
            state = load_state(node.proc.state_dir)
            snapshot = json.loads((node.proc.state_dir / "store.json").read_bytes())
            return (
                (set(state["pods"]), set(state["containers"])) == _runtime(node.runtime)
                and last[-1] in state["containers"]
                and last[-1] not in snapshot["containers"]
            )

        wait_for(read_from_the_journal, PATIENCE, "crihook state to read the journal")
        node.pod(channel)
    node.proc.kill()
    assert _on_disk(node.proc) <= _runtime(node.runtime)
    node.proc.start()
    wait_for(lambda: _on_disk(node.proc) == _runtime(node.runtime), PATIENCE, "the store")
    assert node.proc.stop() == 0
    assert records_files(node.proc.state_dir) == []  # a clean stop compacts
    assert _on_disk(node.proc) == _runtime(node.runtime)


def test_memory_a_large_message_took_is_given_back() -> None:
    """One 15 MiB CreateContainer through the grpc data path: crihook's RSS comes back to
    within 10 MiB of what it was before (glibc keeps freed heap without malloc_trim)."""
    made = Node(short_tmpdir("mt-"), data_path="grpc")
    try:
        made.proc.start()
        assert made.proc.proc is not None
        pid = made.proc.proc.pid
        with _channel(made.proc) as channel:
            made.pod(channel)
            made.pod(channel)
            idle = rss_bytes(pid)
            cid = made.pod(channel, env_bytes=15 * MiB)
            assert len(made.runtime.containers[cid].config.envs[0].value) == 15 * MiB
            wait_for(lambda: rss_bytes(pid) <= idle + 10 * MiB, PATIENCE, "RSS back near idle")
    finally:
        made.proc.kill()
        made.runtime.stop()


def _asked(runtime: MemoryRuntime, since: int) -> list[str]:
    """The containers whose resources crihook asked the runtime for (ContainerStatus, not
    verbose: the verbose one rebuilds a record the store lacks), after the first `since`
    calls."""
    calls = runtime.calls("ContainerStatus")[since:]
    requests = [api_pb2.ContainerStatusRequest.FromString(c.request) for c in calls]
    return sorted(r.container_id for r in requests if not r.verbose)


def test_a_restart_asks_the_runtime_only_about_a_container_whose_update_it_missed(
    node: Node,
) -> None:
    """crihook is killed while the runtime has applied an UpdateContainerResources and not
    answered yet: the record on disk is older than the runtime. The next start takes that
    container's resources from the runtime, and only that one's (proxy/state/unsettled.py); a
    clean restart asks about none."""
    node.proc.start()
    with _channel(node.proc) as channel:
        cids = [node.pod(channel) for _ in range(3)]
    assert node.proc.stop() == 0
    since = len(node.runtime.calls("ContainerStatus"))
    node.proc.start()
    assert _asked(node.runtime, since) == []
    target = cids[1]
    linux = api_pb2.LinuxContainerResources(
        cpu_period=100000, cpu_shares=512, memory_limit_in_bytes=256 * MiB
    )
    node.runtime.slow_next("UpdateContainerResources", PATIENCE)
    errors: list[grpc.RpcError] = []

    def update() -> None:
        with _channel(node.proc) as channel:
            request = api_pb2.UpdateContainerResourcesRequest(container_id=target, linux=linux)
            try:
                api_pb2_grpc.RuntimeServiceStub(channel).UpdateContainerResources(
                    request, timeout=PATIENCE
                )
            except grpc.RpcError as exc:  # the kill below
                errors.append(exc)

    worker = threading.Thread(target=update)
    worker.start()
    wait_for(lambda: node.runtime.containers[target].updates, PATIENCE, "the update applied")
    node.proc.kill()  # before the runtime's answer: the record was never changed
    worker.join(PATIENCE)
    assert [e.code() for e in errors] == [grpc.StatusCode.UNAVAILABLE]
    before = load_state(node.proc.state_dir)["containers"][target]["view"]["resources"]
    assert before["memory_limit_bytes"] != 256 * MiB
    since = len(node.runtime.calls("ContainerStatus"))
    node.proc.start()
    assert _asked(node.runtime, since) == [target]

    def recorded() -> int:
        doc = load_state(node.proc.state_dir)["containers"][target]["view"]["resources"]
        return int(doc["memory_limit_bytes"])

    wait_for(lambda: recorded() == 256 * MiB, PATIENCE, "the runtime's resources recorded")
    assert node.proc.stop() == 0
    since = len(node.runtime.calls("ContainerStatus"))
    node.proc.start()
    assert _asked(node.runtime, since) == []
