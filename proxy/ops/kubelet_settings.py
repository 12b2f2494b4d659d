"""What kubelet was told, for `crihook check`: its CPU and memory manager policies, its
runtime endpoint and its cgroup driver.

kubelet reads them, later sources winning: its built-in defaults, the KubeletConfiguration
file (`--config`), the drop-in directory (`--config-dir`, `*.conf` files in lexical order),
and its command-line flags. The same order is applied here to whatever the operator gives
`crihook check` (`--kubelet-config`, `--kubelet-flags`). Pure functions: the caller reads the
files.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = [
    "DEFAULTS",
    "FIELDS",
    "KubeletConfigError",
    "KubeletSetting",
    "parse_kubelet_config",
    "parse_kubelet_flags",
    "resolve_kubelet_settings",
    "same_socket",
]

# KubeletConfiguration field → the kubelet flag that sets it.
FIELDS = {
    "cpuManagerPolicy": "--cpu-manager-policy",
    "memoryManagerPolicy": "--memory-manager-policy",
    "containerRuntimeEndpoint": "--container-runtime-endpoint",
    "cgroupDriver": "--cgroup-driver",
}
# kubelet's defaults (kubelet.config.k8s.io/v1beta1, Linux, kubelet >= 1.27).
DEFAULTS = {
    "cpuManagerPolicy": "none",
    "memoryManagerPolicy": "None",
    "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
    "cgroupDriver": "cgroupfs",
}
# Flags that take a value and that `crihook check` follows to more settings.
CONFIG_FLAG = "--config"
CONFIG_DIR_FLAG = "--config-dir"
_VALUE_FLAGS = frozenset({*FIELDS.values(), CONFIG_FLAG, CONFIG_DIR_FLAG})
_KIND = "KubeletConfiguration"


class KubeletConfigError(ValueError):
    """A kubelet config file or flag string `crihook check` cannot read; says which."""


@dataclass(frozen=True)
class KubeletSetting:
    value: str
    source: str
    """Where the value came from: `default`, `--cpu-manager-policy`, `<file> cpuManagerPolicy`."""


def parse_kubelet_flags(text: str) -> dict[str, str]:
    """The flags of a kubelet command line this module knows (`--name=value` or `--name
    value`, as kubelet's pflag takes them); the program name and other flags are skipped,
    and a flag given twice keeps its last value, as pflag does."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise KubeletConfigError(f"--kubelet-flags: {exc}") from None
    found: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        name, eq, value = word.partition("=")
        if name not in _VALUE_FLAGS:
            continue
        if not eq:
            if index >= len(words):
                raise KubeletConfigError(f"--kubelet-flags: {name} has no value")
            value = words[index]
            index += 1
        found[name] = value
    return found


def parse_kubelet_config(text: str, where: str) -> dict[str, Any]:
    """A KubeletConfiguration document (YAML or JSON) as a mapping."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeletConfigError(f"{where}: not valid YAML: {_one_line(exc)}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise KubeletConfigError(f"{where}: not a KubeletConfiguration (a mapping)")
    kind = doc.get("kind")
    if kind is not None and kind != _KIND:
        raise KubeletConfigError(f"{where}: kind is {kind!r}, not {_KIND}")
    return doc


def resolve_kubelet_settings(
    documents: Sequence[tuple[str, Mapping[str, Any]]], flags: Mapping[str, str]
) -> dict[str, KubeletSetting]:
    """Each field's effective value: defaults, then `documents` (the config file, then its
    drop-ins, as (where, document)), then flags."""
    out = {name: KubeletSetting(value, "default") for name, value in DEFAULTS.items()}
    for where, doc in documents:
        for name in FIELDS:
            value = doc.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise KubeletConfigError(f"{where}: {name} must be a string, not {value!r}")
            if value:  # kubelet treats an empty string as unset
                out[name] = KubeletSetting(value, f"{where} {name}")
    for name, flag in FIELDS.items():
        if flags.get(flag):
            out[name] = KubeletSetting(flags[flag], flag)
    return out


def same_socket(a: str, b: str) -> bool:
    """Whether two CRI endpoints name the same unix socket (`unix://` optional; /var/run is
    /run on every distribution kubelet supports)."""
    return _socket_path(a) == _socket_path(b)


def _socket_path(endpoint: str) -> str:
    path = endpoint.removeprefix("unix://")
    if path.startswith("/var/run/"):
        path = path.removeprefix("/var")
    return path.rstrip("/")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
