"""crihook against a recording fake runtime: what a real containerd cannot show.

Exact bytes received (lossless forwarding, unknown fields), deadlines, the runtime's status
passed through, streams, a runtime that is absent at start, SIGTERM with calls in flight,
stale and live socket files.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from tests.lab.crihook_proc import (
    DATA_PATH_ENV,
    DATA_PATHS,
    PATIENCE,
    CrihookProcess,
    short_tmpdir,
    wait_for,
)
from tests.lab.fake_runtime import FakeRuntime, Reply

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGE = "/runtime.v1.ImageService/"


# The least an intercepted call must carry for crihook to forward it (proxy/core/validate.py);
# pass-through methods are forwarded whatever they carry.
SANDBOX = api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(name="p", uid="u1"))
MINIMAL = {
    "StartContainer": api_pb2.StartContainerRequest(container_id="c1").SerializeToString(),
    "CreateContainer": api_pb2.CreateContainerRequest(
        pod_sandbox_id="p1",
        config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app")),
        sandbox_config=SANDBOX,
    ).SerializeToString(),
}


def _minimal(method: str) -> bytes:
    return MINIMAL.get(method, b"")


def _unknown_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field the CRI schema does not have."""
    tag = (number << 3) | 2
    out = bytearray()
    for value in (tag, len(payload)):
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out) + payload


@pytest.fixture(autouse=True, params=DATA_PATHS)
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both data paths (grpc.aio, and crihook's own HTTP/2)."""
    monkeypatch.setenv(DATA_PATH_ENV, request.param)
    return str(request.param)


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    yield runtime
    runtime.stop()


@pytest.fixture
def proxy(fake: FakeRuntime) -> Iterator[CrihookProcess]:
    with CrihookProcess(fake.endpoint) as proc:
        yield proc


def _call(endpoint: str, method: str, request: bytes, timeout: float = 10, **kw: object) -> bytes:
    with grpc.insecure_channel(endpoint) as channel:
        return channel.unary_unary(method)(request, timeout=timeout, **kw)  # type: ignore[no-any-return]


def test_pass_through_forwards_bytes_and_unknown_fields_unchanged(
    fake: FakeRuntime, proxy: CrihookProcess
) -> None:
    request = api_pb2.ListContainersRequest(
        filter=api_pb2.ContainerFilter(label_selector={"a": "1", "b": "2"})
    ).SerializeToString() + _unknown_field(50, b"from-a-newer-kubelet")
    fake.script["ListContainers"] = Reply(response=b"\x0a\x02\x0a\x00" + _unknown_field(77, b"x"))
    answer = _call(proxy.endpoint, RUNTIME + "ListContainers", request)
    assert fake.calls("ListContainers")[-1].request == request
    assert answer == b"\x0a\x02\x0a\x00" + _unknown_field(77, b"x")


def test_intercepted_call_without_hooks_is_byte_identical(
    fake: FakeRuntime, proxy: CrihookProcess
) -> None:
    config = api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="app"),
        labels={"z": "1", "a": "2", "m": "3"},
        envs=[api_pb2.KeyValue(key="B", value=b"\xff\xfe not utf-8"), api_pb2.KeyValue(key="A")],
    )
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id="p1", config=config, sandbox_config=SANDBOX
    ).SerializeToString() + _unknown_field(60, b"newer")
    fake.script["CreateContainer"] = Reply(
        response=api_pb2.CreateContainerResponse(container_id="c1").SerializeToString()
    )
    answer = _call(proxy.endpoint, RUNTIME + "CreateContainer", request)
    assert fake.calls("CreateContainer")[-1].request == request
    assert api_pb2.CreateContainerResponse.FromString(answer).container_id == "c1"


def test_unknown_method_is_forwarded_not_unimplemented(
    fake: FakeRuntime, proxy: CrihookProcess
) -> None:
    fake.script["FutureMethod"] = Reply(response=b"future-answer")
    assert _call(proxy.endpoint, RUNTIME + "FutureMethod", b"q") == b"future-answer"
    assert fake.calls("FutureMethod")[-1].request == b"q"


