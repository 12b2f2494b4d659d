"""What a runtime's verbose status says about the config a pod or container was created with.

`verbose_config` takes it from either runtime's, for reconcile (proxy/state/reconcile.py).

containerd's verbose status repeats the CRI config (``info["info"]["config"]``); CRI-O's does
not. CRI-O's carries the OCI spec it made (``info["info"]["runtimeSpec"]``), and CRI-O writes
the CRI config it needs again into that spec's annotations (``io.kubernetes.cri-o.*``):

- a sandbox: ``Metadata``, ``Labels``, ``Annotations`` (JSON), ``CgroupParent``, and
  ``PodLinuxResources`` (the pod's summed resources, CRI's JSON field names);
- a container: ``Metadata``, ``Labels``, ``Annotations`` (JSON), ``ImageName``, and the
  resources in the spec itself (``linux.resources``, ``process.oomScoreAdj``).

:func:`sandbox_config_from_crio` and :func:`container_config_from_crio` rebuild the CRI
config from that, as far as it goes (what crihook's views read: names, labels, annotations,
the cgroup parent, resources), or return None when ``info`` is not CRI-O's. Pure functions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from crihook.api.cri.v1 import api_pb2

__all__ = [
    "container_config_from_crio",
    "crio_config",
    "runtime_spec",
    "sandbox_config_from_crio",
    "verbose_config",
]

log = logging.getLogger(__name__)

_PREFIX = "io.kubernetes.cri-o."


def runtime_spec(info: Mapping[str, str]) -> dict[str, Any] | None:
    """The OCI spec of a verbose status (containerd and CRI-O both put it there)."""
    try:
        doc = json.loads(info.get("info", "") or "{}")
    except ValueError:
        return None
    spec = doc.get("runtimeSpec") if isinstance(doc, dict) else None
    return spec if isinstance(spec, dict) else None


def crio_config(info: Mapping[str, str], message: Any) -> Any | None:
    """The config of ``message``'s type (PodSandboxConfig or ContainerConfig) from CRI-O's
    verbose ``info``; None when it is not CRI-O's or does not parse."""
    try:
        if isinstance(message, api_pb2.PodSandboxConfig):
            config: Any = sandbox_config_from_crio(info)
        elif isinstance(message, api_pb2.ContainerConfig):
            config = container_config_from_crio(info)
        else:
            raise TypeError(f"no CRI-O config for {type(message).__name__}")
    except json_format.ParseError:
        return None
    if config is not None:
        message.CopyFrom(config)
    return None if config is None else message


def sandbox_config_from_crio(info: Mapping[str, str]) -> api_pb2.PodSandboxConfig | None:
    annotations = _crio_annotations(info)
    if annotations is None:
        return None
    config = api_pb2.PodSandboxConfig()
    _common(config, annotations)
    config.linux.cgroup_parent = annotations.get(f"{_PREFIX}CgroupParent", "")
    resources = _json(annotations.get(f"{_PREFIX}PodLinuxResources"))
    if resources:
        json_format.ParseDict(resources, config.linux.resources, ignore_unknown_fields=True)
    return config


def container_config_from_crio(info: Mapping[str, str]) -> api_pb2.ContainerConfig | None:
    spec = runtime_spec(info)
    annotations = _crio_annotations(info)
    if spec is None or annotations is None:
        return None
    config = api_pb2.ContainerConfig()
    _common(config, annotations)
    config.image.image = annotations.get(f"{_PREFIX}ImageName", "")
    linux = spec.get("linux") or {}
    resources = linux.get("resources") or {}
    cpu = resources.get("cpu") or {}
    memory = resources.get("memory") or {}
    out = config.linux.resources
    for field, value in (
        ("cpu_shares", cpu.get("shares")),
        ("cpu_quota", cpu.get("quota")),
        ("cpu_period", cpu.get("period")),
        ("memory_limit_in_bytes", memory.get("limit")),
        ("oom_score_adj", (spec.get("process") or {}).get("oomScoreAdj")),
    ):
        if isinstance(value, int):
            setattr(out, field, value)
    if isinstance(cpu.get("cpus"), str):
        out.cpuset_cpus = cpu["cpus"]
    if isinstance(cpu.get("mems"), str):
        out.cpuset_mems = cpu["mems"]
    return config


def _crio_annotations(info: Mapping[str, str]) -> dict[str, str] | None:
    spec = runtime_spec(info)
    annotations = (spec or {}).get("annotations")
    if not isinstance(annotations, dict) or f"{_PREFIX}Metadata" not in annotations:
        return None  # not CRI-O's (or an older one without its annotations)
    return {str(k): str(v) for k, v in annotations.items()}


def _common(config: Any, annotations: Mapping[str, str]) -> None:
    metadata = _json(annotations.get(f"{_PREFIX}Metadata"))
    if metadata:
        json_format.ParseDict(metadata, config.metadata, ignore_unknown_fields=True)
    for field in ("Labels", "Annotations"):
        values = _json(annotations.get(f"{_PREFIX}{field}"))
        if values:
            getattr(config, field.lower()).update({str(k): str(v) for k, v in values.items()})


def _json(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def verbose_config(info: Any, message: Any) -> Any | None:
    """containerd's verbose status carries the original config as JSON under info["info"];
    CRI-O's carries only its OCI spec, from which crio_config rebuilds the config."""
    try:
        doc = json.loads(info.get("info", "{}")).get("config")
    except (ValueError, AttributeError):
        return None
    if not isinstance(doc, dict):
        return crio_config(info, message)
    doc.pop("envs", None)  # Go marshals env values as text, protobuf JSON expects base64
    try:
        return json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        log.debug("cannot parse verbose config: %s", exc)
        return None
