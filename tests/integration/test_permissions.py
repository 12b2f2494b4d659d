"""Hook permissions, validators and required hooks in a real crihook process, in front of a
recording fake runtime (so "nothing was forwarded" is exact), with the annotate example
plugin as its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fake_runtime import FakeRuntime, Reply
from tests.lab.plugin_proc import KEY, Plugin

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
CONTAINER_ID = "c0ffee" * 10 + "abcd"


@pytest.fixture
def fake() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(short_tmpdir("fr-") / "rt.sock").start()
    runtime.script["CreateContainer"] = Reply(
        response=api_pb2.CreateContainerResponse(container_id=CONTAINER_ID).SerializeToString()
    )
    yield runtime
    runtime.stop()


def create_request(
    pod_annotations: dict[str, str] | None = None, namespace: str = "prod", pod: str = "p1"
) -> api_pb2.CreateContainerRequest:
    sandbox = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=f"web-{pod}", uid=f"u-{pod}", namespace=namespace),
        annotations=pod_annotations or {},
    )
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id=pod,
        config=api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name="app"),
            image=api_pb2.ImageSpec(image="busybox"),
        ),
        sandbox_config=sandbox,
    )


def create(proc: CrihookProcess, request: api_pb2.CreateContainerRequest) -> None:
    with grpc.insecure_channel(proc.endpoint) as channel:
        channel.unary_unary(CREATE)(request.SerializeToString(), timeout=60)


def refused(proc: CrihookProcess, request: api_pb2.CreateContainerRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        create(proc, request)
    return info.value


def forwarded(fake: FakeRuntime) -> list[api_pb2.CreateContainerRequest]:
    return [
        api_pb2.CreateContainerRequest.FromString(c.request) for c in fake.calls("CreateContainer")
    ]


def state(proc: CrihookProcess, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "crihook", "state", "--state-dir", str(proc.state_dir), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, check=True)


def hook_status(proc: CrihookProcess, name: str) -> dict[str, Any]:
    """The hook's entry in crihook's status file (empty until crihook has written it)."""
    for hook in _hooks(proc):
        if hook["name"] == name:
            return hook
    return {}


def _hooks(proc: CrihookProcess) -> list[dict[str, Any]]:
    status = json.loads(state(proc, "--json").stdout).get("status") or {}
    return status.get("hooks", [])  # type: ignore[no-any-return]


def wait_counter(proc: CrihookProcess, name: str, counter: str, value: int) -> None:
    wait_for(
        lambda: hook_status(proc, name).get("counters", {}).get(counter) == value,
        PATIENCE,
        f"{name} {counter} == {value}",
    )


def wait_connected(proc: CrihookProcess, name: str) -> None:
    wait_for(
        lambda: hook_status(proc, name).get("connected"),
        PATIENCE,
        f"{name} connected\n{proc.log()}",
    )


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    p = Plugin(key="other.io/x").start()
    yield p
    p.stop()


def _with_plugin(
    fake: FakeRuntime, plugin: Plugin, policy: str, **dropin: object
) -> CrihookProcess:
    proc = CrihookProcess(fake.endpoint)
    (proc.plugins_dir / "annotate.toml").write_text(plugin.dropin("50-annotate", policy, **dropin))
    proc.start()
    try:
        wait_connected(proc, "50-annotate")
    except BaseException:
        proc.kill()
        raise
    return proc


def test_a_plugin_denied_a_field_fails_the_call_under_fail(
    fake: FakeRuntime, plugin: Plugin
) -> None:
    with _with_plugin(fake, plugin, "fail", allow=["label", "cpuset_cpus"]) as proc:
        error = refused(proc, create_request())
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'50-annotate'" in error.details() and "annotation 'other.io/x'" in error.details()
        assert forwarded(fake) == []
        wait_counter(proc, "50-annotate", "not_permitted", 1)
        assert hook_status(proc, "50-annotate")["permissions"] == [["cpuset_cpus", "label"]]


def test_under_ignore_the_call_goes_on_without_the_plugins_adjustment(
    fake: FakeRuntime, plugin: Plugin
) -> None:
    with _with_plugin(fake, plugin, "ignore", allow=["label"]) as proc:
        create(proc, create_request())
        [sent] = forwarded(fake)
        assert sent == create_request()  # byte for byte what kubelet sent
        wait_counter(proc, "50-annotate", "not_permitted", 1)
        assert hook_status(proc, "50-annotate")["counters"]["ignored"] == 1
        shown = state(proc).stdout
        assert "may set: label" in shown
        assert "REFUSED annotation 'other.io/x'" in shown and "(asked by 50-annotate" in shown


def test_a_narrowed_annotation_grant_refuses_another_key(fake: FakeRuntime) -> None:
    allowed = Plugin(key=KEY).start()
    other = Plugin(key="other.io/x").start()
    try:
        proc = CrihookProcess(fake.endpoint)
        for name, plugin in (("50-mine", allowed), ("60-theirs", other)):
            text = plugin.dropin(name, "fail", allow=["annotation:example.com/*"])
            (proc.plugins_dir / f"{name}.toml").write_text(text)
        with proc.start():
            wait_connected(proc, "50-mine")
            wait_connected(proc, "60-theirs")
            error = refused(proc, create_request())
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "'60-theirs'" in error.details() and "other.io/x" in error.details()
            assert "annotation:example.com/*" in error.details()
            assert forwarded(fake) == []
            # without the other plugin the granted key goes through
            (proc.plugins_dir / "60-theirs.toml").unlink()  # drop-ins are rescanned each second
            wait_for(
                lambda: "60-theirs" not in {h["name"] for h in _hooks(proc)},
                PATIENCE,
                "theirs unloaded",
            )
            create(proc, create_request())
            [sent] = forwarded(fake)
            assert sent.config.annotations[KEY] == "by-plugin"
    finally:
        allowed.stop()
        other.stop()


GUARDED = """
[hooks]
order = ["40-mounter", "90-guard"]
[hooks.mounter]
module = "tests.lab.sample_hooks:AddMount"
allow = ["mount:/host-etc"]
at = "/host-etc"
host = "/etc"
[hooks.guard]
host_paths = ["/var/lib/kubelet/*"]
"""


def test_a_validator_refuses_another_hooks_change_and_nothing_is_forwarded(
    fake: FakeRuntime,
) -> None:
    with CrihookProcess(fake.endpoint, config=GUARDED, hooks=None).start() as proc:
        error = refused(proc, create_request())
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = error.details()
        assert "guard" in details and "host path /etc" in details, details
        assert "asked by 40-mounter" in details, details
        assert forwarded(fake) == []
        wait_counter(proc, "90-guard", "rejected", 1)


def test_a_validator_also_refuses_what_kubelet_asked(fake: FakeRuntime) -> None:
    config = '[hooks]\norder = ["90-guard"]\n'
    request = create_request()
    request.config.linux.security_context.privileged = True
    with CrihookProcess(fake.endpoint, config=config, hooks=None).start() as proc:
        error = refused(proc, request)
        assert "privileged containers are not allowed in namespace 'prod'" in error.details()
        assert forwarded(fake) == []
        request.sandbox_config.metadata.namespace = "kube-system"
        # the guard's default allows no privileged container anywhere
        assert refused(proc, request).code() == grpc.StatusCode.FAILED_PRECONDITION
        create(proc, create_request())  # an ordinary container goes through, untouched
        assert forwarded(fake) == [create_request()]


@pytest.mark.parametrize("required_by", ["config", "pod"])
def test_a_required_plugin_that_is_down_fails_the_call_whatever_its_policy(
    fake: FakeRuntime, plugin: Plugin, required_by: str
) -> None:
    config = '[hooks]\nrequired_hooks = ["annotate"]\n' if required_by == "config" else ""
    request = create_request(
        {"hooks.crihook.io/required": "annotate"} if required_by == "pod" else None
    )
    proc = CrihookProcess(fake.endpoint, config=config or None)
    (proc.plugins_dir / "annotate.toml").write_text(plugin.dropin("50-annotate", "ignore"))
    with proc.start():
        wait_connected(proc, "50-annotate")
        create(proc, request)  # while it is up, the call goes through with its annotation
        assert forwarded(fake)[-1].config.annotations["other.io/x"] == "by-plugin"
        plugin.stop()
        wait_for(lambda: not hook_status(proc, "50-annotate")["connected"], PATIENCE, "plugin down")
        error = refused(proc, request)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "'50-annotate' is required by" in error.details(), error.details()
        assert len(forwarded(fake)) == 1
        # another pod, which does not require it, is served without it (policy ignore);
        # unless the configuration requires it
        if required_by == "pod":
            create(proc, create_request(pod="p2"))
            assert len(forwarded(fake)) == 2
        else:
            assert refused(proc, create_request(pod="p2")).code() == error.code()


def test_a_pod_cannot_exempt_itself_from_a_hook_the_config_requires(
    fake: FakeRuntime, plugin: Plugin
) -> None:
    config = '[hooks]\nrequired_hooks = ["annotate"]\nexempt_namespaces = ["kube-system"]\n'
    proc = CrihookProcess(fake.endpoint, config=config)
    (proc.plugins_dir / "annotate.toml").write_text(plugin.dropin("50-annotate", "ignore"))
    with proc.start():
        wait_connected(proc, "50-annotate")
        create(proc, create_request(namespace="kube-system"))
        assert forwarded(fake)[-1].config.annotations["other.io/x"] == "by-plugin"


def test_a_required_hook_missing_from_the_chain_fails_shaping_calls_not_teardown(
    fake: FakeRuntime,
) -> None:
    config = '[hooks]\nrequired_hooks = ["annotate"]\n'
    with CrihookProcess(fake.endpoint, config=config).start() as proc:
        error = refused(proc, create_request())
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "annotate are not in the chain" in error.details(), error.details()
        assert forwarded(fake) == []
        stop = api_pb2.StopContainerRequest(container_id=CONTAINER_ID).SerializeToString()
        with grpc.insecure_channel(proc.endpoint) as channel:
            channel.unary_unary("/runtime.v1.RuntimeService/StopContainer")(stop, timeout=60)
        assert [c.request for c in fake.calls("StopContainer")] == [stop]