def test_image_service_goes_to_a_separate_image_endpoint(fake: FakeRuntime) -> None:
    images = FakeRuntime(short_tmpdir("fi-") / "img.sock").start()
    try:
        images.script["ListImages"] = Reply(response=b"\x0a\x00")
        with CrihookProcess(fake.endpoint, args=["--image-endpoint", images.endpoint]) as proc:
            assert _call(proc.endpoint, IMAGE + "ListImages", b"") == b"\x0a\x00"
            _call(proc.endpoint, RUNTIME + "ListContainers", b"")
        assert len(images.calls("ListImages")) == 1
        assert fake.calls("ListImages") == []
        # (crihook's own start-up reconcile also lists containers; ours carried a 10 s deadline)
        listed = [c.time_remaining for c in fake.calls("ListContainers")]
        assert any(t is not None and t <= 10.5 for t in listed), listed  # grpc rounds up
    finally:
        images.stop()


def test_server_streaming_method_is_forwarded_as_a_stream(
    fake: FakeRuntime, proxy: CrihookProcess
) -> None:
    events = [
        api_pb2.ContainerEventResponse(container_id=f"c{i}").SerializeToString() for i in range(5)
    ]
    fake.script["GetContainerEvents"] = Reply(stream=events)
    with grpc.insecure_channel(proxy.endpoint) as channel:
        got = list(channel.unary_stream(RUNTIME + "GetContainerEvents")(b"", timeout=60))
    assert got == events


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.NOT_FOUND, 'container "abc" not found'),
        (grpc.StatusCode.UNIMPLEMENTED, "not implemented by this runtime"),
        (grpc.StatusCode.FAILED_PRECONDITION, "sandbox is not ready"),
    ],
    ids=["not-found", "unimplemented", "failed-precondition"],
)
@pytest.mark.parametrize("method", ["ContainerStatus", "StartContainer"], ids=["raw", "pipeline"])
def test_runtime_status_reaches_kubelet_unchanged(
    fake: FakeRuntime, proxy: CrihookProcess, method: str, code: grpc.StatusCode, details: str
) -> None:
    fake.script[method] = Reply(code=code, details=details)
    with pytest.raises(grpc.RpcError) as err:
        _call(proxy.endpoint, RUNTIME + method, _minimal(method))
    assert (err.value.code(), err.value.details()) == (code, details)


@pytest.mark.parametrize("method", ["ListContainers", "CreateContainer"], ids=["raw", "pipeline"])
def test_kubelet_deadline_reaches_the_runtime(
    fake: FakeRuntime, proxy: CrihookProcess, method: str
) -> None:
    _call(proxy.endpoint, RUNTIME + method, _minimal(method), timeout=7)
    seen = fake.calls(method)[-1].time_remaining
    assert seen is not None and 5.5 < seen <= 7.3  # grpc-timeout is rounded up


