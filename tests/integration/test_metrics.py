"""Prometheus metrics from a real crihook process, scraped over a unix socket and a TCP port
as Prometheus does: the series move with real calls, a bad address is a config error, and
the number of series stays the same however many pods come and go."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator

import grpc
import pytest

from crihook import __version__
from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from crihook.hooks.node import read_topology
from tests.integration.test_resource_hooks_fixtures import Node
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import DATA_PATHS, CrihookProcess, short_tmpdir
from tests.lab.fake_runtime import FakeRuntime, Reply
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import KubeletClient
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, burstable_pod
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.metrics_scrape import Samples, bound_address, http_get, scrape, value
from tests.lab.sysfs import DUAL_SOCKET_SMT2_2NUMA, GIB

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGE = "/runtime.v1.ImageService/"
ANNOTATE = (
    '[hooks]\norder = ["10-a"]\n'
    '[hooks.a]\nmodule = "crihook.hooks.examples.annotate:AnnotateHook"\n'
    'key = "example.com/a"\nvalue = "x"\n'
)
CREATE = api_pb2.CreateContainerRequest(
    pod_sandbox_id="p1",
    config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app")),
    sandbox_config=api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="web", namespace="default", uid="u1")
    ),
).SerializeToString()


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    runtime.script["CreateContainer"] = Reply(
        api_pb2.CreateContainerResponse(container_id="c" * 64).SerializeToString()
    )
    runtime.script["ListImages"] = Reply(code=grpc.StatusCode.NOT_FOUND, details="no such image")
    yield runtime
    runtime.stop()


def _call(endpoint: str, method: str, request: bytes = b"") -> grpc.StatusCode:
    with grpc.insecure_channel(endpoint) as channel:
        try:
            channel.unary_unary(method)(request, timeout=60)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.mark.parametrize("data_path", DATA_PATHS)
def test_unix_socket_series_move_with_pass_through_and_intercepted_calls(
    fake: FakeRuntime, data_path: str
) -> None:
    workdir = short_tmpdir("mx-")
    address = f"unix://{workdir}/metrics.sock"
    args = ["--metrics-listen", address]
    with CrihookProcess(
        fake.endpoint, workdir, args=args, config=ANNOTATE, hooks=None, data_path=data_path
    ) as proc:
        before = scrape(address)
        for _ in range(3):
            assert _call(proc.endpoint, RUNTIME + "ListContainers") == grpc.StatusCode.OK
        assert _call(proc.endpoint, IMAGE + "ListImages") == grpc.StatusCode.NOT_FOUND
        assert _call(proc.endpoint, RUNTIME + "CreateContainer", CREATE) == grpc.StatusCode.OK
        # crihook refuses a StartContainer without an id itself: the runtime never sees it.
        assert _call(proc.endpoint, RUNTIME + "StartContainer") == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        after = scrape(address)
        metrics_socket = workdir / "metrics.sock"
        assert stat.S_IMODE(metrics_socket.stat().st_mode) == 0o660  # as kubelet's socket
        assert proc.stop() == 0
        assert not metrics_socket.exists()
        log = proc.log()

    calls, errors = "crihook_cri_calls_total", "crihook_cri_errors_total"
    duration = "crihook_cri_call_duration_seconds_count"
    passthrough = {"method": "ListContainers", "path": "passthrough"}
    assert _delta(before, after, calls, **passthrough) == 3
    assert _delta(before, after, duration, **passthrough) == 3
    assert _delta(before, after, calls, method="ListImages", path="passthrough") == 1
    assert (
        _delta(
            before,
            after,
            errors,
            method="ListImages",
            path="passthrough",
            code="NOT_FOUND",
            origin="runtime",
        )
        == 1
    )
    create = {"method": "CreateContainer", "path": "intercepted"}
    assert _delta(before, after, calls, **create) == 1
    assert _delta(before, after, duration, **create) == 1
    assert _delta(before, after, "crihook_cri_call_duration_seconds_bucket", le="+Inf", **create)
    assert (
        _delta(
            before,
            after,
            errors,
            method="StartContainer",
            path="intercepted",
            code="INVALID_ARGUMENT",
            origin="crihook",
        )
        == 1
    )
    assert not any(
        name == errors and dict(labels)["method"] == "CreateContainer" for name, labels in after
    )
    # The hook: one pre-stage run that adjusted an annotation.
    hook = {"hook": "10-a"}
    assert (
        _delta(before, after, "crihook_hook_runs_total", stage="pre", verdict="adjusted", **hook)
        == 1
    )
    assert _delta(before, after, "crihook_hook_invocations_total", **hook) == 1
    assert _delta(before, after, "crihook_hook_duration_seconds_count", stage="pre", **hook) == 1
    assert _delta(before, after, "crihook_hook_adjustments_total", field="annotation", **hook) == 1
    assert value(after, "crihook_hook_errors_total", **hook) == 0
    assert value(after, "crihook_hook_breaker_state", state="closed", **hook) == 1
    assert value(after, "crihook_hook_breaker_state", state="open", **hook) == 0
    assert value(after, "crihook_hook_connected", **hook) == 1
    assert value(after, "crihook_store_objects", kind="container") == 1
    assert value(after, "crihook_ready") == 1
    assert (
        value(
            after,
            "crihook_build_info",
            version=__version__,
            python_version=_python_version(after),
            python_implementation="cpython",
        )
        == 1
    )
    assert value(after, "crihook_process_open_fds") > 0
    # ... and the log has one line for each intercepted call.
    assert re.search(
        r"CreateContainer ok \(adjusted\) method=CreateContainer pod=default/web container=app "
        r"hooks=10-a/pre:adjusted outcome=adjusted elapsed_ms=[\d.]+ runtime_ms=[\d.]+",
        log,
    ), log
    assert re.search(
        r"StartContainer refused by crihook: INVALID_ARGUMENT method=StartContainer .*"
        r"outcome=INVALID_ARGUMENT origin=crihook",
        log,
    ), log


def _python_version(samples: Samples) -> str:
    for name, labels in samples:
        if name == "crihook_build_info":
            return dict(labels)["python_version"]
    raise AssertionError("no crihook_build_info")


def test_tcp_port_serves_metrics_and_only_metrics(fake: FakeRuntime) -> None:
    with CrihookProcess(fake.endpoint, args=["--metrics-listen", "127.0.0.1:0"]) as proc:
        address = bound_address(proc.log())
        assert address is not None and address.startswith("127.0.0.1:"), proc.log()
        before = scrape(address)
        assert _call(proc.endpoint, RUNTIME + "ListContainers") == grpc.StatusCode.OK
        after = scrape(address)
        labels = {"method": "ListContainers", "path": "passthrough"}
        assert _delta(before, after, "crihook_cri_calls_total", **labels) == 1
        assert http_get(address, "/")[0] == 404
        assert http_get(address, "/metrics", verb="POST")[0] == 405
        status, body = http_get(address, "/metrics", verb="HEAD")
        assert (status, body) == (200, "")


FAULTY = (
    '[hooks]\norder = ["10-slow", "20-a", "30-b"]\n'
    '[hooks.slow]\nmodule = "crihook.hooks.examples.annotate:AnnotateHook"\n'
    'key = "example.com/slow"\nvalue = "x"\ndelay_ms = 2000\ntimeout_ms = 50\n'
    'failure_policy = "ignore"\nbreaker_threshold = 1\nbreaker_reset_seconds = 600\n'
    '[hooks.a]\nmodule = "crihook.hooks.examples.annotate:AnnotateHook"\n'
    'key = "example.com/same"\nvalue = "a"\n'
    '[hooks.b]\nmodule = "crihook.hooks.examples.annotate:AnnotateHook"\n'
    'key = "example.com/same"\nvalue = "b"\n'
)


def test_hook_timeouts_conflicts_and_breakers_are_counted(fake: FakeRuntime) -> None:
    """10-slow times out (ignored) and its breaker opens; 30-b sets what 20-a set: a
    conflict fails the call. The next call skips 10-slow."""
    workdir = short_tmpdir("mf-")
    address = f"unix://{workdir}/metrics.sock"
    args = ["--metrics-listen", address]
    with CrihookProcess(fake.endpoint, workdir, args=args, config=FAULTY, hooks=None) as proc:
        create = RUNTIME + "CreateContainer"
        assert _call(proc.endpoint, create, CREATE) == grpc.StatusCode.FAILED_PRECONDITION
        first = scrape(address)
        assert _call(proc.endpoint, create, CREATE) == grpc.StatusCode.FAILED_PRECONDITION
        second = scrape(address)
    slow, a, b = {"hook": "10-slow"}, {"hook": "20-a"}, {"hook": "30-b"}
    assert value(first, "crihook_hook_timeouts_total", **slow) == 1
    assert value(first, "crihook_hook_errors_total", **slow) == 1
    assert value(first, "crihook_hook_ignored_failures_total", **slow) == 1
    assert value(first, "crihook_hook_runs_total", stage="pre", verdict="ignored", **slow) == 1
    assert value(first, "crihook_hook_breaker_state", state="open", **slow) == 1
    assert value(first, "crihook_hook_breaker_state", state="closed", **slow) == 0
    assert value(first, "crihook_hook_conflicts_total", **b) == 1
    assert value(first, "crihook_hook_conflicts_total", **a) == 0
    assert value(first, "crihook_hook_timeouts_total", **a) == 0
    assert value(first, "crihook_hook_adjustments_total", field="annotation", **b) == 0
    assert value(first, "crihook_hook_runs_total", stage="pre", verdict="failed", **b) == 1
    errors = {"method": "CreateContainer", "path": "intercepted", "origin": "crihook"}
    assert value(first, "crihook_cri_errors_total", code="FAILED_PRECONDITION", **errors) == 1
    # The open breaker: the call is not made, it is counted as skipped.
    assert _delta(first, second, "crihook_hook_skipped_total", **slow) == 1
    assert _delta(first, second, "crihook_hook_invocations_total", **slow) == 0
    assert _delta(first, second, "crihook_hook_invocations_total", **a) == 1
    assert not fake.calls("CreateContainer")


@pytest.mark.parametrize("data_path", DATA_PATHS)
def test_streams_and_unknown_methods_are_counted_not_timed(
    fake: FakeRuntime, data_path: str
) -> None:
    fake.script["GetContainerEvents"] = Reply(stream=[b"", b""])
    workdir = short_tmpdir("ms-")
    address = f"unix://{workdir}/metrics.sock"
    args = ["--metrics-listen", address]
    with CrihookProcess(fake.endpoint, workdir, args=args, data_path=data_path) as proc:
        before = scrape(address)
        with grpc.insecure_channel(proc.endpoint) as channel:
            events = channel.unary_stream(RUNTIME + "GetContainerEvents")(b"", timeout=60)
            assert len(list(events)) == 2
        # A method of a newer kubelet: forwarded, counted as `other` (no series per name).
        assert _call(proc.endpoint, RUNTIME + "SomethingNew") == grpc.StatusCode.OK
        assert _call(proc.endpoint, RUNTIME + "SomethingElse") == grpc.StatusCode.OK
        after = scrape(address)
    events_labels = {"method": "GetContainerEvents", "path": "passthrough"}
    assert _delta(before, after, "crihook_cri_calls_total", **events_labels) == 1
    assert value(after, "crihook_cri_call_duration_seconds_count", **events_labels) == 0
    other = {"method": "other", "path": "passthrough"}
    assert _delta(before, after, "crihook_cri_calls_total", **other) == 2
    assert not any("Something" in str(labels) for _, labels in after)


def _serve_exit(args: list[str], config: str | None = None) -> tuple[int, str]:
    proc = CrihookProcess("unix:///nonexistent/rt.sock", args=args, config=config)
    done = subprocess.run(proc.command(), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    ("args", "config", "named"),
    [
        (["--metrics-listen", "9464"], None, "--metrics-listen"),
        (["--metrics-listen", "http://127.0.0.1:9464"], None, "--metrics-listen"),
        (["--metrics-listen", "unix://relative.sock"], None, "--metrics-listen"),
        ([], 'metrics_listen = "127.0.0.1:99999"\n', "metrics_listen"),
        ([], "metrics_listen = 9464\n", "metrics_listen"),
    ],
    ids=["port-only", "url", "relative-unix", "config-port-out-of-range", "config-not-a-string"],
)
def test_a_bad_metrics_address_is_a_config_error(
    args: list[str], config: str | None, named: str
) -> None:
    code, stderr = _serve_exit(args, config)
    assert code == 2, stderr
    assert f"crihook: config error: {named}:" in stderr, stderr


def test_a_metrics_port_in_use_stops_crihook_at_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = _serve_exit(["--metrics-listen", f"127.0.0.1:{port}"])
    assert code == 2, stderr
    assert f"metrics_listen: cannot listen on 127.0.0.1:{port}" in stderr, stderr


# --- bounded cardinality, pool usage ------------------------------------------------------------


@pytest.fixture
def pool_node() -> Iterator[tuple[Node, str]]:
    """cpuset, numa, oom on a 2-NUMA-node fixture machine, in front of the memory runtime,
    metrics on a unix socket."""
    workdir = short_tmpdir("mp-")
    address = f"unix://{workdir}/metrics.sock"
    args = ["--metrics-listen", address, "--log-level", "info"]
    with crihook_on_fixture(
        workdir, DUAL_SOCKET_SMT2_2NUMA, hooks="cpuset,numa,oom", args=args
    ) as m:
        yield Node(m.topology, m.runtime, m.proc, m.stub), address


def _churn(node: Node, prefix: str, count: int) -> list[str]:
    """Pods of one Burstable container made, started, stopped and removed through crihook;
    returns their names and uids."""
    seen = []
    for i in range(count):
        app = ContainerSpec(name=f"app-{prefix}-{i}", cpu_request=100, memory_request=GIB)
        spec = PodSpec(name=f"{prefix}-{i}", namespace=f"ns-{prefix}-{i}", containers=[app])
        sandbox = node.run_pod(spec)
        cid = node.create(spec, sandbox, app)
        node.stub.StopContainer(api_pb2.StopContainerRequest(container_id=cid), timeout=60)
        node.stub.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=cid), timeout=60)
        node.stub.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
        node.stub.RemovePodSandbox(
            api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60
        )
        seen += [spec.name, spec.uid, spec.namespace, app.name, sandbox, cid]
    return seen


def test_series_stay_bounded_however_many_pods_come_and_go(pool_node: tuple[Node, str]) -> None:
    node, address = pool_node
    _churn(node, "warm", 3)
    first = scrape(address)
    names = _churn(node, "many", 60)
    status, text = http_get(address)
    after = scrape(address)
    assert status == 200
    assert set(after) == set(first)  # the same series: none per pod or container
    for name in names:
        assert name not in text
    created = {"method": "CreateContainer", "path": "intercepted"}
    assert _delta(first, after, "crihook_cri_calls_total", **created) == 60
    assert (
        _delta(
            first,
            after,
            "crihook_hook_runs_total",
            hook="20-cpuset",
            stage="pre",
            verdict="adjusted",
        )
        == 60
    )  # a shared-pool cpuset each
    assert (
        _delta(
            first, after, "crihook_hook_adjustments_total", hook="20-cpuset", field="cpuset_cpus"
        )
        == 60
    )
    assert value(after, "crihook_store_objects", kind="pod") == 0


def test_pool_gauges_follow_exclusive_cpus_and_numa_memory(pool_node: tuple[Node, str]) -> None:
    node, address = pool_node
    online = len(node.topology.online)
    before = scrape(address)
    assert value(before, "crihook_pool_cpus", pool="exclusive") == 0
    assert value(before, "crihook_pool_cpus", pool="shared") == online
    memory = {"resource": "memory", "state": "assigned"}
    assert [
        value(before, "crihook_pool_memory_bytes", numa_node=n, **memory) for n in ("0", "1")
    ] == [0, 0]
    sandbox, _ = node.pod("guaranteed", cpus=4, memory=2 * GIB)
    held = scrape(address)
    assert value(held, "crihook_pool_cpus", pool="exclusive") == 4
    assert value(held, "crihook_pool_cpus", pool="shared") == online - 4
    assigned = sum(
        value(held, "crihook_pool_memory_bytes", numa_node=n, **memory) for n in ("0", "1")
    )
    assert assigned == 2 * GIB
    for n in ("0", "1"):
        free = value(
            held, "crihook_pool_memory_bytes", numa_node=n, resource="memory", state="free"
        )
        allocatable = value(
            held, "crihook_pool_memory_bytes", numa_node=n, resource="memory", state="allocatable"
        )
        taken = value(held, "crihook_pool_memory_bytes", numa_node=n, **memory)
        assert free == allocatable - taken
    node.stub.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
    after = scrape(address)
    assert value(after, "crihook_pool_cpus", pool="exclusive") == 0
    assert value(after, "crihook_pool_cpus", pool="shared") == online
    assert (
        sum(value(after, "crihook_pool_memory_bytes", numa_node=n, **memory) for n in ("0", "1"))
        == 0
    )


def test_device_pool_gauges_follow_what_containers_hold() -> None:
    workdir = short_tmpdir("md-")
    dev = workdir / "dev"
    dev.mkdir()
    for i in range(4):
        os.mknod(dev / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 7))  # S_IFCHR, /dev/full's
    gpus = ", ".join(f'{{ id = "{i}", path = "{dev}/gpu{i}" }}' for i in range(4))
    config = (
        f'[hooks.devices]\nnamespaces = ["default"]\n'
        f"[hooks.devices.pools.gpu]\ndevices = [{gpus}]\n"
    )
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    address = f"unix://{workdir}/metrics.sock"
    proc = CrihookProcess(
        runtime.endpoint,
        workdir,
        config=config,
        hooks="devices",
        args=["--metrics-listen", address],
    )
    try:
        proc.start()
        before = scrape(address)
        with grpc.insecure_channel(proc.endpoint) as channel:
            node = Node(
                read_topology("/sys"), runtime, proc, api_pb2_grpc.RuntimeServiceStub(channel)
            )
            app = ContainerSpec(name="app", cpu_request=100, memory_request=GIB)
            spec = PodSpec(
                name="gpu",
                containers=[app],
                annotations={"pools.crihook.io/container.app": json.dumps({"gpu": 2})},
            )
            sandbox = node.run_pod(spec)
            node.create(spec, sandbox, app)
            held = scrape(address)
            node.stub.RemovePodSandbox(
                api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60
            )
        after = scrape(address)
    finally:
        proc.kill()
        runtime.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    pool = "crihook_pool_devices"
    assert [value(before, pool, pool="gpu", state=s) for s in ("held", "free")] == [0, 4]
    assert [value(held, pool, pool="gpu", state=s) for s in ("held", "free")] == [2, 2]
    assert [value(after, pool, pool="gpu", state=s) for s in ("held", "free")] == [0, 4]


# --- real containerd ----------------------------------------------------------------------------


@pytest.mark.containerd
def test_real_containerd_pod_lifecycle_moves_the_series(
    containerd: Containerd, pod_cleanup: PodCleanup
) -> None:
    workdir = short_tmpdir("mc-")
    address = f"unix://{workdir}/metrics.sock"
    args = ["--metrics-listen", address, "--log-format", "json", "--log-level", "info"]
    with CrihookProcess(containerd.endpoint, workdir, args=args, hooks="cpuset") as proc:
        before = scrape(address)
        with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
            handle = kubelet.run_pod(burstable_pod("metrics"))
            during = scrape(address)
            kubelet.stop_pod(handle)
            kubelet.remove_pod(handle)
        after = scrape(address)
        log = proc.log()
    online = len(read_topology("/sys").online)
    for method in ("RunPodSandbox", "CreateContainer", "StartContainer"):
        labels = {"method": method, "path": "intercepted"}
        assert _delta(before, during, "crihook_cri_calls_total", **labels) == 1, method
        assert _delta(before, during, "crihook_cri_call_duration_seconds_count", **labels) == 1
    assert (
        _delta(
            before, after, "crihook_cri_calls_total", method="RemovePodSandbox", path="intercepted"
        )
        == 1
    )
    assert (
        _delta(
            before, during, "crihook_cri_calls_total", method="PodSandboxStatus", path="passthrough"
        )
        >= 1
    )  # the kubelet client polls it
    # (Only the probes before crihook was ready failed: UNAVAILABLE, from crihook.)
    errors = [
        dict(labels)
        for (name, labels), count in after.items()
        if name == "crihook_cri_errors_total" and count != before.get((name, labels))
    ]
    assert errors == [], errors
    assert value(during, "crihook_store_objects", kind="pod") == 1
    assert value(after, "crihook_store_objects", kind="pod") == 0
    assert value(during, "crihook_pool_cpus", pool="shared") == online
    assert (
        _delta(
            before, during, "crihook_hook_adjustments_total", hook="20-cpuset", field="cpuset_cpus"
        )
        == 1
    )
    # The JSON log: one line per intercepted call, with the pod, the hooks and the outcome.
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    created = [
        doc
        for doc in lines
        if doc.get("logger") == "crihook.proxy.call_log" and doc["method"] == "CreateContainer"
    ]
    assert len(created) == 1
    assert created[0]["pod"] == "default/metrics" and created[0]["container"] == "app"
    assert created[0]["outcome"] == "adjusted"
    assert created[0]["hooks"].split(",") == ["20-cpuset/pre:adjusted", "20-cpuset/post:nothing"]
    assert created[0]["elapsed_ms"] > 0
