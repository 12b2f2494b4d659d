"""What a real kubelet of the test bed is told: its KubeletConfiguration, command line and
kubeconfig, as pure functions (tests/lab/kubelet_node.py runs it).

The configuration keeps kubelet off everything that is not its own: a cgroup root of its
own (``cgroupRoot``), no server ports but a loopback healthz, no iptables chains, no image
garbage collection (the lab's images are imported, never pulled), eviction thresholds that a
busy shared machine does not cross, and ``failCgroupV1: false`` (these machines are cgroup v1,
which kubelet refuses by default since 1.35). The sysctls and /var/log it would change are
covered by the node's private mount namespace (kubelet_node.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KubeletSettings", "command_line", "kubeconfig", "kubelet_configuration"]

CPU_MANAGER_POLICIES = ("none", "static")


@dataclass(frozen=True)
class KubeletSettings:
    """One kubelet's choices; paths are absolute."""

    node_name: str
    root_dir: Path
    cgroup_root: str  # "/<name>": kubelet's pods go under <cgroup_root>/kubepods
    runtime_endpoint: str  # unix://...: the runtime itself, or crihook
    static_pod_dir: Path
    pod_logs_dir: Path
    healthz_port: int
    cpu_manager_policy: str = "none"
    reserved_cpus: str = "0"  # reservedSystemCPUs: matches crihook's [hooks.cpuset] reserved
    kubeconfig: Path | None = None  # None: standalone (static pods only)
    feature_gates: tuple[tuple[str, bool], ...] = ()
    cpu_manager_reconcile_period: str = "5s"  # how often the static policy re-sends cpusets

    def __post_init__(self) -> None:
        if self.cpu_manager_policy not in CPU_MANAGER_POLICIES:
            raise ValueError(
                f"cpu_manager_policy {self.cpu_manager_policy!r}: not one of "
                f"{', '.join(CPU_MANAGER_POLICIES)}"
            )
        if not self.cgroup_root.startswith("/") or self.cgroup_root == "/":
            raise ValueError(f"cgroup_root {self.cgroup_root!r}: must be /<name>")


def kubelet_configuration(s: KubeletSettings) -> dict[str, object]:
    """The KubeletConfiguration document (kubelet.config.k8s.io/v1beta1)."""
    config: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "staticPodPath": str(s.static_pod_dir),
        "fileCheckFrequency": "1s",  # besides inotify: a manifest seen within a second
        "syncFrequency": "10s",
        "containerRuntimeEndpoint": s.runtime_endpoint,
        "imageServiceEndpoint": s.runtime_endpoint,
        "cgroupDriver": "cgroupfs",  # the lab's runtimes use cgroupfs
        "cgroupRoot": s.cgroup_root,
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "failCgroupV1": False,
        "podLogsDir": str(s.pod_logs_dir),
        "volumePluginDir": str(s.root_dir / "volume-plugins"),
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
            "x509": {},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "enableServer": False,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": s.healthz_port,
        "makeIPTablesUtilChains": False,
        "hairpinMode": "none",
        "oomScoreAdj": 0,  # kubelet's own score: -999 needs CAP_SYS_RESOURCE, missing here
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "cpuManagerPolicy": s.cpu_manager_policy,
        "cpuManagerReconcilePeriod": s.cpu_manager_reconcile_period,
        "reservedSystemCPUs": s.reserved_cpus,
        "registerNode": s.kubeconfig is not None,
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",  # no systemd inhibitor lock
        "localStorageCapacityIsolation": True,
    }
    if s.feature_gates:
        config["featureGates"] = dict(s.feature_gates)
    return config


def command_line(kubelet: Path, s: KubeletSettings, config_file: Path) -> list[str]:
    argv = [
        str(kubelet),
        f"--config={config_file}",
        f"--root-dir={s.root_dir}",
        f"--cert-dir={s.root_dir / 'pki'}",
        f"--hostname-override={s.node_name}",
        "--v=2",
    ]
    if s.kubeconfig is not None:
        argv.append(f"--kubeconfig={s.kubeconfig}")
    return argv


def kubeconfig(server: str, token: str) -> str:
    """A kubeconfig with a bearer token; the API server's cert is self-signed."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "lab", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "lab", "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}],
        "current-context": "lab",
    }
    return json.dumps(doc, indent=2) + "\n"
