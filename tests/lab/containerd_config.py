"""The lab containerd's config.toml and registry hosts files, as pure functions.

containerd 1.6 reads config ``version = 2`` (CRI under ``io.containerd.grpc.v1.cri``);
containerd 2.x reads ``version = 3`` (CRI split into ``io.containerd.cri.v1.images`` and
``io.containerd.cri.v1.runtime``; 2.4 migrates it to its own version 4 on load). Both
versions get the same behaviour: private root/state/socket, runc with a private root,
overlayfs or native, the lab pause image, restricted OOM scores, no AppArmor/SELinux,
netns mounts under the state dir, and no registry access except through ``config_path``
hosts files (:func:`hosts_toml`), which both versions support.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HOST_DROP_INS",
    "REGISTRY_HOSTS",
    "LabConfig",
    "config_toml",
    "hosts_files",
    "hosts_toml",
]

# containerd 2.x always imports these (defaults.DefaultConfigIncludePattern).
HOST_DROP_INS = "/etc/containerd/conf.d/*.toml"

# The registries critest pulls from (cri-tools' pkg/validate and pkg/framework), plus
# docker.io for anything else: all of them point at the loopback registry when one is set.
REGISTRY_HOSTS = ("registry.k8s.io", "k8s.gcr.io", "gcr.io", "docker.io")

_NOISY_SNAPSHOTTERS = (
    # Snapshotters that cannot work here only add noise to the log (or, for 2.x, probe tools).
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
)
_NOISY_SNAPSHOTTERS_2 = (
    *_NOISY_SNAPSHOTTERS,
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
)


@dataclass(frozen=True)
class LabConfig:
    """Everything the config depends on. Paths are absolute."""

    major: int  # containerd's major version: 1 or 2
    dir: Path  # the lab root: root/, state/, runc/, opt/ live below it
    socket: Path
    snapshotter: str
    sandbox_image: str
    runc: Path
    shim: Path | None  # containerd-shim-runc-v2 to use (2.x: runtime_path); None: PATH
    cni_bin_dir: str
    cni_conf_dir: Path
    registry_config_path: Path | None  # dir of <host>/hosts.toml, or None: no mirrors
    nri_socket: Path | None = None  # 2.x only: NRI on this socket; None: NRI disabled


def config_toml(c: LabConfig) -> str:
    if c.major == 1:
        return _config_v2(c)
    if c.major == 2:
        return _config_v3(c)
    raise ValueError(f"unsupported containerd major version {c.major} (1 or 2)")


def hosts_toml(mirror: str) -> str:
    """A hosts.toml sending every pull and resolve for one registry to ``mirror``.

    ``server`` (the fall-back after the listed hosts) is the mirror too, so nothing falls
    back to the real registry. containerd 1.6 rejects a file without a ``host`` table
    ("invalid `host` tree") and then uses the real registry: both are needed.
    """
    return f'server = "{mirror}"\n\n[host."{mirror}"]\n  capabilities = ["pull", "resolve"]\n'


def hosts_files(config_path: Path, mirror: str) -> dict[Path, str]:
    """``<config_path>/<host>/hosts.toml`` for every host in REGISTRY_HOSTS."""
    return {config_path / host / "hosts.toml": hosts_toml(mirror) for host in REGISTRY_HOSTS}


def _toml_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def _common_head(c: LabConfig, version: int, disabled: tuple[str, ...]) -> str:
    return f"""\
version = {version}
root = "{c.dir}/root"
state = "{c.dir}/state"
oom_score = 0
# containerd 2.x also imports /etc/containerd/conf.d/*.toml whatever this says (it appends
# its default): Containerd.start() refuses to run 2.x when that directory has drop-ins.
imports = []
disabled_plugins = {_toml_list(disabled)}

[grpc]
  address = "{c.socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""
"""


def _config_v2(c: LabConfig) -> str:
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return (
        _common_head(c, 2, _NOISY_SNAPSHOTTERS)
        + f"""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{c.dir}/opt"
  {cri}]
    sandbox_image = "{c.sandbox_image}"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    # Without CAP_SYS_RESOURCE (lab VMs) any negative oom_score_adj makes runc fail, and
    # containerd gives every sandbox -998; true clamps scores to containerd's own (0).
    restrict_oom_score_adj = true
    # Keep netns bind mounts under our state dir instead of /var/run/netns.
    netns_mounts_under_state_dir = true
    # The lab images do not need AppArmor; CI hosts with it enabled need no parser.
    disable_apparmor = true
    enable_selinux = false
    {cri}.containerd]
      snapshotter = "{c.snapshotter}"
      default_runtime_name = "runc"
      {cri}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
{_runtime_path(c, 8)}\
        {cri}.containerd.runtimes.runc.options]
          BinaryName = "{c.runc}"
          Root = "{c.dir}/runc"
          SystemdCgroup = false
    {cri}.cni]
      bin_dir = "{c.cni_bin_dir}"
      conf_dir = "{c.cni_conf_dir}"
      max_conf_num = 1
    {cri}.registry]
      config_path = "{c.registry_config_path or ""}"
"""
    )


def _config_v3(c: LabConfig) -> str:
    images = "[plugins.'io.containerd.cri.v1.images'"
    runtime = "[plugins.'io.containerd.cri.v1.runtime'"
    nri = (
        f"""  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = "{c.nri_socket}"
    plugin_path = "{c.dir}/nri/plugins"
    plugin_config_path = "{c.dir}/nri/conf.d"
"""
        if c.nri_socket is not None
        else """  [plugins.'io.containerd.nri.v1.nri']
    # On by default in 2.x, on the host-wide /var/run/nri/nri.sock: off unless asked for.
    disable = true
"""
    )
    return (
        _common_head(c, 3, _NOISY_SNAPSHOTTERS_2)
        + f"""
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "{c.dir}/opt"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  {images}]
    snapshotter = "{c.snapshotter}"
    {images}.pinned_images]
      sandbox = "{c.sandbox_image}"
    {images}.registry]
      config_path = "{c.registry_config_path or ""}"
  {runtime}]
    # See the 1.6 config: no CAP_SYS_RESOURCE in lab VMs.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    disable_apparmor = true
    enable_selinux = false
    {runtime}.containerd]
      default_runtime_name = "runc"
      {runtime}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
{_runtime_path(c, 8)}\
        {runtime}.containerd.runtimes.runc.options]
          BinaryName = "{c.runc}"
          Root = "{c.dir}/runc"
          SystemdCgroup = false
    {runtime}.cni]
      bin_dirs = ["{c.cni_bin_dir}"]
      conf_dir = "{c.cni_conf_dir}"
      max_conf_num = 1
{nri}"""
    )


def _runtime_path(c: LabConfig, indent: int) -> str:
    if c.shim is None:
        return ""
    return " " * indent + f'runtime_path = "{c.shim}"\n'
