"""crihook's log: one line per intercepted call, and never a secret, at any level.

A real crihook at DEBUG (plain and JSON, applying and in dry-run) fronts the memory runtime;
pods carry secrets where kubelet puts them (a container's env values) and where the devices
hook reads env values to inject (its env annotation), and one asks for a variable the policy
refuses. Whatever crihook logs, the secret values never appear on its stderr."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime

SECRETS = ("s3cr3t-kubelet-env", "s3cr3t-injected-env", "s3cr3t-refused-env")
POLICY = '[hooks.devices]\nnamespaces = ["default"]\nenv = ["HTTP_PROXY"]\n'


@pytest.fixture(params=["plain", "json", "json-dry-run"])
def logged(request: pytest.FixtureRequest) -> Iterator[tuple[MemoryRuntime, CrihookProcess]]:
    workdir = short_tmpdir("lg-")
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    fmt, _, dry = str(request.param).partition("-")
    args = ["--log-format", fmt, "--log-level", "debug"] + (["--dry-run"] if dry else [])
    proc = CrihookProcess(runtime.endpoint, workdir, args=args, config=POLICY, hooks="devices")
    try:
        yield runtime, proc.start()
    finally:
        proc.kill()
        runtime.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _pod(stub: api_pb2_grpc.RuntimeServiceStub, name: str, env_name: str, secret: str) -> None:
    app = ContainerSpec(name="app", env=[("DB_PASSWORD", SECRETS[0]), ("MODE", "plain")])
    annotation = json.dumps([{"name": env_name, "value": f"http://user:{secret}@proxy:3128"}])
    spec = PodSpec(name=name, containers=[app], annotations={"env.crihook.io/pod": annotation})
    sandbox = stub.RunPodSandbox(
        api_pb2.RunPodSandboxRequest(config=sandbox_config(spec)), timeout=60
    ).pod_sandbox_id
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        config=container_config(spec, app, node_memory=64 << 30),
        sandbox_config=sandbox_config(spec),
    )
    cid = stub.CreateContainer(request, timeout=60).container_id
    stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=60)


def test_no_env_value_or_secret_reaches_the_log_at_debug(
    logged: tuple[MemoryRuntime, CrihookProcess],
) -> None:
    runtime, proc = logged
    with grpc.insecure_channel(proc.endpoint) as channel:
        stub = api_pb2_grpc.RuntimeServiceStub(channel)
        _pod(stub, "allowed", "HTTP_PROXY", SECRETS[1])
        with pytest.raises(grpc.RpcError) as refused:
            _pod(stub, "refused", "AWS_PROXY", SECRETS[2])
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert proc.stop() == 0
    log = proc.log()
    for secret in SECRETS:
        assert secret not in log
    # The runtime did get them: the test would pass for nothing otherwise.
    envs = [
        {kv.key: kv.value.decode() for kv in c.config.envs} for c in runtime.containers.values()
    ]  # fmt: skip
    assert envs and envs[0]["DB_PASSWORD"] == SECRETS[0]
    if "--dry-run" not in proc.args:
        assert envs[0]["HTTP_PROXY"] == f"http://user:{SECRETS[1]}@proxy:3128"
    # What was logged about the env: its name, never its value.
    assert "env 'HTTP_PROXY'=<redacted>" in log
    # One line per intercepted call, with the pod, container, hooks, duration and outcome.
    calls = _call_lines(log, "--log-format" in proc.args and "json" in proc.args)
    assert [c["method"] for c in calls] == [
        "RunPodSandbox", "CreateContainer", "StartContainer", "RunPodSandbox", "CreateContainer",
    ]  # fmt: skip
    created, refused_line = calls[1], calls[4]
    assert created["pod"] == "default/allowed" and created["container"] == "app"
    assert created["hooks"].startswith("50-devices/pre:")
    assert float(created["elapsed_ms"]) > 0
    # the runtime's part of it: the rest is crihook's; a call it refused never reached it
    assert 0 < float(created["runtime_ms"]) <= float(created["elapsed_ms"])
    assert "runtime_ms" not in refused_line
    assert created["outcome"] in ("adjusted", "ok")  # ok: dry-run forwards it unchanged
    assert refused_line["outcome"] == "PERMISSION_DENIED"
    assert refused_line["origin"] == "crihook"


def _call_lines(log: str, json_format: bool) -> list[dict[str, str]]:
    """The call log's lines, as dicts."""
    out = []
    for line in log.splitlines():
        if json_format:
            if line.startswith("{"):
                doc = json.loads(line)
                if doc["logger"] == "crihook.proxy.call_log":
                    out.append({k: str(v) for k, v in doc.items()})
        elif " crihook.proxy.call_log: " in line:
            fields = line.split(" crihook.proxy.call_log: ", 1)[1]
            out.append(dict(p.split("=", 1) for p in fields.split(" ") if "=" in p))
    return out
