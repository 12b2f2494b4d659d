"""The lab CRI-O's config files, as pure functions.

CRI-O reads one ``crio.conf`` (``--config``) and a drop-in dir (``--config-dir``); the
image libraries it is built on read three more files, each given here explicitly so that
nothing comes from /etc/containers or /etc/crio:

- ``registries.conf`` (``--registries-conf``): where each registry really is. The lab's own
  images (``localhost/crihook/...``) come from a loopback registry the lab starts; with a
  mirror (the conformance bed) every registry critest pulls from goes to it;
- ``policy.json`` (``signature_policy``): accept any image (the lab's images are unsigned);
- ``storage.conf`` (``$CONTAINERS_STORAGE_CONF``): the same root, run root and driver as
  crio.conf, so containers/storage's own defaults (/var/lib/containers) are never used.

Everything CRI-O writes goes under the lab root: storage, run root, pod logs, exit files,
attach sockets, pinned namespaces, the version and clean-shutdown files, the OCI runtime's
state; NRI, metrics, tracing, CDI and hook dirs point there too or are off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CrioConfig", "crio_conf", "policy_json", "registries_conf", "storage_conf"]


@dataclass(frozen=True)
class CrioConfig:
    """Everything the config depends on. Paths are absolute."""

    dir: Path  # the lab root
    socket: Path
    storage_driver: str  # "overlay" or "vfs"
    pause_image: str
    runtime_name: str  # the default runtime handler: "runc" or "crun"
    runtimes: Mapping[str, Path]  # handler -> the OCI runtime (or the lab's front to it)
    conmon: Path
    pinns: Path
    cni_bin_dir: str
    cni_conf_dir: Path
    attach_dir: Path  # conmon's attach sockets: <dir>/<container id>/attach, under 108 bytes
    nri_socket: Path | None = None  # NRI on this socket; None: NRI off

    def sub(self, name: str) -> Path:
        return self.dir / name


def _toml(value: object) -> str:
    """A TOML value for the simple types the config uses (JSON strings are TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _table(name: str, fields: dict[str, object]) -> str:
    lines = [f"[{name}]"] + [f"{key} = {_toml(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def crio_conf(c: CrioConfig) -> str:
    nri_socket = c.nri_socket or c.sub("nri/nri.sock")
    tables = [
        _table(
            "crio",
            {
                "root": c.sub("storage"),
                "runroot": c.sub("run/storage"),
                "storage_driver": c.storage_driver,
                "log_dir": c.sub("pods"),
                "version_file": c.sub("run/version"),
                "version_file_persist": c.sub("version"),
                "clean_shutdown_file": c.sub("clean.shutdown"),
            },
        ),
        _table(
            "crio.api",
            {
                "listen": c.socket,
                "stream_address": "127.0.0.1",
                "stream_port": "0",
            },
        ),
        _table(
            "crio.runtime",
            {
                "default_runtime": c.runtime_name,
                "cgroup_manager": "cgroupfs",
                "conmon_cgroup": "pod",
                "selinux": False,
                "apparmor_profile": "",
                "decryption_keys_path": c.sub("keys"),
                "container_exits_dir": c.sub("run/exits"),
                "container_attach_socket_dir": c.attach_dir,
                "namespaces_dir": c.sub("run/ns"),
                "pinns_path": c.pinns,
                "hooks_dir": [c.sub("hooks.d")],
                "cdi_spec_dirs": [c.sub("cdi")],
                "irqbalance_config_file": "",
                "log_level": "info",
                # GetContainerEvents (kubelet's evented PLEG): off, CRI-O ends the stream at
                # once; on, it streams as containerd 2.x does.
                "enable_pod_events": True,
                # Host ports need iptables or nftables rules on the host (the lab adds none:
                # containerd's lab has no portmap plugin either). Without either working, CRI-O
                # 1.34.0 dereferences a nil port manager and dies on a pod with a host port.
                "disable_hostport_mapping": True,
            },
        ),
        *(
            # Every handler is the lab's: CRI-O adds a crun handler (root /run/crun) to any
            # config that does not define one.
            _table(
                f"crio.runtime.runtimes.{name}",
                {
                    "runtime_path": path,
                    "runtime_root": c.sub(f"run/{name}"),
                    "runtime_type": "oci",
                    "monitor_path": c.conmon,
                    "monitor_cgroup": "pod",
                },
            )
            for name, path in c.runtimes.items()
        ),
        _table(
            "crio.image",
            {
                "pause_image": c.pause_image,
                "signature_policy": c.sub("policy.json"),
                "signature_policy_dir": c.sub("policies"),
                "big_files_temporary_dir": c.sub("tmp"),
            },
        ),
        _table(
            "crio.network",
            {
                "network_dir": c.cni_conf_dir,
                "plugin_dirs": [c.cni_bin_dir],
            },
        ),
        _table("crio.metrics", {"enable_metrics": False}),
        _table("crio.tracing", {"enable_tracing": False}),
        _table(
            "crio.nri",
            {
                "enable_nri": c.nri_socket is not None,
                "nri_listen": nri_socket,
                "nri_plugin_dir": c.sub("nri/plugins"),
                "nri_plugin_config_dir": c.sub("nri/conf.d"),
            },
        ),
    ]
    return "\n".join(tables)


def registries_conf(lab_registry: str, mirror: str | None, mirrored: Sequence[str]) -> str:
    """registries.conf v2: ``localhost/crihook`` is the lab registry (``host:port``); with
    ``mirror`` (``host:port``) every registry in ``mirrored`` is served by it. Plain HTTP
    (insecure) to loopback only; short names resolve to docker.io, as containerd's do."""
    out = [
        'unqualified-search-registries = ["docker.io"]',
        'short-name-mode = "permissive"',
        "",
        "[[registry]]",
        'prefix = "localhost/crihook"',
        f'location = "{lab_registry}/crihook"',
        "insecure = true",
    ]
    for host in mirrored if mirror is not None else ():
        out += ["", "[[registry]]", f'prefix = "{host}"', f'location = "{mirror}"']
        out.append("insecure = true")
    return "\n".join(out) + "\n"


def policy_json() -> str:
    return json.dumps({"default": [{"type": "insecureAcceptAnything"}]}, indent=2) + "\n"


def storage_conf(c: CrioConfig) -> str:
    return _table(
        "storage",
        {
            "driver": c.storage_driver,
            "graphroot": c.sub("storage"),
            "runroot": c.sub("run/storage"),
        },
    )
