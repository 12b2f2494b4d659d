"""The example validator (hooks/examples/guard): privileged containers and host paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.examples.guard import GuardHook, GuardOptions, parse_options, refusal
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import Event, HookContext, Reject, Stage
from crihook.hooks.spec.views import container_view_from_config, pod_view_from_config


def ctx_for(
    mounts: list[tuple[str, str]], privileged: bool = False, namespace: str = "prod"
) -> HookContext:
    sandbox = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="web", uid="u1", namespace=namespace)
    )
    config = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="app"))
    config.linux.security_context.privileged = privileged
    for container_path, host_path in mounts:
        config.mounts.add(container_path=container_path, host_path=host_path)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id="sb1", config=config, sandbox_config=sandbox
    )
    pod = pod_view_from_config("sb1", sandbox)
    container = container_view_from_config("", pod, config)
    return HookContext(
        Event.CREATE_CONTAINER, Stage.VALIDATE, pod, container, request, None, MemoryState(), 1.0
    )


async def test_kubelets_own_mounts_pass_and_others_are_refused() -> None:
    guard = GuardHook()
    ok = ctx_for([("/var/run/secrets/x", "/var/lib/kubelet/pods/u1/volumes/x")])
    assert await guard.validate_create_container(ok) is None
    with pytest.raises(Reject, match=r"host path /etc .*asked by kubelet"):
        await guard.validate_create_container(ctx_for([("/host", "/etc")]))


async def test_the_refusal_names_the_hook_that_asked() -> None:
    ctx = ctx_for([("/host", "/etc")])
    ctx.owners = {"mount '/host'": "40-mounter"}
    with pytest.raises(Reject, match="asked by 40-mounter"):
        await GuardHook().validate_create_container(ctx)


async def test_a_symlink_inside_an_allowed_directory_cannot_reach_outside(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    os.symlink("/etc", allowed / "escape")
    (allowed / "real").mkdir()
    guard = GuardHook({"host_paths": [f"{allowed}/*"]})
    assert await guard.validate_create_container(ctx_for([("/d", str(allowed / "real"))])) is None
    with pytest.raises(Reject, match="host path /etc "):
        await guard.validate_create_container(ctx_for([("/d", str(allowed / "escape"))]))
    dotdot = f"{allowed}/real/../../outside"  # matches the glob until resolved
    with pytest.raises(Reject, match=f"host path {tmp_path}/outside "):
        await guard.validate_create_container(ctx_for([("/d", dotdot)]))


@pytest.mark.parametrize(
    ("namespace", "allowed", "refused"),
    [("prod", (), True), ("kube-system", (), True), ("kube-system", ("kube-system",), False)],
)
async def test_privileged_only_where_allowed(
    namespace: str, allowed: tuple[str, ...], refused: bool
) -> None:
    guard = GuardHook({"privileged_namespaces": list(allowed)})
    ctx = ctx_for([], privileged=True, namespace=namespace)
    if refused:
        with pytest.raises(
            Reject, match=rf"privileged containers are not allowed in .*{namespace}"
        ):
            await guard.validate_create_container(ctx)
    else:
        assert await guard.validate_create_container(ctx) is None


def test_refusal_is_none_for_an_ordinary_container() -> None:
    assert refusal(GuardOptions(), "prod", False, [], {}) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"paths": []}, "unknown option"),
        ({"host_paths": "/data"}, "must be a list of strings"),
        ({"host_paths": ["data/*"]}, "not an absolute path glob"),
        ({"privileged_namespaces": [1]}, "must be a list of strings"),
    ],
)
def test_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options(options)
