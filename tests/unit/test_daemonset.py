"""deploy/daemonset.yaml: well-formed, its config loads with crihook's parser, the host paths
crihook needs are mounted where the config says, and the pod exempts itself."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from crihook.proxy.cli import build_parser
from crihook.proxy.config import Settings, settings_from_toml
from tests.unit.test_deploy_files import REPO

MANIFEST = REPO / "deploy" / "daemonset.yaml"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["ConfigMap", "DaemonSet"]
    assert by_kind["DaemonSet"]["apiVersion"] == "apps/v1"
    return by_kind


@pytest.fixture(scope="module")
def pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = objects["DaemonSet"]["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def settings(objects: dict[str, dict[str, Any]]) -> Settings:
    return settings_from_toml(tomllib.loads(objects["ConfigMap"]["data"]["config.toml"]))


def mounts(pod: dict[str, Any]) -> dict[PurePosixPath, str]:
    """Where each volume is mounted in the container: mount path → host path (or
    `configMap:<name>`)."""
    volumes = {}
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            volumes[volume["name"]] = volume["hostPath"]["path"]
        else:
            volumes[volume["name"]] = f"configMap:{volume['configMap']['name']}"
    (container,) = pod["containers"]
    out = {}
    for mount in container["volumeMounts"]:
        assert mount["name"] in volumes, f"volumeMount {mount['name']} names no volume"
        out[PurePosixPath(mount["mountPath"])] = volumes[mount["name"]]
    return out


def test_selector_matches_the_pod(objects: dict[str, dict[str, Any]]) -> None:
    spec = objects["DaemonSet"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    # kubelet cannot replace this pod while it is down: never roll it on its own.
    assert spec["updateStrategy"]["type"] == "OnDelete"


def test_the_config_is_crihooks_own_and_the_pod_is_exempt(
    objects: dict[str, dict[str, Any]], settings: Settings
) -> None:
    daemonset = objects["DaemonSet"]
    assert objects["ConfigMap"]["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    chain = settings.chain
    assert daemonset["metadata"]["namespace"] in chain.exempt_namespaces
    assert chain.exempt_labels and chain.exempt_labels.items() <= labels.items()


def test_host_paths_are_where_the_config_says(pod: dict[str, Any], settings: Settings) -> None:
    mounted = mounts(pod)

    def host_path_of(path: PurePosixPath) -> PurePosixPath:
        """The host path behind a container path, through the mount holding it (same place)."""
        holder = max(
            (m for m in mounted if path == m or m in path.parents),
            key=lambda m: len(m.parts),
            default=None,
        )
        assert holder is not None, f"{path} is not on a mounted volume"
        host = mounted[holder]
        assert not host.startswith("configMap:"), f"{path} is in a ConfigMap, not the host"
        assert PurePosixPath(host) == holder, f"{holder} is mounted from {host}, not itself"
        return PurePosixPath(host) / path.relative_to(holder)

    socket = PurePosixPath(settings.server.listen.removeprefix("unix://"))
    runtime = PurePosixPath(settings.runtime.endpoint.removeprefix("unix://"))
    host_path_of(socket.parent)
    host_path_of(runtime.parent)
    host_path_of(PurePosixPath(settings.state_dir))
    host_path_of(PurePosixPath(settings.chain.plugins_dir))
    host_path_of(PurePosixPath(settings.node.sysfs_root) / "devices/system/cpu")
    host_path_of(PurePosixPath(settings.node.sysfs_root) / "fs/cgroup")
    host_path_of(PurePosixPath("/var/run/netns"))
    netns = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "netns")
    # Namespaces containerd creates after the pod started must show up inside it.
    assert netns["mountPropagation"] == "HostToContainer"
    # The devices hook's staging mounts, made inside the pod, must reach the runtime.
    staging = PurePosixPath(settings.node.staging_dir)
    assert host_path_of(staging) == staging
    holder = max((m for m in mounted if m in staging.parents), key=lambda m: len(m.parts))
    volume = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == str(holder))
    assert volume["mountPropagation"] == "Bidirectional"


def test_the_command_serves_with_the_configmap(pod: dict[str, Any]) -> None:
    (container,) = pod["containers"]
    script = container["command"][-1]
    serve = next(line for line in script.splitlines() if "crihook serve" in line)
    argv = shlex.split(serve.replace("&", ""))
    parsed = build_parser().parse_args(argv[1:])
    assert parsed.command == "serve"
    config = PurePosixPath(parsed.config)
    assert mounts(pod)[config.parent] == "configMap:crihook-config"
    assert config.name == "config.toml"


def test_the_pod_can_do_what_the_hooks_need(pod: dict[str, Any], settings: Settings) -> None:
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["containers"][0]["securityContext"]["privileged"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    # crihook's drain (shutdown_grace_seconds) must end before kubelet's SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > settings.server.shutdown_grace_seconds


def test_the_container_restarts_crihook_and_stops_on_sigterm(
    pod: dict[str, Any], tmp_path: Path
) -> None:
    # A stand-in crihook: the first run exits (a crash), the second serves until SIGTERM.
    runs = tmp_path / "runs"
    fake = tmp_path / "bin" / "crihook"
    fake.parent.mkdir()
    # (The trap is set before the run is written: the test signals once it sees the run.)
    fake.write_text(
        "#!/bin/sh\n"
        "trap 'echo stopped >> " + str(runs) + "; exit 0' TERM\n"
        f'echo "$@" >> {runs}\n'
        f'if [ "$(wc -l < {runs})" -eq 1 ]; then exit 3; fi\n'
        "while :; do sleep 0.05; done\n"
    )
    fake.chmod(0o755)
    script = pod["containers"][0]["command"]
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    shell = subprocess.Popen(script, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (runs.exists() and len(runs.read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline, "crihook was not restarted"
            time.sleep(0.05)
        shell.send_signal(signal.SIGTERM)
        _, err = shell.communicate(timeout=20)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()
    config = "serve --config /etc/crihook/config/config.toml"
    assert runs.read_text().splitlines() == [config, config, "stopped"]
    assert "crihook exited with 3; restarting it in 1 s" in err
    assert shell.returncode == 0