@pytest.mark.parametrize("method", ["ListContainers", "CreateContainer"], ids=["raw", "pipeline"])
def test_expired_deadline_is_deadline_exceeded(
    fake: FakeRuntime, proxy: CrihookProcess, method: str
) -> None:
    fake.script[method] = Reply(delay=PATIENCE)  # the runtime would answer only after this
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        _call(proxy.endpoint, RUNTIME + method, _minimal(method), timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Not a timing bound: the answer came before the runtime's, so from the deadline.
    assert time.monotonic() - started < PATIENCE
    wait_for(lambda: method in fake.cancelled, PATIENCE, "the runtime's call to be cancelled")


def test_metadata_is_forwarded(fake: FakeRuntime, proxy: CrihookProcess) -> None:
    _call(proxy.endpoint, RUNTIME + "Version", b"", metadata=(("x-trace-id", "t-42"),))
    assert ("x-trace-id", "t-42") in fake.calls("Version")[-1].metadata


def test_runtime_absent_at_start_then_appearing() -> None:
    runtime_dir = short_tmpdir("late-")
    late = FakeRuntime(runtime_dir / "rt.sock")
    with CrihookProcess(late.endpoint, args=[]).start(ready=False) as proc:
        with pytest.raises(grpc.RpcError) as err:
            _call(proc.endpoint, RUNTIME + "Version", b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "crihook: waiting for the runtime" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            _call(proc.endpoint, RUNTIME + "CreateContainer", b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        late.start()
        try:
            wait_for(lambda: _answers(proc.endpoint), PATIENCE, "crihook to find the late runtime")
            assert proc.proc is not None and proc.proc.poll() is None
        finally:
            late.stop()


def _answers(endpoint: str) -> bool:
    try:
        _call(endpoint, RUNTIME + "Version", b"", timeout=2)
        return True
    except grpc.RpcError:
        return False


def test_sigterm_lets_calls_in_flight_finish_then_exits_0(fake: FakeRuntime) -> None:
    fake.script["ExecSync"] = Reply(response=b"\x0a\x02ok", delay=1.5)
    proc = CrihookProcess(fake.endpoint).start()
    results: list[object] = []

    def slow_call() -> None:
        try:
            results.append(_call(proc.endpoint, RUNTIME + "ExecSync", b"", timeout=60))
        except grpc.RpcError as exc:
            results.append(exc.code())

    threads = [threading.Thread(target=slow_call) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(fake.calls("ExecSync")) == 4, PATIENCE, "calls to reach the runtime")
    proc.signal(signal.SIGTERM)
    wait_for(lambda: "stopping: letting calls in flight finish" in proc.log(), PATIENCE, "stop")
    with pytest.raises(grpc.RpcError):  # no new calls once stopping
        _call(proc.endpoint, RUNTIME + "Version", b"", timeout=1)
    for t in threads:
        t.join(PATIENCE)
    assert results == [b"\x0a\x02ok"] * 4
    assert proc.stop() == 0
    assert not proc.socket_path.exists()
    # The last status it wrote says so: `crihook state` does not show it ready.
    shown = subprocess.run(
        [sys.executable, "-m", "crihook", "state", "--state-dir", str(proc.state_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown.startswith("crihook is not running: it stopped at")
    assert "ready=False" in shown


def test_stale_socket_file_is_replaced(fake: FakeRuntime) -> None:
    workdir = short_tmpdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(workdir / "crihook.sock"))
    stale.close()  # the file stays, nobody listens: what a crashed process leaves
    with CrihookProcess(fake.endpoint, workdir=workdir) as proc:
        assert _call(proc.endpoint, RUNTIME + "Version", b"") == b""
        assert oct(proc.socket_path.stat().st_mode & 0o777) == oct(0o660)


def test_the_socket_listens_before_start_up_and_a_call_made_then_is_served(
    fake: FakeRuntime,
) -> None:
    """The socket is bound before crihook loads anything (proxy/early.py): while a hook's
    start still holds start-up, a client connects, and its call is answered once crihook
    serves (UNAVAILABLE until ready, or the runtime's answer), not refused."""
    workdir = short_tmpdir()
    release, waiting = workdir / "release", workdir / "waiting"
    config = (
        '[hooks]\norder = ["10-wait"]\n[hooks.wait]\n'
        'module = "tests.lab.sample_hooks:WaitAtStart"\n'
        f'until = "{release}"\nnote = "{waiting}"\n'
    )
    proc = CrihookProcess(fake.endpoint, workdir, config=config, hooks=None, data_path="h2")
    proc.start(wait=False)
    wait_for(waiting.exists, PATIENCE, "the hook's start")
    assert proc.socket_path.exists()
    answers: list[object] = []

    def version() -> None:
        try:
            answers.append(_call(proc.endpoint, RUNTIME + "Version", b"", timeout=PATIENCE))
        except grpc.RpcError as exc:
            answers.append((exc.code(), (exc.details() or "").split(":")[0]))

    caller = threading.Thread(target=version)
    caller.start()
    release.touch()
    caller.join(PATIENCE)
    assert answers in ([b""], [(grpc.StatusCode.UNAVAILABLE, "crihook")])
    proc.stop()


def test_live_socket_is_refused_with_a_clear_error(fake: FakeRuntime) -> None:
    workdir = short_tmpdir()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(workdir / "crihook.sock"))
    live.listen(1)
    try:
        proc = CrihookProcess(fake.endpoint, workdir=workdir).start(wait=False)
        assert proc.proc is not None
        assert proc.proc.wait(PATIENCE) == 1
        assert "in use by a live process" in proc.log()
    finally:
        live.close()


def test_non_socket_file_at_listen_path_is_refused(fake: FakeRuntime) -> None:
    workdir = short_tmpdir()
    (workdir / "crihook.sock").write_text("not a socket")
    proc = CrihookProcess(fake.endpoint, workdir=workdir).start(wait=False)
    assert proc.proc is not None and proc.proc.wait(PATIENCE) == 1
    assert "is not a socket" in proc.log()
    assert (workdir / "crihook.sock").read_text() == "not a socket"


@pytest.mark.parametrize(
    ("toml", "flags", "named"),
    [
        ('listen = "relative.sock"', [], "listen:"),
        ('log_format = "xml"', [], "log_format:"),
        ("socket_mode = 660", [], "socket_mode:"),
        ("shutdown_grace_seconds = -1", [], "shutdown_grace_seconds:"),
        ("nonsense = 1", [], "nonsense: unknown setting"),
        ('[hooks]\norder = ["anotate"]', [], "[hooks] order:"),
        (
            '[hooks]\norder = ["10-annotate"]\n[hooks.annotate]\nfailure_policy = "maybe"',
            [],
            "[hooks.annotate] failure_policy:",
        ),
        (
            '[hooks]\norder = ["10-annotate"]\n[hooks.annotate]\ntimeout_ms = "fast"',
            [],
            "[hooks.annotate] timeout_ms:",
        ),
        ('[hooks]\norder = ["10-annotate"]', [], "[hooks.annotate]: annotate: option 'key'"),
        ("listen = ", [], "--config:"),
        ("", ["--runtime-endpoint", "tcp://1.2.3.4:1"], "--runtime-endpoint:"),
        ("", ["--hooks", "cpusett"], "--hooks:"),
        ("", ["--log-level", "loud"], "--log-level"),
        ("", ["--state-dir", "rel/dir"], "--state-dir:"),
        ("", ["--sysfs-root", "/nonexistent-sysfs"], "/nonexistent-sysfs/devices/system/cpu"),
    ],
    ids=[
        "listen",
        "log-format",
        "socket-mode-int",
        "grace",
        "unknown-key",
        "hook-name",
        "failure-policy",
        "timeout",
        "hook-options",
        "toml-syntax",
        "endpoint-flag",
        "hooks-flag",
        "log-level-flag",
        "state-dir-flag",
        "sysfs-root-unreadable",
    ],
)
def test_bad_config_is_one_line_naming_the_setting_and_exit_2(
    toml: str, flags: list[str], named: str
) -> None:
    workdir = short_tmpdir()
    (workdir / "c.toml").write_text(toml)
    cmd = [
        sys.executable,
        "-m",
        "crihook",
        "serve",
        "--config",
        str(workdir / "c.toml"),
        "--listen",
        f"unix://{workdir}/c.sock",
        "--state-dir",
        str(workdir / "s"),
        *flags,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert named in lines[0]
    assert not (workdir / "c.sock").exists()


def test_missing_explicit_config_file_is_an_error() -> None:
    workdir = short_tmpdir()
    done = subprocess.run(
        [sys.executable, "-m", "crihook", "serve", "--config", str(workdir / "absent.toml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "does not exist" in done.stderr
