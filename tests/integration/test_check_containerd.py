"""`crihook check` against the lab's real containerd, 1.6 and 2.x: the version and cgroup
driver each reports (2.x through RuntimeConfig, 1.6 through Status's verbose info), the node's
cgroup version, kubelet fixtures, and the exit codes, through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab import cgroups
from tests.lab.peers import CRIO_VERSION
from tests.lab.runtime_lab import RuntimeLab

pytestmark = [pytest.mark.containerd, pytest.mark.both_containerds, pytest.mark.on_crio]

CONFIGS = Path(__file__).parents[1] / "unit" / "kubelet_configs"


def crihook_check(*args: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "crihook", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == ""
    return done.returncode, done.stdout.splitlines()


def runtime_version(containerd: RuntimeLab) -> str:
    with grpc.insecure_channel(containerd.endpoint) as channel:
        answer = api_pb2_grpc.RuntimeServiceStub(channel).Version(api_pb2.VersionRequest())
    return answer.runtime_version


def test_a_ready_node_is_exit_0(containerd: RuntimeLab, tmp_path: Path) -> None:
    code, lines = crihook_check(
        "--runtime-endpoint", containerd.endpoint, "--image-endpoint", containerd.endpoint,
        "--plugins-dir", str(tmp_path), "--hooks", "cpuset,numa,oom",
        "--kubelet-config", str(CONFIGS / "crihook-ready.yaml"),
    )  # fmt: skip
    version = runtime_version(containerd)
    name, prefix = {
        "containerd-1.6": ("containerd", "1.6."),
        "containerd-2": ("containerd", "2."),
        "crio": ("cri-o", CRIO_VERSION[1:]),
    }[containerd.runtime]
    assert version.startswith(prefix)
    assert f"ok       runtime: {name} {version} (CRI v1) at {containerd.endpoint}" in lines
    # The lab's runc runs with SystemdCgroup = false, CRI-O with cgroup_manager cgroupfs;
    # containerd 2.x and CRI-O say so through RuntimeConfig.
    source = (
        "Status info, runtime 'runc' SystemdCgroup"
        if containerd.runtime == "containerd-1.6"
        else "CRI RuntimeConfig"
    )
    assert f"ok       cgroup: driver cgroupfs ({source})" in lines
    assert f"ok       cgroup: version {2 if cgroups.is_cgroup_v2() else 1}" in lines
    assert [line for line in lines if line.startswith("ok       hook ")] == [
        "ok       hook 20-cpuset: builds",
        "ok       hook 30-numa: builds",
        "ok       hook 40-oom: builds",
    ]
    assert f"ok       images: image service at {containerd.endpoint}" in lines
    assert "ok       kubelet: runtime endpoint is crihook (unix:///run/crihook/crihook.sock)" in (
        lines
    )
    assert not [line for line in lines if line.startswith(("warning", "error"))], lines
    assert (code, lines[-1]) == (0, "crihook check: 0 error(s), 0 warning(s) (exit 0)")


def test_kubelet_static_managers_and_a_missing_plugin_are_warnings(
    containerd: RuntimeLab, tmp_path: Path
) -> None:
    (tmp_path / "50-gone.toml").write_text(
        'name = "50-gone"\nendpoint = "unix:///run/crihook-check-absent/gone.sock"\n'
    )
    code, lines = crihook_check(
        "--runtime-endpoint", containerd.endpoint, "--plugins-dir", str(tmp_path),
        "--kubelet-config", str(CONFIGS / "kubeadm-static.yaml"),
        "--kubelet-flags", f"/usr/bin/kubelet --container-runtime-endpoint={containerd.endpoint}",
    )  # fmt: skip
    kubeadm = CONFIGS / "kubeadm-static.yaml"
    expected = [
        "warning  plugin 50-gone: socket /run/crihook-check-absent/gone.sock does not exist",
        f"warning  kubelet: CPU manager policy is static ({kubeadm} cpuManagerPolicy)",
        f"warning  kubelet: memory manager policy is Static ({kubeadm} memoryManagerPolicy)",
        f"warning  kubelet: runtime endpoint {containerd.endpoint} (--container-runtime-endpoint)"
        " is the runtime itself",
        f"warning  kubelet: cgroup driver systemd ({kubeadm} cgroupDriver) is not the runtime's "
        "(cgroupfs)",
    ]
    warnings = [line for line in lines if line.startswith("warning")]
    assert len(warnings) == len(expected), warnings
    for line, start in zip(warnings, expected, strict=True):
        assert line.startswith(start), line
    assert (code, lines[-1]) == (1, "crihook check: 0 error(s), 5 warning(s) (exit 1)")


def test_json_output_carries_the_same_findings_and_exit(
    containerd: RuntimeLab, tmp_path: Path
) -> None:
    args = (
        "--runtime-endpoint", containerd.endpoint, "--plugins-dir", str(tmp_path),
        "--kubelet-config", str(CONFIGS / "kubeadm-static.yaml"),
    )  # fmt: skip
    code, lines = crihook_check(*args)
    json_code, json_lines = crihook_check(*args, "--json")
    doc = json.loads("\n".join(json_lines))
    assert json_code == code == doc["exit"] == 1
    shown = [f"{f['level']:<8} {f['topic']}: {f['message']}" for f in doc["findings"]]
    assert shown == lines[:-1]
    levels = [line.split()[0] for line in lines[:-1]]
    assert doc["counts"] == {
        level: levels.count(level) for level in ("ok", "note", "warning", "error")
    }
    assert doc["counts"]["warning"] >= 3  # the static managers and the cgroup driver
