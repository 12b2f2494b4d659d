"""The real kubelet's harness, without running it: its configuration, the private mount
namespace it runs in, and the wrapper module kubelet is built in (tests/lab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab import peers
from tests.lab.kubelet_config import KubeletSettings, command_line, kubelet_configuration
from tests.lab.kubelet_node import _in_private_mounts


def _settings(**changes: object) -> KubeletSettings:
    fields: dict[str, object] = {
        "node_name": "crihook-node-x",
        "root_dir": Path("/tmp/n/root"),
        "cgroup_root": "/crihook-node-x",
        "runtime_endpoint": "unix:///tmp/ch/crihook.sock",
        "static_pod_dir": Path("/tmp/n/manifests"),
        "pod_logs_dir": Path("/tmp/n/pods"),
        "healthz_port": 10248,
    }
    return KubeletSettings(**(fields | changes))  # type: ignore[arg-type]


def test_the_configuration_keeps_kubelet_to_its_own() -> None:
    config = kubelet_configuration(_settings())
    assert config["cgroupRoot"] == "/crihook-node-x"
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failCgroupV1"] is False
    assert config["makeIPTablesUtilChains"] is False
    assert config["enableServer"] is False
    assert config["readOnlyPort"] == 0
    assert config["healthzBindAddress"] == "127.0.0.1"
    assert config["containerRuntimeEndpoint"] == "unix:///tmp/ch/crihook.sock"
    assert config["podLogsDir"] == "/tmp/n/pods"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["registerNode"] is False
    assert config["cpuManagerPolicy"] == "none"
    assert config["reservedSystemCPUs"] == "0"


def test_with_a_kubeconfig_kubelet_registers() -> None:
    settings = _settings(kubeconfig=Path("/tmp/n/kubeconfig"), cpu_manager_policy="static")
    assert kubelet_configuration(settings)["registerNode"] is True
    argv = command_line(Path("/k/kubelet"), settings, Path("/tmp/n/c.json"))
    assert "--kubeconfig=/tmp/n/kubeconfig" in argv
    assert "--root-dir=/tmp/n/root" in argv
    assert "--hostname-override=crihook-node-x" in argv


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cpu_manager_policy": "best"}, "cpu_manager_policy 'best'"),
        ({"cgroup_root": "/"}, "cgroup_root '/'"),
        ({"cgroup_root": "kubelet"}, "cgroup_root 'kubelet'"),
    ],
)
def test_bad_settings_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(**change)


def test_kubelet_runs_in_a_mount_namespace_with_the_host_covered() -> None:
    covers = {Path("/proc/sys/vm/overcommit_memory"): Path("/tmp/n/sysctl/vm.overcommit_memory")}
    argv = _in_private_mounts(["/k/kubelet", "--v=2"], covers, Path("/tmp/n/var-log"))
    assert argv[:5] == ["unshare", "--mount", "--propagation", "slave", "--"]
    script = argv[argv.index("-c") + 1]
    assert (
        'mount --bind "/tmp/n/sysctl/vm.overcommit_memory" "/proc/sys/vm/overcommit_memory"'
        in script
    )
    assert 'mount --bind "/tmp/n/var-log" "/var/log"' in script
    assert script.startswith("set -e\n")  # a failed cover stops it before kubelet runs
    assert argv[-2:] == ["/k/kubelet", "--v=2"]


def test_the_wrapper_module_replaces_the_staging_modules(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text(
        "module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n"
        "\tgithub.com/x/y v1.2.3\n\tk8s.io/api v0.0.0\n\tk8s.io/kubelet v0.0.0\n)\n\n"
        "require k8s.io/utils v0.0.0-20260626114624-be93311217bd // indirect\n"
        "replace k8s.io/api => ./staging/src/k8s.io/api\n"
    )
    gomod = peers._wrapper_module(peers.BUNDLES["kubernetes"], tmp_path, "1.26.0")
    assert f"require k8s.io/kubernetes {peers.KUBERNETES_VERSION}\n" in gomod
    staging = "v0." + peers.KUBERNETES_VERSION.removeprefix("v1.")
    assert f"\tk8s.io/api => k8s.io/api {staging}\n" in gomod
    assert f"\tk8s.io/kubelet => k8s.io/kubelet {staging}\n" in gomod
    assert "k8s.io/utils =>" not in gomod and "github.com/x/y" not in gomod
    assert "\ngo 1.26.0\n" in gomod


def test_a_version_without_staging_releases_is_refused() -> None:
    with pytest.raises(peers.PeerError, match=r"staging modules' version from 'v2\.0'"):
        peers._staging_version("v2.0")
